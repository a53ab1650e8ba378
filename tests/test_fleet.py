"""The fleet simulator: its bucket, its determinism, and that its readers form the real
Prefetcher's requests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from snapstore.format.plan import EpochPlan, PlanOptions
from snapstore.read.fleet import FleetOptions, simulate_fleet, synthetic_index
from snapstore.read.prefetch import Prefetcher, PrefetchLimits
from snapstore.read.requests import RequestShape, form_requests
from snapstore.storage.bucket import BucketLimits, TokenBucket


def test_token_bucket_serves_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(BucketLimits(rate=10.0, burst=1.0, doubling=math.inf))
    assert sum(bucket.take(0.0) for _ in range(20)) == 10
    assert sum(bucket.take(1.0) for _ in range(20)) == 10  # refilled at 10/s
    assert bucket.throttled == 20


def test_token_bucket_ramps_up() -> None:
    limits = BucketLimits(rate=5000.0, doubling=1200.0)
    bucket = TokenBucket(limits)
    assert bucket.rate(0.0) == 5000.0
    assert bucket.rate(1200.0) == pytest.approx(10000.0)
    assert bucket.allowed(0.0, 60.0) > 5000.0 * 60
    assert TokenBucket(BucketLimits(rate=None)).take(0.0)


def test_bucket_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="rate"):
        BucketLimits(rate=0.0)
    with pytest.raises(ValueError, match="errors"):
        BucketLimits(errors=1.5)


def _small(**kw: Any) -> FleetOptions:
    base: dict[str, Any] = dict(hosts=4, per_host=2, duration=5.0, limits=BucketLimits(rate=50.0))
    return FleetOptions(**{**base, **kw})


def test_simulation_is_deterministic_for_a_seed() -> None:
    index = synthetic_index(4096)
    options = _small(limits=BucketLimits(rate=50.0, errors=0.05))
    a, b = simulate_fleet(options, *index), simulate_fleet(options, *index)
    assert np.array_equal(a.first_batch, b.first_batch, equal_nan=True)
    assert (a.requests, a.throttled, a.errors, a.bytes_read) == (
        b.requests,
        b.throttled,
        b.errors,
        b.bytes_read,
    )


def test_shared_metadata_is_three_requests_per_host() -> None:
    index = synthetic_index(4096)
    shared = simulate_fleet(_small(limits=BucketLimits(rate=None)), *index)
    alone = simulate_fleet(_small(limits=BucketLimits(rate=None), share_metadata=False), *index)
    assert shared.metadata_per_host == 3
    assert alone.metadata_per_host == 3 * 2


def test_a_limited_bucket_throttles_and_the_readers_go_on() -> None:
    index = synthetic_index(4096)
    result = simulate_fleet(_small(), *index)
    assert result.throttled > 0
    assert np.isfinite(result.first_batch).all()


def test_simulated_requests_are_the_prefetchers() -> None:
    """The Prefetcher forms its requests with form_requests: the same plan gives the same
    ranges in both (what the simulator relies on)."""
    index, offsets, paths = synthetic_index(512, block_bytes=4096, rows=8, per_shard=64)
    plan = EpochPlan(None, offsets=offsets, epoch=0, rank=1, world_size=3,
                     options=PlanOptions(window_blocks=16))  # fmt: skip
    seen: list[tuple[str, int, int]] = []

    def fetch(path: str, start: int, length: int) -> bytes:
        seen.append((path, start, length))
        return bytes(length)

    limits = PrefetchLimits(1 << 30, max_requests=1, initial_requests=1, max_request_bytes=16384)
    prefetcher = Prefetcher(
        plan.chunks(),
        locate=lambda i: np.searchsorted(offsets, i, side="right") - 1,
        index=index,
        paths=paths,
        fetch=fetch,
        decode=lambda b, data: b,
        limits=limits,
    )
    for _ in prefetcher:
        pass
    expected = []
    shape = RequestShape(16384)
    for number, chunk in enumerate(plan.chunks()):
        blocks = np.unique(np.searchsorted(offsets, chunk, side="right") - 1)
        order = [int(b) for b in blocks]
        expected += [(r.path, r.start, r.length)
                     for r in form_requests(order, number, index, paths, shape)]  # fmt: skip
    assert sorted(seen) == sorted(expected)
