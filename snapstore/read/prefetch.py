"""The prefetcher: fetch and decode the blocks an epoch plan needs next, in parallel, ahead of use.

One :class:`Prefetcher` serves one pass over a sequence of chunks (arrays of global sample
indices, from :meth:`snapstore.format.plan.EpochPlan.chunks`). Three kinds of thread share the work:

- a scheduler walks the chunks, turns the blocks each one needs into byte-range requests
  (adjacent blocks of a shard coalesced into one request, up to ``max_request_bytes``), and
  admits them while fewer than :attr:`Concurrency.limit` requests are in flight and the decoded
  bytes fetched ahead of the consumer stay inside ``budget_bytes``. The chunk the consumer is
  waiting for is admitted at once (up to the maximum number of requests, whatever the budget),
  so a cold start costs about one round trip and a window larger than the budget cannot
  deadlock;
- an I/O pool runs the requests (``fetch(path, start, length)``), retrying transient errors
  and completing short reads a bounded number of times;
- a decode pool verifies and decodes each block (checksum, decompression, Arrow), off the
  consumer's thread, earliest chunk first (requests complete in any order).

Local stores skip the I/O pool: a "read" is a slice of a memory map, so the decode pool does it
and the bytes are never copied.

The number of requests in flight adapts (:class:`Concurrency`): by Little's law a consumer that
uses ``rate`` requests per second needs ``rate * latency`` of them in flight; the limit follows
that estimate (with headroom), doubles whenever the consumer has to wait while the limit, not the
budget, held requests back, and decays when nobody waits.

Every thread stops in :meth:`Prefetcher.close`; an exception in any of them is raised to the
consumer, unchanged, when it reaches the block (or the chunk) that failed.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import tracing
from ..errors import FormatError, StoreError
from ..format.layout import BLOCK_ALIGNMENT
from ..oldpaths import historic_name
from ..storage.retry import is_throttled
from .requests import (
    Concurrency,
    RangeRequest,
    RequestShape,
    admits,
    form_requests,
    reform_requests,
)

__all__ = [
    "Concurrency",
    "PrefetchLimits",
    "Prefetcher",
    "PrefetcherClosedError",
    "ReadStats",
    "SharedDecoders",
]

log = logging.getLogger(historic_name(__name__))

Fetch = Callable[[str, int, int], Any]
Decode = Callable[[int, Any], Any]

# Errors worth trying again: the network and the store's own failures. A missing file, a denied
# permission or a corrupt block is not transient (StoreError keeps the errno it translated).
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_PERMANENT_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR}
_TRANSIENT = (OSError, StoreError, TimeoutError, ConnectionError)
# Blocks this close are read in one request: the zero padding that aligns blocks, no more (a
# larger gap would be another window's block, fetched and then thrown away).
_MAX_GAP = BLOCK_ALIGNMENT
# Blocks of one shard a local request holds (see Prefetcher._joins).
_LOCAL_BLOCKS = 8
# Request latencies kept per pass for the p95.
_SAMPLE = 4096


class PrefetcherClosedError(RuntimeError):
    """The prefetcher was closed (by another thread) while its consumer waited for blocks."""


@dataclass
class ReadStats:
    """What one pass over an epoch (or part of one) cost.

    Attributes
    ----------
    samples, batches : int
        Delivered to the consumer.
    blocks, requests, bytes : int
        Blocks decoded, range requests made (after coalescing) and stored bytes fetched.
    retries : int
        Reads repeated after a transient error or an empty read (a read that returns only part
        of a range is continued where it stopped, and not counted here).
    latency_mean, latency_p95 : float
        Seconds per request (NaN before the first one); the p95 is that of a uniform sample of
        4,096 requests once a pass has made more.
    stall : float
        Seconds the consumer waited for data after the first chunk arrived.
    startup : float
        Seconds from the start of the pass until the first chunk was ready.
    wall : float
        Seconds from the start of the pass to its end (or to now).
    concurrency : float
        Requests in flight on average over the pass (Little's law: request-seconds / wall).
    max_in_flight : int
        The most requests in flight at once.
    limit : int
        The concurrency limit when the pass ended.
    """

    samples: int = 0
    batches: int = 0
    blocks: int = 0
    requests: int = 0
    bytes: int = 0
    retries: int = 0
    latency_mean: float = math.nan
    latency_p95: float = math.nan
    stall: float = 0.0
    startup: float = 0.0
    wall: float = 0.0
    concurrency: float = 0.0
    max_in_flight: int = 0
    limit: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The stats as a plain dict (latencies are NaN when nothing was requested remotely)."""
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"{self.samples} samples, {self.bytes / 1e6:.1f} MB in {self.requests} requests "
            f"(latency mean {self.latency_mean * 1e3:.1f} ms, p95 {self.latency_p95 * 1e3:.1f} "
            f"ms), concurrency {self.concurrency:.1f} (limit {self.limit}), stall "
            f"{self.stall:.3f} s of {self.wall:.3f} s, startup {self.startup:.3f} s"
        )


@dataclass
class _Chunk:
    indices: np.ndarray[Any, Any]
    blocks: list[int]
    requests: int = 0  # requests first needed by this chunk


@dataclass(frozen=True)
class PrefetchLimits:
    """How far and how wide a :class:`Prefetcher` reads ahead: its memory, requests, threads.

    :meth:`snapstore.read.reader.SnapshotReader.prefetch` chooses them for a store (see its
    defaults); a :class:`snapstore.ReaderOptions` sets the budget, requests and threads.

    Parameters
    ----------
    budget_bytes : int
        Decoded bytes that may be fetched ahead of the chunk the consumer holds (the chunk it
        waits for is always admitted). Memory is about this plus the consumer's chunk.
    max_requests : int
        Most requests in flight at once (the limit adapts below it).
    initial_requests : int
        Requests in flight to start with, before anything is measured.
    decode_threads : int
        Threads that verify and decode.
    max_request_bytes : int
        Coalesce adjacent blocks into requests up to this size (0: never; local stores never
        coalesce, whatever this says).
    retries : int
        Extra attempts for a request after a transient error or a read that came back short.
    start_delay : float
        Seconds to wait before the first requests (:func:`start_delay`: ranks spread out).
    read_ahead_delay : float
        Seconds from the start before requests for chunks past the first
        (:func:`~snapstore.read.crowd.read_ahead_delay`: a crowd's first chunks go first).
    initial_level : int
        Request growth to start with (:attr:`Concurrency.level`): a crowd's readers start
        grown, so that each first chunk is fewer requests.
    crowd : bool
        One of many readers on one bucket (:class:`Concurrency`'s ``crowd``).

    Raises
    ------
    ValueError
        If the budget, the requests or the threads are below 1.
    """

    budget_bytes: int
    max_requests: int = 64
    initial_requests: int = 8
    decode_threads: int = 2
    max_request_bytes: int = 8 << 20
    retries: int = 3
    start_delay: float = 0.0
    read_ahead_delay: float = 0.0
    initial_level: int = 0
    crowd: bool = False

    def __post_init__(self) -> None:
        # In the order SnapshotReader.prefetch has always checked them (threads size requests).
        for name in ("decode_threads", "max_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an int >= 1, found {getattr(self, name)}")
        for name in ("start_delay", "read_ahead_delay"):
            if not (0.0 <= getattr(self, name) <= 60.0):
                raise ValueError(
                    f"{name}: expected seconds in [0, 60], found {getattr(self, name)!r}"
                )
        if self.budget_bytes < 1:
            raise ValueError(
                f"prefetch budget: expected a positive number of bytes, found {self.budget_bytes}"
            )


class SharedDecoders:
    """One decode pool for several prefetchers (a mixture's sources).

    Each task decodes one block of the prefetcher whose next block is needed soonest: the
    fewest chunks ahead of what its consumer waits for. A mixture's sources are consumed a
    chunk at a time at about the same pace (a source's window is its share of the mixture's),
    so this is the order in which the mixture needs the blocks; a pool that took tasks as they
    were queued would decode one source far ahead while the other kept the consumer waiting,
    and hold the blocks decoded early.

    Parameters
    ----------
    threads : int
        Decode threads (at least 1).
    """

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, "snapstore-decode")
        self._members: list[Prefetcher] = []
        self._lock = threading.Lock()

    def join(self, prefetcher: Prefetcher) -> None:
        with self._lock:
            self._members = [*self._members, prefetcher]

    def leave(self, prefetcher: Prefetcher) -> None:
        with self._lock:
            self._members = [p for p in self._members if p is not prefetcher]

    def submit(self) -> None:
        """Decode one queued block, of whichever member needs it soonest."""
        self._pool.submit(self._run_one)

    def _run_one(self) -> None:
        while True:
            ranked = sorted(
                ((p.decode_urgency(), n, p) for n, p in enumerate(self._members)),
                key=lambda entry: entry[:2],
            )
            if not ranked or ranked[0][0] == math.inf:
                return  # every queued block was taken by another task, or its prefetcher closed
            for _, _, member in ranked:
                if member.decode_next():
                    return

    def shutdown(self) -> None:
        """Stop the threads once the tasks queued have run (each returns at once when its
        prefetchers are closed)."""
        self._pool.shutdown(wait=True)


class Prefetcher:
    """Fetch and decode the blocks of ``chunks`` ahead of the consumer; iterate for the results.

    Iterating yields ``(indices, {block: decoded})`` per chunk, in order. Use it once.

    Parameters
    ----------
    chunks : Iterable of numpy.ndarray
        Global sample indices, chunk by chunk (consumed on the scheduler thread).
    locate : callable
        ``locate(indices) -> blocks``: the block number of each global index.
    index : numpy structured array
        The block index (``shard``, ``offset``, ``length``, ``raw_length`` per block).
    paths : list of str
        Store path of each shard, by shard number.
    fetch : callable
        ``fetch(path, start, length)``: bytes (any buffer) of a range; may return fewer bytes.
    decode : callable
        ``decode(block, data)``: the decoded block; raises on corruption.
    limits : PrefetchLimits
        How far and how wide to read ahead: the byte budget, requests, threads and retries.
    local : bool
        Reads are cheap memory-map slices: run them on the decode threads, one block each.
    first_part : int
        Yield the first chunk in two parts: its first ``first_part`` indices as soon as the
        blocks they need are decoded, then the rest (0: whole). The requests are the same.
    on_requests : callable, optional
        Called once, on the scheduler thread, when the first chunk's requests are all out (a
        reader's pin starts then: nothing optional goes before the first requests).
    decoders : SharedDecoders, optional
        A decode pool shared with other prefetchers (a mixture's sources share one: its
        threads decode whichever source's block is needed soonest); the caller shuts it down.
        Default: a pool of ``limits.decode_threads`` of its own.
    throttles : callable, optional
        ``throttles()``: how many 429/503 answers the store has seen so far (its own retries
        hide them from ``fetch``); a rise during a request counts as a throttle
        (:meth:`Concurrency.on_throttled`), as does a throttling error ``fetch`` raises.
    """

    def __init__(
        self,
        chunks: Iterable[np.ndarray[Any, Any]],
        *,
        locate: Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]],
        index: np.ndarray[Any, Any],
        paths: list[str],
        fetch: Fetch,
        decode: Decode,
        limits: PrefetchLimits,
        local: bool = False,
        first_part: int = 0,
        on_requests: Callable[[], None] | None = None,
        decoders: SharedDecoders | None = None,
        throttles: Callable[[], int] | None = None,
    ) -> None:
        self._chunks = iter(chunks)
        self._locate = locate
        self._index = index
        self._paths = paths
        self._fetch = fetch
        self._decode = decode
        self.limits = limits
        self.budget_bytes = limits.budget_bytes
        self._local = local
        self._shape = RequestShape(0 if local else limits.max_request_bytes, local=local)
        self._throttles = throttles
        self._retries = limits.retries
        self._first_part = first_part
        self._on_requests = on_requests
        self.concurrency = Concurrency(
            limits.max_requests,
            limits.initial_requests,
            level=limits.initial_level,
            crowd=limits.crowd,
        )

        self._cond = threading.Condition()
        self._tickets: dict[int, _Chunk] = {}  # scheduled chunks the consumer has not finished
        self._scheduled = 0  # chunks scheduled so far
        self._scheduled_all = False
        self._failure: BaseException | None = None  # the scheduler's own failure
        self._ready: dict[int, Any] = {}  # block -> decoded block or the exception it raised
        self._refs: dict[int, int] = {}  # block -> chunks not yet consumed that need it
        self._cost: dict[int, int] = {}
        self._held = 0  # decoded bytes admitted and not yet released
        self._in_flight = 0
        self._waiting_chunk = 0  # the chunk the consumer needs next
        self._stopped = False
        self._waited = False  # the consumer stalled on the current chunk
        # Request latencies: exact count and sum, and a uniform sample of at most _SAMPLE of
        # them for the p95 (reservoir sampling), so a pass's memory does not grow with its size.
        self._timed = 0
        self._latencies: list[float] = []
        self._sampler = random.Random(0)
        self.stats = ReadStats(limit=self.concurrency.limit)
        self._started = time.perf_counter()
        self._busy = 0.0  # request-seconds

        # A pool of its own, or one shared with other prefetchers (a mixture's sources), which
        # it then waits to be done with (``_decoding``) instead of shutting down.
        self._shared = decoders
        if decoders is None:
            self._decoders: ThreadPoolExecutor | None = ThreadPoolExecutor(
                limits.decode_threads, "snapstore-decode"
            )
        else:
            self._decoders = None
            decoders.join(self)
        self._decoding = 0  # blocks being decoded now
        # (chunk, sequence, request, data or None): what the decode threads take next.
        self._decodes: list[tuple[int, int, RangeRequest, Any]] = []
        self._decode_seq = itertools.count()
        self._io = None if local else ThreadPoolExecutor(limits.max_requests, "snapstore-fetch")
        self._scheduler = threading.Thread(
            target=self._schedule, name="snapstore-prefetch", daemon=True
        )
        self._scheduler.start()

    # -- scheduler thread -------------------------------------------------------------------

    def _schedule(self) -> None:
        try:
            if self.limits.start_delay > 0:  # a crowd's ranks spread out; close() cuts it short
                with self._cond:
                    self._cond.wait_for(lambda: self._stopped, self.limits.start_delay)
            for number, indices in enumerate(self._chunks):
                blocks = self._locate(indices)
                _, first = np.unique(blocks, return_index=True)
                order = [int(b) for b in blocks[np.sort(first)]]
                fresh = []
                with self._cond:
                    if self._stopped:
                        return
                    for b in order:
                        if b in self._refs:
                            self._refs[b] += 1
                        else:
                            self._refs[b] = 1
                            fresh.append(b)
                    self._tickets[number] = _Chunk(indices, order)
                    self._scheduled = number + 1
                    self._cond.notify_all()
                if number == 1 and not self._hold_read_ahead():
                    return
                level = self.concurrency.level
                requests = list(
                    form_requests(fresh, number, self._index, self._paths, self._shape.grown(level))
                )
                sent = 0
                while sent < len(requests):
                    if not self._admit(requests[sent]):
                        return
                    self._submit(requests[sent])
                    sent += 1
                    if self.concurrency.level != level and sent < len(requests):
                        # Throttled meanwhile: the rest of the chunk in the grown requests.
                        level = self.concurrency.level
                        shape = self._shape.grown(level)
                        requests[sent:] = reform_requests(
                            requests[sent:], self._index, self._paths, shape
                        )
                if self._on_requests is not None:
                    callback, self._on_requests = self._on_requests, None
                    callback()
        except BaseException as exc:  # handed to the consumer
            with self._cond:
                self._failure = exc
                self._cond.notify_all()
        finally:
            with self._cond:
                self._scheduled_all = True
                self._cond.notify_all()

    def _hold_read_ahead(self) -> bool:
        """Wait until ``read_ahead_delay`` after the start; False if closed meanwhile."""
        until = self._started + self.limits.read_ahead_delay
        with self._cond:
            while not self._stopped:
                left = until - time.perf_counter()
                if left <= 0:
                    return True
                self._cond.wait(left)
            return False

    def _admit(self, request: RangeRequest) -> bool:
        """Wait until ``request`` may start; False if the prefetcher was closed meanwhile."""
        with self._cond:
            while not self._stopped:
                if admits(
                    request,
                    waiting_chunk=self._waiting_chunk,
                    in_flight=self._in_flight,
                    held=self._held,
                    concurrency=self.concurrency,
                    budget_bytes=self.budget_bytes,
                ):
                    self._in_flight += 1
                    self._held += request.cost
                    for (b, _, _), cost in zip(request.blocks, request.costs):
                        self._cost[b] = cost
                    if request.chunk in self._tickets:
                        self._tickets[request.chunk].requests += 1
                    self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
                    return True
                self._cond.wait()
            return False

    def _submit(self, request: RangeRequest) -> None:
        if self._io is None:
            self._queue_decode(request, None)  # the read is a memory-map slice: done there
        else:
            self._io.submit(self._run_remote, request)

    def _queue_decode(self, request: RangeRequest, data: Any) -> None:
        """Decode ``request`` (read it first if ``data`` is None) on a decode thread, earliest
        chunk first: requests complete in any order, and at a cold start the windows fetched
        ahead must not hold up the first one's decoding."""
        with self._cond:
            if self._stopped:
                return
            heapq.heappush(self._decodes, (request.chunk, next(self._decode_seq), request, data))
        try:
            if self._decoders is not None:
                self._decoders.submit(self.decode_next)
            elif self._shared is not None:
                self._shared.submit()
        except RuntimeError:  # the pool shut down: the prefetcher is closed
            pass

    def decode_urgency(self) -> float:
        """Chunks between the consumer and the earliest block queued for decoding (inf: none);
        read without the lock, as a hint for :class:`SharedDecoders`."""
        try:
            chunk = self._decodes[0][0]
        except IndexError:
            return math.inf
        return math.inf if self._stopped else chunk - self._waiting_chunk

    def decode_next(self) -> bool:
        """Decode the earliest queued block (reading it first, for a local store); False if
        none was queued or the prefetcher is closed."""
        with self._cond:
            if self._stopped or not self._decodes:
                return False
            _, _, request, data = heapq.heappop(self._decodes)
            self._decoding += 1
        try:
            if data is None:
                self._run_local(request)
            else:
                self._decode_all(request, data)
        finally:
            with self._cond:
                self._decoding -= 1
                if not self._decoding:
                    self._cond.notify_all()
        return True

    # -- pool threads -----------------------------------------------------------------------

    def _run_local(self, request: RangeRequest) -> None:
        try:
            data = self._read(request)
        except BaseException as exc:  # handed to the consumer
            self._finish(request, 0.0, 0, exc)
            return
        # A local request spans gaps it never reads (a view): count its blocks' bytes.
        self._finish(request, 0.0, sum(n for _, _, n in request.blocks), None)
        self._decode_all(request, data)

    def _run_remote(self, request: RangeRequest) -> None:
        began = tracing.now()  # the latency's clock is the trace's: one read of it each end
        try:
            with tracing.profiler_range("request", "read"):
                data = self._read(request)
        except BaseException as exc:  # handed to the consumer
            self._finish(request, self._request_seconds(request, began, 0), 0, exc)
            return
        seconds = self._request_seconds(request, began, request.length)
        self._finish(request, seconds, request.length, None)
        self._queue_decode(request, data)

    @staticmethod
    def _request_seconds(request: RangeRequest, began: float, nbytes: int) -> float:
        """Seconds since ``began`` (:func:`snapstore.tracing.now`); a ``request`` span when
        tracing (``bytes`` read, ``blocks`` covered)."""
        ended = tracing.now()
        if tracing.enabled():
            tracing.complete(
                "request", "read", began, ended, bytes=nbytes, blocks=len(request.blocks)
            )
        return (ended - began) / 1e6

    def _read(self, request: RangeRequest) -> Any:
        """The request's bytes; transient errors and short reads are retried a bounded number
        of times, with exponential backoff."""
        parts: list[Any] = []
        have = 0
        attempt = 0
        while have < request.length:
            if self._stopped:
                raise RuntimeError("prefetcher closed")
            seen = self._throttles() if self._throttles is not None else 0
            try:
                data = self._fetch(request.path, request.start + have, request.length - have)
            except _PERMANENT:
                raise
            except _TRANSIENT as exc:
                self._note_throttle(seen, exc)
                attempt += 1
                if attempt > self._retries or getattr(exc, "errno", None) in _PERMANENT_ERRNOS:
                    raise
                self._retried(attempt, exc)
                continue
            self._note_throttle(seen, None)
            size = memoryview(data).nbytes
            if size == 0:
                attempt += 1
                if attempt > self._retries:
                    raise FormatError(
                        f"shard {request.path} ends before byte {request.start + request.length} "
                        f"(read stopped at {request.start + have}); the snapshot is damaged: "
                        "run `snapstore verify`, remove it with `snapstore rm` and rebuild it"
                    )
                self._retried(attempt, None)
                continue
            parts.append(data)
            have += size
        if len(parts) == 1:
            return parts[0]
        return b"".join(bytes(p) for p in parts)

    def _note_throttle(self, seen: int, exc: BaseException | None) -> None:
        """Tell the controller whether the store throttled this request (``seen``: the store's
        throttle count before it) or answered it."""
        now = self._throttles() if self._throttles is not None else 0
        throttled = now > seen or (exc is not None and is_throttled(exc))
        with self._cond:
            if throttled:
                self.concurrency.on_throttled()
            elif exc is None:
                self.concurrency.on_success()

    def _retried(self, attempt: int, exc: BaseException | None) -> None:
        with self._cond:
            self.stats.retries += 1
        why = f"{type(exc).__name__}: {exc}" if exc is not None else "short read"
        log.debug("retrying a read (attempt %d) after %s", attempt + 1, why)
        time.sleep(min(1.0, 0.05 * 2 ** (attempt - 1)))

    def _finish(
        self, request: RangeRequest, seconds: float, nbytes: int, error: BaseException | None
    ) -> None:
        with self._cond:
            self._in_flight -= 1
            self.stats.requests += 1
            self.stats.bytes += nbytes
            if seconds:
                self._sample_latency(seconds)
                self._busy += seconds
                self.concurrency.record_latency(seconds, nbytes)
            if error is not None:
                for b, _, _ in request.blocks:
                    self._ready[b] = error
            self._cond.notify_all()

    def _sample_latency(self, seconds: float) -> None:
        """Keep ``seconds`` in the latency sample (lock held)."""
        self._timed += 1
        if len(self._latencies) < _SAMPLE:
            self._latencies.append(seconds)
        else:
            slot = self._sampler.randrange(self._timed)
            if slot < _SAMPLE:
                self._latencies[slot] = seconds

    def _decode_all(self, request: RangeRequest, data: Any) -> None:
        """Verify and decode the request's blocks: one ``decode`` span (its first ``block``,
        ``blocks``, their stored ``bytes``)."""
        view = memoryview(data) if not isinstance(data, memoryview) else data
        with tracing.span("decode", "read") as recorded:
            if recorded is not None:
                size = sum(n for _, _, n in request.blocks)
                recorded.args.update(
                    block=request.blocks[0][0], blocks=len(request.blocks), bytes=size
                )
            for b, offset, length in request.blocks:
                result: Any
                try:
                    result = self._decode(b, view[offset : offset + length])
                except BaseException as exc:  # handed to the consumer
                    result = exc
                with self._cond:
                    self._ready[b] = result
                    self.stats.blocks += 1
                    self._cond.notify_all()

    # -- consumer ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[np.ndarray[Any, Any], dict[int, Any]]]:
        number = 0
        try:
            while True:
                chunk = self._wait_chunk(number)
                if chunk is None:
                    return
                if number == 0 and 0 < self._first_part < len(chunk.indices):
                    yield from self._parts(chunk)
                else:
                    decoded = self._wait_blocks(chunk)
                    yield chunk.indices, decoded
                    del decoded
                self._release(chunk)
                number += 1
        finally:
            self.close()

    def _wait_chunk(self, number: int) -> _Chunk | None:
        with self._cond:
            self._waiting_chunk = number
            self._cond.notify_all()
            began, limited = time.perf_counter(), self._limited()
            while number >= self._scheduled and not self._scheduled_all:
                self._cond.wait()
            self._stalled(began, number, limited)
            if self._failure is not None and number >= self._scheduled:
                raise self._failure
            return self._tickets.get(number)

    def _parts(self, chunk: _Chunk) -> Iterator[tuple[np.ndarray[Any, Any], dict[int, Any]]]:
        """The first chunk's head (its blocks only), then its tail (the wait counts as a stall)."""
        cut = self._first_part
        needed = set(self._locate(chunk.indices[:cut]).tolist())
        head = self._wait_blocks(chunk, [b for b in chunk.blocks if b in needed])
        yield chunk.indices[:cut], head
        del head
        yield chunk.indices[cut:], self._wait_blocks(chunk, part=1)

    def _wait_blocks(
        self, chunk: _Chunk, blocks: list[int] | None = None, part: int = 0
    ) -> dict[int, Any]:
        """The decoded ``blocks`` of ``chunk`` (default: all), once ready; ``part`` > 0 makes
        the wait a stall even on the first chunk."""
        blocks = chunk.blocks if blocks is None else blocks
        with self._cond:
            began, limited = time.perf_counter(), self._limited()
            decoded: dict[int, Any] = {}
            for b in blocks:
                while b not in self._ready:
                    if self._failure is not None:
                        raise self._failure
                    if self._stopped:  # closed from another thread (the batch assembler's)
                        raise PrefetcherClosedError("prefetcher closed while a chunk was awaited")
                    self._cond.wait()
                value = self._ready[b]
                if isinstance(value, BaseException):
                    raise value
                decoded[b] = value
            for b in blocks:  # handed over: the budget counts only what lies ahead
                self._held -= self._cost.pop(b, 0)
            self._stalled(began, self._waiting_chunk + part, limited)
            return decoded

    def _limited(self) -> bool:
        """Requests are held back by the concurrency limit, not the budget (lock held)."""
        return self._in_flight >= self.concurrency.limit

    def _stalled(self, began: float, number: int, limited: bool) -> None:
        """Account the wait that began at ``began`` (lock held); adapt concurrency."""
        waited = time.perf_counter() - began
        if number == 0:
            self.stats.startup += waited
        elif waited > 1e-4:
            self.stats.stall += waited
            self._waited = True
            self.concurrency.on_stall(limited)
            self._cond.notify_all()

    def _release(self, chunk: _Chunk) -> None:
        with self._cond:
            for b in chunk.blocks:
                self._refs[b] -= 1
                if not self._refs[b]:
                    del self._refs[b]
                    self._ready.pop(b, None)
            self.stats.samples += len(chunk.indices)
            self.concurrency.record_consumed(chunk.requests, time.perf_counter())
            if not self._waited:
                self.concurrency.on_idle()
            self._waited = False
            self._tickets.pop(self._waiting_chunk, None)
            self._cond.notify_all()

    def snapshot_stats(self) -> ReadStats:
        """The stats so far (a copy)."""
        with self._cond:
            stats = ReadStats(**asdict(self.stats))
            stats.wall = time.perf_counter() - self._started
            if self._timed:
                stats.latency_mean = self._busy / self._timed
                stats.latency_p95 = float(np.percentile(self._latencies, 95))
            stats.concurrency = self._busy / stats.wall if stats.wall > 0 else 0.0
            stats.limit = self.concurrency.limit
            return stats

    def close(self) -> None:
        """Stop every thread; blocks not yet consumed are dropped. Safe to call twice."""
        with self._cond:
            if self._stopped:
                return
            self._stopped = True
            self._cond.notify_all()
        if threading.current_thread() is not self._scheduler:
            self._scheduler.join()
        if self._io is not None:
            self._io.shutdown(wait=True, cancel_futures=True)
        if self._decoders is not None:
            self._decoders.shutdown(wait=True, cancel_futures=True)
        if self._shared is not None:
            self._shared.leave(self)
        with self._cond:
            while self._decoding:  # a shared pool's thread decoding a block of ours
                self._cond.wait()
            self._ready.clear()
            self._tickets.clear()
