"""Many ranks on one bucket: a fleet's cold start and first minute, simulated in virtual time.

For 8 to 8,192 readers (hosts of 8) against an unlimited bucket and a 5,000 requests/s one
(50 ms, 1 Gb/s per host; :mod:`snapstore.read.fleet`), with all adaptations, none, and each
one off: time to first batch (p50, p99 across readers), metadata requests per host, the 429
share and steady throughput against what the rate allows. The last line sums up the largest
case against issue 28's targets; the exit status is 1 when one is missed.

    python benchmarks/bench_fleet.py                 # 8 ... 8,192 readers
    python benchmarks/bench_fleet.py --hosts 1 16    # a quick run
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from bench_format import print_rows

from snapstore.format.plan import PlanOptions
from snapstore.read.fleet import FleetOptions, simulate_fleet, synthetic_index
from snapstore.storage.bucket import BucketLimits

ADAPTATIONS = ("share_metadata", "jitter", "grow", "aimd")
TARGET_P99, TARGET_META, TARGET_429, TARGET_STEADY, TARGET_COST = 3.0, 3.0, 0.01, 0.9, 0.05


def variants() -> list[tuple[str, dict[str, bool]]]:
    on = dict.fromkeys(ADAPTATIONS, True)
    rows = [("all", on), ("none", dict.fromkeys(ADAPTATIONS, False))]
    rows += [(f"no {name}", {**on, name: False}) for name in ADAPTATIONS]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 16, 128, 1024])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--shuffle", action="store_true", help="shuffled order (per-block reads)")
    parser.add_argument("--blocks", type=int, default=1 << 20, help="blocks of 256 KiB")
    parser.add_argument(
        "--only", nargs="+", default=None, help="adaptation rows to run (e.g. all none)"
    )
    args = parser.parse_args()
    index = synthetic_index(args.blocks)
    plan = PlanOptions(shuffle=args.shuffle, window_blocks=128)
    rows = [("readers", "bucket", "adaptations", "p50 s", "p99 s", "meta/host", "429 %",
             "steady GB/s", "allowed GB/s", "wall s")]  # fmt: skip
    results = {}
    for hosts in args.hosts:
        for rate in (None, 5000.0):
            for name, flags in variants():
                if args.only and name not in args.only:
                    continue
                options = FleetOptions(
                    hosts=hosts,
                    per_host=8 if hosts > 1 else 1,
                    limits=BucketLimits(rate=rate),
                    plan=plan,
                    duration=args.duration,
                    **flags,
                )
                began = time.perf_counter()
                r = simulate_fleet(options, *index)
                wall = time.perf_counter() - began
                results[hosts, rate, name] = r
                f = r.first_batch
                rows.append((
                    str(options.hosts * options.per_host),
                    "unlimited" if rate is None else f"{rate:.0f}/s",
                    name,
                    f"{np.nanpercentile(f, 50):.2f}",
                    f"{np.nanpercentile(f, 99):.2f}",
                    f"{r.metadata_per_host:.1f}",
                    f"{100 * r.throttled_share:.2f}",
                    f"{r.steady / 1e9:.2f}",
                    "-" if rate is None else f"{r.allowed / 1e9:.2f}",
                    f"{wall:.1f}",
                ))  # fmt: skip
                print(*rows[-1], sep="  ", file=sys.stderr, flush=True)
    print_rows(rows)
    top = max(args.hosts)
    r = results[top, 5000.0, "all"]
    p99 = float(np.nanpercentile(r.first_batch, 99))
    # What the rate allows, or what the hosts' links carry where that is less (1,024 hosts at
    # 1 Gb/s: 128 GB/s, below 5,000 requests/s of 32 MiB).
    links = top * BucketLimits().host_bandwidth
    steady = r.steady / min(r.allowed, links)
    alone = [results.get((1, None, n)) for n in ("all", "none")]
    cost = 1 - alone[0].steady / alone[1].steady if alone[0] and alone[1] else 0.0
    checks = {
        f"p99 first batch {p99:.2f} s <= {TARGET_P99}": p99 <= TARGET_P99,
        f"metadata {r.metadata_per_host:.1f}/host <= {TARGET_META}": r.metadata_per_host
        <= TARGET_META,
        f"429 {100 * r.throttled_share:.2f}% <= 1%": r.throttled_share <= TARGET_429,
        f"steady {100 * steady:.0f}% of allowed (rate or links) >= 90%": steady >= TARGET_STEADY,
        f"adaptations cost {100 * cost:.1f}% alone <= 5%": cost <= TARGET_COST,
    }
    missed = [k for k, ok in checks.items() if not ok]
    readers = top * 8 if top > 1 else 1
    print(
        f"{readers} readers, 5,000/s bucket: "
        + "; ".join(f"{k} {'ok' if ok else 'MISSED'}" for k, ok in checks.items())
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
