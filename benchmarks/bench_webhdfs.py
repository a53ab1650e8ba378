"""Read one shuffled epoch from HDFS over WebHDFS through the latency simulator: does the
reader keep its latency target there (steady state at 50 ms >= 0.9x the same store at 0 ms)?

    python benchmarks/bench_webhdfs.py                      # 40,000 samples of 1 KiB, 3 rounds
    python benchmarks/bench_webhdfs.py --root webhdfs://namenode:9870/tmp/bench --user me
    python benchmarks/bench_webhdfs.py --samples 2000 --repeat 1 --ttfb 0.01   # smoke

Without ``--root`` the WebHDFS server of snapstore's tests (tests/webhdfs_server.py) runs in a
child process (its own GIL) over a temporary directory. The snapshot is written once through
``webhdfs://``; each round reads it at ttfb 0 and at ``--ttfb`` through
``simulated_store(open_store(root), ttfb=...)`` with a 2 MiB shuffle window (the simulator's
delay comes on top of the server's own), interleaved; the fastest of each is kept. "Steady
state" is samples per second after the first batch (bench_reader's measure).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import snapstore
from snapstore.storage.simulate import simulated_store

TESTS = Path(__file__).resolve().parent.parent / "tests"
BATCH = 256
# 32 blocks of 64 KiB: a 2 MiB shuffle window, so that an epoch of a few tens of MB streams
# through many windows (the default 32 MiB window would hold it all before the first batch).
WINDOW = 32
SERVER = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from webhdfs_server import running_webhdfs
with running_webhdfs() as server:
    print(server.url, flush=True)
    sys.stdin.readline()
"""


def stage(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"x": np.full(256, i, np.int32)}


def epoch(root: str, options: dict[str, Any], fingerprint: str, ttfb: float) -> dict[str, float]:
    store = simulated_store(snapstore.open_store(root, **options), ttfb=ttfb)
    began = time.perf_counter()
    first, samples = 0.0, 0
    with (
        snapstore.open(fingerprint, root=store) as snap,
        snap.batches(BATCH, shuffle=True, seed=1, window_blocks=WINDOW) as reader,
    ):
        for batch in reader:
            samples += len(batch["x"])
            first = first or time.perf_counter() - began
    seconds = time.perf_counter() - began
    return {"samples": samples, "seconds": seconds, "first": first,
            "steady": (samples - BATCH) / (seconds - first),
            "requests": store.fs.requests}  # type: ignore[attr-defined]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="webhdfs://namenode:9870/dir (default: a test server)")
    parser.add_argument("--user", help="the HDFS user")
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--ttfb", type=float, default=0.05)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    options = {"user": args.user} if args.user else {}
    server = None
    if args.root is None:
        server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert server.stdout is not None
        args.root = f"{server.stdout.readline().strip()}/bench"
    root = f"{args.root.rstrip('/')}/webhdfs-{int(time.time())}"
    try:
        write_options = snapstore.WriteOptions(block_bytes=64 << 10, shard_bytes=4 << 20)
        store = snapstore.open_store(root, **options)
        snap = snapstore.snapshot(stage, root=store, options=write_options)(args.samples)
        fingerprint = snap.materialize().fingerprint
        runs: dict[float, list[dict[str, float]]] = {0.0: [], args.ttfb: []}
        for _ in range(args.repeat):
            for ttfb in runs:
                runs[ttfb].append(epoch(root, options, fingerprint, ttfb))
        best = {ttfb: max(r, key=lambda x: x["steady"]) for ttfb, r in runs.items()}
        zero, slow = best[0.0], best[args.ttfb]
        print(f"# {args.samples:,} samples of 1 KiB under {root}, best of {args.repeat}")
        for label, read in (("ttfb 0", zero), (f"ttfb {1000 * args.ttfb:g} ms", slow)):
            print(f"{label:<12} steady {read['steady']:>9,.0f} samples/s  whole epoch "
                  f"{read['samples'] / read['seconds']:>9,.0f} samples/s  first batch "
                  f"{1000 * read['first']:>5.0f} ms  {read['requests']:,.0f} requests")  # fmt: skip
        print(f"steady state {1000 * args.ttfb:g} ms / 0 ms: {slow['steady'] / zero['steady']:.2f}"
              " (target >= 0.90)")  # fmt: skip
        store.remove_tree("")
    finally:
        if server is not None:
            assert server.stdin is not None
            server.stdin.write("\n")
            server.stdin.flush()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
