"""A bucket that fails, throttles and stalls: seeded fault injection under any fsspec store.

:func:`faulty_store` wraps a store's filesystem in a :class:`FaultFileSystem` that, per request,
may fail as a remote bucket does, so that the store's retries, its commit protocol and the
reader's checks can be tried before a real bucket tries them::

    from snapstore.storage.simulate import faulty_store

    store = faulty_store("/data/snaps", seed=1, error_rate=0.05, short_body=0.01, reset_after=0.01)
    snap = snapstore.open(fingerprint, root=store)
    ...
    print(store.fs.injected)   # Counter({'503': 41, 'short_body': 9, 'reset_after': 8, ...})

The faults, each with its own probability per request (:class:`Faults`):

- ``error_rate``: HTTP 503 before the request is served;
- ``throttle_rate``: HTTP 429 with a ``Retry-After`` of ``retry_after`` seconds;
- ``reset_before``: a connection reset before the server saw the request (nothing happened);
- ``reset_after``: a reset after the server acted, before its answer arrived: a write, a
  create or a removal happened, but the caller sees an error (the lost answer);
- ``short_body``: a read whose body is cut short (the client notices the missing bytes, as
  aiohttp and urllib3 do from ``Content-Length``, and raises);
- ``slow_tail``: a delay from a Pareto distribution (``tail_scale`` seconds at least, shape
  ``tail_alpha``, at most ``tail_cap``) before the request is served.

What is raised is what :mod:`snapstore.storage.retry` sees from the real clients: over gcsfs
its ``HttpError`` (``code`` 503 or 429); elsewhere :class:`InjectedHTTPError`, an ``OSError``
with ``status`` and ``retry_after`` (errno ``EBUSY``, as s3fs reports ``SlowDown``);
``ConnectionResetError`` (``ECONNRESET``) for a reset, and :class:`ShortBodyError`
(a ``ConnectionError``, as aiohttp's ``ClientPayloadError``) for a body cut short.

Each decision is a pure function of (``seed``, the method, the path, the byte range, and how
many times that same request was made before), so a run's faults do not depend on how threads
interleave: the same requests meet the same faults in every run, and a retry draws anew.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import fsspec

from .forwarding import ForwardingFileSystem
from .store import FsspecStore, LocalStore, RetryPolicy, Store, open_store

__all__ = [
    "FaultFileSystem",
    "Faults",
    "InjectedHTTPError",
    "ShortBodyError",
    "faulty_store",
]

T = TypeVar("T")

# Requests that change the store: a reset after them is a lost answer (the change happened).
_WRITES = frozenset({"pipe_file", "put_file", "link", "rm", "rm_file", "rmdir", "cp_file"})
_READS = frozenset({"cat_file"})


class InjectedHTTPError(OSError):
    """An HTTP error answer (503, 429) from a :class:`FaultFileSystem`: ``status`` and, for
    429, ``retry_after`` (seconds the server asks the client to wait, its ``Retry-After``)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(errno.EBUSY, message)
        self.status = status
        self.retry_after = retry_after
        self.throttled = status in (429, 503)


class ShortBodyError(ConnectionError):
    """A response body that ended before its ``Content-Length`` (as aiohttp's
    ``ClientPayloadError`` and urllib3's ``IncompleteRead``): the bytes are not returned."""


@dataclass(frozen=True)
class Faults:
    """How often each fault happens, per request; see :mod:`snapstore.storage.faults`.

    Parameters
    ----------
    seed : int
        Chooses which requests fail; the same seed fails the same requests.
    error_rate, throttle_rate, reset_before, reset_after, short_body, slow_tail : float
        Probabilities (0 to 1) of HTTP 503, HTTP 429, a reset before the request, a reset
        after the server acted, a read's body cut short, and a heavy-tailed delay. They
        add up: at most 1 in all.
    retry_after : float
        Seconds a 429 asks the client to wait: 1, as GCS and S3 suggest.
    tail_scale, tail_alpha, tail_cap : float
        The delay of a slow request: Pareto with minimum ``tail_scale`` seconds (0.05) and
        shape ``tail_alpha`` (1.5: a heavy tail, as measured request latencies of object
        stores have), cut at ``tail_cap`` seconds (2) so that a test ends.
    """

    seed: int = 0
    error_rate: float = 0.0
    throttle_rate: float = 0.0
    reset_before: float = 0.0
    reset_after: float = 0.0
    short_body: float = 0.0
    slow_tail: float = 0.0
    retry_after: float = 1.0
    tail_scale: float = 0.05
    tail_alpha: float = 1.5
    tail_cap: float = 2.0

    def __post_init__(self) -> None:
        if type(self.seed) is not int:
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        total = 0.0
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "seed":
                continue
            if not (isinstance(value, int | float) and not isinstance(value, bool)) or not (
                math.isfinite(value) and value >= 0
            ):
                raise ValueError(f"{f.name} must be a finite number >= 0, got {value!r}")
            if f.name in _RATES:
                if value > 1:
                    raise ValueError(f"{f.name} is a probability (0 to 1), got {value!r}")
                total += value
        if total > 1:
            raise ValueError(
                f"the fault probabilities add up to {total:g}; they must add up to at most 1"
            )
        if self.tail_alpha <= 0:
            raise ValueError(f"tail_alpha must be > 0, got {self.tail_alpha!r}")


_RATES = ("error_rate", "throttle_rate", "reset_before", "reset_after", "short_body", "slow_tail")


def _uniform(seed: int, key: str, salt: str) -> float:
    digest = hashlib.blake2b(f"{seed}|{salt}|{key}".encode(), digest_size=8).digest()
    value: int = struct.unpack("<Q", digest)[0]
    return (value >> 11) / float(1 << 53)


class FaultFileSystem(ForwardingFileSystem):
    """An fsspec filesystem that passes every request to another one, failing some as a
    remote bucket does (see :mod:`snapstore.storage.faults`).

    Each request, as :class:`~snapstore.storage.forwarding.ForwardingFileSystem` counts them,
    draws its own fault; so do ``put_file``, ``link``, ``size`` and ``du`` here (one request
    each).

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The target filesystem (local, memory, a :class:`~snapstore.storage.simulate.
        LatencyFileSystem`, gcsfs...).
    faults : Faults
        What to inject, and how often.

    Attributes
    ----------
    requests : Counter
        Requests made, by method.
    injected : Counter
        Faults injected, by kind: ``"503"``, ``"429"``, ``"reset_before"``, ``"reset_after"``,
        ``"short_body"``, ``"slow_tail"``.
    enabled : bool
        Set False to pass every request through unharmed (to check a result).
    """

    protocol = "faults"
    url_prefixes = ("faults://",)
    snapstore_in_process = True  # what it adds only sleeps; the target says for itself

    def __init__(self, fs: Any, faults: Faults | None = None, **storage_options: Any) -> None:
        if not isinstance(fs, fsspec.AbstractFileSystem):
            raise TypeError(f"fs must be an fsspec filesystem, got {type(fs).__name__}")
        super().__init__(fs, **storage_options)
        self.faults = faults if faults is not None else Faults()
        self.requests: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.enabled = True
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._http_error = _http_error_for(fs)

    def __repr__(self) -> str:
        return f"<FaultFileSystem {self.faults} over {type(self.fs).__name__}>"

    # -- the faults ----------------------------------------------------------------------------

    def _choose(self, method: str, key: str) -> str | None:
        """The fault of this request (None: none), from the seed and how often it was made."""
        with self._lock:
            self.requests[method] += 1
            count = self._seen[key]
            self._seen[key] = count + 1
        if not self.enabled:
            return None
        u = _uniform(self.faults.seed, f"{key}|{count}", "fault")
        for name in _RATES:
            u -= getattr(self.faults, name)
            if u < 0:
                if name == "short_body" and method not in _READS:
                    return None
                if name == "reset_after" and method == "info":
                    return "reset_before"  # nothing to lose from a stat: the same to a caller
                return name
        return None

    def _delay(self, key: str) -> float:
        f = self.faults
        u = _uniform(f.seed, key, "tail")
        return float(min(f.tail_cap, f.tail_scale / (1.0 - u) ** (1.0 / f.tail_alpha)))

    def _do(self, method: str, key: str, call: Callable[[], T]) -> T:
        fault = self._choose(method, key)
        if fault is None:
            return call()
        with self._lock:
            self.injected[_LABELS.get(fault, fault)] += 1
        where = f"{method} {key.split('|', 1)[0]}"
        if fault == "error_rate":
            raise self._http_error(503, f"503 Service Unavailable (injected) on {where}", None)
        if fault == "throttle_rate":
            wait = self.faults.retry_after
            raise self._http_error(429, f"429 Too Many Requests (injected) on {where}", wait)
        if fault == "reset_before":
            raise ConnectionResetError(
                errno.ECONNRESET, f"Connection reset by peer (injected before {where} was sent)"
            )
        if fault == "slow_tail":
            time.sleep(self._delay(key))
            return call()
        result = call()
        if fault == "short_body":
            size = len(result) if isinstance(result, bytes | bytearray | memoryview) else 0
            raise ShortBodyError(
                f"Response payload is not completed (injected): {size // 2} of {size} bytes "
                f"of {where}"
            )
        raise ConnectionResetError(
            errno.ECONNRESET, f"Connection reset by peer (injected after {where} was served)"
        )

    def _send(self, name: str, path: str, call: Callable[[], T], *, sent: int = 0) -> T:
        """A request with its fault, if it draws one."""
        return self._do(name, f"{path}|{name}", call)

    def _read(
        self, path: str, start: int | None, end: int | None, call: Callable[[], bytes]
    ) -> bytes:
        """A read with its fault, drawn per byte range."""
        data: bytes = self._do("cat_file", f"{path}|cat_file|{start}|{end}", call)
        return data

    # -- requests of their own here (fsspec's defaults make them of info, find and open) -------

    def size(self, path: str) -> Any:
        """One request."""
        return self._forward("size", path)

    def du(self, path: str, total: bool = True, maxdepth: int | None = None,
           withdirs: bool = False, **kwargs: Any) -> Any:  # fmt: skip
        """One request."""
        return self._forward("du", path, total=total, maxdepth=maxdepth, withdirs=withdirs,
                             **kwargs)  # fmt: skip

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        """One upload from a local file."""
        target = self._strip_protocol(rpath)
        self._send("put_file", target, lambda: self.fs.put_file(lpath, target, **kwargs))

    def link(self, src: str, dst: str, **kwargs: Any) -> None:
        """One request: a hard link (local targets), refused if ``dst`` exists."""
        source, target = self._strip_protocol(src), self._strip_protocol(dst)
        self._send("link", target, lambda: _link(self.fs, source, target, **kwargs))


_LABELS = {"error_rate": "503", "throttle_rate": "429"}


def _link(fs: Any, src: str, dst: str, **kwargs: Any) -> None:
    link = getattr(fs, "link", None)
    if link is not None:
        link(src, dst, **kwargs)
    else:
        os.link(src, dst)


def _http_error_for(fs: Any) -> Callable[[int, str, float | None], Exception]:
    """How the target's client reports an HTTP error answer: gcsfs' ``HttpError`` over gcsfs,
    else :class:`InjectedHTTPError`."""
    inner = fs
    for _ in range(8):
        if type(inner).__module__.startswith("gcsfs"):
            from gcsfs.retry import HttpError  # type: ignore[import-untyped]

            def gcs(status: int, message: str, retry_after: float | None) -> Exception:
                err: Exception = HttpError({"code": status, "message": message})
                return err

            return gcs
        if not hasattr(inner, "fs"):
            break
        inner = inner.fs
    return InjectedHTTPError


def faulty_store(
    root: str | os.PathLike[str] | Store,
    *,
    seed: int = 0,
    error_rate: float = 0.0,
    throttle_rate: float = 0.0,
    reset_before: float = 0.0,
    reset_after: float = 0.0,
    short_body: float = 0.0,
    slow_tail: float = 0.0,
    retry: RetryPolicy | None = None,
    **settings: Any,
) -> FsspecStore:
    """A store over ``root`` whose requests fail as a remote bucket's do, seeded.

    Parameters
    ----------
    root : str, PathLike or Store
        A local directory, an fsspec URL (``memory://snaps``), or a :class:`LocalStore` or
        :class:`FsspecStore` (a :func:`~snapstore.storage.simulate.simulated_store` too, for
        latency and faults at once). A WebHDFS store becomes a plain FsspecStore over its
        filesystem: its commits stay atomic, but a record found half-written is not waited on.
    seed, error_rate, throttle_rate, reset_before, reset_after, short_body, slow_tail
        As for :class:`Faults`.
    retry : RetryPolicy, optional
        How the store retries what fails; default: the wrapped store's policy (an
        :class:`FsspecStore`'s), else ``RetryPolicy()``.
    **settings
        The other fields of :class:`Faults` (``retry_after``, ``tail_scale``, ``tail_alpha``,
        ``tail_cap``).

    Returns
    -------
    FsspecStore
        Its ``fs`` is the :class:`FaultFileSystem` (``fs.injected`` counts the faults; set
        ``fs.enabled = False`` to stop them); its ``url`` is ``faults://`` and the root's URL.

    Raises
    ------
    ValueError
        If a setting is out of range.
    TypeError
        If ``root`` is a Store of another kind, or a setting is unknown.

    Examples
    --------
    >>> store = faulty_store("/data/snaps", seed=7, error_rate=0.05)    # doctest: +SKIP
    >>> snap = snapstore.open(fingerprint, root=store)                  # doctest: +SKIP
    """
    faults = Faults(
        seed=seed, error_rate=error_rate, throttle_rate=throttle_rate, reset_before=reset_before,
        reset_after=reset_after, short_body=short_body, slow_tail=slow_tail, **settings,
    )  # fmt: skip
    inner = open_store(root)
    if isinstance(inner, LocalStore):
        target: Any = fsspec.filesystem("file")
        path = inner.root.as_posix()
    elif isinstance(inner, FsspecStore):
        target, path = inner.fs, inner.root
        retry = retry if retry is not None else inner.retry
    else:
        raise TypeError(
            f"faulty_store wraps a LocalStore or an FsspecStore, got a {type(inner).__name__}; "
            "pass its root path or URL instead"
        )
    store = FsspecStore(FaultFileSystem(target, faults), path, retry=retry)
    store.url = f"faults://{inner.url}"
    return store
