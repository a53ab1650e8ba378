"""Batches assembled from decoded blocks by copies in C, into arrays allocated for each batch.

A chunk of samples (sample ``i`` is row ``rows[i]`` of block ``which[i]``) is prepared once by
:func:`chunk_rows`: per field of :meth:`Schema.flat`, the rows' places in the blocks, nothing
copied yet (str, bytes and list fields excepted: their Python values are taken with Arrow's
``take``). :class:`BatchBuilder` then makes each batch from a run of rows (of one chunk, or the
end of one and the start of the next) in two steps:

1. it works out every array the batch needs (shape and dtype: one per fixed-shape or numeric
   field and mask; values, offsets and shapes per packed varying field; padded values and
   lengths per padded one) and asks ``allocate`` for all of them at once, so an allocator can
   put a whole batch in one buffer (one shared-memory segment for a DataLoader worker);
2. it copies the rows straight into those arrays with numpy calls that release the GIL:
   ``np.take(..., out=)`` for rows of one block or small rows, ``np.concatenate(..., out=)``
   over per-row views (made by C-level ``map`` calls) for large rows of several blocks and for
   varying-shape values. One pass over the bytes, no Python statement per row.

Without an allocator, a batch whose rows are consecutive rows of one block is a read-only view
of it (an unshuffled read), as before; with one, every array is the allocator's.
"""

from __future__ import annotations

import collections
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..format.columns import ROW_COPY_BYTES, BlockColumns, gather_objects, nest_batch
from ..format.ragged import RaggedRows, pad_into, pad_shapes
from ..format.schema import Field, Schema

__all__ = [
    "Allocate",
    "BatchBuilder",
    "FixedRows",
    "Spec",
    "allocate_arrays",
    "chunk_rows",
    "cut_rows",
    "interleave",
]

Spec = tuple[tuple[int, ...], np.dtype[Any]]
"""The shape and dtype of one array of a batch."""
Allocate = Callable[[Sequence[Spec]], list[np.ndarray[Any, Any]]]
"""``allocate(specs)``: one new, writable, C-contiguous array per spec, in order."""
Part = tuple[dict[str, Any], int, int]  # (a chunk's rows by field, start, stop)
_Fill = Callable[[list[np.ndarray[Any, Any]]], None]


def cut_rows(pieces: collections.deque[list[Any]], size: int) -> list[Part]:
    """The next ``size`` rows of ``pieces`` (``[chunk rows, start, stop]`` each, consumed from
    the left: a piece's start advances, a used-up piece is dropped), as (chunk rows, start,
    stop) runs for :meth:`BatchBuilder.build`."""
    parts: list[Part] = []
    while size:
        piece = pieces[0]
        chunk, start, stop = piece
        count = min(size, stop - start)
        parts.append((chunk, start, start + count))
        piece[1] += count
        size -= count
        if piece[1] == stop:
            pieces.popleft()
    return parts


def allocate_arrays(specs: Sequence[Spec]) -> list[np.ndarray[Any, Any]]:
    """The default allocator: ``np.empty`` per array."""
    return [np.empty(shape, dtype) for shape, dtype in specs]


class FixedRows:
    """A chunk's rows of a fixed-shape or scalar numeric field (or a ``_valid`` mask).

    Rows of one block are taken from it with ``np.take``; small rows (under 1 KiB) of several
    blocks from the blocks' columns concatenated once per chunk (a few bytes a row); large rows
    of several blocks (images) are copied from per-row views by one ``np.concatenate``.
    """

    def __init__(
        self,
        field: Field,
        cols: Sequence[np.ndarray[Any, Any]],
        which: np.ndarray[Any, Any],
        rows: np.ndarray[Any, Any],
    ) -> None:
        self.field, self.count = field, len(rows)
        self.dtype = cols[0].dtype if cols else field.np_dtype
        shape = cols[0].shape[1:] if cols else (field.shape or ())
        self.row_shape = tuple(int(d or 0) for d in shape)
        self.view: np.ndarray[Any, Any] | None = None  # the rows, when one slice of a block
        self.source: np.ndarray[Any, Any] | None = None
        self.index = rows
        self.cols, self.which, self.rows = list(cols), which, rows
        if len(cols) == 1:
            self.source = cols[0]
            if len(rows) and rows[-1] - rows[0] + 1 == len(rows) and np.all(np.diff(rows) == 1):
                self.view = cols[0][rows[0] : rows[-1] + 1]
        elif cols and cols[0].strides[0] < ROW_COPY_BYTES:
            starts = np.cumsum([0] + [len(c) for c in cols[:-1]])
            self.source, self.index = np.concatenate(cols), starts[which] + rows

    @classmethod
    def join(
        cls, runs: Sequence[tuple[FixedRows, int, int]], order: np.ndarray[Any, Any]
    ) -> FixedRows:
        """Rows ``a:b`` of each run, one after another, in ``order`` (see :func:`interleave`)."""
        first = runs[0][0]
        size = first.dtype.itemsize * math.prod(first.row_shape)
        if size < ROW_COPY_BYTES:
            values = np.empty((sum(b - a for _, a, b in runs), *first.row_shape), first.dtype)
            at = 0
            for rows, a, b in runs:
                rows.fill(a, b, values[at : at + b - a])
                at += b - a
            ordered = values[order]
            return cls(first.field, [ordered], np.zeros(len(order), np.intp), np.arange(len(order)))
        bases = np.cumsum([0, *(len(rows.cols) for rows, _, _ in runs[:-1])])
        cols = [c for rows, _, _ in runs for c in rows.cols]
        which = np.concatenate(
            [r.which[a:b] + base for (r, a, b), base in zip(runs, bases, strict=True)]
        )
        rows_ = np.concatenate([r.rows[a:b] for r, a, b in runs])
        return cls(first.field, cols, which[order], rows_[order])

    def fill(self, start: int, stop: int, out: np.ndarray[Any, Any]) -> None:
        """Copy rows ``start:stop`` into ``out`` (``stop - start`` rows)."""
        if stop <= start:
            return
        if self.view is not None:
            np.copyto(out, self.view[start:stop])
        elif self.source is not None:
            np.take(self.source, self.index[start:stop], axis=0, out=out, mode="clip")
        else:
            sources = map(self.cols.__getitem__, self.which[start:stop].tolist())
            views = list(map(operator.getitem, sources, self.rows[start:stop].tolist()))
            np.concatenate(views, axis=None, out=out.reshape(-1))


def interleave(parts: Sequence[Part], order: np.ndarray[Any, Any]) -> dict[str, Any]:
    """One chunk of the rows of ``parts`` (taken one after another) put in ``order``: its row
    ``k`` is their row ``order[k]``.

    The parts may come from different snapshots (a mixture's sources). Only the rows' indices
    are joined and permuted, so :meth:`BatchBuilder.build` then copies each large row once,
    straight to its place; rows under ``ROW_COPY_BYTES`` are gathered here first, as their
    copies are cheap and a gather over several chunks' blocks is not.
    """
    out: dict[str, Any] = {}
    for name, first in parts[0][0].items():
        runs = [(c[name], a, b) for c, a, b in parts]
        if isinstance(first, RaggedRows):
            out[name] = RaggedRows.join([rows[a:b] for rows, a, b in runs])[order]
        elif isinstance(first, FixedRows):
            out[name] = FixedRows.join(runs, order)
        else:
            values = [v for rows, a, b in runs for v in rows[a:b]]
            out[name] = [values[k] for k in order.tolist()]
    return out


def chunk_rows(
    schema: Schema,
    blocks: Sequence[BlockColumns],
    which: np.ndarray[Any, Any],
    rows: np.ndarray[Any, Any],
) -> dict[str, Any]:
    """A chunk's rows by field of ``schema.flat()``: :class:`FixedRows`,
    :class:`~snapstore.format.ragged.RaggedRows`, or a list of Python values (str, bytes, lists)."""
    out: dict[str, Any] = {}
    for field in schema.flat().fields:
        cols = [b.column(field.name) for b in blocks]
        if field.kind in ("str", "bytes", "list"):
            out[field.name] = gather_objects(cols, which, rows)
        elif field.kind == "array" and not field.fixed:
            out[field.name] = RaggedRows(field, cols, which, rows)
        else:
            out[field.name] = FixedRows(field, cols, which, rows)
    return out


class BatchBuilder:
    """Make batches of runs of chunk rows (see the module docstring).

    Parameters
    ----------
    schema : Schema
        The snapshot's schema.
    form : {"list", "pad", "packed"}
        The form of varying-shape fields.
    allocate : callable, optional
        Where the batch's arrays go (:data:`Allocate`); default ``np.empty`` per array, and
        read-only views of a block where a batch's rows are one slice of it.
    """

    def __init__(self, schema: Schema, form: str, allocate: Allocate | None = None) -> None:
        self.schema = schema
        self.fields = schema.flat().fields
        self.form = form
        self.views = allocate is None
        self.allocate: Allocate = allocate_arrays if allocate is None else allocate

    def build(self, parts: Sequence[Part]) -> dict[str, Any]:
        """The batch of ``parts`` (rows ``start:stop`` of each chunk, in order)."""
        parts = [p for p in parts if p[2] > p[1]]
        batch: dict[str, Any] = {}
        specs: list[Spec] = []
        fills: list[tuple[int, _Fill]] = []
        for field in self.fields:
            name = field.name
            first = parts[0][0][name]
            if isinstance(first, RaggedRows):
                self._ragged(field, [c[name][a:b] for c, a, b in parts], batch, specs, fills)
            elif isinstance(first, FixedRows):
                self._fixed(name, [(c[name], a, b) for c, a, b in parts], batch, specs, fills)
            else:
                batch[name] = [v for c, a, b in parts for v in c[name][a:b]]
        arrays = self.allocate(specs) if specs else []
        used = 0
        for count, fill in fills:
            fill(arrays[used : used + count])
            used += count
        return nest_batch(self.schema, batch, self.form)

    def _fixed(
        self,
        name: str,
        parts: list[tuple[FixedRows, int, int]],
        batch: dict[str, Any],
        specs: list[Spec],
        fills: list[tuple[int, _Fill]],
    ) -> None:
        rows, a, b = parts[0]
        if self.views and len(parts) == 1 and rows.view is not None:
            batch[name] = rows.view[a:b]
            return
        specs.append(((sum(b - a for _, a, b in parts), *rows.row_shape), rows.dtype))
        batch[name] = None  # its place among the keys

        def fill(arrays: list[np.ndarray[Any, Any]]) -> None:
            out, at = arrays[0], 0
            for rows, a, b in parts:
                rows.fill(a, b, out[at : at + b - a])
                at += b - a
            batch[name] = out

        fills.append((1, fill))

    def _ragged(
        self,
        field: Field,
        parts: list[RaggedRows],
        batch: dict[str, Any],
        specs: list[Spec],
        fills: list[tuple[int, _Fill]],
    ) -> None:
        if self.form == "list":
            batch[field.name] = [a for p in parts for a in p.arrays()]
        elif self.form == "pad":
            _pad(field, parts, batch, specs, fills)
        elif self.views and len(parts) == 1 and parts[0].contiguous():
            packed = parts[0].pack()  # a view of the block's values, no copy
            _put_packed(field.name, batch, packed.values, packed.offsets, packed.shapes)
        else:
            _packed(field, parts, batch, specs, fills)


def _put_packed(
    name: str,
    batch: dict[str, Any],
    values: Any,
    offsets: Any,
    shapes: Any,
) -> None:
    batch[name] = values
    batch[f"{name}_offsets"] = offsets
    if shapes is not None:
        batch[f"{name}_shapes"] = shapes


def _packed(
    field: Field,
    parts: list[RaggedRows],
    batch: dict[str, Any],
    specs: list[Spec],
    fills: list[tuple[int, _Fill]],
) -> None:
    """Values (stored dtype), offsets and shapes, copied into the batch's arrays."""
    lengths = np.concatenate([p.stops - p.starts for p in parts])
    count = len(lengths)
    complex_ = field.np_dtype.kind == "c"
    shapes = parts[0].shapes
    width = 0 if shapes is None else shapes.shape[1] - complex_
    specs.append(((int(lengths.sum()),), field.storage_dtype()))
    specs.append(((count + 1,), np.dtype(np.int64)))
    if width > 1:
        specs.append(((count, width), np.dtype(np.int64)))
    _put_packed(field.name, batch, None, None, None if width <= 1 else True)

    def fill(arrays: list[np.ndarray[Any, Any]]) -> None:
        values, offsets = arrays[0], arrays[1]
        at = 0
        for p in parts:
            size = int((p.stops - p.starts).sum())
            p.fill_values(values[at : at + size])
            at += size
        offsets[0] = 0
        np.cumsum(lengths // 2 if complex_ else lengths, out=offsets[1:])
        packed = values.view(field.np_dtype) if complex_ else values
        shapes_out = None
        if width > 1:
            shapes_out = arrays[2]
            stored = [p.shapes[:, :width] for p in parts if p.shapes is not None]
            np.concatenate(stored, out=shapes_out)
        _put_packed(field.name, batch, packed, offsets, shapes_out)

    fills.append((3 if width > 1 else 2, fill))


def _pad(
    field: Field,
    parts: list[RaggedRows],
    batch: dict[str, Any],
    specs: list[Spec],
    fills: list[tuple[int, _Fill]],
) -> None:
    """One zero-padded array and the true shapes (lengths for 1-D fields)."""
    arrays = [a for p in parts for a in p.arrays()]
    shapes, top = pad_shapes(arrays, field)
    lengths = shapes[:, 0] if shapes.shape[1] == 1 else shapes
    specs.append(((len(arrays), *top), field.np_dtype))
    specs.append((lengths.shape, np.dtype(np.int64)))
    name = field.name
    batch[name] = batch[f"{name}_lengths"] = None

    def fill(out: list[np.ndarray[Any, Any]]) -> None:
        out[0].fill(0)
        pad_into(arrays, out[0])
        np.copyto(out[1], lengths)
        batch[name], batch[f"{name}_lengths"] = out[0], out[1]

    fills.append((2, fill))
