"""snapstore.mix(): the pure schedule and the mixed reader (shares, partition, resume, epochs)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapstore
from snapstore.errors import ResumeError, SchemaError
from snapstore.read.mixture import MixSchedule, apportion

SIZES = (37, 150, 420)
TAG = 1_000_000  # a sample's id is tag * source + index


def samples(n: int, tag: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"id": tag + i, "tok": np.arange(i % 5, dtype=np.int16), "x": np.full(2, i, np.int32)}


def other(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"id": i, "tok": np.arange(3, dtype=np.int32), "x": np.full(2, i, np.int32)}


@pytest.fixture(scope="module")
def snaps(tmp_path_factory: pytest.TempPathFactory) -> list[snapstore.Snapshot]:
    root = tmp_path_factory.mktemp("mix")
    options = snapstore.WriteOptions(block_bytes=200, block_min_rows=4)
    stage = snapstore.snapshot(samples, root=root, options=options)
    return [stage(n, TAG * k).materialize() for k, n in enumerate(SIZES)]


def shares_ok(sources: np.ndarray, weights: list[float], window: int, points: float) -> bool:
    onehot = np.eye(len(weights))[sources]
    run = np.cumsum(np.vstack([np.zeros(len(weights)), onehot]), axis=0)
    share = (run[window:] - run[:-window]) / window
    return bool(np.all(np.abs(share - np.asarray(weights)) <= points / 100))


def read(mixture: snapstore.Mixture, batch: int = 16, **kw: Any) -> list[dict[str, Any]]:
    return list(mixture.batches(batch, **kw))


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 3000), min_size=1, max_size=8).filter(lambda c: sum(c) > 0),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 50),
)
def test_schedule_counts_shares_and_seeks(counts: list[int], seed: int, epoch: int) -> None:
    s = MixSchedule(counts, seed=seed, epoch=epoch)
    order = s.sources(0, s.total)
    assert np.bincount(order, minlength=len(counts)).tolist() == counts
    weights = [c / s.total for c in counts]
    window = min(1000, s.total)
    # Smooth round-robin: off by at most about 1 + K * w units in any window.
    assert shares_ok(order, weights, window, 100 * (1 + len(counts)) / window + 1e-9)
    for t in (0, s.total // 3, s.total - 1, s.total):
        assert s.units_before(t) == np.bincount(order[:t], minlength=len(counts)).tolist()
    if s.total > 10:
        assert np.array_equal(s.sources(5, s.total - 3), order[5:-3])


def test_apportion_sums_and_follows_weights() -> None:
    assert apportion(7, [1, 1, 1]) == [3, 2, 2]
    assert sum(apportion(250_000, [0.01, 0.49, 0.5])) == 250_000


SCHEDULE_SCRIPT = (
    "import json; from snapstore.read.mixture import MixSchedule; "
    "s = MixSchedule([700, 300, 11], seed=12345, epoch=7); "
    "print(json.dumps(s.sources(0, s.total).tolist()))"
)


def test_same_schedule_in_another_process() -> None:
    here = MixSchedule([700, 300, 11], seed=12345, epoch=7)
    env = {"PYTHONHASHSEED": "77"}
    done = subprocess.run(
        [sys.executable, "-c", SCHEDULE_SCRIPT], capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(done.stdout) == here.sources(0, here.total).tolist()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 2),
    epoch=st.integers(0, 5),
    drop_last=st.booleans(),
)
def test_consumers_even_and_resume_exact(
    snaps: list[snapstore.Snapshot],
    data: st.DataObject,
    world_size: int,
    num_workers: int,
    epoch: int,
    drop_last: bool,
) -> None:
    weights = data.draw(st.lists(st.floats(0.05, 1), min_size=3, max_size=3))
    samples_ = data.draw(st.integers(50, 900))
    mixture = snapstore.mix(snaps, weights, samples=samples_, source_field="src")
    counts = []
    for rank in range(world_size):
        for worker in range(num_workers):
            place = dict(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
            kw: dict[str, Any] = dict(shuffle=True, seed=3, epoch=epoch, drop_last=drop_last)
            batches = read(mixture, **kw, **place)
            ids = np.concatenate([b["id"] for b in batches]) if batches else np.zeros(0)
            src = np.concatenate([b["src"] for b in batches]) if batches else np.zeros(0)
            assert np.array_equal(ids // TAG, src)
            counts.append(len(ids))
            if batches:
                k = data.draw(st.integers(0, len(batches)))
                reader = mixture.batches(16, **kw, **place)
                head = [b["id"] for _, b in zip(range(k), reader)]
                state = reader.get_state()
                reader.close()
                again = mixture.batches(16, **kw, **place)
                again.set_state(dict(state))
                rest = [b["id"] for b in again]
                assert np.array_equal(np.concatenate(head + rest), ids)
    assert len(set(counts)) == 1
    consumers = world_size * num_workers
    expected = len(mixture) // consumers if drop_last else math.ceil(len(mixture) / consumers)
    assert counts[0] == expected - (expected % 16 if drop_last else 0)


@pytest.mark.parametrize("count", [10, 16, 37])
def test_subsampled_source_covered_after_ceil_epochs(
    snaps: list[snapstore.Snapshot], count: int
) -> None:
    big = snaps[1]  # 150 samples, count of them per epoch
    mixture = snapstore.mix([snaps[0], big], counts=[20, count])
    seen: set[int] = set()
    epochs = math.ceil(len(big) / count)
    for epoch in range(epochs):
        for rank in range(2):
            for b in read(mixture, 8, shuffle=True, seed=1, epoch=epoch, rank=rank, world_size=2):
                seen |= {int(i) - TAG for i in b["id"] if i >= TAG}
    assert seen == set(range(len(big)))


def test_upsampled_source_repeats_with_fresh_shuffle(snaps: list[snapstore.Snapshot]) -> None:
    mixture = snapstore.mix([snaps[0], snaps[1]], repeats=[3, 1])
    assert mixture.counts == [3 * 37, 150] and len(mixture) == 261
    ids = np.concatenate([b["id"] for b in read(mixture, 32, shuffle=True)])
    small = ids[ids < TAG]
    assert np.bincount(small).tolist() == [3] * 37
    passes = [small[np.isin(small, small)][i * 37 : (i + 1) * 37] for i in range(3)]
    assert len({tuple(p) for p in passes}) > 1


def test_homogeneous_batches_come_from_one_source(snaps: list[snapstore.Snapshot]) -> None:
    mixture = snapstore.mix(snaps, [0.2, 0.3, 0.5], homogeneous=True, source_field="src")
    batches = read(mixture, 8, shuffle=True, world_size=1)
    assert all(len(set(b["src"].tolist())) == 1 for b in batches)
    assert {int(b["src"][0]) for b in batches} == {0, 1, 2}


def test_order_changes_with_seed_epoch_and_weights(snaps: list[snapstore.Snapshot]) -> None:
    def ids(mixture: snapstore.Mixture, **kw: Any) -> list[int]:
        return np.concatenate([b["id"] for b in read(mixture, **kw)]).tolist()

    a = snapstore.mix(snaps, [1, 1, 1])
    assert ids(a, shuffle=True, seed=1) == ids(a, shuffle=True, seed=1)
    assert ids(a, shuffle=True, seed=1) != ids(a, shuffle=True, seed=2)
    assert ids(a, shuffle=True, seed=1) != ids(a, shuffle=True, seed=1, epoch=1)
    assert ids(a, shuffle=True) != ids(snapstore.mix(snaps, [1, 1, 2]), shuffle=True)


def test_schema_mismatch_names_source_and_field(
    snaps: list[snapstore.Snapshot], tmp_path: Any
) -> None:
    odd = snapstore.snapshot(other, root=tmp_path)(20).materialize()
    with pytest.raises(SchemaError, match=r"source 'odd'.*field 'tok'"):
        snapstore.mix({"web": snaps[0], "odd": odd})
    mixture = snapstore.mix({"web": snaps[0], "odd": odd}, fields=["id", "x"])
    batch = next(iter(mixture.batches(4)))
    assert sorted(batch) == ["id", "x"]
    with pytest.raises(SchemaError, match="no field 'nope'"):
        snapstore.mix([snaps[0], odd], fields=["nope"])


def test_bad_arguments_and_foreign_state(snaps: list[snapstore.Snapshot]) -> None:
    with pytest.raises(ValueError, match="not both"):
        snapstore.mix(snaps, [1, 1, 1], counts=[1, 2, 3])
    with pytest.raises(ValueError, match="unknown sources"):
        snapstore.mix({"a": snaps[0]}, {"b": 1.0})
    with pytest.raises(TypeError, match="Snapshot"):
        snapstore.mix(["x"])  # type: ignore[list-item]
    reader = snapstore.mix(snaps).batches(8, seed=1)
    other_ = snapstore.mix(snaps, [1, 2, 3]).batches(8, seed=1)
    with pytest.raises(ResumeError, match="another mixture"):
        reader.set_state(other_.get_state())


def test_stats_add_up_the_sources_on_a_slow_store(snaps: list[snapstore.Snapshot]) -> None:
    from snapstore.storage.simulate import simulated_store

    store = simulated_store(snaps[0].store, ttfb=0.01)
    slow = [snapstore.open(s.fingerprint, root=store) for s in snaps[:2]]
    reader = snapstore.mix(slow, [0.5, 0.5]).batches(16, shuffle=True, seed=1)
    assert sum(len(b["id"]) for b in reader) == SIZES[0] + SIZES[1]
    stats = reader.stats()
    assert stats.samples == SIZES[0] + SIZES[1] and stats.requests >= 2
    assert stats.latency_mean >= 0.01 and stats.latency_p95 >= stats.latency_mean * 0.99
    assert stats.wall > 0 and stats.bytes > 0 and stats.limit >= 2
