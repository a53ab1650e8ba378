"""Order versions: version 2 ramps a shuffled epoch's first windows up (16, 32, 64 blocks, then
the window), version 1 is the order before it, kept exactly; resume states carry the version."""

from __future__ import annotations

import numpy as np
import pytest

import snapstore
from snapstore.errors import ResumeError
from snapstore.format.plan import (
    ORDER_VERSION,
    ORDER_VERSIONS,
    RAMP_FIRST_BLOCKS,
    EpochPlan,
    PlanOptions,
    window_layout,
)
from snapstore.write.writer import WriteOptions

# Computed with the code before order versions (EpochPlan, epoch 1, shuffled): version 1 must
# give exactly these. (seed, block_rows, window_blocks, world_size, rank) -> the rank's order.
BEFORE_VERSIONS = [
    (
        (0, [5] * 12, 3, 1, 0),
        [
            *[19, 15, 16, 53, 34, 31, 50, 52, 30, 51, 33, 18, 54, 32, 17, 28, 25, 48, 20, 23],
            *[21, 29, 45, 22, 47, 24, 26, 49, 27, 46, 58, 42, 57, 0, 2, 44, 3, 40, 4, 55],
            *[56, 1, 59, 43, 41, 35, 8, 11, 39, 7, 12, 36, 38, 14, 37, 10, 9, 13, 6, 5],
        ],
    ),
    (
        (7, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], 2, 2, 1),
        [0, 32, 3, 35, 33, 31, 34, 36, 15, 38, 19, 14, 37, 17, 20, 16, 21, 18, 22, 6],
    ),
    ((123, [4] * 9 + [2], 4, 3, 2), [1, 0, 8, 4, 23, 22, 20, 35, 32, 21, 33, 34, 14]),
]
# docs/format.md's test vector (section 12.6): rows (7 * b) % 13 + 1 for 60 blocks, seed 2024,
# window_blocks 40, epoch 0.
VECTOR_ROWS = [(7 * b) % 13 + 1 for b in range(60)]
VECTOR = {
    1: [333, 17, 347, 270, 61, 68, 231, 234, 97, 201],
    2: [17, 347, 270, 68, 201, 217, 218, 87, 50, 355],
}


def plan(rows, version, *, seed=0, window=40, epoch=0, rank=0, world=1, drop_last=False):
    options = PlanOptions(True, seed, window, drop_last, version)
    return EpochPlan(rows, epoch=epoch, rank=rank, world_size=world, options=options)


@pytest.mark.parametrize(("case", "expected"), BEFORE_VERSIONS)
def test_version_1_is_the_order_before_versions(case, expected) -> None:
    seed, rows, window, world, rank = case
    got = plan(rows, 1, seed=seed, window=window, epoch=1, rank=rank, world=world).order()
    assert got.tolist() == expected


def test_plan_options_default_to_version_1_and_readers_to_the_latest() -> None:
    assert PlanOptions().order_version == 1 and ORDER_VERSION == max(ORDER_VERSIONS) == 2
    assert snapstore.ReaderOptions().order_version is None  # the latest, or a state's


# The same with world_size 4: consumer 2's first ten samples (section 12.6).
VECTOR_RANK_2_OF_4 = {
    1: [146, 389, 335, 24, 336, 76, 331, 51, 40, 180],
    2: [46, 123, 22, 187, 4, 367, 119, 209, 137, 6],
}


@pytest.mark.parametrize("version", ORDER_VERSIONS)
def test_the_pinned_vector(version) -> None:
    assert plan(VECTOR_ROWS, version, seed=2024).order()[:10].tolist() == VECTOR[version]
    later = plan(VECTOR_ROWS, version, seed=2024, rank=2, world=4).order()[:10].tolist()
    assert later == VECTOR_RANK_2_OF_4[version]


def test_the_ramp_layout() -> None:
    assert window_layout(126, 2) == (0, 16, 48, 112)
    assert window_layout(42, 2) == (0, 16, 48)
    assert window_layout(16, 2) == window_layout(126, 1) == (0,)
    blocks = [len(c) for c in plan([1] * 300, 2, window=126).chunks()]
    assert blocks == [16, 32, 64, 126, 62]


@pytest.mark.parametrize("window", [17, 40, 126, 500])
@pytest.mark.parametrize("rows", [[3] * 200, [(5 * b) % 9 for b in range(150)], [7] * 20])
def test_every_sample_once_per_epoch(rows, window) -> None:
    for epoch in range(3):
        order = plan(rows, 2, window=window, epoch=epoch, seed=epoch + 5).order()
        assert sorted(order.tolist()) == list(range(sum(rows)))


def consumer_orders(rows, world, workers, *, version=2, drop_last=False, window=40, seed=0):
    options = PlanOptions(True, seed, window, drop_last, version)
    return [
        EpochPlan(
            rows, epoch=0, rank=rank, world_size=world, options=options,
            worker=worker, num_workers=workers,
        ).order()
        for rank in range(world)
        for worker in range(workers)
    ]  # fmt: skip


@pytest.mark.parametrize("drop_last", [False, True])
def test_equal_shares_across_ranks_and_workers(drop_last) -> None:
    rows = [(5 * b) % 9 + 1 for b in range(150)]
    n = sum(rows)
    by_total = {}
    for world, workers in [(3, 1), (1, 3), (2, 4), (8, 1), (4, 2)]:
        parts = consumer_orders(rows, world, workers, drop_last=drop_last)
        consumers = world * workers
        per = n // consumers if drop_last else -(-n // consumers)
        assert {len(p) for p in parts} == {per}
        joined = np.concatenate(parts)  # consumers in order read the epoch's order from its start
        if drop_last:  # the last N - C * per samples of the order are read by none
            assert len(set(joined.tolist())) == joined.size == consumers * per > n - consumers
        else:  # the order, then its first C * per - N samples again (padding)
            assert sorted(joined[:n].tolist()) == list(range(n))
            assert joined[n:].tolist() == joined[: consumers * per - n].tolist()
        # What consumer c reads depends on C and c only, not on how C is split.
        same = by_total.setdefault(consumers, parts)
        assert [p.tolist() for p in parts] == [p.tolist() for p in same]


def blocks_of(rows, samples) -> int:
    """How many blocks hold ``samples``."""
    return len(set(np.searchsorted(np.cumsum(rows), samples, side="right").tolist()))


@pytest.mark.parametrize("uniform", [True, False])
def test_every_consumer_starts_on_the_ramp(uniform) -> None:
    """Every consumer's first batch comes from one 16-block window, not from a full one."""
    rows = [8] * 6000 if uniform else [6 + (7 * b) % 5 for b in range(6000)]
    batch, n = 64, sum(rows)  # 8 blocks of samples: far fewer blocks than a full window
    former = []
    for world in range(1, 9):
        for workers in range(1, 5):
            parts = consumer_orders(rows, world, workers, window=126, seed=world * 10 + workers)
            firsts = [blocks_of(rows, p[:batch]) for p in parts]
            assert max(firsts) <= RAMP_FIRST_BLOCKS, (world, workers, firsts)
            assert sorted(np.concatenate(parts)[:n].tolist()) == list(range(n))
            if world * workers == 8:  # version 1: consumer 3 of 8 starts inside a full window
                old = consumer_orders(rows, world, workers, version=1, window=126)
                former.append(blocks_of(rows, old[3][:batch]))
    assert min(former) > 2 * RAMP_FIRST_BLOCKS


def test_one_consumer_reads_the_ramp_from_the_epoch_start_alone() -> None:
    rows = [(5 * b) % 9 + 1 for b in range(150)]
    single = consumer_orders(rows, 1, 1)[0]
    assert [len(c) for c in plan([1] * 300, 2, window=126).chunks()] == [16, 32, 64, 126, 62]
    first = consumer_orders(rows, 2, 1)[0]  # the second consumer's ramp cuts the first's share
    assert first[:50].tolist() == single[:50].tolist()  # its first window: the same 16 blocks
    assert first.tolist() != single[: first.size].tolist()


def test_chunks_resume_exactly_around_the_ramp() -> None:
    rows = [4] * 120  # windows of 16, 32, 40, 32 blocks: boundaries at 64, 192 and 352 samples
    p = plan(rows, 2, seed=9)
    order = p.order()
    for start in [0, 1, 63, 64, 65, 191, 192, 193, 351, 352, 353, 479, 480]:
        chunks = list(p.chunks(start))
        tail = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
        assert tail.tolist() == order[start:].tolist()


@pytest.mark.parametrize("uniform", [True, False])
def test_a_later_consumer_resumes_exactly_around_its_ramp(uniform) -> None:
    rows = [4] * 2000 if uniform else [3 + b % 3 for b in range(2000)]
    options = PlanOptions(True, 9, 126, False, 2)
    p = EpochPlan(rows, epoch=1, rank=3, world_size=8, options=options)
    order = p.order()
    sizes = [len(c) for c in p.chunks()]
    # Consumer 3's share, 250 blocks from the one holding its first sample: windows of 16, 32
    # and 64 blocks, then 126 (fewer samples in the first when it starts inside a block).
    edges = np.cumsum(sizes)[:4].tolist()
    if uniform:
        assert sizes == [64, 128, 256, 504, 48]
    for start in [0, 1, *[e + d for e in edges for d in (-1, 0, 1)], p.num_samples]:
        chunks = list(p.chunks(start))
        tail = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
        assert tail.tolist() == order[start:].tolist()


def tokens(n: int):
    for i in range(n):
        yield {"id": i, "tok": np.arange(i % 5, dtype=np.int16)}


@pytest.fixture
def snap(tmp_path):
    s = snapstore.snapshot(
        tokens, root=str(tmp_path), options=WriteOptions(block_min_rows=1, block_bytes=600)
    )(2000)
    s.materialize()
    yield s
    s.close()


def ids(reader) -> list[int]:
    return [int(i) for batch in reader for i in batch["id"]]


def test_readers_read_version_2_and_ask_for_version_1(snap) -> None:
    latest = snap.batches(64, shuffle=True, window_blocks=40)
    former = snap.batches(64, shuffle=True, window_blocks=40, order_version=1)
    assert latest.plan.order_version == 2 and latest.get_state()["order_version"] == 2
    assert former.plan.order_version == 1 and former.get_state()["order_version"] == 1
    assert sorted(ids(latest)) == sorted(ids(former)) == list(range(2000))
    assert ids(latest) == latest.plan.order().tolist() != former.plan.order().tolist()


@pytest.mark.parametrize("place", [{}, {"rank": 1, "world_size": 2}])
@pytest.mark.parametrize("version", ORDER_VERSIONS)
def test_resume_is_exact_across_the_ramp(snap, version, place) -> None:
    settings = {"shuffle": True, "window_blocks": 40, "order_version": version, "seed": 3}
    settings.update(place)
    whole = ids(snap.batches(50, **settings))
    for batches in (1, 3, 7, 12, 17):  # the ramp windows end inside some of these
        reader = snap.batches(50, **settings)
        it = iter(reader)
        for _ in range(batches):
            next(it)
        state = reader.get_state()
        reader.close()
        resumed = snap.batches(50, **settings)
        resumed.set_state(state)
        assert whole[: 50 * batches] + ids(resumed) == whole


def test_a_state_resumes_under_another_split_of_the_consumers(snap) -> None:
    settings = {"shuffle": True, "window_blocks": 40, "seed": 5}
    saved = snap.batches(50, rank=1, world_size=4, **settings)  # consumer 1 of 4
    whole = ids(saved)
    it = iter(saved)
    next(it), next(it)
    state = saved.get_state()
    saved.close()
    split = {"rank": 0, "world_size": 2, "worker": 1, "num_workers": 2}  # consumer 1 of 4 too
    assert ids(snap.batches(50, **split, **settings)) == whole
    resumed = snap.batches(50, **split, **settings)
    resumed.set_state(state)
    assert ids(resumed) == whole[100:]


def test_a_version_1_state_resumes_in_version_1(snap) -> None:
    old = snap.batches(64, shuffle=True, window_blocks=40, order_version=1)
    whole = ids(old)
    it = iter(old)
    next(it), next(it)
    state = old.get_state()
    old.close()
    reader = snap.batches(64, shuffle=True, window_blocks=40)  # order_version None: the latest
    reader.set_state(state)
    assert reader.options.order_version == 1 and reader.get_state()["order_version"] == 1
    assert ids(reader) == whole[128:]


def test_a_state_without_the_key_is_version_1(snap) -> None:
    old = snap.batches(64, shuffle=True, window_blocks=40, order_version=1)
    whole = ids(old)
    state = {**old.get_state(), "position": 64}
    del state["order_version"]  # saved before order versions
    reader = snap.batches(64, shuffle=True, window_blocks=40)
    reader.set_state(state)
    assert reader.plan.order_version == 1 and ids(reader) == whole[64:]


def test_a_reader_asked_for_a_version_refuses_another(snap) -> None:
    state = snap.batches(64, shuffle=True, order_version=1).get_state()
    reader = snap.batches(64, shuffle=True, order_version=2)
    with pytest.raises(ResumeError, match="order_version=1 \\(reader has 2\\)"):
        reader.set_state(state)
    assert reader.plan.order_version == 2  # nothing changed by the refusal


@pytest.mark.parametrize("bad", [0, 3, True, "2", 1.5])
def test_a_bad_order_version_is_refused(snap, bad) -> None:
    with pytest.raises(ValueError, match=r"order_version: expected one of \(1, 2\)"):
        snapstore.ReaderOptions(order_version=bad)
    with pytest.raises(ValueError, match=r"PlanOptions.order_version: expected one of"):
        PlanOptions(order_version=bad)
    state = {**snap.batches(64, shuffle=True).get_state(), "order_version": bad}
    with pytest.raises(ResumeError, match="resume state order_version"):
        snap.batches(64, shuffle=True).set_state(state)


def test_a_planoptions_reader_keeps_its_version(snap) -> None:
    reader = snapstore.BatchReader(snap._open(), 64, PlanOptions(True, 0, 40))
    assert reader.plan.order_version == 1  # a PlanOptions made before versions orders as then
    with pytest.raises(TypeError, match="order_version"):
        snapstore.BatchReader(snap._open(), 64, PlanOptions(), order_version=2)


def test_a_mixture_state_carries_the_version(tmp_path) -> None:
    stage = snapstore.snapshot(
        tokens, root=str(tmp_path), options=WriteOptions(block_min_rows=1, block_bytes=600)
    )
    mixture = snapstore.mix([stage(1500).materialize(), stage(900).materialize()], [2, 1])
    settings = {"shuffle": True, "window_blocks": 40}
    former = [int(i) for b in mixture.batches(32, order_version=1, **settings) for i in b["id"]]
    latest = mixture.batches(32, **settings)
    assert latest.get_state()["order_version"] == 2
    assert [int(i) for b in latest for i in b["id"]] != former
    state = {**mixture.batches(32, order_version=1, **settings).get_state(), "position": 96}
    del state["order_version"]  # saved before order versions: version 1
    resumed = mixture.batches(32, **settings)
    resumed.set_state(state)
    assert [int(i) for b in resumed for i in b["id"]] == former[96:]
    asked = mixture.batches(32, order_version=2, **settings)
    with pytest.raises(ResumeError, match="order_version=1"):
        asked.set_state(state)
