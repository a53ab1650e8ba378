"""Train a tiny model from a snapshot with a StatefulDataLoader, checkpoint mid-epoch, resume.

Run:  python examples/torch_training.py [--samples 4096] [--root DIR] [--steps 60]

1. A deterministic stage writes synthetic 16x16 images of 4 classes (once; later runs reuse it).
2. A small convnet trains for ``--steps`` steps from a ``StatefulDataLoader`` with 2 worker
   processes over :class:`snapstore.torch.SnapshotIterableDataset`; halfway through an epoch it
   saves a checkpoint: model, optimizer and loader state, in one file.
3. The script starts itself again in a fresh process with ``--resume CHECKPOINT``; that process
   restores everything and trains the remaining steps. It checks that its batches are exactly
   those the uninterrupted run read after the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

import snapstore
from snapstore.torch import SnapshotIterableDataset

BATCH = 64


@snapstore.snapshot
def shapes(num_samples: int):
    """Synthetic images: class k is a bright bar at one of 4 places, plus noise (deterministic)."""
    for i in range(num_samples):
        rng = np.random.default_rng(i)
        label = i % 4
        img = rng.normal(0.0, 1.0, (1, 16, 16)).astype(np.float32)
        img[0, 4 * label : 4 * label + 4, :] += 0.25
        yield {"id": i, "image": img, "label": label}


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 4),
    )


def make_loader(snap: Any, root: str) -> tuple[SnapshotIterableDataset, StatefulDataLoader]:
    dataset = SnapshotIterableDataset(snap, root, batch_size=BATCH, shuffle=True, seed=0)
    return dataset, StatefulDataLoader(dataset, batch_size=None, num_workers=2)


def steps_from(
    dataset: SnapshotIterableDataset, loader: StatefulDataLoader, epoch: int
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(epoch, batch) pairs for ever, calling set_epoch at each epoch."""
    while True:
        dataset.set_epoch(epoch)
        for batch in loader:
            yield epoch, batch
        epoch += 1


def train(args: argparse.Namespace) -> None:
    """The uninterrupted run: checkpoints at steps // 2, goes on, then starts the resume."""
    snap = shapes(args.samples).materialize()
    print(f"snapshot {snap.fingerprint[:12]}: {len(snap)} samples of 16x16 under {args.root}")
    torch.set_num_threads(1)  # same arithmetic in both processes
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset, loader = make_loader(snap, args.root)
    checkpoint_at = args.steps // 2
    checkpoint = Path(args.root) / "checkpoint.pt"
    after: list[list[int]] = []
    start, samples = time.perf_counter(), 0
    for step, (epoch, batch) in enumerate(steps_from(dataset, loader, 0), start=1):
        if step > checkpoint_at:
            after.append(batch["id"].tolist())
        loss = train_step(model, optimizer, batch)
        samples += len(batch["id"])
        if step % max(1, args.steps // 6) == 0 or step == args.steps:
            rate = samples / (time.perf_counter() - start)
            print(f"step {step:4d}  epoch {epoch}  loss {loss:.4f}  {rate:,.0f} samples/s")
        if step == checkpoint_at:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            state |= {"loader": loader.state_dict(), "epoch": epoch, "step": step}
            torch.save(state, checkpoint)
            print(f"checkpoint at step {step} (epoch {epoch}, mid-epoch) -> {checkpoint}")
        if step == args.steps:
            break
    expected = Path(args.root) / "expected.json"
    expected.write_text(json.dumps({"ids": after, "loss": loss}))
    print(f"uninterrupted run: final loss {loss:.4f}; now resuming in a fresh process", flush=True)
    cmd = [sys.executable, __file__, "--samples", str(args.samples), "--root", args.root]
    cmd += ["--steps", str(args.steps), "--resume", str(checkpoint)]
    sys.exit(subprocess.run(cmd).returncode)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, Any]) -> float:
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(batch["image"]), batch["label"])
    loss.backward()
    optimizer.step()
    return loss.item()


def resume(args: argparse.Namespace) -> None:
    """The fresh process: restore model, optimizer and loader; check the batches it reads."""
    state = torch.load(args.resume, weights_only=False)
    expected = json.loads((Path(args.root) / "expected.json").read_text())
    torch.set_num_threads(1)
    model = make_model()
    model.load_state_dict(state["model"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    optimizer.load_state_dict(state["optimizer"])
    fingerprint = shapes.fingerprint(args.samples).digest  # no stage run: it is committed
    dataset, loader = make_loader(fingerprint, args.root)
    dataset.set_epoch(state["epoch"])
    loader.load_state_dict(state["loader"])
    got: list[list[int]] = []
    batches = steps_from(dataset, loader, state["epoch"])
    for step, (_, batch) in enumerate(batches, start=state["step"] + 1):
        got.append(batch["id"].tolist())
        loss = train_step(model, optimizer, batch)
        if step == args.steps:
            break
    k = state["step"]
    if got != expected["ids"]:
        print(f"resumed at batch {k}: next batch ids DIFFER from the uninterrupted run")
        sys.exit(1)
    print(f"resumed at batch {k}: next batch ids match ({len(got)} batches, first {got[0][:6]}...)")
    print(f"resumed run: final loss {loss:.4f} (uninterrupted run: {expected['loss']:.4f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--root", default=None, help="snapshot root (default: a temp dir)")
    parser.add_argument("--steps", type=int, default=60, help="training steps in all")
    parser.add_argument("--resume", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # torchdata 0.11 calls a deprecated torch function on every loader it makes.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the checkpoint is taken halfway)")
    if args.root is None:
        args.root = tempfile.mkdtemp(prefix="snapstore-torch-")
    os.environ["SNAPSTORE_ROOT"] = args.root  # read when the stage is called
    if args.resume:
        resume(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
