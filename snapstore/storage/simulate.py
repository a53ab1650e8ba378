"""Read a snapshot as if it lived in a remote bucket: simulated latency and bandwidth.

Before moving a snapshot to object storage, or to test the prefetching reader deterministically
without root (no ``tc netem``), wrap its store so that every request waits as a bucket would::

    import snapstore
    from snapstore.storage.simulate import simulated_store

    store = simulated_store("~/.cache/snapstore", ttfb=0.05, bandwidth=200e6)
    snap = snapstore.open(fingerprint, root=store)
    for batch in snap.batches(256, shuffle=True):
        ...
    print(store.fs.requests, store.fs.bytes_read, store.fs.max_concurrent)

The model is simple on purpose. A request (a whole-file or ranged read, a listing, a stat, an
upload or a delete) takes ``ttfb + nbytes / bandwidth`` seconds from the moment it is served;
``bandwidth`` is one request's (one connection's) throughput, so parallel requests overlap, as
HTTP requests to a bucket do, up to ``max_requests`` at once (a connection pool: the rest
queue). A recursive listing (``find``, what :meth:`Store.list_tree` sends) is paged as GCS and
S3 page one: a request per :data:`LIST_PAGE` objects, one after another. The target's own time
counts toward that delay, so a target slower than the simulation shows through. Not modelled:
an aggregate bandwidth cap, throttling, errors and retries. Timings are accurate to about +-2 ms
(sleep granularity); the sleeps release the GIL.

Failures are simulated by :func:`faulty_store` (from :mod:`snapstore.storage.faults`, exported
here): 503s, 429s with ``Retry-After``, connection resets before and after the server acted,
bodies cut short and heavy-tailed delays, seeded; ``faulty_store(simulated_store(root))`` gives
both.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

import fsspec

from .faults import FaultFileSystem, Faults, InjectedHTTPError, ShortBodyError, faulty_store
from .forwarding import ForwardingFileSystem
from .store import FsspecStore, LocalStore, Store, open_store
from .trees import takes_prefix

__all__ = [
    "LIST_PAGE",
    "FaultFileSystem",
    "Faults",
    "InjectedHTTPError",
    "LatencyFileSystem",
    "Request",
    "ShortBodyError",
    "faulty_store",
    "round_trips",
    "simulated_store",
]

T = TypeVar("T")

# Objects per page of a listing without delimiter: the most GCS (maxResults) and S3 (MaxKeys)
# return per request. A recursive listing of n objects takes ceil(n / 1000) round trips.
LIST_PAGE = 1000

# fsspec's async backends (gcsfs, s3fs) gather at most this many requests of one cat_ranges call
# at a time by default (fsspec.asyn._DEFAULT_BATCH_SIZE); the simulation does the same.
_GATHER_BATCH = 128


def _check_settings(ttfb: float, bandwidth: float | None, max_requests: int | None) -> None:
    def number(x: object) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)

    if not (number(ttfb) and math.isfinite(ttfb) and ttfb >= 0):
        raise ValueError(
            f"ttfb must be a finite number of seconds >= 0 (the time to first byte of each "
            f"request), got {ttfb!r}; e.g. ttfb=0.05 for 50 ms"
        )
    if bandwidth is not None and not (number(bandwidth) and bandwidth > 0):
        raise ValueError(
            f"bandwidth must be a number of bytes per second > 0, or None for unlimited, got "
            f"{bandwidth!r}; e.g. bandwidth=200e6 for 200 MB/s"
        )
    if max_requests is not None and not (
        isinstance(max_requests, int) and not isinstance(max_requests, bool) and max_requests >= 1
    ):
        raise ValueError(
            f"max_requests must be an integer >= 1 (requests served at once), or None for no "
            f"limit, got {max_requests!r}"
        )


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class Request(NamedTuple):
    """One request in a :class:`LatencyFileSystem`'s ``trace``: the filesystem method, the
    target's path, whether it read a byte range, and when it was served (``time.perf_counter``
    seconds, queueing for a connection excluded)."""

    name: str
    path: str
    ranged: bool
    start: float
    end: float


def round_trips(trace: list[Request], until: Callable[[Request], bool] | None = None) -> int:
    """How many round trips ``trace`` took one after another: the number of groups of
    overlapping requests (requests served in parallel are one round trip).

    Parameters
    ----------
    trace : list of Request
        A :class:`LatencyFileSystem`'s ``trace``.
    until : callable, optional
        Count only requests that started before the first one for which ``until(request)`` is
        true (e.g. ``lambda r: r.ranged``: the cold start before the first block is read).

    Examples
    --------
    >>> store = simulated_store("/data/snaps", ttfb=0.05, record=True)        # doctest: +SKIP
    >>> next(iter(snapstore.open(fp, root=store).batches(256)))               # doctest: +SKIP
    >>> round_trips(store.fs.trace, until=lambda r: r.ranged)                 # doctest: +SKIP
    """
    requests = sorted(trace, key=lambda r: r.start)
    stop = next((r.start for r in requests if until is not None and until(r)), math.inf)
    count, frontier = 0, -math.inf
    for r in requests:
        if r.start >= stop:
            break
        if r.start >= frontier:
            count += 1
        frontier = max(frontier, r.end)
    return count


class LatencyFileSystem(ForwardingFileSystem):
    """An fsspec filesystem that delays every request to another one like a remote bucket.

    Paths are the target filesystem's paths (a leading ``latency://`` is stripped). Which calls
    are requests, and how many, is :class:`~snapstore.storage.forwarding.ForwardingFileSystem`'s
    (a read opened with ``open`` is a ranged request per cache miss; making a directory is
    free); :meth:`find` pages.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem, optional
        The target filesystem that holds the data; default: the local filesystem.
    ttfb : float
        Time to first byte of every request, in seconds (0.05: a cloud bucket from a VM in the
        same region, roughly).
    bandwidth : float, optional
        Bytes per second of one request; None for unlimited. A request of ``n`` bytes takes
        ``ttfb + n / bandwidth`` seconds.
    max_requests : int, optional
        How many requests are served at once (an HTTP connection pool); the rest queue.
        None for no limit.
    record : bool
        Keep a :class:`Request` per request in ``trace`` (for :func:`round_trips`); off by
        default, since a long read makes millions of them.
    **storage_options
        Passed to ``fsspec.AbstractFileSystem``.

    Attributes
    ----------
    requests : int
        Requests served since creation or :meth:`reset_counters`.
    bytes_read : int
        Bytes returned by read requests.
    max_concurrent : int
        The most requests served at the same time.
    trace : list of Request or None
        The requests served, in the order they ended, with ``record=True``; None otherwise.

    Raises
    ------
    ValueError
        If a setting is out of range.
    TypeError
        If ``fs`` is not an fsspec filesystem.

    Examples
    --------
    >>> fs = LatencyFileSystem(ttfb=0.02, bandwidth=100e6)             # doctest: +SKIP
    >>> fs.cat_file("/data/shard-0", start=0, end=1024)   # about 20 ms  # doctest: +SKIP
    """

    protocol = "latency"
    url_prefixes = ("latency://", "latency::")
    # Its own calls only sleep: over a local or memory filesystem a store's deadline needs no
    # helper thread (see snapstore.storage.deadline), which would blur the simulated latencies.
    snapstore_in_process = True

    def __init__(
        self,
        fs: Any = None,
        *,
        ttfb: float = 0.05,
        bandwidth: float | None = None,
        max_requests: int | None = None,
        record: bool = False,
        **storage_options: Any,
    ) -> None:
        _check_settings(ttfb, bandwidth, max_requests)
        if fs is not None and not isinstance(fs, fsspec.AbstractFileSystem):
            raise TypeError(
                f"fs must be an fsspec filesystem (fsspec.AbstractFileSystem), got "
                f"{type(fs).__name__}; use fsspec.filesystem(protocol), or simulated_store(url)"
            )
        super().__init__(fs if fs is not None else fsspec.filesystem("file"), **storage_options)
        self.ttfb = float(ttfb)
        self.bandwidth = None if bandwidth is None else float(bandwidth)
        self.max_requests = max_requests
        self._slots: contextlib.AbstractContextManager[Any] = (
            threading.BoundedSemaphore(max_requests) if max_requests else contextlib.nullcontext()
        )
        self._lock = threading.Lock()
        self._active = 0
        self.trace: list[Request] | None = [] if record else None
        self.reset_counters()

    def __repr__(self) -> str:
        bandwidth = "unlimited" if self.bandwidth is None else f"{self.bandwidth:g} B/s"
        return (
            f"<LatencyFileSystem ttfb={self.ttfb:g}s bandwidth={bandwidth} "
            f"max_requests={self.max_requests} over {type(self.fs).__name__}>"
        )

    def reset_counters(self) -> None:
        """Set ``requests``, ``bytes_read`` and ``max_concurrent`` to zero (and empty
        ``trace``)."""
        with self._lock:
            if self.trace is not None:
                self.trace = []
            self.requests = 0
            self.bytes_read = 0
            self.max_concurrent = self._active

    # -- the cost of a request -------------------------------------------------------------

    def _serve(
        self, call: Callable[[], T], size: Callable[[T], int], name: str, path: Any, ranged: bool
    ) -> T:
        with self._slots:
            with self._lock:
                self.requests += 1
                self._active += 1
                self.max_concurrent = max(self.max_concurrent, self._active)
            try:
                start = time.perf_counter()
                try:
                    result = call()
                except Exception:
                    _sleep_until(start + self.ttfb)  # a failed request (a 404) is a round trip too
                    raise
                transfer = size(result) / self.bandwidth if self.bandwidth else 0.0
                _sleep_until(start + self.ttfb + transfer)
                return result
            finally:
                with self._lock:
                    self._active -= 1
                    if self.trace is not None:
                        self.trace.append(
                            Request(name, str(path), ranged, start, time.perf_counter())
                        )

    def _send(self, name: str, path: str, call: Callable[[], T], *, sent: int = 0) -> T:
        """A request that returns no body: ``ttfb`` and the upload of ``sent`` bytes."""
        return self._serve(call, lambda _: sent, name, path, False)

    def _read(
        self, path: str, start: int | None, end: int | None, call: Callable[[], bytes]
    ) -> bytes:
        """A read: ``ttfb`` and the download of what it returns."""
        data = self._serve(call, len, "cat_file", path, start is not None or end is not None)
        with self._lock:
            self.bytes_read += len(data)
        return data

    def _open_writer(self, path: str, mode: str, options: dict[str, Any]) -> Any:
        """One request, named ``open(mode)`` in ``trace``."""
        return self._send(f"open({mode})", path, lambda: self.fs.open(path, mode, **options))

    # -- reads -----------------------------------------------------------------------------

    def _check_ranges(self, paths: Any, starts: Any, ends: Any, max_gap: int | None) -> None:
        """What fsspec's ``cat_ranges`` refuses: merged ranges, and not one start and one end
        per path."""
        if max_gap is not None:
            raise NotImplementedError("LatencyFileSystem.cat_ranges does not merge ranges")
        if not isinstance(paths, list):
            raise TypeError(f"paths must be a list of paths, got {type(paths).__name__}")
        counts = [len(x) if isinstance(x, list) else len(paths) for x in (starts, ends)]
        if counts != [len(paths)] * 2:
            raise ValueError(
                f"cat_ranges needs one start and one end per path: got {len(paths)} paths, "
                f"{counts[0]} starts and {counts[1]} ends"
            )

    def _gather(self, reads: Iterable[Callable[[], bytes | Exception]]) -> list[bytes | Exception]:
        """One request per range of a ``cat_ranges``, issued in parallel as fsspec's async
        backends do."""
        calls = list(reads)
        workers = min(len(calls), self.max_requests or _GATHER_BATCH)
        if workers <= 1:
            return [call() for call in calls]
        with ThreadPoolExecutor(workers, thread_name_prefix="snapstore-latency") as pool:
            return list(pool.map(lambda call: call(), calls))

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        prefix: str = "",
        **kwargs: Any,
    ) -> Any:
        """A recursive listing as an object store pages it: one request per :data:`LIST_PAGE`
        files, one page after another. ``prefix`` keeps the keys under ``path`` that start
        with it (the service filters: only those count)."""
        target = self._strip_protocol(path).rstrip("/")
        options = dict(kwargs, maxdepth=maxdepth, withdirs=withdirs, detail=True)
        found = self._send("find", target, lambda: self._find(target, prefix, options))
        files = sum(1 for info in found.values() if info.get("type") != "directory")
        for _ in range(1, math.ceil(files / LIST_PAGE)):
            self._send("find", target, lambda: None)  # the next page
        return found if detail else sorted(found)

    def _find(self, target: str, prefix: str, options: dict[str, Any]) -> dict[str, Any]:
        if not prefix:
            return dict(self.fs.find(target, **options))
        if takes_prefix(self.fs):
            return dict(self.fs.find(target, prefix=prefix, **options))
        start = f"{target}/{prefix}"
        base = start.rsplit("/", 1)[0]
        try:
            found = self.fs.find(base, **options)
        except FileNotFoundError:
            return {}
        return {k: v for k, v in found.items() if k.startswith(start)}


def simulated_store(
    root: str | os.PathLike[str] | Store,
    *,
    ttfb: float = 0.05,
    bandwidth: float | None = None,
    max_requests: int | None = None,
    record: bool = False,
) -> FsspecStore:
    """A store over ``root`` whose every request waits like a remote bucket's.

    Parameters
    ----------
    root : str, PathLike or Store
        A local directory, an fsspec URL (``memory://snaps``, ``gs://bucket/snaps``), or a
        :class:`LocalStore` or :class:`FsspecStore`.
    ttfb, bandwidth, max_requests, record
        As for :class:`LatencyFileSystem`.

    Returns
    -------
    FsspecStore
        Its ``fs`` is the :class:`LatencyFileSystem`, whose counters say how many requests
        reading took; its ``url`` is ``latency://`` followed by the root's own URL.

    Raises
    ------
    ValueError
        If a setting is out of range.
    TypeError
        If ``root`` is a Store of another kind.

    Examples
    --------
    >>> store = simulated_store("/data/snaps", ttfb=0.05, bandwidth=200e6)  # doctest: +SKIP
    >>> snap = snapstore.open(fingerprint, root=store)                      # doctest: +SKIP
    >>> sum(1 for _ in snap.batches(256)), store.fs.requests               # doctest: +SKIP
    """
    _check_settings(ttfb, bandwidth, max_requests)
    inner = open_store(root)
    if isinstance(inner, LocalStore):
        target: Any = fsspec.filesystem("file")
        path = inner.root.as_posix()
    elif isinstance(inner, FsspecStore):
        target, path = inner.fs, inner.root
    else:
        raise TypeError(
            f"simulated_store wraps a LocalStore or an FsspecStore, got a "
            f"{type(inner).__name__}; pass its root path or URL instead"
        )
    fs = LatencyFileSystem(
        target, ttfb=ttfb, bandwidth=bandwidth, max_requests=max_requests, record=record
    )
    store = FsspecStore(fs, path)
    store.url = f"latency://{inner.url}"
    return store
