"""Reading in a crowd: many ranks on one bucket.

A bucket serves a limited number of requests per second (GCS about 5,000 reads/s when new, S3
about 5,500 GETs/s per prefix); a job of 1,024 ranks of 8 workers that all start at once asks for
far more. Pure rules here keep a crowd inside it: :func:`start_delay` spreads the readers'
first requests over up to two seconds; :func:`read_ahead_delay` holds each reader's reading
past its first chunk until every reader has asked for its own, then lets them in over a second
spread; a reader of a crowd starts with one request in flight and requests :data:`CROWD_LEVEL`
times grown (:func:`crowd_start`); and :func:`host_requests` splits a host's request budget
among the readers on it. :func:`place` reads the job's place from the launcher's environment
(torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``) and PyTorch's worker info; a
single reader gets no delay and the whole budget.
"""

from __future__ import annotations

import os
import sys

__all__ = [
    "CROWD_LEVEL",
    "CROWD_READERS",
    "HOST_REQUESTS",
    "MAX_START_DELAY",
    "START_RATE",
    "crowd_start",
    "host_requests",
    "place",
    "read_ahead_delay",
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
# A reader in a crowd forms requests 2**CROWD_LEVEL times the usual size from the start (up to
# 32 MiB where blocks are adjacent): a host's link fills with a quarter of the requests, so a
# crowd whose hosts read flat out asks the bucket for fewer than it serves (1,024 hosts at 1 Gb/s
# need about 3,800 requests/s of 32 MiB, 15,000 of 8 MiB), and a first chunk is one request,
# not four sent at once. (Plain requests for the first chunk only, measured with a read-ahead
# spread of twice the start spread: 64% of 429s and a p99 first batch of 8.9 s for 8,192 readers
# in the fleet simulation, against 12% and 2.6 s.)
CROWD_LEVEL = 2
# Readers from which a job starts as a crowd (crowd_start): fewer, at their caps (32 requests
# each on hosts of 8), ask a new bucket for less than its one-second burst of about 5,000.
CROWD_READERS = 128


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


def read_ahead_delay(
    consumer: int, consumers: int, rate: float = START_RATE, cap: float = MAX_START_DELAY
) -> float:
    """Seconds from opening before consumer ``consumer`` of ``consumers`` reads past its first
    chunk; 0 for a single consumer.

    Every consumer's first requests go out within the start spread (:func:`start_delay`'s
    ``span``); read-ahead then starts over a second spread four times as long, in the reverse
    order (``5 * span - 4 * start_delay``: the last to start is the first to read ahead), so the
    first chunks never queue behind anyone's read-ahead at the bucket, and the read-aheads join
    at a quarter of the rate the starts came (a reader joining asks for its next chunk and its
    read-ahead at once). A rank of a synchronous job loses little: its first step waits for the
    slowest rank's first batch anyway; the job reaches full speed after about ``5 * span`` (10 s
    for 8,192 readers). Measured in the fleet simulation, 8,192 readers on a 5,000 requests/s
    bucket (10 simulated seconds): a second spread as long as ``span`` met 20.7% of 429s, twice
    as long 12.4% (9.1% with :class:`~snapstore.read.requests.Concurrency`'s queueing guard),
    three times 1.1%, four times none, the links full in all.
    """
    if consumers <= 1:
        return 0.0
    span = min(cap, consumers / rate)
    return 5 * span - 4 * start_delay(consumer, consumers, rate, cap)


def crowd_start(consumers: int, cap: int) -> tuple[int, int]:
    """``(requests in flight, request level)`` a reader of ``consumers`` starts with, its cap
    ``cap``: below :data:`CROWD_READERS`, the cap and plain requests (the limit then drifts
    down to what the consumer needs); in a crowd, one request (the limit doubles when the
    consumer waits on it, as TCP's slow start) and requests :data:`CROWD_LEVEL` times
    grown."""
    if consumers < CROWD_READERS:
        return cap, 0
    return 1, CROWD_LEVEL


def host_requests(readers_on_host: int, reader_cap: int = 128) -> int:
    """Requests in flight one reader may keep: its share of :data:`HOST_REQUESTS`, at least 4,
    at most ``reader_cap``."""
    share = HOST_REQUESTS // max(1, readers_on_host)
    return max(_MIN_READER_REQUESTS, min(reader_cap, share))


def place(
    env: dict[str, str] | None = None, worker: tuple[int, int] | None = None
) -> tuple[int, int, int]:
    """``(reader, readers, readers on this host)`` from the launcher's environment (torchrun:
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``), ``(0, 1, 1)`` where unset or malformed.

    Each DataLoader worker of a rank is a reader of its own: ``worker`` (its number and the
    workers per rank; default: PyTorch's ``get_worker_info()`` when this runs in a worker)
    makes reader ``rank * workers + number`` of ``world_size * workers``.
    """
    env = dict(os.environ) if env is None else env

    def number(name: str, default: int) -> int:
        text = env.get(name, "")
        return int(text) if text.isdigit() else default

    world = max(1, number("WORLD_SIZE", 1))
    rank = min(number("RANK", 0), world - 1)
    on_host = max(1, min(world, number("LOCAL_WORLD_SIZE", 1)))
    which, workers = _worker() if worker is None else worker
    if workers <= 1:
        return rank, world, on_host
    return rank * workers + min(which, workers - 1), world * workers, on_host * workers


def _worker() -> tuple[int, int]:
    """``(number, workers)`` of the DataLoader worker this runs in, ``(0, 1)`` elsewhere; never
    imports torch."""
    data = sys.modules.get("torch.utils.data")
    info = getattr(data, "get_worker_info", lambda: None)() if data is not None else None
    if info is None:
        return 0, 1
    return int(info.id), max(1, int(info.num_workers))
