"""A bucket's request-rate limit as a pure model: a token bucket whose rate ramps up with time.

Object stores limit the requests one bucket (or prefix) serves per second and answer beyond it
with HTTP 429 (GCS) or 503 SlowDown (S3), with a ``Retry-After`` hint. The figures behind the
defaults:

- GCS: a new bucket serves about 5,000 object reads per second and raises that as traffic
  grows, doubling at most every 20 minutes (Cloud Storage's request-rate guidelines);
- S3: about 5,500 GET/HEAD per second per prefix.

:class:`TokenBucket` holds ``burst`` seconds' worth of tokens, refilled at
``rate * 2 ** (t / doubling)`` per second; a request takes a token or is throttled. The ramp is
the most the store allows (it assumes the traffic keeps pushing), so it flatters a crowd over
the first minute by under 4 %. The fleet simulator (:mod:`snapstore.read.fleet`) runs its
buckets with it, in virtual time: nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BucketLimits", "TokenBucket"]


@dataclass(frozen=True)
class BucketLimits:
    """What a simulated bucket allows.

    Parameters
    ----------
    rate : float or None
        Requests per second when the run starts (GCS: 5,000 reads/s); None: unlimited.
    doubling : float
        Seconds for the rate to double (GCS: 20 minutes at the fastest); ``inf``: flat (S3).
    burst : float
        Seconds of ``rate`` the bucket may serve at once after being idle.
    retry_after : float
        Seconds a 429 asks the client to wait (``Retry-After``).
    errors : float
        Share of admitted requests answered 503 anyway (0 to 1).
    latency : float
        Seconds to the first byte of every answer (50 ms: a bucket in the VM's region).
    host_bandwidth : float
        Bytes per second into one host (1 Gb/s: 125e6).
    """

    rate: float | None = 5000.0
    doubling: float = 1200.0
    burst: float = 1.0
    retry_after: float = 1.0
    errors: float = 0.0
    latency: float = 0.05
    host_bandwidth: float = 125e6

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError(
                f"BucketLimits.rate: expected requests/s > 0 or None, found {self.rate}"
            )
        if not 0.0 <= self.errors < 1.0:
            raise ValueError(
                f"BucketLimits.errors: expected a share in [0, 1), found {self.errors}"
            )
        for name in ("doubling", "burst", "latency", "host_bandwidth"):
            if not getattr(self, name) > 0:
                raise ValueError(f"BucketLimits.{name}: expected > 0, found {getattr(self, name)}")


class TokenBucket:
    """The request-rate limit of :class:`BucketLimits`, in virtual time (pure: times are given).

    Examples
    --------
    >>> bucket = TokenBucket(BucketLimits(rate=2.0, burst=1.0))
    >>> [bucket.take(0.0), bucket.take(0.0), bucket.take(0.0), bucket.take(0.5)]
    [True, True, False, True]
    """

    def __init__(self, limits: BucketLimits) -> None:
        self.limits = limits
        self._tokens = 0.0 if limits.rate is None else limits.rate * limits.burst
        self._last = 0.0
        self.admitted = 0
        self.throttled = 0

    def rate(self, now: float) -> float:
        """Requests per second allowed at ``now`` (``inf`` when unlimited)."""
        if self.limits.rate is None:
            return math.inf
        return float(self.limits.rate * 2.0 ** (now / self.limits.doubling))

    def allowed(self, start: float, end: float) -> float:
        """Requests the ramp allows from ``start`` to ``end`` (its integral, burst left out)."""
        if self.limits.rate is None:
            return math.inf
        k = math.log(2.0) / self.limits.doubling
        if k == 0.0:  # a flat rate (doubling = inf: S3)
            return self.limits.rate * (end - start)
        return self.limits.rate * (math.exp(k * end) - math.exp(k * start)) / k

    def take(self, now: float) -> bool:
        """Whether a request arriving at ``now`` is served (False: 429); times never go back."""
        if self.limits.rate is None:
            self.admitted += 1
            return True
        if now > self._last:
            cap = self.rate(now) * self.limits.burst
            self._tokens = min(cap, self._tokens + self.allowed(self._last, now))
            self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            self.admitted += 1
            return True
        self.throttled += 1
        return False
