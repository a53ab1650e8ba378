"""Reading a committed snapshot: random access, written-order iteration and batches.

The reader starts from the commit record, never from a listing: ``COMMIT`` names the run and the
manifest's size and checksum; the manifest names the index and shards, each checked to be a
plain file inside the run. Every block is verified (length and CRC-32) before it is decoded.

Which samples a consumer reads, and in what order, is decided by :class:`snapstore.plan.EpochPlan`
(a pure function of the block index, seed, epoch and partition); this module only fetches and
decodes the blocks the plan names, a bounded number of them ahead of the consumer.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from . import format as fmt
from .columns import BlockColumns, RowCopy, gather
from .errors import FormatError, SnapshotNotFoundError
from .plan import EpochPlan, PlanOptions
from .schema import Schema
from .store import Store

__all__ = ["BatchReader", "SnapshotReader"]

# Decoded blocks kept for random access; 8 x 1 MiB blocks by default.
_RANDOM_ACCESS_CACHE_BLOCKS = 8


def load_manifest(store: Store, fingerprint: str) -> dict[str, Any]:
    """The manifest of a committed snapshot, validated against its commit record.

    Raises
    ------
    SnapshotNotFoundError
        If no commit record exists for ``fingerprint``.
    FormatError
        If the record or manifest is corrupt, foreign or of another format version.
    """
    where = store.join(f"{fingerprint}/{fmt.COMMIT_NAME}")
    try:
        record = fmt.CommitRecord.from_bytes(
            store.read_bytes(f"{fingerprint}/{fmt.COMMIT_NAME}"), where
        )
    except FileNotFoundError as exc:
        raise SnapshotNotFoundError(
            f"no committed snapshot {fingerprint} under {store.url}; run the stage (or "
            "snap.materialize()) to create it, or check the root with `snapstore ls`."
        ) from exc
    if record.fingerprint != fingerprint:
        raise FormatError(f"{where} belongs to fingerprint {record.fingerprint}, not {fingerprint}")
    path = f"{fingerprint}/runs/{record.run}/{fmt.MANIFEST_NAME}"
    try:
        data = store.read_bytes(path)
    except FileNotFoundError as exc:
        raise FormatError(f"{where} names run {record.run}, whose manifest is missing") from exc
    if len(data) != record.manifest_size or fmt.checksum(data) != record.manifest_checksum:
        raise FormatError(
            f"manifest {store.join(path)} does not match its commit record; it is corrupt"
        )
    manifest = fmt.load_json(data, store.join(path))
    fmt.check_version(manifest, store.join(path))
    if manifest.get("fingerprint") != fingerprint or manifest.get("run") != record.run:
        raise FormatError(f"manifest {store.join(path)} belongs to another snapshot or run")
    return manifest


class SnapshotReader:
    """Random and sequential access to one committed snapshot.

    Parameters
    ----------
    store : Store
        Where the snapshot lives.
    fingerprint : str
        Its full fingerprint.
    decode_threads : int
        Threads that fetch, verify and decompress blocks ahead of the consumer.
    """

    def __init__(self, store: Store, fingerprint: str, *, decode_threads: int = 2) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.manifest = load_manifest(store, fingerprint)
        try:
            self._open_index()
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(
                f"manifest of {fingerprint} under {store.url} is missing or has a malformed "
                f"entry ({exc!r}); the snapshot is corrupt: remove it and rebuild it"
            ) from exc
        self._pool = ThreadPoolExecutor(
            max(1, decode_threads), thread_name_prefix="snapstore-decode"
        )
        self._cache: collections.OrderedDict[int, BlockColumns] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _open_index(self) -> None:
        self.run_dir = f"{self.fingerprint}/runs/{self.manifest['run']}"
        self.schema = Schema.from_json(self.manifest["schema"])
        self._arrow_schema = self.schema.arrow_schema()
        self.shards = [fmt.check_name(s.get("path"), "shard") for s in self.manifest["shards"]]
        self.index = self._load_index()
        self.offsets = np.zeros(len(self.index) + 1, dtype=np.int64)
        np.cumsum(self.index["rows"].astype(np.int64), out=self.offsets[1:])
        if int(self.offsets[-1]) != int(self.manifest["num_samples"]):
            raise FormatError(
                f"index of {self.fingerprint} holds {int(self.offsets[-1])} samples but the "
                f"manifest says {self.manifest['num_samples']}; the snapshot is corrupt"
            )

    def _load_index(self) -> np.ndarray[Any, Any]:
        meta = self.manifest["index"]
        name = fmt.check_name(meta.get("path"), "index")
        where = self.store.join(f"{self.run_dir}/{name}")
        data = self.store.read_bytes(f"{self.run_dir}/{name}")
        if len(data) != meta.get("size") or fmt.checksum(data) != meta.get("crc32"):
            raise FormatError(
                f"block index {where} does not match its manifest entry; it is corrupt"
            )
        index = fmt.read_index(data, where)
        sizes = np.array([int(s.get("size", -1)) for s in self.manifest["shards"]], dtype=np.int64)
        if len(index) and (
            int(index["shard"].max()) >= len(self.shards)
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
        shard = self.shards[int(entry["shard"])]
        path = f"{self.run_dir}/{shard}"
        try:
            data = self.store.read_range(path, int(entry["offset"]), int(entry["length"]))
        except FileNotFoundError as exc:
            raise FormatError(
                f"shard {self.store.join(path)} of committed snapshot {self.fingerprint} is "
                "missing; the snapshot is damaged: remove it with `snapstore rm` and rebuild it"
            ) from exc
        batch = fmt.decode_block(data, entry, self._arrow_schema, f"{self.run_dir}/{shard}")
        return BlockColumns(self.schema, batch)

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

    def decoded_chunks(
        self, chunks: Iterable[np.ndarray[Any, Any]], lookahead: int = 1
    ) -> Iterator[tuple[np.ndarray[Any, Any], dict[int, BlockColumns]]]:
        """Pair each chunk of global indices with its decoded blocks, decoding ``lookahead``
        chunks ahead on the thread pool. Memory: the blocks of ``lookahead + 1`` chunks."""
        source = iter(chunks)
        queued: collections.deque[tuple[np.ndarray[Any, Any], list[int]]] = collections.deque()
        futures: dict[int, Future[BlockColumns]] = {}

        def pull() -> None:
            idx = next(source, None)
            if idx is None:
                return
            blocks, _ = self.locate(idx)
            order = [int(b) for b in dict.fromkeys(blocks.tolist())]
            for b in order:
                if b not in futures:
                    futures[b] = self._pool.submit(self.load_block, b)
            queued.append((idx, order))

        try:
            for _ in range(lookahead + 1):
                pull()
            while queued:
                idx, order = queued.popleft()
                decoded = {b: futures[b].result() for b in order}
                pull()
                still_needed = {b for _, later in queued for b in later}
                for b in order:
                    if b not in still_needed:
                        futures.pop(b, None)
                yield idx, decoded
        finally:
            for future in futures.values():
                future.cancel()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        plan = EpochPlan(self.index["rows"], epoch=0, rank=0, world_size=1, options=PlanOptions())
        for idx, decoded in self.decoded_chunks(plan.chunks()):
            blocks, rows = self.locate(idx)
            for b, r in zip(blocks.tolist(), rows.tolist()):
                yield decoded[b].sample(r)

    def close(self) -> None:
        """Stop the decode threads and drop cached blocks."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._cache.clear()


class BatchReader:
    """Batches of one consumer's share of one epoch, as dicts of numpy arrays.

    Every rank yields the same number of batches (see :class:`snapstore.plan.EpochPlan` for the
    pad/drop rule); with ``drop_last`` the final short batch is dropped as well.
    """

    def __init__(
        self, reader: SnapshotReader, batch_size: int, plan: EpochPlan, drop_last: bool
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.reader = reader
        self.batch_size = batch_size
        self.plan = plan
        self.drop_last = drop_last

    def __len__(self) -> int:
        full, rest = divmod(self.plan.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Each chunk (a shuffle window, or part of one) is gathered in one go; batches are then
        # slices of it, zero-copy except for the one batch that straddles two chunks.
        pieces: collections.deque[list[Any]] = collections.deque()  # [columns, start, stop]
        buffered = 0
        for idx, decoded in self.reader.decoded_chunks(self.plan.chunks()):
            blocks, rows = self.reader.locate(idx)
            unique, which = np.unique(blocks, return_inverse=True)
            columns = gather(self.reader.schema, [decoded[int(b)] for b in unique], which, rows)
            pieces.append([columns, 0, len(idx)])
            buffered += len(idx)
            while buffered >= self.batch_size:
                yield self._take(pieces, self.batch_size)
                buffered -= self.batch_size
        if buffered and not self.drop_last:
            yield self._take(pieces, buffered)

    def _take(self, pieces: collections.deque[list[Any]], size: int) -> dict[str, Any]:
        parts = []
        while size:
            piece = pieces[0]
            columns, start, stop = piece
            count = min(size, stop - start)
            parts.append((columns, start, start + count))
            piece[1] += count
            size -= count
            if piece[1] == stop:
                pieces.popleft()
        batch: dict[str, Any] = {}
        for name in self.reader.schema.names:
            sliced = [columns[name][a:b] for columns, a, b in parts]
            sliced = [p.materialize() if isinstance(p, RowCopy) else p for p in sliced]
            if len(sliced) == 1:
                batch[name] = sliced[0]
            elif isinstance(sliced[0], np.ndarray):
                batch[name] = np.concatenate(sliced)
            else:
                batch[name] = [item for part in sliced for item in part]
        return batch
