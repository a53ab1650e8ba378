"""The ``snapstore`` command line (installed as the package ``snapstore.cli``)."""
