"""Fingerprints of the partitions of a partitioned stage, each from its own inputs only.

A stage written with ``partition_by`` is computed partition by partition. A partition's
fingerprint hashes two things, so that a partition is found again by any call of the stage that
has the same partition, whatever the call's other inputs:

- the **stage's identity** (:func:`stage_key`): the parts of the call's fingerprint that do not
  depend on the partitioned argument (scheme, code, upstream snapshots, format version,
  ``version``), the digests of every other argument (or, for a stage with ``key=``, what
  ``key`` gives for the partition's own call), the other declared inputs, the ignored
  arguments and the partitioned argument's name;
- the partition's **members** (:func:`members`), in order: for ``snapstore.files(...)``, each
  file's stable name and identity (size and mtime, generation or ETag, or content hash, as
  :func:`snapstore.files` records it); for a plain sequence, each element's digest.

So adding a file changes the whole call's fingerprint (``snap.fingerprint`` still means
"exactly this data"), but only the partitions whose members changed get new fingerprints.
Specified in docs/format.md, section 13.2.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import FingerprintError
from .digest import declared_digest, hash_value
from .hashing import feed_item

__all__ = ["PARTITION_SCHEME", "members", "partition_fingerprint", "stage_key"]

PARTITION_SCHEME = 1
"""Version of this hashing; a change gives every partition a new fingerprint."""

_STAGE_PARTS = ("scheme", "code", "upstream", "format", "version")


def members(values: Any) -> list[tuple[str, str]]:
    """``(name, identity)`` per input of the partitioned argument, in the order the stage gets
    them: the name decides partition boundaries (see :mod:`snapstore.write.boundaries`), the
    identity whether an input changed.

    Parameters
    ----------
    values : Inputs or sequence
        ``snapstore.files(...)`` (anything with ``__snapstore_inputs__``: names and identities
        as it gives them) or a sequence of plain values (each value's digest is both its name
        and its identity).

    Raises
    ------
    FingerprintError
        If an element cannot be hashed.
    """
    hook = getattr(type(values), "__snapstore_inputs__", None)
    if hook is not None:
        identity = hook(values)
        names = list(identity) if not hasattr(values, "names") else list(values.names)
        return [(name, _digest(identity[name])) for name in names]
    out = []
    for i, value in enumerate(values):
        digest = hash_value(value, f"partitioned input {i}")
        out.append((digest, digest))
    return out


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def stage_key(
    parts: Mapping[str, str],
    details: Mapping[str, Any],
    partition_by: str,
    values: Mapping[str, Any],
    *,
    arguments: str | None = None,
    schema: Any = None,
) -> str:
    """The identity a partitioned stage gives every partition, the partitioned input left out.

    Parameters
    ----------
    parts, details : mapping
        The whole call's fingerprint parts and details (as its manifest records them).
    partition_by : str
        The partitioned argument.
    values : mapping
        The call's bound arguments (defaults applied), to hash the other declared inputs.
    arguments : str, optional
        The digest that stands for the arguments, for a stage with ``key=`` (``key`` of the
        partition's call varies by partition: pass it to :func:`partition_fingerprint`
        instead and leave this None).
    schema : JSON-able, optional
        The stage's declared schema (``Schema.to_json()``), which decides the types partitions
        store: partitions written under another declaration (or none) are not reused.

    Returns
    -------
    str
        32 hex characters: the directory the stage's partitions are kept under.

    Raises
    ------
    FingerprintError
        If ``parts`` lacks a part (a fingerprint of another kind) or an input cannot be hashed.
    """
    missing = [name for name in _STAGE_PARTS if name not in parts]
    if missing:
        raise FingerprintError(
            f"partitioned stage: its fingerprint has no {missing} part(s); expected a stage "
            "call's fingerprint (snapstore.fingerprint.fingerprint_stage)"
        )
    plain = {a: d for a, d in dict(details.get("arguments") or {}).items() if a != partition_by}
    others: dict[str, str] = {}
    for name, value in values.items():
        if name == partition_by:
            continue
        digest = declared_digest(value, "inputs")
        if digest is not None:
            others[name] = digest
    identity = {name: parts[name] for name in _STAGE_PARTS}
    identity |= {
        "partition_scheme": hash_value(PARTITION_SCHEME),
        "partition_by": hash_value(partition_by),
        "arguments": arguments or hash_value(plain, "argument digests"),
        "keyed": hash_value(details.get("key")),
        "inputs": hash_value(others, "input digests"),
        "ignored": hash_value(sorted(details.get("ignored") or [])),
    }
    if schema is not None:  # absent otherwise: keys of stages without a declaration unchanged
        identity["schema"] = hash_value(schema, "declared schema")
    h = hashlib.sha256()
    feed_item(h, b"snapstore-partitioned-stage")
    for name in sorted(identity):
        feed_item(h, name.encode(), identity[name].encode())
    return h.hexdigest()[:32]


def partition_fingerprint(
    key: str, inputs: Sequence[tuple[str, str]], *, arguments: str | None = None
) -> str:
    """The fingerprint of one partition: its stage's ``key`` and its members, in order
    (``arguments``: a keyed stage's ``key`` of the partition's call, hashed)."""
    h = hashlib.sha256()
    feed_item(h, b"snapstore-partition", key.encode())
    if arguments is not None:
        feed_item(h, b"arguments", arguments.encode())
    feed_item(h, b"members", len(inputs).to_bytes(8, "big"))
    for name, identity in inputs:
        feed_item(h, b"name", name.encode("utf-8", "surrogatepass"))
        feed_item(h, b"identity", identity.encode())
    return h.hexdigest()[:32]
