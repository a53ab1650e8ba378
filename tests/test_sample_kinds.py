"""Sample kinds of format version 2: lists, None, nested dicts, numpy and Python scalars mixed.

Each kind is written, then read back by index, by iteration and in shuffled batches; the
mixes a field cannot hold raise the SchemaError that says what to do. The hypothesis round
trip over random mixes of these kinds is tests/test_sample_kinds_roundtrip.py.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from kinds_oracle import FORMS, assert_same, batch_rows, write_rows

import snapstore
from snapstore.errors import SchemaError
from snapstore.format.checks import fast_check
from snapstore.format.inference import merge_stored
from snapstore.format.schema import Field, Schema, infer_schema
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore


def read_all(reader: SnapshotReader) -> list[dict[str, Any]]:
    return [reader.sample(i) for i in range(len(reader))]


def check_reads(reader: SnapshotReader, expected: list[dict[str, Any]]) -> None:
    """By index, in written order, and in shuffled batches of every ragged form."""
    assert len(reader) == len(expected)
    for i, (got, want) in enumerate(zip(read_all(reader), expected, strict=True)):
        assert_same(got, want, f"sample {i}")
    for i, (got, want) in enumerate(zip(reader, expected, strict=True)):
        assert_same(got, want, f"iterated sample {i}")
    for form in FORMS:
        seen = batch_rows(reader, form, batch_size=3)
        assert sorted(seen) == list(range(len(expected)))
        for i, row in seen.items():
            assert_same(row, expected[i], f"sample {i} from a batch, ragged={form}")


def roundtrip(tmp_path: Any, samples: list[dict[str, Any]], **kw: Any) -> SnapshotReader:
    """Write ``samples``: one block unless ``block_min_rows`` says how many rows make one."""
    kw.setdefault("block_min_rows", max(1, len(samples)))
    return write_rows(LocalStore(tmp_path / "rows"), samples, **kw)


# -- lists ------------------------------------------------------------------------------------


def test_lists_of_numbers_read_back_as_arrays(tmp_path: Any) -> None:
    samples = [
        {
            "ids": list(range((i + 1) % 5)),  # empty lists too
            "scores": [0.5, 1, 2.25][: (i + 1) % 4],  # ints among floats: float64
            "flags": [True, False, bool(i % 2)],
            "tags": ["a", "bc"][: (i + 1) % 3],
            "raw": (b"x", b"y"),  # a tuple is a list
        }
        for i in range(11)
    ]
    reader = roundtrip(tmp_path, samples)
    expected = [
        {
            "ids": np.array(s["ids"], np.int64),
            "scores": np.array(s["scores"], np.float64),
            "flags": np.array(s["flags"], bool),
            "tags": list(s["tags"]),
            "raw": list(s["raw"]),
        }
        for s in samples
    ]
    check_reads(reader, expected)
    assert [f.describe() for f in reader.schema.fields] == [
        "int64[*]",
        "float64[*]",
        "bool[*]",
        "list of str",
        "list of bytes",
    ]


def test_lists_and_arrays_share_a_field(tmp_path: Any) -> None:
    samples = [{"v": [1, 2]}, {"v": np.array([3], np.int64)}, {"v": []}, {"v": np.zeros(4, int)}]
    reader = roundtrip(tmp_path, samples, block_min_rows=2)
    assert reader.schema["v"].describe() == "int64[*]"
    check_reads(reader, [{"v": np.asarray(s["v"], np.int64)} for s in samples])


def test_empty_lists_only_in_the_first_block_make_float64(tmp_path: Any) -> None:
    samples = [{"v": []}] * 4 + [{"v": [1, 2]}, {"v": [0.5]}]
    reader = roundtrip(tmp_path, samples, block_min_rows=4)
    assert reader.schema["v"].describe() == "float64[*]"
    check_reads(reader, [{"v": np.asarray(s["v"], np.float64)} for s in samples])
    with pytest.raises(SchemaError, match=r"'v': sample 4 holds list of bool but the schema"):
        roundtrip(tmp_path / "b", [{"v": []}] * 4 + [{"v": [True]}], block_min_rows=4)


def test_int_lists_widen_to_float_in_the_first_block_only(tmp_path: Any) -> None:
    reader = roundtrip(tmp_path, [{"v": [1]}, {"v": [0.5]}, {"v": [2]}], block_min_rows=3)
    assert reader.schema["v"].describe() == "float64[*]"
    later = [{"v": [1]}] * 3 + [{"v": [0.5]}]
    with pytest.raises(SchemaError, match=r"sample 3 holds list of float but the schema says"):
        roundtrip(tmp_path / "b", later, block_min_rows=3)
    exact = [{"v": [0.5]}] * 3 + [{"v": [2**60]}]  # not exactly a float64
    with pytest.raises(SchemaError, match=r"sample 3 holds list of int but the schema says"):
        roundtrip(tmp_path / "c", exact, block_min_rows=3)


# -- None -------------------------------------------------------------------------------------


def test_none_makes_every_kind_nullable(tmp_path: Any) -> None:
    def sample(i: int) -> dict[str, Any]:
        missing = i % 3 == 1
        return {
            "i": None if missing else i,
            "f": None if missing else i / 2,
            "b": None if missing else i % 2 == 0,
            "s": None if missing else str(i),
            "y": None if missing else bytes([i]),
            "n": None if missing else np.float32(i),
            "img": None if missing else np.full((2, 3), i, np.uint8),
            "tok": None if missing else np.arange(i % 4, dtype=np.int32),
            "spec": None if missing else np.ones((i % 3, 2), np.float16),
            "ids": None if missing else list(range(i % 3)),
            "tags": None if missing else ["t"] * ((i + 1) % 2),
            "z": None if missing else np.complex64(i + 1j),
        }

    samples = [sample(i) for i in range(10)]
    reader = roundtrip(tmp_path, samples, block_min_rows=3)
    assert all(f.nullable for f in reader.schema.fields)
    expected = [
        {k: np.asarray(v, np.int64) if k == "ids" and v is not None else v for k, v in s.items()}
        for s in samples
    ]
    check_reads(reader, expected)


def test_batches_carry_none_or_a_valid_mask(tmp_path: Any) -> None:
    samples = [
        {"n": None if i == 1 else i, "s": None if i == 2 else "x", "t": None} for i in range(4)
    ]
    for s, t in zip(samples, [[1], None, [], [2, 3]]):
        s["t"] = t
    reader = roundtrip(tmp_path, samples)
    batch = next(iter(snapstore.BatchReader(reader, 4, options=_plain())))
    assert batch["n"].tolist() == [0, 0, 2, 3]  # the null row holds 0
    assert batch["n_valid"].tolist() == [True, False, True, True]
    assert batch["s"] == ["x", "x", None, "x"]  # object columns: None itself, no mask
    assert "s_valid" not in batch and "t_valid" not in batch  # ragged="list": None rows
    assert [None if t is None else t.tolist() for t in batch["t"]] == [[1], None, [], [2, 3]]
    padded = next(iter(snapstore.BatchReader(reader, 4, options=_plain(), ragged="pad")))
    assert padded["t_valid"].tolist() == [True, False, True, True]
    assert padded["t_lengths"].tolist() == [1, 0, 0, 2]


def test_a_field_none_in_the_whole_first_block_must_be_declared(tmp_path: Any) -> None:
    samples = [{"x": 1, "caption": None}] * 3 + [{"x": 1, "caption": "a"}]
    with pytest.raises(SchemaError) as info:
        roundtrip(tmp_path, samples, block_min_rows=3)
    message = str(info.value)
    assert "'caption' is None in every sample of the first block (samples 0 to 2)" in message
    assert "schema={'x': int, 'caption': <type> | None}" in message
    declared = Schema.declare({"x": int, "caption": str | None})
    reader = roundtrip(tmp_path / "b", samples, block_min_rows=3, schema=declared)
    check_reads(reader, samples)


def test_none_after_the_first_block_says_to_declare_nullable(tmp_path: Any) -> None:
    samples = [{"x": 1}] * 3 + [{"x": None}]
    with pytest.raises(
        SchemaError, match=r"'x': sample 3 is None but the schema says int.*nullable"
    ):
        roundtrip(tmp_path, samples, block_min_rows=3)


# -- nested dicts -----------------------------------------------------------------------------


def test_nested_dicts_read_back_nested(tmp_path: Any) -> None:
    def sample(i: int) -> dict[str, Any]:
        return {
            "meta": {
                "w": 64 + i,
                "size": {"h": np.int16(i), "tags": ["a"] * (i % 3)},
                "box": None if i % 4 == 0 else np.arange(4, dtype=np.float32) + i,
                "ids": list(range(i % 3)),
            },
            "opt": None if i % 2 else {"k": str(i)},
        }

    samples = [sample(i) for i in range(9)]
    reader = roundtrip(tmp_path, samples, block_min_rows=2)
    assert reader.schema["meta"].describe() == (
        "{w: int, size: {h: int16[], tags: list of str}, box: float32[4] | None, ids: int64[*]}"
    )
    expected = [sample(i) for i in range(9)]
    for s in expected:
        s["meta"]["ids"] = np.asarray(s["meta"]["ids"], np.int64)
    check_reads(reader, expected)
    batch = next(iter(snapstore.BatchReader(reader, 9, options=_plain(), ragged="pad")))
    assert set(batch) == {"meta", "opt", "opt_valid"}
    assert set(batch["meta"]) == {"w", "size", "box", "box_valid", "ids", "ids_lengths"}
    assert batch["meta"]["size"]["h"].dtype == np.int16
    assert batch["opt_valid"].tolist() == [i % 2 == 0 for i in range(9)]
    assert batch["opt"]["k"][:2] == ["0", ""]  # a None dict's fields hold placeholders


def test_nested_dict_keys_must_agree(tmp_path: Any) -> None:
    with pytest.raises(SchemaError, match=r"'m': sample 1 holds a dict with keys \['b'\]"):
        roundtrip(tmp_path, [{"m": {"a": 1}}, {"m": {"b": 1}}])
    samples = [{"m": {"a": 1}}] * 2 + [{"m": {"a": 1, "b": 2}}]
    with pytest.raises(SchemaError, match=r"'m': sample 2 holds a dict with keys \['a', 'b'\]"):
        roundtrip(tmp_path / "b", samples, block_min_rows=2)
    samples = [{"m": {"a": 1}}] * 2 + [{"m": {"a": "x"}}]
    with pytest.raises(SchemaError, match=r"'m.a': sample 2 holds str but the schema says int"):
        roundtrip(tmp_path / "c", samples, block_min_rows=2)


# -- numpy and Python scalars in one field ----------------------------------------------------


@pytest.mark.parametrize(
    ("values", "reads_as"),
    [
        ([np.int64(3), 4, np.int64(5)], np.int64),
        ([4, np.int32(3), np.uint8(2)], np.int64),  # a Python int counts as int64
        ([np.int32(3), np.int16(-2)], np.int32),
        ([np.float32(0.5), 0.1], np.float64),
        ([np.float16(1), np.float32(2)], np.float32),
        ([True, np.bool_(False)], np.bool_),
        ([3, 4], int),
    ],
)
def test_scalars_of_a_family_share_a_field(
    tmp_path: Any, values: list[Any], reads_as: type
) -> None:
    samples = [{"x": v} for v in values]
    reader = roundtrip(tmp_path, samples, block_min_rows=len(values))
    got = [s["x"] for s in read_all(reader)]
    assert all(type(g) is reads_as for g in got), got
    assert got == values  # value-equal
    check_reads(reader, [{"x": reads_as(v)} for v in values])


def test_a_settled_scalar_field_takes_what_it_holds_exactly(tmp_path: Any) -> None:
    first = [{"i": np.int32(1), "n": 1, "f": np.float32(1), "g": 1.5}] * 2
    later = [{"i": 7, "n": np.uint32(7), "f": 0.5, "g": np.float16(2)}]
    reader = roundtrip(tmp_path, first + later, block_min_rows=2)
    assert reader.sample(2) == {"i": np.int32(7), "n": 7, "f": np.float32(0.5), "g": 2.0}
    assert type(reader.sample(2)["n"]) is int and type(reader.sample(2)["g"]) is float
    for bad, message in [
        ({"i": 2**40}, r"'i': sample 2 holds int 1099511627776 but the schema says int32\[\]"),
        ({"i": np.int64(1)}, r"'i': sample 2 holds np.int64\(1\) but the schema says int32"),
        ({"f": 0.1}, r"'f': sample 2 holds float 0.1 but the schema says float32\[\]"),
        ({"n": np.uint64(1)}, r"'n': sample 2 holds np.uint64\(1\) but the schema says int\."),
        ({"n": 1.0}, r"'n': sample 2 holds float but the schema says int\. Make the type"),
    ]:
        with pytest.raises(SchemaError, match=message):
            roundtrip(tmp_path / "bad", [*first, {**first[0], **bad}], block_min_rows=2)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([3, 0.5], r"'x': sample 1 holds float but earlier samples hold int"),
        ([3, np.uint64(1)], r"'x': sample 1 holds uint64\[\] but earlier samples hold int"),
        ([np.int32(1), np.float32(1)], r"holds float32\[\] but earlier samples hold int32\[\]"),
        ([3, "3"], r"'x': sample 1 holds str but earlier samples hold int"),
        ([[1], 1], r"'x': sample 1 holds int but earlier samples hold list of int"),
        ([{"a": 1}, 1], r"'x': sample 1 holds int but earlier samples hold \{a: int\}"),
        ([["a"], [1]], r"holds list of int but earlier samples hold list of str"),
        ([np.zeros(2, np.float32), [1.0]], r"holds list of float but earlier .* float32\[2\]"),
    ],
)
def test_kinds_that_do_not_mix_are_refused(tmp_path: Any, values: list[Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        roundtrip(tmp_path, [{"x": v} for v in values], block_min_rows=len(values))


def test_valid_values_take_the_fast_path() -> None:
    """The per-sample check accepts every valid kind without the message-building path."""
    cases: list[tuple[list[Any], list[Any]]] = [  # values inferred from, values checked
        ([1], [2, np.int64(3), np.int32(4), np.uint32(5)]),
        ([0.5], [1.5, np.float64(2), np.float32(3), np.float16(4)]),
        ([True], [False, np.bool_(True)]),
        ([np.int32(1)], [np.int16(2), 7, np.array(3, np.int32)]),
        ([np.float32(1)], [0.5, np.float16(1)]),
        ([[1, 2]], [[], [3], (4, 5), [np.int64(6)]]),
        ([[0.5]], [[], [1, 2.5], [np.float64(1), 2]]),
        ([[True]], [[], [False, np.bool_(True)]]),
        ([["a"]], [[], ["b", "c"]]),
        ([1, None], [None, 3]),
        ([np.zeros((2, 3), np.uint8)], [np.ones((2, 3), np.uint8)]),
        ([np.zeros((2, 3)), np.zeros((4, 3))], [np.ones((7, 3))]),
        (
            [{"a": 1, "b": [1], "c": None}, {"a": 1, "b": [1], "c": "s"}],
            [{"a": 2, "b": [], "c": None}],
        ),
    ]
    for first, later in cases:
        schema = infer_schema([{"x": v} for v in first])
        check = fast_check(schema["x"])
        for value in later:
            assert check(value), (schema["x"].describe(), value)


# -- declared schemas -------------------------------------------------------------------------


def test_declared_schemas_of_the_new_kinds(tmp_path: Any) -> None:
    declared = Schema.declare(
        {
            "ids": list[int],
            "scores": list[float] | None,
            "tags": list[str],
            "label": int | None,
            "box": snapstore.nullable(("float32", (4,))),
            "meta": {"w": int, "name": str | None, "deep": {"x": list[bool]}},
            "opt": snapstore.nullable({"k": bytes}),
        }
    )
    assert [f.describe() for f in declared.fields] == [
        "int64[*]",
        "float64[*] | None",
        "list of str",
        "int | None",
        "float32[4] | None",
        "{w: int, name: str | None, deep: {x: bool[*]}}",
        "{k: bytes} | None",
    ]
    samples = [
        {
            "ids": [] if i == 0 else [i],
            "scores": None if i == 0 else [0.5],
            "tags": ["t"],
            "label": None,
            "box": None,
            "meta": {"w": i, "name": None, "deep": {"x": []}},
            "opt": None if i else {"k": b"k"},
        }
        for i in range(3)
    ]
    reader = roundtrip(tmp_path, samples, schema=declared)
    assert reader.schema == declared and reader.manifest["schema_declared"]
    assert reader.sample(1)["ids"].tolist() == [1] and reader.sample(0)["opt"] == {"k": b"k"}
    assert reader.sample(2)["meta"]["deep"]["x"].dtype == bool


def test_declaration_errors_name_the_field() -> None:
    with pytest.raises(SchemaError, match=r"field 'm.x': cannot understand declaration"):
        Schema.declare({"m": {"x": list[list[int]]}})
    with pytest.raises(SchemaError, match=r"'x': declaration int \| str is a union"):
        Schema.declare({"x": int | str})
    with pytest.raises(SchemaError, match=r"batches carry its validity mask as 'x_valid'"):
        Schema.declare({"x": int | None, "x_valid": bool})
    with pytest.raises(SchemaError, match=r"'m.a' looks like a key of the nested dict 'm'"):
        Schema.declare({"m": {"a": int}, "m.a": int})


# -- format -----------------------------------------------------------------------------------


def test_format_version_manifest_and_arrow_types(tmp_path: Any) -> None:
    samples = [{"m": {"a": 1, "t": ["x"]}, "n": None}, {"m": {"a": 2, "t": []}, "n": 1.5}]
    reader = roundtrip(tmp_path, samples)  # one block: n is not None in all of it
    assert reader.manifest["format_version"] == snapstore.FORMAT_VERSION == 4
    assert reader.manifest["checksum"] == "crc32c"
    assert reader.manifest["schema"] == [
        {
            "kind": "struct",
            "name": "m",
            "fields": [
                {"kind": "int", "name": "a"},
                {"items": "str", "kind": "list", "name": "t"},
            ],
        },
        {"kind": "float", "name": "n", "nullable": True},
    ]
    arrow = reader.schema.arrow_schema()
    assert arrow.field("m").type == pa.struct(
        [
            pa.field("a", pa.int64(), nullable=False),
            pa.field("t", pa.large_list(pa.large_string()), nullable=False),
        ]
    )
    assert not arrow.field("m").nullable and arrow.field("n").nullable
    commit = json.loads((tmp_path / "rows" / "fp" / "COMMIT").read_text())
    assert commit["format_version"] == snapstore.FORMAT_VERSION


def test_partitions_that_differ_only_in_none_or_twins_merge() -> None:
    a = infer_schema([{"x": 1, "s": "a", "m": {"k": 1}}])
    b = infer_schema(
        [
            {"x": np.int64(1), "s": None, "m": {"k": None}},
            {"x": 1, "s": "b", "m": None},
            {"x": 1, "s": "b", "m": {"k": 2}},
        ]
    )
    merged = merge_stored(a, b)
    assert merged is not None
    assert [f.describe() for f in merged.fields] == [
        "int64[]",
        "str | None",
        "{k: int | None} | None",
    ]
    assert merge_stored(a, infer_schema([{"x": 1.0, "s": "a", "m": {"k": 1}}])) is None


# -- integrations -----------------------------------------------------------------------------


def test_tf_refuses_what_tensors_cannot_hold() -> None:
    tensorflow = pytest.importorskip("snapstore.tensorflow")
    for field, words in [
        (Field("n", "int", nullable=True), "may be None"),
        (Field("m", "struct", fields=(Field("a", "int"),)), "nested dict"),
        (Field("t", "list", "str"), "list of str or bytes"),
    ]:
        with pytest.raises(SchemaError, match=rf"field '{field.name}' .*{words}.*snap.batches"):
            tensorflow.element_spec(Schema((field,)))


def test_torch_tensors_of_nested_and_nullable_batches(tmp_path: Any) -> None:
    torch_module = pytest.importorskip("snapstore.torch")
    samples = [{"m": {"a": i, "v": None if i == 1 else [i]}} for i in range(3)]
    reader = roundtrip(tmp_path, samples)
    batch = next(iter(snapstore.BatchReader(reader, 3, options=_plain())))
    tensors = torch_module.to_tensors(batch)
    assert tensors["m"]["a"].tolist() == [0, 1, 2]
    assert tensors["m"]["v"][1] is None and tensors["m"]["v"][2].tolist() == [2]


def test_torch_dataset_forms_reach_nested_fields(tmp_path: Any) -> None:
    torch_module = pytest.importorskip("snapstore.torch")
    samples = [{"m": {"t": list(range(i % 3))}, "v": None if i == 1 else [i]} for i in range(4)]
    roundtrip(tmp_path, samples)
    snap = snapstore.open("fp", root=str(tmp_path / "rows"))
    for form in ("list", "nested"):
        dataset = torch_module.SnapshotIterableDataset(
            snap, batch_size=4, shuffle=False, ragged=form
        )
        batch = next(iter(dataset))
        assert [t.tolist() for t in batch["m"]["t"]] == [[], [0], [0, 1], []]
        assert batch["v_valid"].tolist() == [True, False, True, True]
        assert [t.tolist() for t in batch["v"]] == [[0], [], [2], [3]]


def test_grain_read_batch_nests(tmp_path: Any) -> None:
    grain = pytest.importorskip("snapstore.grain")
    samples = [{"m": {"a": i}, "n": None if i else 1.5} for i in range(4)]
    roundtrip(tmp_path, samples)
    snap = snapstore.open("fp", root=str(tmp_path / "rows"))
    out = grain.SnapshotSource(snap).read_batch([3, 0])
    assert out["m"]["a"].tolist() == [3, 0] and out["n_valid"].tolist() == [False, True]


def test_head_previews_the_new_kinds(tmp_path: Any) -> None:
    from snapstore.cli.inspect_cmd import preview

    assert preview({"a": [1, "x"], "b": None}) == {
        "type": "dict",
        "fields": {
            "a": {
                "type": "list",
                "length": 2,
                "head": [1, {"type": "str", "length": 1, "head": "x"}],
            },
            "b": None,
        },
    }


def test_info_and_head_show_the_new_kinds(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from snapstore.cli.main import main

    roundtrip(tmp_path, [{"m": {"w": 1, "t": ["a"]}, "n": None}, {"m": {"w": 2, "t": []}, "n": 1}])
    root = str(tmp_path / "rows")
    info = CliRunner().invoke(main, ["--root", root, "info", "fp"], catch_exceptions=False)
    assert "{w: int, t: list of str}" in info.output and "int | None" in info.output
    head = CliRunner().invoke(main, ["--root", root, "head", "fp"], catch_exceptions=False)
    assert head.exit_code == 0 and "{w: 1, t: ['a' (1 chars)] (1 items)}" in head.output


def test_ray_batches_hold_the_new_kinds_as_objects(tmp_path: Any) -> None:
    ray_module = pytest.importorskip("snapstore.ray")
    samples = [{"m": {"w": i}, "n": None if i else 1.5, "t": ["a"] * i} for i in range(3)]
    reader = roundtrip(tmp_path, samples)
    batch = ray_module._ray_batch(reader.load_block(0))
    assert list(batch["m"]) == [{"w": 0}, {"w": 1}, {"w": 2}]
    assert list(batch["n"]) == [1.5, None, None] and list(batch["t"]) == [[], ["a"], ["a", "a"]]


def _plain() -> Any:
    from snapstore.format.plan import PlanOptions

    return PlanOptions(shuffle=False)
