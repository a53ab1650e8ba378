"""Quickstart: snapshot an expensive preprocessing stage once, then train from the snapshot.

Run:  python examples/quickstart.py [--samples 2000] [--root DIR]

The stage below does decode-like CPU work per sample (synthesize a 128x128 image, blur it,
downsample it, tokenize a caption). The first run computes and writes the snapshot; every later
epoch (and every later run of this script) reads it back, shuffled and batched.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import snapstore
from snapstore.cli.main import main as snapstore_cli

KERNEL = np.array([1, 4, 6, 4, 1], np.float32) / 16


def blur(img: np.ndarray, axis: int) -> np.ndarray:
    """One pass of a 5-tap binomial blur along an axis (edges repeated)."""
    pad = [(2, 2) if i == axis else (0, 0) for i in range(img.ndim)]
    padded = np.pad(img, pad, mode="edge")
    n = img.shape[axis]
    return sum(w * padded.take(range(k, k + n), axis=axis) for k, w in enumerate(KERNEL))


def preprocess(seed: int) -> dict:
    """Stand-in for decode + resize + augment: a couple of milliseconds of numpy per sample."""
    rng = np.random.default_rng(seed)
    img = rng.random((128, 128, 3), dtype=np.float32)
    for _ in range(3):
        img = blur(blur(img, 0), 1)
    small = img.reshape(64, 2, 64, 2, 3).mean(axis=(1, 3))
    small = (255 * (small - small.min()) / (np.ptp(small) + 1e-6)).astype(np.uint8)
    caption = rng.integers(0, 32_000, rng.integers(8, 64), dtype=np.int32)
    return {"image": small, "caption": caption, "label": int(seed % 10)}


@snapstore.snapshot
def images(num_samples: int):
    """The expensive stage: yields one preprocessed sample at a time."""
    for i in range(num_samples):
        yield preprocess(i)


def progress_bar(total: int):
    start = time.perf_counter()

    def report(samples: int, stored_bytes: int) -> None:
        if sys.stderr.isatty():
            rate = samples / max(time.perf_counter() - start, 1e-9)
            sys.stderr.write(
                f"\r  writing {samples}/{total} samples, {stored_bytes / 2**20:.1f} MiB, "
                f"{rate:.0f} samples/s "
            )
            sys.stderr.flush()

    return report


def epoch(snap: snapstore.Snapshot, n: int) -> int:
    seen = 0
    for batch in snap.batches(256, shuffle=True, seed=0, epoch=n):
        seen += len(batch["label"])
    return seen


def run(num_samples: int, root: str | None) -> None:
    if root:
        os.environ["SNAPSTORE_ROOT"] = (
            root  # read when the stage is called, as is --root by the CLI
        )
    t = time.perf_counter()
    for i in range(num_samples):
        preprocess(i)
    recompute = time.perf_counter() - t

    snap = images(num_samples)
    print(f"fingerprint {snap.fingerprint} under {snap.store.url}")
    already = snap.committed
    t = time.perf_counter()
    snap.materialize(progress=progress_bar(num_samples))
    first = time.perf_counter() - t
    created = snap.manifest["created_at"][:19].replace("T", " ")
    if sys.stderr.isatty():
        sys.stderr.write("\n")

    t = time.perf_counter()
    seen = epoch(snap, 1)
    second = time.perf_counter() - t
    snap.close()

    print(f"{'recompute one epoch':<34}{recompute:8.2f} s")
    if already:  # a run before this one (the root outlives the script) committed it
        print(f"{'first run (already committed)':<34}an earlier run's snapshot, created {created} "
              f"UTC, found\n{'':<34}under {snap.store.url}: nothing to compute "
              f"(`snapstore{' --root ' + root if root else ''} rm {snap.fingerprint[:12]}` "
              "to start over)")  # fmt: skip
    else:
        print(f"{'first run (compute + write)':<34}{first:8.2f} s")
    print(
        f"{'epoch from the snapshot':<34}{second:8.2f} s   {recompute / second:6.1f}x faster "
        f"({seen / second:,.0f} samples/s, shuffled, batches of 256)"
    )
    print("\n$ snapstore ls")
    snapstore_cli.main(["ls"], standalone_mode=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument(
        "--root", default=None, help="default: $SNAPSTORE_ROOT or ~/.cache/snapstore"
    )
    options = parser.parse_args()
    run(options.samples, options.root)
