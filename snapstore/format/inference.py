"""Inferring a schema from samples: the field each value implies, and how the fields of several
samples merge into one.

Dims that differ between samples become varying; None makes a field nullable; numeric scalars
of one family promote (``3`` and ``np.int32(3)`` give ``int64[]``, see
:mod:`snapstore.format.scalars`); lists join varying 1-D
fields (an empty list takes the other's type, a list of int widens to ``float64`` beside a
list of float); nested dicts merge key by key. What only a whole first block settles (a field
seen only as None, lists seen only empty) is settled by :func:`resolve`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import SchemaError
from . import scalars
from .arraylike import as_numpy
from .fields import DECLARE_HINT, SCALAR_KINDS, Field, check_dtype
from .lists import LIST_TYPES, classify
from .schema import Schema, check_names

__all__ = [
    "check_keys",
    "describe_value",
    "field_of",
    "infer_schema",
    "merge_fields",
    "merge_stored",
    "resolve",
    "sample_items",
]

# A Python scalar kind and the numpy dtype of its twin, stored alike: int and int64[].
_TWINS = {"int": "int64", "float": "float64", "bool": "bool"}


def describe_value(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"numpy array {value.dtype}{list(value.shape)}"
    return type(value).__name__


def field_of(name: str, value: Any, index: int, label: str | None = None) -> Field:
    """The field a single value implies; raises SchemaError for unsupported values.

    ``label`` names the field in messages (a dotted path inside nested dicts); default ``name``.
    """
    label = label or name
    if value is None:
        return Field(name, "null", nullable=True)
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        dtype = check_dtype(arr.dtype, label)
        return Field(name, "array", dtype.name, tuple(arr.shape))
    if type(value) in LIST_TYPES:
        try:
            list_kind, list_dtype = classify(value)
        except ValueError as exc:
            raise SchemaError(f"sample {index}, field {label!r}: the list {exc}.") from exc
        shape = (None,) if list_kind == "array" else None
        return Field(name, list_kind, list_dtype, shape, from_list=True)
    if isinstance(value, Mapping):
        return _struct_field(name, value, index, label)
    kind = SCALAR_KINDS.get(type(value))
    if kind is None:
        array = as_numpy(value, label, index)
        if array is not None:
            return field_of(name, array, index, label)
    if kind == "int" and not -(2**63) <= value < 2**63:
        raise SchemaError(
            f"sample {index}, field {label!r}: int {value} does not fit in 64 bits; store it as "
            "a str, or as a numpy array of a wider representation."
        )
    if kind is None:
        raise SchemaError(
            f"sample {index}, field {label!r}: values of type {type(value).__name__} are not "
            "supported; expected a numpy array or scalar, a torch tensor or array-like "
            "(__array__, __dlpack__), int, float, bool, str, bytes, a list of numbers, str or "
            "bytes, a dict of these, or None. Convert other objects to arrays."
        )
    return Field(name, kind)


def _struct_field(name: str, value: Mapping[Any, Any], index: int, label: str) -> Field:
    keys = list(value)
    if not keys or not all(isinstance(k, str) for k in keys):
        raise SchemaError(
            f"sample {index}, field {label!r}: a nested dict needs at least one key and only "
            f"str keys, found {keys!r}; use str keys, or None for a missing dict."
        )
    children = tuple(field_of(k, v, index, f"{label}.{k}") for k, v in value.items())
    return Field(name, "struct", fields=children)


def _mismatch(a: Field, b: Field, index: int, label: str) -> SchemaError:
    return SchemaError(
        f"field {label!r}: sample {index} holds {b.describe()} but earlier samples hold "
        f"{a.describe()}. Make the type consistent, or {DECLARE_HINT}"
    )


def merge_fields(a: Field, b: Field, index: int, label: str | None = None) -> Field:
    """The field that holds the values of both ``a`` (earlier samples) and ``b`` (sample
    ``index``): None makes a field nullable, numeric scalars of one family promote (``int``
    and ``int32[]`` give ``int64[]``, see :mod:`snapstore.format.scalars`), lists join varying 1-D
    fields, dims that differ vary."""
    label = label or a.name
    if a.kind == "null" or b.kind == "null":
        return replace(b if a.kind == "null" else a, name=a.name, nullable=True)
    merged = _merge_kinds(a, b, index, label)
    nullable = a.nullable or b.nullable
    return merged if merged.nullable == nullable else replace(merged, nullable=nullable)


def _twin_of(f: Field, other: Field) -> Field:
    """``f`` as the rank-0 array field ``other`` is, when ``f`` is its Python scalar twin,
    stored alike (``int`` and ``int64[]``)."""
    twin = _TWINS.get(f.kind)
    if twin is not None and other.kind == "array" and other.shape == () and other.dtype == twin:
        return replace(other, name=f.name, nullable=f.nullable)
    return f


def _merge_kinds(a: Field, b: Field, index: int, label: str) -> Field:
    if a.kind != b.kind or a.dtype != b.dtype:
        widened = scalars.join(a, b) or _widen(a, b) or _widen(b, a)
        if widened is None:
            raise _mismatch(a, b, index, label)
        return replace(widened, name=a.name)
    if a.kind == "struct":
        return _merge_struct(a, b, index, label)
    if a.kind != "array" or a.shape == b.shape:
        return a if a.from_list <= b.from_list else replace(a, from_list=False)
    assert a.shape is not None and b.shape is not None
    if len(a.shape) != len(b.shape):
        raise SchemaError(
            f"field {label!r}: sample {index} has rank {len(b.shape)} (shape {b.shape}) "
            f"but earlier "
            f"samples have rank {len(a.shape)} ({a.describe()}). Arrays of a field must keep their "
            f"rank; {DECLARE_HINT}"
        )
    shape = tuple(x if x == y else None for x, y in zip(a.shape, b.shape))
    return Field(a.name, "array", a.dtype, shape, from_list=a.from_list and b.from_list)


def _widen(x: Field, y: Field) -> Field | None:
    """The field for lists ``x`` and another 1-D field ``y`` of another type, if lists allow:
    an empty list takes ``y``'s type, a list of int widens to ``float64``."""
    if not x.from_list or x.kind != "array":
        return None
    one_d = y.kind == "list" or (y.kind == "array" and len(y.shape or ()) == 1)
    if x.dtype is None and one_d:
        return replace(y, shape=(None,)) if y.kind == "array" else y
    if x.dtype == "int64" and y.kind == "array" and y.dtype == "float64" and one_d:
        return replace(y, shape=(None,))
    return None


def _merge_struct(a: Field, b: Field, index: int, label: str) -> Field:
    theirs = {f.name: f for f in b.fields}
    if {f.name for f in a.fields} != set(theirs):
        raise SchemaError(
            f"field {label!r}: sample {index} holds a dict with keys {sorted(theirs)} but "
            f"earlier samples hold keys {sorted(f.name for f in a.fields)}. Every sample's "
            "nested dict needs the same keys: use None for a missing value."
        )
    children = tuple(merge_fields(f, theirs[f.name], index, f"{label}.{f.name}") for f in a.fields)
    return replace(a, fields=children)


def infer_schema(
    samples: Sequence[Mapping[str, Any]], first_index: int = 0, *, resolved: bool = True
) -> Schema:
    """Infer a schema from samples: dims that differ between them become varying (``None``).

    With ``resolved=False`` the schema may still hold what only a whole first block settles
    (fields seen only as None, lists seen only empty): pass it through :func:`resolve` once
    every part of the block is merged.

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
            fields[name] = merge_fields(fields[name], field_of(name, value, index), index)
    schema = Schema(tuple(fields.values()))
    return resolve(schema, first_index, len(samples)) if resolved else schema


def resolve(schema: Schema, first: int, count: int) -> Schema:
    """The schema of a first block of ``count`` samples from sample ``first``, once all of it is
    merged: a varying 1-D field seen only as empty lists is ``float64[*]`` (lists of int and
    float fit it later); a field None in every sample has no type to infer.

    Raises
    ------
    SchemaError
        For a field that was None in every sample, with the declaration to pass instead.
    """
    fields = tuple(_resolve(f, f.name, schema, first, count) for f in schema.fields)
    resolved = Schema(fields)
    check_names(resolved.fields)
    return resolved


def _resolve(field: Field, label: str, schema: Schema, first: int, count: int) -> Field:
    if field.kind == "null":
        from .declare import declaration_of

        declared = ", ".join(f"{f.name!r}: {declaration_of(f)}" for f in schema.fields)
        raise SchemaError(
            f"field {label!r} is None in every sample of the first block (samples {first} to "
            f"{first + count - 1}), so its type cannot be inferred. Declare the schema: pass "
            f"schema={{{declared}}} to snapshot(), with the field's type for <type>."
        )
    if field.kind == "struct":
        children = [_resolve(f, f"{label}.{f.name}", schema, first, count) for f in field.fields]
        return replace(field, fields=tuple(children))
    if field.kind == "array" and field.dtype is None:
        return replace(field, dtype="float64", from_list=False)
    return replace(field, from_list=False) if field.from_list else field


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


def merge_stored(a: Schema, b: Schema) -> Schema | None:
    """The schema that reads blocks written with ``a`` and with ``b`` (partitions that inferred
    their schemas apart), or None if their stored types differ: fields may differ only in being
    nullable, or as a Python scalar and its numpy twin (``int`` and ``int64[]``, stored alike;
    the twin reads back)."""
    if [f.name for f in a.fields] != [f.name for f in b.fields]:
        return None
    merged = [_merge_stored_field(x, y) for x, y in zip(a.fields, b.fields)]
    return None if None in merged else Schema(tuple(f for f in merged if f is not None))


def _merge_stored_field(x: Field, y: Field) -> Field | None:
    nullable = x.nullable or y.nullable
    x, y = _twin_of(x, y), _twin_of(y, x)
    if x.kind == "struct" and y.kind == "struct":
        if [f.name for f in x.fields] != [f.name for f in y.fields]:
            return None
        children = [_merge_stored_field(f, g) for f, g in zip(x.fields, y.fields)]
        if None in children:
            return None
        return replace(x, nullable=nullable, fields=tuple(f for f in children if f is not None))
    if replace(x, nullable=nullable) != replace(y, nullable=nullable):
        return None
    return replace(x, nullable=nullable)
