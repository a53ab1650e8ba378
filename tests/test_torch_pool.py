"""DataLoader workers' batches in a pool of shared-memory segments (issue 24): segments are
recycled, a batch the user holds (or a view of it) is never overwritten, batches arrive in
order in every ragged form, and nothing is left behind when the workers and the batches go."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from multiprocessing.reduction import ForkingPickler  # noqa: E402

import snapstore  # noqa: E402
from snapstore import torch_pool  # noqa: E402
from snapstore.torch import RaggedList, SnapshotIterableDataset, to_tensors  # noqa: E402
from snapstore.torch_pool import SegmentPool  # noqa: E402
from snapstore.torch_ragged import (  # noqa: E402
    from_packed,
    reader_form,
    share_batch,
    shared_tensor,
)

DataLoader = torch.utils.data.DataLoader
N = 600
# 128 KiB of values: past what travels inline, so they go in the lease; the labels go inline.
SPECS = [((256, 128), np.dtype(np.float32)), ((16,), np.dtype(np.int64))]
pytestmark = [
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype"),
]


def stage(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {
            "image": np.full((64, 64, 3), i % 251, np.uint8),  # 192 KiB a batch: in the lease
            "id": i,
            "tok": np.arange(i % 9 + 1, dtype=np.int32) + i,
        }


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("pool") / "root"
    options = snapstore.WriteOptions(block_bytes=1 << 16, block_min_rows=8)
    return snapstore.snapshot(stage, root=root, options=options)(N).materialize()


def send(batch: Any) -> Any:
    return ForkingPickler.loads(ForkingPickler.dumps(batch))


def pooled_batch(pool: SegmentPool, fill: int) -> dict[str, Any]:
    values, labels = pool.allocate(SPECS)
    values[:] = fill
    labels[:] = np.arange(16) + fill
    return share_batch({"x": torch.from_numpy(values), "y": torch.from_numpy(labels)})


def collect() -> None:
    gc.collect()


def in_memfd(tensor: Any) -> bool:
    """Whether ``tensor``'s bytes lie in a mapping of a pool segment (a memfd)."""
    start = tensor.untyped_storage().data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "memfd:snapstore-pool" in line:
                low, high = (int(x, 16) for x in line.split()[0].split("-"))
                if low <= start < high:
                    return True
    return False


def test_a_segment_is_reused_only_after_the_receiver_lets_go(pool: SegmentPool) -> None:
    sent = pooled_batch(pool, 1)
    assert isinstance(sent, torch_pool.PooledBatch)
    got = send(sent)
    assert type(got) is dict and torch.equal(got["y"], torch.arange(16) + 1)
    first = pool.segments[0]
    del sent
    collect()
    view = got["x"][3]  # a view is enough to hold the segment
    del got
    collect()
    again = pooled_batch(pool, 2)
    assert pool.lease_of([again["x"]]).segment is not first  # type: ignore[union-attr]
    assert torch.equal(view, torch.ones(128))  # not overwritten
    del view, again
    collect()
    third = pooled_batch(pool, 3)
    assert pool.stats["created"] == 2 and pool.stats["reused"] >= 1
    assert pool.lease_of([third["x"]]).segment is first  # type: ignore[union-attr]


def test_small_tensors_travel_inline_and_hold_no_segment(pool: SegmentPool) -> None:
    got = send(pooled_batch(pool, 1))
    labels = got["y"]  # kept, as a training loop keeps labels for a metric
    assert in_memfd(got["x"]) and not in_memfd(labels)
    del got
    collect()
    pooled_batch(pool, 2)
    assert pool.stats == {"created": 1, "reused": 1, "regrown": 0, "one_off": 0}
    assert labels.tolist() == list(range(1, 17))


def test_a_batch_arrives_as_views_of_one_storage(pool: SegmentPool) -> None:
    values, offsets = pool.allocate([((10,), np.dtype(np.int32)), ((4,), np.dtype(np.int64))])
    values[:] = np.arange(10)
    offsets[:] = [0, 3, 3, 10]
    tokens = RaggedList(torch.from_numpy(values), torch.from_numpy(offsets))
    names = ["a", "b", "c"]
    got = send(share_batch({"tokens": tokens, "name": names, "n": torch.tensor(3)}))
    assert isinstance(got["tokens"], RaggedList)
    assert [t.tolist() for t in got["tokens"]] == [[0, 1, 2], [], [3, 4, 5, 6, 7, 8, 9]]
    assert got["name"] == names and got["n"].item() == 3
    assert got["tokens"].values.untyped_storage().data_ptr() == (
        got["tokens"][2].untyped_storage().data_ptr()
    )


def test_other_batches_are_copied_into_a_lease(pool: SegmentPool) -> None:
    """A transform's new tensors: one copy into a lease, then they travel as the lease."""
    batch = {"x": torch.arange(6.0), "nested": {"y": torch.ones(2, 2)}}
    shared = share_batch(batch)
    assert isinstance(shared, torch_pool.PooledBatch)
    assert pool.lease_of([shared["x"], shared["nested"]["y"]]) is not None
    got = send(shared)
    assert got["x"].tolist() == list(range(6)) and got["nested"]["y"].sum().item() == 4


def test_pickled_twice_the_second_is_a_copy(pool: SegmentPool) -> None:
    sent = pooled_batch(pool, 5)
    one, two = send(sent), send(sent)
    assert torch.equal(one["x"], two["x"])
    assert in_memfd(one["x"]) and not in_memfd(two["x"])


def test_a_tensor_escaping_the_batch_is_copied_not_shared(pool: SegmentPool) -> None:
    values, _ = pool.allocate(SPECS)
    values[:] = 7
    tensor = torch.from_numpy(values)
    assert in_memfd(tensor)
    got = send(tensor)  # torch's own path: into a new segment of its own
    assert not in_memfd(got) and not in_memfd(tensor)  # moved out of the lease, both
    assert torch.equal(got, torch.full((256, 128), 7.0))


def test_a_busy_pool_falls_back_to_one_off_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    small = SegmentPool(1)
    monkeypatch.setattr(torch_pool, "_POOL", (os.getpid(), small))
    held = small.allocate(SPECS)
    other = small.allocate(SPECS)
    assert small.stats["one_off"] == 1 and shared_tensor(other[0]) is not None
    batch = share_batch({"x": torch.from_numpy(other[0]), "y": torch.from_numpy(other[1])})
    assert not isinstance(batch, torch_pool.PooledBatch)  # travels as one torch segment
    assert held[0].base is not None


def test_a_segment_too_small_is_replaced_and_forgotten(pool: SegmentPool) -> None:
    pool.limit = 1
    got = send(pooled_batch(pool, 1))
    token = pool.segments[0].token
    del got
    collect()
    values, ids = pool.allocate([((1 << 20,), np.dtype(np.uint8)), ((4,), np.dtype(np.int64))])
    assert pool.stats["regrown"] == 1 and pool.retired == [token]
    got = send(share_batch({"v": torch.from_numpy(values), "i": torch.from_numpy(ids)}))
    assert token not in torch_pool._RECEIVED and pool.retired == []
    assert got["v"].numel() == 1 << 20


def test_no_pool_means_one_segment_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_pool, "_POOL", None)
    monkeypatch.setenv(torch_pool.POOL_SEGMENTS_ENV, "0")
    arrays = torch_pool.allocate_pooled(SPECS)
    assert shared_tensor(arrays[0]) is not None  # allocate_shared's buffer, as before
    monkeypatch.setattr(torch_pool, "_POOL", None)
    monkeypatch.setenv(torch_pool.POOL_SEGMENTS_ENV, "many")
    with pytest.raises(ValueError, match=r"SNAPSTORE_POOL_SEGMENTS.*'many'"):
        torch_pool.allocate_pooled(SPECS)


def test_an_unknown_segment_is_an_error(pool: SegmentPool) -> None:
    send(pooled_batch(pool, 1))
    collect()
    torch_pool._RECEIVED.clear()  # as if the first batch had gone to another process
    data = ForkingPickler.dumps(pooled_batch(pool, 2))
    assert pool.stats["reused"] == 1
    with pytest.raises(torch_pool.PoolError, match="never received"):
        ForkingPickler.loads(data)


# -- through a DataLoader ----------------------------------------------------------------------


def _expected(snap: snapstore.Snapshot, form: str) -> list[dict[str, Any]]:
    """What 2 workers yield, read here: each worker's batches, taken in turn."""
    shares = []
    for worker in range(2):
        reader = snap.batches(
            16, shuffle=True, seed=4, worker=worker, num_workers=2, ragged=reader_form(form)
        )
        schema = reader.reader.schema
        shares.append([from_packed(to_tensors(b), schema, form) for b in reader])
    return [b for turn in zip(*shares, strict=True) for b in turn]


def _memfd_mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum("memfd:snapstore-pool" in line for line in maps)


def _wait_for_exit() -> None:
    """Until the workers' segments are forgotten (the workers exit right after the loader)."""
    for _ in range(100):
        torch_pool.forget_exited()
        if torch_pool.received_segments() == 0:
            return
        time.sleep(0.05)


@pytest.mark.parametrize("form", ["list", "packed", "pad", "nested"])
def test_held_batches_are_not_overwritten(snap: snapstore.Snapshot, form: str) -> None:
    """Hold every 7th batch and a view into others while the workers go on through the epoch
    (far more batches than pooled segments): each held thing keeps its values, and the batches
    arrive in the order of the one-process read."""
    want = _expected(snap, form)
    ds = SnapshotIterableDataset(snap, batch_size=16, seed=4, ragged=form)  # type: ignore[arg-type]
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    held, views = [], []
    for i, batch in enumerate(loader):
        assert torch.equal(batch["id"], want[i]["id"])
        if i % 7 == 0:
            held.append((i, batch))
        else:
            views.append((i, batch["image"][1]))
    assert len(want) == i + 1 > 2 * 2 * torch_pool.DEFAULT_SEGMENTS
    for i, batch in held:
        assert torch.equal(batch["image"], want[i]["image"]) and torch.equal(
            batch["id"], want[i]["id"]
        )
        tok, expected = batch["tok"], want[i]["tok"]
        if form == "nested":
            assert all(torch.equal(a, b) for a, b in zip(tok.unbind(), expected.unbind()))
        elif form == "list":
            assert all(torch.equal(a, b) for a, b in zip(tok, expected, strict=True))
        else:
            assert torch.equal(tok, expected)
    for i, view in views:
        assert torch.equal(view, want[i]["image"][1])


def test_segments_are_recycled_and_nothing_is_left(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=16, seed=1)
    fds = len(os.listdir("/proc/self/fd"))
    shm = set(os.listdir("/dev/shm"))
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    batches = 0
    for _ in range(2):  # persistent workers keep their pools across epochs
        for _batch in loader:
            batches += 1
            assert torch_pool.received_segments() <= 2 * torch_pool.DEFAULT_SEGMENTS
    assert batches > 4 * torch_pool.DEFAULT_SEGMENTS
    del loader, _batch
    collect()
    _wait_for_exit()
    assert torch_pool.received_segments() == 0 and _memfd_mappings() == 0
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert set(os.listdir("/dev/shm")) <= shm


def _memfd_sizes() -> list[int]:
    """The size of each pool segment this process maps (0: its worker gave the memory back)."""
    sizes = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "memfd:snapstore-pool" in line:
                sizes.append(os.stat(f"/proc/self/map_files/{line.split()[0]}").st_size)
    return sizes


def test_exiting_workers_give_the_memory_back(snap: snapstore.Snapshot) -> None:
    """A worker that exits truncates the segments the main process let go of; the one a held
    batch uses stays whole until the batch goes, then is unmapped."""
    ds = SnapshotIterableDataset(snap, batch_size=16, seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for each in loader:
        batch = each  # the others go
    del each
    collect()
    assert in_memfd(batch["image"])
    assert _memfd_sizes().count(0) == 0 and torch_pool.received_segments() > 1
    del loader
    collect()
    for _ in range(100):  # until both workers are gone
        sizes = _memfd_sizes()
        if sizes.count(0) == len(sizes) - 1:
            break
        time.sleep(0.05)
    assert sizes.count(0) == len(sizes) - 1, sizes
    assert torch.equal(batch["image"][0], batch["image"][0].clone())  # still readable
    del batch
    collect()
    assert torch_pool.received_segments() == 0 and _memfd_sizes() == []


KILLED = """
import os, signal, sys, torch
from snapstore.torch import SnapshotIterableDataset
ds = SnapshotIterableDataset(sys.argv[1], sys.argv[2], batch_size=16, seed=1)
held = []
for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
    held.append(batch)  # past the pool: one-off segments too
    if len(held) == 20:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_main_process_leaves_nothing_in_dev_shm(snap: snapstore.Snapshot) -> None:
    shm = set(os.listdir("/dev/shm"))
    env = {**os.environ, torch_pool.POOL_SEGMENTS_ENV: "4"}
    args = [sys.executable, "-c", KILLED, snap.fingerprint, str(snap.store.url)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert set(os.listdir("/dev/shm")) <= shm


def test_spawned_workers(snap: snapstore.Snapshot, tmp_path: Path) -> None:
    want = _expected(snap, "list")
    ds = SnapshotIterableDataset(snap, batch_size=16, seed=4)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    got = list(loader)
    assert [b["id"].tolist() for b in got] == [b["id"].tolist() for b in want]
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(got, want, strict=True))
    del loader, got
    collect()
    _wait_for_exit()
    assert torch_pool.received_segments() == 0
