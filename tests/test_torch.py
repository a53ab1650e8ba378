"""snapstore.torch with real DataLoader worker processes (fork and spawn) and StatefulDataLoader."""

from __future__ import annotations

import collections
import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

import snapstore  # noqa: E402
from snapstore.errors import ResumeError  # noqa: E402
from snapstore.torch import SnapshotDataset, SnapshotIterableDataset  # noqa: E402

DataLoader = torch.utils.data.DataLoader
StatefulDataLoader = stateful.StatefulDataLoader
N = 50


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


def samples(n: int) -> Any:
    for i in range(n):
        yield {"id": i, "x": np.full((2, 3), i, np.float32), "name": f"s{i}"}


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("torch") / "root"
    # Blocks of 4 samples, so that 50 samples make 13 blocks and shuffling mixes them.
    options = snapstore.WriteOptions(block_bytes=64, block_min_rows=4)
    return snapstore.snapshot(samples, root=root, options=options)(N).materialize()


def ids(loader: Any) -> list[list[int]]:
    out = []
    for batch in loader:
        assert isinstance(batch["x"], torch.Tensor) and batch["x"].dtype == torch.float32
        assert torch.equal(batch["x"][:, 0, 0].long(), batch["id"])
        assert batch["name"] == [f"s{i}" for i in batch["id"].tolist()]
        out.append(batch["id"].tolist())
    return out


def read_ranks(snap: snapstore.Snapshot, world_size: int, **loader: Any) -> list[list[list[int]]]:
    per_rank = []
    for rank in range(world_size):
        ds = SnapshotIterableDataset(snap, batch_size=4, rank=rank, world_size=world_size, seed=3)
        per_rank.append(ids(DataLoader(ds, batch_size=None, **loader)))
    return per_rank


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_exact_cover(snap: snapstore.Snapshot, world_size: int, num_workers: int) -> None:
    per_rank = read_ranks(snap, world_size, num_workers=num_workers)
    counts = [sum(len(b) for b in batches) for batches in per_rank]
    consumers = world_size * max(num_workers, 1)
    per = -(-N // consumers)
    assert counts == [per * max(num_workers, 1)] * world_size  # equal counts per rank
    seen = collections.Counter(i for batches in per_rank for b in batches for i in b)
    assert set(seen) == set(range(N))
    assert sum(seen.values()) - N == consumers * per - N  # only the documented padding repeats
    assert all(len(b) == 4 for batches in per_rank for b in batches[: -max(num_workers, 1)])


def test_drop_last_cover(snap: snapstore.Snapshot) -> None:
    read = []
    for rank in range(2):
        ds = SnapshotIterableDataset(snap, batch_size=4, rank=rank, world_size=2, drop_last=True)
        read.append(ids(DataLoader(ds, batch_size=None, num_workers=2)))
    flat = [i for batches in read for b in batches for i in b]
    assert len(flat) == len(set(flat))
    assert all(len(b) == 4 for batches in read for b in batches)
    assert len(read[0]) == len(read[1])


def test_set_epoch_changes_order(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=4)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    first = ids(loader)
    ds.set_epoch(0)
    assert ids(loader) == first  # the same epoch again
    ds.set_epoch(1)
    second = ids(loader)
    assert second != first and sorted(flat(second)) == sorted(flat(first))


def epoch_orders(snap: snapstore.Snapshot, passes: int, **loader: Any) -> list[list[list[int]]]:
    """The batches of ``passes`` passes of one loader, with no set_epoch call."""
    ds = SnapshotIterableDataset(snap, batch_size=4)
    dl = DataLoader(ds, batch_size=None, **loader)
    return [ids(dl) for _ in range(passes)]


@pytest.mark.parametrize(
    "loader",
    [
        {"num_workers": 0},
        {"num_workers": 2},
        {"num_workers": 2, "persistent_workers": True},
        {"num_workers": 2, "multiprocessing_context": "spawn"},
    ],
    ids=["no-workers", "workers", "persistent", "spawn"],
)
def test_each_pass_is_the_next_epoch(snap: snapstore.Snapshot, loader: dict[str, Any]) -> None:
    passes = epoch_orders(snap, 3, **loader)
    # Every worker mode reads epochs 0, 1, 2: the orders are those of set_epoch(e) before
    # each pass with no workers.
    ds = SnapshotIterableDataset(snap, batch_size=4)
    expected = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        expected.append(sorted(map(tuple, ids(DataLoader(ds, batch_size=None, **loader)))))
    assert [sorted(map(tuple, p)) for p in passes] == expected
    assert passes[0] != passes[1] != passes[2]
    assert all(sorted(flat(p)) == sorted(flat(passes[0])) for p in passes)


def test_set_epoch_reaches_persistent_workers(snap: snapstore.Snapshot) -> None:
    def epochs(**loader: Any) -> list[list[list[int]]]:
        ds = SnapshotIterableDataset(snap, batch_size=4)
        dl = DataLoader(ds, batch_size=None, num_workers=2, **loader)
        out = []
        for epoch in (3, 3, 0):
            ds.set_epoch(epoch)
            out.append(ids(dl))
        return out

    persistent = epochs(persistent_workers=True)
    assert persistent == epochs()
    assert persistent[0] == persistent[1] != persistent[2]


def test_persistent_workers_follow_epochs(snap: snapstore.Snapshot) -> None:
    def epochs(**loader: Any) -> list[list[list[int]]]:
        ds = SnapshotIterableDataset(snap, batch_size=4)
        dl = DataLoader(ds, batch_size=None, num_workers=2, **loader)
        out = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            out.append(ids(dl))
        return out

    persistent = epochs(persistent_workers=True)
    assert persistent == epochs()
    assert persistent[0] != persistent[1]


def test_spawn(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=4)
    spawned = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    first = ids(spawned)
    ds.set_epoch(0)
    assert first == ids(DataLoader(ds, batch_size=None, num_workers=2))


class DecodeThreads(SnapshotIterableDataset):
    """Yields how many decode threads the reader in this worker was given."""

    def __iter__(self) -> Any:
        super().__iter__().close()
        assert self._reader is not None
        yield {"threads": self._reader.decode_threads, "cpus": len(os.sched_getaffinity(0))}


def test_workers_decode_on_their_share_of_the_cpus(snap: snapstore.Snapshot) -> None:
    ds = DecodeThreads(snap, batch_size=4)
    main = next(iter(ds))
    assert main["threads"] is None  # this process: the reader's default, min(4, CPUs)
    for item in DataLoader(ds, batch_size=None, num_workers=2):
        assert int(item["threads"]) == max(1, min(4, int(item["cpus"]) // 2))
    explicit = DecodeThreads(snap, batch_size=4, decode_threads=3)
    for item in DataLoader(explicit, batch_size=None, num_workers=2):
        assert int(item["threads"]) == 3


def test_pin_memory(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "pin_memory ... no accelerator is found"
        pinned = ids(DataLoader(ds, batch_size=None, num_workers=2, pin_memory=True))
    assert sorted(flat(pinned)) == list(range(N))  # 2 workers x 25, no padding


def test_pickles_without_reader(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=4)
    batches = iter(ds)
    next(batches)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._reader is None and copy._location._opened is None
    assert copy.epoch == 1  # the pass started before pickling counts
    copy.set_epoch(0)
    assert ids(copy) == ids(SnapshotIterableDataset(snap.fingerprint, snap.store, batch_size=4))


def test_no_copy_and_no_warning(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = next(iter(ds))
        sample = SnapshotDataset(snap)[3]
    assert torch.equal(sample["x"], torch.full((2, 3), 3.0)) and sample["id"].item() == 3
    assert sample["name"] == "s3"
    assert batch["x"].shape == (8, 2, 3)


RESUME = textwrap.dedent(
    """
    import json, sys, torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    from snapstore.torch import SnapshotIterableDataset
    fp, root, state_path, workers = sys.argv[1:5]
    ds = SnapshotIterableDataset(fp, root, batch_size=4, seed=5, rank=1, world_size=2)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=int(workers))
    loader.load_state_dict(torch.load(state_path, weights_only=False))
    print(json.dumps([b["id"].tolist() for b in loader]))
    """
)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_resume_in_fresh_process(
    snap: snapstore.Snapshot, tmp_path: Path, num_workers: int
) -> None:
    def loader() -> Any:
        ds = SnapshotIterableDataset(snap, batch_size=4, seed=5, rank=1, world_size=2)
        return StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)

    full = [b["id"].tolist() for b in loader()]
    interrupted = loader()
    k = 3
    taken = [b["id"].tolist() for _, b in zip(range(k), interrupted)]
    assert taken == full[:k]
    state_path = tmp_path / "state.pt"
    torch.save(interrupted.state_dict(), state_path)
    root = str(snap.store.url)
    cmd = [sys.executable, "-c", RESUME, snap.fingerprint, root, str(state_path), str(num_workers)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == full[k:]


def test_load_state_dict_rejects_foreign_state(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=4)
    with pytest.raises(ResumeError, match="dataset_version"):
        ds.load_state_dict({"position": 3})
    other = SnapshotIterableDataset(snap, batch_size=4, seed=9)
    next(iter(other))
    ds.load_state_dict(other.state_dict())
    with pytest.raises(ResumeError, match="seed"):
        iter(ds)


def test_rank_arguments(snap: snapstore.Snapshot) -> None:
    with pytest.raises(ValueError, match="both rank and world_size"):
        SnapshotIterableDataset(snap, batch_size=4, rank=1)
    with pytest.raises(ValueError, match="rank"):
        SnapshotIterableDataset(snap, batch_size=4, rank=2, world_size=2)


def test_map_style_random_sampler(snap: snapstore.Snapshot) -> None:
    ds = SnapshotDataset(snap.fingerprint, snap.store.url)
    assert len(ds) == N
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)
    seen = []
    for batch in loader:
        assert batch["x"].shape[1:] == (2, 3)
        seen += batch["id"].tolist()
    assert sorted(seen) == list(range(N)) and seen != list(range(N))


def test_stateful_loader_makes_no_warning(snap: snapstore.Snapshot, tmp_path: Path) -> None:
    # torchdata 0.11 calls torch.set_vital, deprecated, in every StatefulDataLoader: torch
    # warned on every loader users made. Run as a user's script would (pytest resets the
    # warning filters around each test).
    script = tmp_path / "loader.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import warnings
            from torchdata.stateful_dataloader import StatefulDataLoader
            from snapstore.torch import SnapshotIterableDataset
            fp, root = {snap.fingerprint!r}, {str(snap.store.url)!r}
            ds = SnapshotIterableDataset(fp, root, batch_size=4)
            for _ in range(2):
                assert sum(len(b["id"]) for b in StatefulDataLoader(ds, batch_size=None)) == {N}
            warnings.warn("'set_vital' is deprecated, from user code", UserWarning)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-W", "default", str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "please do not call" not in done.stderr  # torch's warning for torchdata's call
    assert "from user code" in done.stderr  # the same warning from elsewhere still shows
