"""Partitioned writes: a stage over a list of inputs, written and committed partition by partition.

Pure and engine-free: :func:`write_partition` writes one partition and commits it as a small
snapshot of its own (same files and commit protocol as a whole snapshot), and
:func:`commit_partitions` assembles the finished partitions into the snapshot: one block index
over all of them and a manifest whose shard entries point into the partitions' runs. A crash
between the two loses nothing but the current partition: a rerun finds the finished ones by
their commit records and computes the rest. The written order is the partitions' in order,
whoever computed each.

Where partitions live is a :class:`PartitionLayout`:

- **shared** (a stage's ``partition_by``, format version 4): under
  ``parts/<stage key>/<partition fingerprint>`` at the root, outside any snapshot, so every
  snapshot of the stage whose inputs include a partition's members uses the one copy (see
  :mod:`snapstore.fingerprint.partition`); shard entries point there with ``"shared"``;
- **numbered** (engines' jobs such as Ray Data's, and format versions up to 3):
  ``<fp>/parts/<p>``, owned by the one snapshot; shard entries point there with ``"dir"``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import FormatError, SchemaError
from ..format import layout as fmt
from ..format.checksums import WRITTEN
from ..format.inference import merge_stored
from ..format.schema import Schema
from ..oldpaths import historic_name
from ..read.reader import SnapshotReader
from ..storage.claims import CLAIMS_DIR, remove_claims
from ..storage.listing import list_prefixes, listing_workers, map_concurrently
from ..storage.pins import PINS_DIR, Pin
from ..storage.store import Store
from .times import WriteTimes
from .writer import (
    Columns,
    ProgressCallback,
    SnapshotWriter,
    WriteOptions,
    build_manifest,
    new_run_id,
    publish,
)

__all__ = [
    "SHARED_DIR",
    "PartitionLayout",
    "PartitionStatus",
    "commit_partitions",
    "holding_stage",
    "partition_dir",
    "partition_done",
    "partition_status",
    "remove_listed_claims",
    "remove_partition_claims",
    "write_partition",
]

log = logging.getLogger(historic_name(__name__))

PARTS_DIR = "parts"
SHARED_DIR = fmt.SHARED_PARTS_DIR
"""The root's directory of shared partitions: ``parts/<stage key>/<partition fingerprint>``."""


@dataclass(frozen=True)
class PartitionLayout:
    """Where the partitions of one partitioned write live.

    Attributes
    ----------
    base : str
        The directory holding them, relative to the root: ``<fp>/parts`` (numbered) or
        ``parts/<stage key>`` (shared).
    names : tuple of str, optional
        Shared: partition ``p``'s directory name (its fingerprint) is ``names[p]``. None:
        numbered, ``p`` as six digits.
    """

    base: str
    names: tuple[str, ...] | None = None

    @classmethod
    def numbered(cls, fingerprint: str) -> PartitionLayout:
        """A snapshot's own partitions, ``<fp>/parts/<p>``."""
        return cls(f"{fingerprint}/{PARTS_DIR}")

    @classmethod
    def shared(cls, stage_key: str, fingerprints: Sequence[str]) -> PartitionLayout:
        """A stage's shared partitions, ``parts/<stage key>/<partition fingerprint>``."""
        return cls(f"{SHARED_DIR}/{stage_key}", tuple(fingerprints))

    @property
    def is_shared(self) -> bool:
        return self.names is not None

    def name(self, partition: int) -> str:
        """Partition ``partition``'s directory name."""
        return f"{partition:06d}" if self.names is None else self.names[partition]

    def dir(self, partition: int) -> str:
        """Where partition ``partition`` lives, relative to the root."""
        return f"{self.base}/{self.name(partition)}"

    def prefixes(self, partitions: Iterable[int]) -> list[str]:
        """Prefixes of the names in :attr:`base` whose listings, sent at once, cover
        ``partitions``."""
        names = {self.name(p) for p in partitions}
        if self.names is None:
            return status_prefixes_of(names)
        # Fingerprints are uniform hex: about 256 partitions (a page of 1,000 objects or two)
        # per listing, at most listing_workers listings.
        digits = 0
        while len(names) >> (4 * digits) > 256 and 16 ** (digits + 1) <= listing_workers:
            digits += 1
        return sorted({name[:digits] for name in names})


def _layout(where: str | PartitionLayout) -> PartitionLayout:
    return where if isinstance(where, PartitionLayout) else PartitionLayout.numbered(where)


def partition_dir(fingerprint: str | PartitionLayout, partition: int) -> str:
    """Where partition ``partition`` of ``fingerprint`` (or of a layout) lives, relative to the
    root."""
    return _layout(fingerprint).dir(partition)


def partition_done(store: Store, fingerprint: str | PartitionLayout, partition: int) -> bool:
    """Whether the partition is committed."""
    return store.exists(f"{partition_dir(fingerprint, partition)}/{fmt.COMMIT_NAME}")


@dataclass(frozen=True)
class PartitionStatus:
    """What listings say about a partitioned stage's partitions.

    Attributes
    ----------
    committed : frozenset of int
        The partitions with a commit record.
    claims : dict
        For each partition not committed whose claims directory holds files, their names (to
        judge the claim with :func:`snapstore.storage.claims.inspect_claim`); partitions with no
        claim file are absent.
    """

    committed: frozenset[int] = frozenset()
    claims: dict[int, list[str]] = field(default_factory=dict)


# Partitions per prefix listing, at least: 10**2, so that a listing of partitions of a few
# shards each fits one page of 1,000 objects. Coarser (10**3, ...) only when finer would take
# more listings than are sent at once (listing_workers), i.e. beyond 12,800 partitions.
_MIN_GROUP_DIGITS = 2


def status_prefixes(partitions: Iterable[int]) -> list[str]:
    """Prefixes (of the ``parts`` directory's names) that together cover ``partitions``: as
    fine as lets all their listings be in flight at once."""
    return status_prefixes_of({f"{p:06d}" for p in partitions})


def status_prefixes_of(names: set[str]) -> list[str]:
    """:func:`status_prefixes` of numbered partitions' directory names."""
    for digits in range(_MIN_GROUP_DIGITS, 8):
        prefixes = {name[: max(len(name) - digits, 0)] for name in names}
        if len(prefixes) <= listing_workers:
            break
    return sorted(prefixes)


def partition_status(
    store: Store, fingerprint: str | PartitionLayout, partitions: Iterable[int]
) -> PartitionStatus:
    """Which of ``partitions`` are committed and which have claim files, from listings of the
    partitions' directory (:meth:`PartitionLayout.prefixes`) sent all at once: about
    ``ceil(objects per listing / 1000)`` round trips on an object store, not one per
    partition."""
    layout = _layout(fingerprint)
    wanted = {layout.name(p): p for p in partitions}
    tree = list_prefixes(store, layout.base, layout.prefixes(wanted.values()))
    committed: set[int] = set()
    claimed: dict[int, list[str]] = {}
    for rel in tree:
        name, _, inside = rel.partition("/")
        p = wanted.get(name)
        if p is None:
            continue
        if inside == fmt.COMMIT_NAME:
            committed.add(p)
        elif inside.startswith(f"{CLAIMS_DIR}/") and not inside.endswith("/"):
            claimed.setdefault(p, []).append(inside[len(CLAIMS_DIR) + 1 :])
    claims = {p: sorted(n) for p, n in claimed.items() if p not in committed}
    return PartitionStatus(frozenset(committed), claims)


def remove_partition_claims(
    store: Store, fingerprint: str | PartitionLayout, partitions: Iterable[int]
) -> None:
    """Best effort, once the snapshot is committed: delete the claims that listings show under
    ``partitions``, concurrently (not one request per partition). A snapshot's own partitions
    lose their claims directories; shared ones only the claim files listed (see
    :func:`remove_listed_claims`): another job may be claiming one anew meanwhile."""
    layout = _layout(fingerprint)
    ids = list(partitions)
    wanted = {layout.name(p) for p in ids}
    tree = list_prefixes(store, layout.base, layout.prefixes(ids))
    listed: dict[str, list[str]] = {}
    for rel in tree:
        name, _, inside = rel.partition("/")
        if name in wanted and inside.startswith(f"{CLAIMS_DIR}/"):
            listed.setdefault(name, []).append(inside[len(CLAIMS_DIR) + 1 :])
    if layout.is_shared:
        items = sorted(listed.items())
        map_concurrently(
            lambda i: remove_listed_claims(store, f"{layout.base}/{i[0]}", i[1]), items
        )
    else:
        map_concurrently(lambda name: remove_claims(store, f"{layout.base}/{name}"), sorted(listed))


def remove_listed_claims(store: Store, where: str, names: Iterable[str]) -> None:
    """Best effort: delete the claim files ``names`` (as a listing of ``where``'s claims showed
    them), heartbeats first and claim files last, then the claims directory if that leaves it
    empty. A file written since the listing, or one being created (a temporary name), stays:
    removing the whole directory could take a claim from under a job that is creating it."""
    rank = {"beat": 0, "released": 1, "claim": 2}
    order = sorted(
        (n for n in names if "/" not in n and not n.startswith(".")),
        key=lambda n: (rank.get(n.split("-", 1)[0], -1), n),
    )
    try:
        for name in order:
            store.remove_tree(f"{where}/{CLAIMS_DIR}/{name}")
        store.remove_empty_dir(f"{where}/{CLAIMS_DIR}")
    except Exception:  # gc removes what is left
        log.debug("could not remove the claims of %s", where, exc_info=True)


@contextlib.contextmanager
def holding_stage(store: Store, layout: PartitionLayout) -> Iterator[None]:
    """Pin a stage's shared partitions while a job finds, computes and assembles them.

    The pin (``parts/<stage key>/pins/pin-<owner>-<k>``, renewed on a thread like a reader's,
    see :mod:`snapstore.storage.pins`) is written before the job looks at any partition and
    taken down once its snapshot is committed (and so references them): ``snapstore gc`` and
    ``rm`` leave every partition of a stage with a live pin alone (see
    :mod:`snapstore.manage.release`). Directories left empty are removed afterwards. A
    numbered layout is not pinned.
    """
    if not layout.is_shared:
        yield
        return
    handle = Pin(store, layout.base)
    try:
        handle.renew()
        handle.start()
        yield
    finally:
        handle.release()
        # A job that committed nothing leaves no empty directory (each step refuses a
        # directory another job has put something in).
        for path in (f"{layout.base}/{PINS_DIR}", layout.base, SHARED_DIR):
            if not store.remove_empty_dir(path):
                break


def write_partition(
    store: Store,
    fingerprint: str | PartitionLayout,
    partition: int,
    samples: Callable[[], Iterable[Mapping[str, Any] | Columns]],
    *,
    schema: Schema | None = None,
    options: WriteOptions | None = None,
    progress: ProgressCallback | None = None,
    times: WriteTimes | None = None,
) -> bool:
    """Compute one partition (``samples()``) and commit it; on any error nothing is committed.
    Where its time went is added to ``times``, if given (see :mod:`snapstore.write.times`).

    Returns
    -------
    bool
        True if this call's run became the partition, False if another job committed it first.
    """
    layout = _layout(fingerprint)
    if layout.is_shared:  # shared by snapshots: it names its stage and its own fingerprint
        extra: dict[str, Any] = {"partition_of": layout.base.rsplit("/", 1)[-1]}
    else:
        extra = {"partition": partition, "snapshot": layout.base.rsplit("/", 1)[0]}
    writer = SnapshotWriter(
        store,
        layout.dir(partition),
        extra,
        schema=schema,
        options=options,
        progress=progress,
    )
    try:
        writer.add_all(samples)
    except BaseException:
        writer.abort()
        raise
    won = writer.commit()
    if times is not None:
        times.add(writer.times)
    return won


def _check_checksums(
    readers: list[SnapshotReader], ids: list[int], fingerprint: str, layout: PartitionLayout
) -> None:
    """Refuse partitions whose blocks carry another checksum than this version writes: the
    assembled manifest names one algorithm for every block."""
    for p, reader in zip(ids, readers):
        if reader.checksum is not WRITTEN:
            raise FormatError(
                f"partition {p} of {fingerprint} has {reader.checksum.name} block checksums "
                f"(format version {reader.manifest.get('format_version')}); this snapstore "
                f"assembles {WRITTEN.name} ones. Remove {layout.dir(p)} "
                "and compute the partition again."
            )


def commit_partitions(
    store: Store,
    fingerprint: str,
    partitions: int | Sequence[int],
    manifest_extra: Mapping[str, Any] | None = None,
    *,
    schema: Schema | None = None,
    layout: PartitionLayout | None = None,
) -> bool:
    """Assemble committed partitions into the snapshot and commit it, in the order given.

    Parameters
    ----------
    partitions : int or sequence of int
        A count ``n`` means partitions ``0 .. n-1``; a sequence names the partition ids (an
        engine's task indices need not be consecutive).
    layout : PartitionLayout, optional
        Where the partitions are: by default the snapshot's own (``<fp>/parts/<p>``). Shared
        ones are referenced by the manifest (``shared_partitions``, in order), so that
        management keeps them while the snapshot exists.

    Raises
    ------
    FormatError
        If a partition is not committed.
    SchemaError
        If partitions inferred different schemas (declare one with ``schema=``).

    Returns
    -------
    bool
        True if this call committed the snapshot, False if another job had already.
    """
    ids = list(range(partitions)) if isinstance(partitions, int) else [int(p) for p in partitions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"partitions: expected distinct partition ids, found {ids}")
    layout = layout or PartitionLayout.numbered(fingerprint)
    readers = map_concurrently(lambda p: _partition_reader(store, layout, p, fingerprint), ids)
    _check_checksums(readers, ids, fingerprint, layout)
    merged = _merged_schema(readers, ids, schema, fingerprint)
    index, shards = _joined(readers, fingerprint, layout)
    index_bytes = fmt.write_index(index)
    run = new_run_id()
    manifests = [r.manifest for r in readers]
    manifest = build_manifest(
        fingerprint,
        run,
        manifest_extra or {},
        schema=merged,
        schema_declared=schema is not None,
        totals={
            "num_samples": sum(int(m["num_samples"]) for m in manifests),
            "num_blocks": len(index),
            "raw_bytes": sum(int(m["raw_bytes"]) for m in manifests),
            "stored_bytes": sum(int(m["stored_bytes"]) for m in manifests),
        },
        shards=shards,
        index_bytes=index_bytes,
        write_options=manifests[0].get("write_options", {}) if manifests else {},
        more={
            "partitions": len(ids),
            **({} if ids == list(range(len(ids))) or layout.is_shared else {"partition_ids": ids}),
            **(_shared_refs(layout, ids) if layout.is_shared else {}),
        },
    )
    won = publish(store, fingerprint, run, index_bytes, manifest)
    if not won:
        store.remove_tree(f"{fingerprint}/runs/{run}")
    return won


# Seconds between looks at a shared partition's missing commit record: a removal that found the
# stage in use puts it back (snapstore.manage.release).
_RESTORE_DELAYS = (0.25, 0.5, 1.0, 2.0)


def _partition_reader(
    store: Store, layout: PartitionLayout, partition: int, fingerprint: str
) -> SnapshotReader:
    """Partition ``partition``'s reader (commit record, manifest, index); opened for every
    partition at once, so a partition that is not committed is found without a listing."""
    where = layout.dir(partition)
    for delay in _RESTORE_DELAYS if layout.is_shared else ():
        with contextlib.suppress(FileNotFoundError):
            return SnapshotReader(store, where)
        time.sleep(delay)
    try:
        return SnapshotReader(store, where)
    except FileNotFoundError as exc:  # SnapshotNotFoundError among them
        raise FormatError(
            f"partition {partition} of {fingerprint} ({where}) under {store.url} is not "
            "committed; compute it before assembling the snapshot"
        ) from exc


def _shared_refs(layout: PartitionLayout, ids: list[int]) -> dict[str, Any]:
    """The manifest's references to the shared partitions it is made of, in order."""
    stage_key = layout.base.rsplit("/", 1)[-1]
    return {"shared_partitions": [f"{stage_key}/{layout.name(p)}" for p in ids]}


def _joined(
    readers: list[SnapshotReader], fingerprint: str, layout: PartitionLayout
) -> tuple[np.ndarray[Any, Any], list[dict[str, Any]]]:
    """The partitions' block indexes as one (shard numbers offset) and their shard entries,
    each pointing into its partition's run: ``dir`` under the snapshot, or ``shared`` under
    the root's shared partitions."""
    indexes: list[np.ndarray[Any, Any]] = []
    shards: list[dict[str, Any]] = []
    for reader in readers:
        index = reader.index.copy()
        index["shard"] += len(shards)
        indexes.append(index)
        if layout.is_shared:
            key, where = "shared", reader.run_dir.removeprefix(f"{SHARED_DIR}/")
        else:
            key, where = "dir", reader.run_dir.removeprefix(f"{fingerprint}/")
        for entry, name in zip(reader.manifest["shards"], reader.shard_paths):
            shards.append({**entry, "path": name.rsplit("/", 1)[-1], key: where})
    index = np.concatenate(indexes) if indexes else np.zeros(0, fmt.INDEX_DTYPE)
    return index, shards


def _merged_schema(
    readers: list[SnapshotReader], ids: list[int], declared: Schema | None, fp: str
) -> Schema:
    if declared is not None:
        for p, reader in zip(ids, readers):
            if len(reader) and merge_stored(declared, reader.schema) != declared:
                raise SchemaError(
                    f"partition {p} of {fp} stores {reader.schema.to_json()}, not the declared "
                    f"schema {declared.to_json()}; it was written under another declaration. "
                    "Remove it (snapstore gc, or rm of the snapshots using it) and compute it "
                    "again."
                )
        return declared
    found: Schema | None = None
    for p, reader in zip(ids, readers):
        if not len(reader):
            continue  # an empty partition inferred nothing
        if found is None:
            found = reader.schema
            continue
        merged = merge_stored(found, reader.schema)
        if merged is None:
            raise SchemaError(
                f"partitions of {fp} inferred different schemas: partition {p} has "
                f"{reader.schema.to_json()}, earlier ones {found.to_json()}. Each partition "
                "infers its schema from its own samples, so an array whose samples all had one "
                "shape in a partition (a partition of one input, say) is stored fixed there "
                "and varying elsewhere. Declare the schema with snapshot(..., schema=...) so "
                f"every partition writes the same types{_declaration(found, reader.schema)}."
            )
        found = merged  # one partition saw None where another did not: the field is nullable
    return found or Schema(())


def _declaration(a: Schema, b: Schema) -> str:
    """``, e.g. schema={...}`` for the fields two partitions' schemas disagree on where one
    declaration reads both (arrays of one dtype and rank: the differing dimensions varying)."""
    known = {f.name: f for f in b.fields}
    hints = []
    for x in a.fields:
        y = known.get(x.name)
        if y is None or x == y or x.kind != "array" or y.kind != "array":
            continue
        if x.dtype != y.dtype or x.shape is None or y.shape is None or len(x.shape) != len(y.shape):
            continue
        shape = tuple(i if i == j else None for i, j in zip(x.shape, y.shape))
        hints.append(f"{x.name!r}: ({x.dtype!r}, {shape!r})")
    return f", e.g. schema={{{', '.join(hints)}, ...}}" if hints else ""
