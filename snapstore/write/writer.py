"""Streaming snapshot writer: samples in, committed snapshot out, with bounded memory.

Samples are validated on the caller's thread (so errors name the sample), grouped into blocks of
about ``block_bytes``, and encoded (Arrow IPC, zstd, CRC-32) on a thread pool while the caller's
generator keeps running. Encoded blocks are appended in order to shards under a run directory
that no reader looks at. :meth:`SnapshotWriter.commit` writes the block index and the manifest,
then creates the commit record only if absent: that single atomic step makes the snapshot
visible. :meth:`SnapshotWriter.abort` removes the run directory.

Memory is bounded by ``max_block_bytes * (2 * threads + 3)``: the block being filled, the blocks
being encoded or waiting to be written, and nothing else. (Rows given to
:meth:`SnapshotWriter.add_batch` are kept as slices of the caller's columns until their block is
encoded, so a batch's arrays stay alive that long.)

Where the time goes is counted as it is spent (:attr:`SnapshotWriter.times`, see
:mod:`snapstore.write.times`): a few clock readings per block on each thread, and one sample
in :data:`TIMED_EVERY` timed through validation; under :mod:`snapstore.tracing`, each block's
steps are ``write`` spans (``stage`` and ``validate`` on the stage's thread, ``encode`` and
``compress`` on an encoding thread, ``upload`` on the I/O thread, then ``commit``).
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import os
import secrets
import socket
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from time import perf_counter
from typing import IO, Any

import numpy as np
import pyarrow as pa

from .. import tracing
from ..format import layout as fmt
from ..format.arraylike import convert_sample
from ..format.checks import sample_checker
from ..format.checksums import WRITTEN
from ..format.columns import (
    batch_from_columns,
    conform_columns,
    infer_columns,
    normalize_columns,
    row_sizes,
    to_record_batch,
)
from ..format.inference import check_keys, infer_schema, merge_fields, resolve, sample_items
from ..format.schema import Schema
from ..oldpaths import historic_name
from ..storage.store import Store
from .times import WriteTimes

__all__ = ["Columns", "ProgressCallback", "SnapshotWriter", "WriteOptions"]

log = logging.getLogger(historic_name(__name__))

ProgressCallback = Callable[[int, int], None]
"""Called after each block is written with (samples written so far, bytes stored so far)."""

TIMED_EVERY = 16
"""One sample in this many has its validation timed (two clock readings), and the others are
counted as taking as long: timing every sample would cost a stage of 200,000 small samples
about 1% (see :mod:`snapstore.write.times`). A power of two."""


def _default_threads() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2))


@dataclass(frozen=True)
class WriteOptions:
    """How a snapshot is written. None of these change the data, so none is in the fingerprint.

    Parameters
    ----------
    block_bytes : int
        Target uncompressed size of a block. Blocks are the unit of the cross-shard shuffle, so
        a snapshot needs many of them: a random order of B blocks keeps a rank correlation of
        about 1/sqrt(B) with the written order. 256 KiB gives a 240 MB token snapshot ~900
        blocks (|Spearman| ~0.03, against ~0.09 with 1 MiB blocks) while zstd keeps its full
        ratio. See the block-size sweep in benchmarks/README.md.
    block_min_rows : int
        A block also holds at least this many samples (unless it reaches ``max_block_bytes``):
        decoding and checksumming cost per block, so blocks of a few large samples (images)
        read 40% slower; 64 rows keeps a 50,000-image snapshot at ~780 blocks.
    max_block_bytes : int
        Hard upper bound of a block's size (a single larger sample still makes one block).
    shard_bytes : int
        Target stored size of a shard file. 256 MiB keeps file counts low (one object per
        256 MiB in a bucket) while every block is still reachable by one range read.
    compression_level : int
        zstd level; 0 stores every block raw. Level 1 compresses tokens 2.7x at ~290 MB/s per
        core here; level 3 gains 2% of size for 35% less speed.
    min_compression_ratio : float
        Store a block raw unless zstd shrinks it by at least this factor: decoded image data that
        compresses 1.1x costs far more to decompress than the bytes saved.
    threads : int
        Encoding threads; 0 means up to 4, bounded by the usable cores.
    """

    block_bytes: int = 256 << 10
    block_min_rows: int = 64
    max_block_bytes: int = 4 << 20
    shard_bytes: int = 256 << 20
    compression_level: int = 1
    min_compression_ratio: float = 1.25
    threads: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.block_bytes >= 1, "block_bytes", "a positive number of bytes"),
            (self.block_min_rows >= 1, "block_min_rows", "a positive number of rows"),
            (self.max_block_bytes >= self.block_bytes, "max_block_bytes", ">= block_bytes"),
            (self.shard_bytes >= 1, "shard_bytes", "a positive number of bytes"),
            (0 <= self.compression_level <= 22, "compression_level", "a zstd level 0..22"),
            (self.min_compression_ratio >= 1.0, "min_compression_ratio", "a ratio >= 1.0"),
            (self.threads >= 0, "threads", "0 (automatic) or a positive count"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise ValueError(
                    f"WriteOptions.{name} must be {expected}, got {getattr(self, name)!r}"
                )


def build_manifest(
    fingerprint: str,
    run: str,
    extra: Mapping[str, Any],
    *,
    schema: Schema,
    schema_declared: bool,
    totals: Mapping[str, int],
    shards: list[dict[str, Any]],
    index_bytes: bytes,
    write_options: Mapping[str, Any],
    more: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A run's manifest (section 5 of docs/format.md): ``extra`` first, then the format's keys;
    ``totals`` holds ``num_samples``, ``num_blocks``, ``raw_bytes`` and ``stored_bytes``, and
    ``more`` keys go before ``write_options``."""
    return {
        **extra,
        "format": "snapstore",
        "format_version": fmt.FORMAT_VERSION,
        "checksum": WRITTEN.name,
        "fingerprint": fingerprint,
        "run": run,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "schema": schema.to_json(),
        "schema_declared": schema_declared,
        **{key: totals[key] for key in ("num_samples", "num_blocks", "raw_bytes", "stored_bytes")},
        "shards": shards,
        "index": {
            "path": fmt.INDEX_NAME,
            "size": len(index_bytes),
            "checksum": WRITTEN(index_bytes),
        },
        **(more or {}),
        "write_options": dict(write_options),
    }


def publish(
    store: Store, fingerprint: str, run: str, index_bytes: bytes, manifest: dict[str, Any]
) -> bool:
    """Write a run's index and manifest, make them durable, then create the commit record if
    absent (section 10.1 of docs/format.md). True if this run became the snapshot.

    The record takes the manifest's ``format_version``, so a copy keeps its source's."""
    run_dir = f"{fingerprint}/runs/{run}"
    store.write_bytes(f"{run_dir}/{fmt.INDEX_NAME}", index_bytes)
    data = fmt.dump_json(manifest)
    store.write_bytes(f"{run_dir}/{fmt.MANIFEST_NAME}", data)
    store.sync_dir(run_dir)  # the run's files are durable before the commit
    store.sync_dir(f"{fingerprint}/runs")
    record = fmt.CommitRecord(
        fingerprint=fingerprint,
        run=run,
        manifest_size=len(data),
        manifest_checksum=fmt.CommitRecord.checksum(data),
        committed_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        format_version=int(manifest["format_version"]),
    )
    return store.create_if_absent(f"{fingerprint}/{fmt.COMMIT_NAME}", record.to_bytes())


def new_run_id() -> str:
    """A run name unique per writer attempt: time, host, pid and random bits."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    short = socket.gethostname().split(".")[0]
    host = "".join(c for c in short if c.isascii() and c.isalnum())[:20] or "host"
    return f"{stamp}-{host}-{os.getpid()}-{secrets.token_hex(4)}"


def _index_array(entries: list[tuple[int, int, int, int, int, int, int]]) -> np.ndarray[Any, Any]:
    index = np.zeros(len(entries), dtype=fmt.INDEX_DTYPE)
    if entries:
        names = ("shard", "codec", "offset", "length", "raw_length", "rows", "checksum")
        for name, column in zip(names, zip(*entries)):
            index[name] = column
    return index


_Piece = list[Mapping[str, Any]] | dict[str, Any]
"""Part of a block: rows of add(), or column slices of add_batch()."""


def _slice(cols: Mapping[str, Any], start: int, stop: int) -> dict[str, Any]:
    return {name: col[start:stop] for name, col in cols.items()}


def _sample_nbytes(sample: Mapping[str, Any]) -> int:
    total = 0
    for value in sample.values():
        kind = type(value)  # exact types first: this runs for every sample
        if kind is np.ndarray:
            total += value.nbytes
        elif kind is str or kind is bytes:
            total += len(value) + 8
        elif kind is dict:
            total += _sample_nbytes(value)
        elif kind is list or kind is tuple:
            total += 8 * len(value) + 8
        elif isinstance(value, np.ndarray):
            total += value.nbytes
        else:
            total += 8
    return total


@dataclass(frozen=True)
class Columns:
    """A batch of samples as columns, for a stage to yield in place of one dict per sample.

    ``data`` is what :meth:`SnapshotWriter.add_batch` takes: field name to a numpy array or a
    torch tensor (or other array-like) whose leading dimension is the rows (or a list, for str,
    bytes and varying-shape arrays), or a pyarrow Table or RecordBatch. The snapshot is the
    same as if the stage had yielded the rows one by one; a vectorized stage skips building a
    dict per sample.

    Examples
    --------
    >>> @snapstore.snapshot()                                             # doctest: +SKIP
    ... def tokenized(paths):
    ...     for path in paths:
    ...         ids, labels = tokenize_file(path)  # (rows, 512) int32, (rows,) int64
    ...         yield snapstore.Columns({"tokens": ids, "label": labels})
    """

    data: Mapping[str, Any] | pa.Table | pa.RecordBatch


class SnapshotWriter:
    """Writes one attempt of a snapshot under ``<fingerprint>/runs/<run>/``.

    Parameters
    ----------
    store : Store
        Where to write.
    fingerprint : str
        The snapshot's key (its directory name).
    manifest_extra : mapping
        JSON-able entries for the manifest (fingerprint parts, stage name...).
    schema : Schema, optional
        Declared schema; inferred from the first block's samples when None.
    options : WriteOptions, optional
        Block, shard, compression and thread settings.
    progress : callable, optional
        ``progress(samples, stored_bytes)`` after each block is written.
    """

    def __init__(
        self,
        store: Store,
        fingerprint: str,
        manifest_extra: Mapping[str, Any] | None = None,
        *,
        schema: Schema | None = None,
        options: WriteOptions | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        self.store = store
        if not all(fmt.is_plain_name(part) for part in fingerprint.split("/")):
            raise ValueError(
                f"fingerprint {fingerprint!r} is not a plain directory name (or, for a "
                "partition, a path of plain names)"
            )
        self.fingerprint = fingerprint
        self.options = options or WriteOptions()
        self.run = new_run_id()
        self.run_dir = f"{fingerprint}/runs/{self.run}"
        self._extra = dict(manifest_extra or {})
        self._declared = schema
        self.schema: Schema | None = schema
        self._progress = progress
        threads = self.options.threads or _default_threads()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="snapstore-encode")
        # One I/O thread appends encoded blocks to shards in order, so neither compression nor
        # file writes block the caller's generator.
        self._io = ThreadPoolExecutor(1, thread_name_prefix="snapstore-write")
        self._max_pending = 2 * threads + 1
        self._pending: collections.deque[Future[None]] = collections.deque()
        self._check: Callable[[Any, int], Mapping[str, Any]] | None = None
        self._buffer: list[Mapping[str, Any]] = []  # rows of add(), after self._pieces
        # Earlier parts of the block being filled, with the index of their first sample:
        # rows of add(), or column slices of add_batch() (conformed once the schema is known).
        self._pieces: list[tuple[int, _Piece]] = []
        self._buffer_rows = 0  # rows in self._pieces and self._buffer
        self._buffer_bytes = 0
        self._count = 0
        self._entries: list[tuple[int, int, int, int, int, int, int]] = []
        self._shards: list[dict[str, Any]] = []
        self._shard: IO[bytes] | None = None
        self._shard_size = 0
        self._shard_blocks = 0
        self._raw_bytes = 0
        self._stored_bytes = 0
        self._rows_written = 0
        self._closed = False
        # Where the time goes (snapstore.write.times). The stage's thread: its add() samples
        # timed and their seconds, rows given as columns and the seconds validating them,
        # validation and waits at block flushes, the stage's own seconds, the commit's.
        self._threads = threads
        self._timed, self._timed_rows = 0.0, 0
        self._batch_rows, self._batch_validate = 0, 0.0
        self._flush_validate = self._blocked = self._flushing = 0.0
        self._stage = self._commit = 0.0
        self._ran = False
        self._work = [0.0, 0.0, 0.0]  # encode, compress, upload: the I/O thread's alone
        # While add_all() runs under tracing: when the block being filled began (trace
        # microseconds) and the validation seconds counted by then.
        self._block_mark: tuple[float, float] | None = None

    @property
    def samples_written(self) -> int:
        """Samples accepted so far."""
        return self._count

    @property
    def times(self) -> WriteTimes:
        """Where this writer's time went so far, final once committed (see
        :mod:`snapstore.write.times`); ``stage`` counts only what :meth:`add_all` ran."""
        encode, compress, upload = self._work
        return WriteTimes(
            stage=self._stage,
            validate=self._validated(),
            blocked=self._blocked,
            commit=self._commit,
            encode=encode,
            compress=compress,
            upload=upload,
            samples=self._count,
            stored_bytes=self._stored_bytes,
            threads=self._threads,
            computed=self._ran,
        )

    def _validated(self) -> float:
        """Seconds spent validating samples so far: add()'s estimated from its timed samples."""
        rows = self._count - self._batch_rows
        each = self._timed / self._timed_rows if self._timed_rows else 0.0
        return each * rows + self._batch_validate + self._flush_validate

    def add_all(self, samples: Callable[[], Iterable[Mapping[str, Any] | Columns]]) -> None:
        """:meth:`add` every sample of ``samples()`` (a stage's call), timing the stage's own
        code (the call, and each step of what it returned) apart from snapstore's work: see
        :attr:`times`. Under tracing, each block's share of either is a span.

        Raises
        ------
        SchemaError
            As :meth:`add`; and whatever ``samples`` raises.
        """
        began = perf_counter()
        spent = self._validated() + self._blocked
        self._ran = True
        if tracing.enabled():
            self._block_mark = (tracing.now(), self._validated())
        try:
            for sample in samples():
                self.add(sample)
        finally:
            if self._block_mark is not None:
                self._trace_block()
                self._block_mark = None
            theirs = self._validated() + self._blocked - spent  # snapstore's, in the loop
            self._stage += max(0.0, perf_counter() - began - theirs)

    def _trace_block(self) -> None:
        """The block being filled since the mark, as a ``stage`` span and a ``validate`` span
        as long as the seconds of each (they alternate sample by sample; drawn one after the
        other)."""
        assert self._block_mark is not None
        start, validated = self._block_mark
        end = tracing.now()
        middle = max(start, end - (self._validated() - validated) * 1e6)
        rows = self._buffer_rows
        tracing.complete("stage", "write", start, middle, samples=rows)
        tracing.complete("validate", "write", middle, end, samples=rows)

    def add(self, sample: Mapping[str, Any] | Columns) -> None:
        """Validate and buffer one sample; encodes a block when enough bytes have gathered.

        A :class:`Columns` is a batch of samples: it goes to :meth:`add_batch`. Torch tensors
        and other array-likes among the values are converted to numpy arrays once, here, and
        the sample is stored as if it had held those arrays.

        Raises
        ------
        SchemaError
            If the sample does not fit the (declared or inferred) schema.
        """
        if isinstance(sample, Columns):
            self.add_batch(sample.data)
            return
        timed = not self._count & (TIMED_EVERY - 1)
        if timed:
            began = perf_counter()
        row: Mapping[str, Any]  # the sample to store: array-likes become numpy arrays once
        if self._check is not None:
            row = self._check(sample, self._count)
        elif self.schema is not None:
            self._check = sample_checker(self.schema)
            row = self._check(sample, self._count)
        else:
            sample_items(sample, self._count)  # a dict of str keys; the rest at inference
            row = convert_sample(sample, self._count)
        self._buffer.append(row)
        self._buffer_bytes += _sample_nbytes(row)
        self._buffer_rows += 1
        self._count += 1
        if timed:
            self._timed += perf_counter() - began
            self._timed_rows += 1
        options = self.options
        if self._buffer_bytes >= options.max_block_bytes or (
            self._buffer_bytes >= options.block_bytes
            and self._buffer_rows >= options.block_min_rows
        ):
            self._flush_block()

    def add_batch(self, columns: Mapping[str, Any] | pa.Table | pa.RecordBatch) -> None:
        """Validate and buffer a batch of samples given as columns; same result as :meth:`add`
        for each row, without a Python dict per row.

        Parameters
        ----------
        columns : mapping or pyarrow.Table or pyarrow.RecordBatch
            Field name to column, one value per row: a numpy array (or a torch tensor or other
            array-like, converted once) whose leading dimension is the rows, or a list (str,
            bytes, varying-shape arrays, whose items may be tensors too). A 1-D ``int64``,
            ``float64`` or ``bool`` array holds the kinds int, float and bool (what a Python
            stage yields); other 1-D arrays hold rank-0 arrays; an array of shape
            ``(rows, *shape)`` holds arrays of ``shape``. Row ``i`` is the sample :meth:`add`
            would take, with :func:`snapstore.format.columns.column_rows` giving each column's
            values. Arrow input may have primitive, string, binary and fixed-size list columns,
            without nulls.

        Raises
        ------
        SchemaError
            If columns differ in length, or do not fit the (declared or inferred) schema:
            missing or extra fields, another dtype, another fixed shape. Nothing of the batch
            is buffered then (unless the schema was still to be inferred from it).

        Examples
        --------
        >>> writer.add_batch({"tokens": tokens, "label": np.arange(len(tokens))})  # doctest: +SKIP
        """
        began, flushing = perf_counter(), self._flushing
        cols, rows = normalize_columns(columns)
        self._add_columns(cols, rows)
        self._batch_validate += perf_counter() - began - (self._flushing - flushing)
        self._batch_rows += rows

    def _add_columns(self, cols: dict[str, Any], rows: int) -> None:
        sizes = np.zeros(rows, dtype=np.int64)
        for col in cols.values():
            sizes += row_sizes(col)
        if self.schema is not None:
            cols = conform_columns(self.schema, cols, self._count)
        if not rows:
            return
        cum = np.cumsum(sizes)
        start = 0
        while start < rows:
            end, full = self._block_end(cum, start)
            if self._buffer:
                self._pieces.append((self._count - len(self._buffer), self._buffer))
                self._buffer = []
            self._pieces.append((self._count, _slice(cols, start, end)))
            self._buffer_bytes += int(cum[end - 1] - (cum[start - 1] if start else 0))
            self._buffer_rows += end - start
            self._count += end - start
            if not full:
                return
            inferred = self.schema is None
            self._flush_block()
            if inferred and end < rows:  # the rest is checked against the schema just inferred
                self._add_columns(_slice(cols, end, rows), rows - end)
                return
            start = end

    def _block_end(self, cum: np.ndarray[Any, Any], start: int) -> tuple[int, bool]:
        """Where the block being filled ends if rows ``start..`` join it (exclusive), and
        whether it is then full, by the rule :meth:`add` applies row by row."""
        options = self.options
        base = int(cum[start - 1]) if start else 0
        by_max = int(np.searchsorted(cum, base + options.max_block_bytes - self._buffer_bytes))
        by_bytes = int(np.searchsorted(cum, base + options.block_bytes - self._buffer_bytes))
        by_rows = start + max(0, options.block_min_rows - self._buffer_rows - 1)
        last = min(by_max, max(by_bytes, by_rows))
        return (last + 1, True) if last < len(cum) else (len(cum), False)

    def _infer(self, pieces: list[tuple[int, _Piece]]) -> Schema:
        """The schema of the first block, as :func:`infer_schema` gives for its rows."""
        fields: dict[str, Any] = {}
        for first, piece in pieces:
            if isinstance(piece, list):
                found = infer_schema(piece, first, resolved=False)
            else:
                found = infer_columns(piece, first)
            if not fields:
                fields = {f.name: f for f in found.fields}
                continue
            check_keys(fields, {f.name: f for f in found.fields}, first)
            for f in found.fields:
                fields[f.name] = merge_fields(fields[f.name], f, first)
        return resolve(Schema(tuple(fields.values())), pieces[0][0], self._buffer_rows)

    def _flush_block(self) -> None:
        if not self._buffer_rows:
            return
        began = perf_counter()
        if self._block_mark is not None:
            self._trace_block()
        pieces = list(self._pieces)
        if self._buffer:
            pieces.append((self._count - len(self._buffer), self._buffer))
        schema = self.schema
        if schema is None:
            with tracing.span("validate", "write", inferred=self._buffer_rows):
                schema, pieces = self._infer_and_check(pieces)
        checked = perf_counter()
        self._pieces, self._buffer, self._buffer_bytes, self._buffer_rows = [], [], 0, 0
        encoded = self._pool.submit(self._encode, schema, pieces)
        self._pending.append(self._io.submit(lambda: self._write_block(encoded.result())))
        while len(self._pending) > self._max_pending:
            self._pending.popleft().result()  # bounds memory; raises what encoding or I/O raised
        ended = perf_counter()
        self._flush_validate += checked - began
        self._blocked += ended - checked
        self._flushing += ended - began
        if self._block_mark is not None:
            self._block_mark = (tracing.now(), self._validated())

    def _infer_and_check(
        self, pieces: list[tuple[int, _Piece]]
    ) -> tuple[Schema, list[tuple[int, _Piece]]]:
        """Infer the schema from the first block, and check the block against it."""
        self.schema = schema = self._infer(pieces)
        # Inference accepted these rows one by one; the schema it settled on is checked too
        # (a list of int in a field that widened to float64 must hold exactly there).
        self._check = check = sample_checker(schema)
        return schema, [
            (
                first,
                [check(row, first + i) for i, row in enumerate(p)]
                if isinstance(p, list)
                else conform_columns(schema, p, first),
            )
            for first, p in pieces
        ]

    def _encode(
        self, schema: Schema, pieces: list[tuple[int, _Piece]]
    ) -> tuple[fmt.EncodedBlock, float, float]:
        """The block, and the seconds spent encoding and compressing it (on a pool thread)."""
        began = perf_counter()
        with tracing.span("encode", "write"):
            batches = [
                to_record_batch(schema, p) if isinstance(p, list) else batch_from_columns(schema, p)  # type: ignore[arg-type]
                for _, p in pieces
            ]
            if len(batches) == 1:
                batch = batches[0]
            else:  # pa.concat_batches needs pyarrow 19
                batch = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
            raw = memoryview(batch.serialize())
        serialized = perf_counter()
        with tracing.span("compress", "write", bytes=raw.nbytes):
            block = fmt.pack_block(
                raw,
                batch.num_rows,
                level=self.options.compression_level,
                min_ratio=self.options.min_compression_ratio,
            )
        return block, serialized - began, perf_counter() - serialized

    def _write_block(self, encoded: tuple[fmt.EncodedBlock, float, float]) -> None:
        block, encode, compress = encoded
        began = perf_counter()
        with tracing.span("upload", "write", bytes=block.data.nbytes):
            self._append(block)
        work = self._work  # this thread's alone: no lock
        work[0] += encode
        work[1] += compress
        work[2] += perf_counter() - began
        if self._progress is not None:
            self._progress(self._rows_written, self._stored_bytes)

    def _append(self, block: fmt.EncodedBlock) -> None:
        if (
            self._shard is not None
            and self._shard_size + block.data.nbytes > self.options.shard_bytes
        ):
            self._close_shard()
        if self._shard is None:
            name = f"shard-{len(self._shards):05d}.snap"
            self._shard = self.store.open_write(f"{self.run_dir}/{name}")
            self._shard.write(fmt.SHARD_MAGIC)
            self._shards.append({"path": name})
            self._shard_size = len(fmt.SHARD_MAGIC)
            self._shard_blocks = 0
        padding = -self._shard_size % fmt.BLOCK_ALIGNMENT
        if padding:
            self._shard.write(bytes(padding))
            self._shard_size += padding
        self._shard.write(block.data)
        self._entries.append(
            (
                len(self._shards) - 1,
                block.codec,
                self._shard_size,
                block.data.nbytes,
                block.raw_length,
                block.rows,
                block.checksum,
            )
        )
        self._shard_size += block.data.nbytes
        self._shard_blocks += 1
        self._raw_bytes += block.raw_length
        self._stored_bytes += block.data.nbytes
        self._rows_written += block.rows

    def _close_shard(self) -> None:
        if self._shard is None:
            return
        entries = _index_array(self._entries[len(self._entries) - self._shard_blocks :])
        self._shard.write(fmt.shard_footer(entries))
        self._shard.close()
        self._shards[-1].update(
            size=self._shard_size + len(entries) * fmt.INDEX_DTYPE.itemsize + 16,
            blocks=self._shard_blocks,
        )
        self._shard = None

    def _drain(self) -> None:
        self._flush_block()
        began = perf_counter()
        while self._pending:
            self._pending.popleft().result()
        self._io.submit(self._close_last_shard).result()
        self._blocked += perf_counter() - began

    def _close_last_shard(self) -> None:
        began = perf_counter()
        with tracing.span("upload", "write"):
            self._close_shard()
        self._work[2] += perf_counter() - began

    def _manifest(self, index: np.ndarray[Any, Any], index_bytes: bytes) -> dict[str, Any]:
        return build_manifest(
            self.fingerprint,
            self.run,
            self._extra,
            schema=self.schema or Schema(()),
            schema_declared=self._declared is not None,
            totals={
                "num_samples": self._count,
                "num_blocks": len(index),
                "raw_bytes": self._raw_bytes,
                "stored_bytes": self._stored_bytes,
            },
            shards=self._shards,
            index_bytes=index_bytes,
            write_options=asdict(self.options),
        )

    def commit(self) -> bool:
        """Finish writing and make the snapshot visible.

        Returns
        -------
        bool
            True if this writer's run became the snapshot; False if another writer had
            committed the same fingerprint first (this run is then removed).
        """
        if self._closed:
            raise RuntimeError("this SnapshotWriter is already committed or aborted")
        try:
            self._drain()
            began = perf_counter()
            with tracing.span("commit", "write"):
                index = _index_array(self._entries)
                index_bytes = fmt.write_index(index)
                manifest = self._manifest(index, index_bytes)
                won = publish(self.store, self.fingerprint, self.run, index_bytes, manifest)
        except BaseException:
            self.abort()
            raise
        self._shutdown()
        if not won:
            log.info(
                "snapshot %s was committed by another writer; discarding run %s",
                self.fingerprint,
                self.run,
            )
            self.store.remove_tree(self.run_dir)
        self._commit += perf_counter() - began
        return won

    def abort(self) -> None:
        """Stop, and remove everything this run wrote. Safe to call more than once."""
        if self._closed:
            return
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._shutdown()
        if self._shard is not None:
            try:
                self._shard.close()
            except OSError:
                log.warning("could not close a shard of aborted run %s", self.run, exc_info=True)
            self._shard = None
        try:
            self.store.remove_tree(self.run_dir)
        except OSError:
            log.warning(
                "could not remove aborted run %s; `snapstore gc` will", self.run_dir, exc_info=True
            )

    def _shutdown(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._io.shutdown(wait=True, cancel_futures=True)
