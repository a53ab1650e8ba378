"""What a stage's result is named by: the fingerprint of code, arguments and inputs.

Hashing primitives (:mod:`~snapstore.fingerprint.hashing`), the code identity of a function and
the user code it reaches (:mod:`~snapstore.fingerprint.codeid`,
:mod:`~snapstore.fingerprint.importname`), the canonical hashing of values and the fingerprint
itself (:mod:`~snapstore.fingerprint.digest`), declared inputs such as files
(:mod:`~snapstore.fingerprint.inputs`), and the explanation of why two fingerprints differ
(:mod:`~snapstore.fingerprint.explain`).

Layer: above :mod:`snapstore.storage`; imports it, :mod:`snapstore.format` and
:mod:`snapstore.errors`.
"""

from ..oldpaths import moved_attribute
from .digest import (
    FINGERPRINT_SCHEME,
    Fingerprint,
    diff_parts,
    fingerprint_key,
    fingerprint_stage,
    hash_code,
    hash_value,
)
from .inputs import InputError, Inputs, files

__all__ = [
    "FINGERPRINT_SCHEME",
    "Fingerprint",
    "InputError",
    "Inputs",
    "diff_parts",
    "files",
    "fingerprint_key",
    "fingerprint_stage",
    "hash_code",
    "hash_value",
]


def __getattr__(name: str) -> object:
    """Names of the old ``snapstore.fingerprint`` module (now
    :mod:`snapstore.fingerprint.digest`)."""
    from . import digest

    return moved_attribute("snapstore.fingerprint", digest, name)
