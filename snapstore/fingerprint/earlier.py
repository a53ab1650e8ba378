"""The fingerprints earlier releases gave a stage call, so that an upgrade finds what they wrote.

Two of a fingerprint's parts say how its snapshot is named and encoded, not what the stage
computed: ``scheme`` (how the parts are computed) and ``format`` (the on-disk format version the
snapshot is written in). A release that changes either gives every call a new fingerprint, yet
the snapshot an earlier release wrote for the call holds the same samples, and readers read
every earlier format version. :func:`earlier_namings` lists the ``(scheme, format version)``
pairs that releases wrote snapshots under, newest first, and :func:`renamed` gives a call's
fingerprint under one of them: its parts with ``scheme`` and ``format`` hashed as that release
hashed them, and ``upstream`` hashed from the upstream snapshots' fingerprints under the same
naming, so that a chain of stages one release wrote is found whole. Nothing here does I/O: the
caller checks which of these fingerprints is committed (``snapstore.snapshot``).

Only schemes that differ from the current one in how they name things can be found this way:
scheme 2 differs from scheme 3 only in naming code of a file run as a script ``__main__.f``
where scheme 3 names it as its import would (``prep.f``). A call whose code includes such a
script's functions is fingerprinted again with scheme 2's names
(:func:`~snapstore.fingerprint.importname.script_names_as_main`); any other call has the same
``code`` and ``arguments`` parts under both. Scheme 1 hashed code another way: its snapshots are
not found. A scheme that changes what is hashed, not only names, cannot be added here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .digest import FINGERPRINT_SCHEME, Fingerprint, combine_parts, hash_value, upstream_digest
from .importname import script_modules

__all__ = [
    "EARLIER_SCHEMES",
    "SCHEME_FIRST_FORMAT",
    "SCRIPTS_AS_MAIN",
    "Naming",
    "earlier_namings",
    "names_script_code",
    "renamed",
]

EARLIER_SCHEMES: dict[int, tuple[int, ...]] = {2: (1,)}
"""Fingerprint schemes before the current one that only named things differently, each with
the format versions releases wrote under it. When a change that only renames replaces the
current scheme, the current scheme goes here with the versions it wrote."""

SCHEME_FIRST_FORMAT = 1
"""The first format version written under :data:`FINGERPRINT_SCHEME` (every later one was)."""

SCRIPTS_AS_MAIN = frozenset({2})
"""The schemes that named code of a file run as a script ``__main__.<qualname>``."""


@dataclass(frozen=True)
class Naming:
    """How a release named a stage call: its fingerprint scheme and the format version it wrote."""

    scheme: int
    format_version: int

    def __str__(self) -> str:
        return f"format version {self.format_version} (fingerprint scheme {self.scheme})"


def earlier_namings(format_version: int) -> tuple[Naming, ...]:
    """The namings of releases before the one that writes ``format_version`` under the current
    scheme, newest first: the earlier format versions of the current scheme, then each of
    :data:`EARLIER_SCHEMES`.

    Examples
    --------
    >>> [str(n) for n in earlier_namings(3)][:1]
    ['format version 2 (fingerprint scheme 3)']
    """
    current = range(format_version - 1, SCHEME_FIRST_FORMAT - 1, -1)
    namings = [Naming(FINGERPRINT_SCHEME, version) for version in current]
    for scheme in sorted(EARLIER_SCHEMES, reverse=True):
        namings += [Naming(scheme, v) for v in sorted(EARLIER_SCHEMES[scheme], reverse=True)]
    return tuple(namings)


def names_script_code(fp: Fingerprint) -> bool:
    """Whether ``fp``'s code includes functions of a module this process runs as a script (so
    that the schemes of :data:`SCRIPTS_AS_MAIN` named them otherwise)."""
    code = fp.details.get("code")
    functions = code.get("functions", {}) if isinstance(code, dict) else {}
    prefixes = tuple(f"{module}." for module in script_modules())
    return bool(prefixes) and any(str(key).startswith(prefixes) for key in functions)


def renamed(
    fp: Fingerprint, naming: Naming, upstream: Mapping[str, str] | None = None
) -> Fingerprint:
    """``fp`` as a release of ``naming`` computed it.

    Parameters
    ----------
    fp : Fingerprint
        A call's fingerprint under the current scheme (for the schemes of
        :data:`SCRIPTS_AS_MAIN`, computed with scripts' code named ``__main__`` when
        :func:`names_script_code` says so).
    naming : Naming
        The release's scheme and format version.
    upstream : mapping of str to str, optional
        Per argument of ``fp``'s ``upstream`` details, that upstream snapshot's fingerprint
        under ``naming``; an argument left out keeps the fingerprint ``fp`` recorded (a snapshot
        opened by its name is that name under every naming).

    Returns
    -------
    Fingerprint
        With the ``scheme``, ``format`` and ``upstream`` parts (and the details that record
        them) as that release had them; the other parts are ``fp``'s.
    """
    parts = dict(fp.parts)
    parts["scheme"] = hash_value(naming.scheme)
    parts["format"] = hash_value(naming.format_version)
    details: dict[str, Any] = {
        **fp.details,
        "scheme": naming.scheme,
        "format_version": naming.format_version,
    }
    recorded = fp.details.get("upstream") or {}
    if upstream and isinstance(recorded, dict):
        fingerprints = {arg: upstream.get(arg, str(found)) for arg, found in recorded.items()}
        digests = {arg: upstream_digest(found) for arg, found in fingerprints.items()}
        parts["upstream"] = hash_value(digests, "upstream digests")
        details["upstream"] = fingerprints
    return Fingerprint(combine_parts(parts), parts, details)
