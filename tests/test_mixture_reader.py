"""snapstore.mix() read through its reader: shares per window of what each consumer reads,
homogeneous batches, varying-shape and large fixed-shape fields, transforms in DataLoader
workers, the same order in another process, and resume at drawn positions (tests/test_mixture.py
covers the schedule on its own)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapstore
from snapstore.read.mixed import MixedBatchReader
from snapstore.read.mixture import MixSchedule

TAG = 1_000_000  # a sample's id is TAG * source + its index in the source
TINY_SIZES = (120, 400, 900, 1500, 2600, 5000)
WINDOW = 1000  # the window of consecutive samples
POINTS = 2.0  # the bound on a source's share in every window, in percentage points
FIXTURE = [HealthCheck.function_scoped_fixture]


def tiny_rows(n: int, tag: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"id": tag + i}


def tok_of(sample_id: int) -> np.ndarray[Any, Any]:
    """A varying-length 1-D row (length 0 included)."""
    return np.arange((sample_id * 7) % 9, dtype=np.int32) + sample_id % 997


def grid_of(sample_id: int) -> np.ndarray[Any, Any]:
    """A varying-shape (rows, 3) row (0 rows included)."""
    rows = (sample_id * 5) % 4
    return (np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + sample_id).astype(np.float32)


def name_of(sample_id: int) -> str:
    return f"s{sample_id}" * (sample_id % 3)


def ragged_rows(n: int, tag: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        sid = tag + i
        yield {"id": sid, "tok": tok_of(sid), "grid": grid_of(sid), "name": name_of(sid)}


def image_of(sample_id: int, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    return np.random.default_rng(sample_id).integers(0, 256, shape, dtype=np.uint8)


IMG, BIG = (16, 16, 3), (24, 24, 3)  # 768 bytes a row, and 1,728 (over the 1 KiB row copy path)


def image_rows(n: int, tag: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"id": tag + i, "img": image_of(tag + i, IMG), "big": image_of(tag + i, BIG)}


def make(fn: Any, root: Any, sizes: tuple[int, ...], options: Any) -> list[snapstore.Snapshot]:
    stage = snapstore.snapshot(fn, root=root, options=options)
    return [stage(n, TAG * k).materialize() for k, n in enumerate(sizes)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> list[snapstore.Snapshot]:
    options = snapstore.WriteOptions(block_bytes=512, block_min_rows=16)
    return make(tiny_rows, tmp_path_factory.mktemp("tiny"), TINY_SIZES, options)


@pytest.fixture(scope="module")
def ragged(tmp_path_factory: pytest.TempPathFactory) -> list[snapstore.Snapshot]:
    options = snapstore.WriteOptions(block_bytes=1024, block_min_rows=4)
    return make(ragged_rows, tmp_path_factory.mktemp("ragged"), (90, 300, 45), options)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[snapstore.Snapshot]:
    options = snapstore.WriteOptions(block_bytes=8192, block_min_rows=1)
    return make(image_rows, tmp_path_factory.mktemp("img"), (70, 160), options)


def places(world_size: int, num_workers: int) -> list[dict[str, Any]]:
    """Every consumer's keyword arguments, in consumer order."""
    return [
        dict(rank=r, world_size=world_size, worker=w, num_workers=num_workers)
        for r in range(world_size)
        for w in range(num_workers)
    ]


def column(batches: list[dict[str, Any]], name: str) -> np.ndarray[Any, Any]:
    return np.concatenate([b[name] for b in batches]) if batches else np.zeros(0, np.int64)


def windowed(which: np.ndarray[Any, Any], k: int, window: int) -> np.ndarray[Any, Any]:
    """Each source's share of every ``window`` consecutive entries of ``which``, one row each."""
    run = np.cumsum(np.vstack([np.zeros(k), np.eye(k)[which]]), axis=0)
    out: np.ndarray[Any, Any] = (run[window:] - run[:-window]) / window
    return out


def worst_window_error(sources: np.ndarray[Any, Any], weights: list[float], window: int) -> float:
    """The largest |share - weight| of any source over any ``window`` consecutive samples."""
    shares = windowed(sources, len(weights), window)
    return float(np.max(np.abs(shares - np.asarray(weights))))


def ids_of(reader: MixedBatchReader) -> list[int]:
    return [int(i) for b in reader for i in b["id"]]


# -- the per-window share bound, through the reader ---------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=FIXTURE)
@given(
    data=st.data(),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 2),
    epoch=st.integers(0, 30),
    shuffle=st.booleans(),
)
def test_every_window_of_every_consumer_holds_the_weights(
    tiny: list[snapstore.Snapshot],
    data: st.DataObject,
    world_size: int,
    num_workers: int,
    epoch: int,
    shuffle: bool,
) -> None:
    k = data.draw(st.integers(3, 6), label="sources")
    raw = data.draw(st.lists(st.floats(0.01, 0.6), min_size=k, max_size=k), label="weights")
    weights = [w / sum(raw) for w in raw]
    consumers = world_size * num_workers
    per = data.draw(st.integers(2500, 3500), label="samples per consumer")
    mixture = snapstore.mix(tiny[:k], raw, samples=per * consumers, source_field="src")
    assert sum(mixture.counts) == per * consumers
    kw: dict[str, Any] = dict(shuffle=shuffle, seed=11, epoch=0, window_bytes=4096)
    totals = np.zeros(k, np.int64)
    for place in places(world_size, num_workers):
        reader = mixture.batches(64, **kw, **place)
        streams = []
        # Two epochs back to back through one reader: a window may straddle them.
        for e in (epoch, epoch + 1):
            reader.set_epoch(e)
            batches = list(reader)
            src, ids = column(batches, "src"), column(batches, "id")
            assert len(src) == len(ids) == per  # equal counts per consumer
            assert np.array_equal(ids // TAG, src)  # the source field says where a row came from
            assert np.all(ids % TAG < np.asarray(TINY_SIZES)[src])
            if e == epoch:
                totals += np.bincount(src, minlength=k)
            streams.append(src)
        both = np.concatenate(streams)
        worst = worst_window_error(both, weights, WINDOW)
        assert worst <= POINTS / 100, (worst, weights, place)
    assert totals.tolist() == mixture.counts  # the consumers together read the epoch


# -- homogeneous batches ------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=FIXTURE)
@given(
    data=st.data(),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 2),
    epoch=st.integers(0, 20),
    batch=st.integers(4, 12),
    drop_last=st.booleans(),
)
def test_homogeneous_batches_even_resumable_and_weighted(
    tiny: list[snapstore.Snapshot],
    data: st.DataObject,
    world_size: int,
    num_workers: int,
    epoch: int,
    batch: int,
    drop_last: bool,
) -> None:
    """Units are whole batches: source ``i`` has ``u_i = counts_i // batch`` of the epoch's
    ``U = sum(u)`` units, and the schedule spaces its units evenly in time (mixture.py), so any
    ``L`` consecutive units a consumer reads (also across the padded consumer's wrap, where time
    goes on cyclically) hold ``L * u_i / U`` of them give or take ``1 + K * u_i / U``. The
    batch share ``u_i / U`` differs from the weight ``w_i`` by rounding: ``counts_i`` is within
    1 of ``w_i * M`` and each floor loses less than one unit, so ``|u_i / U - w_i|`` is at most
    ``(2 + K * w_i) / U``. The test asserts the sum of the two."""
    k = data.draw(st.integers(3, 6), label="sources")
    raw = data.draw(st.lists(st.floats(0.01, 0.6), min_size=k, max_size=k), label="weights")
    weights = np.asarray(raw) / sum(raw)
    samples = data.draw(st.integers(5000, 7000), label="samples per epoch")
    mixture = snapstore.mix(tiny[:k], raw, samples=samples, source_field="src", homogeneous=True)
    units = np.asarray(mixture.counts) // batch
    total = int(units.sum())
    share = units / total
    assert np.all(np.abs(share - weights) <= (2 + k * weights) / total + 1e-12)
    consumers = world_size * num_workers
    per = total // consumers if drop_last else -(-total // consumers)
    kw: dict[str, Any] = dict(shuffle=True, seed=5, epoch=epoch, drop_last=drop_last)
    read = np.zeros(k, np.int64)
    for place in places(world_size, num_workers):
        batches = list(mixture.batches(batch, **kw, **place))
        assert len(batches) == per  # equal batch counts per consumer, every batch whole
        for b in batches:
            assert len(b["id"]) == batch and len(set(b["src"].tolist())) == 1
            assert np.array_equal(b["id"] // TAG, b["src"])
        which = np.asarray([int(b["src"][0]) for b in batches], np.int64)
        read += np.bincount(which, minlength=k)
        window = min(50, per)
        if window:
            bound = (1 + k * share) / window + (2 + k * weights) / total
            errors = np.abs(windowed(which, k, window) - weights)
            assert np.all(errors <= bound + 1e-12), (errors.max(axis=0), bound, place)
        at = data.draw(st.integers(0, per), label="resume batch")
        reader = mixture.batches(batch, **kw, **place)
        head = [b["id"].tolist() for _, b in zip(range(at), reader)]
        state = reader.get_state()
        reader.close()
        again = mixture.batches(batch, **kw, **place)
        again.set_state(dict(state))
        assert head + [b["id"].tolist() for b in again] == [b["id"].tolist() for b in batches]
    padding = consumers * per - total
    if drop_last:
        assert np.all(read <= units) and int(read.sum()) == consumers * per
    else:
        assert np.all(read >= units) and int((read - units).sum()) == padding


# -- varying-shape fields in each form --------------------------------------------------------


def check_ragged_batch(batch: dict[str, Any], form: str) -> None:
    """Every row of ``tok``, ``grid`` and ``name`` is what its source holds for the row's id."""
    ids = batch["id"].tolist()
    n = len(ids)
    assert np.array_equal(batch["id"] // TAG, batch["src"])
    assert list(batch["name"]) == [name_of(i) for i in ids]
    if form == "list":
        assert len(batch["tok"]) == len(batch["grid"]) == n
        for i, sid in enumerate(ids):
            assert batch["tok"][i].dtype == np.int32 and batch["grid"][i].dtype == np.float32
            assert np.array_equal(batch["tok"][i], tok_of(sid))
            assert np.array_equal(batch["grid"][i], grid_of(sid))
    elif form == "pad":
        tok, grid = batch["tok"], batch["grid"]
        assert tok.shape[0] == grid.shape[0] == n and grid.shape[2:] == (3,)
        lengths, shapes = batch["tok_lengths"], batch["grid_lengths"]
        assert lengths.shape == (n,) and shapes.shape == (n, 2)
        for i, sid in enumerate(ids):
            want, cells = tok_of(sid), grid_of(sid)
            assert int(lengths[i]) == len(want) and tuple(shapes[i]) == cells.shape
            assert np.array_equal(tok[i, : len(want)], want) and not tok[i, len(want) :].any()
            assert np.array_equal(grid[i, : len(cells)], cells) and not grid[i, len(cells) :].any()
    else:
        for name, of in (("tok", tok_of), ("grid", grid_of)):
            values, offsets = batch[name], batch[f"{name}_offsets"]
            assert values.ndim == 1 and offsets.dtype == np.int64 and offsets.shape == (n + 1,)
            assert offsets[0] == 0 and offsets[-1] == len(values)
            assert np.all(np.diff(offsets) >= 0)
            shapes = batch.get(f"{name}_shapes")
            for i, sid in enumerate(ids):
                row = values[offsets[i] : offsets[i + 1]]
                want = of(sid)
                assert row.size == want.size
                if name == "grid":
                    assert shapes is not None and tuple(shapes[i]) == want.shape
                    row = row.reshape(tuple(shapes[i]))
                assert np.array_equal(row, want)
        assert "tok_shapes" not in batch and batch["grid_shapes"].shape == (n, 2)


@pytest.mark.parametrize("form", ["list", "pad", "packed"])
@settings(max_examples=15, deadline=None, suppress_health_check=FIXTURE)
@given(
    raw=st.lists(st.floats(0.05, 1), min_size=3, max_size=3),
    samples=st.integers(50, 700),
    batch=st.integers(1, 37),
    shuffle=st.booleans(),
    world_size=st.integers(1, 2),
    num_workers=st.integers(1, 2),
    epoch=st.integers(0, 5),
)
def test_varying_shape_fields_match_their_sources(
    ragged: list[snapstore.Snapshot],
    form: str,
    raw: list[float],
    samples: int,
    batch: int,
    shuffle: bool,
    world_size: int,
    num_workers: int,
    epoch: int,
) -> None:
    mixture = snapstore.mix(ragged, raw, samples=samples, source_field="src")
    assert mixture.schema["tok"].shape == (None,) and mixture.schema["grid"].shape == (None, 3)
    rows = 0
    for place in places(world_size, num_workers):
        reader = mixture.batches(
            batch, shuffle=shuffle, seed=3, epoch=epoch, window_blocks=3, ragged=form, **place
        )
        for b in reader:
            check_ragged_batch(b, form)
            rows += len(b["id"])
    assert rows == world_size * num_workers * math.ceil(samples / (world_size * num_workers))


# -- large fixed-shape rows -------------------------------------------------------------------


@settings(max_examples=20, deadline=None, suppress_health_check=FIXTURE)
@given(
    raw=st.lists(st.floats(0.1, 1), min_size=2, max_size=2),
    batch=st.integers(1, 40),
    shuffle=st.booleans(),
    window_blocks=st.integers(1, 8),
    world_size=st.integers(1, 2),
    epoch=st.integers(0, 5),
)
def test_large_fixed_rows_match_their_sources(
    images: list[snapstore.Snapshot],
    raw: list[float],
    batch: int,
    shuffle: bool,
    window_blocks: int,
    world_size: int,
    epoch: int,
) -> None:
    assert images[0].schema["big"].shape == BIG and images[0].schema["img"].shape == IMG
    mixture = snapstore.mix(images, raw, samples=260, source_field="src")
    seen = 0
    for place in places(world_size, 1):
        kw: dict[str, Any] = dict(shuffle=shuffle, seed=7, epoch=epoch, window_blocks=window_blocks)
        for b in mixture.batches(batch, **kw, **place):
            assert b["img"].shape == (len(b["id"]), *IMG) and b["img"].dtype == np.uint8
            assert b["big"].shape == (len(b["id"]), *BIG) and b["big"].dtype == np.uint8
            assert np.array_equal(b["id"] // TAG, b["src"])
            for i, sid in enumerate(b["id"].tolist()):
                assert np.array_equal(b["img"][i], image_of(sid, IMG)), (sid, i)
                assert np.array_equal(b["big"][i], image_of(sid, BIG)), (sid, i)
            seen += len(b["id"])
    assert seen == world_size * math.ceil(260 / world_size)


# -- transforms in DataLoader workers ---------------------------------------------------------


def double_id(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "double": sample["id"] * 2}


def plus_one_and_noise(batch: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {**batch, "plus": batch["double"] + 1, "noise": torch.rand(len(batch["id"]))}


def test_transforms_in_dataloader_workers(tiny: list[snapstore.Snapshot]) -> None:
    torch = pytest.importorskip("torch")
    from snapstore.torch import SnapshotIterableDataset

    mixture = snapstore.mix(tiny[:3], source_field="src")  # one pass of each source an epoch
    assert len(mixture) == 1420  # even: two workers read 710 each, none repeated
    everything = sorted(TAG * k + i for k, n in enumerate(TINY_SIZES[:3]) for i in range(n))
    ds = SnapshotIterableDataset(
        mixture,
        batch_size=16,
        seed=2,
        sample_transform=double_id,
        transform=plus_one_and_noise,
    )

    def epoch_of(epoch: int) -> list[dict[str, Any]]:
        ds.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        return [dict(b) for b in loader]

    first = epoch_of(0)
    for batch in first:
        ids = batch["id"]
        assert torch.equal(batch["double"], ids * 2) and torch.equal(batch["plus"], ids * 2 + 1)
        assert torch.equal(ids // TAG, batch["src"])
    ids0 = [int(i) for b in first for i in b["id"]]
    assert sorted(ids0) == everything  # every sample once, transformed
    again = epoch_of(0)
    assert [b["id"].tolist() for b in again] == [b["id"].tolist() for b in first]
    # The random draws are seeded per batch: the same epoch draws the same noise.
    assert all(torch.equal(a["noise"], b["noise"]) for a, b in zip(first, again, strict=True))
    second = epoch_of(1)
    ids1 = [int(i) for b in second for i in b["id"]]
    assert sorted(ids1) == everything and ids1 != ids0
    assert all(torch.equal(b["plus"], b["id"] * 2 + 1) for b in second)


# -- the same order in another process --------------------------------------------------------

ORDER_SCRIPT = """
import json, sys
import snapstore
root, a, b = sys.argv[1:4]
mixture = snapstore.mix([snapstore.open(a, root), snapstore.open(b, root)], [0.3, 0.7],
                        samples=1700, source_field="src")
out = []
for rank in range(2):
    for worker in range(2):
        reader = mixture.batches(32, shuffle=True, seed=9, epoch=4, rank=rank, world_size=2,
                                 worker=worker, num_workers=2, window_bytes=2048)
        out.append([int(i) for batch in reader for i in batch["id"]])
print(json.dumps(out))
"""


def test_same_mixed_order_in_another_process(tiny: list[snapstore.Snapshot]) -> None:
    a, b = tiny[1], tiny[2]
    mixture = snapstore.mix([a, b], [0.3, 0.7], samples=1700, source_field="src")
    here = []
    for place in places(2, 2):
        reader = mixture.batches(32, shuffle=True, seed=9, epoch=4, window_bytes=2048, **place)
        here.append(ids_of(reader))
    root = a.store.url
    assert b.store.url == root
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    done = subprocess.run(
        [sys.executable, "-c", ORDER_SCRIPT, root, a.fingerprint, b.fingerprint],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    there = json.loads(done.stdout)
    assert there == here
    assert len({len(ids) for ids in here}) == 1 and sum(map(len, here)) == 1700
    assert sum(i >= 2 * TAG for ids in here for i in ids) == mixture.counts[1] == 1190


# -- resume at drawn positions ----------------------------------------------------------------


def pass_starts(
    mixture: snapstore.Mixture,
    src: np.ndarray[Any, Any],
    source: int,
    seed: int,
    epoch: int,
    consumer: int,
) -> list[int]:
    """The positions among a consumer's samples (``src``: each one's source, ``len(src)`` a
    consumer's share) that start a pass over ``source``, from the pure schedule: the ``j``-th
    unit of source ``i`` in the epoch's order is its stream position ``epoch * count_i + j``,
    and a pass starts where that is a multiple of the source's size."""
    schedule = MixSchedule(mixture.counts, seed=seed, epoch=epoch)
    size, count = TINY_SIZES[source], mixture.counts[source]
    out = []
    for p in np.flatnonzero(src == source).tolist():
        position = (consumer * len(src) + p) % schedule.total
        if (epoch * count + schedule.units_before(position)[source]) % size == 0:
            out.append(p)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURE)
@given(
    data=st.data(),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 2),
    epoch=st.integers(0, 12),
    batch=st.integers(1, 40),
    drop_last=st.booleans(),
    repeat=st.sampled_from([1.5, 2, 3, 4.25]),
    part=st.sampled_from([0.3, 0.5, 1]),
)
def test_resume_at_drawn_positions_and_pass_boundaries(
    tiny: list[snapstore.Snapshot],
    data: st.DataObject,
    world_size: int,
    num_workers: int,
    epoch: int,
    batch: int,
    drop_last: bool,
    repeat: float,
    part: float,
) -> None:
    mixture = snapstore.mix(tiny[:3], repeats=[repeat, 1, part], source_field="src")
    assert mixture.counts[0] == round(repeat * TINY_SIZES[0])
    place = data.draw(st.sampled_from(places(world_size, num_workers)), label="consumer")
    kw: dict[str, Any] = dict(shuffle=True, seed=21, drop_last=drop_last, window_bytes=2048)
    # A reader made for epoch 0 that has read epoch 0, then moved on by set_epoch.
    reader = mixture.batches(batch, epoch=0, **kw, **place)
    read = reader.num_samples - (reader.num_samples % batch if drop_last else 0)
    assert len(ids_of(reader)) == read
    reader.set_epoch(epoch)
    full = list(reader)
    ids = column(full, "id")
    assert np.array_equal(
        ids, column(list(mixture.batches(batch, epoch=epoch, **kw, **place)), "id")
    )
    assert len(ids) == read and len(full) == len(reader)
    state = reader.get_state()
    assert state["position"] == len(ids) and state["epoch"] == epoch

    # Resume from a state saved between batches, after set_epoch, into a reader for epoch 0
    # moved by set_epoch, and into one made for the epoch.
    at = data.draw(st.integers(0, len(full)), label="batches before the save")
    saving = mixture.batches(batch, epoch=0, **kw, **place)
    saving.set_epoch(epoch)
    head = [b["id"] for _, b in zip(range(at), saving)]
    saved = saving.get_state()
    saving.close()
    for made_for in (0, epoch):
        resumed = mixture.batches(batch, epoch=made_for, **kw, **place)
        resumed.set_epoch(epoch)
        resumed.set_state(dict(saved))
        rest = [b["id"] for b in resumed]
        assert np.array_equal(column([{"id": x} for x in head + rest], "id"), ids)
        assert [len(x) for x in head + rest] == [len(b["id"]) for b in full]

    # Resume at any sample position, right at a pass boundary of the upsampled source included.
    # The consumer's samples one by one (the order does not depend on the batch size): a resumed
    # reader yields them from the position on, in whole batches when drop_last says so.
    singles = list(mixture.batches(1, epoch=epoch, **kw, **place))
    one = column(singles, "id")
    assert len(one) == reader.num_samples and np.array_equal(one[: len(ids)], ids)
    consumer = place["rank"] * num_workers + place["worker"]
    starts = pass_starts(mixture, column(singles, "src"), 0, kw["seed"], epoch, consumer)
    positions = {data.draw(st.integers(0, len(one)), label="position"), len(one)}
    for p in starts[:2]:
        positions |= {max(0, p - 1), p, min(len(one), p + 1)}
    for p in sorted(positions):
        resumed = mixture.batches(batch, epoch=epoch, **kw, **place)
        resumed.set_state({**state, "position": p})
        left = len(one) - p - ((len(one) - p) % batch if drop_last else 0)
        assert np.array_equal(column(list(resumed), "id"), one[p : p + left]), p
    if repeat >= 2 and world_size * num_workers == 1:
        assert starts  # one consumer reads all of source 0: at least one pass starts in it
