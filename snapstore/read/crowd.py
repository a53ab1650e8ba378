"""Reading in a crowd: many ranks on one bucket.

A bucket serves a limited number of requests per second (GCS about 5,000 reads/s when new, S3
about 5,500 GETs/s per prefix); a job of 1,024 ranks of 8 workers that all start at once asks for
far more. Two pure rules here keep a crowd inside it: :func:`start_delay` spreads the ranks'
first requests over about a second, and :func:`host_requests` splits a host's request budget
among the readers on it. Both read the job's place from the launcher's environment (torchrun's
``RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``) when not given; a single reader gets no delay
and the whole budget.
"""

from __future__ import annotations

import os

__all__ = [
    "HOST_REQUESTS",
    "MAX_START_DELAY",
    "START_RATE",
    "host_requests",
    "place",
    "start_delay",
]

# Starts are spread over ``consumers / START_RATE`` seconds, at most MAX_START_DELAY: a bucket
# serves about 5,000 reads/s when it is new (GCS), so 8,192 consumers each asking for their
# first window at once queue for seconds; spread out, each finds the bucket free. Half the
# bucket's rate (the other half for metadata and read-ahead), over at most 2 s: provisional,
# not yet confirmed by an 8,192-reader run of benchmarks/bench_fleet.py.
START_RATE = 2500.0
MAX_START_DELAY = 2.0
_GOLDEN_FRACTION = 0.6180339887498949


def start_delay(
    consumer: int, consumers: int, rate: float = START_RATE, cap: float = MAX_START_DELAY
) -> float:
    """Seconds consumer ``consumer`` of ``consumers`` waits before its first requests.

    Deterministic from the consumer number (the golden-ratio sequence, so neighbouring ranks
    land far apart and any run of them is spread evenly), at most ``min(cap, consumers /
    rate)``; 0 for a single consumer.
    """
    if consumers <= 1:
        return 0.0
    span = min(cap, consumers / rate)
    return span * ((consumer * _GOLDEN_FRACTION) % 1.0)


# Requests in flight per host, split among its readers: 128 (a reader's own cap) for one reader,
# 32 each for 8 ranks. A host at 1 Gb/s needs about 8 requests of 8 MiB in flight at 50 ms, so
# 256 leaves room for small blocks and slow answers (a reasoned default, not yet tuned by
# benchmarks/bench_fleet.py).
HOST_REQUESTS = 256
_MIN_READER_REQUESTS = 4


def host_requests(readers_on_host: int, reader_cap: int = 128) -> int:
    """Requests in flight one reader may keep: its share of :data:`HOST_REQUESTS`, at least 4,
    at most ``reader_cap``."""
    share = HOST_REQUESTS // max(1, readers_on_host)
    return max(_MIN_READER_REQUESTS, min(reader_cap, share))


def place(env: dict[str, str] | None = None) -> tuple[int, int, int]:
    """``(rank, world_size, ranks on this host)`` from the launcher's environment (torchrun:
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``), ``(0, 1, 1)`` where unset or malformed."""
    env = dict(os.environ) if env is None else env

    def number(name: str, default: int) -> int:
        text = env.get(name, "")
        return int(text) if text.isdigit() else default

    world = max(1, number("WORLD_SIZE", 1))
    rank = min(number("RANK", 0), world - 1)
    return rank, world, max(1, min(world, number("LOCAL_WORLD_SIZE", 1)))
