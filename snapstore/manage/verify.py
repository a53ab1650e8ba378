"""Verifying a committed snapshot end to end: every file it names and every byte of every block.

A reader checks each block it reads; :func:`verify_snapshot` reads them all, and also the parts a
reader never looks at (shard magic and footers, recorded sizes, stray files), and reports every
problem it finds instead of stopping at the first.

What fails verification (``VerifyReport.ok`` is false): a commit record, manifest or block index
that does not load (``"manifest"``, ``"index"``); a missing shard (``"missing"``); a shard whose
size differs from the manifest (``"size"``: truncated or appended to); a shard that does not
start with the shard magic (``"magic"``); a footer that does not list exactly the blocks the
index gives for that shard (``"footer"``); a block whose length, checksum (with the snapshot's
algorithm), decompression, Arrow decoding or row count is wrong (``"block"``, one problem per
bad block).

A snapshot assembled from shared partitions (format version 4) is checked wherever its blocks
live, and so is each partition's own commit record, manifest and block index (``"partition"``:
they must load, name the run the snapshot reads, and list the blocks the snapshot's index gives
for that partition), since the next snapshot assembled from the partition, and ``cp``, read
them. A :class:`SharedChecks` passed to several calls makes each shared partition be read once
among them: a snapshot whose partition was checked for an earlier one gets that result
(``bytes_reused``), with no request.

What does not: a file or directory in a run directory that the manifest does not name
(``"foreign"``). No reader opens it, so the snapshot reads correctly; it is reported because it
wastes space or hints at a tool writing where it should not. Failures of the storage backend
itself (:class:`~snapstore.errors.StoreError`) are raised, not reported: they say nothing about
the snapshot.

Memory: at most ``jobs`` reads are in flight, each at most ``_MAX_REQUEST_BYTES`` (or one block,
when a block is larger), and nothing is kept once a read is checked.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CorruptBlockError, FormatError
from ..format import layout as fmt
from ..oldpaths import historic_name
from ..read.reader import SnapshotReader, load_manifest
from ..storage.listing import map_concurrently
from ..storage.store import Store, StoreLike, as_store
from .sharing import partition_refs

__all__ = [
    "WARNING_KINDS",
    "ProgressCallback",
    "SharedChecks",
    "VerifyReport",
    "plan_ranges",
    "verify_snapshot",
]

logger = logging.getLogger(historic_name(__name__))

#: ``progress(done_bytes, total_bytes)``: block bytes checked so far, of all the snapshot holds.
ProgressCallback = Callable[[int, int], None]

#: Problem kinds that are reported but do not fail verification.
WARNING_KINDS = frozenset({"foreign"})

# Adjacent blocks of a remote shard are read together up to this size: a request costs ~50 ms
# of latency, 8 MiB costs about as much again to transfer, so bigger requests gain little.
_MAX_REQUEST_BYTES = 8 << 20
# A remote shard this small is read whole, magic and footer with its blocks, in one request.
_WHOLE_SHARD_BYTES = 8 << 20
_FOOTER_TAIL = 16  # u64 count + footer magic
_FOOTER_FIELDS = ("codec", "offset", "length", "raw_length", "rows", "checksum")

Problem = dict[str, Any]
Fetch = Callable[[int, int], Any]
Decode = Callable[..., Any]
"""Verifies and decodes one block: ``decode(data, entry, shard=path)`` (:func:`format.decode_block`
with the snapshot's schema and checksum algorithm)."""


def _problem(kind: str, shard: str | None, offset: int | None, message: str) -> Problem:
    return {"kind": kind, "shard": shard, "offset": offset, "message": message}


ShardKey = tuple[str, str]
ShardResult = tuple[list[Problem], int, int]
"""What checking one shard found: its problems, blocks and block bytes checked."""

_SHARED_PREFIX = f"{fmt.SHARED_PARTS_DIR}/"
_REBUILD = "Remove the snapshot with `snapstore rm` and rebuild it."


@dataclass
class SharedChecks:
    """What verification found in shared partitions, kept across :func:`verify_snapshot` calls
    so that a partition several snapshots reference is read once among them (``snapstore
    verify`` passes one to all the snapshots it checks).

    Memory: one small entry per shard and per partition checked. Not for concurrent calls:
    pass it to calls made one after another.

    Attributes
    ----------
    shards : dict
        ``(shard path, size and digest of its index rows)`` to ``(problems, blocks, bytes)``.
    directories : dict
        A partition's run directory to the foreign files found in it (warnings).
    partitions : dict
        ``<stage key>/<partition fp>`` to the problems of its own files (``"partition"``).
    """

    shards: dict[ShardKey, ShardResult] = field(default_factory=dict)
    directories: dict[str, list[Problem]] = field(default_factory=dict)
    partitions: dict[str, list[Problem]] = field(default_factory=dict)


@dataclass
class VerifyReport:
    """The outcome of :func:`verify_snapshot`.

    Attributes
    ----------
    fingerprint : str
        The snapshot verified.
    problems : list of dict
        ``{"kind", "shard", "offset", "message"}`` each, sorted by shard and offset; ``shard`` is
        a path relative to the store's root (None for the manifest and index), ``offset`` a
        byte offset in it (None where no single offset applies).
    blocks : int
        Blocks read and checked (bad ones included; blocks of a missing shard are not).
    bytes : int
        Stored block bytes read and checked.
    bytes_reused : int
        Of ``bytes``, those of shared partitions checked for an earlier snapshot of the same
        :class:`SharedChecks`, whose result this report reuses instead of reading them again.
    seconds : float
        Wall time of the verification.
    """

    fingerprint: str
    problems: list[Problem] = field(default_factory=list)
    blocks: int = 0
    bytes: int = 0
    bytes_reused: int = 0
    seconds: float = 0.0

    @property
    def errors(self) -> list[Problem]:
        """Problems that fail verification."""
        return [p for p in self.problems if p["kind"] not in WARNING_KINDS]

    @property
    def warnings(self) -> list[Problem]:
        """Problems reported that do not fail verification (``"foreign"`` files)."""
        return [p for p in self.problems if p["kind"] in WARNING_KINDS]

    @property
    def ok(self) -> bool:
        """True when no problem fails verification."""
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        """The stable JSON shape of ``snapstore verify --json`` (one snapshot)."""
        return {
            "fingerprint": self.fingerprint,
            "ok": self.ok,
            "blocks": self.blocks,
            "bytes": self.bytes,
            "bytes_reused": self.bytes_reused,
            "seconds": round(self.seconds, 3),
            "problems": [dict(p) for p in self.problems],
        }


def plan_ranges(
    offsets: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any], max_bytes: int
) -> list[tuple[int, int, list[int]]]:
    """Group a shard's blocks (in offset order) into range reads of at most ``max_bytes``.

    Returns ``(start, length, blocks)`` per read, ``blocks`` being positions in ``offsets``.
    Consecutive blocks merge (the padding between them is read too); a block larger than
    ``max_bytes``, or any block when ``max_bytes`` is 0, is a read of its own. No I/O.
    """
    ranges: list[tuple[int, int, list[int]]] = []
    for i, (offset, length) in enumerate(zip(offsets.tolist(), lengths.tolist())):
        if ranges:
            start, _, members = ranges[-1]
            end = offset + length
            if offset >= start and end - start <= max_bytes:
                ranges[-1] = (start, end - start, [*members, i])
                continue
        ranges.append((offset, length, [i]))
    return ranges


def verify_snapshot(
    store: StoreLike,
    fingerprint: str,
    *,
    progress: ProgressCallback | None = None,
    jobs: int = 8,
    checked: SharedChecks | None = None,
) -> VerifyReport:
    """Read and check every file and block of a committed snapshot; report every problem.

    Parameters
    ----------
    store : Store, str or PathLike
        Where the snapshot lives: a Store, or a root (path or URL) to open.
    fingerprint : str
        Its full fingerprint (see :func:`snapstore.snapshot.resolve_fingerprint` for prefixes).
    progress : callable, optional
        ``progress(done_bytes, total_bytes)``, called from this thread after each read.
    jobs : int
        Reads in flight at once (threads of the pool that reads and decodes).
    checked : SharedChecks, optional
        Shared partitions already checked by earlier calls given the same object: their
        results are reused, not read again, and this call's are added.

    Returns
    -------
    VerifyReport
        ``.ok`` is false if anything but a foreign file was found (see the module docstring).

    Raises
    ------
    SnapshotNotFoundError
        If ``fingerprint`` has no commit record.
    StoreError
        If the storage backend fails.

    Examples
    --------
    >>> report = verify_snapshot(store, fp)  # doctest: +SKIP
    >>> report.ok, [p["message"] for p in report.problems]  # doctest: +SKIP
    """
    store = as_store(store)
    if jobs < 1:
        raise ValueError(f"jobs: expected an int >= 1, found {jobs!r}")
    started = time.perf_counter()
    report = VerifyReport(fingerprint)
    reader = _open(store, fingerprint, report)
    if reader is not None:
        try:
            with ThreadPoolExecutor(jobs, thread_name_prefix="snapstore-verify") as pool:
                report_progress = progress or (lambda done, total: None)
                _verify_files(reader, pool, report, report_progress, checked or SharedChecks())
        finally:
            reader.close()
    report.problems.sort(
        key=lambda p: (p["shard"] or "", -1 if p["offset"] is None else p["offset"], p["kind"])
    )
    report.seconds = time.perf_counter() - started
    logger.info("verified %s: %d problem(s)", fingerprint, len(report.problems))
    return report


def _open(store: Store, fingerprint: str, report: VerifyReport) -> SnapshotReader | None:
    """The reader, or None with a problem recorded when the commit record, manifest or index
    does not load."""
    try:
        load_manifest(store, fingerprint)
    except FormatError as exc:
        report.problems.append(_problem("manifest", None, None, str(exc)))
        return None
    try:
        return SnapshotReader(store, fingerprint, decode_threads=1)
    except FormatError as exc:
        report.problems.append(_problem("index", None, None, str(exc)))
    except FileNotFoundError as exc:
        report.problems.append(
            _problem("index", None, None, f"block index of {fingerprint} is missing ({exc})")
        )
    return None


def _verify_files(
    reader: SnapshotReader,
    pool: ThreadPoolExecutor,
    report: VerifyReport,
    progress: ProgressCallback,
    checked: SharedChecks,
) -> None:
    store, paths, shards = reader.store, reader.shard_paths, reader.manifest["shards"]
    index = reader.index
    per_shard = [index[index["shard"] == i] for i in range(len(paths))]
    for i, entries in enumerate(per_shard):
        if len(entries) != int(shards[i].get("blocks", -1)):
            report.problems.append(
                _problem(
                    "index",
                    paths[i],
                    None,
                    f"the block index lists {len(entries)} blocks in shard "
                    f"{store.join(paths[i])} but the manifest says {shards[i].get('blocks')}",
                )
            )
    keys = [_shard_key(path, entry, rows) for path, entry, rows in zip(paths, shards, per_shard)]
    todo = [i for i, key in enumerate(keys) if key is None or key not in checked.shards]
    report.problems.extend(_partition_problems(reader, checked))
    sizes = dict(zip(todo, pool.map(lambda i: _size(store, paths[i]), todo)))
    report.problems.extend(_foreign_problems(reader, pool, checked))
    decode: Decode = functools.partial(
        fmt.decode_block, schema=reader.schema.arrow_schema(), checksum=reader.checksum
    )
    total = int(index["length"].astype(np.int64).sum()) if len(index) else 0
    found: dict[int, list[ShardResult]] = {}
    futures: dict[Future[ShardResult], int] = {}
    for i in todo:
        size = sizes[i]
        if size is None:
            found[i] = [(_advised(paths[i], [_missing(store, paths[i], len(per_shard[i]))]), 0, 0)]
            continue
        expected = int(shards[i]["size"])
        for future in _submit_shard(pool, store, paths[i], expected, size, per_shard[i], decode):
            futures[future] = i
    done = 0
    for i, key in enumerate(keys):
        if i not in sizes and key is not None:  # checked for an earlier snapshot: reused
            problems, blocks, nbytes = checked.shards[key]
            report.problems.extend(dict(p) for p in problems)
            report.blocks, report.bytes = report.blocks + blocks, report.bytes + nbytes
            report.bytes_reused += nbytes
            done += nbytes
            progress(done, total)
    for results in found.values():  # missing shards
        report.problems.extend(results[0][0])
    for future in as_completed(futures):
        problems, blocks, nbytes = future.result()
        i = futures[future]
        problems = _advised(paths[i], problems)
        found.setdefault(i, []).append((problems, blocks, nbytes))
        report.problems.extend(problems)
        report.blocks += blocks
        report.bytes += nbytes
        done += nbytes
        progress(done, total)
    for i, results in found.items():
        key = keys[i]
        if key is not None:
            merged = [p for problems, _, _ in results for p in problems]
            checked.shards[key] = (merged, sum(r[1] for r in results), sum(r[2] for r in results))


def _missing(store: Store, path: str, blocks: int) -> Problem:
    return _problem(
        "missing",
        path,
        None,
        f"shard {store.join(path)} is missing; its {blocks} block(s) were not checked. {_REBUILD}",
    )


def _shard_key(path: str, entry: dict[str, Any], rows: np.ndarray[Any, Any]) -> ShardKey | None:
    """What a shard of a shared partition is checked against (its path, size and index rows,
    shard numbers aside: they differ between the snapshots that share it); None for a shard
    no other snapshot can reference."""
    if not path.startswith(_SHARED_PREFIX):
        return None
    rows = rows.copy()
    rows["shard"] = 0
    digest = hashlib.blake2b(rows.tobytes(), digest_size=16).hexdigest()
    return path, f"{entry.get('size')}:{digest}"


def _advised(path: str, problems: list[Problem]) -> list[Problem]:
    """The problems of a shard, with the advice for a shared partition's shard: removing this
    snapshot and rebuilding it would read the same partition again."""
    if not path.startswith(_SHARED_PREFIX):
        return problems
    where = "/".join(path.split("/")[:3])
    advice = (
        f"It is in the partition {where}, which other snapshots of the stage may use too: "
        "remove every snapshot that uses it with `snapstore rm` (the partition goes with the "
        "last one; `snapstore verify --all` names them), then rebuild them."
    )
    return [{**p, "message": p["message"].replace(_REBUILD, advice)} for p in problems]


def _partition_problems(reader: SnapshotReader, checked: SharedChecks) -> list[Problem]:
    """The problems of the shared partitions' own files, each partition checked once per
    :class:`SharedChecks`."""
    try:
        refs = list(dict.fromkeys(partition_refs(reader.manifest)))
    except FormatError as exc:
        return [_problem("manifest", None, None, str(exc))]
    runs: dict[str, str] = {}
    members: dict[str, list[int]] = {}
    for i, entry in enumerate(reader.manifest["shards"]):
        where = entry.get("shared")
        if isinstance(where, str):
            ref = "/".join(where.split("/")[:2])
            runs.setdefault(ref, where.rsplit("/", 1)[-1])
            members.setdefault(ref, []).append(i)
    new = [ref for ref in refs if ref not in checked.partitions]
    # Small reads, bound by latency: as many in flight as listings are, not ``jobs``.
    found = map_concurrently(
        lambda r: _check_partition(reader, r, runs.get(r), members.get(r)), new
    )
    checked.partitions.update(zip(new, found))
    return [dict(p) for ref in refs for p in checked.partitions[ref]]


def _check_partition(
    reader: SnapshotReader, ref: str, run: str | None, shards: list[int] | None
) -> list[Problem]:
    """A shared partition's commit record, manifest and index: they load, name the run the
    snapshot reads (``run``; None when it has no shard) and list the blocks the snapshot's
    index gives for its shards (``shards``, positions in the snapshot's manifest)."""
    store, where = reader.store, f"{_SHARED_PREFIX}{ref}"
    advice = "remove every snapshot that uses it with `snapstore rm`, then rebuild them"
    try:
        part = SnapshotReader(store, where, decode_threads=1)
    except (FormatError, FileNotFoundError) as exc:
        message = f"partition {store.join(where)} does not open ({exc}); {advice}"
        return [_problem("partition", where, None, message)]
    try:
        if run is not None and part.manifest["run"] != run:
            message = (
                f"partition {store.join(where)} is committed as run {part.manifest['run']}, "
                f"but the snapshot reads its run {run}, which gc would remove; {advice}"
            )
            return [_problem("partition", where, None, message)]
        ids = shards or []
        expected = reader.index[np.isin(reader.index["shard"], ids)].copy()
        expected["shard"] -= ids[0] if ids else 0
        if len(part.shard_paths) != len(ids) or not np.array_equal(part.index, expected):
            message = (
                f"partition {store.join(where)} lists {len(part.index)} block(s) in "
                f"{len(part.shard_paths)} shard(s) in its own block index, which differ from "
                f"the {len(expected)} in {len(ids)} the snapshot's index gives for it; {advice}"
            )
            return [_problem("partition", where, None, message)]
    finally:
        part.close()
    return []


def _foreign_problems(
    reader: SnapshotReader, pool: ThreadPoolExecutor, checked: SharedChecks
) -> list[Problem]:
    """Foreign files in the run directory and the partitions' run directories, each of the
    latter listed once per :class:`SharedChecks`."""
    dirs = _run_dirs(reader)
    new = [d for d in dirs if d not in checked.directories]
    found = dict(zip(new, pool.map(lambda d: _foreign(reader.store, d, reader.shard_paths), new)))
    for directory, problems in found.items():
        if directory.startswith(_SHARED_PREFIX):
            checked.directories[directory] = problems
    return [dict(p) for d in dirs for p in found.get(d, checked.directories.get(d, []))]


def _size(store: Store, path: str) -> int | None:
    try:
        return store.size(path)
    except FileNotFoundError:
        return None


def _run_dirs(reader: SnapshotReader) -> list[str]:
    """The run directory and every directory holding a shard (partitions' runs)."""
    dirs = [reader.run_dir, *(p.rsplit("/", 1)[0] for p in reader.shard_paths)]
    return list(dict.fromkeys(dirs))


def _foreign(store: Store, directory: str, paths: list[str]) -> list[Problem]:
    known = {f"{directory}/{fmt.MANIFEST_NAME}", f"{directory}/{fmt.INDEX_NAME}", *paths}
    return [
        _problem(
            "foreign",
            f"{directory}/{name}",
            None,
            f"{store.join(f'{directory}/{name}')} is not named by the manifest and no reader "
            "opens it (a warning: it does not fail verification); remove it if nothing needs it",
        )
        for name in store.list_dir(directory)
        if f"{directory}/{name}" not in known
    ]


def _submit_shard(
    pool: ThreadPoolExecutor,
    store: Store,
    path: str,
    expected: int,
    size: int,
    entries: np.ndarray[Any, Any],
    decode: Decode,
) -> Iterator[Future[tuple[list[Problem], int, int]]]:
    """Submit the checks of one present shard: whole in one read when small and remote, else
    its magic and footer, then its blocks in coalesced range reads."""
    if not store.local and size <= _WHOLE_SHARD_BYTES:

        def whole() -> tuple[list[Problem], int, int]:
            data = memoryview(store.read_bytes(path))
            fetch: Fetch = lambda start, length: data[start : start + length]  # noqa: E731
            layout = _check_layout(store, path, expected, len(data), entries, fetch)
            problems, blocks, nbytes = _check_blocks(path, entries, fetch, decode)
            return layout + problems, blocks, nbytes

        yield pool.submit(whole)
        return

    def fetch(start: int, length: int) -> Any:
        return store.read_range(path, start, length)

    yield pool.submit(lambda: (_check_layout(store, path, expected, size, entries, fetch), 0, 0))
    max_bytes = _MAX_REQUEST_BYTES if store.coalesce and not store.local else 0
    offsets, lengths = entries["offset"].astype(np.int64), entries["length"].astype(np.int64)
    for start, length, members in plan_ranges(offsets, lengths, max_bytes):
        yield pool.submit(_check_range, path, entries[members], start, length, fetch, decode)


def _check_range(
    path: str,
    entries: np.ndarray[Any, Any],
    start: int,
    length: int,
    fetch: Fetch,
    decode: Decode,
) -> tuple[list[Problem], int, int]:
    data = memoryview(fetch(start, length))
    return _check_blocks(path, entries, lambda s, n: data[s - start : s - start + n], decode)


def _check_blocks(
    path: str, entries: np.ndarray[Any, Any], fetch: Fetch, decode: Decode
) -> tuple[list[Problem], int, int]:
    """Length, checksum (the snapshot's algorithm), decompression, decoding and row count of
    each block: every bad one."""
    problems: list[Problem] = []
    nbytes = 0
    for entry in entries:
        offset, length = int(entry["offset"]), int(entry["length"])
        nbytes += length
        try:
            decode(fetch(offset, length), entry, shard=path)
        except CorruptBlockError as exc:
            # The reader's advice to run `snapstore verify` is moot here; keep what is wrong.
            what = str(exc).split(". Run `snapstore verify`", 1)[0]
            message = f"{what}. Remove the snapshot with `snapstore rm` and rebuild it."
            problems.append(_problem("block", path, offset, message))
    return problems, len(entries), nbytes


def _check_layout(
    store: Store,
    path: str,
    expected: int,
    size: int,
    entries: np.ndarray[Any, Any],
    fetch: Fetch,
) -> list[Problem]:
    """The parts of a shard readers skip: its size, magic and footer."""
    where = store.join(path)
    problems: list[Problem] = []
    if size != expected:
        what = "truncated" if size < expected else "longer than written"
        problems.append(
            _problem(
                "size",
                path,
                None,
                f"shard {where} is {size} bytes but the manifest records {expected}: it is "
                f"{what}. Remove the snapshot with `snapstore rm` and rebuild it.",
            )
        )
    if bytes(fetch(0, len(fmt.SHARD_MAGIC))) != fmt.SHARD_MAGIC:
        problems.append(
            _problem("magic", path, 0, f"shard {where} does not start with {fmt.SHARD_MAGIC!r}")
        )
    if size == expected:  # a footer is only where the manifest says once the size matches
        problem = _check_footer(where, path, size, entries, fetch)
        if problem is not None:
            problems.append(problem)
    return problems


def _check_footer(
    where: str, path: str, size: int, entries: np.ndarray[Any, Any], fetch: Fetch
) -> Problem | None:
    """None if the footer lists exactly ``entries`` (shard numbers aside: a partition's shard
    keeps the number it had in its partition), right after the shard's last block."""
    tail = bytes(fetch(size - _FOOTER_TAIL, _FOOTER_TAIL)) if size >= _FOOTER_TAIL else b""
    if tail[8:] != fmt.SHARD_FOOTER_MAGIC:
        return _problem(
            "footer", path, None, f"shard {where} does not end with {fmt.SHARD_FOOTER_MAGIC!r}"
        )
    (count,) = struct.unpack("<Q", tail[:8])
    row = fmt.INDEX_DTYPE.itemsize
    start = size - _FOOTER_TAIL - count * row
    end = int(entries["offset"][-1] + entries["length"][-1]) if len(entries) else 8
    if count != len(entries) or start != end:
        return _problem(
            "footer",
            path,
            max(start, 0),
            f"footer of shard {where} lists {count} block(s) at offset {start}; the index "
            f"gives {len(entries)} ending at offset {end}",
        )
    footer = np.frombuffer(bytes(fetch(start, count * row)), dtype=fmt.INDEX_DTYPE)
    differ = [
        int(entries["offset"][i])
        for i in range(count)
        if any(footer[name][i] != entries[name][i] for name in _FOOTER_FIELDS)
    ]
    if differ:
        return _problem(
            "footer",
            path,
            start,
            f"footer of shard {where} disagrees with the block index about the block(s) at "
            f"offset(s) {', '.join(map(str, differ[:10]))}{' ...' if len(differ) > 10 else ''}",
        )
    return None
