"""Batches onto the GPU: the input wait of a fixed-time training step, four ways, in one run.

Targets (issue 30), on one GPU, where the host produces batches fast enough:

- input-wait share of the step at most 2% at 10 ms steps (``to_device``);
- host-to-device throughput, flat out (no step), at least 80% of the pinned-copy peak measured
  in the same run (a 512 MiB pinned tensor copied to the device);
- main-process CPU time per batch at most half that of snapstore's ``pin_memory=True`` path.

A step is a chain of bf16 matmuls calibrated at start to take 5, 10 and 20 ms of GPU time (and
0: flat out, which gives the GB/s), after reading one element of each of the batch's tensors
(so it depends on its copy); the host runs at most 2 steps ahead of the GPU. The input-wait
share is ``1 - steps x step time / wall time``.
Batches: img (uint8 256 x 224 x 224 x 3, as snapstore stores images: 38.5 MB) and tok
(bench_format's tok shape, int32 values and offsets: ``ragged="packed"``), through:

- ``on device``: a few batches copied to the device once, cycled (the limit);
- ``memmap pin``: a map-style dataset of whole batches over numpy memmaps of the same data, in a
  DataLoader with ``pin_memory=True``, then ``.to(device, non_blocking=True)``;
- ``snap pin``: ``SnapshotIterableDataset`` in a DataLoader with ``pin_memory=True``, then
  ``.to(device, non_blocking=True)``;
- ``to_device``: the same DataLoader without ``pin_memory``, through
  ``snapstore.torch.to_device`` (pool segments pinned once, copies on a side stream).

Main-process CPU time is ``time.process_time()`` of this process (its threads, the DataLoader's
pin-memory thread included; not the workers). Without CUDA it prints "no CUDA device: nothing
measured" and exits 0; ``--cpu-smoke`` runs the same code paths on the CPU with tiny sizes (no
pinning there: the figures prove the script runs, nothing more).
Usage: ``python benchmarks/bench_gpu.py [--workers 8] [--batches 24]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_format import print_rows, tok_lengths, tok_samples
from torch.utils.data import DataLoader, Dataset

import snapstore
from snapstore.torch import SnapshotIterableDataset, to_device
from snapstore.torch_device import move_batch

STEPS_MS = (0, 5, 10, 20)
PATHS = ("on device", "memmap pin", "snap pin", "to_device")


class Sizes:
    def __init__(self, smoke: bool, batches: int) -> None:
        self.side = 32 if smoke else 224
        self.batch = 16 if smoke else 256
        self.warm = 2 if smoke else 4
        self.batches = batches
        self.samples = self.batch * (self.warm + batches + 2)  # one epoch covers a run


def img_samples(n: int, side: int) -> Iterator[dict[str, Any]]:
    """Smooth images (sinusoids and mild noise) from 64 bases, rolled."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:side].astype(np.float32)
    bases = []
    for _ in range(64):
        fx, fy, phase = rng.uniform(0.01, 0.08, 3)
        base = 90 * np.sin(x * fx + phase) + 70 * np.cos(y * fy - phase) + 128
        img = np.stack([base, 0.8 * base + 25, 0.6 * base + 40], axis=-1)
        bases.append(np.clip(img + rng.normal(0, 2.0, img.shape), 0, 255).astype(np.uint8))
    for i in range(n):
        yield {"image": np.roll(bases[i % 64], i // 64, axis=1), "label": i}


def write_data(workload: str, sizes: Sizes, tmp: Path) -> tuple[snapstore.Snapshot, Path]:
    """The workload as a snapshot and as numpy memmaps (one file per array)."""
    n = sizes.samples
    if workload == "img":
        snap = snapstore.snapshot(img_samples, root=tmp / "img-root")(n, sizes.side)
    else:
        snap = snapstore.snapshot(tok_samples, root=tmp / "tok-root")(n)
    snap.materialize()
    mm = tmp / f"{workload}-memmap"
    mm.mkdir()
    if workload == "img":
        out = np.lib.format.open_memmap(
            mm / "image.npy", "w+", np.uint8, (n, sizes.side, sizes.side, 3)
        )
        for i, sample in enumerate(img_samples(n, sizes.side)):
            out[i] = sample["image"]
        out.flush()
    else:
        lengths = tok_lengths(n)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.lib.format.open_memmap(mm / "tokens.npy", "w+", np.int32, (int(offsets[-1]),))
        for i, sample in enumerate(tok_samples(n)):
            values[offsets[i] : offsets[i + 1]] = sample["tokens"]
        values.flush()
        np.save(mm / "offsets.npy", offsets)
    return snap, mm


class MemmapBatches(Dataset[dict[str, torch.Tensor]]):
    """Whole shuffled batches over the memmaps: one fancy index (or gather) per batch."""

    def __init__(self, workload: str, mm: Path, batch: int, samples: int) -> None:
        self.workload, self.mm, self.batch = workload, mm, batch
        self.order = np.random.default_rng(5).permutation(samples)

    def __len__(self) -> int:
        return len(self.order) // self.batch

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        picked = np.sort(self.order[index * self.batch : (index + 1) * self.batch])
        if self.workload == "img":
            images = np.load(self.mm / "image.npy", mmap_mode="r")
            return {"image": torch.from_numpy(images[picked]), "label": torch.from_numpy(picked)}
        values = np.load(self.mm / "tokens.npy", mmap_mode="r")
        offsets = np.load(self.mm / "offsets.npy")
        starts, ends = offsets[picked], offsets[picked + 1]
        out_offsets = np.zeros(len(picked) + 1, np.int64)
        np.cumsum(ends - starts, out=out_offsets[1:])
        tokens = np.concatenate([values[s:e] for s, e in zip(starts, ends)])
        return {
            "tokens": torch.from_numpy(tokens),
            "tokens_offsets": torch.from_numpy(out_offsets),
            "id": torch.from_numpy(picked),
        }


def tensors(batch: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    move_batch(batch, lambda t: found.append(t) or t)
    return found


class Step:
    """A chain of matmuls of a fixed GPU time, calibrated; ``run(batch)`` reads one element of
    each of the batch's tensors first, so that the step waits for the batch's copies."""

    def __init__(self, device: torch.device, sync: Callable[[], None]) -> None:
        cuda = device.type == "cuda"
        n = 4096 if cuda else 96
        dtype = torch.bfloat16 if cuda else torch.float32
        self.a = torch.randn(n, n, device=device, dtype=dtype) / n**0.5
        self.c = torch.empty_like(self.a)
        self.acc = torch.zeros((), device=device)
        self.sync, self.repeats, self.cuda = sync, 0, cuda
        self.done: deque[Any] = deque()  # the last steps' events
        self.per_mm = self._time(40) / 40

    def _time(self, repeats: int) -> float:
        self._mm(repeats)  # warm
        self.sync()
        began = time.perf_counter()
        self._mm(repeats)
        self.sync()
        return time.perf_counter() - began

    def _mm(self, repeats: int) -> None:
        for _ in range(repeats):
            torch.mm(self.a, self.a, out=self.c)

    def calibrate(self, ms: float) -> float:
        """Set the step to about ``ms``; the measured time of one step in seconds."""
        self.repeats = round(ms / 1e3 / self.per_mm)
        return self._time(self.repeats * 10) / 10 if self.repeats else 0.0

    def run(self, batch: Any) -> None:
        for tensor in tensors(batch):
            self.acc += tensor.reshape(-1)[:1].float().sum()
        self._mm(self.repeats)
        if self.cuda:
            # The host runs at most 2 steps ahead, as a loop reading its loss does; the event
            # sleeps instead of spinning, so waiting costs the main process no CPU time.
            event = torch.cuda.Event(blocking=True)
            event.record()
            self.done.append(event)
            if len(self.done) > 2:
                self.done.popleft().synchronize()


def measure(batches: Iterable[Any], step: Step, sizes: Sizes) -> dict[str, float]:
    iterator = iter(batches)
    for _ in range(sizes.warm):  # workers start, segments are made and pinned
        step.run(next(iterator))
    step.sync()
    cpu, began, moved = time.process_time(), time.perf_counter(), 0
    for _ in range(sizes.batches):
        batch = next(iterator)
        moved += sum(t.nbytes for t in tensors(batch))
        step.run(batch)
    step.sync()
    wall = time.perf_counter() - began
    cpu = time.process_time() - cpu
    del iterator  # its workers go
    return {"wall": wall, "cpu": cpu, "bytes": moved}


def path_batches(
    path: str, workload: str, snap: snapstore.Snapshot, mm: Path, sizes: Sizes, args: Any
) -> Iterable[Any]:
    device, cuda = args.device, args.device.type == "cuda"
    pin = {"pin_memory": cuda}  # pin_memory needs CUDA: on the CPU smoke the path runs without
    form = "packed" if workload == "tok" else "list"
    common: dict[str, Any] = {"batch_size": None, "num_workers": args.workers}

    def moved(loader: Iterable[Any]) -> Iterator[Any]:
        for batch in loader:
            yield move_batch(batch, lambda t: t.to(device, non_blocking=True))

    def snap_loader(**extra: Any) -> DataLoader[Any]:
        ds = SnapshotIterableDataset(snap, batch_size=sizes.batch, seed=1, ragged=form)
        return DataLoader(ds, **common, **extra)

    if path == "on device":
        held = [move_batch(b, lambda t: t.to(device)) for _, b in zip(range(4), snap_loader())]
        return (held[i % len(held)] for i in range(sizes.warm + sizes.batches))
    if path == "memmap pin":
        memmap = MemmapBatches(workload, mm, sizes.batch, sizes.samples)
        return moved(DataLoader(memmap, shuffle=False, **common, **pin))
    if path == "snap pin":
        return moved(snap_loader(**pin))
    return to_device(snap_loader(), device, prefetch=args.prefetch)


def pinned_peak(device: torch.device, sync: Callable[[], None], smoke: bool) -> float:
    """GB/s of a big pinned tensor copied to the device (a clone on the CPU smoke)."""
    size = (8 << 20) if smoke else (512 << 20)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    target = torch.empty(size, dtype=torch.uint8, device=device)
    target.copy_(host, non_blocking=True)
    sync()
    began = time.perf_counter()
    for _ in range(10):
        target.copy_(host, non_blocking=True)
    sync()
    return 10 * size / (time.perf_counter() - began) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--workers", type=int, default=min(8, max(1, (os.cpu_count() or 2) - 4)))
    parser.add_argument("--batches", type=int, default=24, help="measured batches per run")
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("no CUDA device: nothing measured (--cpu-smoke runs the code paths on the CPU)")
        return 0
    if args.cpu_smoke:
        args.device, args.workers, sync = torch.device("cpu"), min(args.workers, 2), lambda: None
        args.batches = min(args.batches, 6)
    else:
        args.device, sync = torch.device("cuda"), torch.cuda.synchronize
        print(f"device: {torch.cuda.get_device_name()}, {args.workers} workers")
    sizes = Sizes(args.cpu_smoke, args.batches)
    step = Step(args.device, sync)
    step_s = {ms: step.calibrate(ms) for ms in STEPS_MS}
    peak = pinned_peak(args.device, sync, args.cpu_smoke)
    print(
        f"pinned-copy peak: {peak:.1f} GB/s; step times (ms): "
        + ", ".join(f"{ms}: {s * 1e3:.2f}" for ms, s in step_s.items())
    )
    header = ("workload", "path", "step ms", "ms/batch", "input wait", "GB/s", "main CPU ms/batch")
    rows: list[tuple[str, ...]] = [header]
    results: dict[tuple[str, str, int], dict[str, float]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="snapstore-bench-gpu-") as tmp:
        for workload in ("img", "tok"):
            began = time.perf_counter()
            snap, mm = write_data(workload, sizes, Path(tmp))
            took = time.perf_counter() - began
            print(f"{workload}: {sizes.samples} samples written in {took:.1f} s")
            for path in PATHS:
                for ms in STEPS_MS:
                    step.calibrate(ms)
                    got = measure(path_batches(path, workload, snap, mm, sizes, args), step, sizes)
                    wait = max(0.0, 1 - sizes.batches * step_s[ms] / got["wall"])
                    got["wait"] = wait
                    results[workload, path, ms] = got
                    gbs = got["bytes"] / got["wall"] / 1e9 if path != "on device" else 0.0
                    rows.append((
                        workload, path, str(ms),
                        f"{got['wall'] / sizes.batches * 1e3:.2f}", f"{wait:.1%}" if ms else "-",
                        f"{gbs:.2f}" if path != "on device" else "-",
                        f"{got['cpu'] / sizes.batches * 1e3:.2f}",
                    ))  # fmt: skip
    print()
    print_rows(rows)
    for workload in ("img", "tok"):
        mine = results[workload, "to_device", 10]
        flat = results[workload, "to_device", 0]
        pinned = results[workload, "snap pin", 10]
        print(f"{workload}: input wait at 10 ms, to_device: {mine['wait']:.1%} (target <= 2%)")
        print(
            f"{workload}: H2D flat out, to_device / pinned peak: "
            f"{flat['bytes'] / flat['wall'] / 1e9 / peak:.2f} (target >= 0.80)"
        )
        print(
            f"{workload}: main-process CPU per batch at 10 ms, to_device / snap pin: "
            f"{mine['cpu'] / max(pinned['cpu'], 1e-9):.2f} (target <= 0.50)"
        )
    print(f"whole run: {time.perf_counter() - started:.0f} s")
    if args.cpu_smoke:
        print("cpu smoke: the code paths ran; the figures mean nothing for a GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
