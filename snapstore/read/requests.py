"""Requests as a pure function: how blocks become byte-range requests, when one may start, and
how many may be in flight.

The threaded :class:`snapstore.read.prefetch.Prefetcher` and the fleet simulator
(:mod:`snapstore.read.fleet`) both run these, so the simulated readers cannot drift from the real
one: :func:`form_requests` coalesces a chunk's blocks (:class:`RequestShape`), :func:`admits`
decides whether a request may start against the byte budget and :class:`Concurrency`'s limit,
and :class:`Concurrency` adapts that limit (Little's law; AIMD once the store throttles).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..format.layout import BLOCK_ALIGNMENT

__all__ = [
    "MAX_GROWN_BYTES",
    "MAX_LEVEL",
    "Concurrency",
    "RangeRequest",
    "RequestShape",
    "admits",
    "form_requests",
    "reform_requests",
]

# Blocks this close are read in one request: the zero padding that aligns blocks, no more (a
# larger gap would be another window's block, fetched and then thrown away).
_MAX_GAP = BLOCK_ALIGNMENT
# Blocks of one shard a local request holds (see RequestShape.joins).
_LOCAL_BLOCKS = 8


class Concurrency:
    """How many requests to keep in flight, from what was measured (pure, not thread-safe).

    Without throttling the limit follows Little's law (see the module's docstring). Once the
    store throttles (:meth:`on_throttled`: HTTP 429 or 503) it is run as TCP runs its window:
    halved at a throttle, at most once per window (``limit`` answers since the last halving:
    the other requests in flight then were sent at the old rate, and their throttles say the
    same thing again), one more per ``limit`` successes (:meth:`on_success`), never above the
    estimate's doubling on a stall; and each halving doubles the request size (:attr:`level`,
    at most :data:`MAX_LEVEL`), so reading the same bytes costs fewer requests.

    Parameters
    ----------
    maximum : int
        Upper bound on the limit.
    initial : int
        Starting limit (clamped to ``[1, maximum]``).
    headroom : float
        Multiplier on the Little's-law estimate, to absorb latency variance.
    level : int
        Starting :attr:`level` (a reader in a crowd starts with grown requests).
    crowd : bool
        A reader among many on one bucket: a stall does not raise the limit while requests
        take over twice as long per byte as the fastest did (:meth:`queueing`): more of them
        would only wait in the same queue (the host's link, the bucket) and spend the bucket's
        request budget.
    """

    def __init__(
        self,
        maximum: int,
        initial: int = 8,
        headroom: float = 2.0,
        level: int = 0,
        crowd: bool = False,
    ) -> None:
        if maximum < 1:
            raise ValueError(f"Concurrency: expected maximum >= 1, found {maximum}")
        self.maximum = maximum
        self.limit = max(1, min(initial, maximum))
        self.headroom = headroom
        self._latency = math.nan  # EWMA of request seconds
        self._rate = math.nan  # EWMA of requests consumed per second
        self._last_consumed: float | None = None
        self.throttles = 0  # 429/503 answers seen
        self.level = min(MAX_LEVEL, max(0, level))  # requests 2**level larger (RequestShape.grown)
        self._successes = 0
        self._since_decrease: int | None = None  # answers since the last halving
        self.crowd = crowd
        self._per_byte = math.nan  # EWMA of request seconds per byte
        self._per_byte_best = math.inf  # the fastest request, seconds per byte

    def record_latency(self, seconds: float, nbytes: int = 0) -> None:
        """A request of ``nbytes`` bytes (0: not known) took ``seconds`` end to end."""
        a = 0.2
        self._latency = (
            seconds if math.isnan(self._latency) else (1 - a) * self._latency + a * seconds
        )
        if nbytes > 0 and seconds > 0:
            per = seconds / nbytes
            self._per_byte_best = min(self._per_byte_best, per)
            self._per_byte = (
                per if math.isnan(self._per_byte) else (1 - a) * self._per_byte + a * per
            )

    def queueing(self) -> bool:
        """Requests take over twice as long per byte as the fastest one did: they queue."""
        return self._per_byte > 2 * self._per_byte_best

    def record_consumed(self, requests: float, now: float) -> None:
        """The consumer finished with data worth ``requests`` requests at time ``now``."""
        if self._last_consumed is not None and now > self._last_consumed:
            rate = requests / (now - self._last_consumed)
            a = 0.3
            self._rate = rate if math.isnan(self._rate) else (1 - a) * self._rate + a * rate
        self._last_consumed = now

    def target(self) -> int:
        """Little's law with headroom: requests needed in flight to keep up (1 if unknown)."""
        if math.isnan(self._rate) or math.isnan(self._latency):
            return self.limit
        return max(1, min(self.maximum, math.ceil(self._rate * self._latency * self.headroom)))

    def on_stall(self, limited: bool) -> None:
        """The consumer waited; ``limited`` says the limit (not the budget) held requests back:
        double the limit (at least to the estimate), unless a crowd's requests queue."""
        if limited and not (self.crowd and self.queueing()):
            self.limit = min(self.maximum, max(self.limit * 2, self.target()))

    def on_idle(self) -> None:
        """A chunk was consumed without waiting: drift down towards the estimate."""
        target = self.target()
        if target < self.limit:
            self.limit = max(target, self.limit - max(1, self.limit // 8))
        elif target > self.limit and not self.throttles:
            self.limit = target

    def on_throttled(self) -> None:
        """The store answered 429 or 503: halve the limit (multiplicative decrease) and grow
        the requests (:attr:`level`), so the same bytes cost fewer requests; a throttle within
        ``limit`` answers of the last halving is only counted."""
        self.throttles += 1
        since = self._since_decrease
        if since is not None and since < self.limit:
            self._since_decrease = since + 1
            return
        self._since_decrease = 0
        self._successes = 0
        self.limit = max(1, self.limit // 2)
        self.level = min(MAX_LEVEL, self.level + 1)

    def on_success(self) -> None:
        """A request succeeded: after a throttle, one more request in flight per ``limit``
        successes (additive increase), up to ``maximum``; the request size stays grown."""
        if not self.throttles:
            return
        if self._since_decrease is not None:
            self._since_decrease += 1
        self._successes += 1
        if self._successes >= self.limit:
            self._successes = 0
            self.limit = min(self.maximum, self.limit + 1)


@dataclass
class RangeRequest:
    """One byte range of one shard, covering whole blocks (see :func:`form_requests`)."""

    path: str
    start: int
    length: int
    blocks: list[tuple[int, int, int]]  # (block, offset inside the range, length)
    costs: list[int]  # decoded bytes of each block, charged against the budget
    chunk: int  # the first chunk that needs it

    @property
    def cost(self) -> int:
        """Decoded bytes of its blocks: what it holds of the budget until consumed."""
        return sum(self.costs)


# Requests grow at most this large when the store throttles (1 Gb/s moves it in 0.5 s).
MAX_GROWN_BYTES = 64 << 20
# Throttle levels: each doubles the request size (8 MiB -> 64 MiB) and the gap read over.
MAX_LEVEL = 3
# The gap a grown request reads over at level 1 (doubling with each level): a few blocks of
# 256 KiB, bytes fetched and thrown away to save a request when requests, not bytes, are short.
_GROWN_GAP = 1 << 20


@dataclass(frozen=True)
class RequestShape:
    """How blocks are coalesced into requests: pure settings for :func:`form_requests`.

    Parameters
    ----------
    max_bytes : int
        A request spans at most this many bytes (0: one block per request).
    max_gap : int
        Blocks at most this far apart join one request (the gap is read and dropped).
    local : bool
        Requests are memory-map views: join any blocks of a shard, a few at a time.
    """

    max_bytes: int
    max_gap: int = _MAX_GAP
    local: bool = False

    def grown(self, level: int) -> RequestShape:
        """The shape at throttle ``level`` (:attr:`Concurrency.level`): ``2**level`` times the
        bytes (at most :data:`MAX_GROWN_BYTES`) and a gap of ``2**(level-1)`` MiB."""
        if level <= 0 or self.local or self.max_bytes <= 0:
            return self
        grown = min(MAX_GROWN_BYTES, max(self.max_bytes, self.max_bytes << level))
        return RequestShape(grown, max(self.max_gap, _GROWN_GAP << (level - 1)), self.local)

    def joins(self, current: RangeRequest, offset: int, length: int) -> bool:
        """Whether the block at ``offset`` of ``current``'s shard goes in the same request:
        remotely when it is close and the request stays small enough; locally (a request is
        a view of a memory map, whatever it spans) a few blocks at a time, so that each decode
        task, lock and wake-up is paid per few blocks rather than per block."""
        gap = offset - (current.start + current.length)
        if self.local:
            return gap >= 0 and len(current.blocks) < _LOCAL_BLOCKS
        return 0 <= gap < self.max_gap and offset + length - current.start <= self.max_bytes


def form_requests(
    blocks: list[int],
    chunk: int,
    index: np.ndarray[Any, Any],
    paths: list[str],
    shape: RequestShape,
) -> Iterator[RangeRequest]:
    """Group ``blocks`` into byte-range requests: per shard, by offset, close ones merged.

    A pure function of the block index: the :class:`Prefetcher` and the fleet simulator
    (:mod:`snapstore.read.fleet`) both form their requests with it. Blocks in (shard, offset)
    order join the request before them as :meth:`RequestShape.joins` says; the grouping is
    computed on arrays (:func:`_request_starts`), so its Python work is per request, not per
    block.
    """
    if not blocks:
        return
    entries = index[blocks]
    shard = entries["shard"].astype(np.int64)
    offset = entries["offset"].astype(np.int64)
    order = np.lexsort((offset, shard))
    shard, offset = shard[order], offset[order]
    length = entries["length"].astype(np.int64)[order]
    starts = _request_starts(shard, offset, length, paths, shape)
    counts = np.diff(np.append(starts, shard.size))
    inside = offset - np.repeat(offset[starts], counts)  # each block's offset in its request
    ids = np.asarray(blocks, dtype=np.int64)[order].tolist()
    placed = list(zip(ids, inside.tolist(), length.tolist()))
    raw = entries["raw_length"].astype(np.int64)[order].tolist()
    ends = (offset + length).tolist()
    bounds = [*starts.tolist(), len(ids)]
    for i, j, s in zip(bounds[:-1], bounds[1:], shard[starts].tolist()):
        o = ends[i] - placed[i][2]
        yield RangeRequest(paths[s], o, ends[j - 1] - o, placed[i:j], raw[i:j], chunk)


def reform_requests(
    requests: list[RangeRequest], index: np.ndarray[Any, Any], paths: list[str], shape: RequestShape
) -> list[RangeRequest]:
    """``requests`` not yet sent, formed again in ``shape`` (grown after a throttle), chunk by
    chunk in chunk order: the same blocks in fewer, larger requests. Shared by the
    :class:`Prefetcher` (the rest of a chunk) and the fleet simulator (its pending requests)."""
    out: list[RangeRequest] = []
    for chunk in sorted({r.chunk for r in requests}):
        blocks = [b for r in requests if r.chunk == chunk for b, _, _ in r.blocks]
        out.extend(form_requests(blocks, chunk, index, paths, shape))
    return out


def _request_starts(
    shard: np.ndarray[Any, Any],
    offset: np.ndarray[Any, Any],
    length: np.ndarray[Any, Any],
    paths: list[str],
    shape: RequestShape,
) -> np.ndarray[Any, Any]:
    """Where each request starts among blocks sorted by (shard, offset): what joining them one
    by one with :meth:`RequestShape.joins` gives. A request breaks where the path changes or the
    gap to the block before leaves the shape's rule (runs); inside a run, ends only grow, so a
    remote request is cut where its span would pass ``max_bytes``, a local one every
    :data:`_LOCAL_BLOCKS` blocks."""
    n = shard.size
    end = offset + length
    gap = offset[1:] - end[:-1]
    joined = gap >= 0 if shape.local else (gap >= 0) & (gap < shape.max_gap)
    for k in np.flatnonzero(shard[1:] != shard[:-1]).tolist():
        if paths[int(shard[k])] != paths[int(shard[k + 1])]:
            joined[k] = False
    runs = np.concatenate(([0], np.flatnonzero(~joined) + 1))
    if shape.local:
        run_of = np.cumsum(np.concatenate(([False], ~joined)))
        place = np.arange(n) - runs[run_of]
        return np.flatnonzero(place % _LOCAL_BLOCKS == 0)
    if n == runs.size:  # no two blocks joined: one request each
        return runs
    starts: list[int] = []
    limits = offset + shape.max_bytes
    for lo, hi in zip(runs.tolist(), [*runs[1:].tolist(), n]):
        i = lo
        while i < hi:
            starts.append(i)
            i = max(i + 1, int(np.searchsorted(end[i:hi], limits[i], side="right")) + i)
    return np.asarray(starts, dtype=np.int64)


def admits(
    request: RangeRequest,
    *,
    waiting_chunk: int,
    in_flight: int,
    held: int,
    concurrency: Concurrency,
    budget_bytes: int,
) -> bool:
    """Whether ``request`` may start now: the chunk the consumer waits for goes out at once,
    up to the maximum number of requests and whatever the budget; the limit and the budget
    pace reading ahead (a pure rule shared by the :class:`Prefetcher` and the simulator)."""
    if request.chunk <= waiting_chunk:
        return in_flight < concurrency.maximum
    fits = held == 0 or held + request.cost <= budget_bytes
    return fits and in_flight < concurrency.limit
