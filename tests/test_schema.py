"""Samples that do not fit get errors naming the field, the sample, expected and found."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from snapstore.errors import SchemaError
from snapstore.format.schema import Schema, infer_schema
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import Store
from snapstore.write.writer import SnapshotWriter, WriteOptions


def write_all(
    store: Store, samples: list[Any], schema: Schema | None = None, block_bytes: int = 1 << 20
) -> None:
    writer = SnapshotWriter(
        store, "fp", schema=schema, options=WriteOptions(block_min_rows=1, block_bytes=block_bytes)
    )
    try:
        for s in samples:
            writer.add(s)
    except BaseException:
        writer.abort()
        raise
    writer.commit()


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"x": np.zeros(3, np.int32)}, ["sample 5", "missing fields ['y']"]),
        ({"x": np.zeros(3, np.int32), "y": 1, "z": 2}, ["sample 5", "unexpected fields ['z']"]),
        (
            {"x": np.zeros(3, np.float32), "y": 1},
            ["'x'", "sample 5", "float32", "int32", "schema="],
        ),
        ({"x": np.zeros((3, 1), np.int32), "y": 1}, ["'x'", "sample 5", "rank 2", "schema="]),
        ({"x": np.zeros(3, np.int32), "y": "one"}, ["'y'", "sample 5", "str", "int"]),
    ],
)
@pytest.mark.parametrize("block_bytes", [1, 1 << 20])  # drift inside the first block, and after it
def test_drift_is_named(
    store: Store, bad: dict[str, Any], words: list[str], block_bytes: int
) -> None:
    good = [{"x": np.zeros(3, np.int32), "y": 1} for _ in range(5)]
    with pytest.raises(SchemaError) as info:
        write_all(store, [*good, bad], block_bytes=block_bytes)
    for word in words:
        assert word in str(info.value)
    assert not store.exists("fp/COMMIT")


def test_shape_change_after_first_block_says_how_to_declare(store: Store) -> None:
    samples = [{"x": np.zeros(3, np.int32)} for _ in range(4)] + [{"x": np.zeros(4, np.int32)}]
    with pytest.raises(SchemaError, match=r"sample 4 has shape \(4,\).*None for varying"):
        write_all(store, samples, block_bytes=1)
    declared = Schema.declare({"x": ("int32", (None,))})
    write_all(store, samples, schema=declared, block_bytes=1)
    reader = SnapshotReader(store, "fp")
    assert [len(s["x"]) for s in reader] == [3, 3, 3, 3, 4]


def test_varying_shapes_in_first_block_are_inferred() -> None:
    schema = infer_schema([{"a": np.zeros((2, 3)), "b": 1}, {"a": np.zeros((5, 3)), "b": 2}])
    assert schema["a"].shape == (None, 3) and schema["a"].describe() == "float64[*,3]"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({1: 2}, ["nested dict", "str keys"]),
        ({}, ["nested dict needs at least one key"]),
        (None, ["None in every sample of the first block", "'bad': <type> | None"]),
        ([[1, 2], [3]], ["nested lists", "numpy array"]),
        ([1, None], ["holds None"]),
        ([1, "a"], ["holds int, str", "only int"]),
        ([True, 1], ["holds bool, int"]),
        ([2**64], ["does not fit in 64 bits"]),
        ([0.5, 2**60], ["beyond 2**53"]),
        (object(), ["object"]),
        (np.array(["a", "b"]), ["<U1", "not supported"]),
        (np.array([1, None], dtype=object), ["object", "not supported"]),
        (2**70, ["does not fit in 64 bits"]),
        (np.zeros(2, np.longdouble), ["float128", "not supported"]),
    ],
)
def test_unsupported_values_are_refused(store: Store, value: Any, words: list[str]) -> None:
    with pytest.raises(SchemaError) as info:
        write_all(store, [{"ok": 1, "bad": value}])
    assert "'bad'" in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_sample_must_be_a_dict(store: Store) -> None:
    with pytest.raises(SchemaError, match="sample 0 is a tuple; expected a dict"):
        write_all(store, [(1, 2)])


def test_declaration_errors() -> None:
    with pytest.raises(SchemaError, match="cannot understand declaration"):
        Schema.declare({"x": "int32"})
    with pytest.raises(SchemaError, match="not supported"):
        Schema.declare({"x": ("U3", (2,))})


def test_schema_json_roundtrip() -> None:
    schema = Schema.declare(
        {"a": ("uint8", (4, None)), "b": int, "c": str, "d": bytes, "e": ("complex64", ())}
    )
    assert Schema.from_json(schema.to_json()) == schema
    assert schema.arrow_schema().names == ["a", "b", "c", "d", "e"]
