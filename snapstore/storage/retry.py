"""Which storage failures are worth retrying, and how long to wait between tries.

:func:`classify` sorts an exception from an fsspec driver (gcsfs, s3fs, aiohttp, botocore,
requests, WebHDFS' RemoteException, plain ``OSError``) into transient (timeouts, resets, HTTP
408/429/5xx, a NameNode in safe mode: try again) or a permanent kind (permission, credentials,
missing bucket, quota, no space: report at once); :class:`RetryPolicy` says how many times,
how long to wait between tries, and how long one operation may take in all (its ``timeout``:
see :mod:`snapstore.storage.deadline` for how it is kept).
"""

from __future__ import annotations

import errno
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any

from ..errors import StoreError

__all__ = [
    "DEFAULT_STORE_TIMEOUT",
    "KIND_ERRNOS",
    "KIND_HINTS",
    "STORE_TIMEOUT_ENV",
    "RetryBudget",
    "RetryPolicy",
    "classify_failure",
    "http_status",
    "is_throttled",
    "is_timeout",
    "no_such_bucket",
    "retry_after",
    "vanished_error",
]


# s3fs turns 503 SlowDown and 409 OperationAborted into EBUSY, 500 InternalError into EREMOTEIO.
_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in "ECONNRESET ECONNABORTED ECONNREFUSED ETIMEDOUT EPIPE EAGAIN EBUSY EREMOTEIO "  # noqa: SIM905
    "ENETDOWN ENETUNREACH ENETRESET EHOSTUNREACH EHOSTDOWN".split()
    if hasattr(errno, name)
)
# Foreign exceptions by qualified class name (in the MRO): no import of aiohttp, botocore...
_TRANSIENT_TYPES = {
    "aiohttp.client_exceptions.ClientConnectionError",  # resets, disconnects, socket timeouts
    "aiohttp.client_exceptions.ClientPayloadError",  # a body cut short
    "botocore.exceptions.HTTPClientError",  # read and connect timeouts, closed connections
    "botocore.exceptions.ConnectionError",  # endpoint unreachable
    "requests.exceptions.ConnectionError",
    "requests.exceptions.Timeout",
    "requests.exceptions.ChunkedEncodingError",
    "gcsfs.retry.ChecksumError",  # a download garbled on the way: fetch it again
}
# Failures that mean "no answer in time" (a subset of the transient ones). asyncio's, aiohttp's
# ServerTimeoutError and fsspec's FSTimeoutError are builtin TimeoutErrors.
_TIMEOUT_TYPES = {
    "botocore.exceptions.ReadTimeoutError",
    "botocore.exceptions.ConnectTimeoutError",
    "requests.exceptions.Timeout",  # ReadTimeout, ConnectTimeout
    "urllib3.exceptions.TimeoutError",
}
_CREDENTIAL_TYPES = {
    "botocore.exceptions.NoCredentialsError",
    "botocore.exceptions.PartialCredentialsError",
    "botocore.exceptions.CredentialRetrievalError",
    "google.auth.exceptions.DefaultCredentialsError",
    "google.auth.exceptions.RefreshError",
}
KIND_HINTS = {
    "permission": "check that the credentials grant access to it (on a bucket: reading, "
    "writing, listing and deleting objects)",
    "credentials": "check the credentials: the storage options (token=..., key=/secret=...) "
    "or the environment (GOOGLE_APPLICATION_CREDENTIALS, AWS_PROFILE, AWS_ACCESS_KEY_ID)",
    "bucket": "the bucket does not exist, or these credentials cannot see it; check the bucket "
    "name in the URL, or create the bucket",
    "location": "the location does not exist; check the URL",
    "transient": "the store did not answer; check the network and the endpoint, or try again",
    "quota": "a quota of the directory is exhausted (names or space); check the quotas above "
    "it (hdfs dfs -count -q -h PATH), then free space or ask for a larger quota",
    "permanent": "check that the store is reachable and writable",
}
# WebHDFS (and HttpFS) name the NameNode's Java exception in their error JSON;
# snapstore.storage.webhdfs raises it as an OSError carrying ``remote_exception``. Safe mode (a
# NameNode starting up), a standby NameNode and RetriableException pass, or may pass, with time: try
# again.
_REMOTE_KINDS = {
    "SafeModeException": "transient",
    "RetriableException": "transient",
    "StandbyException": "transient",
    "AccessControlException": "permission",
    "SecurityException": "permission",
    "AuthorizationException": "permission",
    "FileNotFoundException": "missing",
    "FileAlreadyExistsException": "exists",
    "AlreadyBeingCreatedException": "exists",  # the other creator is still writing it
    "RecoveryInProgressException": "exists",  # ... or died, and its lease is being recovered
    "NSQuotaExceededException": "quota",
    "DSQuotaExceededException": "quota",
    "QuotaExceededException": "quota",
}
# The prefetcher does not retry an error whose errno says "missing" or "access denied".
KIND_ERRNOS = {"permission": errno.EACCES, "credentials": errno.EACCES, "bucket": errno.ENOENT,
                "location": errno.ENOENT, "transient": errno.ETIMEDOUT,
                "quota": errno.EDQUOT}  # fmt: skip


def http_status(exc: BaseException, names: set[str]) -> int | None:
    """The HTTP status a driver's exception carries, if it is one that carries one."""
    if "gcsfs.retry.HttpError" in names:
        code = getattr(exc, "code", None)
    elif "aiohttp.client_exceptions.ClientResponseError" in names:
        code = getattr(exc, "status", None)
    elif "botocore.exceptions.ClientError" in names:
        response = getattr(exc, "response", None) or {}
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    elif "requests.exceptions.HTTPError" in names:  # WebHDFS: an error without RemoteException
        code = getattr(getattr(exc, "response", None), "status_code", None)
    elif "snapstore.storage.faults.InjectedHTTPError" in names:  # the fault-injecting wrapper
        code = getattr(exc, "status", None)
    else:
        return None
    return int(code) if isinstance(code, int | str) and str(code).isdigit() else None


def classify_failure(exc: BaseException) -> str | None:
    """What a failure means: ``missing``, ``exists``, ``transient``, ``permission``,
    ``credentials``, ``quota`` or ``permanent``; None for an exception that is not a storage
    failure (a bad argument, a bug), which passes through unchanged."""
    if isinstance(exc, StoreError):
        return None  # translated already
    remote = getattr(exc, "remote_exception", None)
    if remote in _REMOTE_KINDS:
        return _REMOTE_KINDS[remote]
    names = {f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__}
    status = http_status(exc, names)
    if status is not None:
        if status in (408, 429) or status >= 500:
            return "transient"
        return {401: "credentials", 403: "permission", 404: "missing"}.get(status, "permanent")
    if names & _CREDENTIAL_TYPES:
        return "credentials"
    if names & _TRANSIENT_TYPES:
        return "transient"
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return "missing"
    if isinstance(exc, FileExistsError):
        return "exists"
    if isinstance(exc, PermissionError):
        return "permission"
    if isinstance(exc, TimeoutError | ConnectionError):
        return "transient"
    if isinstance(exc, OSError):
        if exc.errno in _TRANSIENT_ERRNOS:
            return "transient"
        if exc.errno in (errno.EACCES, errno.EPERM) or str(exc).startswith("Forbidden"):
            return "permission"  # gcsfs raises a plain OSError("Forbidden: ...") for a 403
        return "permanent"
    return None


def is_timeout(exc: BaseException) -> bool:
    """Whether a failure says that the store did not answer in time (connect or read timeout)."""
    if isinstance(exc, TimeoutError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT:
        return True
    names = {f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__}
    return bool(names & _TIMEOUT_TYPES)


# What the drivers say when a bucket throttles: gcsfs raises HttpError(code=429 or 503) once its
# own retries (6) are spent; s3fs turns "SlowDown" and 503 into OSError(EBUSY).
_THROTTLE_STATUSES = (429, 503)
_THROTTLE_WORDS = ("SlowDown", "Too Many Requests", "TooManyRequests", "rateLimitExceeded")


def is_throttled(exc: BaseException) -> bool:
    """Whether a failure (or one it was raised from) says the store throttles: HTTP 429 or 503,
    S3's SlowDown, or our :class:`~snapstore.errors.StoreError` translated from one of them."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "throttled", False):
            return True
        names = {f"{k.__module__}.{k.__qualname__}" for k in type(current).__mro__}
        if http_status(current, names) in _THROTTLE_STATUSES:
            return True
        if isinstance(current, OSError) and current.errno == errno.EBUSY:
            return True
        if any(word in str(current) for word in _THROTTLE_WORDS):
            return True
        current = current.__cause__ or current.__context__
    return False


def no_such_bucket(exc: BaseException) -> bool:
    """Whether a "not found" is about the bucket (s3fs says so; gcsfs cannot tell)."""
    text = f"{exc} {exc.__cause__}"
    return "NoSuchBucket" in text or "specified bucket does not exist" in text


def _seconds(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if isinstance(value, str | bytes):
        text = value.decode() if isinstance(value, bytes) else value
        try:
            return _seconds(float(text.strip()))
        except ValueError:
            return None  # an HTTP date: rare from buckets, and the backoff covers it
    return None


def retry_after(exc: BaseException) -> float | None:
    """The seconds a failure (or one it was raised from) asks the client to wait before trying
    again: its ``retry_after``, or the ``Retry-After`` header of the answer it carries
    (aiohttp's ``headers``, botocore's ``ResponseMetadata.HTTPHeaders``, requests'
    ``response.headers``); None when it says nothing."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        value = _seconds(getattr(current, "retry_after", None))
        if value is not None:
            return value
        response = getattr(current, "response", None)
        metadata = response.get("ResponseMetadata", {}) if isinstance(response, dict) else {}
        candidates: list[Any] = [
            getattr(current, "headers", None),
            getattr(response, "headers", None),
            metadata.get("HTTPHeaders"),
        ]
        for headers in candidates:
            if headers is not None and hasattr(headers, "get"):
                value = _seconds(headers.get("Retry-After") or headers.get("retry-after"))
                if value is not None:
                    return value
        current = current.__cause__ or current.__context__
    return None


class RetryBudget:
    """Tokens that retries spend and successes earn back: a store's retry budget.

    A retry takes ``cost`` tokens (twice that after a timeout, which holds a connection the
    longest) and is refused when the tokens left are fewer; every answered request puts back
    ``refill``, up to ``capacity``. So a store that answers gets at most ``capacity / cost``
    retries in a burst and, once that is spent, about one retry per ``cost / refill`` answered
    requests: thousands of readers meeting one bad minute do not multiply its load by their
    attempts, and none retries for ever. The scheme is the AWS SDKs' "standard" retry quota
    (500 tokens, 5 a retry, 10 a timeout) and gRPC's retry throttling (a token ratio of 0.1),
    in units of retries. Plain attributes, no lock: exact enough under threads, and a store
    holding one pickles (each process then spends its own).
    """

    def __init__(self, capacity: float, cost: float = 1.0, refill: float = 0.1) -> None:
        self.capacity = float(capacity)
        self.cost = float(cost)
        self.refill = float(refill)
        self.tokens = self.capacity
        self.spent = 0  # retries taken from it
        self.refused = 0  # retries it refused

    def __repr__(self) -> str:
        return f"<RetryBudget {self.tokens:g} of {self.capacity:g} tokens>"

    def withdraw(self, timeout: bool = False) -> bool:
        """Take a retry's tokens; False (nothing taken) when too few are left."""
        cost = self.cost * (2 if timeout else 1)
        if self.tokens < cost:
            self.refused += 1
            return False
        self.tokens -= cost
        self.spent += 1
        return True

    def deposit(self) -> None:
        """A request was answered: put ``refill`` back."""
        if self.tokens < self.capacity:
            self.tokens = min(self.capacity, self.tokens + self.refill)


STORE_TIMEOUT_ENV = "SNAPSTORE_STORE_TIMEOUT"
"""The environment variable that sets :attr:`RetryPolicy.timeout` where none is given: seconds
(``30``, ``120.5``), or ``none`` to wait without end."""

# About a minute: a bucket answers in milliseconds and its clients' own retries of a 429 or 5xx
# take seconds, so a store silent this long is unreachable (a firewall dropping packets, a
# wrong port behind a proxy), and a training job learns it while someone still watches it.
DEFAULT_STORE_TIMEOUT = 60.0


def _finite_seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _timeout_from_env() -> float | None:
    """``$SNAPSTORE_STORE_TIMEOUT`` in seconds (None for ``none``), else the default of 60.

    Raises
    ------
    ValueError
        If the variable holds neither a number of seconds > 0 nor ``none``.
    """
    text = os.environ.get(STORE_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_STORE_TIMEOUT
    if text.lower() == "none":
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(
            f"{STORE_TIMEOUT_ENV}={text!r}: expected the seconds one store operation may take "
            "(e.g. 60 or 120.5), or 'none' to wait without end"
        )
    return seconds


@dataclass(frozen=True)
class RetryPolicy:
    """How :class:`FsspecStore` retries a transient failure, and how long one operation may take.

    Retries use bounded exponential backoff with full jitter. Before retry ``k`` (1, 2, ...) it
    sleeps a uniformly random time in ``[0, min(cap, base * 2**(k - 1))]``, so that clients
    retrying after one hiccup spread out; with the defaults all retries together wait at most
    0.05 + 0.1 + 0.2 = 0.35 s.

    An answer that says how long to wait (HTTP 429 or 503 with ``Retry-After``) is obeyed: the
    wait is at least the hint (plus the jitter, so that throttled clients do not all come back
    in the same instant). Retries are also bounded by the store's retry budget (``budget``,
    ``refill``; see :class:`RetryBudget`). An operation that gives up raises
    :class:`~snapstore.errors.StoreError` naming the store's URL, the operation, the tries, why
    it stopped (the attempts, the budget or a hint past the deadline) and the last answer.

    Every operation (a read, a listing, an upload, a commit), its retries included, ends within
    ``timeout`` seconds: a store that does not answer raises
    :class:`~snapstore.errors.StoreTimeoutError` naming the URL, the endpoint, the operation and
    the seconds waited. The clients' own connect and read timeouts are derived from it when the
    store is opened (see :mod:`snapstore.storage.deadline`); a transfer gets at least the time to
    move its bytes at 1 MiB/s (a 256 MiB shard: 256 s), so that an upload over a slow link is not
    cut.

    Parameters
    ----------
    attempts : int
        Tries in all, the first included; 1 turns retries off. 4, because gcsfs and s3fs retry
        HTTP 429 and 5xx themselves (6 and 5 times, over seconds): this layer catches what they
        let through (a reset mid-body, a timeout of fsspec's event loop) and should not
        multiply their waits.
    base : float
        Seconds (at most) before the first retry: 0.05, about a round trip to a bucket nearby.
    cap : float
        The most seconds one wait can take: 2.
    timeout : float or None
        The most seconds one operation may wait for the store, its retries included; None waits
        without end. Default: ``$SNAPSTORE_STORE_TIMEOUT`` (seconds, or ``none``), else 60 (see
        :data:`DEFAULT_STORE_TIMEOUT`). Read when the policy is made, so a policy carried to a
        worker process keeps its parent's value.
    budget : float or None
        The store's retry budget (:class:`RetryBudget`), in retries: 100 may be taken in a
        burst, then one for every ``1 / refill`` answered requests; None: no budget (only
        ``attempts`` bound the retries). One per store object: a job's store, a reader's copy
        in each worker process.
    refill : float
        Tokens (retries) an answered request puts back in the budget: 0.1, so that retries
        may go on at a tenth of the requests (a store failing 5% of requests needs about 5%).
    max_retry_after : float
        The most seconds a ``Retry-After`` hint is obeyed for (30): a hint longer than that,
        or than the deadline leaves, ends the operation with an error naming it.

    Raises
    ------
    ValueError
        If a setting is out of range (or ``$SNAPSTORE_STORE_TIMEOUT`` is not a number of
        seconds > 0 or ``none``).

    Examples
    --------
    >>> store = snapstore.open_store("gs://bucket/snaps", retry=RetryPolicy(timeout=300))
    ... # doctest: +SKIP
    """

    attempts: int = 4
    base: float = 0.05
    cap: float = 2.0
    timeout: float | None = field(default_factory=_timeout_from_env)
    budget: float | None = 100.0
    refill: float = 0.1
    max_retry_after: float = 30.0

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 1:
            raise ValueError(f"attempts must be an integer >= 1, got {self.attempts!r}")
        for name in ("base", "cap"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        for name in ("refill", "max_retry_after"):
            if not (_finite_seconds(getattr(self, name)) and getattr(self, name) >= 0):
                value = getattr(self, name)
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.budget is not None and not (_finite_seconds(self.budget) and self.budget >= 0):
            raise ValueError(
                f"budget must be a finite number of retries >= 0 (or None: no budget), got "
                f"{self.budget!r}"
            )
        if self.timeout is not None and not (_finite_seconds(self.timeout) and self.timeout > 0):
            raise ValueError(
                f"timeout must be a finite number of seconds > 0 (or None: no deadline), got "
                f"{self.timeout!r}"
            )

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first)."""
        return random.uniform(0.0, min(self.cap, self.base * 2.0 ** (retry - 1)))

    def delay(self, retry: int, exc: BaseException) -> float:
        """Seconds to wait before retry number ``retry`` after ``exc``: the backoff, or the
        answer's ``Retry-After`` plus the backoff's jitter if it asks for longer (up to
        ``max_retry_after``; a longer hint is returned as it is, for the caller to refuse)."""
        wait = self.backoff(retry)
        hint = retry_after(exc)
        return wait if hint is None else max(wait, hint + random.uniform(0.0, self.base))

    def new_budget(self) -> RetryBudget | None:
        """A fresh :class:`RetryBudget` for a store (None without one)."""
        return None if self.budget is None else RetryBudget(self.budget, 1.0, self.refill)


def vanished_error(url: str, exists: BaseException | None = None,
                   missing: BaseException | None = None) -> StoreError:  # fmt: skip
    """The error of a commit whose target vanished each time it was found to exist; the
    last answers of the create (``exists``) and of the read (``missing``), when known."""
    answers = ""
    if exists is not None and missing is not None:
        answers = f" (last, the create: {_chain(exists)}; the read: {_chain(missing)})"
    return StoreError(
        f"cannot commit {url}: it vanished each time it was found to exist{answers}; check "
        "what else removes files in this store"
    )


def _chain(exc: BaseException) -> str:
    """``exc`` and what it was raised from, for an error message."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < 4:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " <- ".join(parts)
