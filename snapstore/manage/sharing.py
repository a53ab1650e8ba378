"""Partitions shared by snapshots: which committed snapshots reference each, and its bytes.

Format version 4 keeps the partitions of a partitioned stage once, under
``parts/<stage key>/<partition fp>`` at the root, and every snapshot assembled from them lists
them in its manifest's ``shared_partitions`` (docs/format.md, section 10.6). The tools count
such a partition once (``du``, the total of ``ls``), say how many of a snapshot's partitions
another snapshot uses too (``ls``, ``info``), and compare two snapshots' partitions (``diff``).

A partition is named here by its reference, ``<stage key>/<partition fp>``. Its bytes come from
listings of ``parts/`` (one listing of the whole directory, or per stage key a few prefix
listings sent at once), never from a request per partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import FormatError, SnapshotNotFoundError
from ..format import layout as fmt
from ..read.reader import load_manifest
from ..storage.claims import CLAIMS_DIR
from ..storage.listing import map_concurrently
from ..storage.store import Store
from ..write.partitions import PartitionLayout

__all__ = [
    "Sharing",
    "diff_partitions",
    "list_partitions",
    "partition_refs",
    "partition_sizes",
    "read_references",
]


def partition_refs(manifest: Mapping[str, Any]) -> list[str]:
    """The shared partitions a committed manifest references, in order, as
    ``<stage key>/<partition fp>`` (empty for a snapshot not assembled from shared partitions).

    Raises
    ------
    FormatError
        If a reference is not two plain names.
    """
    refs = manifest.get("shared_partitions") or []
    if not isinstance(refs, list):
        raise FormatError(
            f"manifest of {manifest.get('fingerprint')}: expected 'shared_partitions' to be a "
            f"list of '<stage key>/<partition fp>', found {refs!r}"
        )
    for ref in refs:
        parts = ref.split("/") if isinstance(ref, str) else []
        if len(parts) != 2 or not all(fmt.is_plain_name(p) for p in parts):
            raise FormatError(
                f"manifest of {manifest.get('fingerprint')}: expected each shared partition as "
                f"'<stage key>/<partition fp>' (two plain names), found {ref!r}"
            )
    return list(refs)


def partition_sizes(tree: Mapping[str, int]) -> dict[str, int]:
    """Bytes under each partition directory of a tree of the root's ``parts/`` directory (paths
    ``<stage key>/<partition fp>/...``), by reference. A partition directory is one holding a
    commit record, runs or claims; anything else under a stage key (its pins) is not one."""
    sizes: dict[str, int] = {}
    for rel, size in tree.items():
        parts = rel.split("/", 3)
        if len(parts) >= 3 and parts[2] in _PARTITION_ENTRIES:
            ref = f"{parts[0]}/{parts[1]}"
            sizes[ref] = sizes.get(ref, 0) + size
    return sizes


# What a partition directory holds (docs/format.md, section 10.6).
_PARTITION_ENTRIES = frozenset({fmt.COMMIT_NAME, "runs", CLAIMS_DIR})


def list_partitions(store: Store, refs: Iterable[str]) -> dict[str, int]:
    """A tree of ``parts/`` covering the partitions ``refs`` (and perhaps others of their
    stages): per stage key, the prefix listings of :meth:`PartitionLayout.prefixes`, all of
    every stage in flight at once."""
    by_stage: dict[str, list[str]] = {}
    for ref in refs:
        key, name = ref.split("/", 1)
        by_stage.setdefault(key, []).append(name)
    jobs = [
        (key, prefix)
        for key, names in by_stage.items()
        for prefix in PartitionLayout.shared(key, names).prefixes(range(len(names)))
    ]

    def listed(job: tuple[str, str]) -> dict[str, int]:
        key, prefix = job
        found = store.list_tree(f"{fmt.SHARED_PARTS_DIR}/{key}", prefix)
        return {f"{key}/{rel}": size for rel, size in found.items()}

    tree: dict[str, int] = {}
    for part in map_concurrently(listed, jobs):
        tree.update(part)
    return tree


def read_references(store: Store, fingerprints: Sequence[str]) -> dict[str, list[str]]:
    """The shared partitions each committed snapshot of ``fingerprints`` references, its
    manifest read concurrently with the others'. A snapshot whose manifest does not load (gone
    meanwhile, or damaged: ``snapstore verify`` reports it) references nothing here."""

    def refs_of(fp: str) -> list[str] | None:
        try:
            return partition_refs(load_manifest(store, fp))
        except (FormatError, SnapshotNotFoundError):
            return None

    found = map_concurrently(refs_of, list(fingerprints))
    return {fp: refs for fp, refs in zip(fingerprints, found) if refs is not None}


@dataclass(frozen=True)
class Sharing:
    """Who references which shared partition, and the bytes of each.

    Attributes
    ----------
    refs : dict
        Fingerprint of a committed snapshot to the partitions it references, in order.
    sizes : dict
        Reference to the bytes under its directory: every partition directory listed, whether
        a snapshot references it or not.
    """

    refs: Mapping[str, Sequence[str]]
    sizes: Mapping[str, int]
    users: dict[str, list[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        users: dict[str, list[str]] = {}
        for fp, refs in self.refs.items():
            for ref in dict.fromkeys(refs):
                users.setdefault(ref, []).append(fp)
        object.__setattr__(self, "users", users)

    def shared(self, ref: str) -> bool:
        """Whether more than one committed snapshot references ``ref``."""
        return len(self.users.get(ref, ())) > 1

    def summary(self, fingerprint: str) -> dict[str, Any]:
        """What ``info`` shows of one snapshot's partitions: ``partitions_shared`` (how many
        another committed snapshot references too), ``partition_bytes`` (bytes of all its
        partitions), ``shared_bytes`` (of those shared) and ``shared_with`` (the other
        snapshots that share one, by fingerprint)."""
        refs = list(dict.fromkeys(self.refs.get(fingerprint, ())))
        shared = [r for r in refs if self.shared(r)]
        others = {fp for r in shared for fp in self.users[r] if fp != fingerprint}
        return {
            "partitions_shared": len(shared),
            "partition_bytes": sum(self.sizes.get(r, 0) for r in refs),
            "shared_bytes": sum(self.sizes.get(r, 0) for r in shared),
            "shared_with": sorted(others),
        }

    def bytes_once(self, fingerprints: Iterable[str]) -> int:
        """Bytes of the partitions these snapshots reference, each partition counted once."""
        refs = {r for fp in fingerprints for r in self.refs.get(fp, ())}
        return sum(self.sizes.get(r, 0) for r in refs)

    def unreferenced(self) -> dict[str, int]:
        """Partition directories no committed snapshot references (being computed, or left by
        a crash or a removal), with their bytes."""
        return {r: size for r, size in self.sizes.items() if r not in self.users}


def diff_partitions(a: Sequence[str], b: Sequence[str]) -> dict[str, list[str]] | None:
    """How snapshot ``b``'s partitions differ from ``a``'s: ``shared`` (in both, in ``b``'s
    order), ``new`` (only in ``b``, in its order) and ``dropped`` (only in ``a``, in its order);
    None when neither is made of shared partitions."""
    if not a and not b:
        return None
    in_a, in_b = set(a), set(b)
    return {
        "shared": [r for r in b if r in in_a],
        "new": [r for r in b if r not in in_a],
        "dropped": [r for r in a if r not in in_b],
    }
