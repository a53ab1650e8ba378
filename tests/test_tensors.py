"""Torch tensors and other array-likes as sample values: stored as the numpy arrays they hold."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import snapstore
from snapstore.errors import SchemaError
from snapstore.format.arraylike import convert_sample
from snapstore.format.schema import Field
from snapstore.write.writer import WriteOptions

torch = pytest.importorskip("torch")

# Blocks of a few rows: the first block's samples go through schema inference, the later ones
# through the fast checker, so both paths see every kind of value.
SMALL = WriteOptions(block_bytes=512, max_block_bytes=4096, block_min_rows=4)


def emit(samples: list[Any]) -> Iterator[Any]:
    yield from samples


def materialize(root: Path, samples: list[Any], **settings: Any) -> snapstore.Snapshot:
    stage = snapstore.snapshot(
        emit,
        root=str(root),
        ignore=["samples"],
        version=uuid.uuid4().hex,  # the samples are not in the fingerprint: one snapshot each
        options=settings.pop("options", SMALL),
        **settings,
    )
    return stage(samples).materialize()


def expected(value: Any) -> np.ndarray[Any, Any]:
    """What a tensor should read back as: its values, on the host, as numpy."""
    return value.numpy(force=True) if torch.is_tensor(value) else value  # detached, on the CPU


def assert_reads_back(snap: snapstore.Snapshot, samples: list[dict[str, Any]]) -> None:
    """``snap[i]`` and ``snap.batches`` give the samples' values and dtypes, as numpy."""
    assert len(snap) == len(samples)
    for i, sample in enumerate(samples):
        got = snap[i]
        for name, value in sample.items():
            want = expected(value)
            if want.ndim == 0:  # a 0-d tensor is a scalar of its dtype, like np.int64(3)
                assert isinstance(got[name], np.generic), (name, got[name])
            else:
                assert isinstance(got[name], np.ndarray), (name, got[name])
            assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
            np.testing.assert_array_equal(got[name], want)
    start = 0
    for batch in snap.batches(5):
        for name in samples[0]:
            want = np.stack([expected(s[name]) for s in samples[start : start + 5]])
            assert isinstance(batch[name], np.ndarray)
            assert batch[name].dtype == want.dtype
            np.testing.assert_array_equal(batch[name], want)
        start += 5
    assert start >= len(samples)


DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensors_of_each_dtype_round_trip(tmp_path: Path, dtype: Any) -> None:
    gen = torch.Generator().manual_seed(0)
    samples = [
        {
            "x": (torch.rand((3, 4), generator=gen) * 100).to(dtype),
            "scalar": torch.tensor(i * 7).to(dtype),
        }
        for i in range(23)
    ]
    snap = materialize(tmp_path, samples)
    numpy_dtype = str(samples[0]["x"].numpy().dtype)
    assert snap.schema["x"] == Field("x", "array", numpy_dtype, (3, 4))
    assert snap.schema["scalar"] == Field("scalar", "array", numpy_dtype, ())
    assert_reads_back(snap, samples)


def test_zero_d_tensor_is_a_scalar_of_its_dtype(tmp_path: Path) -> None:
    samples = [{"label": torch.tensor(i), "flag": torch.tensor(i % 2 == 0)} for i in range(9)]
    snap = materialize(tmp_path, samples)
    assert snap.schema["label"].describe() == "int64[]"  # like np.int64(3), not an int field
    assert snap.schema["flag"].describe() == "bool[]"
    assert snap[4]["label"] == np.int64(4) and isinstance(snap[4]["label"], np.int64)
    assert_reads_back(snap, samples)


def test_non_contiguous_tensors_round_trip(tmp_path: Path) -> None:
    base = torch.arange(40 * 6 * 8, dtype=torch.float32).reshape(40, 6, 8)
    samples = [
        {
            "transposed": base[i].t(),  # (8, 6), strides (1, 8)
            "strided": base[i, ::2, 1::3],  # (3, 3), a slice with steps
            "column": base[i, :, 5],  # (6,), stride 8
            "expanded": base[i, 0, :1].expand(4, 3),  # stride 0
        }
        for i in range(40)
    ]
    assert not samples[0]["transposed"].is_contiguous()
    assert_reads_back(materialize(tmp_path, samples), samples)


def test_tensors_come_back_as_tensors_through_the_torch_integration(tmp_path: Path) -> None:
    from snapstore.torch import to_tensors

    samples = [{"x": torch.full((2, 2), float(i)), "label": torch.tensor(i)} for i in range(8)]
    batch = to_tensors(next(iter(materialize(tmp_path, samples).batches(8))))
    assert torch.equal(batch["x"], torch.stack([s["x"] for s in samples]))
    assert torch.equal(batch["label"], torch.arange(8))


def test_varying_shape_tensors_round_trip(tmp_path: Path) -> None:
    samples = [{"tokens": torch.arange(i % 7, dtype=torch.int32) * i} for i in range(30)]
    snap = materialize(tmp_path, samples)
    assert snap.schema["tokens"].describe() == "int32[*]"
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(snap[i]["tokens"], sample["tokens"].numpy())
        assert snap[i]["tokens"].dtype == np.int32


def test_tensor_requiring_grad_is_detached(tmp_path: Path) -> None:
    weights = torch.linspace(0, 1, 12, requires_grad=True)
    samples = [{"w": weights * i} for i in range(10)]  # non-leaf tensors with a graph
    assert samples[3]["w"].requires_grad
    assert_reads_back(materialize(tmp_path, samples), samples)
    parameter = torch.nn.Parameter(torch.ones(2, 2))
    assert_reads_back(materialize(tmp_path, [{"p": parameter}]), [{"p": parameter}])


def test_conjugate_and_negative_views_are_resolved(tmp_path: Path) -> None:
    values = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    samples = [{"conj": values.conj() * 1, "view": values.conj(), "neg": -values} for _ in range(3)]
    assert samples[0]["view"].is_conj()
    snap = materialize(tmp_path, samples)
    np.testing.assert_array_equal(snap[1]["view"], np.array([1 - 2j, 3 + 4j], np.complex64))
    assert_reads_back(snap, samples)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_are_copied_to_the_host(tmp_path: Path) -> None:
    samples = [
        {"x": torch.full((2, 3), float(i), device="cuda"), "label": torch.tensor(i, device="cuda")}
        for i in range(12)
    ]
    assert_reads_back(materialize(tmp_path, samples), samples)


def test_cpu_tensors_are_converted_without_a_copy() -> None:
    tensor = torch.arange(6.0).reshape(2, 3)
    converted = convert_sample({"x": tensor, "n": 3}, 0)
    assert np.shares_memory(converted["x"], tensor.numpy())
    assert converted["n"] == 3
    plain = {"x": np.zeros(3), "n": 3}
    assert convert_sample(plain, 0) is plain  # nothing to convert: the same dict


def test_tensors_and_numpy_arrays_of_one_field_are_one_field(tmp_path: Path) -> None:
    samples: list[dict[str, Any]] = []
    for i in range(30):
        image = np.full((2, 2), i, np.float32)
        label = np.int64(i)
        if i % 3:
            samples.append({"image": torch.from_numpy(image), "label": torch.tensor(i)})
        else:
            samples.append({"image": image, "label": label})
    snap = materialize(tmp_path, samples)
    assert [f.describe() for f in snap.schema.fields] == ["float32[2,2]", "int64[]"]
    assert_reads_back(snap, samples)


def test_declared_schema_accepts_tensors(tmp_path: Path) -> None:
    samples = [{"x": torch.zeros(3, i % 4 + 1), "label": torch.tensor(i)} for i in range(20)]
    schema = {"x": ("float32", (3, None)), "label": ("int64", ())}
    snap = materialize(tmp_path, samples, schema=schema)
    assert snap.schema["x"].describe() == "float32[3,*]"
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(snap[i]["x"], sample["x"].numpy())


def test_columns_of_tensors(tmp_path: Path) -> None:
    images = torch.arange(20 * 2 * 3, dtype=torch.float32).reshape(20, 2, 3)
    labels = torch.arange(20, dtype=torch.int32)
    tokens = [torch.arange(i % 5, dtype=torch.int16) for i in range(20)]
    batches = [
        snapstore.Columns({"image": images[:10], "label": labels[:10], "tokens": tokens[:10]}),
        snapstore.Columns(
            {"image": images[10:].transpose(1, 2).transpose(1, 2), "label": labels[10:]}
            | {"tokens": tokens[10:]}
        ),
    ]
    snap = materialize(tmp_path, batches)
    assert [f.describe() for f in snap.schema.fields] == ["float32[2,3]", "int32[]", "int16[*]"]
    rows = [
        {"image": images[i], "label": labels[i], "tokens": tokens[i]} for i in range(len(images))
    ]
    for i, row in enumerate(rows):
        for name, value in row.items():
            np.testing.assert_array_equal(snap[i][name], value.numpy())
            assert snap[i][name].dtype == value.numpy().dtype


def test_columns_of_tensors_equal_the_same_rows(tmp_path: Path) -> None:
    images = torch.rand(12, 4)
    rows = [{"image": images[i]} for i in range(12)]
    by_rows = materialize(tmp_path, rows)
    by_columns = materialize(tmp_path, [snapstore.Columns({"image": images})])
    assert by_rows.schema == by_columns.schema
    for i in range(12):
        np.testing.assert_array_equal(by_rows[i]["image"], by_columns[i]["image"])


class OnlyArray:
    """An array-like that numpy reads through ``__array__`` alone; counts the conversions."""

    calls = 0

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self._array = array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        OnlyArray.calls += 1
        return self._array


class OnlyDLPack:
    """An array-like that exposes only the DLPack protocol."""

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self._array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()  # type: ignore[return-value]


def test_object_with_only_array_protocol(tmp_path: Path) -> None:
    arrays = [np.arange(6, dtype=np.uint16).reshape(2, 3) * i for i in range(30)]
    OnlyArray.calls = 0
    samples = [
        {"a": OnlyArray(a), "b": OnlyArray(np.array(i, np.int8))} for i, a in enumerate(arrays)
    ]
    snap = materialize(tmp_path, samples)
    assert OnlyArray.calls == 2 * len(arrays)  # once per value: not again to write it
    assert [f.describe() for f in snap.schema.fields] == ["uint16[2,3]", "int8[]"]
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(snap[i]["a"], a)
        assert snap[i]["b"] == np.int8(i)


def test_array_protocol_in_columns_converts_once(tmp_path: Path) -> None:
    OnlyArray.calls = 0
    lists = [OnlyArray(np.arange(i % 4, dtype=np.float32)) for i in range(16)]
    column = OnlyArray(np.arange(16, dtype=np.float32))
    snap = materialize(tmp_path, [snapstore.Columns({"ragged": lists, "x": column})])
    assert OnlyArray.calls == 17
    np.testing.assert_array_equal(snap[7]["ragged"], np.arange(3, dtype=np.float32))
    assert snap[7]["x"] == np.float32(7)


def test_object_with_only_dlpack(tmp_path: Path) -> None:
    arrays = [np.linspace(0, i, 5) for i in range(12)]
    assert not hasattr(OnlyDLPack(arrays[0]), "__array__")
    snap = materialize(tmp_path, [{"x": OnlyDLPack(a)} for a in arrays])
    assert snap.schema["x"].describe() == "float64[5]"
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(snap[i]["x"], a)


def test_tensorflow_eager_tensors(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    samples = [
        {"x": tf.constant(np.full((2, 3), i, np.float32)), "flag": tf.constant(i % 2 == 0)}
        for i in range(10)
    ]
    snap = materialize(tmp_path, samples)
    assert [f.describe() for f in snap.schema.fields] == ["float32[2,3]", "bool[]"]
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(snap[i]["x"], sample["x"].numpy())
        assert snap[i]["flag"] == np.bool_(i % 2 == 0)


def test_jax_arrays(tmp_path: Path) -> None:
    jnp = pytest.importorskip("jax.numpy")
    samples = [{"x": jnp.arange(4, dtype=jnp.float32) * i, "n": jnp.int32(i)} for i in range(10)]
    snap = materialize(tmp_path, samples)
    assert [f.describe() for f in snap.schema.fields] == ["float32[4]", "int32[]"]
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(snap[i]["x"], np.asarray(sample["x"]))


def test_bfloat16_is_refused_with_what_to_do(tmp_path: Path) -> None:
    samples = [{"x": torch.zeros(3, dtype=torch.bfloat16)}]
    with pytest.raises(SchemaError, match=r"sample 0, field 'x'.*bfloat16.*tensor\.float\(\)"):
        materialize(tmp_path, samples)
    # also after the schema is known (the checker's path), and in a column
    later = [{"x": torch.zeros(3)}] * 100 + [{"x": torch.zeros(3, dtype=torch.bfloat16)}]
    with pytest.raises(SchemaError, match=r"sample 100, field 'x'.*bfloat16"):
        materialize(tmp_path, later)
    columns = [snapstore.Columns({"x": torch.zeros(4, 3, dtype=torch.bfloat16)})]
    with pytest.raises(SchemaError, match=r"batch column 'x'.*bfloat16.*tensor\.float\(\)"):
        materialize(tmp_path, columns)


def test_a_tensor_of_another_dtype_than_the_field_says(tmp_path: Path) -> None:
    samples = [{"x": torch.zeros(3)}] * 100 + [{"x": torch.zeros(3, dtype=torch.float64)}]
    with pytest.raises(
        SchemaError, match=r"sample 100 holds numpy array float64\[3\].*float32\[3\]"
    ):
        materialize(tmp_path, samples)


def test_sparse_tensor_is_refused(tmp_path: Path) -> None:
    samples = [{"x": torch.eye(3).to_sparse()}]
    with pytest.raises(SchemaError, match=r"layout.*to_dense\(\)"):
        materialize(tmp_path, samples)


def test_unsupported_types_still_refused(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"values of type object are not supported.*tensor"):
        materialize(tmp_path, [{"x": object()}])
    later = [{"x": torch.zeros(2)}] * 100 + [{"x": object()}]
    with pytest.raises(SchemaError, match=r"sample 100, field 'x': values of type object"):
        materialize(tmp_path, later)
    with pytest.raises(SchemaError, match=r"batch column 'x' is a object"):
        materialize(tmp_path, [snapstore.Columns({"x": object()})])
    with pytest.raises(SchemaError, match=r"batch column 'x' is a 0-d array"):
        materialize(tmp_path, [snapstore.Columns({"x": torch.tensor(3)})])
