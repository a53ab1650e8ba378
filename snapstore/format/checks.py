"""Checking samples against a schema: a fast path of one cheap predicate per field, and a slow
path that says what is wrong.

:func:`sample_checker` builds the predicates once per schema; a valid sample costs O(fields)
type and shape tests (lists: one C-level pass over their items), and messages are built only
on the error path (:func:`check_sample`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import SchemaError
from . import scalars
from .arraylike import convert_sample
from .fields import DECLARE_HINT, Field
from .inference import check_keys, describe_value, field_of
from .lists import fits_exactly, list_check
from .schema import Schema

__all__ = ["check_sample", "fast_check", "sample_checker"]


def fast_check(field: Field) -> Callable[[Any], bool]:
    """A cheap predicate that accepts the common, valid values of a field (no messages)."""
    check = _fast_value_check(field)
    if not field.nullable:
        return check
    return lambda v: v is None or check(v)


def _fast_value_check(field: Field) -> Callable[[Any], bool]:
    kind = field.kind
    if scalars.family(field) is not None:
        return _scalar_check(field)
    if kind in ("str", "bytes"):
        scalar = str if kind == "str" else bytes
        return lambda v: type(v) is scalar
    if kind == "list":
        items = list_check(kind, field.dtype)
        return lambda v: (type(v) is list or type(v) is tuple) and items(v)
    if kind == "struct":
        return _struct_check(field)
    return _array_check(field)


def _scalar_check(field: Field) -> Callable[[Any], bool]:
    """Python scalars and numpy scalars (what arr[i] and rng.integers() give) that the field
    holds exactly: one set lookup, or a type test and a range or exactness test."""
    types, exact = scalars.accepted(field)
    python = {"i": int, "u": int, "f": float, "b": bool}[scalars.dtype_of(field).kind]
    if field.kind == "array":  # 0-d arrays too, rarely: tested last
        dtypes = frozenset(np.dtype(t) for t in types)

        def scalar_array(v: Any) -> bool:
            if type(v) in types or (type(v) is python and (exact is None or exact(v))):
                return True
            return type(v) is np.ndarray and v.shape == () and v.dtype in dtypes

        return scalar_array
    if exact is None:
        return lambda v: type(v) is python or type(v) in types
    return lambda v: (type(v) is python and exact(v)) or type(v) in types


def _array_check(field: Field) -> Callable[[Any], bool]:
    dtype, shape = field.np_dtype, field.shape or ()
    if field.fixed:
        return lambda v: type(v) is np.ndarray and v.shape == shape and v.dtype == dtype
    if len(shape) == 1:  # lists of numbers are varying 1-D arrays
        items = list_check("array", dtype.name)

        def one_d(v: Any) -> bool:
            if type(v) is np.ndarray:
                return v.ndim == 1 and v.dtype == dtype
            return (type(v) is list or type(v) is tuple) and items(v)

        return one_d
    fixed_dims = [(i, d) for i, d in enumerate(shape) if d is not None]
    rank = len(shape)
    return lambda v: (
        type(v) is np.ndarray
        and v.ndim == rank
        and v.dtype == dtype
        and all(v.shape[i] == d for i, d in fixed_dims)
    )


def _struct_check(field: Field) -> Callable[[Any], bool]:
    checks = [(f.name, fast_check(f)) for f in field.fields]
    count = len(checks)

    def struct(v: Any) -> bool:
        if type(v) is not dict or len(v) != count:
            return False
        try:
            for name, check in checks:
                if not check(v[name]):
                    return False
        except KeyError:
            return False
        return True

    return struct


def sample_checker(schema: Schema) -> Callable[[Any, int], Mapping[str, Any]]:
    """A function ``check(sample, index)`` that raises SchemaError if a sample does not fit, and
    returns the sample to store: ``sample`` itself, or a copy whose tensors and array-likes are
    numpy arrays (converted once, here).

    Valid samples take a fast path (one predicate per field, ~1 us per sample); a sample it does
    not accept has its array-likes converted and is tried again, and anything still refused goes
    through :func:`check_sample` for a precise message.
    """
    checks = {f.name: fast_check(f) for f in schema.fields}
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


_NULLABLE_HINT = (
    "declare the field nullable: pass schema= to snapshot() with 'x': int | None (or "
    "snapstore.nullable(('float32', (4,))) for an array)"
)


def check_sample(schema: Schema, sample: Any, index: int) -> None:
    """Raise SchemaError if ``sample`` does not fit ``schema``."""
    fields = {f.name: f for f in schema.fields}
    check_keys(fields, sample, index)
    for name, value in sample.items():
        _check_value(fields[name], value, index, name)


def _check_value(field: Field, value: Any, index: int, label: str) -> None:
    if value is None:
        if field.nullable:
            return
        raise SchemaError(
            f"field {label!r}: sample {index} is None but the schema says {field.describe()}, "
            "which may not be None (inferred from the first block, where no sample held None, "
            f"unless declared). If the field can be missing, {_NULLABLE_HINT}."
        )
    if field.kind == "struct":
        _check_struct(field, value, index, label)
        return
    found = field_of(field.name, value, index, label)
    if not _fits(field, found, value):
        hint = ""
        if found.from_list:
            hint = (
                " A list of numbers is a varying-length 1-D array of int64, float64 or bool "
                "(float64 when the first block held only empty lists), a list of str or bytes a "
                "list: declare the field (e.g. 'tags': list[str]) when the first block does not "
                "show its type, and yield np.array(value) for a fixed shape."
            )
        elif scalars.family(found) is not None and scalars.family(found) == scalars.family(field):
            hint = (
                " The field holds a number only exactly: a numpy scalar whose dtype casts "
                "safely to the field's, a Python number in its range and precision."
            )
        raise SchemaError(
            f"field {label!r}: sample {index} holds {_describe_found(found, value, field)} but the "
            f"schema says {field.describe()}.{hint} Make the type consistent, or {DECLARE_HINT}"
        )
    if field.kind != "array" or found.from_list or found.kind != "array":
        return
    assert field.shape is not None and found.shape is not None
    if len(found.shape) != len(field.shape):
        raise SchemaError(
            f"field {label!r}: sample {index} has rank {len(found.shape)} (shape "
            f"{found.shape}) but the schema says rank {len(field.shape)} "
            f"({field.describe()}). "
            f"Arrays of a field must keep their rank; {DECLARE_HINT}"
        )
    if any(d is not None and d != e for d, e in zip(field.shape, found.shape)):
        raise SchemaError(
            f"field {label!r}: sample {index} has shape {found.shape} but the schema says "
            f"{field.describe()} (inferred from the first block's samples). If this "
            f"field's shape varies, declare it: {DECLARE_HINT} "
            "Use None for varying dimensions."
        )


def _describe_found(found: Field, value: Any, field: Field) -> str:
    if found.from_list or found.kind not in ("array", "int", "float", "bool"):
        return found.describe()
    if scalars.family(found) not in (None, scalars.family(field)):
        return found.describe()
    if scalars.family(found) is not None:  # the value: a range or precision is what failed
        return f"{value!r}" if isinstance(value, np.generic) else f"{found.describe()} {value!r}"
    return describe_value(value)


def _fits(field: Field, found: Field, value: Any) -> bool:
    """Whether a value that implies ``found`` may be stored in ``field``."""
    if found.from_list:
        if field.kind == "list" or found.kind == "list":
            return (found.kind == field.kind and found.dtype == field.dtype) or found.dtype is None
        if field.kind != "array" or field.shape != (None,):
            return False
        if found.dtype is None or found.dtype == field.dtype:
            return True
        return (
            found.dtype == "int64" and field.dtype == "float64" and fits_exactly(value, "float64")
        )
    if found.kind == field.kind and found.dtype == field.dtype:
        return True
    return scalars.fits(field, value)


def _check_struct(field: Field, value: Any, index: int, label: str) -> None:
    if not isinstance(value, Mapping):
        raise SchemaError(
            f"field {label!r}: sample {index} holds {describe_value(value)} but the schema "
            f"says a nested dict {field.describe()}. Make the type consistent, or {DECLARE_HINT}"
        )
    names = [f.name for f in field.fields]
    if len(value) != len(names) or not all(name in value for name in names):
        raise SchemaError(
            f"field {label!r}: sample {index} holds a dict with keys "
            f"{sorted(map(str, value))} but the schema says keys {sorted(names)}. Every "
            "sample's nested dict needs the same keys: use None for a missing value."
        )
    for f in field.fields:
        _check_value(f, value[f.name], index, f"{label}.{f.name}")
