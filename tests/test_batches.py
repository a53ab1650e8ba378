"""batches(): shuffled, even across ranks, deterministic, as numpy."""

from __future__ import annotations

import numpy as np
import pytest

import snapstore
from snapstore.storage.store import Store
from snapstore.write.writer import WriteOptions


def stage(n: int):
    for i in range(n):
        yield {
            "id": i,
            "img": np.full((2, 3), i, np.int32),
            "tok": np.arange(i % 7, dtype=np.int16),
            "name": f"s{i}",
        }


@pytest.fixture
def snap(store: Store):
    s = snapstore.snapshot(
        stage, root=store, options=WriteOptions(block_min_rows=1, block_bytes=600)
    )(1003)
    s.materialize()
    yield s
    s.close()


def ids(snap, **kw) -> list[np.ndarray]:
    return [b["id"] for b in snap.batches(kw.pop("batch_size", 64), **kw)]


def test_unshuffled_batches_are_written_order(snap) -> None:
    batches = list(snap.batches(100))
    assert len(batches) == 11 and len(batches[-1]["id"]) == 3
    np.testing.assert_array_equal(np.concatenate([b["id"] for b in batches]), np.arange(1003))
    first = batches[0]
    assert first["img"].shape == (100, 2, 3) and first["img"].dtype == np.int32
    np.testing.assert_array_equal(first["img"][:, 0, 0], np.arange(100))
    assert isinstance(first["tok"], list) and len(first["tok"][8]) == 1
    assert first["name"][5] == "s5"


@pytest.mark.parametrize("world_size", range(1, 9))
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_are_even_and_cover_everything(snap, world_size: int, drop_last: bool) -> None:
    per_rank = [
        np.concatenate(
            ids(
                snap,
                shuffle=True,
                seed=3,
                epoch=1,
                rank=r,
                world_size=world_size,
                drop_last=drop_last,
                batch_size=50,
            )
            or [np.empty(0, np.int64)]
        )
        for r in range(world_size)
    ]
    lengths = {len(p) for p in per_rank}
    assert len(lengths) == 1, lengths  # every rank the same count: no DDP hang
    n = lengths.pop()
    allids = np.concatenate(per_rank)
    if drop_last:
        assert n == (1003 // world_size) // 50 * 50
        assert len(set(allids.tolist())) == len(allids)  # no repeats
    else:
        assert n == -(-1003 // world_size)
        assert set(allids.tolist()) == set(range(1003))
        assert len(allids) - 1003 < world_size  # padding repeats fewer than world_size samples
    batch_counts = {
        len(snap.batches(50, rank=r, world_size=world_size, drop_last=drop_last))
        for r in range(world_size)
    }
    assert len(batch_counts) == 1


def test_shuffle_is_deterministic_and_changes_with_epoch_and_seed(snap) -> None:
    a = np.concatenate(ids(snap, shuffle=True, seed=0, epoch=0))
    assert sorted(a.tolist()) == list(range(1003))
    np.testing.assert_array_equal(a, np.concatenate(ids(snap, shuffle=True, seed=0, epoch=0)))
    assert not np.array_equal(a, np.concatenate(ids(snap, shuffle=True, seed=0, epoch=1)))
    assert not np.array_equal(a, np.concatenate(ids(snap, shuffle=True, seed=1, epoch=0)))
    assert not np.array_equal(a, np.arange(1003))


def test_shuffled_fields_stay_together(snap) -> None:
    for batch in snap.batches(128, shuffle=True, epoch=2):
        np.testing.assert_array_equal(batch["img"][:, 1, 2], batch["id"])
        assert [len(t) for t in batch["tok"]] == [i % 7 for i in batch["id"].tolist()]
        assert batch["name"] == [f"s{i}" for i in batch["id"].tolist()]


def test_bad_arguments(snap) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        snap.batches(0)
    with pytest.raises(ValueError, match="rank"):
        snap.batches(8, rank=4, world_size=4)
    with pytest.raises(
        ValueError, match=r"ragged: expected one of \('list', 'pad', 'packed'\), found 'x'"
    ):
        snap.batches(8, ragged="x")
    with pytest.raises(ValueError, match="prefetch_bytes: expected a positive int, found 0"):
        snap.batches(8, prefetch_bytes=0)
    with pytest.raises(ValueError, match="max_requests: expected an int >= 1, found 0"):
        iter(snap.batches(8, max_requests=0))
    with pytest.raises(ValueError, match="decode_threads: expected an int >= 1, found 0"):
        iter(snap.batches(8, decode_threads=0))


def test_decode_threads_change_nothing_but_threads(snap) -> None:
    one = snap.batches(64, shuffle=True, decode_threads=1)
    batches = [next(iterator := iter(one))]
    assert one._prefetcher is not None
    assert one._prefetcher._decoders._max_workers == 1
    batches += list(iterator)
    expected = list(snap.batches(64, shuffle=True, decode_threads=3))
    for a, b in zip(batches, expected, strict=True):
        np.testing.assert_array_equal(a["id"], b["id"])


def test_workers_and_ranks_split_evenly(snap) -> None:
    parts = [
        np.concatenate(ids(snap, shuffle=True, rank=r, world_size=2, worker=w, num_workers=3))
        for r in range(2)
        for w in range(3)
    ]
    assert {len(p) for p in parts} == {-(-1003 // 6)}
    assert set(np.concatenate(parts).tolist()) == set(range(1003))


def test_ragged_pad_gives_padded_arrays_and_lengths(snap) -> None:
    for batch in snap.batches(64, shuffle=True, ragged="pad"):
        lengths = batch["tok_lengths"]
        np.testing.assert_array_equal(lengths, batch["id"] % 7)
        tok = batch["tok"]
        assert tok.dtype == np.int16 and tok.shape == (len(lengths), lengths.max())
        for row, n in zip(tok, lengths):
            np.testing.assert_array_equal(row[:n], np.arange(n))
            assert not row[n:].any()


def test_ragged_pad_of_higher_rank_fields(tmp_path) -> None:
    def grids(n: int):
        for i in range(n):
            yield {"g": np.ones((1 + i % 3, 2 + i % 2), np.float32)}

    snap = snapstore.snapshot(grids, root=str(tmp_path))(10)
    batch = next(iter(snap.batches(10, ragged="pad")))
    assert batch["g"].shape == (10, 3, 3)
    np.testing.assert_array_equal(batch["g_lengths"][:3], [[1, 2], [2, 3], [3, 2]])
    assert batch["g"][0].sum() == 2 and batch["g"][2].sum() == 6
    snap.close()


def test_stats_describe_the_pass(snap, caplog) -> None:
    reader = snap.batches(100, shuffle=True)
    with caplog.at_level("DEBUG", logger="snapstore.batches"):
        for _ in reader:
            pass
    stats = reader.stats()
    assert (stats.samples, stats.batches) == (1003, 11)
    assert stats.blocks == len(snap._open().index)
    if snap.store.local:
        # Memory-map views of up to 8 blocks of one shard each; only the blocks' bytes count.
        assert stats.blocks / 8 <= stats.requests < stats.blocks
        assert stats.bytes == int(snap._open().index["length"].sum())
    else:
        # Order version 2 ramps its first windows up (16, then 32 blocks, then the rest): each
        # is a few scattered blocks, read in a range each at most. In version 1 the 80 blocks
        # are one window: adjacent, so one range read.
        assert stats.requests <= stats.blocks
        former = snap.batches(100, shuffle=True, order_version=1)
        for _ in former:
            pass
        assert former.stats().requests == 1
    assert stats.bytes > 0 and stats.wall > 0 and stats.stall >= 0 and stats.startup >= 0
    assert set(stats.as_dict()) >= {"latency_mean", "latency_p95", "concurrency", "stall"}
    assert any("1003 samples" in r.getMessage() for r in caplog.records)
