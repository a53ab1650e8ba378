"""The name a module has when imported, for code in a file that was started as a script.

``python prep.py`` and ``python -m prep`` run ``prep`` as the module ``__main__`` (and a spawned
multiprocessing child runs it again as ``__mp_main__``), while ``import prep`` names it ``prep``.
Fingerprints, stage names and messages use the imported name, so that the three agree
(fingerprint scheme 3; see the guide's "One name however the file is started"). Within
:func:`script_names_as_main`, a script's module keeps ``__main__``, as scheme 2 named it: how an
upgrade finds a snapshot scheme 2 wrote (:mod:`snapstore.fingerprint.earlier`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["module_name", "script_modules", "script_names_as_main", "spellings"]

_MAIN_NAMES = ("__main__", "__mp_main__")  # a script; in a spawned multiprocessing child
_AS_IMPORTED = contextvars.ContextVar("snapstore_script_names_as_imported", default=True)


def module_name(module: str, namespace: dict[str, Any] | None = None) -> str:
    """The name a module has when imported: a script's ``__main__`` becomes that name.

    ``python prep.py`` and ``python -m prep`` run ``prep`` as ``__main__`` (and a spawned
    multiprocessing child runs it again as ``__mp_main__``), while ``import prep`` names it
    ``prep``. Code is identified by the imported name so that the three agree. With
    ``python -m`` the name comes from ``__main__.__spec__``; for a file run as a script it is
    the file's stem, preceded by the names of the enclosing directories that are packages
    (have an ``__init__.py``): ``python pkg/prep.py`` is ``pkg.prep``. Code with no file (an
    interactive prompt, a notebook, ``python -c``) keeps ``__main__``, and so does code run by
    ``exec`` in a namespace of its own (``namespace``, a function's globals, is not the main
    module's).
    """
    if module not in _MAIN_NAMES or not _AS_IMPORTED.get():
        return module
    main = sys.modules.get(module) or sys.modules.get("__main__")
    if namespace is not None and getattr(main, "__dict__", None) is not namespace:
        return module
    spec = getattr(main, "__spec__", None)
    spec_name = getattr(spec, "name", None)
    if isinstance(spec_name, str) and spec_name not in _MAIN_NAMES:
        return spec_name
    file = getattr(main, "__file__", None)
    return (_script_module(file) if isinstance(file, str) else None) or module


@contextlib.contextmanager
def script_names_as_main() -> Iterator[None]:
    """Within this context (in this thread or task), :func:`module_name` leaves a script's
    module named ``__main__`` (or ``__mp_main__``), as fingerprint scheme 2 did."""
    token = _AS_IMPORTED.set(False)
    try:
        yield
    finally:
        _AS_IMPORTED.reset(token)


def script_modules() -> set[str]:
    """The import names :func:`module_name` gives this process's main module (and, in a spawned
    child, ``__mp_main__``) when it was started from a file; empty at a prompt, in a notebook
    or under ``python -c``."""
    return {module_name(name) for name in _MAIN_NAMES if name in sys.modules} - set(_MAIN_NAMES)


@functools.lru_cache(maxsize=64)
def _script_module(file: str) -> str | None:
    """``pkg.prep`` for ``.../pkg/prep.py`` where ``pkg`` has an ``__init__.py``."""
    path = os.path.realpath(os.path.abspath(file))
    directory, base = os.path.split(path)
    stem, ext = os.path.splitext(base)
    if ext != ".py" or not stem.isidentifier():
        return None  # not importable under any name: keep __main__
    parts = [stem] if stem != "__init__" else []
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        if not package.isidentifier():
            break
        parts.insert(0, package)
    return ".".join(parts) or None


def spellings(module: Any, name: str) -> set[str]:
    """``module.name`` as ``ignore_globals`` may spell it: as imported, or as ``__main__``."""
    if not isinstance(module, str):
        return {f"{module}.{name}"}
    return {f"{module}.{name}", f"{module_name(module)}.{name}"}
