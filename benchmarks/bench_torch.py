"""A torch DataLoader with workers over a snapshot, against the one-process reader, in one run.

Reads the img workload of bench_format.py shuffled, in batches of 256: by the bare reader
(``snap.batches``) in this process, and through ``DataLoader(SnapshotIterableDataset(...),
batch_size=None, num_workers=W)``, with no transform and with two per-batch CPU transforms:

- ``augment``: per-image random crop, flip and normalization in a Python loop over numpy (what
  a PIL or torchvision-v1 style pipeline does: interpreter-bound, the case DataLoader workers
  exist for);
- ``tensor``: the same normalization as whole-batch torch ops (memory-bound: on a 2-vCPU
  machine two processes doing it at once each run at about half speed, see the control).

As a control, the same transforms over the same batches held in memory by a trivial
``IterableDataset`` show what 2 worker processes can gain on this machine at all. Workers are
persistent and the loader runs two epochs; the second (no worker start-up) is the steady state.

Then ragged tokens: the tok workload of bench_format.py (int32 arrays of 64..1024 tokens and an
id), shuffled, batches of 256, through the DataLoader with 0 and 2 workers in every ``ragged=``
form, best of 3 epochs after a warm-up epoch; against the bare reader in this process and a
plain-torch control sending the same batches as 256 separate tensors (what every varying-shape
field cost across workers before it travelled as one buffer).

    python benchmarks/bench_torch.py              # 20,000 images (~245 MB), 100,000 token rows
    python benchmarks/bench_torch.py --samples 4000 --tok-samples 20000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_format import BATCH, img_samples, tok_samples  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, get_worker_info  # noqa: E402

import snapstore  # noqa: E402
from snapstore.torch import SnapshotIterableDataset  # noqa: E402

Batch = dict[str, Any]


def augment(batch: Batch) -> Batch:
    """Per image: random 56x56 crop, random flip, normalization, back to uint8."""
    images = np.asarray(batch["image"])
    rng = np.random.default_rng(int(np.asarray(batch["label"])[0]))
    out = np.empty((len(images), 56, 56, 3), np.uint8)
    for i, image in enumerate(images):
        y, x = rng.integers(0, 9, 2)
        crop = image[y : y + 56, x : x + 56]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        f = crop.astype(np.float32)
        out[i] = np.clip((f - f.mean()) / (f.std() + 1e-6) * 32 + 128, 0, 255)
    return {"image": torch.from_numpy(out), "label": batch["label"]}


def tensor(batch: Batch) -> Batch:
    """Whole-batch float conversion, per-image normalization and a flip, back to uint8."""
    images = batch["image"]
    x = images.float() if isinstance(images, torch.Tensor) else torch.from_numpy(images).float()
    x = (x - x.mean(dim=(1, 2), keepdim=True)) / (x.std(dim=(1, 2), keepdim=True) + 1e-6)
    x = torch.flip(x, dims=[2])
    return {"image": (x * 32 + 128).clamp_(0, 255).to(torch.uint8), "label": batch["label"]}


TRANSFORMS: dict[str, Callable[[Batch], Batch] | None] = {
    "none": None,
    "augment": augment,
    "tensor": tensor,
}


class Transformed(SnapshotIterableDataset):
    """The dataset with a transform applied in the worker (where augmentation runs)."""

    def __init__(self, *args: Any, work: Callable[[Batch], Batch], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.work = work

    def __iter__(self) -> Iterator[Batch]:
        return map(self.work, super().__iter__())


class InMemory(IterableDataset[Batch]):
    """The control: fixed batches split between workers, transformed, no snapshot involved."""

    def __init__(self, batches: list[Batch], work: Callable[[Batch], Batch]) -> None:
        self.batches, self.work = batches, work

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        mine = self.batches if info is None else self.batches[info.id :: info.num_workers]
        return map(self.work, mine)


def timed(batches: Iterable[Batch], key: str = "label") -> dict[str, float]:
    began = time.perf_counter()
    samples = 0
    for batch in batches:
        samples += len(batch[key])
    return {"rate": samples / (time.perf_counter() - began), "samples": samples}


def bare(snap: snapstore.Snapshot, work: Callable[[Batch], Batch] | None) -> dict[str, float]:
    batches = snap.batches(BATCH, shuffle=True, seed=1, epoch=1)
    return timed(work(b) if work else b for b in batches)


def loader(dataset: Any, workers: int, epochs: int = 1, key: str = "label") -> dict[str, float]:
    """The best of ``epochs`` epochs through persistent workers, after one that pays worker
    start-up."""
    extra: dict[str, Any] = {"persistent_workers": True} if workers else {}
    loaded = DataLoader(dataset, batch_size=None, num_workers=workers, **extra)
    timed(loaded, key)
    return max((timed(loaded, key) for _ in range(epochs)), key=lambda r: r["rate"])


FORMS = ("list", "nested", "packed", "pad")


class SeparateTensors(IterableDataset[Batch]):
    """The control: held token batches sent as 256 separate tensors each, no snapshot."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        mine = self.batches if info is None else self.batches[info.id :: info.num_workers]
        for batch in mine:
            yield {"tokens": [t.clone() for t in batch["tokens"]], "id": batch["id"]}


def ragged_tokens(root: Path, samples: int) -> dict[str, Any]:
    """Rates (samples/s) of the tok workload in every ragged form, with 0 and 2 workers."""
    snap = snapstore.snapshot(tok_samples, root=root)(samples)
    snap.materialize()
    opts = {"batch_size": BATCH, "shuffle": True, "seed": 0}
    reader = snap.batches(BATCH, shuffle=True, seed=0)
    timed(reader, "id")  # warm the page cache
    rates: dict[str, Any] = {"reader": max(timed(reader, "id")["rate"] for _ in range(3))}
    counts = set()
    for form in FORMS:
        ds = SnapshotIterableDataset(snap.fingerprint, snap.store.url, ragged=form, **opts)
        for workers in (0, 2):
            run = loader(ds, workers, epochs=3, key="id")
            rates[f"{form}{workers}"] = run["rate"]
            counts.add(run["samples"])
    held = list(SnapshotIterableDataset(snap, **opts))
    rates["separate2"] = loader(SeparateTensors(held), 2, epochs=3, key="id")["rate"]
    # torch's other sharing strategy: segments named, not handed over as file descriptors
    strategy = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    ds = SnapshotIterableDataset(snap.fingerprint, snap.store.url, **opts)
    rates["file_system2"] = loader(ds, 2, epochs=3, key="id")["rate"]
    torch.multiprocessing.set_sharing_strategy(strategy)
    snap.close()
    if len(counts) != 1:
        raise SystemExit(f"the token runs read different numbers of samples: {sorted(counts)}")
    return rates


def report_tokens(rates: dict[str, Any], samples: int) -> None:
    print(f"\n# tok workload, {samples:,} samples (int32, 64..1024 tokens), batch {BATCH}, "
          "shuffled")  # fmt: skip
    print("# samples/s, best of 3 epochs (DataLoader: persistent workers, after a warm-up)\n")
    print(f"{'ragged':10} {'DL 0 w':>9} {'DL 2 w':>9} {'2 w / 0 w':>10}")
    for form in FORMS:
        zero, two = rates[f"{form}0"], rates[f"{form}2"]
        print(f"{form:10} {zero:>9,.0f} {two:>9,.0f} {two / zero:>9.2f}x")
    print(f"\nbare reader in this process (ragged='list'): {rates['reader']:,.0f}")
    print(f"control, plain torch, 2 workers, 256 separate tensors per batch: "
          f"{rates['separate2']:,.0f}")  # fmt: skip
    shared = rates["file_system2"]
    print(f"ragged='list', 2 workers, torch sharing strategy 'file_system': {shared:,.0f} "
          f"({shared / rates['list0']:.2f}x 0 workers)")  # fmt: skip
    default = rates["list2"]
    print(f"tok: default ragged='list', 2 workers / 0 workers: {default / rates['list0']:.2f}x "
          "(target >= 0.5x)")  # fmt: skip
    print(f"tok: default ragged='list', 2 workers / ragged='pad', 2 workers: "
          f"{default / rates['pad2']:.2f}x (target >= 1x)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--tok-samples", type=int, default=None, help="default: 5 x --samples")
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    torch.set_num_threads(1)  # one core per process, as DataLoader workers get
    rows = []
    counts: set[float] = set()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:

        def images(n: int) -> Any:
            return img_samples(n)

        snap = snapstore.snapshot(images, root=Path(tmp))(args.samples)
        snap.materialize()
        bare(snap, None)  # warm the page cache
        held = [dict(b) for b in snap.batches(BATCH, shuffle=True, seed=1)]
        for name, work in TRANSFORMS.items():
            opts = {"batch_size": BATCH, "shuffle": True, "seed": 1}
            ds = (
                SnapshotIterableDataset(snap.fingerprint, snap.store.url, **opts)
                if work is None
                else Transformed(snap.fingerprint, snap.store.url, work=work, **opts)
            )
            ds.set_epoch(1)
            runs = {"reader": bare(snap, work)}
            for workers in (0, 2):
                runs[f"loader{workers}"] = loader(ds, workers)
                if work is not None:
                    runs[f"control{workers}"] = loader(InMemory(held, work), workers)
            counts |= {r["samples"] for r in runs.values()}
            rows.append({"transform": name, **{k: r["rate"] for k, r in runs.items()}})
        snap.close()
    tok_count = args.tok_samples or 5 * args.samples
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tok_rates = ragged_tokens(Path(tmp), tok_count)
    print(f"# img workload, {args.samples:,} samples, batch {BATCH}, shuffled, 2 cores")
    print("# samples/s; DataLoader rows are the 2nd epoch of persistent workers\n")
    print(
        f"{'transform':10} {'reader':>9} {'DL 0 w':>9} {'DL 2 w':>9} {'2 w/reader':>11} "
        f"{'ctrl 0 w':>9} {'ctrl 2 w':>9} {'ctrl 2/0':>9}"
    )
    for row in rows:
        ratio = row["loader2"] / row["reader"]
        control = (
            f"{row['control0']:>9,.0f} {row['control2']:>9,.0f} "
            f"{row['control2'] / row['control0']:>8.2f}x"
            if "control0" in row
            else ""
        )
        print(
            f"{row['transform']:10} {row['reader']:>9,.0f} {row['loader0']:>9,.0f} "
            f"{row['loader2']:>9,.0f} {ratio:>10.2f}x {control}"
        )
    none = rows[0]
    print()
    overhead = none["loader0"] / none["reader"]
    print(f"DataLoader overhead, 0 workers / reader (no transform): {overhead:.2f}x")
    for row in rows[1:]:
        ratio, control = row["loader2"] / row["reader"], row["control2"] / row["control0"]
        print(f"{row['transform']}: DataLoader 2 workers / one-process reader: {ratio:.2f}x "
              f"(target >= 1.5x; what 2 processes gain here at all: {control:.2f}x)")  # fmt: skip
    if len(counts) != 1:
        raise SystemExit(f"the runs read different numbers of samples: {sorted(counts)}")
    report_tokens(tok_rates, tok_count)


if __name__ == "__main__":
    main()
