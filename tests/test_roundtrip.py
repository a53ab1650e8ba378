"""Round trips: whatever a stage yields comes back equal, in order, by index and in batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from snapstore.format.schema import SUPPORTED_DTYPES, Schema
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore, Store
from snapstore.write.writer import SnapshotWriter, WriteOptions

DTYPES = sorted(SUPPORTED_DTYPES)


def write(
    store: Store, samples: list[dict[str, Any]], schema: Schema | None = None, **options: Any
) -> SnapshotReader:
    options.setdefault("block_min_rows", 1)
    writer = SnapshotWriter(store, "fp", schema=schema, options=WriteOptions(**options))
    for sample in samples:
        writer.add(sample)
    assert writer.commit()
    return SnapshotReader(store, "fp")


def assert_same(a: Any, b: Any) -> None:
    if isinstance(b, np.ndarray) and b.ndim == 0:
        assert (
            isinstance(a, np.generic) and a.dtype == b.dtype
        )  # rank 0 reads back as a numpy scalar
        np.testing.assert_array_equal(a, b)
    elif isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    else:
        assert type(a) is type(b) and (a == b or (a != a and b != b)), (a, b)


def assert_samples(reader: SnapshotReader, samples: list[dict[str, Any]]) -> None:
    assert len(reader) == len(samples)
    for got, want in zip(reader, samples, strict=True):
        assert got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
    for i in {0, len(samples) - 1, len(samples) // 2} if samples else ():
        for k in samples[i]:
            assert_same(reader.sample(i)[k], samples[i][k])


@st.composite
def datasets(draw: st.DrawFn) -> tuple[list[dict[str, Any]], Schema]:
    n = draw(st.integers(0, 40))
    fields: dict[str, Any] = {}
    for j in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["fixed", "ragged", "int", "float", "bool", "str", "bytes"]))
        fields[f"f{j}_{kind}"] = (kind, draw(st.sampled_from(DTYPES)), draw(st.integers(0, 3)))
    samples = []
    fixed_shapes = {
        k: draw(hnp.array_shapes(min_dims=spec[2], max_dims=spec[2], min_side=1, max_side=4))
        for k, spec in fields.items()
        if spec[0] == "fixed"
    }
    for _ in range(n):
        sample: dict[str, Any] = {}
        for name, (kind, dtype, rank) in fields.items():
            if kind in ("fixed", "ragged"):
                shape = (
                    fixed_shapes[name]
                    if kind == "fixed"
                    else draw(
                        hnp.array_shapes(
                            min_dims=max(rank, 1), max_dims=max(rank, 1), min_side=0, max_side=5
                        )
                    )
                )
                sample[name] = draw(hnp.arrays(np.dtype(dtype), shape))
            elif kind == "int":
                sample[name] = draw(st.integers(-(2**63), 2**63 - 1))
            elif kind == "float":
                sample[name] = draw(st.floats(allow_nan=True))
            elif kind == "bool":
                sample[name] = draw(st.booleans())
            elif kind == "str":
                sample[name] = draw(st.text(max_size=20))
            else:
                sample[name] = draw(st.binary(max_size=20))
        samples.append(sample)
    declared: dict[str, Any] = {}
    for name, (kind, dtype, rank) in fields.items():
        if kind == "fixed":
            declared[name] = (dtype, fixed_shapes[name])
        elif kind == "ragged":
            declared[name] = (dtype, (None,) * max(rank, 1))
        else:
            declared[name] = {"int": int, "float": float, "bool": bool, "str": str, "bytes": bytes}[
                kind
            ]
    return samples, Schema.declare(declared)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=datasets(), block_bytes=st.sampled_from([1, 64, 4096, 1 << 20]), declare=st.booleans())
def test_roundtrip_any_schema(
    tmp_path_factory: pytest.TempPathFactory,
    data: tuple[list[dict[str, Any]], Schema],
    block_bytes: int,
    declare: bool,
) -> None:
    """Declared schemas, and inferred ones when the first block holds every sample."""
    samples, schema = data
    store = LocalStore(tmp_path_factory.mktemp("rt"))
    inferred = not declare and block_bytes == 1 << 20
    reader = write(
        store,
        samples,
        schema=None if inferred else schema,
        block_bytes=block_bytes,
        shard_bytes=10_000,
    )
    try:
        assert_samples(reader, samples)
    finally:
        reader.close()
        store.close()


def test_roundtrip_every_backend(store: Store) -> None:
    rng = np.random.default_rng(0)
    samples = [
        {
            "img": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8),
            "tokens": rng.integers(0, 1000, rng.integers(1, 50), dtype=np.int32),
            "label": int(i),
            "score": float(i) / 3,
            "text": f"sample {i}",
            "raw": bytes([i % 256]) * 3,
        }
        for i in range(500)
    ]
    reader = write(store, samples, block_bytes=4096, shard_bytes=20_000)
    assert len(reader.shard_paths) > 1 and reader.num_blocks > 10
    assert_samples(reader, samples)
    reader.close()


def test_empty_snapshot(store: Store) -> None:
    reader = write(store, [])
    assert len(reader) == 0 and list(reader) == [] and reader.num_blocks == 0
    with pytest.raises(IndexError, match="out of range"):
        reader.sample(0)


def test_single_sample(store: Store) -> None:
    sample = {"x": np.arange(5, dtype=np.float32), "y": "one"}
    reader = write(store, [sample])
    assert_samples(reader, [sample])
    assert reader.sample(-1)["y"] == "one"


def test_fixed_shape_block_is_one_zero_copy_view(tmp_path) -> None:
    samples = [{"img": np.full((4, 4, 3), i, np.uint8)} for i in range(100)]
    reader = write(LocalStore(tmp_path), samples, compression_level=0)  # raw: the view is the mmap
    block = reader.load_block(0)
    col = block.column("img")
    assert col.shape == (100, 4, 4, 3) and not col.flags.owndata
    whole = block.column("img")
    assert np.shares_memory(col, whole)
    assert reader.sample(7)["img"].base is not None  # a row is a view, not a copy


def test_incompressible_blocks_are_stored_raw_and_compressible_ones_zstd(tmp_path) -> None:
    rng = np.random.default_rng(1)
    noise = [{"x": rng.integers(0, 256, 4096, dtype=np.uint8)} for _ in range(64)]
    zeros = [{"x": np.zeros(4096, np.uint8)} for _ in range(64)]
    r1 = write(LocalStore(tmp_path / "a"), noise, block_bytes=65536)
    r2 = write(LocalStore(tmp_path / "b"), zeros, block_bytes=65536)
    assert set(r1.index["codec"].tolist()) == {0}
    assert set(r2.index["codec"].tolist()) == {1}
    assert r2.manifest["stored_bytes"] * 20 < r2.manifest["raw_bytes"]
