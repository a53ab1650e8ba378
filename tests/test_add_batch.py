"""SnapshotWriter.add_batch: the same snapshot as add() per row, from columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapstore
from snapstore.errors import SchemaError
from snapstore.format.columns import column_rows
from snapstore.format.schema import Schema
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore, Store
from snapstore.write.writer import SnapshotWriter, WriteOptions

SMALL = WriteOptions(block_bytes=600, max_block_bytes=2400, block_min_rows=3)
RNG = np.random.default_rng(0)


def rows_of(columns: dict[str, Any]) -> list[dict[str, Any]]:
    names = list(columns)
    return [dict(zip(names, r)) for r in zip(*(column_rows(columns[n]) for n in names))]


def write(store: Store, fp: str, steps: list[Any], schema: Schema | None = None) -> SnapshotReader:
    """Each step is ("row", sample) or ("batch", columns)."""
    writer = SnapshotWriter(store, fp, schema=schema, options=SMALL)
    for how, value in steps:
        writer.add(value) if how == "row" else writer.add_batch(value)
    assert writer.commit()
    return SnapshotReader(store, fp)


def assert_same_snapshots(a: SnapshotReader, b: SnapshotReader) -> None:
    assert a.manifest["schema"] == b.manifest["schema"]
    assert a.manifest["num_samples"] == b.manifest["num_samples"]
    assert a.index["rows"].tolist() == b.index["rows"].tolist()  # even the same blocks
    for i in range(int(a.manifest["num_samples"])):
        x, y = a.sample(i), b.sample(i)
        assert list(x) == list(y)
        for name in x:
            assert type(x[name]) is type(y[name])
            if isinstance(x[name], np.ndarray):
                assert x[name].dtype == y[name].dtype
            np.testing.assert_array_equal(x[name], y[name])


def check_equivalent(tmp_path: Any, batches: list[dict[str, Any]], schema: Any = None) -> None:
    store = LocalStore(tmp_path)
    rows = [("row", r) for b in batches for r in rows_of(b)]
    by_row = write(store, "a" * 32, rows, schema)
    by_batch = write(store, "b" * 32, [("batch", b) for b in batches], schema)
    assert_same_snapshots(by_row, by_batch)


def every_kind(n: int, start: int = 0) -> dict[str, Any]:
    lengths = RNG.integers(0, 6, n)
    return {
        "int": np.arange(start, start + n),
        "float": RNG.random(n),
        "bool": RNG.random(n) < 0.5,
        "i32": np.arange(n, dtype=np.int32),  # rank-0 arrays (numpy scalars per row)
        "str": [f"s{i}é" * (i % 4) for i in range(n)],
        "bytes": [bytes([i % 256]) * (i % 7) for i in range(n)],
        "fixed": RNG.random((n, 3)).astype(np.float32),
        "multi": RNG.integers(0, 255, (n, 2, 3), dtype=np.uint8),
        "complex": (RNG.random((n, 2)) + 1j).astype(np.complex64),
        "ragged": [np.arange(k, dtype=np.int16) for k in lengths],
        "ragged2": [np.ones((k, 2), dtype=np.float64) for k in lengths],
    }


@pytest.mark.parametrize("sizes", [[1], [7], [200], [5, 3, 40], [0, 9, 0, 120]])
def test_every_kind_matches_add(tmp_path: Any, sizes: list[int]) -> None:
    starts = np.cumsum([0, *sizes])
    check_equivalent(tmp_path, [every_kind(n, int(s)) for n, s in zip(sizes, starts)])


@pytest.mark.parametrize("name", list(every_kind(1)))
def test_each_kind_alone_matches_add(tmp_path: Any, name: str) -> None:
    check_equivalent(tmp_path, [{name: every_kind(50)[name]}, {name: every_kind(30)[name]}])


def test_declared_schema_matches_add(tmp_path: Any) -> None:
    schema = Schema.declare({"v": ("int32", (None,)), "x": ("uint8", (2, 3)), "n": int})
    batch = {
        "v": [np.arange(4, dtype=np.int32)] * 30,  # same shape here, varying by declaration
        "x": np.zeros((30, 2, 3), np.uint8),
        "n": list(range(30)),
    }
    check_equivalent(tmp_path, [batch, batch], schema)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=5),
    rows_between=st.lists(st.integers(0, 5), min_size=5, max_size=5),
    widths=st.lists(st.integers(0, 40), min_size=1, max_size=3),
)
def test_mixed_add_and_add_batch(
    tmp_path_factory: Any, sizes: list[int], rows_between: list[int], widths: list[int]
) -> None:
    store = LocalStore(tmp_path_factory.mktemp("mixed"))
    steps: list[Any] = []
    count = 0
    for n, k in zip(sizes, rows_between):
        for width in widths:  # rows of varying width: block boundaries fall everywhere
            batch = {"i": np.arange(count, count + n), "v": [np.zeros(width, np.int8)] * n}
            steps.append(("batch", batch))
            count += n
        for _ in range(k):
            steps.append(("row", {"i": count, "v": np.ones(widths[0], np.int8)}))
            count += 1
    rows = [("row", r) for how, v in steps for r in (rows_of(v) if how == "batch" else [v])]
    schema = Schema.declare({"i": int, "v": ("int8", (None,))})
    assert_same_snapshots(
        write(store, "a" * 32, rows, schema), write(store, "b" * 32, steps, schema)
    )


def test_inference_spans_batches_like_rows(tmp_path: Any) -> None:
    # Both batches fall in the first block: the varying length is seen, as it is row by row.
    first = {"v": [np.zeros(2, np.int32)] * 2}
    second = {"v": [np.zeros(3, np.int32)] * 2}
    check_equivalent(tmp_path, [first, second])
    reader = SnapshotReader(LocalStore(tmp_path), "b" * 32)
    assert reader.manifest["schema"] == [
        {"name": "v", "kind": "array", "dtype": "int32", "shape": [None]}
    ]


def test_empty_batch(tmp_path: Any) -> None:
    store = LocalStore(tmp_path)
    writer = SnapshotWriter(store, "a" * 32, options=SMALL)
    writer.add_batch({"i": np.arange(0), "s": []})
    writer.add_batch({})
    assert writer.schema is None and writer.samples_written == 0
    writer.add_batch({"i": np.arange(3), "s": ["a", "b", "c"]})
    writer.add_batch({"i": np.arange(0), "s": []})
    assert writer.commit()
    reader = SnapshotReader(store, "a" * 32)
    assert [reader.sample(i)["s"] for i in range(3)] == ["a", "b", "c"]


def test_arrow_input(tmp_path: Any) -> None:
    table = pa.table(
        {
            "i": pa.array(range(20), pa.int64()),
            "s": pa.array([str(i) for i in range(20)], pa.string()),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(40, dtype=np.float32)), 2),
        }
    )
    columns = {
        "i": np.arange(20),
        "s": [str(i) for i in range(20)],
        "x": np.arange(40, dtype=np.float32).reshape(20, 2),
    }
    store = LocalStore(tmp_path)
    a = write(store, "a" * 32, [("batch", table), ("batch", table.to_batches()[0])])
    b = write(store, "b" * 32, [("batch", columns), ("batch", columns)])
    assert_same_snapshots(a, b)
    # Arrow nulls are None: the field is nullable (see tests/test_sample_kinds.py)
    c = write(store, "c" * 32, [("batch", pa.table({"i": [1, None]}))])
    assert [c.sample(0)["i"], c.sample(1)["i"]] == [1, None]


def test_many_blocks_respect_bounds(tmp_path: Any) -> None:
    options = WriteOptions(block_bytes=4096, max_block_bytes=16384, block_min_rows=8)
    writer = SnapshotWriter(LocalStore(tmp_path), "a" * 32, options=options)
    n = 5000
    writer.add_batch({"x": np.zeros((n, 100), np.uint8), "i": np.arange(n)})
    writer.add_batch({"x": np.zeros((3, 100), np.uint8), "i": np.arange(3)})
    writer.add_batch({"x": np.zeros((100, 3000), np.uint8)[:, :100], "i": np.arange(100)})
    writer.add_batch({"x": np.zeros((40, 100), np.uint8), "i": np.arange(40)})
    assert writer.commit()
    reader = SnapshotReader(LocalStore(tmp_path), "a" * 32)
    rows = reader.index["rows"]
    assert len(rows) > 50 and rows.sum() == n + 143
    per_row = 108
    assert all(r * per_row >= 4096 for r in rows[:-1])  # every block but the last is full
    assert all(r * per_row < 4096 + per_row for r in rows[:-1])  # and closes at the first row over
    assert all(r * per_row <= 16384 for r in rows)


def test_max_block_bytes_bounds_large_rows(tmp_path: Any) -> None:
    options = WriteOptions(block_bytes=4096, max_block_bytes=8192, block_min_rows=64)
    writer = SnapshotWriter(LocalStore(tmp_path), "a" * 32, options=options)
    writer.add_batch({"x": np.zeros((100, 1000), np.uint8)})
    assert writer.commit()
    rows = SnapshotReader(LocalStore(tmp_path), "a" * 32).index["rows"].tolist()
    assert rows == [9] * 11 + [1]  # max_block_bytes closes blocks before block_min_rows


def declared_writer(tmp_path: Any) -> SnapshotWriter:
    schema = Schema.declare({"n": int, "x": ("float32", (3,)), "v": ("int16", (None,)), "s": str})
    return SnapshotWriter(LocalStore(tmp_path), "a" * 32, schema=schema, options=SMALL)


GOOD = {
    "n": np.arange(4),
    "x": np.zeros((4, 3), np.float32),
    "v": [np.arange(k, dtype=np.int16) for k in range(4)],
    "s": ["a", "b", "c", "d"],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n": np.arange(3)}, r"different lengths \{'n': 3, 'x': 4, 'v': 4, 's': 4\}.*same number"),
        ({"extra": np.arange(4)}, r"unexpected fields \['extra'\].*expected exactly"),
        ({"n": None}, r"missing fields \['n'\]"),
        (
            {"n": np.arange(4, dtype=np.int32)},
            r"'n'.*column of int32\[\] per row but the schema says int.*int64",
        ),
        (
            {"x": np.zeros((4, 3), np.float64)},
            r"'x'.*float64\[3\] per row but the schema says float32\[3\]",
        ),
        (
            {"x": np.zeros((4, 2), np.float32)},
            r"'x'.*float32\[2\] per row but the schema says float32\[3\]",
        ),
        (
            {"x": [np.zeros(3, np.float32)] * 3 + [np.zeros(4, np.float32)]},
            r"'x': sample 7 has shape \(4,\)",
        ),
        (
            {"v": [np.arange(2, dtype=np.int32)] * 4},
            r"'v': sample 4 holds numpy array int32\[2\] but the schema says int16\[\*\]",
        ),
        ({"n": [0, 1, True, 3]}, r"'n': sample 6 holds bool but the schema says int"),
        ({"s": ["a", b"b", "c", "d"]}, r"'s': sample 5 holds bytes but the schema says str"),
        ({"s": 5}, r"column 's' is a int; expected a numpy array"),
    ],
)
def test_declared_schema_errors(tmp_path: Any, change: dict[str, Any], message: str) -> None:
    writer = declared_writer(tmp_path)
    writer.add_batch(GOOD)
    batch = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(SchemaError, match=message):
        writer.add_batch(batch)
    assert writer.samples_written == 4  # nothing of the bad batch was taken
    writer.add_batch(GOOD)  # the writer is still usable
    assert writer.commit()
    assert SnapshotReader(LocalStore(tmp_path), "a" * 32).manifest["num_samples"] == 8


def test_inferred_schema_errors_name_the_field(tmp_path: Any) -> None:
    writer = SnapshotWriter(LocalStore(tmp_path), "a" * 32, options=SMALL)
    writer.add_batch({"x": np.zeros((500, 3), np.float32)})  # several blocks: schema inferred
    with pytest.raises(
        SchemaError, match=r"'x'.*float32\[4\] per row but the schema says float32\[3\]"
    ):
        writer.add_batch({"x": np.zeros((5, 4), np.float32)})
    writer.abort()


def test_unsupported_numpy_dtype_is_named(tmp_path: Any) -> None:
    writer = SnapshotWriter(LocalStore(tmp_path), "a" * 32)
    writer.add_batch({"u": np.array(["a"])})
    with pytest.raises(SchemaError, match=r"'u': numpy dtype <U1 is not supported.*str/bytes"):
        writer.commit()  # inferred when the first block is made, as for add()


def test_abort_after_add_batch_leaves_nothing(tmp_path: Any) -> None:
    store = LocalStore(tmp_path)
    writer = SnapshotWriter(store, "a" * 32, options=SMALL)
    writer.add_batch(every_kind(300))
    writer.abort()
    assert not store.exists(f"{'a' * 32}/_COMMIT") and store.list_dir(f"{'a' * 32}/runs") == []


def rows_stage(n: int):
    for i in range(n):
        yield {"id": i, "x": np.full(3, i, np.float32), "name": f"s{i}"}


def columns_stage(n: int):
    """The same samples as rows_stage: a batch of columns, then single rows, then a batch."""
    first = n // 2
    yield snapstore.Columns(
        {
            "id": np.arange(first, dtype=np.int64),
            "x": np.repeat(np.arange(first, dtype=np.float32)[:, None], 3, axis=1),
            "name": [f"s{i}" for i in range(first)],
        }
    )
    for i in range(first, first + 2):
        yield {"id": i, "x": np.full(3, i, np.float32), "name": f"s{i}"}
    rest = np.arange(first + 2, n)
    yield snapstore.Columns(
        {
            "id": rest.astype(np.int64),
            "x": np.repeat(rest.astype(np.float32)[:, None], 3, axis=1),
            "name": [f"s{i}" for i in rest.tolist()],
        }
    )


def test_a_stage_may_yield_columns(tmp_path: Path) -> None:
    rows = snapstore.snapshot(rows_stage, root=tmp_path / "rows")(2000)
    cols = snapstore.snapshot(columns_stage, root=tmp_path / "cols")(2000)
    assert cols.schema == rows.schema and len(cols) == len(rows) == 2000
    for a, b in zip(rows, cols, strict=True):
        assert a["id"] == b["id"] and a["name"] == b["name"] and type(a["id"]) is type(b["id"])
        np.testing.assert_array_equal(a["x"], b["x"])
    rows.close()
    cols.close()


def chunked(chunks: list[int]):
    for c in chunks:
        ids = np.arange(c * 100, (c + 1) * 100)
        yield snapstore.Columns({"id": ids, "x": np.repeat(ids[:, None], 3, 1).astype(np.float32),
                                 "name": [f"s{i}" for i in ids.tolist()]})  # fmt: skip


def test_partitions_on_worker_processes_may_yield_columns(tmp_path: Path) -> None:
    stage = snapstore.snapshot(
        chunked, root=tmp_path, partition_by="chunks", engine="process", workers=2
    )
    snap = stage(list(range(6)))
    assert [int(s["id"]) for s in snap] == list(range(600))
    assert snap.manifest["partitions"] == 6
    snap.close()
