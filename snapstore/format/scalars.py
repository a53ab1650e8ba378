"""Numeric scalars, Python and numpy, in one field: the type that holds a mix, and the values a
settled field takes.

Python ``int``, ``float`` and ``bool`` and numpy scalars (``np.int32(3)``, what ``arr[i]``
gives) of one family (integers, floats, bools) may share a field. While the first block is
inferred, a mix takes the numpy type that holds every value exactly: numpy's promotion of the
types seen, a Python int counting as ``int64`` and a Python float as ``float64`` (``3`` and
``np.int32(4)`` give ``int64[]``, ``0.5`` and ``np.float32(1)`` give ``float64[]``,
``np.int32`` and ``np.int64`` give ``int64[]``); a field of Python scalars only keeps its Python
kind. Types with no common type in their family (``int64`` and ``uint64``, whose promotion is
``float64``) are refused, and so are mixes of families (int and float), as before.

Once settled, a field takes any value of its family that it holds exactly: numpy scalars whose
dtype casts safely to the field's (``np.int16`` into ``int64[]`` or ``int``), Python ints in
the range of the field's dtype, Python floats that the dtype represents exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .schema import SUPPORTED_DTYPES, Field

__all__ = ["accepted", "dtype_of", "family", "fits", "join"]

# numpy dtype kind to scalar family, and each Python scalar kind's type and dtype
FAMILIES = {"i": "int", "u": "int", "f": "float", "b": "bool"}
_PYTHON_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool}
_PYTHON_DTYPES = {"int": np.dtype(np.int64), "float": np.dtype(np.float64), "bool": np.dtype(bool)}


def family(field: Field) -> str | None:
    """``"int"``, ``"float"`` or ``"bool"`` for a Python scalar field or a rank-0 numeric array
    field of that family; None for every other field."""
    if field.kind in _PYTHON_DTYPES:
        return field.kind
    if field.kind == "array" and field.shape == () and field.dtype is not None:
        return FAMILIES.get(np.dtype(field.dtype).kind)
    return None


def dtype_of(field: Field) -> np.dtype[Any]:
    """The numpy dtype a scalar field's values take: its own, or int64, float64, bool."""
    return _PYTHON_DTYPES.get(field.kind) or np.dtype(field.dtype)


def join(a: Field, b: Field) -> Field | None:
    """The rank-0 field that holds the scalars of ``a`` and of ``b``, two different scalar types
    of one family; None when they are not scalars of one family or have no common type."""
    fam = family(a)
    if fam is None or fam != family(b) or (a.kind, a.dtype) == (b.kind, b.dtype):
        return None
    dtype = np.promote_types(dtype_of(a), dtype_of(b))
    if FAMILIES.get(dtype.kind) != fam or dtype.name not in SUPPORTED_DTYPES:
        return None
    return Field(a.name, "array", dtype.name, (), a.nullable or b.nullable)


def fits(field: Field, value: Any) -> bool:
    """Whether a scalar field holds ``value`` exactly (see the module docstring)."""
    fam = family(field)
    if fam is None:
        return False
    target = dtype_of(field)
    if type(value) is _PYTHON_TYPES[fam]:
        return _python_fits(target, value)
    if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
        return FAMILIES.get(value.dtype.kind) == fam and np.can_cast(value.dtype, target, "safe")
    return False


def _python_fits(target: np.dtype[Any], value: Any) -> bool:
    if target.kind in "iu":
        info = np.iinfo(target)
        return bool(info.min <= value <= info.max)
    if target.kind == "f" and target.itemsize < 8:
        with np.errstate(over="ignore"):
            # float() first: numpy would compare in float32 (NEP 50), where 0.1 equals itself
            return bool(value != value or float(target.type(value)) == value)  # nan is nan
    return True


def accepted(field: Field) -> tuple[frozenset[type], Callable[[Any], bool] | None]:
    """For the fast check of a scalar field: the numpy scalar types it takes as they are, and a
    predicate for Python scalars of its family (None: every one fits)."""
    fam = family(field)
    target = dtype_of(field)
    types = frozenset(
        np.dtype(name).type
        for name in SUPPORTED_DTYPES
        if FAMILIES.get(np.dtype(name).kind) == fam and np.can_cast(name, target, "safe")
    )
    if target.kind in "iu":
        low, high = int(np.iinfo(target).min), int(np.iinfo(target).max)
        return types, lambda v: low <= v <= high
    if target.kind == "f" and target.itemsize < 8:
        return types, lambda v: _python_fits(target, v)
    return types, None
