"""DataLoader workers read a snapshot on a bucket under every start method (fork, spawn,
forkserver), after the parent has used the store: each worker rebuilds the store's filesystem in
its own process instead of using the parent's (whose event loop a forked child does not have)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import snapstore  # noqa: E402
from snapstore.storage.cache import BlockCache, CachedStore  # noqa: E402
from snapstore.storage.simulate import simulated_store  # noqa: E402
from snapstore.storage.store import open_store  # noqa: E402
from snapstore.torch import SnapshotDataset, SnapshotIterableDataset  # noqa: E402

DataLoader = torch.utils.data.DataLoader
METHODS = ["fork", "spawn", "forkserver"]


def rows(n: int) -> Any:
    for i in range(n):
        yield {"id": i, "x": np.full(3, i, np.int32)}


def batches(loader: Any) -> list[list[int]]:
    out = []
    for batch in loader:
        assert torch.equal(batch["x"][:, 0].long(), batch["id"])
        out.append(batch["id"].tolist())
    return out


@pytest.fixture(scope="module")
def remote_snaps(
    request: pytest.FixtureRequest,
) -> dict[str, snapstore.Snapshot]:
    """One small snapshot per server, written and read in this process first."""
    snaps = {}
    options = snapstore.WriteOptions(block_bytes=64, block_min_rows=4)
    for kind in ("gcs", "s3"):
        server = request.getfixturevalue(f"{kind}_server")
        url, storage_options = server.root(f"start-methods-{os.getpid()}")
        store = open_store(url, **storage_options)
        snap = snapstore.snapshot(rows, root=store, options=options)(40).materialize()
        assert len(list(snap.batches(8))) == 5  # the parent has used the store and its loop
        snaps[kind] = snap
    return snaps


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["gcs", "s3"])
def test_iterable_dataset_under_every_start_method(
    remote_snaps: dict[str, snapstore.Snapshot], kind: str, method: str
) -> None:
    snap = remote_snaps[kind]
    ds = SnapshotIterableDataset(snap, batch_size=8, seed=3)
    ds.set_epoch(1)
    assert len(batches(DataLoader(ds, batch_size=None, num_workers=0))) == 5  # the parent reads
    # Worker w reads consumer w's share of epoch 1; the loader takes one batch from each in turn.
    shares = [
        [
            b["id"].tolist()
            for b in snap.batches(8, shuffle=True, seed=3, epoch=1, worker=w, num_workers=2)
        ]
        for w in range(2)
    ]
    expected = [b for pair in zip(*shares) for b in pair]
    ds.set_epoch(1)  # the next pass would read epoch 2
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=method)
    assert batches(loader) == expected
    assert sorted(i for b in expected for i in b) == list(range(40))


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_map_dataset_under_fork_and_forkserver(
    remote_snaps: dict[str, snapstore.Snapshot], method: str
) -> None:
    ds = SnapshotDataset(remote_snaps["gcs"])
    ds[0]  # the parent reads through the store first
    loader = DataLoader(ds, batch_size=10, num_workers=2, multiprocessing_context=method)
    assert [i for b in loader for i in b["id"].tolist()] == list(range(40))


@pytest.mark.parametrize("wrap", ["cache", "simulated"])
def test_wrapped_stores_under_fork(
    remote_snaps: dict[str, snapstore.Snapshot], wrap: str, tmp_path: Any
) -> None:
    snap = remote_snaps["gcs"]
    inner = snap.store
    store = (
        CachedStore(inner, BlockCache(tmp_path / "cache", 1 << 20))
        if wrap == "cache"
        else simulated_store(inner, ttfb=0.001)
    )
    opened = snapstore.open(snap.fingerprint, root=store)
    assert len(list(opened.batches(8))) == 5
    ds = SnapshotIterableDataset(opened, batch_size=8, seed=0)
    forked = batches(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    assert sorted(i for b in forked for i in b) == list(range(40))


def _read_source(source: Any, queue: Any) -> None:
    queue.put(int(source[7]["id"]))


@pytest.mark.parametrize("method", METHODS)
def test_grain_source_under_every_start_method(
    remote_snaps: dict[str, snapstore.Snapshot], method: str
) -> None:
    pytest.importorskip("grain")
    import multiprocessing

    from snapstore.grain import SnapshotSource

    source = SnapshotSource(remote_snaps["s3"])
    assert int(source[7]["id"]) == 7  # the parent reads through the store first
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    child = context.Process(target=_read_source, args=(source, queue))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == 7
