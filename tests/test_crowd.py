"""Reading in a crowd: start delays, host budgets, AIMD on 429 and throttle detection."""

from __future__ import annotations

import errno

import pytest

from snapstore.errors import StoreError
from snapstore.read import crowd
from snapstore.read.requests import MAX_GROWN_BYTES, MAX_LEVEL, Concurrency, RequestShape
from snapstore.storage.retry import is_throttled


def test_start_delay_is_deterministic_bounded_and_off_alone() -> None:
    assert crowd.start_delay(0, 1) == 0.0
    delays = [crowd.start_delay(r, 8192) for r in range(8192)]
    assert delays == [crowd.start_delay(r, 8192) for r in range(8192)]
    assert min(delays) >= 0.0 and max(delays) <= crowd.MAX_START_DELAY
    assert len(set(delays)) > 8000  # spread out
    assert max(crowd.start_delay(r, 10) for r in range(10)) <= 10 / crowd.START_RATE


def test_host_budget_is_split_among_readers() -> None:
    assert crowd.host_requests(1) == 128
    assert crowd.host_requests(8) == crowd.HOST_REQUESTS // 8
    assert crowd.host_requests(1000) == 4


def test_place_reads_the_launcher_environment() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    assert crowd.place(env) == (5, 16, 8)
    assert crowd.place({}) == (0, 1, 1)
    # DataLoader worker 3 of 8 of rank 5: reader 43 of 128, 64 on the host
    assert crowd.place(env, worker=(3, 8)) == (43, 128, 64)
    assert crowd.place({}, worker=(2, 4)) == (2, 4, 4)


def test_aimd_halves_on_429_and_grows_back_additively() -> None:
    c = Concurrency(maximum=64, initial=32)
    c.on_throttled()
    assert (c.limit, c.level) == (16, 1)
    for _ in range(16):  # a window of answers: requests sent before the halving
        c.on_throttled()
    assert (c.limit, c.level, c.throttles) == (16, 1, 17)
    c.on_throttled()  # 16 answers since the halving: a new window, halved again
    assert (c.limit, c.level) == (8, 2)
    for _ in range(8):
        c.on_success()
    assert c.limit == 9  # one more per limit's worth of successes
    c.on_throttled()  # 8 answers since the halving, fewer than the limit of 9: counted only
    assert c.limit == 9
    for _ in range(40):  # a store that throttles everything: halved once per window
        c.on_throttled()
    assert c.limit == 1


def test_one_throttle_in_a_hundred_answers_halves_once_per_window() -> None:
    """Isolated throttles (1 in 100 answers) halve the limit each time they come a window
    apart, and successes grow it back in between: it does not collapse to 1."""
    c = Concurrency(maximum=64, initial=32)
    for _ in range(20):
        c.on_throttled()
        for _ in range(99):
            c.on_success()
    assert c.limit >= 8


def test_requests_grow_when_throttled() -> None:
    shape = RequestShape(8 << 20)
    assert shape.grown(0) == shape
    assert shape.grown(1).max_bytes == 16 << 20
    assert shape.grown(10).max_bytes == MAX_GROWN_BYTES
    assert shape.grown(1).max_gap > shape.max_gap


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.EBUSY, "SlowDown"),
        RuntimeError("429 Too Many Requests"),
    ],
)
def test_throttling_errors_are_recognised(exc: BaseException) -> None:
    assert is_throttled(exc)
    try:
        raise StoreError("cannot read x: gave up") from exc
    except StoreError as wrapped:
        assert is_throttled(wrapped)


def test_other_errors_are_not_throttling() -> None:
    assert not is_throttled(FileNotFoundError("x"))
    assert not is_throttled(OSError(errno.ECONNRESET, "reset"))


def test_read_ahead_waits_for_every_first_request_then_spreads_in_reverse() -> None:
    n = 8192
    span = min(crowd.MAX_START_DELAY, n / crowd.START_RATE)
    starts = [crowd.start_delay(c, n) for c in range(n)]
    holds = [crowd.read_ahead_delay(c, n) for c in range(n)]
    assert crowd.read_ahead_delay(0, 1) == 0.0
    assert max(starts) <= span <= min(holds) and max(holds) <= 5 * span
    late = max(range(n), key=starts.__getitem__)
    assert holds[late] == min(holds)  # the last to start is the first to read ahead


def test_a_crowd_starts_with_one_grown_request_and_a_lone_reader_at_its_cap() -> None:
    assert crowd.crowd_start(1, 128) == (128, 0)
    assert crowd.crowd_start(crowd.CROWD_READERS - 1, 32) == (32, 0)
    assert crowd.crowd_start(crowd.CROWD_READERS, 32) == (1, crowd.CROWD_LEVEL)
    c = Concurrency(32, 1, level=crowd.CROWD_LEVEL)
    assert (c.limit, c.level) == (1, crowd.CROWD_LEVEL)
    assert Concurrency(32, level=99).level == MAX_LEVEL


def test_a_crowd_does_not_raise_its_limit_while_its_requests_queue() -> None:
    """Requests of 32 MiB at 0.3 s, then at 2 s (8 readers' requests queued on one link): a
    stall no longer doubles a crowd's limit; a lone reader's it does."""
    crowd_c, alone = Concurrency(32, 2, crowd=True), Concurrency(32, 2)
    for c in (crowd_c, alone):
        c.record_latency(0.3, 32 << 20)
        c.on_stall(limited=True)
        assert c.limit == 4  # not queueing yet: doubled
        for _ in range(10):
            c.record_latency(2.0, 32 << 20)
        assert c.queueing()
        c.on_stall(limited=True)
    assert (crowd_c.limit, alone.limit) == (4, 8)
