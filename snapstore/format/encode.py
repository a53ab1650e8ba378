"""Sample values to Arrow arrays, one column at a time.

:func:`column_array` builds the Arrow array of one field from its values: a list of the rows'
values (samples given to :meth:`SnapshotWriter.add`) or an ndarray (a conformed column of
:meth:`SnapshotWriter.add_batch`). Each column is one C-level pass where the values allow it:
fixed-shape arrays are stacked by one ``np.asarray``, varying-shape arrays concatenated by one
``np.concatenate`` (rows that are lists of numbers: one ``np.fromiter`` over their chained
items), scalars, strings and lists of strings converted by ``pa.array``. No numpy call per row.

A None in a nullable field becomes Arrow validity: ``pa.array`` takes None itself for scalars,
strings and lists of strings; for arrays and nested dicts the null rows hold a placeholder
(zeros, empty arrays, placeholder dicts) under a validity mask, as docs/format.md specifies.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .lists import LIST_TYPES, flatten
from .schema import Field

__all__ = ["column_array", "placeholder"]

# Kinds whose None pa.array turns into a null by itself.
_PYARROW_NULLS = frozenset({"int", "float", "bool", "str", "bytes", "list"})
_PLACEHOLDERS: dict[str, Any] = {"int": 0, "float": 0.0, "bool": False, "str": "", "bytes": b""}


def numeric_array(values: np.ndarray[Any, Any]) -> pa.Array:
    """A 1-D numpy array of a bool, integer or float dtype as an Arrow array over its bytes.

    ``pa.array(ndarray)`` would do the same, but it imports pandas on its first call in a
    process (~0.3 s, in every engine worker and on the encode threads of a first write).
    """
    flat = np.ascontiguousarray(values)
    if flat.dtype == np.bool_:  # Arrow packs bools into bits, least significant first
        data = pa.py_buffer(np.packbits(flat.view(np.uint8), bitorder="little"))
        return pa.Array.from_buffers(pa.bool_(), len(flat), [None, data])
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(flat.dtype), len(flat), [None, pa.py_buffer(flat)]
    )


_SCALAR_DTYPES = {"int": np.int64, "float": np.float64, "bool": np.bool_}
_SIZE = operator.attrgetter("size")  # of checked arrays: a C-level getter, unlike np.size


def placeholder(field: Field) -> Any:
    """The value a null row of ``field`` holds under its validity mask: zeros, an empty array
    of the field's rank, an empty list, or a dict of placeholders (None for nullable keys)."""
    if field.kind == "struct":
        return {f.name: None if f.nullable else placeholder(f) for f in field.fields}
    if field.kind == "array":
        return np.zeros(tuple(d or 0 for d in field.shape or ()), field.np_dtype)
    if field.kind == "list":
        return []
    return _PLACEHOLDERS[field.kind]


def column_array(field: Field, values: Sequence[Any] | np.ndarray[Any, Any]) -> pa.Array:
    """The Arrow array of ``field`` holding ``values``, already checked against the field."""
    mask = None
    if field.nullable and not isinstance(values, np.ndarray):
        nulls = list(map(operator.is_, values, itertools.repeat(None)))  # C-level, no __eq__
        if True in nulls:
            if field.kind in _PYARROW_NULLS:
                return pa.array(values, type=field.arrow_type())
            mask = np.array(nulls, dtype=bool)
            fill = placeholder(field)
            values = [fill if null else v for v, null in zip(values, nulls)]
    if field.kind == "struct":
        return _struct_array(field, list(values), mask)
    if field.kind == "array":
        return _array_column(field, values, mask)
    if field.kind in _SCALAR_DTYPES and mask is None:  # checked: in range, no None left
        return numeric_array(np.asarray(values, dtype=_SCALAR_DTYPES[field.kind]))
    return pa.array(values, type=field.arrow_type())


def _struct_array(
    field: Field, values: Sequence[Any], mask: np.ndarray[Any, Any] | None
) -> pa.Array:
    children = [
        column_array(f, list(map(operator.itemgetter(f.name), values))) for f in field.fields
    ]
    return pa.StructArray.from_arrays(
        children,
        fields=[f.arrow_field() for f in field.fields],
        mask=None if mask is None else pa.array(mask),
    )


def _array_column(
    field: Field, values: Sequence[Any] | np.ndarray[Any, Any], mask: np.ndarray[Any, Any] | None
) -> pa.Array:
    dtype = field.np_dtype
    storage = field.storage_dtype()
    shape = field.storage_shape()
    validity = None if mask is None else pa.array(mask)
    if field.fixed:
        fixed = tuple(int(d) for d in shape if d is not None)
        stacked = np.asarray(values, dtype=dtype) if len(values) else np.empty((0, *fixed), storage)
        flat = np.ascontiguousarray(stacked).view(storage).reshape(-1)
        if not shape:
            return numeric_array(flat) if mask is None else pa.array(flat, mask=mask)
        if math.prod(fixed) == 0:  # Arrow's from_arrays refuses list_size 0
            rows: list[Any] = [[]] * len(values)
            if mask is not None:
                rows = [None if m else [] for m in mask]
            return pa.array(rows, type=field.arrow_type())
        return pa.FixedSizeListArray.from_arrays(
            numeric_array(flat), math.prod(fixed), mask=validity
        )
    count = len(values)
    width = 2 if dtype.kind == "c" else 1  # complex is stored as (..., 2) real values
    types = set(map(type, values)) if not isinstance(values, np.ndarray) else {np.ndarray}
    if types <= set(LIST_TYPES):  # lists of numbers (a 1-D field): their items, chained
        sizes, flat = flatten(list(values), dtype)
        sizes *= width
    else:
        if not types.isdisjoint(LIST_TYPES):  # lists among arrays: a conversion per list
            values = [np.asarray(v, dtype) if type(v) in LIST_TYPES else v for v in values]
        # Checked values are arrays of the field's dtype and rank: one C-level pass each for
        # the sizes, the values (flattened in any memory order) and the offsets.
        sizes = np.fromiter(map(_SIZE, values), dtype=np.int64, count=count) * width
        # 1-D arrays join as they are; others are flattened (axis=None: a view per array)
        axis = 0 if len(field.shape or ()) == 1 else None
        flat = np.concatenate(values, axis=axis, dtype=dtype) if count else np.empty(0, dtype)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    flat_values = numeric_array(flat.view(storage))
    if len(shape) == 1:
        return pa.LargeListArray.from_arrays(numeric_array(offsets), flat_values, mask=validity)
    listed = pa.LargeListArray.from_arrays(numeric_array(offsets), flat_values)
    extra = (2,) if width == 2 else ()
    shapes = np.array([(*np.shape(v), *extra) for v in values], dtype=np.int64)
    shapes = shapes.reshape(-1, len(shape))
    shape_col = pa.FixedSizeListArray.from_arrays(numeric_array(shapes.reshape(-1)), len(shape))
    return pa.StructArray.from_arrays([listed, shape_col], names=["values", "shape"], mask=validity)
