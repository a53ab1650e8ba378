"""Tests for snapstore.format.plan: keyed permutations, the epoch order and the rank partition."""

from __future__ import annotations

import json
from pathlib import Path

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
    shuffle_quality,
    window_permutation,
)

GOLDEN = Path(__file__).with_name("plan_golden.json")
GOLDEN_ROWS = [(7 * b) % 13 + 1 for b in range(60)]
GOLDEN_OPTIONS = PlanOptions(shuffle=True, seed=2024, window_blocks=4)

SIZES = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
SIZES += [v for p in (4, 5, 6, 8, 10, 12, 15, 16) for v in (2**p - 1, 2**p, 2**p + 1)]


def reference_order(rows: list[int], options: PlanOptions, epoch: int) -> np.ndarray:
    """The epoch order G built naively (O(N) memory) straight from the documented rule."""
    offsets = np.concatenate(([0], np.cumsum(rows, dtype=np.int64)))
    total = int(offsets[-1])
    if not options.shuffle:
        return np.arange(total)
    n_blocks, wb = len(rows), options.window_blocks
    key = derive_key(options.seed, epoch, BLOCK_DOMAIN)
    block_order = permute(np.arange(n_blocks), n_blocks, key)
    parts = [np.zeros(0, np.int64)]
    for window, first in enumerate(range(0, n_blocks, wb)):
        members = [np.arange(offsets[b], offsets[b + 1]) for b in block_order[first : first + wb]]
        listed = np.concatenate(members)
        key = derive_key(options.seed, epoch, window, WINDOW_DOMAIN)
        parts.append(listed[window_permutation(listed.size, key)])
    return np.concatenate(parts)


def make_plan(
    rows: list[int], options: PlanOptions, *, epoch: int = 0, rank: int = 0, world: int = 1
) -> EpochPlan:
    return EpochPlan(rows, epoch=epoch, rank=rank, world_size=world, options=options)


def rank_orders(rows: list[int], options: PlanOptions, epoch: int, world: int) -> list[np.ndarray]:
    plans = [
        EpochPlan(rows, epoch=epoch, rank=r, world_size=world, options=options)
        for r in range(world)
    ]
    assert len({p.num_samples for p in plans}) == 1
    orders = [p.order() for p in plans]
    assert all(o.size == plans[0].num_samples and o.dtype == np.int64 for o in orders)
    return orders


# --- permute ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("key", [0, 1, 2**64 - 1, -5, 12345678901234567890123])
def test_permute_is_a_bijection(n: int, key: int) -> None:
    out = permute(np.arange(n), n, key)
    assert out.dtype == np.int64 and out.shape == (n,)
    np.testing.assert_array_equal(np.sort(out), np.arange(n))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 100_000), key=st.integers(-(2**80), 2**80))
def test_permute_is_a_bijection_for_random_sizes(n: int, key: int) -> None:
    out = permute(np.arange(n), n, key)
    np.testing.assert_array_equal(np.sort(out), np.arange(n))
    np.testing.assert_array_equal(out, permute(np.arange(n), n, key))


def test_permute_is_elementwise_and_keeps_shape() -> None:
    full = permute(np.arange(1000), 1000, 9)
    picked = np.array([[999, 0], [17, 500]], dtype=np.int32)
    np.testing.assert_array_equal(permute(picked, 1000, 9), full[picked])
    assert permute(np.zeros(3, np.int64), 1, 9).tolist() == [0, 0, 0]
    assert permute(np.array([], np.int64), 0, 9).size == 0


def test_permute_key_reduces_mod_2_64() -> None:
    index = np.arange(50)
    np.testing.assert_array_equal(permute(index, 50, -1), permute(index, 50, 2**64 - 1))


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_different_keys_give_different_permutations(n: int) -> None:
    seen = {tuple(permute(np.arange(n), n, key).tolist()) for key in range(50)}
    assert len(seen) == 50
    assert tuple(range(n)) not in seen


@pytest.mark.parametrize(
    ("index", "n", "match"),
    [
        (np.arange(5), 4, r"expected index values in \[0, 4\), found values in \[0, 4\]"),
        (np.array([-1]), 4, "found values in"),
        (np.array([1.0]), 4, "expected an integer index array"),
        (np.arange(0), -1, "expected 0 <= n"),
    ],
)
def test_permute_rejects_bad_input(index: np.ndarray, n: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        permute(index, n, 0)


def test_permute_ten_million_runs() -> None:
    """Performance sanity (no timing assert): 10M indices in one call stay a bijection."""
    n = 10_000_000
    out = permute(np.arange(n), n, derive_key(1, 2, 3))
    assert out.shape == (n,)
    assert np.bincount(out, minlength=n).max() == 1


def test_derive_key_is_deterministic_and_unambiguous() -> None:
    keys = [
        derive_key(),
        derive_key(0),
        derive_key(0, 0),
        derive_key(1, 2),
        derive_key(2, 1),
        derive_key(12),
        derive_key(-1),
        derive_key(2**64 - 1),
        derive_key(2**64),
        derive_key(2**200),
    ]
    assert len(set(keys)) == len(keys)
    assert all(0 <= k < 2**64 for k in keys)
    assert derive_key(3, 1, 4) == derive_key(3, 1, 4) == derive_key(np.int64(3), 1, 4)


# --- the epoch order and the rank partition ----------------------------------------------------

plan_cases = st.fixed_dictionaries(
    {
        "rows": st.lists(st.integers(0, 40), max_size=50),
        "world": st.integers(1, 8),
        "shuffle": st.booleans(),
        "drop_last": st.booleans(),
        "window_blocks": st.integers(1, 5),
        "seed": st.integers(-(2**70), 2**70),
        "epoch": st.integers(0, 3),
    }
)


@settings(max_examples=300, deadline=None)
@given(case=plan_cases)
def test_ranks_partition_the_global_order(case: dict) -> None:
    rows, world = case["rows"], case["world"]
    options = PlanOptions(
        shuffle=case["shuffle"],
        seed=case["seed"],
        window_blocks=case["window_blocks"],
        drop_last=case["drop_last"],
    )
    total = sum(rows)
    global_order = reference_order(rows, options, case["epoch"])
    assert np.array_equal(np.sort(global_order), np.arange(total))

    orders = rank_orders(rows, options, case["epoch"], world)
    per = orders[0].size
    if total:
        assert per == (total // world if options.drop_last else -(-total // world))
    else:
        assert per == 0
    joined = np.concatenate(orders)
    # Rank r reads G[(r * per + i) mod N], so ranks in order read G from the start, wrapping.
    expected = global_order[np.arange(world * per) % max(total, 1)] if per else joined
    np.testing.assert_array_equal(joined, expected)

    counts = np.bincount(joined, minlength=total)
    if options.drop_last:
        assert counts.max(initial=0) <= 1
        assert 0 <= total - world * per < world
    else:
        assert counts.min(initial=1) >= 1
        assert 0 <= world * per - total < world
    if total % world == 0 and not options.drop_last:
        np.testing.assert_array_equal(joined, global_order)


@settings(max_examples=200, deadline=None)
@given(case=plan_cases, workers=st.integers(1, 4))
def test_workers_compose_with_ranks(case: dict, workers: int) -> None:
    """Rank r's worker w is consumer r * workers + w of world * workers: the same samples as
    that rank of a job with world * workers single-worker ranks, equal counts, exact cover."""
    rows, world = case["rows"], case["world"]
    options = PlanOptions(
        shuffle=case["shuffle"],
        seed=case["seed"],
        window_blocks=case["window_blocks"],
        drop_last=case["drop_last"],
    )
    flat = rank_orders(rows, options, case["epoch"], world * workers)
    composed = [
        EpochPlan(
            rows,
            epoch=case["epoch"],
            rank=r,
            world_size=world,
            worker=w,
            num_workers=workers,
            options=options,
        ).order()
        for r in range(world)
        for w in range(workers)
    ]
    assert len({o.size for o in composed}) == 1
    for got, want in zip(composed, flat, strict=True):
        np.testing.assert_array_equal(got, want)
    counts = np.bincount(np.concatenate(composed), minlength=sum(rows))
    if not options.drop_last and sum(rows):
        assert counts.min() >= 1


def test_order_does_not_depend_on_world_size() -> None:
    rows = [3, 0, 7, 5, 1, 9, 4, 4, 2, 6, 8, 1]  # 50 samples
    options = PlanOptions(shuffle=True, seed=11, window_blocks=3)
    single = make_plan(rows, options, epoch=2).order()
    for world in (2, 5, 10, 25):
        np.testing.assert_array_equal(np.concatenate(rank_orders(rows, options, 2, world)), single)


def test_padding_and_dropping_when_fewer_samples_than_ranks() -> None:
    rows = [2, 1]
    padded = rank_orders(rows, PlanOptions(shuffle=True), 0, 5)
    assert [o.size for o in padded] == [1] * 5
    assert sorted(set(np.concatenate(padded).tolist())) == [0, 1, 2]
    dropped = rank_orders(rows, PlanOptions(shuffle=True, drop_last=True), 0, 5)
    assert list(make_plan(rows, PlanOptions(drop_last=True), world=5).chunks()) == []
    assert [o.size for o in dropped] == [0] * 5
    assert rank_orders([], PlanOptions(), 0, 3)[0].size == 0


def test_determinism_and_variation_across_epochs_and_seeds() -> None:
    rows = [50] * 40

    def order(seed: int, epoch: int) -> np.ndarray:
        options = PlanOptions(shuffle=True, seed=seed, window_blocks=4)
        return make_plan(rows, options, epoch=epoch).order()

    np.testing.assert_array_equal(order(7, 3), order(7, 3))
    variants = [order(7, 3), order(7, 4), order(8, 3), order(0, 0)]
    for i, a in enumerate(variants):
        for b in variants[i + 1 :]:
            assert not np.array_equal(a, b)
    block_orders = {
        tuple(make_plan(rows, PlanOptions(shuffle=True), epoch=e).block_order()) for e in range(5)
    }
    assert len(block_orders) == 5


@settings(max_examples=100, deadline=None)
@given(case=plan_cases)
def test_chunks_resume_at_every_start(case: dict) -> None:
    options = PlanOptions(
        shuffle=case["shuffle"],
        seed=case["seed"],
        window_blocks=case["window_blocks"],
        drop_last=case["drop_last"],
    )
    rows = case["rows"]
    # windows group consecutive *permuted* blocks, so bound a chunk by the largest blocks' rows
    longest = sum(sorted(rows)[max(0, len(rows) - options.window_blocks) :])
    for rank in range(case["world"]):
        plan = EpochPlan(
            rows, epoch=case["epoch"], rank=rank, world_size=case["world"], options=options
        )
        full = plan.order()
        for start in range(plan.num_samples + 1):
            chunks = list(plan.chunks(start))
            assert all(0 < c.size <= longest for c in chunks)
            rest = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
            np.testing.assert_array_equal(rest, full[start:])


def test_chunks_stay_inside_one_window() -> None:
    rows = [int(r) for r in np.random.default_rng(0).integers(0, 30, size=97)]
    offsets = np.cumsum(rows)
    wb = 4
    options = PlanOptions(shuffle=True, seed=5, window_blocks=wb)
    plan = make_plan(rows, options, epoch=1)
    windows = [set(plan.block_order()[i : i + wb].tolist()) for i in range(0, len(rows), wb)]
    seen_windows = []
    for chunk in plan.chunks():
        blocks = set(np.searchsorted(offsets, chunk, side="right").tolist())
        owners = [w for w, members in enumerate(windows) if blocks <= members]
        assert len(owners) == 1
        seen_windows.append(owners[0])
    assert seen_windows == sorted(set(seen_windows))  # windows are read one after another


def test_seek_is_cheap_on_a_billion_samples() -> None:
    """Resuming near the end of a 10**9-sample epoch generates only the last window."""
    plan = EpochPlan(
        np.full(1_000_000, 1000),
        epoch=3,
        rank=3,
        world_size=4,
        options=PlanOptions(shuffle=True, seed=1),
    )
    assert plan.total_samples == 10**9 and plan.num_samples == 250_000_000
    chunks = list(plan.chunks(plan.num_samples - 5))
    assert sum(c.size for c in chunks) == 5
    assert all(int(c.min()) >= 0 and int(c.max()) < 10**9 for c in chunks)


# --- quality and golden orders -----------------------------------------------------------------


def test_shuffle_quality_of_windowed_shuffle() -> None:
    rows = [100] * 1000
    shuffled = make_plan(rows, PlanOptions(shuffle=True, window_blocks=16)).order()
    quality = shuffle_quality(shuffled)
    assert abs(quality["spearman"]) <= 0.05
    assert quality["distance_ratio"] >= 0.9
    ordered = make_plan(rows, PlanOptions()).order()
    assert shuffle_quality(ordered)["spearman"] == pytest.approx(1.0)
    assert shuffle_quality(ordered)["distance_ratio"] < 0.001


def test_shuffle_quality_edge_cases() -> None:
    assert shuffle_quality(np.arange(10)[::-1])["spearman"] == pytest.approx(-1.0)
    assert np.isnan(shuffle_quality(np.array([3]))["spearman"])
    uniform = shuffle_quality(np.random.default_rng(1).permutation(100_000))
    assert abs(uniform["spearman"]) < 0.02
    assert uniform["distance_ratio"] == pytest.approx(1, abs=0.02)


def golden_values() -> dict:
    def head(epoch: int) -> list[int]:
        plan = make_plan(GOLDEN_ROWS, GOLDEN_OPTIONS, epoch=epoch)
        return np.concatenate(list(plan.chunks()))[:50].tolist()

    return {
        "block_rows": GOLDEN_ROWS,
        "seed": GOLDEN_OPTIONS.seed,
        "window_blocks": GOLDEN_OPTIONS.window_blocks,
        "epoch_0_first_50": head(0),
        "epoch_1_first_50": head(1),
        "permute_20_key_12345": permute(np.arange(20), 20, 12345).tolist(),
        "window_permutation_20_key_12345": window_permutation(20, 12345).tolist(),
        "derive_key_1_2_3": derive_key(1, 2, 3),
    }


def test_golden_orders() -> None:
    """The stored orders (order version 1, what a PlanOptions orders by default) are part of
    the format's contract.

    A change to any of these values (permutation, key derivation, windowing) changes the order
    every existing snapshot is read in: it needs a new order version (docs/format.md, section
    14), with this one kept.
    """
    assert json.loads(GOLDEN.read_text()) == golden_values()


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"world_size": 0}, r"expected world_size >= 1, found 0"),
        ({"rank": 2, "world_size": 2}, r"expected rank in \[0, 2\), found 2"),
        ({"rank": -1}, r"expected rank in \[0, 1\), found -1"),
        ({"epoch": -1}, r"expected epoch >= 0, found -1"),
        ({"num_workers": 0}, r"expected num_workers >= 1, found 0"),
        ({"worker": 3, "num_workers": 3}, r"expected worker in \[0, 3\), found 3"),
        ({"block_rows": [[1, 2]]}, r"expected 1-D block_rows, found shape \(1, 2\)"),
        ({"block_rows": [1, -2]}, r"expected block_rows in \[0, 2\*\*62\), found values"),
        ({"block_rows": [1.5]}, r"expected integer block_rows, found dtype float64"),
    ],
)
def test_plan_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    arguments = {"block_rows": [3, 4], "epoch": 0, "rank": 0, "world_size": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        EpochPlan(**arguments, options=PlanOptions())


def test_plan_rejects_bad_start_and_options() -> None:
    plan = EpochPlan([3, 4], epoch=0, rank=0, world_size=2, options=PlanOptions())
    assert list(plan.chunks(4)) == []
    with pytest.raises(ValueError, match=r"expected start in \[0, 5\), found 5"):
        plan.chunks(5)
    with pytest.raises(ValueError, match=r"expected start in \[0, 5\), found -1"):
        plan.chunks(-1)
    with pytest.raises(ValueError, match="expected an int >= 1, found 0"):
        PlanOptions(window_blocks=0)


@given(n=st.integers(0, 5000), key=st.integers(-(2**70), 2**70))
def test_window_permutation_is_a_bijection(n: int, key: int) -> None:
    perm = window_permutation(n, key)
    assert sorted(perm.tolist()) == list(range(n))
    np.testing.assert_array_equal(perm, window_permutation(n, key))
    if n >= 10:
        assert not np.array_equal(perm, window_permutation(n, key + 1))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.integers(0, 9), min_size=1, max_size=60),
    shuffle=st.booleans(),
    window=st.integers(1, 8),
    version=st.sampled_from([1, 2]),
    consumers=st.integers(1, 5),
    epochs=st.lists(st.integers(0, 6), min_size=1, max_size=3),
)
def test_for_epoch_and_for_rank_are_new_plans_for_them(
    rows: list[int], shuffle: bool, window: int, version: int, consumers: int, epochs: list[int]
) -> None:
    """Uniform and varying block sizes, shuffled or not, either order version: a plan made
    from another epoch's or rank's gives the same order as a plan made for it."""
    options = PlanOptions(shuffle=shuffle, seed=3, window_blocks=window, order_version=version)
    base = EpochPlan(rows, epoch=0, rank=consumers - 1, world_size=consumers, options=options)
    plan = base
    for epoch in epochs:
        plan = plan.for_epoch(epoch)
        fresh = EpochPlan(
            rows, epoch=epoch, rank=consumers - 1, world_size=consumers, options=options
        )
        assert plan.epoch == epoch
        np.testing.assert_array_equal(plan.order(), fresh.order())
        for rank in range(consumers):
            other = EpochPlan(rows, epoch=epoch, rank=rank, world_size=consumers, options=options)
            np.testing.assert_array_equal(plan.for_rank(rank).order(), other.order())
        assert [len(c) for c in plan.chunks()] == [len(c) for c in fresh.chunks()]
    assert base.epoch == 0  # the plan it was made from is unchanged
    with pytest.raises(ValueError):
        base.for_epoch(-1)
    with pytest.raises(ValueError):
        base.for_rank(consumers)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(st.integers(0, 9), min_size=1, max_size=80),
    window=st.integers(1, 9),
    version=st.sampled_from([1, 2]),
)
def test_unshuffled_window_lookup_is_the_binary_search(
    rows: list[int], window: int, version: int
) -> None:
    """Empty blocks included: the direct lookup of an unshuffled plan's window finds what the
    search over window starts finds, at every position."""
    options = PlanOptions(shuffle=False, window_blocks=window, order_version=version)
    plan = EpochPlan(rows, epoch=0, rank=0, world_size=1, options=options)
    for position in range(plan.total_samples):
        assert plan._find_window(position) == plan._search_window(position)
