"""Materializing a stage that yields torch tensors, against the same stage yielding numpy arrays.

The samples are what a torchvision transform or an HF image processor with
``return_tensors="pt"`` gives: ``{"pixel_values": float32[3,64,64], "label": int64 scalar}``.
The numpy stage yields ``np.ndarray`` values (the label a 0-d array, which is what
``torch.tensor(i).numpy()`` is); the torch stage yields tensors over the same memory
(``torch.from_numpy``), so both write the same bytes and only the handling of the values
differs. The samples are built into lists before timing, so the times are net of making them.
A second pair yields the same data as ``snapstore.Columns`` of 256 rows.

Each case materializes into a fresh root. In each of ``--repeat`` rounds the numpy and the torch
case of a pair run back to back (alternating which goes first), so both see the same load on
this shared machine; the table gives the best and median time of each case, and the ratio of
the bests and the median of the rounds' ratios. The target is torch / numpy <= 1.2x. Last, the
writer's per-sample check (where tensors are converted) is timed alone for both kinds.

    python benchmarks/bench_tensors.py                      # 20,000 samples (~1 GB), 7 rounds
    python benchmarks/bench_tensors.py --samples 200 --repeat 1     # a smoke run
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import snapstore
from snapstore.format.schema import infer_schema, sample_checker
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore

BATCH = 256


def emit(samples: list[Any]) -> Iterator[Any]:
    """The stage: yields what was built beforehand, so only materializing is timed."""
    yield from samples


def numpy_samples(n: int) -> list[dict[str, Any]]:
    """Smooth normalized images, CHW float32 (low-frequency sinusoids from a pool of 64)."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:64, 0:64].astype(np.float32)
    pool = []
    for _ in range(64):
        fx, fy, phase = rng.uniform(0.02, 0.15, 3).astype(np.float32)
        base = np.sin(x * fx + phase) * 0.6 + np.cos(y * fy - phase) * 0.4
        pool.append(np.stack([base, 0.8 * base + 0.1, 0.6 * base - 0.2]).astype(np.float32))
    return [
        {"pixel_values": np.roll(pool[i % 64], i // 64, axis=2), "label": np.array(i % 1000)}
        for i in range(n)
    ]


def as_tensors(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{name: torch.from_numpy(value) for name, value in s.items()} for s in samples]


def as_columns(samples: list[dict[str, Any]], tensors: bool) -> list[snapstore.Columns]:
    out = []
    for start in range(0, len(samples), BATCH):
        rows = samples[start : start + BATCH]
        cols = {name: np.stack([s[name] for s in rows]) for name in rows[0]}
        out.append(snapstore.Columns({k: torch.from_numpy(v) for k, v in cols.items()} if tensors
                                     else cols))  # fmt: skip
    return out


def materialize(samples: list[Any], root: Path, name: str) -> tuple[float, Any]:
    """Seconds to materialize the stage into a fresh root, and the block checksums written."""
    shutil.rmtree(root, ignore_errors=True)
    stage = snapstore.snapshot(emit, root=str(root), ignore=["samples"], version=name)
    began = time.perf_counter()
    snap = stage(samples).materialize()
    seconds = time.perf_counter() - began
    checksums = SnapshotReader(LocalStore(root), snap.fingerprint).index["checksum"].copy()
    snap.close()
    shutil.rmtree(root, ignore_errors=True)
    return seconds, checksums


def check_cost(samples: list[dict[str, Any]]) -> float:
    """Microseconds per sample of the writer's per-sample check (and conversion), best of 5:
    the part of ``add()`` that differs between the cases, without the encoding and I/O."""
    check = sample_checker(infer_schema(samples[:64]))
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for i, sample in enumerate(samples):
            check(sample, i)
        best = min(best, time.perf_counter() - began)
    return best / len(samples) * 1e6


PAIRS = {
    "one dict per sample": (
        "numpy arrays, one dict per sample",
        "torch tensors, one dict per sample",
    ),
    "Columns": ("numpy Columns of 256 rows", "torch Columns of 256 rows"),
}


def measure(cases: dict[str, list[Any]], tmp: Path, repeat: int) -> dict[str, list[float]]:
    """Seconds of every run of every case. Each round runs the two cases of a pair back to
    back, in alternating order, so a pair shares the machine's load of that moment."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    written: dict[str, Any] = {}
    for name, samples in cases.items():  # warm-up: imports, the code walk, first writes
        materialize(samples[:2], tmp / "root", f"{name}, warm-up")
    for r in range(repeat):
        for pair in PAIRS.values():
            for name in pair if r % 2 == 0 else pair[::-1]:
                seconds, written[name] = materialize(cases[name], tmp / "root", name)
                times[name].append(seconds)
    first = next(iter(written.values()))
    if any(not np.array_equal(w, first) for w in written.values()):
        raise SystemExit("the cases wrote different blocks")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7, help="rounds; see the docstring")
    parser.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = numpy_samples(args.samples)
    cases: dict[str, list[Any]] = {
        "numpy arrays, one dict per sample": rows,
        "torch tensors, one dict per sample": as_tensors(rows),
        "numpy Columns of 256 rows": as_columns(rows, tensors=False),
        "torch Columns of 256 rows": as_columns(rows, tensors=True),
    }
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="snapstore-bench-") as tmp:
        times = measure(cases, Path(tmp), args.repeat)
    mb = sum(s["pixel_values"].nbytes + 8 for s in rows) / 1e6
    print(f"# {args.samples:,} samples of float32[3,64,64] + int64 label ({mb:,.0f} MB), "
          f"{args.repeat} rounds\n")  # fmt: skip
    print(f"{'stage yields':36} {'best (s)':>8} {'median':>7} {'samples/s':>10} {'MB/s':>7}")
    for name, runs in times.items():
        best, median = min(runs), statistics.median(runs)
        print(f"{name:36} {best:>8.2f} {median:>7.2f} {args.samples / best:>10,.0f} "
              f"{mb / best:>7,.0f}")  # fmt: skip
    print(f"\n{'torch / numpy':36} {'best':>8} {'median':>7}   (median: of each round's ratio)")
    for label, (numpy_case, torch_case) in PAIRS.items():
        a, b = times[numpy_case], times[torch_case]
        rounds = statistics.median(t / n for n, t in zip(a, b))
        target = "   target <= 1.2x" if label == "one dict per sample" else ""
        print(f"{label:36} {min(b) / min(a):>7.2f}x {rounds:>6.2f}x{target}")
    numpy_us = check_cost(cases["numpy arrays, one dict per sample"])
    torch_us = check_cost(cases["torch tensors, one dict per sample"])
    print(f"\nper-sample check, numpy / torch (us) {numpy_us:5.2f} / {torch_us:.2f}")
    print("every case wrote the same blocks     True")


if __name__ == "__main__":
    sys.exit(main())
