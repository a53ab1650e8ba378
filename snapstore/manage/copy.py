"""Copying a committed snapshot from one store to another, resumably.

:func:`copy_snapshot` streams every shard of a committed snapshot to the destination in bounded
chunks, checking each block's checksum against the block index as the bytes go by, then writes
the index and a manifest under a new run and creates ``<fp>/COMMIT`` only if absent (the same
commit protocol as a writer, docs/format.md section 10). Nothing is visible at the destination
before that last step. The copy keeps the source's format version and checksum algorithm
(CRC-32 for versions 1 and 2, the manifest's ``checksum`` since 3): shards and index are copied
byte for byte, and checked with the source's algorithm.

The destination run is named ``copy-<source run>``: deterministic, so an interrupted copy
leaves an uncommitted run that the next attempt finds again. There, a shard of the right size
whose blocks all verify is kept (counted in ``bytes_skipped``); any other file of that name, a
partial upload or a torn write, is removed and copied again.

A partitioned snapshot (shard entries with a ``dir``) is flattened: every shard lands in the
run directory as ``shard-NNNNN.snap`` numbered by its position in the manifest, so the block
index, whose rows name shards by that position, is copied unchanged.

Memory is bounded by ``jobs * chunk_bytes`` (plus what a backend buffers per open upload; an
:class:`~snapstore.storage.store.FsspecStore` spools past 8 MiB to a temporary file).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..errors import CorruptBlockError, FormatError, SnapshotNotFoundError, StoreError
from ..format import layout as fmt
from ..format.checksums import Checksum, file_checksum
from ..oldpaths import historic_name
from ..read.reader import SnapshotReader
from ..storage.store import Store, StoreLike, as_store
from ..write.writer import publish

__all__ = ["CopyProgress", "CopyResult", "copy_run_name", "copy_snapshot"]

log = logging.getLogger(historic_name(__name__))

CopyProgress = Callable[[int, int], None]
"""Called as bytes are copied or verified with (bytes done, bytes in all shards); calls are
serialized, so the callback needs no lock of its own."""

# One range read per chunk: large enough that a remote read is dominated by transfer rather
# than latency (8 MiB at ~100 MB/s is ~80 ms against ~20-50 ms of latency), small enough that
# 8 parallel jobs hold 64 MiB.
_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class CopyResult:
    """What :func:`copy_snapshot` did.

    Attributes
    ----------
    fingerprint : str
        The snapshot's fingerprint (the same at both ends).
    source, destination : str
        URLs of the two stores.
    run : str or None
        The run written at the destination; None when the snapshot was already present.
    bytes_copied : int
        Shard bytes transferred by this call.
    bytes_skipped : int
        Shard bytes already at the destination (from an interrupted copy) and verified there.
    files : int
        Files this call wrote at the destination: copied shards, the block index, the
        manifest and the commit record.
    seconds : float
        Wall time of the call.
    status : {"copied", "already present"}
        ``"already present"`` when the destination had (or, racing another writer, got) a
        committed snapshot of this fingerprint; nothing was then changed there.
    """

    fingerprint: str
    source: str
    destination: str
    run: str | None
    bytes_copied: int
    bytes_skipped: int
    files: int
    seconds: float
    status: Literal["copied", "already present"]

    @property
    def already_present(self) -> bool:
        """Whether the destination already held the snapshot."""
        return self.status == "already present"

    @property
    def committed(self) -> bool:
        """Whether this call committed the snapshot at the destination."""
        return self.status == "copied"

    def to_json(self) -> dict[str, Any]:
        """The stable JSON shape of ``snapstore cp --json`` (docs/cli.md)."""
        return {
            "fingerprint": self.fingerprint,
            "source": self.source,
            "destination": self.destination,
            "bytes_copied": self.bytes_copied,
            "bytes_skipped": self.bytes_skipped,
            "files": self.files,
            "seconds": round(self.seconds, 3),
            "status": self.status,
        }


def copy_run_name(source_run: str) -> str:
    """The destination run of a copy of ``source_run``: ``copy-<source run>``, or, where that
    is too long for a plain name, ``copy-`` and a digest of it (still deterministic)."""
    name = f"copy-{source_run}"
    if fmt.is_plain_name(name):
        return name
    return f"copy-{hashlib.sha256(source_run.encode()).hexdigest()[:32]}"


class _BlockChecker:
    """Checks the checksum of every block of one shard from chunks fed in file order.

    Pure: it sees bytes, never a store. Blocks are taken in offset order; a block spanning
    chunks carries its running checksum from one to the next.
    """

    def __init__(self, blocks: np.ndarray[Any, Any], shard: str, checksum: Checksum) -> None:
        ordered = blocks[np.argsort(blocks["offset"], kind="stable")]
        self._blocks = [(int(b["offset"]), int(b["length"]), int(b["checksum"])) for b in ordered]
        self._shard = shard
        self._update = checksum.update
        self._next = 0
        self._crc = 0

    def feed(self, start: int, data: memoryview) -> None:
        """Take the bytes at ``start`` (chunks must come in order, without gaps)."""
        end = start + data.nbytes
        while self._next < len(self._blocks):
            offset, length, expected = self._blocks[self._next]
            stop = offset + length
            lo, hi = max(offset, start), min(stop, end)
            if hi > lo:
                self._crc = self._update(data[lo - start : hi - start], self._crc)
            if stop > end:
                return  # continues in the next chunk
            if self._crc != expected:
                raise CorruptBlockError(
                    f"block at offset {offset} of shard {self._shard!r} does not match its "
                    f"checksum in the block index (expected {expected:#010x}); the shard is "
                    "corrupt: run `snapstore verify` on it",
                    shard=self._shard,
                    offset=offset,
                )
            self._crc = 0
            self._next += 1

    def finish(self) -> None:
        """Raise unless every block was seen whole."""
        if self._next < len(self._blocks):
            offset = self._blocks[self._next][0]
            raise CorruptBlockError(
                f"shard {self._shard!r} ends before its block at offset {offset}; it is truncated",
                shard=self._shard,
                offset=offset,
            )


@dataclass(frozen=True)
class _ShardJob:
    source: str  # path in the source store
    dest: str  # path in the destination store
    size: int
    blocks: np.ndarray[Any, Any]
    checksum: Checksum  # the source snapshot's algorithm


class _Copier:
    """One copy: the jobs, the shared progress counter and the per-shard work."""

    def __init__(
        self, src: Store, dst: Store, chunk_bytes: int, progress: CopyProgress | None, total: int
    ) -> None:
        self.src, self.dst = src, dst
        self.chunk_bytes = chunk_bytes
        self._progress = progress
        self._total = total
        self._done = 0
        self._lock = threading.Lock()

    def _advance(self, n: int) -> None:
        with self._lock:
            self._done += n
            if self._progress is not None:
                self._progress(self._done, self._total)

    def _stream(self, store: Store, path: str, size: int, checker: _BlockChecker) -> Any:
        """Yield the chunks of a file, each checked; raise if it is shorter than ``size``."""
        for start in range(0, size, self.chunk_bytes):
            want = min(self.chunk_bytes, size - start)
            data = memoryview(store.read_range(path, start, want)).cast("B")
            if data.nbytes != want:
                raise FormatError(
                    f"{store.join(path)} holds fewer bytes than the {size} its manifest entry "
                    "records; the file is truncated"
                )
            checker.feed(start, data)
            yield data
        checker.finish()

    def present(self, job: _ShardJob) -> bool:
        """Whether the destination already holds this shard whole (size and every block)."""
        try:
            if not self.dst.exists(job.dest) or self.dst.size(job.dest) != job.size:
                return False
            checker = _BlockChecker(job.blocks, self.dst.join(job.dest), job.checksum)
            for _ in self._stream(self.dst, job.dest, job.size, checker):
                pass
        except (FormatError, FileNotFoundError):
            return False
        return True

    def copy(self, job: _ShardJob) -> tuple[int, int]:
        """Copy one shard unless it is already there; (bytes copied, bytes skipped)."""
        if self.present(job):
            log.info("kept %s: already copied and verified", self.dst.join(job.dest))
            self._advance(job.size)
            return 0, job.size
        self.dst.remove_tree(job.dest)  # a partial or torn file from an interrupted copy
        checker = _BlockChecker(job.blocks, self.src.join(job.source), job.checksum)
        with self.dst.open_write(job.dest) as out:
            for chunk in self._stream(self.src, job.source, job.size, checker):
                out.write(chunk)
                self._advance(chunk.nbytes)
        written = self.dst.size(job.dest)
        if written != job.size:
            raise StoreError(
                f"copied {job.size} bytes to {self.dst.join(job.dest)} but it holds {written}; "
                "check the destination store, then run the copy again"
            )
        return job.size, 0

    def run(self, jobs: list[_ShardJob], threads: int) -> tuple[int, int, int]:
        """Copy every shard, ``threads`` at once; (copied, skipped, shards copied)."""
        with ThreadPoolExecutor(threads, thread_name_prefix="snapstore-copy") as pool:
            futures = [pool.submit(self.copy, job) for job in jobs]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in futures if f in done and f.exception() is not None]
            if failed:
                for future in futures:
                    future.cancel()
                failed[0].result()  # raises the first failure
            results = [f.result() for f in futures]
        copied = sum(c for c, _ in results)
        return copied, sum(s for _, s in results), sum(1 for _, s in results if not s)


def _source(src: Store, fingerprint: str) -> tuple[SnapshotReader, bytes]:
    """The source snapshot's reader (manifest and index validated) and its index bytes."""
    if not fmt.is_plain_name(fingerprint):
        raise SnapshotNotFoundError(
            f"{fingerprint!r} is not a fingerprint: expected the hex digits `snapstore ls` shows"
        )
    reader = SnapshotReader(src, fingerprint, decode_threads=1)
    meta = reader.manifest["index"]
    path = f"{reader.run_dir}/{fmt.check_name(meta['path'], 'index')}"
    index_bytes = src.read_bytes(path)
    if len(index_bytes) != meta["size"] or reader.checksum(index_bytes) != file_checksum(meta):
        raise FormatError(f"block index {src.join(path)} changed while it was being copied")
    return reader, index_bytes


def _flat_manifest(manifest: dict[str, Any], run: str) -> dict[str, Any]:
    """The source manifest for the destination run: shards renamed into the run directory."""
    shards = []
    for i, entry in enumerate(manifest["shards"]):
        flat = {k: v for k, v in entry.items() if k != "dir"}
        shards.append({**flat, "path": f"shard-{i:05d}.snap"})
    return {
        **manifest,
        "run": run,
        "shards": shards,
        "index": {**manifest["index"], "path": fmt.INDEX_NAME},
        "copied_from": {
            "run": manifest["run"],
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    }


def copy_snapshot(
    src: StoreLike,
    fingerprint: str,
    dst: StoreLike,
    *,
    jobs: int = 8,
    progress: CopyProgress | None = None,
    chunk_bytes: int = _CHUNK_BYTES,
) -> CopyResult:
    """Copy the committed snapshot ``fingerprint`` from ``src`` to ``dst``, resumably.

    Parameters
    ----------
    src, dst : Store, str or PathLike
        Source and destination stores, or roots (paths or URLs) to open with
        :func:`snapstore.open_store`.
    fingerprint : str
        The full fingerprint of a committed snapshot in ``src``.
    jobs : int
        Shards copied at once.
    progress : callable, optional
        ``progress(bytes_done, bytes_total)`` as shard bytes are copied or verified.
    chunk_bytes : int
        Bytes per range read; memory is bounded by ``jobs * chunk_bytes``.

    Returns
    -------
    CopyResult
        With ``status="already present"`` (and nothing written) if ``dst`` already has a
        committed snapshot of ``fingerprint``.

    Raises
    ------
    SnapshotNotFoundError
        If ``src`` holds no committed snapshot ``fingerprint``.
    FormatError
        If the source is corrupt (a block whose checksum does not match, a truncated shard).
    StoreError
        If either store fails. The copy is then not committed; run it again to resume.

    Examples
    --------
    >>> from snapstore import open_store
    >>> result = copy_snapshot(open_store("/data/snaps"), fp, open_store("gs://b/snaps"))
    >>> result.status, result.bytes_copied  # doctest: +SKIP
    ('copied', 1048576)
    """
    if jobs < 1 or chunk_bytes < 1:
        raise ValueError(f"jobs and chunk_bytes must be >= 1, got {jobs} and {chunk_bytes}")
    src, dst = as_store(src, "src"), as_store(dst, "dst")
    started = time.monotonic()
    reader, index_bytes = _source(src, fingerprint)

    def result(run: str | None, copied: int, skipped: int, files: int) -> CopyResult:
        return CopyResult(
            fingerprint, src.url, dst.url, run, copied, skipped, files,
            time.monotonic() - started, "copied" if run else "already present",
        )  # fmt: skip

    commit_path = f"{fingerprint}/{fmt.COMMIT_NAME}"
    if dst.exists(commit_path):
        log.info("%s already holds snapshot %s; nothing to copy", dst.url, fingerprint)
        return result(None, 0, 0, 0)
    run = copy_run_name(str(reader.manifest["run"]))
    run_dir = f"{fingerprint}/runs/{run}"
    shards = reader.manifest["shards"]
    shard_jobs = [
        _ShardJob(
            source=reader.shard_paths[i],
            dest=f"{run_dir}/shard-{i:05d}.snap",
            size=int(entry["size"]),
            blocks=reader.index[reader.index["shard"] == i],
            checksum=reader.checksum,
        )
        for i, entry in enumerate(shards)
    ]
    total = sum(job.size for job in shard_jobs)
    copier = _Copier(src, dst, chunk_bytes, progress, total)
    copied, skipped, shard_files = copier.run(shard_jobs, jobs)
    # Left by an attempt that stopped between these writes and the commit: written afresh.
    for name in (fmt.INDEX_NAME, fmt.MANIFEST_NAME):
        dst.remove_tree(f"{run_dir}/{name}")
    won = publish(dst, fingerprint, run, index_bytes, _flat_manifest(reader.manifest, run))
    if not won:
        log.info("another writer committed %s at %s first; removing %s", fingerprint, dst.url, run)
        dst.remove_tree(run_dir)
        return result(None, copied, skipped, 0)
    return result(run, copied, skipped, shard_files + 3)
