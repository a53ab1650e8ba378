"""snapstore.grain under Grain's DataLoader: exact cover of shards, workers and resume."""

from __future__ import annotations

import collections
import pickle
from typing import Any

import fsspec
import numpy as np
import pytest

pygrain = pytest.importorskip("grain.python")

import snapstore  # noqa: E402
from snapstore.grain import SnapshotSource  # noqa: E402
from snapstore.read.reader import SnapshotReader  # noqa: E402
from snapstore.storage.store import FsspecStore  # noqa: E402

N = 50


def samples(n: int) -> Any:
    for i in range(n):
        yield {"id": i, "x": np.full((2, 3), i, np.float32), "name": f"s{i}"}


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("grain") / "root"
    # Blocks of 4 samples: 50 samples make 13 blocks.
    options = snapstore.WriteOptions(block_bytes=64, block_min_rows=4)
    return snapstore.snapshot(samples, root=root, options=options)(N).materialize()


def loader(source: SnapshotSource, shard: int, workers: int, seed: int = 0) -> Any:
    sampler = pygrain.IndexSampler(
        num_records=len(source),
        shard_options=pygrain.ShardOptions(shard, 2),
        shuffle=True,
        num_epochs=1,
        seed=seed,
    )
    return pygrain.DataLoader(
        data_source=source, sampler=sampler, operations=[pygrain.Batch(4)], worker_count=workers
    )


def ids(batches: Any) -> list[list[int]]:
    out = []
    for batch in batches:
        np.testing.assert_array_equal(batch["x"][:, 0, 0].astype(np.int64), batch["id"])
        assert [str(s) for s in batch["name"]] == [f"s{i}" for i in batch["id"].tolist()]
        out.append(batch["id"].tolist())
    return out


def test_len_and_items_match_snapshot(snap: snapstore.Snapshot) -> None:
    source = SnapshotSource(snap)
    assert len(source) == len(snap) == N
    for i in [0, 3, 4, 17, N - 1, -1]:
        got, want = source[i], snap[i]
        assert got.keys() == want.keys()
        assert got["id"] == want["id"] and got["name"] == want["name"]
        np.testing.assert_array_equal(got["x"], want["x"])
    with pytest.raises(IndexError):
        source[N]
    assert repr(source) == repr(SnapshotSource(snap.fingerprint, snap.store))
    assert snap.fingerprint in repr(source)


def test_read_batch_decodes_each_block_once(
    snap: snapstore.Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    indices = [45, 1, 2, 0, 13, 3, 44, 14, -1, 30]
    loads: list[int] = []
    original = SnapshotReader.load_block

    def counting(self: SnapshotReader, block: int) -> Any:
        loads.append(block)
        return original(self, block)

    monkeypatch.setattr(SnapshotReader, "load_block", counting)
    source = SnapshotSource(snap.fingerprint, snap.store)  # a fresh reader: an empty cache
    batch = source.read_batch(indices)
    assert sorted(loads) == [0, 3, 7, 11, 12]  # each needed block once
    items = [source[i] for i in indices]
    assert batch["id"].tolist() == [s["id"] for s in items] == [i % N for i in indices]
    np.testing.assert_array_equal(batch["x"], np.stack([s["x"] for s in items]))
    assert batch["name"] == [s["name"] for s in items]
    loads.clear()
    listed = pickle.loads(pickle.dumps(source)).__getitems__(indices)
    assert sorted(loads) == [0, 3, 7, 11, 12]
    assert [s["id"] for s in listed] == batch["id"].tolist()
    with pytest.raises(IndexError, match="out of range"):
        source.read_batch([0, N])


def test_pickles_without_reader(snap: snapstore.Snapshot) -> None:
    source = SnapshotSource(snap)
    source[0]
    copy = pickle.loads(pickle.dumps(source))
    assert copy._handle._opened is None
    assert copy[7]["id"] == 7 and len(copy) == N


def test_fsspec_store_pickles(snap: snapstore.Snapshot) -> None:
    store = FsspecStore(fsspec.filesystem("memory"), "/grain-test")
    other = snapstore.snapshot(samples, root=store)(8).materialize()
    source = pickle.loads(pickle.dumps(SnapshotSource(other)))
    assert source.read_batch(range(8))["id"].tolist() == list(range(8))


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_cover_every_record_once(snap: snapstore.Snapshot, workers: int) -> None:
    source = SnapshotSource(snap)
    shards = [ids(loader(source, shard, workers)) for shard in range(2)]
    seen = collections.Counter(i for batches in shards for b in batches for i in b)
    assert sorted(seen) == list(range(N)) and set(seen.values()) == {1}
    assert shards[0] != sorted(shards[0])  # shuffled


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_from_iterator_state(snap: snapstore.Snapshot, workers: int) -> None:
    source = SnapshotSource(snap)
    full = ids(loader(source, 1, workers, seed=5))
    iterator = iter(loader(source, 1, workers, seed=5))
    k = 2
    taken = ids(next(iterator) for _ in range(k))
    assert taken == full[:k]
    state = iterator.get_state()
    resumed = iter(loader(pickle.loads(pickle.dumps(source)), 1, workers, seed=5))
    resumed.set_state(state)
    assert ids(resumed) == full[k:]
