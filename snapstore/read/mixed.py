"""Batches of one consumer's share of a mixture's epoch, resumable from a small dict of integers.

:class:`MixedBatchReader` reads several opened snapshots as one stream. The pure
:class:`~snapstore.read.mixture.MixSchedule` says which source each position of the epoch reads;
consumers (rank x worker) read contiguous, equal slices of the epoch's positions, as for one
snapshot (:class:`~snapstore.format.plan.EpochPlan`). A consumer's positions of source ``i`` are
a contiguous range of that source's stream (its passes, each an ``EpochPlan`` order keyed by the
pass), so each source is read by its own :class:`~snapstore.read.prefetch.Prefetcher` over its
part of the one byte budget, and an assembler thread puts each batch together in schedule order.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import tracing
from ..errors import ResumeError
from ..format.handoff import Handoff
from ..format.plan import ORDER_VERSION, EpochPlan, PlanOptions, derive_key
from ..format.ragged import check_form
from ..format.schema import Schema
from .assemble import Allocate, BatchBuilder, chunk_rows, cut_rows, interleave
from .batches import consumer_of, resume_state, snapshot_id, traced_pass
from .mixture import MIX_DOMAIN, MixSchedule
from .options import ReaderOptions
from .prefetch import Prefetcher, ReadStats, SharedDecoders
from .reader import SnapshotReader

__all__ = ["MixedBatchReader", "SourceSlice", "source_chunks"]

STATE_VERSION = 1
_ORDER_KEYS = ("mixture", "epoch", "seed", "shuffle", "drop_last", "unit", "order_version")
_READY_BATCHES = 2
SPAN_ROWS = 4096  # rows put in schedule order at once: the index work is spread over batches
# A source's read-ahead never drops below this, however small its share: enough for a few
# blocks in flight, so a rare source still hides its store's latency.
_MIN_SOURCE_PREFETCH = 8 << 20


@dataclasses.dataclass(frozen=True)
class SourceSlice:
    """How one source is read in a mixture: its samples per epoch and its order settings."""

    reader: SnapshotReader
    count: int  # samples of this source per epoch
    share: float  # its fraction of the bytes the mixture reads: its part of budget and window


def source_chunks(
    reader: SnapshotReader, options: PlanOptions, ranges: Sequence[tuple[int, int]]
) -> Iterator[np.ndarray[Any, Any]]:
    """Global sample indices of the stream positions in ``ranges`` of a source, chunk by chunk.

    Position ``q`` of a source's stream is position ``q mod N`` of its pass ``q // N``, whose
    order is the source's :class:`EpochPlan` for epoch ``q // N`` (one consumer).
    """
    n = len(reader)
    for lo, hi in ranges:
        while lo < hi:
            pass_, at = divmod(lo, n)
            plan = EpochPlan(
                None, offsets=reader.offsets, epoch=pass_, rank=0, world_size=1, options=options
            )
            for chunk in plan.chunks(at):
                take = chunk[: hi - lo]
                yield take
                lo += len(take)
                if lo >= hi:
                    break


def mixture_id(fingerprints: Sequence[str], counts: Sequence[int]) -> int:
    """A 63-bit integer naming a mixture (sources and their counts) inside a resume state."""
    text = ";".join(f"{f}:{c}" for f, c in zip(fingerprints, counts, strict=True))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


class MixedBatchReader:
    """Batches of one consumer's share of one epoch of a mixture, as dicts of numpy arrays.

    Made by :meth:`snapstore.Mixture.batches`, which documents the parameters; it is read like a
    :class:`snapstore.BatchReader`: iterate, ``get_state()``/``set_state()``, ``set_epoch()``,
    ``stats()``, ``close()``, ``allocate``.
    """

    def __init__(
        self,
        sources: Sequence[SourceSlice],
        schema: Schema,
        batch_size: int,
        settings: ReaderOptions,
        *,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        homogeneous: bool = False,
        source_field: str | None = None,
        allocate: Allocate | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or operator.index(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.settings = settings
        check_form(schema.flat(), settings.ragged)
        self.schema, self.sources = schema, list(sources)
        self.source_field = source_field
        self.unit = self.batch_size if homogeneous else 1
        self.units = [s.count // self.unit for s in self.sources]
        if sum(self.units) == 0:
            raise ValueError(
                f"homogeneous batches of {self.batch_size}: no source has that many samples per "
                "epoch; use a smaller batch or more samples per epoch"
            )
        self.order_version = settings.order_version or ORDER_VERSION  # each source's EpochPlan's
        self.plans = [self._source_plan(i) for i in range(len(self.sources))]
        consumers = operator.index(world_size) * operator.index(num_workers)
        consumer = operator.index(rank) * operator.index(num_workers) + operator.index(worker)
        if not 0 <= consumer < consumers:
            raise ValueError(
                f"expected 0 <= rank < world_size and 0 <= worker < num_workers, found rank "
                f"{rank} of {world_size}, worker {worker} of {num_workers}"
            )
        self._place = {"rank": rank, "world_size": world_size}
        self._place |= {"worker": worker, "num_workers": num_workers}
        self.consumer, self.consumers = consumer, consumers
        total = sum(self.units)
        self.per = total // consumers if settings.drop_last else -(-total // consumers)
        self.id = mixture_id([s.reader.fingerprint for s in self.sources], self.units)
        self.allocate = allocate
        self._epoch = operator.index(epoch)
        self.schedule = MixSchedule(self.units, seed=settings.seed, epoch=self._epoch)
        self._start = self._position = 0
        self._prefetchers: list[Prefetcher] = []
        self._decoders: SharedDecoders | None = None
        self._streams: list[Iterator[tuple[np.ndarray[Any, Any], dict[int, Any]]]] = []
        self._handoff: Handoff[tuple[dict[str, Any], int]] | None = None
        self._stats = ReadStats()
        self._began = 0.0  # when the current pass started (tracing.now())

    def _source_plan(self, i: int) -> PlanOptions:
        source, read = self.sources[i], self.settings
        seed = derive_key(read.seed, snapshot_id(source.reader.fingerprint), MIX_DOMAIN) >> 1
        blocks = read.window_blocks or source.reader.window_blocks(
            max(1, int(read.window_bytes * source.share))
        )
        return PlanOptions(bool(read.shuffle), seed, blocks, False, self.order_version)

    @property
    def reader(self) -> MixedBatchReader:
        """This reader (what integrations take the schema from: ``reader.reader.schema``)."""
        return self

    @property
    def epoch(self) -> int:
        """The epoch this reader yields."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Yield epoch ``epoch`` from the next pass on (from its start)."""
        self._epoch = operator.index(epoch)
        self.schedule = MixSchedule(self.units, seed=self.settings.seed, epoch=self._epoch)
        self._start = self._position = 0

    @property
    def num_samples(self) -> int:
        """Samples this consumer reads in one epoch."""
        return self.per * self.unit

    def __len__(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.settings.drop_last else 0)

    # -- resume -----------------------------------------------------------------------------

    def get_state(self) -> dict[str, int]:
        """Where this reader is: a small dict of integers (three per source), for a checkpoint."""
        read = self.settings
        state = {
            "version": STATE_VERSION,
            "mixture": self.id,
            "epoch": self._epoch,
            "seed": int(read.seed),
            "shuffle": int(bool(read.shuffle)),
            "drop_last": int(read.drop_last),
            "unit": self.unit,
            "order_version": self.order_version,
            **self._place,
            "position": self._position,
        }
        for i, (source, plan) in enumerate(zip(self.sources, self.plans, strict=True)):
            state[f"source{i}"] = snapshot_id(source.reader.fingerprint)
            state[f"count{i}"] = self.units[i]
            state[f"window{i}"] = plan.window_blocks
        return state

    def set_state(self, state: dict[str, int]) -> None:
        """Continue from ``state`` (from :meth:`get_state`) on the next pass, in its order
        version (1 when it has none) when ``settings.order_version`` is None.

        Raises
        ------
        ResumeError
            If the state is malformed or for another mixture, order or consumer.
        """
        mine = self.get_state()
        state, version = resume_state(state, mine, self.settings.order_version)
        keys = [*_ORDER_KEYS, *(k for k in mine if k[-1].isdigit())]
        differ = [f"{k}={state[k]} (reader has {mine[k]})" for k in keys if state[k] != mine[k]]
        theirs = consumer_of(state)
        if theirs != (self.consumer, self.consumers):
            differ.append(
                f"consumer {theirs[0]} of {theirs[1]} (reader: {self.consumer} of {self.consumers})"
            )
        if state["version"] != STATE_VERSION:
            differ.append(f"version {state['version']} (reader reads {STATE_VERSION})")
        if differ:
            raise ResumeError(
                "resume state is for another mixture, order or partition: "
                + ", ".join(differ)
                + "; make the reader with the same sources, weights and settings as the one that "
                "saved it"
            )
        position = state["position"]
        if (
            not isinstance(position, int)
            or not 0 <= position <= self.num_samples
            or position % self.unit
        ):
            raise ResumeError(
                f"resume state position must be a multiple of {self.unit} in "
                f"[0, {self.num_samples}], found {position!r}"
            )
        if self._handoff is not None:
            raise ResumeError("set_state() while a pass is running; call it before iterating")
        if version != self.order_version:
            self.order_version = version
            self.plans = [self._source_plan(i) for i in range(len(self.sources))]
        self._start = self._position = position

    # -- iteration --------------------------------------------------------------------------

    def _segments(self, start: int) -> list[tuple[int, int]]:
        """This consumer's positions from unit ``start`` on, as ranges of the epoch's positions
        (two where the padded last consumer wraps around to the start)."""
        total = self.schedule.total
        begin, remaining = (self.consumer * self.per + start) % total, self.per - start
        out = []
        while remaining > 0:
            stop = min(total, begin + remaining)
            out.append((begin, stop))
            remaining -= stop - begin
            begin = 0
        return out

    def _stream_ranges(self, segments: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        """Each source's stream ranges (in samples) that ``segments`` read."""
        ranges: list[list[tuple[int, int]]] = [[] for _ in self.sources]
        for begin, end in segments:
            lo, hi = self.schedule.units_before(begin), self.schedule.units_before(end)
            for i, units in enumerate(self.units):
                base = self._epoch * units
                if hi[i] > lo[i]:
                    ranges[i].append(((base + lo[i]) * self.unit, (base + hi[i]) * self.unit))
        return ranges

    def _budget(self) -> int:
        given = self.settings.prefetch_bytes
        if given is not None:
            return given
        local = all(s.reader.store.local for s in self.sources)
        window = self.settings.window_bytes
        ahead = 2 if local else 4
        return max(ahead * 32 << 20, ahead * window)

    def _decode_threads(self) -> int:
        """The sources' one decode pool: ``decode_threads``, else a reader's default (as many as
        one snapshot's reader would use)."""
        given = self.settings.decode_threads
        return given if given is not None else max(s.reader.decode_threads for s in self.sources)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.close()
        self._began = tracing.now()
        start, self._start = self._start, 0
        self._position = start
        self._stats = ReadStats()
        segments = self._segments(start // self.unit)
        budget, threads = self._budget(), self._decode_threads()
        # One decode pool for all sources (as many threads as one snapshot's reader): its threads
        # decode the block the mixture needs soonest, whichever source it is in.
        self._decoders = SharedDecoders(threads)
        self._prefetchers = []
        for i, ranges in enumerate(self._stream_ranges(segments)):
            source = self.sources[i]
            self._prefetchers.append(
                source.reader.prefetch(
                    source_chunks(source.reader, self.plans[i], ranges),
                    first_part=self.batch_size,
                    budget_bytes=max(_MIN_SOURCE_PREFETCH, int(budget * source.share)),
                    max_requests=self.settings.max_requests,
                    decode_threads=threads,
                    decoders=self._decoders,
                )
            )
        prefetchers = self._prefetchers
        self._streams = [iter(p) for p in prefetchers]
        self._handoff = Handoff(
            self._assemble(segments),
            depth=_READY_BATCHES,
            name="snapstore-mix-assemble",
            wake=functools.partial(_close_all, prefetchers),
        )
        return self._batches(self._handoff)

    def _rows(self, i: int, pieces: collections.deque[list[Any]], need: int) -> int:
        """Pull chunks of source ``i`` until ``pieces`` hold ``need`` rows; the rows held."""
        have: int = sum(int(p[2] - p[1]) for p in pieces)
        reader, flat = self.sources[i].reader, self.schema
        for idx, decoded in self._streams[i]:
            with tracing.span("assemble", "read") as recorded:
                if recorded is not None:
                    recorded.args.update(source=i, samples=len(idx))
                blocks, rows = reader.locate(idx)
                unique, which = np.unique(blocks, return_inverse=True)
                chunk = chunk_rows(flat, [decoded[int(b)] for b in unique], which, rows)
            pieces.append([chunk, 0, len(idx)])
            have += len(idx)
            if have >= need:
                return have
        raise RuntimeError(f"mixture source {i} ended {need - have} rows early")

    def _spans(self, segments: list[tuple[int, int]]) -> Iterator[np.ndarray[Any, Any]]:
        """The source of each sample this pass reads, at most ``SPAN_ROWS`` at a time (a frame
        of the schedule, or part of one)."""
        for begin, end in segments:
            for source, _ in self.schedule.segments(begin, end):
                order = np.repeat(source, self.unit) if self.unit > 1 else source
                for lo in range(0, len(order), SPAN_ROWS):
                    yield order[lo : lo + SPAN_ROWS]

    def _assemble(self, segments: list[tuple[int, int]]) -> Iterator[tuple[dict[str, Any], int]]:
        """The pass's batches, made on the assembler thread.

        A span of positions at a time, each source's rows are cut as one run and
        :func:`~snapstore.read.assemble.interleave` puts them in schedule order by their
        indices (no row copied); batches are then cut off the ordered spans as
        :class:`~snapstore.BatchReader` cuts them off its chunks, each row copied once, straight
        to its place. A span's index work is spread over its batches.
        """
        pending: list[collections.deque[list[Any]]] = [collections.deque() for _ in self.sources]
        held = [0] * len(self.sources)
        ordered: collections.deque[list[Any]] = collections.deque()  # [rows, start, stop]
        sources = np.zeros(0, np.int64)  # the source of each row in ``ordered``
        size, number = self.batch_size, 0
        builder = BatchBuilder(self.schema, self.settings.ragged, self.allocate)
        spans = self._spans(segments)
        while True:
            which = next(spans, None)
            if which is not None:
                counts = np.bincount(which, minlength=len(self.sources))
                used = np.flatnonzero(counts).tolist()
                for i in used:
                    if held[i] < counts[i]:  # pulling a source's chunks waits for its blocks
                        held[i] = self._rows(i, pending[i], int(counts[i]))
                parts = []
                for i in used:
                    parts.extend(cut_rows(pending[i], int(counts[i])))
                    held[i] -= int(counts[i])
                if len(used) > 1:
                    grouped = np.argsort(which, kind="stable")  # each grouped row's position
                    order = np.argsort(grouped)  # the grouped row of each position
                    ordered.append([interleave(parts, order), 0, len(which)])
                else:
                    ordered.extend([list(part) for part in parts])
                sources = np.concatenate((sources, which))
            last = which is None and len(sources) and not self.settings.drop_last
            while len(sources) >= size or last:
                take = min(size, len(sources))
                with tracing.span("assemble", "read") as recorded:
                    if recorded is not None:
                        recorded.args.update(batch=number, samples=take)
                    batch = builder.build(cut_rows(ordered, take))
                    if self.source_field is not None:
                        batch[self.source_field] = sources[:take].copy()
                sources = sources[take:]
                number += 1
                last = False
                yield batch, take
            if which is None:
                return

    def _batches(self, handoff: Handoff[tuple[dict[str, Any], int]]) -> Iterator[dict[str, Any]]:
        try:
            for batch, size in handoff:
                for source in self.sources:
                    source.reader.check_kept()
                self._position += size
                self._stats.samples += size
                self._stats.batches += 1
                yield batch
                del batch
        finally:
            if self._handoff is handoff:
                self._end_pass()
            else:
                handoff.close()

    def stats(self) -> ReadStats:
        """The current (or last) pass: samples and batches delivered; the sources' blocks,
        requests, bytes, retries, stalls, concurrency and limits summed; the mean latency over
        all requests, the p95 the worst source's; startup and wall the longest source's."""
        stats = dataclasses.replace(self._stats)
        parts = [p.snapshot_stats() for p in self._prefetchers]
        if not parts:
            return stats
        summed = ("blocks", "requests", "bytes", "retries", "stall", "concurrency")
        for name in (*summed, "max_in_flight", "limit"):
            setattr(stats, name, sum(getattr(p, name) for p in parts))
        stats.startup = max(p.startup for p in parts)
        stats.wall = max(p.wall for p in parts)
        timed = [p for p in parts if p.requests and not math.isnan(p.latency_mean)]
        if timed:
            total = sum(p.requests for p in timed)
            stats.latency_mean = sum(p.latency_mean * p.requests for p in timed) / total
            stats.latency_p95 = max(p.latency_p95 for p in timed)
        return stats

    def _end_pass(self) -> None:
        handoff, self._handoff = self._handoff, None
        if handoff is not None:
            handoff.close()
        for prefetcher in self._prefetchers:
            prefetcher.close()
        if self._decoders is not None:
            self._decoders.shutdown()
            self._decoders = None
        self._stats = self.stats()
        if self._prefetchers:
            traced_pass(self._began, self.get_state(), self._stats)
        self._prefetchers = []

    def close(self) -> None:
        """Stop the current pass's threads (iterating again starts a new pass)."""
        if self._handoff is not None or self._prefetchers:
            self._end_pass()

    def __enter__(self) -> MixedBatchReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_all(prefetchers: list[Prefetcher]) -> None:
    for prefetcher in prefetchers:
        prefetcher.close()
