"""Reading a committed snapshot: random access, written-order iteration and batches.

The reader starts from the commit record, never from a listing: ``COMMIT`` names the run and the
manifest's size and checksum; the manifest names the index and shards, each checked to be a
plain file inside the run. Every block is verified (length and CRC-32) before it is decoded.

Which samples a consumer reads, and in what order, is decided by
:class:`snapstore.format.plan.EpochPlan` (a pure function of the block index, seed, epoch and
partition); this module only fetches and decodes the blocks the plan names, ahead of the consumer,
through :mod:`snapstore.read.prefetch`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tracing
from ..errors import FormatError, SnapshotNotFoundError, SnapshotRemovedError, SnapstoreError
from ..format import layout as fmt
from ..format.checksums import file_checksum, snapshot_checksum
from ..format.columns import BlockColumns
from ..format.plan import EpochPlan, PlanOptions
from ..format.schema import Schema
from ..oldpaths import historic_name
from ..storage import hostindex
from ..storage.store import Store
from . import crowd
from .prefetch import Fetch, Prefetcher, PrefetchLimits, SharedDecoders

if TYPE_CHECKING:
    from ..storage.pins import ReadGuard

__all__ = [
    "SnapshotMetadata",
    "SnapshotReader",
    "load_manifest",
    "read_metadata",
    "read_record",
    "removed_message",
]

log = logging.getLogger(historic_name(__name__))

# Decoded blocks kept for random access; 8 x 1 MiB blocks by default.
_RANDOM_ACCESS_CACHE_BLOCKS = 8
# A compressed block index up to this size travels with a dataset to worker processes (larger
# ones are read there from the per-host copy or the store).
_SHARE_INDEX_BYTES = 16 << 20


@dataclass(frozen=True)
class SnapshotMetadata:
    """What opening a committed snapshot reads before its first block, read once per handle.

    ``record`` is the commit record's bytes (a reader that pins compares a fresh read with them);
    ``manifest`` is validated against the record; ``index`` is the block index's bytes when
    they were fetched along with the manifest (a :class:`SnapshotReader` checks them against
    the manifest), None when the reader is to read it.
    """

    record: bytes
    manifest: dict[str, Any]
    index: bytes | None = None


def read_record(store: Store, fingerprint: str) -> bytes:
    """The bytes of ``fingerprint``'s commit record: one request.

    Raises
    ------
    SnapshotNotFoundError
        If no commit record exists for ``fingerprint``.
    """
    try:
        return _read_traced(store, f"{fingerprint}/{fmt.COMMIT_NAME}")
    except FileNotFoundError as exc:
        raise SnapshotNotFoundError(
            f"no committed snapshot {fingerprint} under {store.url}; run the stage (or "
            "snap.materialize()) to create it, or check the root with `snapstore ls`."
        ) from exc


def load_manifest(store: Store, fingerprint: str) -> dict[str, Any]:
    """The manifest of a committed snapshot, validated against its commit record.

    Raises
    ------
    SnapshotNotFoundError
        If no commit record exists for ``fingerprint``.
    FormatError
        If the record or manifest is corrupt, foreign or of another format version.
    """
    return read_metadata(store, fingerprint, with_index=False).manifest


def read_metadata(
    store: Store, fingerprint: str, record: bytes | None = None, *, with_index: bool = True
) -> SnapshotMetadata:
    """The commit record (``record``, if already read), the manifest and, from a remote store,
    the block index: the manifest and the index are fetched in parallel (two round trips in
    all, one when ``record`` is given), since the index's path follows from the record.

    Raises
    ------
    SnapshotNotFoundError
        If no commit record exists for ``fingerprint``.
    FormatError
        If the record or manifest is corrupt, foreign or of another format version.
    """
    record = read_record(store, fingerprint) if record is None else record
    where = store.join(f"{fingerprint}/{fmt.COMMIT_NAME}")
    commit = fmt.CommitRecord.from_bytes(record, where)
    if commit.fingerprint != fingerprint:
        raise FormatError(f"{where} belongs to fingerprint {commit.fingerprint}, not {fingerprint}")
    run_dir = f"{fingerprint}/runs/{commit.run}"
    # A local index read costs no round trip; a copy of it on this host costs none either.
    if not with_index or store.local or hostindex.exists(fingerprint, commit.run):
        return SnapshotMetadata(record, _read_manifest(store, commit, where, run_dir))
    # The writer names the index INDEX_NAME; the reader checks it against the manifest's entry.
    with ThreadPoolExecutor(1, thread_name_prefix="snapstore-index") as pool:
        index = pool.submit(_read_if_readable, store, f"{run_dir}/{fmt.INDEX_NAME}")
        manifest = _read_manifest(store, commit, where, run_dir)
        data = index.result()
    entry = manifest.get("index")  # a malformed one: SnapshotReader says so
    named = entry.get("path") if isinstance(entry, dict) else None
    return SnapshotMetadata(record, manifest, data if named == fmt.INDEX_NAME else None)


def _read_traced(store: Store, path: str) -> bytes:
    """``store.read_bytes(path)``, traced as an ``open`` span (:mod:`snapstore.tracing`) with
    the path and the bytes read: the requests of opening a snapshot."""
    with tracing.span("open", "read") as recorded:
        data = store.read_bytes(path)
        if recorded is not None:
            recorded.args.update(path=path, bytes=len(data))
    return data


def removed_message(store: Store, fingerprint: str, why: str) -> str:
    """The message of a :class:`SnapshotRemovedError`: ``why`` says what happened."""
    return (
        f"snapshot {fingerprint} under {store.url} {why}; what was read before is intact "
        "(every block is checksummed), but reading cannot go on. Open it again (a stage "
        "computes it again), and keep `snapstore rm`/`gc` away from snapshots in use"
    )


def _read_manifest(
    store: Store, record: fmt.CommitRecord, where: str, run_dir: str
) -> dict[str, Any]:
    path = f"{run_dir}/{fmt.MANIFEST_NAME}"
    try:
        data = _read_traced(store, path)
    except FileNotFoundError as exc:
        raise FormatError(f"{where} names run {record.run}, whose manifest is missing") from exc
    if len(data) != record.manifest_size or record.checksum(data) != record.manifest_checksum:
        raise FormatError(
            f"manifest {store.join(path)} does not match its commit record; it is corrupt"
        )
    manifest = fmt.load_json(data, store.join(path))
    fmt.check_version(manifest, store.join(path))
    if manifest.get("fingerprint") != record.fingerprint or manifest.get("run") != record.run:
        raise FormatError(f"manifest {store.join(path)} belongs to another snapshot or run")
    return manifest


def _read_if_readable(store: Store, path: str) -> bytes | None:
    """A speculative read: None if it fails (the reader reads the file again, and says why)."""
    try:
        return _read_traced(store, path)
    except (OSError, SnapstoreError):
        log.debug("snapstore: could not read %s ahead", store.join(path), exc_info=True)
        return None


class SnapshotReader:
    """Random and sequential access to one committed snapshot.

    Parameters
    ----------
    store : Store
        Where the snapshot lives.
    fingerprint : str
        Its full fingerprint.
    decode_threads : int, optional
        Threads that verify and decompress blocks ahead of the consumer; default: the number
        of CPUs, at most 4.
    metadata : SnapshotMetadata, optional
        The commit record, manifest and index already read (:func:`read_metadata`); default:
        read them now.
    """

    def __init__(
        self,
        store: Store,
        fingerprint: str,
        *,
        decode_threads: int | None = None,
        metadata: SnapshotMetadata | None = None,
    ) -> None:
        self.store = store
        self.decode_threads = decode_threads or min(4, os.cpu_count() or 1)
        self.fingerprint = fingerprint
        if metadata is None:
            metadata = read_metadata(store, fingerprint)
        self.manifest = metadata.manifest
        self.record = metadata.record
        self._index_data = metadata.index
        self.guard: ReadGuard | None = None  # set by the Snapshot that pins this reader
        try:
            self._open_index()
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(
                f"manifest of {fingerprint} under {store.url} is missing or has a malformed "
                f"entry ({exc!r}); the snapshot is corrupt: remove it and rebuild it"
            ) from exc
        # Workers map this host's copy, if there is one, rather than receive the bytes.
        small = metadata.index is not None and len(metadata.index) <= _SHARE_INDEX_BYTES
        shared = metadata.index if small and self.index_copy is None else None
        self.shareable = SnapshotMetadata(metadata.record, self.manifest, shared)
        """The metadata, verified, for another process to open this snapshot with no request."""
        self._cache: collections.OrderedDict[int, BlockColumns] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _open_index(self) -> None:
        self.run_dir = f"{self.fingerprint}/runs/{self.manifest['run']}"
        self.schema = Schema.from_json(self.manifest["schema"])
        self._arrow_schema = self.schema.arrow_schema()
        self.shard_paths = [self._shard_path(s) for s in self.manifest["shards"]]
        where = self.store.join(f"{self.run_dir}/{fmt.MANIFEST_NAME}")
        self.checksum = snapshot_checksum(self.manifest, where)
        """The checksum algorithm of the snapshot's blocks and index (its manifest's)."""
        self.index_copy: Path | None = None
        """The per-host index copy the index is mapped from (None: it is in memory)."""
        self.index, self.offsets = self._load_index()
        if int(self.offsets[-1]) != int(self.manifest["num_samples"]):
            raise FormatError(
                f"index of {self.fingerprint} holds {int(self.offsets[-1])} samples but the "
                f"manifest says {self.manifest['num_samples']}; the snapshot is corrupt"
            )

    def _shard_path(self, entry: dict[str, Any]) -> str:
        """Where a manifest's shard entry lives: in the run directory, or (a snapshot assembled
        from partitions) in the directory ``dir`` under the fingerprint, or ``shared`` under the
        root's shared partitions (``parts/``), each part a plain name."""
        name = fmt.check_name(entry.get("path"), "shard")
        shared = entry.get("shared")  # format version 4: a partition shared by snapshots
        where = entry.get("dir") if shared is None else shared
        if where is None:
            return f"{self.run_dir}/{name}"
        parts = where.split("/") if isinstance(where, str) else [where]
        for part in parts:
            fmt.check_name(part, "shard directory component")
        if shared is not None:  # under the root's shared partitions, never elsewhere
            return f"{fmt.SHARED_PARTS_DIR}/{shared}/{name}"
        return f"{self.fingerprint}/{where}/{name}"

    def _load_index(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The block index and the sample offsets (``offsets[b]``: block ``b``'s first sample).

        From :data:`snapstore.storage.hostindex.MIN_BLOCKS` blocks on, both are mapped from this
        host's copy (created from the store's ``index.bin`` by the first reader on the host); below
        that, or where the copy cannot be written, they are private arrays.
        """
        meta = self.manifest["index"]
        name = fmt.check_name(meta.get("path"), "index")
        where = self.store.join(f"{self.run_dir}/{name}")
        shared = int(self.manifest["num_blocks"]) >= hostindex.MIN_BLOCKS
        if shared:
            found = hostindex.load(self.fingerprint, self.manifest["run"], meta)
            if found is not None:
                self._index_data, self.index_copy = None, found.path
                return self._checked_counts(found.index, where), found.offsets
        data = self._index_bytes(name, where)
        sizes = np.array([int(s.get("size", -1)) for s in self.manifest["shards"]], dtype=np.int64)
        check = functools.partial(self._check_rows, where=where, sizes=sizes)
        if shared:
            made = hostindex.create(self.fingerprint, self.manifest["run"], meta, data, check)
            if made is not None:
                self.index_copy = made.path
                return self._checked_counts(made.index, where), made.offsets
        index = fmt.read_index(data, where)
        check(index)
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(index["rows"].astype(np.int64), out=offsets[1:])
        return self._checked_counts(index, where), offsets

    def _index_bytes(self, name: str, where: str) -> bytes:
        """``index.bin``'s bytes (those read ahead, if any), checked against the manifest."""
        meta = self.manifest["index"]
        data, self._index_data = self._index_data, None
        if data is None or name != fmt.INDEX_NAME:
            data = _read_traced(self.store, f"{self.run_dir}/{name}")
        if len(data) != meta.get("size") or self.checksum(data) != file_checksum(meta):
            raise FormatError(
                f"block index {where} does not match its manifest entry; it is corrupt"
            )
        return data

    def _check_rows(
        self, index: np.ndarray[Any, Any], where: str, sizes: np.ndarray[Any, Any]
    ) -> None:
        """Raise if rows of the index point outside the snapshot's shards (of ``sizes`` bytes)."""
        if len(index) and (
            int(index["shard"].max()) >= len(self.shard_paths)
            or bool(
                np.any(
                    index["offset"].astype(np.int64) + index["length"].astype(np.int64)
                    > sizes[index["shard"]]
                )
            )
        ):
            raise FormatError(
                f"block index {where} points outside the snapshot's shards; it is corrupt"
            )

    def _checked_counts(self, index: np.ndarray[Any, Any], where: str) -> np.ndarray[Any, Any]:
        per_shard = [int(s.get("blocks", -1)) for s in self.manifest["shards"]]
        if len(index) != int(self.manifest["num_blocks"]) or sum(per_shard) != len(index):
            raise FormatError(
                f"block index {where} holds {len(index)} blocks but the manifest counts "
                f"{self.manifest['num_blocks']} ({sum(per_shard)} in its shards); it is corrupt"
            )
        return index

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_blocks(self) -> int:
        """Number of blocks in the snapshot."""
        return len(self.index)

    def window_blocks(self, window_bytes: int) -> int:
        """How many of this snapshot's blocks make a shuffle window of about ``window_bytes``.

        A function of the manifest alone (mean decoded block size), so the epoch order stays a
        pure function of the snapshot and the settings.
        """
        if window_bytes < 1:
            raise ValueError(
                f"window_bytes must be a positive number of bytes, got {window_bytes!r}"
            )
        mean = int(self.manifest["raw_bytes"]) / max(1, self.num_blocks)
        return max(1, int(window_bytes // max(mean, 1.0)))

    def load_block(self, block: int) -> BlockColumns:
        """Fetch, verify and decode one block (no caching)."""
        entry = self.index[block]
        path = self.shard_paths[int(entry["shard"])]
        return self._decode(block, self._fetch(path, int(entry["offset"]), int(entry["length"])))

    def block(self, block: int) -> BlockColumns:
        """A decoded block, through a small LRU cache for random access."""
        with self._lock:
            cached = self._cache.get(block)
            if cached is not None:
                self._cache.move_to_end(block)
                return cached
        decoded = self.load_block(block)
        with self._lock:
            self._cache[block] = decoded
            while len(self._cache) > _RANDOM_ACCESS_CACHE_BLOCKS:
                self._cache.popitem(last=False)
        return decoded

    def locate(
        self, indices: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Block number and row inside the block of each global sample index."""
        blocks = np.searchsorted(self.offsets, indices, side="right") - 1
        return blocks, indices - self.offsets[blocks]

    def sample(self, index: int) -> dict[str, Any]:
        """One sample by its position in written order (negative counts from the end)."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample index {index} out of range for a snapshot of {n} samples")
        index %= n
        block = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return self.block(block).sample(index - int(self.offsets[block]))

    def prefetch(
        self,
        chunks: Iterable[np.ndarray[Any, Any]],
        *,
        budget_bytes: int = 64 << 20,
        max_requests: int | None = None,
        fetch: Fetch | None = None,
        decode_threads: int | None = None,
        first_part: int = 0,
        decoders: SharedDecoders | None = None,
    ) -> Prefetcher:
        """Start fetching and decoding the blocks of ``chunks`` ahead of use (see
        :class:`snapstore.read.prefetch.Prefetcher`); iterate the result for ``(indices, blocks)``.

        Parameters
        ----------
        chunks : Iterable of numpy.ndarray
            Global sample indices, chunk by chunk (e.g. ``EpochPlan.chunks()``).
        budget_bytes : int
            Decoded bytes that may be held ahead of the consumer.
        max_requests : int, optional
            Cap on requests in flight: default, for remote stores, this reader's share of a
            host's 256 (:func:`snapstore.read.crowd.host_requests`: 128 alone, 32 for each of
            8 ranks on a host) and twice the decode threads for local ones (whose reads are
            memory-map slices). The prefetcher starts at the cap and lowers its limit towards
            what Little's law says the consumer needs while nobody waits. A remote reader among
            many ranks (``RANK``/``WORLD_SIZE``) instead waits
            :func:`snapstore.read.crowd.start_delay` before its first requests and
            :func:`~snapstore.read.crowd.read_ahead_delay` before reading past its first chunk,
            and starts with one request in flight and grown requests
            (:func:`~snapstore.read.crowd.crowd_start`).
        fetch : callable, optional
            ``fetch(path, start, length)`` to use instead of the store's range read (to inject
            latency or faults, or to route reads elsewhere); paths are relative to the store.
        decode_threads : int, optional
            Threads that check, decompress and decode blocks; default the reader's
            ``decode_threads``.
        first_part : int
            Yield the first chunk's first ``first_part`` samples as soon as their blocks are
            decoded, then the rest of the chunk (e.g. a batch: the first batch does not wait
            for its whole window); 0 yields it whole.
        decoders : SharedDecoders, optional
            A decode pool shared with other prefetchers, which the caller shuts down (see
            :class:`~snapstore.read.prefetch.SharedDecoders`).

        Raises
        ------
        ValueError
            If the budget, ``max_requests`` or ``decode_threads`` is below 1.
        """
        local = self.store.local
        threads = self.decode_threads if decode_threads is None else decode_threads
        rank, world, on_host = crowd.place()
        if max_requests is None:
            max_requests = 2 * threads if local else crowd.host_requests(on_host)
        initial, level = crowd.crowd_start(1 if local else world, max_requests)
        limits = PrefetchLimits(
            budget_bytes,
            max_requests=max_requests,
            initial_requests=initial,
            decode_threads=threads,
            max_request_bytes=8 << 20 if self.store.coalesce else 0,
            start_delay=0.0 if local else crowd.start_delay(rank, world),
            read_ahead_delay=0.0 if local else crowd.read_ahead_delay(rank, world),
            initial_level=level,
            crowd=level > 0,
        )
        store = self.store
        return Prefetcher(
            chunks,
            locate=lambda indices: self.locate(indices)[0],
            index=self.index,
            paths=self.shard_paths,
            fetch=fetch or self._fetch,
            decode=self._decode,
            limits=limits,
            local=local,
            first_part=first_part,
            on_requests=None if self.guard is None else self.guard.start,
            decoders=decoders,
            throttles=lambda: int(getattr(store, "throttles", 0)),
        )

    def _fetch(self, path: str, start: int, length: int) -> Any:
        try:
            return self.store.read_range(path, start, length)
        except FileNotFoundError as exc:
            self.check_kept()
            try:
                now = read_record(self.store, self.fingerprint)
            except SnapshotNotFoundError:
                raise SnapshotRemovedError(self._removed("was removed while it was read")) from exc
            if now != self.record:
                why = "was committed again (by another run) while it was read"
                raise SnapshotRemovedError(self._removed(why)) from exc
            raise FormatError(
                f"shard {self.store.join(path)} of committed snapshot {self.fingerprint} is "
                "missing; the snapshot is damaged: remove it with `snapstore rm` and rebuild it"
            ) from exc

    def check_kept(self) -> None:
        """Raise if this reader's pin found its snapshot removed or replaced (see
        :class:`snapstore.storage.pins.ReadGuard`); a reader checks before each batch.

        Raises
        ------
        SnapshotRemovedError
            If the snapshot is no longer the one this reader opened.
        """
        lost = None if self.guard is None else self.guard.lost
        if lost is not None:
            raise SnapshotRemovedError(self._removed(lost))

    def _removed(self, why: str) -> str:
        return removed_message(self.store, self.fingerprint, why)

    def _decode(self, block: int, data: Any) -> BlockColumns:
        entry = self.index[block]
        shard = self.shard_paths[int(entry["shard"])]
        batch = fmt.decode_block(data, entry, self._arrow_schema, shard, checksum=self.checksum)
        return BlockColumns(self.schema, batch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        options = PlanOptions()
        plan = EpochPlan(None, offsets=self.offsets, epoch=0, rank=0, world_size=1, options=options)
        with contextlib.closing(self.prefetch(plan.chunks())) as prefetcher:
            for idx, decoded in prefetcher:
                blocks, rows = self.locate(idx)
                for b, r in zip(blocks.tolist(), rows.tolist()):
                    yield decoded[b].sample(r)

    def close(self) -> None:
        """Drop cached blocks (prefetchers are closed by their own iterators)."""
        with self._lock:
            self._cache.clear()
