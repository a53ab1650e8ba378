"""A torch DataLoader with workers over a snapshot, against the one-process reader, in one run.

Reads the img workload of bench_format.py shuffled, in batches of 256, four ways: the bare
reader (``snap.batches``) in this process, and ``DataLoader(SnapshotIterableDataset(...),
batch_size=None, num_workers=W)`` for W = 0 and 2, each with and without a per-batch transform
that costs CPU (a stand-in for augmentation: normalizing and flipping the images in float32).
Prints samples/s and the ratios the targets are about.

    python benchmarks/bench_torch.py              # 20,000 images (~245 MB)
    python benchmarks/bench_torch.py --samples 2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from bench_format import BATCH, img_samples  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import snapstore  # noqa: E402
from snapstore.torch import SnapshotIterableDataset  # noqa: E402


def transform(batch: dict[str, Any]) -> dict[str, Any]:
    """CPU work per batch: float conversion, per-channel normalization, a horizontal flip."""
    images = batch["image"]
    x = images.float() if isinstance(images, torch.Tensor) else torch.from_numpy(images).float()
    x = (x - x.mean(dim=(1, 2), keepdim=True)) / (x.std(dim=(1, 2), keepdim=True) + 1e-6)
    x = torch.flip(x, dims=[2])
    # Back to 8 bits, as a pipeline that ships uint8 and normalizes on the GPU does: the batch
    # crossing the process boundary stays 3 MB instead of 12.
    out = (x * 32 + 128).clamp_(0, 255).to(torch.uint8)
    return {"image": out, "label": batch["label"]}


class Transformed(SnapshotIterableDataset):
    """The dataset with the transform applied in the worker (where augmentation runs)."""

    def __iter__(self) -> Any:
        for batch in super().__iter__():
            yield transform(batch)


def timed(batches: Iterable[dict[str, Any]]) -> dict[str, float]:
    began = time.perf_counter()
    first = None
    samples = 0
    for batch in batches:
        if first is None:
            first = time.perf_counter() - began
        samples += len(batch["label"])
    seconds = time.perf_counter() - began
    return {"rate": samples / seconds, "first": first or 0.0, "samples": samples}


def bare(snap: snapstore.Snapshot, work: Callable[[Any], Any] | None) -> dict[str, float]:
    batches = snap.batches(BATCH, shuffle=True, seed=1)
    return timed(work(b) if work else b for b in batches)


def loader(snap: snapstore.Snapshot, workers: int, work: bool) -> dict[str, float]:
    cls = Transformed if work else SnapshotIterableDataset
    ds = cls(snap.fingerprint, snap.store.url, batch_size=BATCH, shuffle=True, seed=1)
    return timed(DataLoader(ds, batch_size=None, num_workers=workers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    torch.set_num_threads(1)  # one core per reader process, as DataLoader workers get
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:

        def images(n: int) -> Any:
            return img_samples(n)

        snap = snapstore.snapshot(images, root=Path(tmp))(args.samples)
        snap.materialize()
        bare(snap, None)  # warm the page cache
        results = {
            "reader, no transform": bare(snap, None),
            "DataLoader 0 workers, no transform": loader(snap, 0, False),
            "DataLoader 2 workers, no transform": loader(snap, 2, False),
            "reader + transform (one process)": bare(snap, transform),
            "DataLoader 2 workers + transform": loader(snap, 2, True),
        }
        snap.close()
    print(f"# img workload, {args.samples:,} samples, batch {BATCH}, shuffled, 2 cores\n")
    for name, r in results.items():
        print(f"{name:40} {r['rate']:>10,.0f} samples/s   first batch {r['first'] * 1e3:6.0f} ms")
    base = results["reader, no transform"]["rate"]
    work = results["reader + transform (one process)"]["rate"]
    print()
    print(f"{'DataLoader overhead, 0 workers / reader':48} "
          f"{results['DataLoader 0 workers, no transform']['rate'] / base:6.2f}x")  # fmt: skip
    print(f"{'DataLoader 2 workers / reader (no transform)':48} "
          f"{results['DataLoader 2 workers, no transform']['rate'] / base:6.2f}x")  # fmt: skip
    ratio = results["DataLoader 2 workers + transform"]["rate"] / work
    print(f"{'with transform: 2 workers / one process':48} {ratio:6.2f}x   (target >= 1.5x)")
    if len({r["samples"] for r in results.values()}) != 1:
        raise SystemExit(f"the runs read different numbers of samples: {results}")


if __name__ == "__main__":
    main()
