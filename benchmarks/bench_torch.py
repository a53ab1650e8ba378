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

Last, both workloads through the DataLoader with 2 workers against a memmap baseline, in
alternating epochs: ``SnapshotIterableDataset`` (persistent workers, ``batch_size=None``)
against a map-style dataset over numpy memmaps of the same data whose ``__getitems__`` fetches
a whole batch with one fancy index per field (for tokens, one gather of the batch's slices into
one buffer), driven by a batch sampler that yields, batch for batch, what the snapshot's
workers read in each epoch (checked: both loaders deliver the same ids in the same order), with
the same 2 workers, batch size and an identity collate. The main process gives every batch
to the same consumer, :func:`touch`, which copies every byte of every sample.

Before it, workers against no workers (issue 24), both workloads: the dataset with
``num_workers=0``, with 2 workers as it is (each worker's batches in a pool of shared-memory
segments recycled across batches), with 2 workers and one new segment per batch (the way before
the pool, ``SNAPSTORE_POOL_SEGMENTS=0``), and a control: a plain in-memory array (the same data,
loaded whole) through the same 2 workers (and with none), each batch one fancy index (tokens
gathered into one buffer, a RaggedList), sent the way torch sends tensors. Every loader has
persistent workers and a warm-up pass; then 3 rounds, in each 3 consecutive passes of every
loader in turn, with two consumers: one that only counts samples, one that copies every byte
(:func:`touch`); neither keeps anything of a batch. Ratios are to the ``num_workers=0`` passes
of the same round; the table gives their median and range, and the CPU time per batch of the
main process and the workers together (from /proc, Linux): what workers cost when the cores are
busy.

    python benchmarks/bench_torch.py              # 20,000 images (~245 MB), 100,000 token rows
    python benchmarks/bench_torch.py --samples 4000 --tok-samples 20000
    python benchmarks/bench_torch.py --only memmap    # just the memmap comparison
    python benchmarks/bench_torch.py --only workers   # just workers against no workers
"""

from __future__ import annotations

import argparse
import os
import statistics
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
from bench_format import BATCH, child_memmap_write, img_samples, tok_samples  # noqa: E402
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info  # noqa: E402

import snapstore  # noqa: E402
from snapstore.torch import RaggedList, SnapshotIterableDataset  # noqa: E402
from snapstore.torch_pool import POOL_SEGMENTS_ENV  # noqa: E402

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


def ragged_tokens(snap: snapstore.Snapshot) -> dict[str, Any]:
    """Rates (samples/s) of the tok workload in every ragged form, with 0 and 2 workers."""
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


# -- the DataLoader against a memmap dataset ----------------------------------------------------


def touch(batch: Batch, scratch: dict[str, torch.Tensor]) -> int:
    """The consumer in the main process: every sample of every field copied into a buffer reused
    from batch to batch (a tensor in one ``copy_``, a list of tensors packed by one
    ``torch.cat(out=)``), so every byte is read once. Returns the bytes touched."""
    touched = 0
    for name, value in batch.items():
        parts = [value] if isinstance(value, torch.Tensor) else list(value)
        flat = [part.reshape(-1) for part in parts]
        size = sum(part.numel() for part in flat)
        buffer = scratch.get(name)
        if buffer is None or buffer.dtype != flat[0].dtype or buffer.numel() < size:
            buffer = scratch[name] = torch.empty(2 * size, dtype=flat[0].dtype)
        if len(flat) == 1:
            buffer[:size].copy_(flat[0])
        else:
            torch.cat(flat, out=buffer[:size])
        touched += size * buffer.element_size()
    return touched


class MemmapDataset(Dataset[Batch]):
    """The baseline: bench_format's memmap files, a whole batch per ``__getitems__`` call.

    img: ``images[idx]`` and ``labels[idx]`` (one fancy index per field). tok: the batch's
    token slices gathered into one buffer (one ``np.concatenate``), sent as a
    :class:`~snapstore.torch.RaggedList` over it (the form ``SnapshotIterableDataset`` yields),
    and the ids. The files are mapped lazily, in the worker that reads.
    """

    def __init__(self, directory: str, workload: str, samples: int) -> None:
        self.directory, self.workload, self.samples = directory, workload, samples
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.samples

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None}

    def _open(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            # a plain ndarray over the map: slicing an np.memmap makes a memmap per slice
            data = np.load(f"{self.directory}/data.npy", mmap_mode="r").view(np.ndarray)
            other = "labels" if self.workload == "img" else "offsets"
            self._arrays = (data, np.load(f"{self.directory}/{other}.npy"))
        return self._arrays

    def __getitem__(self, index: int) -> Batch:
        return self.__getitems__([index])

    def __getitems__(self, indices: Any) -> Batch:
        data, other = self._open()
        idx = np.asarray(indices, np.int64)
        if self.workload == "img":
            return {"image": torch.from_numpy(data[idx]), "label": torch.from_numpy(other[idx])}
        starts, ends = other[idx], other[idx + 1]
        values = np.concatenate([data[a:b] for a, b in zip(starts.tolist(), ends.tolist())])
        offsets = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(ends - starts, out=offsets[1:])
        tokens = RaggedList(torch.from_numpy(values), torch.from_numpy(offsets))
        return {"tokens": tokens, "id": torch.from_numpy(idx)}


def identity(batch: Batch) -> Batch:
    """The collate of the baseline: ``__getitems__`` already returns the batch."""
    return batch


class SnapshotOrder:
    """A batch sampler: the batches the snapshot's DataLoader workers read in epoch ``epoch``
    (:meth:`set_epoch`), interleaved as DataLoader takes them (worker 0's first, worker 1's
    first, worker 0's second...). Epochs ``first .. first + epochs - 1`` are computed up front,
    outside the timing."""

    def __init__(self, snap: snapstore.Snapshot, seed: int, first: int, epochs: int) -> None:
        self.orders = {e: self._epoch(snap, seed, e) for e in range(first, first + epochs)}
        self.epoch = first

    @staticmethod
    def _epoch(snap: snapstore.Snapshot, seed: int, epoch: int) -> list[np.ndarray]:
        shares = []
        for worker in range(WORKERS):
            reader = snap.batches(BATCH, shuffle=True, seed=seed, epoch=epoch, worker=worker,
                                  num_workers=WORKERS)  # fmt: skip
            order = reader.plan.order()
            shares.append([order[i : i + BATCH] for i in range(0, len(order), BATCH)])
        if len({len(share) for share in shares}) != 1:
            raise SystemExit("the snapshot's workers read different numbers of batches")
        return [batch for group in zip(*shares) for batch in group]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.orders[self.epoch])

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.orders[self.epoch])


WORKERS = 2


def consumed(loaded: Iterable[Batch], key: str) -> dict[str, Any]:
    """One pass, every batch through :func:`touch`: its rate and the ids in the order read."""
    scratch: dict[str, torch.Tensor] = {}
    ids = []
    began = time.perf_counter()
    touched = 0
    for batch in loaded:
        touched += touch(batch, scratch)
        ids.append(batch[key])
    seconds = time.perf_counter() - began
    order = torch.cat(ids).numpy()
    return {"rate": len(order) / seconds, "mb_s": touched / seconds / 1e6, "order": order}


def against_memmap(
    snap: snapstore.Snapshot, workload: str, samples: int, tmp: Path, epochs: int = 3
) -> dict[str, Any]:
    """snapstore and the memmap dataset through DataLoaders with 2 persistent workers: a warm-up
    pass each, then ``epochs`` passes each, alternating; the best pass of each."""
    mm_dir = tmp / f"{workload}-memmap"
    mm_dir.mkdir()
    child_memmap_write(workload, samples, str(mm_dir))
    key, seed, first = ("label" if workload == "img" else "id"), 3, 1
    ds = SnapshotIterableDataset(snap.fingerprint, snap.store.url, batch_size=BATCH, seed=seed)
    ds.set_epoch(first)
    common: dict[str, Any] = {"num_workers": WORKERS, "persistent_workers": True}
    order = SnapshotOrder(snap, seed, first, epochs + 1)
    loaders = {
        "snapstore": DataLoader(ds, batch_size=None, **common),
        "memmap": DataLoader(
            MemmapDataset(str(mm_dir), workload, samples),
            batch_sampler=order,
            collate_fn=identity,
            **common,
        ),
    }
    best: dict[str, dict[str, Any]] = {}
    same = True
    for _ in range(epochs + 1):  # the first pass of each starts its workers
        order.set_epoch(first + _)  # the snapshot's persistent workers move on by themselves
        runs = {name: consumed(loaded, key) for name, loaded in loaders.items()}
        same &= np.array_equal(runs["snapstore"]["order"], runs["memmap"]["order"])
        if _:
            for name, run in runs.items():
                if name not in best or run["rate"] > best[name]["rate"]:
                    best[name] = run
    del loaders
    return {"workload": workload, "samples": samples, "same_order": same, **best}


def report_memmap(results: list[dict[str, Any]]) -> None:
    print(f"\n# DataLoader, {WORKERS} workers, batch {BATCH}, shuffled: SnapshotIterableDataset "
          "against a map-style memmap dataset")  # fmt: skip
    print("# (__getitems__, one fancy index per field, batch sampler in the snapshot's order)")
    print("# samples/s and MB/s, best of 3 epochs; every byte copied in the main process\n")
    print(f"{'workload':9} {'samples':>8} {'snapstore':>10} {'memmap':>10} {'MB/s':>7} "
          f"{'MB/s':>7} {'ratio':>6}  same order")  # fmt: skip
    for r in results:
        snap, mm = r["snapstore"], r["memmap"]
        print(f"{r['workload']:9} {r['samples']:>8,} {snap['rate']:>10,.0f} {mm['rate']:>10,.0f} "
              f"{snap['mb_s']:>7,.0f} {mm['mb_s']:>7,.0f} {snap['rate'] / mm['rate']:>5.2f}x  "
              f"{r['same_order']}")  # fmt: skip
    for r in results:
        ratio = r["snapstore"]["rate"] / r["memmap"]["rate"]
        print(f"{r['workload']}: DataLoader {WORKERS} workers, snapstore / memmap dataset: "
              f"{ratio:.2f}x (target >= 1.0x)")  # fmt: skip
    if not all(r["same_order"] for r in results):
        raise SystemExit("snapstore and the memmap dataset read different orders")


# -- workers against no workers (issue 24) -----------------------------------------------------


class InMemoryArrays(IterableDataset[Batch]):
    """The control: the workload held whole in numpy arrays; each worker takes its share of a
    shuffled order, each batch by one fancy index (tokens: the rows gathered into one buffer,
    sent as a RaggedList), and torch sends the tensors its own way (a new segment each)."""

    def __init__(self, arrays: dict[str, np.ndarray], seed: int) -> None:
        self.arrays = arrays
        count = len(arrays["label" if "label" in arrays else "id"])
        self.order = np.random.default_rng(seed).permutation(count)

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        batches = [self.order[i : i + BATCH] for i in range(0, len(self.order), BATCH)]
        mine = batches if info is None else batches[info.id :: info.num_workers]
        return map(self.batch, mine)

    def batch(self, idx: np.ndarray) -> Batch:
        if "image" in self.arrays:
            images, labels = self.arrays["image"], self.arrays["label"]
            return {"image": torch.from_numpy(images[idx]), "label": torch.from_numpy(labels[idx])}
        data, offsets, ids = self.arrays["tokens"], self.arrays["offsets"], self.arrays["id"]
        starts, ends = offsets[idx], offsets[idx + 1]
        values = np.concatenate([data[a:b] for a, b in zip(starts.tolist(), ends.tolist())])
        bounds = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(ends - starts, out=bounds[1:])
        tokens = RaggedList(torch.from_numpy(values), torch.from_numpy(bounds))
        return {"tokens": tokens, "id": torch.from_numpy(ids[idx])}


def held_arrays(snap: snapstore.Snapshot) -> dict[str, np.ndarray]:
    """The whole snapshot in memory, in its own order: fixed fields stacked, tokens packed."""
    batches = list(snap.batches(4096, shuffle=False, ragged="packed"))
    if "image" in batches[0]:
        return {k: np.concatenate([b[k] for b in batches]) for k in ("image", "label")}
    lengths = np.concatenate([np.diff(b["tokens_offsets"]) for b in batches])
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.concatenate([b["tokens"] for b in batches])
    return {"tokens": tokens, "offsets": offsets, "id": np.concatenate([b["id"] for b in batches])}


WORKER_ROWS = {
    "none0": "snapstore, 0 workers",
    "pool2": "snapstore, 2 workers, pool",
    "fresh2": "snapstore, 2 workers, segment per batch",
    "plain2": "in-memory array, 2 workers",
    "plain0": "in-memory array, 0 workers",
}


def cpu_seconds(loaded: Any) -> float:
    """CPU time (user + system, every thread) of this process and the loader's persistent
    workers so far, from /proc (Linux)."""
    iterator = getattr(loaded, "_iterator", None)  # DataLoader's own; None before a pass
    pids = [os.getpid(), *(w.pid for w in getattr(iterator, "_workers", []))]
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def passes(loaded: Any, key: str, consumer: str, count: int = 3) -> tuple[float, float]:
    """``count`` passes in a row (persistent workers: consecutive epochs), the batches given
    to the consumer (``"count"`` or ``"touch"``) and dropped at once: samples/s, and the CPU
    milliseconds per batch of all the loader's processes together."""
    scratch: dict[str, torch.Tensor] = {}
    cpu = cpu_seconds(loaded)
    began, samples, batches = time.perf_counter(), 0, 0
    for _ in range(count):
        for batch in loaded:
            if consumer == "touch":
                touch(batch, scratch)
            samples += len(batch[key])
            batches += 1
    rate = samples / (time.perf_counter() - began)
    return rate, (cpu_seconds(loaded) - cpu) / batches * 1e3


def workers_against_none(snap: snapstore.Snapshot, workload: str, rounds: int = 3) -> Batch:
    """Samples/s of every WORKER_ROWS loader, per consumer and round (see the module doc)."""
    key = "label" if workload == "img" else "id"
    ds = SnapshotIterableDataset(snap.fingerprint, snap.store.url, batch_size=BATCH, seed=5)
    plain = InMemoryArrays(held_arrays(snap), seed=5)
    loaders: dict[str, Any] = {}
    for name in WORKER_ROWS:
        workers = int(name[-1])
        extra: dict[str, Any] = {"persistent_workers": True} if workers else {}
        source = plain if name.startswith("plain") else ds
        loaders[name] = DataLoader(source, batch_size=None, num_workers=workers, **extra)
        # The workers start at the first pass and read the setting then: 0 = no pool.
        os.environ[POOL_SEGMENTS_ENV] = "0" if name == "fresh2" else "8"
        passes(loaders[name], key, "count", 1)
    del os.environ[POOL_SEGMENTS_ENV]
    rates: dict[str, dict[str, list[float]]] = {"count": {}, "touch": {}}
    cpu: dict[str, list[float]] = {}
    for _ in range(rounds):
        for consumer, by_loader in rates.items():
            for name, loaded in loaders.items():
                rate, milliseconds = passes(loaded, key, consumer)
                by_loader.setdefault(name, []).append(rate)
                if consumer == "count":
                    cpu.setdefault(name, []).append(milliseconds)
    del loaders
    return {"workload": workload, "rates": rates, "cpu": cpu}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def report_workers(results: list[Batch]) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n# DataLoader workers against none, batch {BATCH}, shuffled, 2 cores: samples/s, "
          "median of 3 rounds;")  # fmt: skip
    print("# ratio: to the 0-worker pass of the same round, median (range)")
    print("# count: the main process counts samples; touch: it copies every byte (touch());")
    print("# each round: 3 consecutive passes of each loader in turn (persistent workers)")
    print("# cpu: CPU ms per batch of the main process and the workers together (count)")
    print(f"# load average at the end: {load}\n")
    print(f"{'':6} {'loader':40} {'count':>9} {'ratio':>17} {'touch':>9} {'ratio':>17} "
          f"{'cpu':>5}")  # fmt: skip
    for result in results:
        rates = result["rates"]
        for name, label in WORKER_ROWS.items():
            cells = []
            for consumer in ("count", "touch"):
                mine, base = rates[consumer][name], rates[consumer]["none0"]
                ratios = [a / b for a, b in zip(mine, base)]
                cells.append(f"{statistics.median(mine):>9,.0f} {spread(ratios):>17}")
            cells.append(f"{statistics.median(result['cpu'][name]):>5.2f}")
            print(f"{result['workload'] + ',':6} {label:40} {' '.join(cells)}")
    for result in results:
        rates = result["rates"]["touch"]
        ratios = [a / b for a, b in zip(rates["pool2"], rates["none0"])]
        print(f"{result['workload']}: 2 workers (pool) / 0 workers, touching every byte: "
              f"{spread(ratios)} (target >= 0.9x)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--tok-samples", type=int, default=None, help="default: 5 x --samples")
    parser.add_argument("--only", choices=("all", "memmap", "workers"), default="all")
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    torch.set_num_threads(1)  # one core per process, as DataLoader workers get
    tok_count = args.tok_samples or 5 * args.samples
    compared: list[dict[str, Any]] = []
    workers: list[Batch] = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:

        def images(n: int) -> Any:
            return img_samples(n)

        snap = snapstore.snapshot(images, root=Path(tmp))(args.samples)
        snap.materialize()
        bare(snap, None)  # warm the page cache
        rows = [] if args.only != "all" else transform_rows(snap)
        if args.only in ("all", "workers"):
            workers.append(workers_against_none(snap, "img"))
        if args.only != "workers":
            compared.append(against_memmap(snap, "img", args.samples, Path(tmp)))
        snap.close()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        snap = snapstore.snapshot(tok_samples, root=Path(tmp))(tok_count)
        snap.materialize()
        tok_rates = None if args.only != "all" else ragged_tokens(snap)
        if args.only in ("all", "workers"):
            workers.append(workers_against_none(snap, "tok"))
        if args.only != "workers":
            compared.append(against_memmap(snap, "tok", tok_count, Path(tmp)))
        snap.close()
    if rows:
        report_transforms(rows, args.samples)
    if tok_rates:
        report_tokens(tok_rates, tok_count)
    if workers:
        report_workers(workers)
    if compared:
        report_memmap(compared)


def transform_rows(snap: snapstore.Snapshot) -> list[dict[str, Any]]:
    """The img table: the bare reader and the DataLoader with 0 and 2 workers, per transform."""
    rows = []
    counts: set[float] = set()
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
    if len(counts) != 1:
        raise SystemExit(f"the runs read different numbers of samples: {sorted(counts)}")
    return rows


def report_transforms(rows: list[dict[str, Any]], samples: int) -> None:
    print(f"# img workload, {samples:,} samples, batch {BATCH}, shuffled, 2 cores")
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


if __name__ == "__main__":
    main()
