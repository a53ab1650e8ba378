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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

import fsspec
from fsspec.spec import AbstractBufferedFile
from fsspec.utils import stringify_path

from .faults import FaultFileSystem, Faults, InjectedHTTPError, ShortBodyError, faulty_store
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


class _LatencyFile(AbstractBufferedFile):  # type: ignore[misc]
    """A file opened for reading: each cache miss is one ranged request, as with gcsfs or s3fs."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        data: bytes = self.fs.cat_file(self.path, start=start, end=end)
        return data


class LatencyFileSystem(fsspec.AbstractFileSystem):  # type: ignore[misc]
    """An fsspec filesystem that delays every request to another one like a remote bucket.

    Paths are the target filesystem's paths (a leading ``latency://`` is stripped).

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
    # Its own calls only sleep: over a local or memory filesystem a store's deadline needs no
    # helper thread (see snapstore.storage.deadline), which would blur the simulated latencies.
    snapstore_in_process = True
    # Instances differ by their latency settings and hold counters: never hand out a cached one.
    cachable = False

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
        super().__init__(**storage_options)
        self.fs: Any = fs if fs is not None else fsspec.filesystem("file")
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

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(stringify_path(path))
        for prefix in ("latency://", "latency::"):
            if text.startswith(prefix):
                return text[len(prefix) :]
        return text  # the target normalizes its own paths

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

    def _request(self, call: Callable[[], T], name: str, path: Any, *, sent: int = 0) -> T:
        return self._serve(call, lambda _: sent, name, path, False)

    def _read(self, call: Callable[[], bytes], path: str, ranged: bool) -> bytes:
        data = self._serve(call, len, "cat_file", path, ranged)
        with self._lock:
            self.bytes_read += len(data)
        return data

    def _forward(self, method: str, path: Any, *args: Any, sent: int = 0, **kwargs: Any) -> Any:
        """One request: the target's ``method`` on the target's path."""
        target = self._strip_protocol(path)
        return self._request(
            lambda: getattr(self.fs, method)(target, *args, **kwargs), method, target, sent=sent
        )

    # -- reads -----------------------------------------------------------------------------

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """One request for the bytes ``[start:end)`` (negative: from the end), as slices."""
        target = self._strip_protocol(path)
        return self._read(
            lambda: self.fs.cat_file(target, start=start, end=end, **kwargs),
            target,
            start is not None or end is not None,
        )

    def cat_ranges(
        self,
        paths: list[str],
        starts: list[int | None] | int | None,
        ends: list[int | None] | int | None,
        max_gap: int | None = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> list[bytes | Exception]:
        """One request per range, issued in parallel as fsspec's async backends do."""
        if max_gap is not None:
            raise NotImplementedError("LatencyFileSystem.cat_ranges does not merge ranges")
        if not isinstance(paths, list):
            raise TypeError(f"paths must be a list of paths, got {type(paths).__name__}")
        starts = starts if isinstance(starts, list) else [starts] * len(paths)
        ends = ends if isinstance(ends, list) else [ends] * len(paths)
        if len(starts) != len(paths) or len(ends) != len(paths):
            raise ValueError(
                f"cat_ranges needs one start and one end per path: got {len(paths)} paths, "
                f"{len(starts)} starts and {len(ends)} ends"
            )

        def one(path: str, start: int | None, end: int | None) -> bytes | Exception:
            try:
                return self.cat_file(path, start, end, **kwargs)
            except Exception as exc:
                if on_error == "return":
                    return exc
                raise

        workers = min(len(paths), self.max_requests or _GATHER_BATCH)
        if workers <= 1:
            return [one(*args) for args in zip(paths, starts, ends)]
        with ThreadPoolExecutor(workers, thread_name_prefix="snapstore-latency") as pool:
            return list(pool.map(one, paths, starts, ends))

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        if mode == "rb":
            return _LatencyFile(
                self, path, mode, block_size, autocommit, cache_options=cache_options, **kwargs
            )
        options = dict(kwargs, block_size=block_size, autocommit=autocommit)
        return self._request(lambda: self.fs.open(path, mode, **options), f"open({mode})", path)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """One request: the target's ``info``."""
        return dict(self._forward("info", path, **kwargs))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """One request: the target's listing."""
        return list(self._forward("ls", path, detail=detail, **kwargs))

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
        found = self._request(lambda: self._find(target, prefix, options), "find", target)
        files = sum(1 for info in found.values() if info.get("type") != "directory")
        for _ in range(1, math.ceil(files / LIST_PAGE)):
            self._request(lambda: None, "find", target)  # the next page
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

    def exists(self, path: str, **kwargs: Any) -> bool:
        """One request."""
        return bool(self._forward("exists", path, **kwargs))

    def isdir(self, path: str) -> bool:
        """One request."""
        return bool(self._forward("isdir", path))

    def isfile(self, path: str) -> bool:
        """One request."""
        return bool(self._forward("isfile", path))

    def modified(self, path: str) -> Any:
        """One request."""
        return self._forward("modified", path)

    # -- writes: passed through; each costs a request ----------------------------------------

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """One upload of ``len(value)`` bytes; ``mode="create"`` raises FileExistsError."""
        self._forward("pipe_file", path, value, mode=mode, sent=len(value), **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Free: object stores have no directories, so making one sends no request."""
        self.fs.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Free, as :meth:`makedirs`."""
        self.fs.mkdir(self._strip_protocol(path), create_parents=create_parents, **kwargs)

    def rm(self, path: str, recursive: bool = False, maxdepth: int | None = None) -> None:
        """One request (a batch delete)."""
        self._forward("rm", path, recursive=recursive, maxdepth=maxdepth)

    def rm_file(self, path: str) -> None:
        """One request."""
        self._forward("rm_file", path)

    def rmdir(self, path: str) -> None:
        """One request."""
        self._forward("rmdir", path)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """One request (a server-side copy)."""
        self._forward("cp_file", path1, self._strip_protocol(path2), **kwargs)

    def invalidate_cache(self, path: str | None = None) -> None:
        """Clear the target's listings cache; no request."""
        self.fs.invalidate_cache(path)


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
