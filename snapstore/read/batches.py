"""Batches of one consumer's share of an epoch, resumable from a small dict of integers.

:class:`BatchReader` ties the pieces together: the pure :class:`~snapstore.format.plan.EpochPlan`
says which samples, in which order; the :class:`~snapstore.read.prefetch.Prefetcher` fetches and
decodes their blocks ahead of use; an assembler thread locates each chunk's rows (a shuffle
window, or part of one) once and copies each batch from the decoded blocks straight into arrays
allocated for it (:mod:`snapstore.read.assemble`, numpy copies that release the GIL), handing
finished batches to the consumer through a bounded queue (:mod:`snapstore.format.handoff`).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import operator
from collections.abc import Iterator
from typing import Any, Unpack

import numpy as np

from .. import tracing
from ..errors import ResumeError
from ..format.handoff import Handoff
from ..format.plan import ORDER_VERSION, EpochPlan, PlanOptions, check_order_version
from ..format.ragged import FORMS, check_form
from ..oldpaths import historic_name
from .assemble import Allocate, BatchBuilder, chunk_rows, cut_rows
from .options import ReaderOptions, ReaderSettings, reader_options
from .prefetch import Prefetcher, ReadStats
from .reader import SnapshotReader

__all__ = ["BatchReader"]

log = logging.getLogger(historic_name(__name__))

STATE_VERSION = 1
# What a state must agree on with the reader it is restored into, besides the snapshot. The
# partition is compared as (consumer, consumers): 2 ranks of 2 workers read what 4 ranks of 1 do.
_ORDER_KEYS = ("epoch", "seed", "shuffle", "window_blocks", "drop_last", "order_version")
RAGGED_FORMS = FORMS
# Finished batches the assembler thread may hold ahead of the consumer: one being taken while
# the next waits covers the consumer's jitter; more would only add memory.
_READY_BATCHES = 2
# Read-ahead of a reader whose order is a PlanOptions (the form before ReaderOptions): the
# default it had then, kept so that such a reader reads as it did.
_FORMER_PREFETCH_BYTES = 64 << 20
# The ReaderOptions fields that fix the order: a PlanOptions gives them all.
_ORDER_SETTINGS = ("shuffle", "seed", "drop_last", "window_bytes", "window_blocks", "order_version")


def resume_state(
    state: object, mine: dict[str, int], chosen: int | None
) -> tuple[dict[str, int], int]:
    """A resume state checked for what every reader's ``set_state`` needs first, and its order
    version: a dict (1 when saved before order versions; checked), with every key of ``mine``,
    the reader's own state. ``mine`` takes the state's version when the reader's setting
    ``chosen`` is None (the reader follows the state's order).

    Raises
    ------
    ResumeError
        If the state is not a dict, names an order version this snapstore cannot read, or
        lacks a key.
    """
    if not isinstance(state, dict):
        raise ResumeError(f"expected a state dict from get_state(), found {type(state)}")
    state = {"order_version": 1, **state}  # saved before order versions: the order then
    try:
        version = check_order_version(state["order_version"], "resume state order_version")
    except ValueError as exc:
        raise ResumeError(f"{exc}: this snapstore cannot continue that order") from exc
    if chosen is None:
        mine["order_version"] = version
    missing = sorted(set(mine) - set(state))
    if missing:
        raise ResumeError(f"resume state is missing {missing}; pass the dict get_state() returned")
    return state, version


def consumer_of(state: dict[str, Any]) -> tuple[Any, Any]:
    """(consumer, consumers) of a state: its place in the partition."""
    try:
        workers = state["num_workers"]
        return state["rank"] * workers + state["worker"], state["world_size"] * workers
    except TypeError as exc:
        raise ResumeError(f"resume state holds a non-integer partition field ({exc})") from exc


def snapshot_id(fingerprint: str) -> int:
    """A 63-bit integer naming a snapshot inside a resume state."""
    return int.from_bytes(hashlib.sha256(fingerprint.encode()).digest()[:8], "big") >> 1


class BatchReader:
    """Batches of one consumer's share of one epoch, as dicts of numpy arrays.

    Made by :meth:`snapstore.Snapshot.batches`. Every consumer yields the same number of batches
    (see :class:`snapstore.format.plan.EpochPlan` for the pad/drop rule); with ``drop_last`` the
    final short batch is dropped as well. Iterating again repeats the epoch (from the position given
    to :meth:`set_state`, if any); :meth:`set_epoch` moves to another epoch.

    Batches hold fixed-shape and numeric fields as stacked arrays; str and bytes fields as
    lists; varying-shape arrays as lists of arrays (``ragged="list"``, read-only views into the
    decoded blocks), zero-padded to the batch's largest shape with the true shapes in
    ``<name>_lengths`` (``ragged="pad"``: shape ``(batch,)`` for 1-D fields, ``(batch, ndim)``
    otherwise), or packed (``ragged="packed"``): every sample's values one after the other in
    one flat array, sample ``i`` at ``<name>_offsets[i]:<name>_offsets[i + 1]`` (int64, shape
    ``(batch + 1,)``), with ``<name>_shapes`` (int64, ``(batch, ndim)``) for fields of more
    than one dimension.

    Batches are made on a thread of their own (``snapstore-assemble``), at most two ahead of
    the consumer; every array of a batch is new (``allocate``'s), except that a batch whose
    rows are consecutive rows of one block is a read-only view of it when ``allocate`` is None.
    ``allocate(specs)`` (attribute or argument; set it before iterating) returns one new,
    writable, C-contiguous array per ``(shape, dtype)`` of a batch, for all of them at once:
    :class:`snapstore.torch.SnapshotIterableDataset` passes one that puts each batch in one
    shared-memory buffer in DataLoader workers. It is called on the assembler thread.

    Parameters
    ----------
    reader : SnapshotReader
        The snapshot, opened.
    batch_size : int
        Samples per batch.
    options : ReaderOptions or PlanOptions, optional
        How to read (:class:`snapstore.ReaderOptions`, default ``ReaderOptions()``), as for
        :meth:`snapstore.Snapshot.batches`. A :class:`snapstore.format.plan.PlanOptions` (the
        form before ReaderOptions) gives the order alone; the keywords then set only
        ``prefetch_bytes`` (default 64 MiB, as then), ``max_requests``, ``decode_threads`` and
        ``ragged``.
    epoch, rank, world_size, worker, num_workers : int
        Which epoch, and this consumer's place in the job (see ``Snapshot.batches``).
    allocate : callable, optional
        Makes the arrays of each batch (see above).
    **settings
        Any field of :class:`snapstore.ReaderOptions` as a keyword, overriding ``options``'s.

    Attributes
    ----------
    options : PlanOptions
        The order: shuffle, seed, window in blocks, drop_last and order version (what a resume
        state must match; a state of another order version is followed when
        ``settings.order_version`` is None).
    settings : ReaderOptions
        The options as given, keywords applied; a field left None is chosen when reading
        (``options.window_blocks``, :attr:`prefetch_bytes`, the reader's threads and requests).

    Raises
    ------
    TypeError, ValueError
        On a bad setting, as :class:`snapstore.ReaderOptions` raises them; TypeError also for a
        keyword that sets the order beside a PlanOptions.
    """

    def __init__(
        self,
        reader: SnapshotReader,
        batch_size: int,
        options: ReaderOptions | PlanOptions | None = None,
        *,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        allocate: Allocate | None = None,
        **settings: Unpack[ReaderSettings],
    ) -> None:
        if isinstance(batch_size, bool) or operator.index(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.options, self.settings = _order_and_settings(reader, options, dict(settings))
        check_form(reader.schema.flat(), self.settings.ragged)
        self.reader = reader
        self.batch_size = int(batch_size)
        self._place = {"rank": rank, "world_size": world_size}
        self._place |= {"worker": worker, "num_workers": num_workers}
        self.plan = self._plan(epoch)
        self._start = 0  # where the next pass starts (set_state)
        self._position = 0  # samples yielded so far in the current pass
        self._prefetcher: Prefetcher | None = None
        self._handoff: Handoff[tuple[dict[str, Any], int]] | None = None
        self.allocate = allocate
        self._stats = ReadStats()
        self._began = 0.0  # when the current pass started (tracing.now())

    @property
    def ragged(self) -> str:
        """The form of varying-shape fields (``settings.ragged``)."""
        return self.settings.ragged

    @property
    def prefetch_bytes(self) -> int:
        """Decoded bytes read ahead of the window being consumed: ``settings.prefetch_bytes``,
        by default two windows (at least 64 MiB) on a local store, four (at least 128 MiB) on
        a remote one."""
        given = self.settings.prefetch_bytes
        if given is not None:
            return given
        # Enough to read ahead across a window boundary; a remote store needs more in flight
        # (bandwidth x latency), so it gets twice as much.
        reader = self.reader
        window = int(reader.manifest["raw_bytes"]) / max(1, reader.num_blocks)
        window *= self.options.window_blocks
        ahead = 2 if reader.store.local else 4
        return max(ahead * 32 << 20, int(ahead * window))

    @property
    def max_requests(self) -> int | None:
        """Cap on requests in flight (``settings.max_requests``; None: the reader's default)."""
        return self.settings.max_requests

    @property
    def decode_threads(self) -> int | None:
        """Decode threads (``settings.decode_threads``; None: the reader's default)."""
        return self.settings.decode_threads

    def _plan(self, epoch: int) -> EpochPlan:
        offsets = self.reader.offsets  # shared with the reader: no private O(blocks) array
        return EpochPlan(None, offsets=offsets, epoch=epoch, options=self.options, **self._place)

    @property
    def epoch(self) -> int:
        """The epoch this reader yields."""
        return self.plan.epoch

    def set_epoch(self, epoch: int) -> None:
        """Yield epoch ``epoch`` from the next pass on (from its start)."""
        self.plan = self._plan(epoch)
        self._start = self._position = 0

    def __len__(self) -> int:
        full, rest = divmod(self.plan.num_samples, self.batch_size)
        return full + (1 if rest and not self.options.drop_last else 0)

    # -- resume -----------------------------------------------------------------------------

    def get_state(self) -> dict[str, int]:
        """Where this reader is: a small dict of integers, for a checkpoint.

        ``position`` counts the samples of this epoch already yielded; restoring the state with
        :meth:`set_state` in any process continues with the next one.
        """
        plan, options = self.plan, self.options
        return {
            "version": STATE_VERSION,
            "snapshot": snapshot_id(self.reader.fingerprint),
            "epoch": plan.epoch,
            "seed": int(options.seed),
            "shuffle": int(options.shuffle),
            "window_blocks": int(options.window_blocks),
            "drop_last": int(options.drop_last),
            "order_version": int(options.order_version),
            "rank": plan.rank,
            "world_size": plan.world_size,
            "worker": plan.worker,
            "num_workers": plan.num_workers,
            "position": self._position,
        }

    def set_state(self, state: dict[str, int]) -> None:
        """Continue from ``state`` (from :meth:`get_state`) on the next pass.

        The reader must read the same snapshot in the same order (epoch, seed, shuffle, window,
        drop_last) as the same consumer: the same ``rank * num_workers + worker`` out of the
        same ``world_size * num_workers``, however that total is split into ranks and workers.
        The position is taken from the state, and its order version (1 when it has none, as a
        state saved before order versions) when ``settings.order_version`` is None: the reader
        then reads that order from here on. Nothing before the position is fetched or decoded.

        Raises
        ------
        ResumeError
            If the state is malformed, from another snapshot, or for another epoch, seed,
            shuffle window or partition; the message names the differing settings.
        """
        mine = self.get_state()
        state, version = resume_state(state, mine, self.settings.order_version)
        if state["version"] != STATE_VERSION:
            raise ResumeError(
                f"resume state has version {state['version']}, this snapstore reads "
                f"version {STATE_VERSION}"
            )
        if state["snapshot"] != mine["snapshot"]:
            raise ResumeError(
                f"resume state belongs to another snapshot, not {self.reader.fingerprint}; "
                "restore it into a reader of the snapshot it was saved from"
            )
        differ = [
            f"{k}={state[k]} (reader has {mine[k]})" for k in _ORDER_KEYS if state[k] != mine[k]
        ]
        theirs, ours = consumer_of(state), consumer_of(mine)
        if theirs != ours:
            differ.append(
                f"consumer {theirs[0]} of {theirs[1]} (reader is consumer {ours[0]} of "
                f"{ours[1]}; consumer = rank * num_workers + worker, of world_size * num_workers)"
            )
        if differ:
            raise ResumeError(
                "resume state is for another order or partition: "
                + ", ".join(differ)
                + "; create the reader with the same settings (snap.batches(...)) as the one "
                "that saved it. A different number of ranks or workers can only start a new epoch."
            )
        position = state["position"]
        if not isinstance(position, int) or not 0 <= position <= self.plan.num_samples:
            raise ResumeError(
                f"resume state position must be in [0, {self.plan.num_samples}], found {position!r}"
            )
        if self._prefetcher is not None:
            raise ResumeError("set_state() while a pass is running; call it before iterating")
        if version != self.options.order_version:
            self.options = dataclasses.replace(self.options, order_version=version)
            self.plan = self._plan(self.plan.epoch)
        self._start = self._position = position

    # -- iteration --------------------------------------------------------------------------

    def stats(self) -> ReadStats:
        """Stats of the current pass, or of the last one when none is running."""
        if self._prefetcher is not None:
            stats = self._prefetcher.snapshot_stats()
            stats.samples, stats.batches = self._stats.samples, self._stats.batches
            return stats
        return self._stats

    def close(self) -> None:
        """Stop the current pass's threads, the assembler's included (iterating again starts a
        new pass)."""
        if self._prefetcher is not None:
            self._end_pass()

    def __enter__(self) -> BatchReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _end_pass(self) -> None:
        prefetcher, self._prefetcher = self._prefetcher, None
        handoff, self._handoff = self._handoff, None
        if handoff is not None:
            handoff.close()  # closes the prefetcher too, then joins the assembler thread
        if prefetcher is None:
            return
        prefetcher.close()
        samples, batches = self._stats.samples, self._stats.batches
        self._stats = prefetcher.snapshot_stats()
        self._stats.samples, self._stats.batches = samples, batches
        log.debug("epoch %d pass: %s", self.plan.epoch, self._stats)
        traced_pass(self._began, self.get_state(), self._stats)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.close()
        self._began = tracing.now()
        start = self._start
        self._start = 0
        self._position = start
        self._stats = ReadStats()
        prefetcher = self.reader.prefetch(
            self.plan.chunks(start),
            first_part=self.batch_size,
            budget_bytes=self.prefetch_bytes,
            max_requests=self.max_requests,
            decode_threads=self.decode_threads,
        )
        self._prefetcher = prefetcher
        self._handoff = Handoff(
            self._assemble(prefetcher),
            depth=_READY_BATCHES,
            name="snapstore-assemble",
            wake=prefetcher.close,
        )
        return self._batches(self._handoff)

    def _assemble(self, prefetcher: Prefetcher) -> Iterator[tuple[dict[str, Any], int]]:
        """The pass's batches and their sizes, made on the assembler thread: each chunk's rows
        are located once, and each batch is copied from the decoded blocks straight into the
        arrays allocated for it (see :mod:`snapstore.read.assemble`)."""
        pieces: collections.deque[list[Any]] = collections.deque()  # [rows, start, stop]
        buffered = 0
        schema = self.reader.schema
        builder = BatchBuilder(schema, self.ragged, self.allocate)
        made = 0
        for number, (idx, decoded) in enumerate(prefetcher):
            with tracing.span("assemble", "read") as recorded:
                if recorded is not None:
                    recorded.args.update(chunk=number, samples=len(idx))
                blocks, rows = self.reader.locate(idx)
                unique, which = np.unique(blocks, return_inverse=True)
                chunk = chunk_rows(schema, [decoded[int(b)] for b in unique], which, rows)
            del decoded  # the chunk's rows keep what they still need, no more
            pieces.append([chunk, 0, len(idx)])
            del chunk
            buffered += len(idx)
            while buffered >= self.batch_size:
                buffered -= self.batch_size
                yield build_batch(builder, pieces, self.batch_size, made)
                made += 1
        if buffered and not self.options.drop_last:
            yield build_batch(builder, pieces, buffered, made)

    def _batches(self, handoff: Handoff[tuple[dict[str, Any], int]]) -> Iterator[dict[str, Any]]:
        try:
            for batch, size in handoff:
                self.reader.check_kept()
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


def build_batch(
    builder: BatchBuilder, pieces: collections.deque[list[Any]], size: int, number: int
) -> tuple[dict[str, Any], int]:
    """Batch ``number`` of a pass from the next ``size`` rows of ``pieces``, and its size: an
    ``assemble`` span (``batch``, ``samples``)."""
    with tracing.span("assemble", "read") as recorded:
        if recorded is not None:
            recorded.args.update(batch=number, samples=size)
        return builder.build(cut_rows(pieces, size)), size


def traced_pass(began: float, place: dict[str, int], stats: ReadStats) -> None:
    """A reader's pass that began at ``began`` (:func:`snapstore.tracing.now`) and ends now,
    as a ``pass`` span (``epoch``, ``rank``, ``worker`` and their counts, ``samples``,
    ``batches``); then this process's events so far go to its part file, so that a DataLoader
    worker's are on disk when its epoch ends."""
    if not tracing.enabled():
        return
    args = {k: place[k] for k in ("epoch", "rank", "world_size", "worker", "num_workers")}
    args |= {"samples": stats.samples, "batches": stats.batches}
    tracing.complete("pass", "read", began, tracing.now(), **args)
    tracing.flush()


def _order_and_settings(
    reader: SnapshotReader, options: ReaderOptions | PlanOptions | None, settings: dict[str, Any]
) -> tuple[PlanOptions, ReaderOptions]:
    """A reader's order and its settings, from ``options`` and the keyword ``settings``."""
    if isinstance(options, PlanOptions):
        order = [name for name in _ORDER_SETTINGS if name in settings]
        if order:
            raise TypeError(
                f"{order} beside a PlanOptions, which fixes the order: pass a "
                "snapstore.ReaderOptions instead to set the order by keyword"
            )
        former = ReaderOptions(
            shuffle=bool(options.shuffle),
            seed=options.seed,
            drop_last=bool(options.drop_last),
            window_blocks=options.window_blocks,
            prefetch_bytes=_FORMER_PREFETCH_BYTES,
            order_version=options.order_version,
        )
        return options, former.replace(**settings)
    read = reader_options(options, settings)
    blocks = read.window_blocks or reader.window_blocks(read.window_bytes)
    version = ORDER_VERSION if read.order_version is None else read.order_version
    return PlanOptions(bool(read.shuffle), read.seed, blocks, read.drop_last, version), read
