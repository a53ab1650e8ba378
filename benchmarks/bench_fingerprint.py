"""Time to list and identify declared inputs (snapstore.fingerprint.inputs.files), against a bare
walk.

    python benchmarks/bench_fingerprint.py                  # 1,000 and 10,000 files of 4 KiB
    python benchmarks/bench_fingerprint.py --counts 100     # a quick smoke run

For each count, in one temporary directory (removed afterwards) and one memory:// prefix:
  local glob       files("dir/*.bin").identity()         one scandir walk, one stat per file
  local list       files([every path]).identity()        one os.stat per path
  local sha256     files("dir/*.bin", content_hash=True)   reads and hashes every byte
  memory glob / list / sha256                              the same on fsspec's memory filesystem
and the baseline: a plain os.scandir walk with entry.stat() of the same local directory, measured
in the same run (this machine is shared and noisy: the ratio means more than the time). Each
figure is the best of --repeat runs, each on a fresh object (no cached identity).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable

import fsspec

from snapstore.fingerprint.inputs import files

PAYLOAD = 4096


def best(fn: Callable[[], int], repeat: int, expect: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - start)
        if got != expect:
            raise SystemExit(f"expected {expect} inputs, got {got}")
    return min(times)


def scandir_walk(root: str) -> int:
    """The floor: list the directory and stat every entry, nothing else."""
    n = 0
    with os.scandir(root) as it:
        for entry in it:
            entry.stat()
            n += 1
    return n


def run(count: int, tmp: str, repeat: int) -> list[tuple[str, float]]:
    rng = os.urandom(PAYLOAD)
    root = tempfile.mkdtemp(prefix=f"bench-inputs-{count}-", dir=tmp)
    mem = f"/bench-inputs-{uuid.uuid4().hex}"
    memfs = fsspec.filesystem("memory")
    try:
        paths = [os.path.join(root, f"{i:06d}.bin") for i in range(count)]
        urls = [f"memory://{mem}/{i:06d}.bin" for i in range(count)]
        for i, (path, url) in enumerate(zip(paths, urls)):
            data = i.to_bytes(8, "little") + rng[8:]
            with open(path, "wb") as f:
                f.write(data)
            memfs.pipe(url, data)
        rows = [
            ("os.scandir walk + stat (baseline)", best(lambda: scandir_walk(root), repeat, count)),
            ("local glob", best(lambda: len(files(f"{root}/*.bin").identity()), repeat, count)),
            ("local list", best(lambda: len(files(paths).identity()), repeat, count)),
            (
                "local glob, content_hash",
                best(lambda: len(files(f"{root}/*.bin", content_hash=True).identity()), 1, count),
            ),
            (
                "memory glob",
                best(lambda: len(files(f"memory://{mem}/*.bin").identity()), repeat, count),
            ),
            ("memory list", best(lambda: len(files(urls).identity()), repeat, count)),
            (
                "memory glob, content_hash",
                best(
                    lambda: len(files(f"memory://{mem}/*.bin", content_hash=True).identity()),
                    1,
                    count,
                ),
            ),
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if memfs.exists(mem):
            memfs.rm(mem, recursive=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,10000", help="comma-separated file counts")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--tmp", default=None, help="parent of the temporary directory")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    results = {count: run(count, args.tmp, args.repeat) for count in counts}
    labels = [label for label, _ in results[counts[0]]]
    width = max(map(len, labels))
    head = "".join(f"{f'{c:,} files':>14}{'x walk':>9}" for c in counts)
    print(f"{'list + identify (4 KiB files)':<{width}}{head}")
    for i, label in enumerate(labels):
        cells = ""
        for count in counts:
            seconds = results[count][i][1]
            ratio = seconds / results[count][0][1]
            cells += f"{seconds * 1000:>11.1f} ms{ratio:>8.1f}x"
        print(f"{label:<{width}}{cells}")


if __name__ == "__main__":
    main()
