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
    """8 readers and 12 metadata requests at once against a bucket of 10 requests/s."""
    index = synthetic_index(4096)
    result = simulate_fleet(_small(limits=BucketLimits(rate=10.0), duration=10.0), *index)
    assert result.throttled > 0
    assert np.isfinite(result.first_batch).all()


def _prefetch(
    fetch: Any,
    limits: PrefetchLimits,
    window: int = 16,
    *,
    blocks: int = 256,
    rank: int = 0,
    world_size: int = 1,
    shuffle: bool = False,
) -> tuple[Prefetcher, EpochPlan, Any]:
    """A Prefetcher over a synthetic index of ``blocks`` blocks of 4 KiB (8 rows each, 64 a
    shard), reading consumer ``rank`` of ``world_size``'s plan; ``(prefetcher, plan, index)``."""
    index, offsets, paths = synthetic_index(blocks, block_bytes=4096, rows=8, per_shard=64)
    options = PlanOptions(shuffle=shuffle, window_blocks=window)
    plan = EpochPlan(
        None, offsets=offsets, epoch=0, rank=rank, world_size=world_size, options=options
    )
    prefetcher = Prefetcher(
        plan.chunks(),
        locate=lambda i: np.searchsorted(offsets, i, side="right") - 1,
        index=index,
        paths=paths,
        fetch=fetch,
        decode=lambda b, data: b,
        limits=limits,
    )
    return prefetcher, plan, index


def test_simulated_requests_are_the_prefetchers() -> None:
    """The Prefetcher forms its requests with form_requests: the same plan gives the same
    ranges in both (what the simulator relies on)."""
    seen: list[tuple[str, int, int]] = []

    def fetch(path: str, start: int, length: int) -> bytes:
        seen.append((path, start, length))
        return bytes(length)

    limits = PrefetchLimits(1 << 30, max_requests=1, initial_requests=1, max_request_bytes=16384)
    prefetcher, plan, index = _prefetch(fetch, limits, blocks=512, rank=1, world_size=3)
    for _ in prefetcher:
        pass
    _, offsets, paths = synthetic_index(512, block_bytes=4096, rows=8, per_shard=64)
    expected = []
    shape = RequestShape(16384)
    for number, chunk in enumerate(plan.chunks()):
        blocks = np.unique(np.searchsorted(offsets, chunk, side="right") - 1)
        order = [int(b) for b in blocks]
        expected += [(r.path, r.start, r.length)
                     for r in form_requests(order, number, index, paths, shape)]  # fmt: skip
    assert sorted(seen) == sorted(expected)


def test_read_ahead_waits_for_its_delay_and_the_first_chunk_does_not() -> None:
    """A reader in a crowd asks for its first chunk at once and for nothing past it before
    read_ahead_delay (crowd.read_ahead_delay) has passed since it started."""
    import time

    seen: list[tuple[float, int]] = []

    def fetch(path: str, start: int, length: int) -> bytes:
        seen.append((time.perf_counter(), int(path[-5:]) * 64 + start // 4096))
        return bytes(length)

    limits = PrefetchLimits(1 << 30, max_requests=4, initial_requests=4, read_ahead_delay=0.3)
    prefetcher, plan, _ = _prefetch(fetch, limits)
    for _ in prefetcher:
        pass
    opened = prefetcher._started
    first_chunk = next(iter(plan.chunks()))
    first_blocks = set((first_chunk // 8).tolist())  # 8 rows a block
    early = [block for at, block in seen if at < opened + 0.3]
    assert early and set(early) <= first_blocks  # only the first chunk before the delay
    assert any(block not in first_blocks for _, block in seen)  # and the rest after it


def test_a_throttle_mid_chunk_grows_the_rest_of_its_requests() -> None:
    """One request in flight at a time; the first answer is a throttle (EBUSY): the chunk's
    requests not yet sent are formed again, grown, and every block is still read once."""
    import errno

    lengths: list[int] = []

    def fetch(path: str, start: int, length: int) -> bytes:
        lengths.append(length)
        if len(lengths) == 1:
            raise OSError(errno.EBUSY, "slow down")
        return bytes(length)

    limits = PrefetchLimits(1 << 30, max_requests=1, initial_requests=1, max_request_bytes=16384)
    prefetcher, _, index = _prefetch(fetch, limits, window=64)
    for _ in prefetcher:
        pass
    assert prefetcher.concurrency.level == 1
    assert max(lengths) > 16384  # grown past the plain maximum after the throttle
    assert sum(lengths[1:]) == int(index["length"].sum())  # each block once, the retry too
