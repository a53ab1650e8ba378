"""Conversion between samples and Arrow record batches, and numpy views of decoded blocks.

``to_record_batch`` turns a list of validated samples into one record batch. ``BlockColumns``
wraps a decoded batch: fixed-shape fields become one zero-copy numpy view of the whole block,
shaped ``(rows, *shape)``; varying arrays keep their flat values and offsets, so taking a row is
a slice, not a copy.

For :meth:`snapstore.write.writer.SnapshotWriter.add_batch`, ``normalize_columns``,
``infer_columns`` and ``conform_columns`` check a batch given as columns and ``batch_from_columns``
builds a block's record batch from slices of them, without a Python object per row; ``column_rows``
names the rows a batch stands for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import SchemaError
from .arraylike import as_numpy, convert_values
from .checks import check_sample, fast_check
from .encode import column_array
from .fields import DECLARE_HINT, Field, check_dtype
from .inference import check_keys, infer_schema
from .ragged import RaggedRows
from .schema import Schema

__all__ = [
    "BlockColumns",
    "RowCopy",
    "batch_from_columns",
    "column_rows",
    "conform_columns",
    "gather",
    "gather_objects",
    "infer_columns",
    "nest_batch",
    "normalize_columns",
    "row_sizes",
    "to_record_batch",
]


def to_record_batch(schema: Schema, samples: Sequence[dict[str, Any]]) -> pa.RecordBatch:
    """Build one record batch from samples already checked against ``schema``."""
    columns = [column_array(f, [s[f.name] for s in samples]) for f in schema.fields]
    return pa.RecordBatch.from_arrays(columns, schema=schema.arrow_schema())


def _numpy(array: pa.Array) -> np.ndarray[Any, Any]:
    """A zero-copy view of a primitive array's values (bools, packed as bits, are copied)."""
    if pa.types.is_boolean(array.type):
        filled = array.fill_null(False) if array.null_count else array
        copied: np.ndarray[Any, Any] = filled.to_numpy(zero_copy_only=False)
        return copied
    # Straight from the data buffer: ~10x cheaper per call than Array.to_numpy, which matters
    # because a block is decoded for every ~1 MiB read.
    dtype = np.dtype(array.type.to_pandas_dtype())
    offset = array.offset * dtype.itemsize
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=offset)


def _values(column: pa.Array) -> pa.Array:
    """The child values of a fixed-size list column (no compute call when it is not sliced)."""
    return column.values if column.offset == 0 else column.flatten()


class _Ragged:
    """Flat values plus offsets (and per-row shapes for rank > 1) of a varying-shape field."""

    def __init__(self, field: Field, column: pa.Array) -> None:
        self.dtype = field.np_dtype
        if isinstance(column, pa.StructArray):
            listed = column.field("values")
            rank = len(field.storage_shape())
            self.shapes: np.ndarray[Any, Any] | None = _numpy(
                _values(column.field("shape"))
            ).reshape(-1, rank)
        else:
            listed = column
            self.shapes = None
        self.offsets = _numpy(listed.offsets)
        self.values = _numpy(listed.values)
        self.complex = self.dtype.kind == "c"

    def row(self, i: int) -> np.ndarray[Any, Any]:
        flat = self.values[self.offsets[i] : self.offsets[i + 1]]
        if self.complex:
            flat = flat.view(self.dtype)
        if self.shapes is None:
            return flat
        shape = self.shapes[i][:-1] if self.complex else self.shapes[i]
        return flat.reshape(tuple(shape))


class BlockColumns:
    """Numpy views of one decoded block, ready for taking rows.

    Parameters
    ----------
    schema : Schema
        The snapshot's schema.
    batch : pyarrow.RecordBatch
        The decoded block; its buffers stay referenced by the views.
    """

    def __init__(self, schema: Schema, batch: pa.RecordBatch) -> None:
        self.schema = schema
        self.rows = batch.num_rows
        self._columns: dict[str, Any] = {}
        for field, column in zip(schema.fields, batch.columns):
            self._add(field, field.name, column)
        self._nested = schema.flat() is not schema

    def _add(self, field: Field, key: str, column: pa.Array) -> None:
        """Views of a field under the keys of :meth:`Schema.flat`: nested fields by dotted
        path, and the validity of a masked field as ``<key>_valid``."""
        if field.kind == "struct":
            for i, child in enumerate(field.fields):
                self._add(child, f"{key}.{child.name}", column.field(i))
        else:
            self._columns[key] = self._view(field, column)
        if field.masked:
            self._columns[f"{key}_valid"] = _validity(column)

    @staticmethod
    def _view(field: Field, column: pa.Array) -> Any:
        if field.kind in ("str", "bytes", "list"):
            return column
        if field.kind != "array":
            return _numpy(column)
        if not field.fixed:
            return _Ragged(field, column)
        storage = field.storage_shape()
        flat = _numpy(_values(column)) if storage else _numpy(column)
        view = flat.reshape((len(column), *storage))  # type: ignore[arg-type]
        if field.np_dtype.kind == "c":
            view = view.view(field.np_dtype).reshape((len(column), *(field.shape or ())))  # type: ignore[arg-type]
        return view

    def column(self, name: str) -> Any:
        """The whole-block view of a column of :meth:`Schema.flat`: an ndarray for fixed-shape
        and scalar numeric fields and for ``<name>_valid`` masks."""
        return self._columns[name]

    def sample(self, row: int) -> dict[str, Any]:
        """One row as a sample dict (arrays are views into the block; None where null)."""
        if self._nested:
            return self._row(self.schema.fields, "", row)
        out: dict[str, Any] = {}
        for field in self.schema.fields:
            col = self._columns[field.name]
            if isinstance(col, _Ragged):
                out[field.name] = col.row(row)
            elif isinstance(col, np.ndarray):
                value = col[row]
                out[field.name] = value.item() if field.kind != "array" else value
            else:
                out[field.name] = col[row].as_py()
        return out

    def field_values(self, field: Field) -> list[Any]:
        """The values of one top-level field, row by row, as :meth:`sample` gives them."""
        return [self._row((field,), "", row)[field.name] for row in range(self.rows)]

    def _row(self, fields: Sequence[Field], prefix: str, row: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in fields:
            key = prefix + field.name
            if field.masked and not self._columns[f"{key}_valid"][row]:
                out[field.name] = None
            elif field.kind == "struct":
                out[field.name] = self._row(field.fields, f"{key}.", row)
            elif field.kind in ("str", "bytes", "list"):
                out[field.name] = self._columns[key][row].as_py()
            elif field.kind == "array" and not field.fixed:
                out[field.name] = self._columns[key].row(row)
            else:
                value = self._columns[key][row]
                out[field.name] = value.item() if field.kind != "array" else value
        return out


def _validity(column: pa.Array) -> np.ndarray[Any, Any]:
    """Which rows of a column are not null, as a bool array."""
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    valid: np.ndarray[Any, Any] = column.is_valid().to_numpy(zero_copy_only=False)
    return valid


def gather(
    schema: Schema,
    blocks: Sequence[BlockColumns],
    which: np.ndarray[Any, Any],
    rows: np.ndarray[Any, Any],
) -> dict[str, Any]:
    """Sample ``i`` is row ``rows[i]`` of ``blocks[which[i]]``: assemble them, in order, by the
    columns of ``schema.flat()`` (nested fields by dotted path, ``<name>_valid`` masks; see
    :func:`nest_batch` for the batch's final shape).

    Fixed-shape and scalar numeric fields come back stacked as one ndarray; varying-shape arrays
    as a :class:`~snapstore.format.ragged.RaggedRows` (the rows' bounds in the blocks, sliced and
    taken as views, packed or padded batch by batch); str and bytes as lists. Called once per
    shuffle window, so its per-call work is amortized over thousands of samples. Fields with large
    rows come back as a :class:`RowCopy`, to be sliced and copied batch by batch: a window-sized
    copy would be a fresh allocation of tens of MB, paid in page faults every window.
    """
    out: dict[str, Any] = {}
    for field in schema.flat().fields:
        cols = [b.column(field.name) for b in blocks]
        if field.kind in ("str", "bytes", "list"):
            out[field.name] = gather_objects(cols, which, rows)
        elif field.kind == "array" and not field.fixed:
            out[field.name] = RaggedRows(field, cols, which, rows)
        elif not cols:
            out[field.name] = np.empty((0, *(field.shape or ())), dtype=field.np_dtype)
        elif len(cols) == 1:
            out[field.name] = _take_rows(cols[0], rows)
        elif cols[0].strides[0] >= ROW_COPY_BYTES:
            out[field.name] = RowCopy(cols, which, rows)
        else:
            starts = np.cumsum([0] + [len(c) for c in cols[:-1]])
            out[field.name] = np.concatenate(cols)[starts[which] + rows]
    return out


def gather_objects(
    cols: list[Any], which: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
) -> list[Any]:
    """Python values of str, bytes and list fields: Arrow ``take`` per block, in sample order."""
    items: list[Any] = [None] * len(rows)
    for k, col in enumerate(cols):
        positions = np.flatnonzero(which == k)
        values = col.take(pa.array(rows[positions])).to_pylist()
        for pos, value in zip(positions.tolist(), values):
            items[pos] = value
    return items


def nest_batch(schema: Schema, batch: dict[str, Any], ragged: str) -> dict[str, Any]:
    """A batch assembled from the columns of ``schema.flat()``, shaped like the samples: a nested
    dict's fields as a dict of batch columns (their ``_valid`` masks and ragged extras beside
    them, ``<name>_valid`` of the dict itself beside the dict), and, with ``ragged="list"``,
    None for the null rows of a varying-shape field (in place of a mask). ``batch`` itself
    when the schema has no nested or nullable field (every format version 1 schema)."""
    if schema.flat() is schema:
        return batch
    if ragged == "list":
        _none_rows(schema.fields, "", batch)
    return _nest(schema.fields, batch)


def _none_rows(fields: Sequence[Field], prefix: str, batch: dict[str, Any]) -> None:
    for f in fields:
        key = prefix + f.name
        if f.kind == "struct":
            _none_rows(f.fields, f"{key}.", batch)
        elif f.masked and f.kind == "array" and not f.fixed:
            valid = batch.pop(f"{key}_valid").tolist()
            batch[key] = [a if ok else None for a, ok in zip(batch[key], valid)]


def _nest(fields: Sequence[Field], flat: dict[str, Any]) -> dict[str, Any]:
    structs = [f for f in fields if f.kind == "struct"]
    if not structs:
        return flat
    out: dict[str, Any] = {}
    for key, value in flat.items():  # keys keep their order; a dict sits where its first key was
        owner = next((f for f in structs if key.startswith(f"{f.name}.")), None)
        if owner is None:
            out[key] = value
        else:
            out.setdefault(owner.name, {})[key[len(owner.name) + 1 :]] = value
    for f in structs:
        out[f.name] = _nest(f.fields, out[f.name])
    return out


# Rows at least this large are copied one by one straight into place: one pass over memory.
# A fancy-index gather then scatter makes two, and is 2.5x slower once blocks are out of cache.
ROW_COPY_BYTES = 1024


class RowCopy:
    """Rows of several blocks, not yet copied: slice it, then :meth:`materialize` the slice."""

    def __init__(
        self,
        cols: list[np.ndarray[Any, Any]],
        which: np.ndarray[Any, Any],
        rows: np.ndarray[Any, Any],
    ) -> None:
        self.cols, self.which, self.rows = cols, which, rows

    def __getitem__(self, part: slice) -> RowCopy:
        return RowCopy(self.cols, self.which[part], self.rows[part])

    def materialize(self) -> np.ndarray[Any, Any]:
        """The rows stacked into one new array."""
        return _copy_rows(self.cols, self.which, self.rows)


def _copy_rows(
    cols: list[np.ndarray[Any, Any]], which: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    result = np.empty((len(rows), *cols[0].shape[1:]), dtype=cols[0].dtype)
    # memoryview slice assignment is a bare memcpy: ~25% cheaper per row than ndarray assignment
    size = result.strides[0]
    out = memoryview(result.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    sources = [memoryview(c.reshape(-1).view(np.uint8)) for c in cols]  # type: ignore[arg-type]
    for pos, (w, row) in enumerate(zip(which.tolist(), rows.tolist())):
        out[pos * size : (pos + 1) * size] = sources[w][row * size : (row + 1) * size]
    return result


def _take_rows(col: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Rows of one block: a zero-copy slice when they are contiguous and ascending."""
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows) and np.all(np.diff(rows) == 1):
        return col[rows[0] : rows[-1] + 1]
    taken: np.ndarray[Any, Any] = col[rows]
    return taken


# --- columnar input: a batch of samples given as one column per field -----------------------

# 1-D numpy columns of these dtypes hold the Python kinds int, float and bool, as a Python stage
# would yield them; 1-D columns of other dtypes hold rank-0 arrays (numpy scalars).
_PYTHON_KINDS = {np.dtype("int64"): "int", np.dtype("float64"): "float", np.dtype("bool"): "bool"}


def normalize_columns(columns: Any) -> tuple[dict[str, Any], int]:
    """Columns as ``{name: ndarray or list}`` and their common length; an Arrow table or record
    batch of primitive, string, binary and fixed-size list columns is converted, and so are
    torch tensors and other array-likes, as columns or as the items of a list column.

    Raises
    ------
    SchemaError
        If a name is not a str, a column is not an array, array-like or list, or lengths differ.
    """
    if isinstance(columns, (pa.Table, pa.RecordBatch)):
        columns = {
            name: _from_arrow(name, col) for name, col in zip(columns.column_names, columns.columns)
        }
    if not isinstance(columns, Mapping):
        raise SchemaError(
            f"add_batch expects a mapping of field name to column (numpy array or list) or a "
            f"pyarrow Table; found {type(columns).__name__}"
        )
    out: dict[str, Any] = {}
    for name, col in columns.items():
        if not isinstance(name, str):
            raise SchemaError(f"batch column names must be str, found {name!r}")
        if not isinstance(col, (np.ndarray, list, tuple)):
            col = as_numpy(col, name)
        if isinstance(col, np.ndarray) and col.ndim == 0:
            raise SchemaError(
                f"batch column {name!r} is a 0-d array; expected one value per row (leading "
                "dimension = rows). Yield a dict for a single sample."
            )
        if isinstance(col, np.ndarray):
            out[name] = convert_values(list(col), name) if col.dtype == object else col
        elif isinstance(col, (list, tuple)):
            out[name] = convert_values(list(col), name)
        else:
            raise SchemaError(
                f"batch column {name!r} is a {type(columns[name]).__name__}; expected a numpy "
                "array or tensor (leading dimension = rows) or a list of per-row values"
            )
        if out[name] is not col and isinstance(col, np.ndarray) and col.ndim != 1:
            raise SchemaError(f"batch column {name!r}: an object array must be 1-D")
    lengths = {name: len(col) for name, col in out.items()}
    if len(set(lengths.values())) > 1:
        raise SchemaError(
            f"batch columns have different lengths {lengths}; every column needs one value per "
            "row. Slice them to the same number of rows."
        )
    return out, next(iter(lengths.values()), 0)


def _from_arrow(name: str, col: Any) -> Any:
    array = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    kind = array.type
    if array.null_count or pa.types.is_struct(kind):
        return array.to_pylist()  # None and nested dicts as the Python values a stage yields
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if _is_number(kind.value_type) and not array.values.null_count:
            offsets = array.offsets.to_numpy()
            flat = array.flatten().to_numpy(zero_copy_only=False)
            return np.split(flat, offsets[1:-1] - offsets[0])  # 1-D arrays of the list's dtype
        return array.to_pylist()
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        return array.to_pylist()
    if _is_number(kind):
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(kind) and (
        pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)
    ):
        flat = array.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(array), kind.list_size)
    raise SchemaError(
        f"column {name!r}: Arrow type {kind} is not supported by add_batch; pass a mapping of "
        "numpy arrays and lists instead (varying-shape arrays as a list of arrays)"
    )


def _is_number(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    )


def column_rows(column: Any) -> list[Any]:
    """The per-row values that :meth:`SnapshotWriter.add` would receive for a column."""
    if isinstance(column, np.ndarray):
        if column.ndim == 1 and column.dtype in _PYTHON_KINDS:
            return column.tolist()  # type: ignore[no-any-return]
        return list(column)
    return list(column)


def row_sizes(column: Any) -> np.ndarray[Any, Any]:
    """Per-row byte counts of a column, as the writer counts them for a sample."""
    if isinstance(column, np.ndarray):
        size = column.dtype.itemsize * math.prod(column.shape[1:]) if column.ndim > 1 else 8
        return np.full(len(column), size, dtype=np.int64)
    return np.fromiter(map(_value_nbytes, column), dtype=np.int64, count=len(column))


def _value_nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (str, bytes)):
        return len(value) + 8
    if isinstance(value, (list, tuple)):
        return 8 * len(value) + 8
    if isinstance(value, dict):
        return sum(map(_value_nbytes, value.values()))
    return 8


def infer_columns(columns: Mapping[str, Any], first: int) -> Schema:
    """The schema that :func:`infer_schema` gives for the rows of ``columns``."""
    fields = []
    for name, col in columns.items():
        if isinstance(col, np.ndarray) and col.ndim == 1 and col.dtype in _PYTHON_KINDS:
            fields.append(Field(name, _PYTHON_KINDS[col.dtype]))  # type: ignore[arg-type]
        elif isinstance(col, np.ndarray):
            dtype = check_dtype(col.dtype, name)
            fields.append(Field(name, "array", dtype.name, tuple(col.shape[1:])))
        else:
            fields.append(infer_schema([{name: v} for v in col], first, resolved=False).fields[0])
    return Schema(tuple(fields))


def conform_columns(schema: Schema, columns: Mapping[str, Any], first: int) -> dict[str, Any]:
    """Check columns against ``schema`` and bring them to the form :func:`batch_from_columns`
    takes: ndarrays for scalar kinds and fixed arrays, lists for str, bytes and varying arrays.

    Raises
    ------
    SchemaError
        Naming the field, what the schema expects, what the batch holds and what to do.
    """
    check_keys({f.name: f for f in schema.fields}, columns, first)
    return {f.name: _conform(f, columns[f.name], first) for f in schema.fields}


def _conform(field: Field, col: Any, first: int) -> Any:
    if isinstance(col, np.ndarray):
        want = (field.dtype, tuple(field.shape or ())) if field.kind == "array" else None
        dtype = check_dtype(col.dtype, field.name)
        found = (dtype.name, tuple(col.shape[1:]))
        if field.kind in ("int", "float", "bool") and found == (_PYTHON_DTYPE[field.kind], ()):
            return np.asarray(col, dtype=_PYTHON_DTYPE[field.kind])
        if field.fixed and found == want:
            return np.asarray(col, dtype=field.np_dtype)
        if field.kind == "array" and not field.fixed and dtype.name == field.dtype:
            return _conform(field, list(col), first)
        raise _column_error(field, dtype, tuple(col.shape[1:]), first)
    fast = fast_check(field)
    bad = [i for i, v in enumerate(col) if not fast(v)]
    for i in bad:  # the slow check names the sample; what it accepts is converted below
        check_sample(Schema((field,)), {field.name: col[i]}, first + i)
    if field.kind in _PYTHON_DTYPE and not field.nullable:
        return np.array(col, dtype=_PYTHON_DTYPE[field.kind]).reshape(len(col))
    if field.kind != "array":
        return col  # str, bytes, lists of them, nested dicts, nullable scalars: a list
    if bad:  # accepted by the slow check: e.g. arrays in another byte order, made native here
        col = [np.asarray(v, field.np_dtype) if isinstance(v, np.ndarray) else v for v in col]
    if field.fixed and not field.nullable:
        shape = (len(col), *(field.shape or ()))
        return np.stack(col) if col else np.empty(shape, field.np_dtype)
    return col


_PYTHON_DTYPE = {"int": "int64", "float": "float64", "bool": "bool"}


def _column_error(field: Field, dtype: Any, shape: tuple[int, ...], first: int) -> SchemaError:
    want = _PYTHON_DTYPE.get(field.kind, field.dtype)
    if field.kind in ("str", "bytes", "list", "struct"):
        todo = "pass a list of its per-row values"
    elif dtype.name != want:
        todo = f"convert it with column.astype(np.{want})"
    else:
        rows = ", ".join(["rows", *("*" if d is None else str(d) for d in field.shape or ())])
        todo = f"give it the shape ({rows})"
    return SchemaError(
        f"field {field.name!r}: the batch starting at sample {first} holds a numpy column of "
        f"{dtype}{list(shape)} per row but the schema says {field.describe()}; {todo}, or "
        f"{DECLARE_HINT}"
    )


def batch_from_columns(schema: Schema, columns: Mapping[str, Any]) -> pa.RecordBatch:
    """One record batch from columns made by :func:`conform_columns` (sliced to a block)."""
    arrays = [column_array(f, columns[f.name]) for f in schema.fields]
    return pa.RecordBatch.from_arrays(arrays, schema=schema.arrow_schema())
