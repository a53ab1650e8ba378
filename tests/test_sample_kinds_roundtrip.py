"""Round trips of random mixes of every sample kind: numpy scalars of each dtype mixed with
Python scalars in one field, lists of numbers, str and bytes (empty and of varying length),
None, nested dicts. Written as rows and as ``snapstore.Columns``, read back by index and in
shuffled batches of every ragged form, each value equal to what was written and of the type
the schema says it reads back as."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kinds_oracle import FORMS, assert_same, batch_rows, write_columns, write_rows

from snapstore.format.schema import Field
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "float32", "float64"]
LEAVES = ["int", "float", "bool", "ilist", "flist", "blist", "slist", "ylist", "str", "bytes"]
LEAVES += ["fixed", "ragged"]


@st.composite
def kinds(draw: st.DrawFn, depth: int = 0) -> tuple[Any, ...]:
    """A field's kind: (name, dtype or children, nullable)."""
    choices = LEAVES + (["struct"] if depth < 2 else [])
    kind = draw(st.sampled_from(choices))
    nullable = draw(st.booleans())
    if kind == "struct":
        children = draw(st.lists(kinds(depth + 1), min_size=1, max_size=3))
        return ("struct", children, nullable)
    dtype = draw(st.sampled_from(INTS if kind == "int" else FLOATS if kind == "float" else [""]))
    return (kind, dtype, nullable)


@st.composite
def values(draw: st.DrawFn, spec: tuple[Any, ...], first: bool) -> Any:
    """One value of a field; the first sample's is never None and its lists not empty, so the
    first block always shows the field's type."""
    kind, arg, nullable = spec
    if nullable and not first and draw(st.integers(0, 3)) == 0:
        return None
    if kind == "struct":
        return {f"c{i}": draw(values(child, first)) for i, child in enumerate(arg)}
    if kind in ("int", "float"):
        return _number(draw, kind, np.dtype(arg))
    if kind == "bool":
        return draw(st.sampled_from([True, False, np.True_, np.False_]))
    if kind.endswith("list"):
        items = {
            "ilist": st.integers(-(2**53), 2**53),
            "flist": st.floats(allow_nan=False, width=64),
            "blist": st.booleans(),
            "slist": st.text(max_size=3),
            "ylist": st.binary(max_size=3),
        }[kind]
        listed = draw(st.lists(items, min_size=1 if first else 0, max_size=5))
        return tuple(listed) if draw(st.integers(0, 4)) == 0 else listed
    if kind == "str":
        return draw(st.text(max_size=8))
    if kind == "bytes":
        return draw(st.binary(max_size=8))
    if kind == "fixed":
        return np.array(draw(st.lists(st.integers(-9, 9), min_size=3, max_size=3)), np.int32)
    shape = (draw(st.integers(0, 3)), 2)
    return np.full(shape, draw(st.floats(-4, 4, width=32)), np.float32)


def _number(draw: st.DrawFn, kind: str, dtype: np.dtype[Any]) -> Any:
    """A numpy scalar of ``dtype`` or a Python number that ``dtype`` holds exactly (uint64 has no
    common type with a Python int, so its field holds numpy scalars only)."""
    if kind == "int":
        info = np.iinfo(dtype)
        value = draw(st.integers(int(info.min), int(info.max)))
        python = dtype != np.uint64 and draw(st.booleans())
        return value if python else dtype.type(value)
    value = float(dtype.type(draw(st.floats(width=16 if dtype == np.float16 else 32))))
    return value if draw(st.booleans()) else dtype.type(value)


@st.composite
def datasets(draw: st.DrawFn) -> list[dict[str, Any]]:
    specs = draw(st.lists(kinds(), min_size=1, max_size=4))
    n = draw(st.integers(1, 14))
    return [{f"f{j}": draw(values(spec, i == 0)) for j, spec in enumerate(specs)} for i in range(n)]


def read_back(field: Field, value: Any) -> Any:
    """What the schema says ``value`` reads back as."""
    if value is None:
        return None
    if field.kind == "struct":
        return {f.name: read_back(f, value[f.name]) for f in field.fields}
    if field.kind == "list":
        return list(value)
    if field.kind == "array":
        if field.shape == ():
            return np.dtype(field.dtype).type(value)
        return np.asarray(value, dtype=field.dtype)
    return {"int": int, "float": float, "bool": bool}.get(field.kind, lambda v: v)(value)


def assert_value_equal(got: Any, written: Any, where: str) -> None:
    """The value read equals the value written, whatever their types."""
    if isinstance(written, dict):
        for k in written:
            assert_value_equal(got[k], written[k], f"{where}.{k}")
    elif isinstance(written, np.ndarray) or (
        isinstance(written, (list, tuple)) and not any(isinstance(x, (str, bytes)) for x in written)
    ):
        assert np.array_equal(np.asarray(got), np.asarray(written), equal_nan=True), where
    elif isinstance(written, tuple):  # of str or bytes: reads back as a list
        assert got == list(written), (where, got, written)
    else:
        assert got == written or (got != got and written != written), (where, got, written)


def check(reader: SnapshotReader, samples: list[dict[str, Any]]) -> None:
    fields = {f.name: f for f in reader.schema.fields}
    expected = [{k: read_back(fields[k], v) for k, v in s.items()} for s in samples]
    for i, want in enumerate(expected):
        got = reader.sample(i)
        assert_same(got, want, f"sample {i}")
        for k in want:
            assert_value_equal(got[k], samples[i][k], f"sample {i}, {k}")
    for form in FORMS:
        for i, row in batch_rows(reader, form, batch_size=4).items():
            assert_same(row, expected[i], f"sample {i} in a batch, ragged={form}")


def first_block_cannot_tell(fields: tuple[Field, ...]) -> bool:
    """Whether a small first block may not show what later samples need: None (a field is
    nullable), or a 2-D array whose first dimension varies (one sample shows one shape)."""
    return any(
        f.nullable
        or (f.shape is not None and len(f.shape) > 1 and None in f.shape)
        or first_block_cannot_tell(f.fields)
        for f in fields
    )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(samples=datasets(), block_rows=st.sampled_from([1, 3]), chunk=st.integers(1, 5))
def test_every_kind_round_trips(
    tmp_path_factory: Any, samples: list[dict[str, Any]], block_rows: int, chunk: int
) -> None:
    root = tmp_path_factory.mktemp("kinds")
    whole = write_rows(LocalStore(root / "whole"), samples, block_min_rows=len(samples))
    check(whole, samples)
    # In small blocks the first block settles the schema, and later values must fit it. None,
    # or a new shape, after a first block without any would not: such a schema is declared, as
    # a user would declare it.
    declared = whole.schema if first_block_cannot_tell(whole.schema.fields) else None
    rows = write_rows(LocalStore(root / "rows"), samples, declared, block_min_rows=block_rows)
    check(rows, samples)
    columns = write_columns(
        LocalStore(root / "cols"), samples, chunk, declared, block_min_rows=block_rows
    )
    assert columns.manifest["schema"] == rows.manifest["schema"]
    check(columns, samples)
