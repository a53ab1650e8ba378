"""Partition status from listings: 10,000 partitions on fake-gcs-server at 50 ms a request.

gcsfs -> snapstore.storage.simulate's LatencyFileSystem (``--ttfb`` per request, a listing paged
1,000 objects a request, every request recorded) -> fake-gcs-server (in memory). The stage is being
resumed: most partitions are committed, some hold the claims of a job that crashed, the rest are
pending. Measured in one run: the old way (one ``exists`` per partition, timed on a sample and
scaled: all of them would take minutes), one recursive listing of ``parts/``, and what a partitioned
stage does now (prefix listings in parallel, then the claims it saw read concurrently). Round trips
are groups of overlapping requests (``simulate.round_trips``).

    python benchmarks/bench_listing.py                     # 10,000 partitions
    python benchmarks/bench_listing.py --partitions 300    # smoke run
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from servers import running_fake_gcs  # noqa: E402

from snapstore.storage import claims  # noqa: E402
from snapstore.storage.simulate import round_trips, simulated_store  # noqa: E402
from snapstore.storage.store import FsspecStore, Store  # noqa: E402
from snapstore.write.engines import PartitionTask  # noqa: E402
from snapstore.write.parallel import PartitionJob  # noqa: E402
from snapstore.write.partitions import partition_dir, partition_done  # noqa: E402

FP = "b" * 32


def craft(store: FsspecStore, partitions: int, claimed: int) -> tuple[int, int]:
    """A resumed stage's files: 90% of the partitions committed, then ``claimed`` with the
    expired claim of a crashed job (a real claim body), the rest pending. Returns the counts."""
    committed = partitions * 9 // 10
    files = {f"{partition_dir(FP, p)}/COMMIT": b"{}" for p in range(committed)}
    body = {"owner": "crashed", "host": socket.gethostname(), "pid": -1, "lease": 60.0}
    for p in range(committed, min(committed + claimed, partitions)):
        claim = {**body, "created_at": time.time() - 3600, "generation": 0}
        files[f"{partition_dir(FP, p)}/claims/claim-00000000"] = json.dumps(claim).encode()
    store.fs.pipe({f"{store.root}/{path}": data for path, data in files.items()})
    return committed, len(files) - committed


def traced(
    store: FsspecStore, ttfb: float, work: Callable[[FsspecStore], Any]
) -> tuple[int, int, float, Any]:
    """Run ``work`` on a recording simulation of ``store``: (round trips, requests, s, result)."""
    sim = simulated_store(store, ttfb=ttfb, record=True)
    start = time.perf_counter()
    result = work(sim)
    seconds = time.perf_counter() - start
    trace = sim.fs.trace or []
    return round_trips(trace), len(trace), seconds, result


def job_over(store: Store, partitions: int) -> PartitionJob:
    tasks = [PartitionTask(print, "bench", (), {}, store, FP, p) for p in range(partitions)]
    clock = claims.SystemClock()
    return PartitionJob(store, FP, "bench", tasks, 60.0, clock, lambda p, s: False, lambda: False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--claimed", type=int, default=100, help="partitions with claims")
    parser.add_argument("--ttfb", type=float, default=0.05, help="seconds per request")
    parser.add_argument("--sample", type=int, default=200, help="partitions timed the old way")
    args = parser.parse_args()
    n = args.partitions
    with running_fake_gcs() as server:
        store = server.store()
        start = time.perf_counter()
        committed, claimed = craft(store, n, args.claimed)
        made = time.perf_counter() - start
        sample = min(args.sample, n)

        def old(sim: FsspecStore) -> int:
            return sum(partition_done(sim, FP, p) for p in range(sample))

        rows = []
        trips, requests, seconds, _ = traced(store, args.ttfb, old)
        scale = n / sample
        rows.append(
            (
                f"per-partition exists ({sample} timed, x{scale:g})",
                round(trips * scale),
                round(requests * scale),
                seconds * scale,
            )
        )
        one = traced(store, args.ttfb, lambda sim: sim.list_tree(f"{FP}/parts"))
        rows.append(("one recursive listing of parts/", *one[:3]))
        job = job_over(store, n)
        status = traced(store, args.ttfb, lambda sim: _refresh(job, sim))
        rows.append(("partition status: prefix listings at once", *status[:3]))
        both = traced(store, args.ttfb, lambda sim: _refresh(job, sim, states=True))
        rows.append(("  and then the claims seen, read at once", *both[:3]))
    pending, states = both[3]
    ms = args.ttfb * 1000
    print(f"# {n:,} partitions on fake-gcs-server via gcsfs, {ms:g} ms per request")
    print(f"# {committed:,} committed, {claimed:,} with a crashed job's claim; setup {made:.0f} s")
    print()
    print(f"{'':48}{'round trips':>12}{'requests':>10}{'seconds':>10}")
    for label, trips, requests, seconds in rows:
        print(f"{label:48}{trips:>12,}{requests:>10,}{seconds:>10.2f}")
    print(f"\n{'partitions pending / claims judged expired':48}{len(pending):>12,}", end="")
    print(f"{sum(s.expired(time.time()) for s in states.values()):>10,}")
    print(f"{'target: status in <= 3 round trips':48}{status[0] <= 3!s:>12}")
    assert len(pending) == n - committed and len(states) == claimed, "wrong status"


def _refresh(
    job: PartitionJob, sim: Store, *, states: bool = False
) -> tuple[list[PartitionTask], dict[int, claims.ClaimState]]:
    job.store = sim
    pending = job.refresh(job.tasks)
    return pending, job.claim_states(pending) if states else {}


if __name__ == "__main__":
    main()
