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

A snapshot with partitions of its own (shard entries with a ``dir``: ``<fp>/parts/<p>``) is
flattened: every shard lands in the run directory as ``shard-NNNNN.snap`` numbered by its
position in the manifest, so the block index, whose rows name shards by that position, is
copied unchanged.

A snapshot assembled from **shared partitions** (format version 4: ``shared_partitions``, shard
entries with ``shared``) is copied with its partitions, each to the same place at the
destination, ``parts/<stage key>/<partition fp>``: one set of listings of the destination's
partition directories says which are committed there already, and those are not copied (a
committed partition is the same data wherever it was computed, as a committed snapshot is).
Each other partition is copied as a snapshot of its own: its shards (checked as above) into
``runs/copy-<source run>/``, then its index and manifest, then its ``COMMIT``, created only if
absent, so a partition is visible at the destination only when whole. Last the snapshot's own
run is written, its block index assembled from the destination's partitions (as a writer
assembles one), and its ``COMMIT``. Partitions are copied concurrently, never one request
after another per partition; an interrupted copy keeps the partitions it committed and resumes
the others shard by shard.

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
from ..storage.listing import map_concurrently
from ..storage.store import Store, StoreLike, as_store
from ..write.partitions import SHARED_DIR
from ..write.writer import publish
from .sharing import list_partitions, partition_refs

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
        Files this call wrote at the destination: copied shards, each copied partition's block
        index, manifest and commit record, and the snapshot's.
    seconds : float
        Wall time of the call.
    status : {"copied", "already present"}
        ``"already present"`` when the destination had (or, racing another writer, got) a
        committed snapshot of this fingerprint; nothing was then changed there.
    partitions_copied : int
        Shared partitions this call copied and committed at the destination.
    partitions_present : int
        Shared partitions of the snapshot already committed at the destination, not copied.
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
    partitions_copied: int = 0
    partitions_present: int = 0

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
            "partitions_copied": self.partitions_copied,
            "partitions_present": self.partitions_present,
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
        self,
        src: Store,
        dst: Store,
        chunk_bytes: int,
        progress: CopyProgress | None,
        total: int,
        listed: dict[str, int] | None = None,
    ) -> None:
        self.src, self.dst = src, dst
        # The destination's files and sizes where a listing already says (a path absent from
        # it is absent): no request per shard to find out.
        self.listed = listed
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
            if self.listed is not None:
                if self.listed.get(job.dest) != job.size:
                    return False
            elif not self.dst.exists(job.dest) or self.dst.size(job.dest) != job.size:
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
        if self.listed is None or job.dest in self.listed:
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
    return _open_source(src, fingerprint)


def _open_source(src: Store, where: str) -> tuple[SnapshotReader, bytes]:
    """A committed snapshot's (or shared partition's) reader and its index bytes."""
    reader = SnapshotReader(src, where, decode_threads=1)
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

    def result(run: str | None, done: _Done, files: int) -> CopyResult:
        return CopyResult(
            fingerprint, src.url, dst.url, run, done.copied, done.skipped, files,
            time.monotonic() - started, "copied" if run else "already present",
            done.partitions_copied, done.partitions_present,
        )  # fmt: skip

    commit_path = f"{fingerprint}/{fmt.COMMIT_NAME}"
    if dst.exists(commit_path):
        log.info("%s already holds snapshot %s; nothing to copy", dst.url, fingerprint)
        return result(None, _Done(0, 0, 0), 0)
    run = copy_run_name(str(reader.manifest["run"]))
    run_dir = f"{fingerprint}/runs/{run}"
    if partition_refs(reader.manifest):
        done = _copy_partitions(src, dst, reader, jobs, chunk_bytes, progress)
        index_bytes, manifest = _assembled(dst, reader, run)
    else:
        flat = _flat_jobs(reader, run_dir)
        copier = _Copier(src, dst, chunk_bytes, progress, sum(job.size for job in flat))
        done = _Done(*copier.run(flat, jobs))
        manifest = _flat_manifest(reader.manifest, run)
    # Left by an attempt that stopped between these writes and the commit: written afresh.
    for name in (fmt.INDEX_NAME, fmt.MANIFEST_NAME):
        dst.remove_tree(f"{run_dir}/{name}")
    won = publish(dst, fingerprint, run, index_bytes, manifest)
    if not won:
        log.info("another writer committed %s at %s first; removing %s", fingerprint, dst.url, run)
        dst.remove_tree(run_dir)
        return result(None, done, 0)
    return result(run, done, done.files + 3)


def _flat_jobs(reader: SnapshotReader, run_dir: str) -> list[_ShardJob]:
    """The shards of a snapshot copied into one run directory, numbered in manifest order."""
    return [
        _ShardJob(
            source=reader.shard_paths[i],
            dest=f"{run_dir}/shard-{i:05d}.snap",
            size=int(entry["size"]),
            blocks=reader.index[reader.index["shard"] == i],
            checksum=reader.checksum,
        )
        for i, entry in enumerate(reader.manifest["shards"])
    ]


@dataclass(frozen=True)
class _Done:
    """What the shard copies and partition commits of one copy did."""

    copied: int  # shard bytes transferred
    skipped: int  # shard bytes found whole at the destination
    files: int  # files written: shards, and each partition's index, manifest and COMMIT
    partitions_copied: int = 0
    partitions_present: int = 0


def _partition_runs(reader: SnapshotReader) -> dict[str, str]:
    """The run of each shared partition that the snapshot's shards are in (a partition without
    samples has no shard: it is absent here)."""
    runs: dict[str, str] = {}
    for entry in reader.manifest["shards"]:
        where = entry.get("shared")
        parts = where.split("/") if isinstance(where, str) else []
        if len(parts) != 4 or parts[2] != "runs":
            raise FormatError(
                f"manifest of {reader.fingerprint}: a snapshot made of shared partitions has "
                f"the shard entry {entry!r}; expected 'shared': '<stage key>/<partition fp>/"
                "runs/<run>'. The snapshot is corrupt: remove it and rebuild it"
            )
        ref, run = "/".join(parts[:2]), parts[3]
        if runs.setdefault(ref, run) != run:
            raise FormatError(
                f"manifest of {reader.fingerprint}: partition {ref} has shards in two runs "
                f"({runs[ref]} and {run}); the snapshot is corrupt: remove it and rebuild it"
            )
    return runs


def _open_partition(src: Store, ref: str, run: str | None) -> tuple[SnapshotReader, bytes]:
    """A source partition's reader and index bytes, checked to be the run the snapshot reads."""
    reader, index_bytes = _open_source(src, f"{SHARED_DIR}/{ref}")
    if run is not None and reader.manifest["run"] != run:
        raise FormatError(
            f"partition {src.join(f'{SHARED_DIR}/{ref}')} is committed as run "
            f"{reader.manifest['run']}, but the snapshot reads its run {run}; run "
            "`snapstore verify` on the snapshot"
        )
    return reader, index_bytes


def _partition_jobs(reader: SnapshotReader, run_dir: str) -> list[_ShardJob]:
    """A partition's shards, copied under their own names into ``run_dir``."""
    jobs = []
    for i, (entry, path) in enumerate(zip(reader.manifest["shards"], reader.shard_paths)):
        name = path.rsplit("/", 1)[-1]
        if path != f"{reader.run_dir}/{name}":
            raise FormatError(
                f"partition {reader.fingerprint}: expected its shards in its run directory "
                f"{reader.run_dir}, found {path}"
            )
        blocks = reader.index[reader.index["shard"] == i]
        size = int(entry["size"])
        jobs.append(_ShardJob(path, f"{run_dir}/{name}", size, blocks, reader.checksum))
    return jobs


def _copy_partitions(
    src: Store,
    dst: Store,
    reader: SnapshotReader,
    threads: int,
    chunk_bytes: int,
    progress: CopyProgress | None,
) -> _Done:
    """Copy and commit every shared partition of the snapshot not committed at the destination
    (module docstring); the destination's partition directories are listed once."""
    refs = list(dict.fromkeys(partition_refs(reader.manifest)))
    runs = _partition_runs(reader)
    listed = {f"{SHARED_DIR}/{rel}": n for rel, n in list_partitions(dst, refs).items()}
    missing = [r for r in refs if f"{SHARED_DIR}/{r}/{fmt.COMMIT_NAME}" not in listed]
    sources = map_concurrently(lambda ref: _open_partition(src, ref, runs.get(ref)), missing)
    targets = [
        f"{SHARED_DIR}/{ref}/runs/{copy_run_name(str(part.manifest['run']))}"
        for ref, (part, _) in zip(missing, sources)
    ]
    jobs = [j for (part, _), where in zip(sources, targets) for j in _partition_jobs(part, where)]
    total = sum(job.size for job in jobs)
    copier = _Copier(src, dst, chunk_bytes, progress, total, listed)
    copied, skipped, shard_files = copier.run(jobs, threads)

    def commit(item: tuple[tuple[SnapshotReader, bytes], str]) -> bool:
        (part, index_bytes), run_dir = item
        for name in (fmt.INDEX_NAME, fmt.MANIFEST_NAME):  # left by an interrupted copy
            if f"{run_dir}/{name}" in listed:
                dst.remove_tree(f"{run_dir}/{name}")
        where, run = run_dir.split("/runs/")
        won = publish(dst, where, run, index_bytes, _copied_manifest(part.manifest, run))
        if not won:  # committed meanwhile by another job: that run is the partition
            dst.remove_tree(run_dir)
        return won

    won = map_concurrently(commit, list(zip(sources, targets)))
    log.info("copied %d partition(s); %d already at %s", len(missing), len(refs) - len(missing),
             dst.url)  # fmt: skip
    files = shard_files + 3 * sum(won)
    return _Done(copied, skipped, files, len(missing), len(refs) - len(missing))


def _copied_manifest(manifest: dict[str, Any], run: str) -> dict[str, Any]:
    """A partition's manifest for its copy's run (its shards keep their names)."""
    at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return {**manifest, "run": run, "copied_from": {"run": manifest["run"], "at": at}}


def _assembled(dst: Store, reader: SnapshotReader, run: str) -> tuple[bytes, dict[str, Any]]:
    """The block index and manifest of the snapshot at the destination, assembled from the
    destination's partitions as a writer assembles them; each must hold the samples the
    source's partition holds."""
    refs = partition_refs(reader.manifest)

    def open_part(ref: str) -> SnapshotReader:
        try:
            return SnapshotReader(dst, f"{SHARED_DIR}/{ref}", decode_threads=1)
        except FileNotFoundError as exc:
            raise FormatError(
                f"partition {dst.join(f'{SHARED_DIR}/{ref}')} was committed and is gone; "
                "run the copy again"
            ) from exc

    parts = map_concurrently(open_part, refs)
    expected = _samples_per_partition(reader)
    indexes: list[np.ndarray[Any, Any]] = []
    shards: list[dict[str, Any]] = []
    for ref, part in zip(refs, parts):
        if part.checksum is not reader.checksum or len(part) != expected.get(ref, 0):
            raise FormatError(
                f"partition {dst.join(part.fingerprint)} holds {len(part)} samples with "
                f"{part.checksum.name} checksums; the source's holds {expected.get(ref, 0)} with "
                f"{reader.checksum.name}. Remove that partition directory and copy again"
            )
        index = part.index.copy()
        index["shard"] += len(shards)
        indexes.append(index)
        where = part.run_dir.removeprefix(f"{SHARED_DIR}/")
        for entry, path in zip(part.manifest["shards"], part.shard_paths):
            shards.append({**entry, "path": path.rsplit("/", 1)[-1], "shared": where})
    joined = np.concatenate(indexes) if indexes else np.zeros(0, fmt.INDEX_DTYPE)
    index_bytes = fmt.write_index(joined)
    manifest = {
        **_flat_manifest(reader.manifest, run),
        "num_blocks": len(joined),
        "stored_bytes": sum(int(p.manifest["stored_bytes"]) for p in parts),
        "shards": shards,
    }
    manifest["index"].update(size=len(index_bytes), checksum=reader.checksum(index_bytes))
    return index_bytes, manifest


def _samples_per_partition(reader: SnapshotReader) -> dict[str, int]:
    """Samples in each shared partition of the source snapshot, from its block index."""
    owner = ["/".join(str(entry["shared"]).split("/")[:2]) for entry in reader.manifest["shards"]]
    rows = np.bincount(
        reader.index["shard"].astype(np.int64),
        weights=reader.index["rows"].astype(np.float64),
        minlength=len(owner),
    )
    counts: dict[str, int] = {}
    for ref, n in zip(owner, rows.tolist()):
        counts[ref] = counts.get(ref, 0) + int(n)
    return counts
