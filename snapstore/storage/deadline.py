"""Deadlines for store requests: nothing waits for a store without end.

A store that accepts connections but never answers (a firewall dropping packets, a wrong port
behind a proxy) is bounded in layers, the first two as users of gcsfs and s3fs expect:

1. **The client's own timeouts**, set by :func:`client_options` when a store is opened, from
   the policy's ``timeout`` T (:class:`~snapstore.storage.retry.RetryPolicy`): one request waits
   at most T/6 to connect and T/2 for each answer (10 s and 30 s by default). gcsfs gets
   ``requests_timeout=aiohttp.ClientTimeout(sock_connect=..., sock_read=...)`` (its default,
   None, waits forever; a plain number would be a *total* per request and cut long uploads),
   s3fs ``config_kwargs`` ``connect_timeout`` and ``read_timeout`` (botocore's 60 s each), WebHDFS
   ``timeout=(connect, read)`` on every ``requests`` call. Options given explicitly win; the
   clients' own retries are left as they are.
2. **A total budget per operation**, kept by
   :class:`~snapstore.storage.fsspec_store.FsspecStore` through :class:`Deadline` and
   :func:`call_with_deadline`: no retry starts once it is spent, and each try runs on a helper
   thread that is left behind when the budget runs out (reads, stats and listings of gcsfs and
   s3fs, the frequent calls, run their coroutine on the driver's event loop instead, through
   :func:`await_with_deadline`, and are cancelled there: no thread hop, nothing left running).
   A transfer gets at least the time to
   move its bytes at :data:`SLOWEST_RATE` (a 256 MiB shard: 256 s). That ends what no client
   timeout covers: an upload to a server that stopped reading (aiohttp has no write timeout),
   gcsfs' six tries of one request (over two minutes at 30 s each), a hung event loop. A try
   left behind ends on its client's timeout; its thread is a daemon and never holds up the
   interpreter's exit.
3. **Silence** (:class:`Silence`): once one operation of a store ran out of its deadline, the
   operations in flight stop waiting and those that follow within a short window (a sixth of
   the deadline) fail at once; any answer from the store ends it. Otherwise each would wait a
   deadline of its own: a failed job's clean-up (its run, its claim), a heartbeat, the
   prefetcher's retries would turn one minute into several.

Each way the caller gets :class:`~snapstore.errors.StoreTimeoutError` naming the URL, the
endpoint, the operation and the seconds waited.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "SLOWEST_RATE",
    "Deadline",
    "Silence",
    "TryAbandoned",
    "await_with_deadline",
    "call_with_deadline",
    "client_options",
    "client_timeouts",
    "endpoint_of",
]

T = TypeVar("T")

# Bytes per second below which a transfer counts as not answering: 1 MiB/s (8 Mbit/s), a
# hundredth of a cloud VM's bandwidth to its buckets and below any office link. Without it a
# 256 MiB shard over a slow link would be cut at 60 s and retried without end.
SLOWEST_RATE = 1 << 20
# Where a URL names no endpoint, the service its client talks to by default.
_DEFAULT_ENDPOINTS = {
    "gs": "https://storage.googleapis.com",
    "gcs": "https://storage.googleapis.com",
    "s3": "https://s3.amazonaws.com (the bucket's region)",
    "s3a": "https://s3.amazonaws.com (the bucket's region)",
}


class TryAbandoned(TimeoutError):
    """A try that :func:`call_with_deadline` stopped waiting for (internal: the store turns
    it into :class:`~snapstore.errors.StoreTimeoutError`)."""


class Deadline:
    """The budget of one store operation from now: ``timeout`` seconds, or the time to move
    its ``nbytes`` at :data:`SLOWEST_RATE` if longer (None: no end)."""

    def __init__(self, timeout: float | None, nbytes: int = 0) -> None:
        self.timeout = timeout
        self.nbytes = nbytes
        self.started = time.monotonic()
        self.limit = None if timeout is None else max(timeout, nbytes / SLOWEST_RATE)
        self._end = None if self.limit is None else self.started + self.limit

    def describe(self) -> str:
        """The budget in words: ``"the deadline is 60 s"``, with the transfer's allowance."""
        if self.limit is None or self.timeout is None:
            return "no deadline"
        text = f"the deadline is {self.timeout:g} s"
        if self.limit > self.timeout:
            text += f"; {self.limit:.0f} s to move {self.nbytes / (1 << 20):.0f} MiB at 1 MiB/s"
        return text

    def elapsed(self) -> float:
        """Seconds since the operation started."""
        return time.monotonic() - self.started

    def remaining(self) -> float | None:
        """Seconds left (0 once spent), or None without a deadline."""
        return None if self._end is None else max(0.0, self._end - time.monotonic())

    def allows(self, wait: float) -> bool:
        """Whether a retry after sleeping ``wait`` seconds starts within the budget."""
        left = self.remaining()
        return left is None or left > wait


class Silence:
    """When a store last let an operation run out of its deadline (see the module docstring).

    Plain attributes, no lock (a float is assigned atomically): a store holding one pickles.
    """

    def __init__(self) -> None:
        self.at: float | None = None  # time.monotonic() of the last operation without an answer
        self.waited = 0.0  # how long that operation waited

    def mark(self, waited: float) -> None:
        """An operation got no answer in ``waited`` seconds, its deadline."""
        self.waited = waited
        self.at = time.monotonic()

    def clear(self) -> None:
        """The store answered."""
        self.at = None

    def recent(self, timeout: float | None) -> float | None:
        """Seconds since the store last left an operation unanswered, if within a sixth of
        ``timeout`` (the window in which later operations fail at once); else None."""
        at = self.at
        if at is None or timeout is None:
            return None
        ago = time.monotonic() - at
        return ago if ago < timeout / 6 else None

    def since(self, start: float) -> bool:
        """Whether an operation went unanswered after ``start`` (one in flight stops waiting)."""
        at = self.at
        return at is not None and at >= start


# How often a waiting call looks whether another operation of its store went unanswered.
_POLL_SECONDS = 0.5


def call_with_deadline(
    fn: Callable[[], T], seconds: float | None, stop: Callable[[], bool] | None = None
) -> T:
    """``fn()``, or :class:`TryAbandoned` once ``seconds`` have passed without its answer, or
    once ``stop()`` says to stop waiting (checked twice a second).

    ``fn`` runs on a daemon thread (with the caller's context variables); when it is abandoned
    it is left running and its result, or error, is dropped. With ``seconds`` None it runs on
    the calling thread.
    """
    if seconds is None:
        return fn()
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()
    context = contextvars.copy_context()

    def attempt() -> None:
        try:
            outcome.append((True, context.run(fn)))
        except BaseException as exc:  # handed to the waiting caller, which raises it
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=attempt, name="snapstore-store-call", daemon=True).start()
    end = time.monotonic() + seconds
    while not done.wait(max(0.0, min(_POLL_SECONDS, end - time.monotonic()))):
        if time.monotonic() >= end or (stop is not None and stop()):
            raise TryAbandoned(f"no answer in {seconds:.1f} s")
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def await_with_deadline(
    loop: asyncio.AbstractEventLoop,
    make: Callable[[], Coroutine[Any, Any, T]],
    seconds: float | None,
    stop: Callable[[], bool] | None = None,
) -> T:
    """The result of the coroutine ``make()`` run on ``loop`` (an async fsspec driver's, from
    another thread, as fsspec's ``sync`` runs it), or :class:`TryAbandoned` once ``seconds``
    have passed, or ``stop()`` says to stop waiting: the coroutine is then cancelled on its
    loop (its request closed), not left running."""
    future = asyncio.run_coroutine_threadsafe(make(), loop)
    end = None if seconds is None else time.monotonic() + seconds
    while True:
        left = _POLL_SECONDS if end is None else max(0.0, end - time.monotonic())
        done, _ = concurrent.futures.wait([future], timeout=min(_POLL_SECONDS, left))
        if done:
            return future.result()
        if (end is not None and time.monotonic() >= end) or (stop is not None and stop()):
            future.cancel()
            raise TryAbandoned(f"no answer in {seconds:.1f} s")


def client_timeouts(timeout: float) -> tuple[float, float]:
    """(connect, read) seconds for one request of a client under a budget of ``timeout``: a
    sixth and a half, so that a try that gets no answer ends on the client's own timeout (the
    request cancelled, its connection closed) and leaves time for a retry."""
    return timeout / 6, timeout / 2


def client_options(protocol: str, options: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """``options`` for the fsspec driver of ``protocol``, with its own connect and read timeouts
    set from ``timeout`` (see the module docstring) unless ``options`` sets them."""
    if timeout is None:
        return options
    connect, read = client_timeouts(timeout)
    options = dict(options)
    protocol = protocol.lower()
    if protocol in ("gs", "gcs") and options.get("requests_timeout") is None:
        import aiohttp  # gcsfs' HTTP client

        options["requests_timeout"] = aiohttp.ClientTimeout(sock_connect=connect, sock_read=read)
    elif protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", connect)
        config.setdefault("read_timeout", read)
        options["config_kwargs"] = config
    elif protocol in ("webhdfs", "swebhdfs") and options.get("timeout") is None:
        options["timeout"] = (connect, read)
    return options


def endpoint_of(fs: Any, protocol: str) -> str:
    """The service a filesystem sends its requests to, for messages: ``http://host:port``."""
    if protocol in ("webhdfs", "swebhdfs") and isinstance(getattr(fs, "url", None), str):
        return str(fs.url).split("/webhdfs/", 1)[0]
    location = getattr(fs, "_location", None)  # gcsfs: endpoint_url, the emulator or Google's
    if isinstance(location, str) and location:
        return location
    endpoint = getattr(fs, "endpoint_url", None) or (getattr(fs, "client_kwargs", None) or {}).get(
        "endpoint_url"
    )
    if isinstance(endpoint, str) and endpoint:
        return endpoint
    return _DEFAULT_ENDPOINTS.get(protocol, f"the {protocol}:// service")
