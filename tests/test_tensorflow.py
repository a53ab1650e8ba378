"""snapstore.tensorflow: element specs from the schema, values equal to snapstore's reader,
sharding, drop_last and resume."""

from __future__ import annotations

import collections
import gc
import json
import threading
import time
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip(
    "tensorflow",
    reason="snapstore.tensorflow needs TensorFlow: pip install 'snapstore[tensorflow]'",
)

import snapstore  # noqa: E402
from snapstore.errors import ResumeError, SchemaError  # noqa: E402
from snapstore.format.schema import Field, Schema  # noqa: E402
from snapstore.tensorflow import TFReader, element_spec, to_dataset  # noqa: E402

N = 30


def samples(n: int) -> Any:
    for i in range(n):
        yield {
            "id": i,
            "x": np.full((2, 3), i, np.float32),
            "u": np.uint32(i),
            "w": float(i) / 2,
            "flag": i % 2 == 0,
            "name": f"s{i}é",
            "raw": bytes([i, 0]),
            "tok": np.arange(i % 5, dtype=np.int32),
            "m": np.full((i % 3 + 1, 2, i % 2 + 1), i, np.float16),
            "c": np.full((2,), i + 1j, np.complex64),
            "v": np.full((2, i % 3), i, np.int64),  # fixed, then varying (empty rows too)
        }


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("tf") / "root"
    # Small blocks (about 4 samples each) so that shuffling and sharding cross blocks.
    options = snapstore.WriteOptions(block_bytes=64, block_min_rows=4)
    return snapstore.snapshot(samples, root=root, options=options)(N).materialize()


def ids(ds: Any) -> list[int]:
    out: list[int] = []
    for element in ds:
        out.extend(np.atleast_1d(element["id"].numpy()).tolist())
    return out


def test_element_spec_batched(snap: snapstore.Snapshot) -> None:
    spec = to_dataset(snap, batch_size=4).element_spec
    assert spec["id"] == tf.TensorSpec((None,), tf.int64)
    assert spec["x"] == tf.TensorSpec((None, 2, 3), tf.float32)
    assert spec["u"] == tf.TensorSpec((None,), tf.uint32)
    assert spec["w"] == tf.TensorSpec((None,), tf.float64)
    assert spec["flag"] == tf.TensorSpec((None,), tf.bool)
    assert spec["name"] == tf.TensorSpec((None,), tf.string)
    assert spec["raw"] == tf.TensorSpec((None,), tf.string)
    assert spec["c"] == tf.TensorSpec((None, 2), tf.complex64)
    assert spec["tok"] == tf.RaggedTensorSpec((None, None), tf.int32, 1, tf.int64)
    assert spec["m"] == tf.RaggedTensorSpec((None, None, 2, None), tf.float16, 3, tf.int64)
    assert spec["v"] == tf.RaggedTensorSpec((None, 2, None), tf.int64, 2, tf.int64)


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 4},
        {"batch_size": 4, "drop_last": True},
        {"batch_size": 4, "drop_last": True, "ragged": "pad"},
        {"batch_size": 3, "ragged": "pad"},
        {},
        {"drop_last": True},
    ],
)
def test_dataset_spec_is_the_declared_one(snap: snapstore.Snapshot, options: Any) -> None:
    reader = TFReader(snap, **options)
    ds = reader.dataset()
    declared = element_spec(snap.schema, **options)
    assert ds.element_spec == reader.element_spec == declared
    for element in ds.take(2):
        fits = tf.nest.map_structure(lambda s, v: s.is_compatible_with(v), declared, element)
        assert all(tf.nest.flatten(fits))


def test_element_spec_drop_last_pad_and_samples(snap: snapstore.Snapshot) -> None:
    spec = element_spec(snap.schema, batch_size=4, drop_last=True, ragged="pad")
    assert spec["x"] == tf.TensorSpec((4, 2, 3), tf.float32)
    assert spec["tok"] == tf.TensorSpec((4, None), tf.int32)
    assert spec["tok_lengths"] == tf.TensorSpec((4,), tf.int64)
    assert spec["m"] == tf.TensorSpec((4, None, 2, None), tf.float16)
    assert spec["m_lengths"] == tf.TensorSpec((4, 3), tf.int64)
    ragged = element_spec(snap.schema, batch_size=4, drop_last=True)
    assert ragged["m"] == tf.RaggedTensorSpec((4, None, 2, None), tf.float16, 3, tf.int64)
    assert ragged["v"] == tf.RaggedTensorSpec((4, 2, None), tf.int64, 2, tf.int64)
    single = element_spec(snap.schema)
    assert single["id"] == tf.TensorSpec((), tf.int64)
    assert single["name"] == tf.TensorSpec((), tf.string)
    assert single["x"] == tf.TensorSpec((2, 3), tf.float32)
    assert single["m"] == tf.TensorSpec((None, 2, None), tf.float16)
    with pytest.raises(ValueError, match="padded_batch"):
        element_spec(snap.schema, ragged="pad")
    with pytest.raises(ValueError, match="ragged"):
        element_spec(snap.schema, batch_size=4, ragged="list")  # type: ignore[arg-type]


def test_unmappable_schema_raises_clearly() -> None:
    wide = Schema((Field("x", "array", "float128", (2,)),))
    with pytest.raises(SchemaError, match=r"'x'.*float128.*expected one of"):
        element_spec(wide, batch_size=2)
    odd = Schema((Field("y", "decimal"),))  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match=r"'y'.*decimal"):
        element_spec(odd)


def test_batches_equal_snapstore_reader(snap: snapstore.Snapshot) -> None:
    ds = to_dataset(snap, batch_size=4, seed=3, epoch=1)
    want = list(snap.batches(4, shuffle=True, seed=3, epoch=1))
    got = list(ds)
    assert len(got) == len(want) == int(ds.cardinality()) == 8
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g["id"].numpy(), w["id"])
        np.testing.assert_array_equal(g["x"].numpy(), w["x"])
        np.testing.assert_array_equal(g["u"].numpy(), w["u"])
        np.testing.assert_array_equal(g["c"].numpy(), w["c"])
        assert [s.decode() for s in g["name"].numpy().tolist()] == w["name"]
        assert g["raw"].numpy().tolist() == w["raw"]
        for name in ("tok", "m", "v"):
            rows = g[name].to_list()
            assert len(rows) == len(w[name])
            for row, arr in zip(rows, w[name]):
                np.testing.assert_array_equal(
                    np.array(row, dtype=arr.dtype).reshape(arr.shape), arr
                )
    again = [b["id"].numpy().tolist() for b in ds]
    assert again == [b["id"].tolist() for b in want]  # every pass yields the same epoch
    other = ids(to_dataset(snap, batch_size=4, seed=3, epoch=2))
    assert other != ids(ds) and sorted(other) == list(range(N))


def test_pad_matches_reader(snap: snapstore.Snapshot) -> None:
    got = list(to_dataset(snap, batch_size=4, ragged="pad", shuffle=False))
    want = list(snap.batches(4, ragged="pad"))
    for g, w in zip(got, want, strict=True):
        for name in ("m", "m_lengths", "tok", "tok_lengths"):
            np.testing.assert_array_equal(g[name].numpy(), w[name])


def test_per_sample(snap: snapstore.Snapshot) -> None:
    ds = to_dataset(snap, seed=1)
    order = [i for b in snap.batches(7, shuffle=True, seed=1) for i in b["id"].tolist()]
    elements = list(ds)
    assert [int(e["id"]) for e in elements] == order
    assert int(ds.cardinality()) == N
    for e in elements:
        i = int(e["id"])
        assert e["name"].numpy().decode() == f"s{i}é"
        assert e["m"].shape == (i % 3 + 1, 2, i % 2 + 1)
        np.testing.assert_array_equal(e["tok"].numpy(), np.arange(i % 5))
        np.testing.assert_array_equal(e["v"].numpy(), np.full((2, i % 3), i))
    batched = ds.ragged_batch(4)  # per-sample elements batch with tf.data's own tools
    assert sum(int(b["id"].shape[0]) for b in batched) == N


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_shards_cover_with_equal_counts(
    snap: snapstore.Snapshot, world_size: int, drop_last: bool
) -> None:
    shares = [
        ids(to_dataset(snap, batch_size=4, drop_last=drop_last, rank=r, world_size=world_size))
        for r in range(world_size)
    ]
    share = N // world_size if drop_last else -(-N // world_size)
    if drop_last:
        share -= share % 4  # short batches are dropped too
    assert [len(s) for s in shares] == [share] * world_size
    seen = collections.Counter(i for s in shares for i in s)
    if drop_last:
        assert max(seen.values()) == 1
    else:
        assert set(seen) == set(range(N))
        assert sum(seen.values()) - N == share * world_size - N  # only the padding repeats


def test_drop_last_batches_are_full(snap: snapstore.Snapshot) -> None:
    ds = to_dataset(snap, batch_size=4, drop_last=True)
    assert ds.element_spec["id"].shape == (4,)
    shapes = [b["x"].shape for b in ds]
    assert shapes == [(4, 2, 3)] * (N // 4) and int(ds.cardinality()) == N // 4
    per_sample = to_dataset(snap, drop_last=True, rank=1, world_size=4)
    assert len(ids(per_sample)) == int(per_sample.cardinality()) == N // 4


@pytest.mark.parametrize("batch_size", [4, None])
def test_resume_yields_the_tail(snap: snapstore.Snapshot, batch_size: int | None) -> None:
    reader = TFReader(snap, batch_size=batch_size, seed=5, rank=1, world_size=2)
    full = ids(reader.dataset(epoch=2))
    unit = batch_size or 1
    state = json.loads(json.dumps(reader.state_after(2, epoch=2)))
    assert state["position"] == 2 * unit and state["epoch"] == 2
    fresh = TFReader(snap, batch_size=batch_size, seed=5, rank=1, world_size=2)
    tail = fresh.dataset(state=state)
    assert ids(tail) == full[2 * unit :]
    assert int(tail.cardinality()) == len(fresh.dataset(epoch=2)) - 2
    # A state after a resumed start counts from it; the end of the epoch leaves nothing.
    later = fresh.state_after(1, state=state)
    assert (
        ids(to_dataset(snap, batch_size=batch_size, seed=5, rank=1, world_size=2, state=later))[
            :unit
        ]
        == full[3 * unit : 4 * unit]
    )
    end = fresh.state_after(int(tail.cardinality()), state=state)
    assert ids(fresh.dataset(state=end)) == []


def test_resume_errors(snap: snapstore.Snapshot) -> None:
    reader = TFReader(snap, batch_size=4, seed=5)
    state = reader.state_after(1)
    with pytest.raises(ResumeError, match="seed"):
        TFReader(snap, batch_size=4, seed=6).dataset(state=state)
    with pytest.raises(ResumeError, match="epoch"):
        reader.dataset(epoch=1, state=state)
    with pytest.raises(ValueError, match=r"steps must be in \[0, 8\]"):
        reader.state_after(9)
    # State from snapstore's own reader works too: the same position.
    batches = snap.batches(4, shuffle=True, seed=5)
    for _ in zip(range(3), batches):
        pass
    own = batches.get_state()
    batches.close()
    assert own == reader.state_after(3)


def test_abandoned_dataset_stops_its_reader(snap: snapstore.Snapshot) -> None:
    def prefetchers() -> int:
        return sum(t.name == "snapstore-prefetch" for t in threading.enumerate())

    for _ in to_dataset(snap, batch_size=2).take(1):
        pass
    gc.collect()
    deadline = time.monotonic() + 30  # a wait for the threads to end, not a speed check
    while prefetchers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert prefetchers() == 0


def test_bad_arguments(snap: snapstore.Snapshot) -> None:
    with pytest.raises(ValueError, match="both rank and world_size"):
        to_dataset(snap, batch_size=4, rank=0)
    with pytest.raises(ValueError, match="batch_size"):
        to_dataset(snap, batch_size=0)
    with pytest.raises(TypeError, match="Snapshot"):
        to_dataset("abc", batch_size=4)  # type: ignore[arg-type]
