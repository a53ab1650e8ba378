"""EpochPlan without O(blocks) arrays yields exactly the documented order: checked against a
straightforward reference that builds the whole global order ``G`` (plan.py's docstring), for
blocks of equal and of varying rows, with rows given or offsets shared, and for resumed starts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapstore.format.plan import (
    BLOCK_DOMAIN,
    WINDOW_DOMAIN,
    EpochPlan,
    PlanOptions,
    derive_key,
    permute,
    unpermute_one,
    window_layout,
    window_permutation,
)


def reference_order(
    rows: list[int], options: PlanOptions, epoch: int, consumers: int = 1
) -> np.ndarray[Any, Any]:
    """``G`` built as format.md and plan.py describe it, with every array materialized: in
    version 2 the ramp starts again at the block holding each consumer's first position."""
    blocks = len(rows)
    offsets = np.concatenate(([0], np.cumsum(rows, dtype=np.int64)))
    order = np.arange(blocks)
    if options.shuffle:
        order = permute(order, blocks, derive_key(options.seed, epoch, BLOCK_DOMAIN))
    ramp = window_layout(options.window_blocks, options.order_version)
    n = int(offsets[-1])
    per = n // consumers if options.drop_last else -(-n // consumers)
    before = np.concatenate(([0], np.cumsum(np.asarray(rows, np.int64)[order])))  # rows before j
    segments = {0}
    if options.shuffle and len(ramp) > 1:  # the block holding G[c * per], for c * per < N
        segments |= {int(np.searchsorted(before, c * per, "right")) - 1
                     for c in range(1, consumers) if 0 < c * per < n}  # fmt: skip
    cuts = sorted(segments)
    starts: list[int] = []
    for lo, hi in zip(cuts, [*cuts[1:], blocks]):
        local = [*ramp[:-1], *range(ramp[-1], max(hi - lo, ramp[-1]), options.window_blocks)]
        starts += [lo + s for s in local if lo + s < hi]
    parts = []
    for w, lo in enumerate(starts):
        hi = starts[w + 1] if w + 1 < len(starts) else blocks
        members = order[lo:hi]
        samples = np.concatenate(
            [np.arange(offsets[b], offsets[b + 1]) for b in members] + [np.zeros(0, np.int64)]
        )
        if options.shuffle:
            key = derive_key(options.seed, epoch, w, WINDOW_DOMAIN)
            samples = samples[window_permutation(samples.size, key)]
        parts.append(samples)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def reference_slice(
    order: np.ndarray[Any, Any], consumer: int, consumers: int, drop_last: bool
) -> np.ndarray[Any, Any]:
    n = order.size
    per = n // consumers if drop_last else -(-n // consumers)
    return order[(consumer * per + np.arange(per)) % n] if n else np.zeros(0, np.int64)


block_rows = st.one_of(
    st.lists(st.integers(0, 9), max_size=70),  # varying, empty blocks included
    st.tuples(st.integers(0, 9), st.integers(1, 70), st.integers(0, 20)).map(
        lambda t: [t[0]] * (t[1] - 1) + [t[2]]  # uniform but the last
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    rows=block_rows,
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64),
    epoch=st.integers(0, 5),
    window_blocks=st.integers(1, 40),  # the ramp (version 2) starts at 16 blocks
    drop_last=st.booleans(),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    shared=st.booleans(),
    version=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_chunks_equal_the_reference(
    rows, shuffle, seed, epoch, window_blocks, drop_last, world, workers, shared, version, data
) -> None:
    options = PlanOptions(shuffle=shuffle, seed=seed, window_blocks=window_blocks)
    options = PlanOptions(**{**options.__dict__, "drop_last": drop_last, "order_version": version})
    order = reference_order(rows, options, epoch, world * workers)
    rank, worker = data.draw(st.integers(0, world - 1)), data.draw(st.integers(0, workers - 1))
    place = {"rank": rank, "world_size": world, "worker": worker, "num_workers": workers}
    if shared:
        offsets = np.concatenate(([0], np.cumsum(rows, dtype=np.int64))).astype(np.int64)
        plan = EpochPlan(None, offsets=offsets, epoch=epoch, options=options, **place)
    else:
        plan = EpochPlan(rows, epoch=epoch, options=options, **place)
    expected = reference_slice(order, rank * workers + worker, world * workers, drop_last)
    assert plan.num_samples == expected.size
    assert plan.order().tolist() == expected.tolist()
    start = data.draw(st.integers(0, plan.num_samples))
    chunks = list(plan.chunks(start))
    tail = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    assert tail.tolist() == expected[start:].tolist()
    assert all(c.size <= max(1, max(rows, default=0)) * window_blocks for c in chunks)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 1 << 40), key=st.integers(0, 2**64), data=st.data())
def test_unpermute_one_inverts_permute(n: int, key: int, data: st.DataObject) -> None:
    i = data.draw(st.integers(0, n - 1))
    assert unpermute_one(int(permute([i], n, key)[0]), n, key) == i


def test_offsets_are_read_in_place_not_copied() -> None:
    offsets = np.arange(0, 8 * 1001, 8, dtype=np.int64)
    offsets.flags.writeable = False  # as mapped from the per-host copy
    plan = EpochPlan(None, offsets=offsets, epoch=0, rank=0, world_size=1, options=PlanOptions())
    assert plan._offsets is offsets
    uniform = PlanOptions(shuffle=True, window_blocks=7)
    plan = EpochPlan(None, offsets=offsets, epoch=1, rank=0, world_size=1, options=uniform)
    assert plan._bounds is None  # every block holds 8 rows: window starts are arithmetic
    varying = np.concatenate(([0], np.cumsum(np.arange(1000) % 3)))
    plan = EpochPlan(None, offsets=varying, epoch=1, rank=0, world_size=1, options=uniform)
    assert plan._bounds is not None and plan._bounds.size == plan.num_windows + 1 == 144


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        (np.array([1, 2], np.int64), "starting at 0"),
        (np.array([0, 3, 2], np.int64), "decrease"),
        (np.array([0, 3], np.int32), "int64"),
        (np.zeros((2, 2), np.int64), "1-D"),
        (np.zeros(0, np.int64), "1-D"),
    ],
)
def test_bad_offsets_are_refused(offsets: np.ndarray[Any, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EpochPlan(None, offsets=offsets, epoch=0, rank=0, world_size=1, options=PlanOptions())
    with pytest.raises(ValueError, match="block_rows or offsets"):
        EpochPlan(None, epoch=0, rank=0, world_size=1, options=PlanOptions())


def test_small_scan_chunks_give_the_same_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offsets checked, uniformity found and window starts summed over many chunks."""
    from snapstore.format import plan as plan_module

    monkeypatch.setattr(plan_module, "_BATCH", 5)
    rng = np.random.default_rng(14)
    for case in range(60):
        blocks = int(rng.integers(1, 90))
        rows = rng.integers(0, 6, blocks) if case % 2 else np.full(blocks, 4)
        rows[-1] = int(rng.integers(0, 9))
        options = PlanOptions(
            shuffle=case % 3 > 0,
            seed=case,
            window_blocks=int(rng.integers(1, 40)),
            order_version=1 + case % 2,
        )
        order = reference_order(rows.tolist(), options, epoch=case, consumers=3)
        for rank in range(3):
            plan = EpochPlan(rows, epoch=case, rank=rank, world_size=3, options=options)
            assert plan.order().tolist() == reference_slice(order, rank, 3, False).tolist()
