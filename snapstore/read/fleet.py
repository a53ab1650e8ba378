"""Many readers on one bucket, simulated in virtual time: a fleet's cold start and first minute.

A job of 1,024 hosts with 8 readers each starts 8,192 readers at once against one bucket. This
module plays that in one process, as a discrete-event simulation (a heap of timed events; no
threads, no sleeping), fast enough to run 8,192 readers' first minute in well under a minute.

The readers are cheap actors that run the real reader's request logic, not a model of it:

- their order is :class:`snapstore.format.plan.EpochPlan`'s (consumer ``host * per_host +
  worker`` of all of them);
- their requests are formed by :func:`snapstore.read.requests.form_requests` (the
  Prefetcher's coalescing, grown as :class:`~snapstore.read.requests.Concurrency` says once the
  store throttles) and admitted by :func:`~snapstore.read.requests.admits` against the byte
  budget and the adaptive limit, as the threaded :class:`~snapstore.read.prefetch.Prefetcher`
  does;
- their starts wait :func:`snapstore.read.crowd.start_delay`, their caps are
  :func:`snapstore.read.crowd.host_requests`.

The bucket is :class:`snapstore.storage.bucket.TokenBucket`: a request it refuses is answered 429
after one latency and retried, as the store layer retries, after a jittered backoff (at least
``Retry-After`` with the adaptations off, as gcsfs waits). An admitted request's bytes then cross
the host's link (one per host, first come first served) after the time to first byte. Metadata
(commit record, then manifest and index) is fetched per reader, or once per host when shared.
Decoding is not modelled: a reader consumes a chunk at ``consume_rate`` decoded bytes per second
once all its blocks are in.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..format import layout as fmt
from ..format.plan import EpochPlan, PlanOptions
from ..storage.bucket import BucketLimits, TokenBucket
from . import crowd
from .requests import (
    Concurrency,
    RangeRequest,
    RequestShape,
    admits,
    form_requests,
    reform_requests,
)

__all__ = ["FleetOptions", "FleetResult", "simulate_fleet", "synthetic_index"]

# Requests opening a snapshot: the commit record, then the manifest and the index together.
_METADATA = 3
# A reader's own cap before the crowd rules (what SnapshotReader.prefetch used alone).
_READER_CAP = 128


@dataclass(frozen=True)
class FleetOptions:
    """One simulated run: the fleet, the snapshot, the bucket and which adaptations are on.

    Parameters
    ----------
    hosts, per_host : int
        Hosts and readers per host (consumers: their product).
    limits : BucketLimits
        The bucket.
    plan : PlanOptions
        Shuffle and window of the readers' epoch order.
    batch_size : int
        Samples of a first batch (its blocks are what the first batch waits for).
    duration : float
        Simulated seconds.
    consume_rate : float
        Decoded bytes per second one reader consumes once a chunk is in.
    budget_bytes : int
        Each reader's read-ahead budget (64 MiB: ``SnapshotReader.prefetch``'s default).
    max_request_bytes : int
        Coalescing bound before any growth (8 MiB, as the reader).
    share_metadata, jitter, grow, aimd : bool
        The adaptations: one metadata fetch per host; starts and read-ahead spread by rank;
        requests grown (from the start in a crowd, and on 429/503); the limit starting at one
        request in a crowd and cut on 429/503 (with the per-host request budget).
    seed : int
        Seeds the 503s and the retry jitter: a run is a function of its options.
    """

    hosts: int = 1
    per_host: int = 1
    limits: BucketLimits = field(default_factory=BucketLimits)
    plan: PlanOptions = field(default_factory=PlanOptions)
    batch_size: int = 256
    duration: float = 60.0
    consume_rate: float = 400e6
    budget_bytes: int = 64 << 20
    max_request_bytes: int = 8 << 20
    share_metadata: bool = True
    jitter: bool = True
    grow: bool = True
    aimd: bool = True
    seed: int = 0


@dataclass
class FleetResult:
    """What a run measured (times in simulated seconds).

    Attributes
    ----------
    first_batch : numpy.ndarray
        Per reader, when its first batch's blocks were all in (NaN: never).
    metadata_per_host : float
        Metadata requests (429s included) per host before its readers' first batches.
    requests, throttled, errors : int
        Requests sent, answered 429, answered 503.
    bytes_read : int
        Bytes received.
    steady : float
        Bytes per second received over the second half of the run.
    allowed : float
        Bytes per second the rate limit allows over that half: mean bytes per request x rate
        (``inf`` when unlimited).
    """

    first_batch: np.ndarray[Any, Any]
    metadata_per_host: float
    requests: int
    throttled: int
    errors: int
    bytes_read: int
    steady: float
    allowed: float

    @property
    def throttled_share(self) -> float:
        """429 answers as a share of requests."""
        return self.throttled / self.requests if self.requests else 0.0


def synthetic_index(
    blocks: int, block_bytes: int = 256 << 10, rows: int = 64, per_shard: int = 1024
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[str]]:
    """A block index of equal blocks packed into shards (no bytes behind it): ``(index,
    offsets, paths)`` for :func:`simulate_fleet`."""
    index = np.zeros(blocks, dtype=fmt.INDEX_DTYPE)
    number = np.arange(blocks, dtype=np.int64)
    index["shard"] = number // per_shard
    index["offset"] = (number % per_shard) * block_bytes
    index["length"] = block_bytes
    index["raw_length"] = block_bytes
    index["rows"] = rows
    offsets = np.arange(blocks + 1, dtype=np.int64) * rows
    paths = [f"shard-{s:05d}" for s in range(-(-blocks // per_shard))]
    return index, offsets, paths


class _Loop:
    """The event heap: ``at(time, fn)`` runs ``fn()`` at virtual ``time``, in time order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, time: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (time, next(self._seq), fn))

    def run(self, until: float) -> None:
        while self._heap and self._heap[0][0] <= until:
            self.now, _, fn = heapq.heappop(self._heap)
            fn()
        self.now = until


class _Bucket:
    """The bucket and the hosts' links: answers a request after latency and transfer."""

    def __init__(self, loop: _Loop, options: FleetOptions) -> None:
        self.loop, self.limits = loop, options.limits
        self.tokens = TokenBucket(options.limits)
        self.link_free = [0.0] * options.hosts
        self.random = random.Random(options.seed)
        self.requests = self.throttled = self.errors = self.bytes = 0
        self.received: list[tuple[float, int]] = []  # (time, bytes) of each answer

    def send(self, host: int, nbytes: int, done: Callable[[int], None]) -> None:
        """Answer with ``done(status)`` (200, 429 or 503) once the bytes are in."""
        now, latency = self.loop.now, self.limits.latency
        self.requests += 1
        if not self.tokens.take(now):
            self.throttled += 1
            self.loop.at(now + latency, lambda: done(429))
            return
        if self.limits.errors and self.random.random() < self.limits.errors:
            self.errors += 1
            self.loop.at(now + latency, lambda: done(503))
            return
        begin = max(now + latency, self.link_free[host])
        end = begin + nbytes / self.limits.host_bandwidth
        self.link_free[host] = end
        self.bytes += nbytes
        self.received.append((end, nbytes))
        self.loop.at(end, lambda: done(200))


class _Reader:
    """One simulated reader: the Prefetcher's scheduler, admission and consumer, as events."""

    def __init__(self, fleet: _Fleet, host: int, consumer: int, plan: EpochPlan) -> None:
        self.fleet, self.host, self.consumer = fleet, host, consumer
        options = fleet.options
        cap = crowd.host_requests(options.per_host, _READER_CAP) if options.aimd else _READER_CAP
        consumers = options.hosts * options.per_host
        initial, level = crowd.crowd_start(consumers, cap)
        self.concurrency = Concurrency(
            cap,
            initial if options.aimd else cap,
            level=level if options.grow else 0,
            crowd=options.aimd and level > 0,
        )
        self.hold = crowd.read_ahead_delay(consumer, consumers) if options.jitter else 0.0
        self.held_pump = False
        self.formed_level = self.concurrency.level
        self.shape = RequestShape(options.max_request_bytes)
        self.chunks: Iterator[np.ndarray[Any, Any]] = itertools.chain.from_iterable(
            _epoch(plan, e).chunks() for e in itertools.count()
        )
        self.pending: list[RangeRequest] = []
        self.scheduled = 0  # chunks whose requests were formed
        self.missing: dict[int, int] = {}  # chunk -> blocks not yet in
        self.chunk_cost: dict[int, int] = {}
        self.chunk_requests: dict[int, int] = {}
        self.first_blocks: set[int] = set()
        self.waiting = 0
        self.in_flight = self.held = 0
        self.consuming = False
        self.waited = False
        self.first_batch = math.nan

    # -- scheduler -----------------------------------------------------------------------
    def start(self) -> None:
        self.pump()

    def _next_chunk(self) -> bool:
        indices = next(self.chunks, None)
        if indices is None:
            return False
        fleet, number = self.fleet, self.scheduled
        blocks = fleet.blocks_of(indices)
        if number == 0:
            head = indices[: self.fleet.options.batch_size]
            self.first_blocks = set(
                (np.searchsorted(fleet.offsets, head, side="right") - 1).tolist()
            )
        level = self.concurrency.level if fleet.options.grow else 0
        self.formed_level = level
        requests = list(
            form_requests(blocks, number, fleet.index, fleet.paths, self.shape.grown(level))
        )
        self.pending.extend(requests)
        self.missing[number] = len(blocks)
        self.chunk_cost[number] = sum(r.cost for r in requests)
        self.chunk_requests[number] = len(requests)
        self.scheduled += 1
        return True

    def pump(self) -> None:
        """Send what the admission rule lets out, forming the next chunk's requests as needed."""
        while True:
            if self.scheduled >= 1 and self._holding():
                return
            if not self.pending and not self._next_chunk():
                return
            self._regrow()
            request = self.pending[0]
            if not admits(
                request,
                waiting_chunk=self.waiting,
                in_flight=self.in_flight,
                held=self.held,
                concurrency=self.concurrency,
                budget_bytes=self.fleet.options.budget_bytes,
            ):
                return
            self.pending.pop(0)
            self.in_flight += 1
            self.held += request.cost
            self._send(request, 1)

    def _holding(self) -> bool:
        """Read-ahead waits for the crowd's first chunks (the Prefetcher's hold before its
        second chunk); True while it does, with a pump set for when it ends."""
        now = self.fleet.loop.now
        if now >= self.hold or (self.pending and self.pending[0].chunk == 0):
            return False
        if not self.held_pump:
            self.held_pump = True

            def resume() -> None:
                self.held_pump = False
                self.pump()

            self.fleet.loop.at(self.hold, resume)
        return True

    def _regrow(self) -> None:
        """Requests not yet sent, formed again once the level grew (as the Prefetcher forms
        the rest of a chunk again)."""
        level = self.concurrency.level if self.fleet.options.grow else 0
        if level == self.formed_level:
            return
        self.formed_level = level
        fleet = self.fleet
        regrown = reform_requests(self.pending, fleet.index, fleet.paths, self.shape.grown(level))
        for r in self.pending:
            self.chunk_requests[r.chunk] -= 1
        for r in regrown:
            self.chunk_requests[r.chunk] += 1
        self.pending = regrown

    def _send(self, request: RangeRequest, attempt: int) -> None:
        sent = self.fleet.loop.now
        self.fleet.bucket.send(
            self.host, request.length, lambda s: self._answer(request, attempt, s, sent)
        )

    def _answer(self, request: RangeRequest, attempt: int, status: int, sent: float) -> None:
        fleet = self.fleet
        if status != 200:  # the store layer retries after a jittered backoff
            if fleet.options.aimd:
                self.concurrency.on_throttled()
            # Retry-After, then a jittered backoff (gcsfs sleeps 1-2 s before its first retry).
            backoff = fleet.random.uniform(0.0, min(2.0, 0.05 * 2.0 ** (attempt - 1)))
            wait = fleet.options.limits.retry_after + backoff
            fleet.loop.at(fleet.loop.now + wait, lambda: self._send(request, attempt + 1))
            return
        self.in_flight -= 1
        if fleet.options.aimd:
            self.concurrency.on_success()
        self.concurrency.record_latency(fleet.loop.now - sent, request.length)
        chunk = request.chunk
        self.missing[chunk] -= len(request.blocks)
        if chunk == 0 and self.first_blocks:
            self.first_blocks.difference_update(b for b, _, _ in request.blocks)
            if not self.first_blocks:
                self.first_batch = fleet.loop.now
        if chunk == self.waiting and not self.missing[chunk] and not self.consuming:
            self._consume()
        self.pump()

    # -- consumer ------------------------------------------------------------------------
    def _consume(self) -> None:
        fleet, chunk = self.fleet, self.waiting
        self.consuming = True
        seconds = self.chunk_cost[chunk] / fleet.options.consume_rate
        fleet.loop.at(fleet.loop.now + seconds, self._consumed)

    def _consumed(self) -> None:
        fleet, chunk = self.fleet, self.waiting
        self.consuming = False
        self.held -= self.chunk_cost.pop(chunk)
        self.concurrency.record_consumed(self.chunk_requests.pop(chunk), fleet.loop.now)
        if not self.waited:
            self.concurrency.on_idle()
        self.waited = False
        del self.missing[chunk]
        self.waiting += 1
        if self.waiting in self.missing and not self.missing[self.waiting]:
            self._consume()
        else:
            self.waited = True  # the consumer waits for the next chunk
            limited = self.in_flight >= self.concurrency.limit
            if self.waiting > 1:
                self.concurrency.on_stall(limited)
        self.pump()


def _epoch(plan: EpochPlan, epoch: int) -> EpochPlan:
    """``plan`` for epoch ``epoch``: a run reads on past the end of an epoch."""
    return plan if epoch == plan.epoch else plan.for_epoch(epoch)


class _Fleet:
    def __init__(self, options: FleetOptions, index: Any, offsets: Any, paths: list[str]) -> None:
        self.options, self.index, self.offsets, self.paths = options, index, offsets, paths
        self.loop = _Loop()
        self.bucket = _Bucket(self.loop, options)
        self.random = random.Random(options.seed + 1)
        self.metadata = [0] * options.hosts
        consumers = options.hosts * options.per_host
        first = EpochPlan(
            None, offsets=offsets, epoch=0, rank=0, world_size=consumers, options=options.plan
        )
        self.readers = [
            _Reader(self, c // options.per_host, c, first.for_rank(c)) for c in range(consumers)
        ]

    def blocks_of(self, indices: np.ndarray[Any, Any]) -> list[int]:
        """The blocks holding ``indices``, ascending (what the Prefetcher computes with
        ``np.unique`` of their blocks). A run of consecutive indices (a chunk read in written
        order) holds the blocks from its first's to its last's, less those without rows: found
        without a search per sample."""
        offsets = self.offsets
        first, last = int(indices[0]), int(indices[-1])
        if last - first + 1 == indices.size and (
            indices.size < 3 or bool((np.diff(indices) == 1).all())
        ):
            lo, hi = np.searchsorted(offsets, [first, last], side="right") - 1
            ids = np.arange(lo, hi + 1)
            kept: list[int] = ids[offsets[ids + 1] > offsets[ids]].tolist()
            return kept
        found: list[int] = np.unique(np.searchsorted(offsets, indices, side="right") - 1).tolist()
        return found

    def open(self) -> None:
        """Every reader opens the snapshot at time 0: metadata, then its first requests."""
        options = self.options
        consumers = len(self.readers)
        if options.share_metadata:
            for host in range(options.hosts):
                group = self.readers[host * options.per_host : (host + 1) * options.per_host]
                self._metadata(host, functools.partial(self._begin, group, consumers))
        else:
            for r in self.readers:
                self._metadata(r.host, functools.partial(self._begin, [r], consumers))

    def _metadata(self, host: int, then: Callable[[], None]) -> None:
        """The commit record, then the manifest and index in parallel; then ``then()``."""
        left = [2]

        def second(status: int) -> None:
            if self._retry_metadata(host, status, second):
                return
            left[0] -= 1
            if not left[0]:
                then()

        def first(status: int) -> None:
            if self._retry_metadata(host, status, first):
                return
            for _ in range(2):
                self._meta_request(host, second)

        self._meta_request(host, first)

    def _meta_request(self, host: int, done: Callable[[int], None]) -> None:
        self.metadata[host] += 1
        self.bucket.send(host, 4096, done)

    def _retry_metadata(self, host: int, status: int, done: Callable[[int], None]) -> bool:
        if status == 200:
            return False
        wait = self.random.uniform(0.0, 0.1) + self.options.limits.retry_after
        self.loop.at(self.loop.now + wait, lambda: self._meta_request(host, done))
        return True

    def _begin(self, readers: list[_Reader], consumers: int) -> None:
        for reader in readers:
            delay = crowd.start_delay(reader.consumer, consumers) if self.options.jitter else 0.0
            self.loop.at(self.loop.now + delay, reader.start)


def simulate_fleet(
    options: FleetOptions,
    index: np.ndarray[Any, Any] | None = None,
    offsets: np.ndarray[Any, Any] | None = None,
    paths: list[str] | None = None,
) -> FleetResult:
    """Run ``options``'s fleet over a snapshot's block index (default: a synthetic one of
    1M blocks of 256 KiB) for ``options.duration`` simulated seconds.

    Deterministic: the same options and index give the same result.
    """
    if index is None or offsets is None or paths is None:
        index, offsets, paths = synthetic_index(1 << 20)
    fleet = _Fleet(options, index, offsets, paths)
    fleet.open()
    fleet.loop.run(options.duration)
    firsts = np.array([r.first_batch for r in fleet.readers], dtype=np.float64)
    half = options.duration / 2
    late = [n for t, n in fleet.bucket.received if half <= t <= options.duration]
    steady = sum(late) / half
    allowed = math.inf
    if options.limits.rate is not None and late:
        allowed = float(np.mean(late)) * fleet.bucket.tokens.allowed(half, options.duration) / half
    bucket = fleet.bucket
    return FleetResult(
        first_batch=firsts,
        metadata_per_host=sum(fleet.metadata) / options.hosts,
        requests=bucket.requests,
        throttled=bucket.throttled,
        errors=bucket.errors,
        bytes_read=bucket.bytes,
        steady=steady,
        allowed=allowed,
    )
