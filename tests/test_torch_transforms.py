"""SnapshotIterableDataset's transform=, sample_transform=, per_sample= and collate_fn, with real
DataLoader workers and StatefulDataLoader resume."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

import snapstore  # noqa: E402
from snapstore.errors import ResumeError  # noqa: E402
from snapstore.torch import RaggedList, SnapshotIterableDataset  # noqa: E402

DataLoader = torch.utils.data.DataLoader
StatefulDataLoader = stateful.StatefulDataLoader
N = 50
BATCH = 4
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


def samples(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"id": i, "x": np.full((2, 3), i, np.float32)}


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("transforms") / "root"
    # Blocks of 4 samples, so that 50 samples make 13 blocks and shuffling mixes them.
    options = snapstore.WriteOptions(block_bytes=64, block_min_rows=4)
    return snapstore.snapshot(samples, root=root, options=options)(N).materialize()


def draw(batch: dict[str, Any]) -> dict[str, Any]:
    """A random draw per sample, and where the batch was transformed."""
    info = torch.utils.data.get_worker_info()
    batch["draw"] = torch.rand(len(batch["id"]))
    batch["pid"] = torch.full((len(batch["id"]),), os.getpid())
    batch["worker"] = torch.full((len(batch["id"]),), -1 if info is None else info.id)
    return batch


def noise(sample: dict[str, Any]) -> dict[str, Any]:
    """Per sample: a draw, and x cut to a length that depends on the sample (varying shapes)."""
    sample["noise"] = torch.rand(())
    sample["x"] = sample["x"][:, : 1 + int(sample["id"]) % 3]
    return sample


def after_noise(batch: dict[str, Any]) -> dict[str, Any]:
    """Per batch, after ``noise``: sees its stacked draws."""
    batch["twice"] = batch["noise"] * 2
    return batch


def read(loader: Any) -> list[tuple[int, float]]:
    """(id, draw) of every sample, in the order read."""
    return [
        (i, d)
        for batch in loader
        for i, d in zip(batch["id"].tolist(), batch["draw"].tolist(), strict=True)
    ]


def test_transform_runs_in_the_workers(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=BATCH, transform=draw)
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert {int(b["worker"][0]) for b in batches} == {0, 1}
    assert all(int(b["pid"][0]) != os.getpid() for b in batches)
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(N))


def test_draws_repeat_per_epoch_and_differ_across_epochs(snap: snapstore.Snapshot) -> None:
    def loader() -> tuple[SnapshotIterableDataset, Any]:
        ds = SnapshotIterableDataset(snap, batch_size=BATCH, seed=3, transform=draw)
        return ds, DataLoader(ds, batch_size=None, num_workers=2)

    _, dl = loader()
    epoch0, epoch1 = read(dl), read(dl)  # passes are epochs 0 and 1
    assert read(loader()[1]) == epoch0  # another run: the same draws
    assert dict(epoch0) != dict(epoch1)  # another epoch: other draws for the same samples
    assert len({d for _, d in epoch0}) == N  # every sample its own draw
    again, dl_again = loader()
    again.set_epoch(1)
    assert read(dl_again) == epoch1  # set_epoch chooses the epoch, draws included
    assert again.state_dict()["epoch"] == 2


def test_torchs_generator_is_restored(snap: snapstore.Snapshot) -> None:
    def after(**transform: Any) -> Any:
        torch.manual_seed(11)  # the DataLoader draws its base seed from it, nothing else does
        ds = SnapshotIterableDataset(snap, batch_size=BATCH, **transform)
        list(DataLoader(ds, batch_size=None))
        return torch.rand(3)

    assert torch.equal(after(transform=draw, sample_transform=noise), after())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resumed_mid_epoch_draws_what_the_uninterrupted_run_draws(
    snap: snapstore.Snapshot, num_workers: int
) -> None:
    def loader() -> Any:
        ds = SnapshotIterableDataset(snap, batch_size=BATCH, transform=draw, sample_transform=noise)
        ds.set_epoch(2)
        return StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)

    full = read(loader())
    interrupted = loader()
    it = iter(interrupted)
    taken = read(next(it) for _ in range(5))
    state = interrupted.state_dict()
    del it, interrupted
    resumed = loader()
    resumed.load_state_dict(state)
    assert taken + read(resumed) == full


def test_sample_transform_then_transform(snap: snapstore.Snapshot) -> None:
    def run() -> list[dict[str, Any]]:
        ds = SnapshotIterableDataset(
            snap, batch_size=BATCH, sample_transform=noise, transform=after_noise
        )
        return list(DataLoader(ds, batch_size=None, num_workers=1))

    batches = run()
    for batch in batches:
        ids = batch["id"].tolist()
        if len({i % 3 for i in ids}) > 1:  # shapes that differ are a RaggedList
            assert isinstance(batch["x"], RaggedList)
        else:  # one shape: stacked
            assert isinstance(batch["x"], torch.Tensor) and len(batch["x"]) == len(ids)
        for i, x in zip(ids, batch["x"], strict=True):
            assert x.shape == (2, 1 + i % 3) and bool((x == i).all())
        assert torch.equal(batch["twice"], batch["noise"] * 2)
    again = run()
    assert all(torch.equal(a["noise"], b["noise"]) for a, b in zip(batches, again, strict=True))
    assert len({float(n) for b in batches for n in b["noise"]}) == N


def test_transform_must_return_a_dict(snap: snapstore.Snapshot) -> None:
    with pytest.raises(TypeError, match="transform: expected a callable"):
        SnapshotIterableDataset(snap, batch_size=BATCH, transform="flip")
    ds = SnapshotIterableDataset(snap, batch_size=BATCH, transform=lambda b: list(b))
    with pytest.raises(TypeError, match="expected it to return a dict, found list"):
        next(iter(ds))


# ---- per_sample and collate_fn ---------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_per_sample_with_a_batch_size(snap: snapstore.Snapshot, num_workers: int) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=BATCH, per_sample=True, transform=draw)
    batches = list(DataLoader(ds, batch_size=8, num_workers=num_workers))
    ids = [i for b in batches for i in b["id"].tolist()]
    assert sorted(ids) == list(range(N))
    for batch in batches:
        assert batch["x"].shape == (len(batch["id"]), 2, 3)
        assert torch.equal(batch["x"][:, 0, 0].long(), batch["id"])
    # The same samples in the same order, with the same draws, as whole batches.
    whole = SnapshotIterableDataset(snap, batch_size=BATCH, transform=draw)
    expected = read(DataLoader(whole, batch_size=None, num_workers=num_workers))
    if num_workers == 0:
        assert read(batches) == expected
    else:
        assert sorted(read(batches)) == sorted(expected)


def test_per_sample_with_a_collate_fn(snap: snapstore.Snapshot) -> None:
    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        assert all(isinstance(item["x"], torch.Tensor) for item in items)
        return {
            "id": torch.stack([item["id"] for item in items]),
            "x": torch.nn.utils.rnn.pad_sequence(
                [item["x"].flatten() for item in items], batch_first=True
            ),
        }

    ds = SnapshotIterableDataset(snap, batch_size=BATCH, per_sample=True, sample_transform=noise)
    loader = DataLoader(ds, batch_size=6, collate_fn=collate, num_workers=2)
    seen = []
    for batch in loader:
        assert batch["x"].shape[0] == len(batch["id"]) <= 6
        for i, row in zip(batch["id"].tolist(), batch["x"], strict=True):
            width = 2 * (1 + i % 3)
            assert row[:width].tolist() == [float(i)] * width and not row[width:].any()
        seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(N))


def test_collate_fn_with_whole_batches(snap: snapstore.Snapshot) -> None:
    """With batch_size=None the DataLoader hands each batch to collate_fn."""
    ds = SnapshotIterableDataset(snap, batch_size=BATCH)
    loader = DataLoader(ds, batch_size=None, collate_fn=lambda b: b["id"].tolist(), num_workers=1)
    batches = list(loader)
    assert all(len(b) <= BATCH for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(N))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_per_sample_resumed_mid_epoch(snap: snapstore.Snapshot, num_workers: int) -> None:
    """DataLoader batches of 3 samples from reads of 4: a state taken between two reads' samples
    still resumes at the next sample."""

    def loader() -> Any:
        ds = SnapshotIterableDataset(snap, batch_size=BATCH, per_sample=True, transform=draw)
        return StatefulDataLoader(ds, batch_size=3, num_workers=num_workers)

    full = read(loader())
    interrupted = loader()
    it = iter(interrupted)
    taken = read(next(it) for _ in range(3))  # 9 samples: mid-way through a read of 4
    state = interrupted.state_dict()
    del it, interrupted
    resumed = loader()
    resumed.load_state_dict(state)
    assert taken + read(resumed) == full


def test_a_per_sample_state_needs_per_sample(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=BATCH, per_sample=True)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    assert state["sample"] == 1
    batches = SnapshotIterableDataset(snap, batch_size=BATCH)
    with pytest.raises(ResumeError, match="per_sample=False"):
        batches.load_state_dict(state)
