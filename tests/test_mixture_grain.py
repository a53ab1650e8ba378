"""snapstore.grain.mixture_dataset: a mixture (or a snapshot) as a grain.IterDataset, its order,
counts, epochs, ranks and mp_prefetch workers, and resume through get_state/set_state."""

from __future__ import annotations

import collections
import json
import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

grain = pytest.importorskip("grain")

import snapstore  # noqa: E402
from snapstore.errors import ResumeError  # noqa: E402
from snapstore.grain import SnapshotSource, mixture_dataset  # noqa: E402

# Blocks of about 4 samples, so that shuffling and sharding cross blocks.
OPTIONS = snapstore.WriteOptions(block_bytes=64, block_min_rows=4)
B = 1000  # ids of source "b" start here


def rows(n: int, tag: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"id": tag + i, "x": np.full((2,), tag + i, np.float32), "name": f"s{tag + i}"}


@pytest.fixture(scope="module")
def snaps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, snapstore.Snapshot]:
    root = tmp_path_factory.mktemp("mixgrain") / "root"
    make = snapstore.snapshot(rows, root=root, options=OPTIONS)
    return {"a": make(30, 0).materialize(), "b": make(12, B).materialize()}


@pytest.fixture(scope="module")
def mixture(snaps: dict[str, snapstore.Snapshot]) -> snapstore.Mixture:
    """Half and half: "a" (30 samples) subsampled to 21 per epoch, "b" (12) repeated to 21."""
    return snapstore.mix(snaps, [0.5, 0.5], source_field="src")


def ids(elements: Any) -> list[int]:
    """The ids of samples or batches, checking each sample's fields against its id."""
    out: list[int] = []
    for element in elements:
        got = np.atleast_1d(element["id"]).tolist()
        np.testing.assert_array_equal(np.atleast_1d(element["src"]), np.array(got) >= B)
        np.testing.assert_array_equal(np.reshape(element["x"], (-1, 2))[:, 0], got)
        assert np.atleast_1d(element["name"]).tolist() == [f"s{i}" for i in got]
        out.extend(got)
    return out


def reader_ids(mixture: snapstore.Mixture, epoch: int = 0, **settings: Any) -> list[int]:
    batches = mixture.batches(4, shuffle=True, epoch=epoch, **settings)
    return [i for batch in batches for i in batch["id"].tolist()]


@pytest.mark.parametrize("batch_size", [None, 4])
def test_an_epoch_is_the_mixtures_order_with_its_counts(
    mixture: snapstore.Mixture, batch_size: int | None
) -> None:
    ds = mixture_dataset(mixture, batch_size=batch_size, seed=3)
    assert isinstance(ds, grain.IterDataset)
    got = ids(ds)
    assert got == reader_ids(mixture, seed=3)
    assert [sum(i < B for i in got), sum(i >= B for i in got)] == mixture.counts == [21, 21]
    a = collections.Counter(i for i in got if i < B)
    b = collections.Counter(i for i in got if i >= B)
    assert max(a.values()) == 1  # subsampled: 21 different samples of 30
    assert set(b) == set(range(B, B + 12)) and max(b.values()) == 2  # repeated


def test_epochs_differ_and_follow_each_other(mixture: snapstore.Mixture) -> None:
    first, second = reader_ids(mixture, 0, seed=1), reader_ids(mixture, 1, seed=1)
    assert first != second
    assert ids(mixture_dataset(mixture, seed=1, epoch=1)) == second
    assert ids(mixture_dataset(mixture, seed=1, num_epochs=2)) == first + second
    endless = iter(mixture_dataset(mixture, seed=1, num_epochs=None))
    assert ids(next(endless) for _ in range(42 * 3))[84:] == reader_ids(mixture, 2, seed=1)


@pytest.mark.parametrize(
    ("batch_size", "drop_last", "taken"),
    [(None, False, 7), (None, True, 41), (4, False, 3), (4, True, 10), (None, False, 50)],
)
def test_get_state_set_state_resumes_with_exactly_the_rest(
    mixture: snapstore.Mixture, batch_size: int | None, drop_last: bool, taken: int
) -> None:
    def dataset() -> Any:
        ds = mixture_dataset(
            mixture, batch_size=batch_size, seed=2, num_epochs=2, drop_last=drop_last
        )
        return ds.map(lambda e: {**e, "seen": 1})  # a Grain transformation on top

    full = list(dataset())
    interrupted = iter(dataset())
    for _ in range(taken):
        next(interrupted)
    state = json.loads(json.dumps(interrupted.get_state()))
    interrupted.close()
    resumed = iter(dataset())
    resumed.set_state(state)
    assert ids(resumed) == ids(full[taken:])
    # A state at the very end resumes to nothing.
    resumed.set_state(state)
    for _ in resumed:
        pass
    end = resumed.get_state()
    assert list(_resumed(dataset(), end)) == []


def _resumed(ds: Any, state: dict[str, Any]) -> Any:
    it = iter(ds)
    it.set_state(state)
    return it


@pytest.mark.parametrize(("world_size", "drop_last"), [(2, False), (3, True), (4, False)])
def test_ranks_read_disjoint_equal_shares(
    snaps: dict[str, snapstore.Snapshot], world_size: int, drop_last: bool
) -> None:
    mixture = snapstore.mix(snaps, source_field="src")  # by size: every sample once an epoch
    shares = [
        ids(mixture_dataset(mixture, seed=4, rank=r, world_size=world_size, drop_last=drop_last))
        for r in range(world_size)
    ]
    assert len({len(s) for s in shares}) == 1
    flat = [i for s in shares for i in s]
    everything = {*range(30), *range(B, B + 12)}
    if drop_last:  # per sample, a share keeps its short last read batch
        assert len(flat) == len(set(flat)) == 42 // world_size * world_size
        assert set(flat) <= everything
    else:  # the last shares are padded from the start of the epoch
        assert set(flat) == everything and len(flat) == -(-42 // world_size) * world_size


def test_mp_prefetch_workers_read_equal_parts_and_resume(mixture: snapstore.Mixture) -> None:
    ds = mixture_dataset(mixture, batch_size=4, seed=6).mp_prefetch(
        grain.MultiprocessingOptions(num_workers=2)
    )
    it = iter(ds)
    full = [batch["id"].tolist() for batch in it]
    it.close()
    assert sorted(i for b in full for i in b) == sorted(reader_ids(mixture, seed=6))
    interrupted = iter(ds)
    taken = [next(interrupted)["id"].tolist() for _ in range(3)]
    state = interrupted.get_state()
    interrupted.close()
    assert taken == full[:3]
    resumed = _resumed(ds, state)
    assert [batch["id"].tolist() for batch in resumed] == full[3:]
    resumed.close()


def test_a_snapshot_reads_as_its_batches(snaps: dict[str, snapstore.Snapshot]) -> None:
    snap = snaps["a"]
    ds = mixture_dataset(snap, batch_size=4, seed=0)
    expected = [b["id"].tolist() for b in snap.batches(4, shuffle=True, seed=0)]
    assert [b["id"].tolist() for b in ds] == expected
    it = iter(mixture_dataset(snap, seed=0))
    head = [int(next(it)["id"]) for _ in range(5)]
    rest = _resumed(mixture_dataset(snap, seed=0), it.get_state())
    assert head + [int(s["id"]) for s in rest] == [i for b in expected for i in b]


def test_the_dataset_pickles(mixture: snapstore.Mixture) -> None:
    ds = mixture_dataset(mixture, batch_size=4, seed=7, rank=1, world_size=2)
    again = pickle.loads(pickle.dumps(ds))
    assert ids(again) == ids(ds) == reader_ids(mixture, seed=7, rank=1, world_size=2)


def test_bad_inputs_fail_clearly(
    mixture: snapstore.Mixture, snaps: dict[str, snapstore.Snapshot]
) -> None:
    with pytest.raises(TypeError, match=r"mixture_dataset\(mixture"):
        SnapshotSource(mixture)
    with pytest.raises(TypeError, match=r"expected a snapstore\.mix"):
        mixture_dataset([snaps["a"], snaps["b"]])
    with pytest.raises(ValueError, match="batch_size=None yields single samples"):
        mixture_dataset(mixture, ragged="pad")
    homogeneous = snapstore.mix(snaps, homogeneous=True)
    with pytest.raises(ValueError, match="homogeneous"):
        mixture_dataset(homogeneous)
    assert len(list(mixture_dataset(homogeneous, batch_size=4))) == 10
    with pytest.raises(ValueError, match="num_epochs"):
        mixture_dataset(mixture, num_epochs=0)
    it = iter(mixture_dataset(mixture, seed=1))
    with pytest.raises(ResumeError, match="seed"):
        it.set_state(iter(mixture_dataset(mixture, seed=2)).get_state())
    with pytest.raises(ResumeError):
        it.set_state(iter(mixture_dataset(snaps["a"], seed=1)).get_state())
    with pytest.raises(ResumeError, match="epochs"):
        it.set_state(iter(mixture_dataset(mixture, seed=1, epoch=3)).get_state())
