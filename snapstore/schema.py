"""Sample schema: which fields a sample has, their kinds, and how they map to Arrow.

A sample is a flat ``dict`` of ``str`` to one of: a numpy array (any integer, unsigned, float,
complex or bool dtype, any rank, fixed or varying shape), a numpy scalar, a Python ``int``,
``float``, ``bool``, ``str`` or ``bytes``. A torch tensor or another array-like (``__array__``,
``__dlpack__``) counts as the numpy array it converts to (see :mod:`snapstore.arraylike`). The
schema is inferred from the samples of the first block unless declared; a later sample that does
not fit raises :class:`SchemaError`.

Arrow layout per field kind (see docs/format.md):

- fixed-shape array ``(d1, ..., dk)``: ``fixed_size_list<T>[d1*...*dk]`` (rank 0: plain ``T``)
- varying-shape array of rank 1: ``large_list<T>``
- varying-shape array of rank k > 1:
  ``struct<values: large_list<T>, shape: fixed_size_list<int64>[k]>``
- ``int`` / ``float`` / ``bool``: ``int64`` / ``float64`` / ``bool``
- ``str`` / ``bytes``: ``large_string`` / ``large_binary``

Complex dtypes are stored as their real components with a trailing dimension of 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from .arraylike import as_numpy, convert_sample
from .errors import SchemaError

__all__ = ["Field", "FieldKind", "Schema", "infer_schema"]

FieldKind = Literal["array", "int", "float", "bool", "str", "bytes"]

_SCALAR_KINDS: dict[type, FieldKind] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
}
_SCALAR_ARROW: dict[str, pa.DataType] = {
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "str": pa.large_string(),
    "bytes": pa.large_binary(),
}
_DECLARE_HINT = (
    "to declare the schema explicitly, pass schema= to snapshot(), e.g. "
    "schema={'tokens': ('int32', (None,)), 'label': int, 'text': str}."
)


# Every dtype Arrow can store natively (complex as pairs of its float parts).
SUPPORTED_DTYPES = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ]
)


def _check_dtype(dtype: np.dtype[Any], name: str) -> np.dtype[Any]:
    if dtype.kind not in "biufc" or dtype.name not in SUPPORTED_DTYPES:
        raise SchemaError(
            f"field {name!r}: numpy dtype {dtype} is not supported; expected one of "
            f"{', '.join(sorted(SUPPORTED_DTYPES))}. Convert strings to str/bytes, objects to "
            "arrays, extended precision (float128) to float64, and bfloat16 to float32."
        )
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


@dataclass(frozen=True)
class Field:
    """One field of a sample.

    Parameters
    ----------
    name : str
        The key in the sample dict.
    kind : {"array", "int", "float", "bool", "str", "bytes"}
        What the field holds.
    dtype : str, optional
        For arrays: the numpy dtype string in native byte order (``"int32"``, ``"uint8"``...).
    shape : tuple of (int or None), optional
        For arrays: the shape, with ``None`` for dimensions that vary between samples.
    """

    name: str
    kind: FieldKind
    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None

    @property
    def fixed(self) -> bool:
        """True for an array whose shape is the same in every sample."""
        return self.kind == "array" and self.shape is not None and None not in self.shape

    @property
    def np_dtype(self) -> np.dtype[Any]:
        """The numpy dtype of an array field."""
        if self.dtype is None:
            raise SchemaError(f"field {self.name!r} of kind {self.kind!r} has no dtype")
        return np.dtype(self.dtype)

    def storage_dtype(self) -> np.dtype[Any]:
        """The dtype stored in Arrow (complex becomes its real component type)."""
        dtype = self.np_dtype
        return np.dtype(f"f{dtype.itemsize // 2}") if dtype.kind == "c" else dtype

    def storage_shape(self) -> tuple[int | None, ...]:
        """The stored shape (complex fields get a trailing dimension of 2)."""
        shape = self.shape or ()
        return (*shape, 2) if self.np_dtype.kind == "c" else shape

    def arrow_type(self) -> pa.DataType:
        """The Arrow type this field is stored as."""
        if self.kind != "array":
            return _SCALAR_ARROW[self.kind]
        value_type = pa.from_numpy_dtype(self.storage_dtype())
        shape = self.storage_shape()
        if None not in shape:
            return pa.list_(value_type, math.prod(shape)) if shape else value_type  # type: ignore[arg-type]
        values = pa.large_list(value_type)
        if len(shape) == 1:
            return values
        return pa.struct([("values", values), ("shape", pa.list_(pa.int64(), len(shape)))])

    def to_json(self) -> dict[str, Any]:
        """A JSON-able description, as stored in the manifest."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == "array":
            out["dtype"] = self.dtype
            out["shape"] = list(self.shape or ())
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Field:
        """Inverse of :meth:`to_json`; validates what it reads."""
        try:
            kind = data["kind"]
            name = data["name"]
            if kind == "array":
                shape = tuple(None if d is None else int(d) for d in data["shape"])
                dtype = _check_dtype(np.dtype(data["dtype"]), name)
                return cls(name, "array", dtype.name, shape)
            if kind in _SCALAR_ARROW:
                return cls(name, kind)
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"malformed field description {dict(data)!r}: {exc}") from exc
        raise SchemaError(f"unknown field kind {kind!r} in {dict(data)!r}")

    def describe(self) -> str:
        """A short human form such as ``uint8[64,64,3]`` or ``int32[*]``."""
        if self.kind != "array":
            return self.kind
        dims = ",".join("*" if d is None else str(d) for d in self.shape or ())
        return f"{self.dtype}[{dims}]"


@dataclass(frozen=True)
class Schema:
    """The ordered fields of a snapshot's samples."""

    fields: tuple[Field, ...]

    @property
    def names(self) -> list[str]:
        """Field names in order."""
        return [f.name for f in self.fields]

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of every block."""
        return pa.schema([pa.field(f.name, f.arrow_type(), nullable=False) for f in self.fields])

    def to_json(self) -> list[dict[str, Any]]:
        """JSON-able form, as stored in the manifest."""
        return [f.to_json() for f in self.fields]

    @classmethod
    def from_json(cls, data: Sequence[Mapping[str, Any]]) -> Schema:
        """Inverse of :meth:`to_json`."""
        return cls(tuple(Field.from_json(d) for d in data))

    @classmethod
    def declare(cls, spec: Mapping[str, Any]) -> Schema:
        """Build a schema from a compact declaration.

        Parameters
        ----------
        spec : mapping
            Field name to ``int``, ``float``, ``bool``, ``str``, ``bytes`` (the Python types), or
            ``(dtype, shape)`` for arrays, with ``None`` for varying dimensions.

        Examples
        --------
        >>> Schema.declare({"tokens": ("int32", (None,)), "label": int}).fields[0].describe()
        'int32[*]'
        """
        fields = []
        for name, decl in spec.items():
            if isinstance(decl, type) and decl in _SCALAR_KINDS:
                fields.append(Field(name, _SCALAR_KINDS[decl]))
            elif isinstance(decl, tuple) and len(decl) == 2:
                dtype = _check_dtype(np.dtype(decl[0]), name)
                shape = tuple(None if d is None else int(d) for d in decl[1])
                fields.append(Field(name, "array", dtype.name, shape))
            else:
                raise SchemaError(
                    f"field {name!r}: cannot understand declaration {decl!r}; expected one of "
                    "int, float, bool, str, bytes or a (dtype, shape) tuple such as "
                    "('int32', (None,))."
                )
        return cls(tuple(fields))


def _describe_value(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"numpy array {value.dtype}{list(value.shape)}"
    return type(value).__name__


def field_of(name: str, value: Any, index: int) -> Field:
    """The field a single value implies; raises SchemaError for unsupported values."""
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        dtype = _check_dtype(arr.dtype, name)
        return Field(name, "array", dtype.name, tuple(arr.shape))
    kind = _SCALAR_KINDS.get(type(value))
    if kind is None:
        array = as_numpy(value, name, index)
        if array is not None:
            return field_of(name, array, index)
    if kind == "int" and not -(2**63) <= value < 2**63:
        raise SchemaError(
            f"sample {index}, field {name!r}: int {value} does not fit in 64 bits; store it as "
            "a str, or as a numpy array of a wider representation."
        )
    if kind is None:
        raise SchemaError(
            f"sample {index}, field {name!r}: values of type {type(value).__name__} are not "
            "supported; expected a numpy array or scalar, a torch tensor or array-like "
            "(__array__, __dlpack__), int, float, bool, str or bytes. Flatten nested dicts into "
            "separate keys and convert other objects to arrays."
        )
    return Field(name, kind)


def _merge(a: Field, b: Field, index: int) -> Field:
    if a.kind != b.kind or a.dtype != b.dtype:
        raise SchemaError(
            f"field {a.name!r}: sample {index} holds {b.describe()} but earlier samples hold "
            f"{a.describe()}. Make the type consistent, or {_DECLARE_HINT}"
        )
    if a.kind != "array" or a.shape == b.shape:
        return a
    assert a.shape is not None and b.shape is not None
    if len(a.shape) != len(b.shape):
        raise SchemaError(
            f"field {a.name!r}: sample {index} has rank {len(b.shape)} (shape {b.shape}) "
            f"but earlier "
            f"samples have rank {len(a.shape)} ({a.describe()}). Arrays of a field must keep their "
            f"rank; {_DECLARE_HINT}"
        )
    shape = tuple(x if x == y else None for x, y in zip(a.shape, b.shape))
    return Field(a.name, "array", a.dtype, shape)


def infer_schema(samples: Sequence[Mapping[str, Any]], first_index: int = 0) -> Schema:
    """Infer a schema from samples: dims that differ between them become varying (``None``).

    Raises
    ------
    SchemaError
        If a sample has other keys than the first, or a field changes kind, dtype or rank.
    """
    if not samples:
        return Schema(())
    first = samples[0]
    fields = {
        name: field_of(name, value, first_index) for name, value in sample_items(first, first_index)
    }
    for offset, sample in enumerate(samples[1:], start=1):
        index = first_index + offset
        check_keys(fields, sample, index)
        for name, value in sample.items():
            fields[name] = _merge(fields[name], field_of(name, value, index), index)
    return Schema(tuple(fields.values()))


def sample_items(sample: Any, index: int) -> list[tuple[str, Any]]:
    if not isinstance(sample, Mapping):
        raise SchemaError(
            f"sample {index} is a {type(sample).__name__}; expected a dict of field name to value, "
            "e.g. {'image': array, 'label': 3}."
        )
    for name in sample:
        if not isinstance(name, str):
            raise SchemaError(f"sample {index}: field names must be str, found {name!r}")
    return list(sample.items())


def check_keys(expected: Mapping[str, Any], sample: Any, index: int) -> None:
    """Raise SchemaError naming the missing or extra keys of a sample."""
    items = sample_items(sample, index)
    if len(items) == len(expected) and all(name in expected for name, _ in items):
        return
    missing = sorted(set(expected) - set(sample))
    extra = sorted(set(sample) - set(expected))
    raise SchemaError(
        f"sample {index} does not match the schema: missing fields {missing}, unexpected fields "
        f"{extra}; expected exactly {sorted(expected)}. Every sample must have the same keys."
    )


def _fast_check(field: Field) -> Callable[[Any], bool]:
    """A cheap predicate that accepts the common, valid values of a field (no messages)."""
    if field.kind != "array":
        scalar = {"int": int, "float": float, "bool": bool, "str": str, "bytes": bytes}[field.kind]
        if scalar is int:
            return lambda v: type(v) is int and -(2**63) <= v < 2**63
        return lambda v: type(v) is scalar
    dtype, shape = field.np_dtype, field.shape or ()
    if field.fixed and not shape:  # a numpy scalar (what arr[i] and rng.integers() give)
        scalar = dtype.type
        return lambda v: type(v) is scalar or (
            type(v) is np.ndarray and v.shape == () and v.dtype == dtype
        )
    if field.fixed:
        return lambda v: type(v) is np.ndarray and v.shape == shape and v.dtype == dtype
    fixed_dims = [(i, d) for i, d in enumerate(shape) if d is not None]
    rank = len(shape)
    return lambda v: (
        type(v) is np.ndarray
        and v.ndim == rank
        and v.dtype == dtype
        and all(v.shape[i] == d for i, d in fixed_dims)
    )


def sample_checker(schema: Schema) -> Callable[[Any, int], Mapping[str, Any]]:
    """A function ``check(sample, index)`` that raises SchemaError if a sample does not fit, and
    returns the sample to store: ``sample`` itself, or a copy whose tensors and array-likes are
    numpy arrays (converted once, here).

    Valid samples take a fast path (one predicate per field, ~1 us per sample); a sample it does
    not accept has its array-likes converted and is tried again, and anything still refused goes
    through :func:`check_sample` for a precise message.
    """
    checks = {f.name: _fast_check(f) for f in schema.fields}
    count = len(checks)

    def check(sample: Any, index: int) -> Mapping[str, Any]:
        if type(sample) is dict and len(sample) == count:
            try:
                for name, value in sample.items():  # a loop: cheaper than all() over a genexpr
                    if not checks[name](value):
                        break
                else:
                    return sample
            except KeyError:
                pass
        converted = convert_sample(sample, index)
        if converted is not sample:  # holds no array-likes now, so this recurses once at most
            return check(converted, index)
        check_sample(schema, sample, index)
        return sample  # type: ignore[no-any-return]

    return check


def check_sample(schema: Schema, sample: Any, index: int) -> None:
    """Raise SchemaError if ``sample`` does not fit ``schema``."""
    fields = {f.name: f for f in schema.fields}
    check_keys(fields, sample, index)
    for name, value in sample.items():
        field = fields[name]
        found = field_of(name, value, index)
        if found.kind != field.kind or found.dtype != field.dtype:
            raise SchemaError(
                f"field {name!r}: sample {index} holds {_describe_value(value)} but the schema "
                f"says {field.describe()}. Make the type consistent, or {_DECLARE_HINT}"
            )
        if field.kind == "array":
            assert field.shape is not None and found.shape is not None
            if len(found.shape) != len(field.shape):
                raise SchemaError(
                    f"field {name!r}: sample {index} has rank {len(found.shape)} (shape "
                    f"{found.shape}) but the schema says rank {len(field.shape)} "
                    f"({field.describe()}). "
                    f"Arrays of a field must keep their rank; {_DECLARE_HINT}"
                )
            if any(d is not None and d != e for d, e in zip(field.shape, found.shape)):
                raise SchemaError(
                    f"field {name!r}: sample {index} has shape {found.shape} but the schema says "
                    f"{field.describe()} (inferred from the first block's samples). If this "
                    f"field's shape varies, declare it: {_DECLARE_HINT} "
                    "Use None for varying dimensions."
                )
