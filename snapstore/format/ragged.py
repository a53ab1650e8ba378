"""Varying-shape fields of a batch: rows taken from decoded blocks, then views, packed or padded.

A decoded block holds a varying-shape field as one flat values buffer plus offsets (and, for
rank > 1, one shape per row): :class:`RaggedRows` keeps a chunk's rows as (block, start, stop)
without copying anything, and a batch's slice of it becomes one of the forms of
:meth:`snapstore.Snapshot.batches`'s ``ragged=``:

- ``"list"``: one read-only ndarray view into the blocks per sample (no copy);
- ``"packed"``: the batch's values copied into one flat buffer, with int64 offsets (and shapes),
  gathered with one ``memcpy`` per row and no Python object per row; this is what crosses a
  process boundary as one buffer instead of one per sample;
- ``"pad"``: one zero-padded array and the true shapes.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from .schema import Field, Schema

__all__ = [
    "FORMS",
    "Packed",
    "RaggedRows",
    "check_form",
    "emit",
    "pack_arrays",
    "pad_into",
    "pad_ragged",
    "pad_shapes",
]

FORMS = ("list", "pad", "packed")
# The fields each form adds next to a varying-shape field ``name``, by suffix.
_EXTRA = {"list": (), "pad": ("_lengths",), "packed": ("_offsets", "_shapes")}


class Packed(NamedTuple):
    """A batch of one varying-shape field in one buffer.

    Sample ``i`` is ``values[offsets[i]:offsets[i + 1]]``, reshaped to ``shapes[i]`` when the
    field has more than one dimension (``shapes`` is None for 1-D fields).
    """

    values: np.ndarray[Any, Any]
    offsets: np.ndarray[Any, Any]
    shapes: np.ndarray[Any, Any] | None


class BlockRagged(Protocol):
    """A varying-shape column of one decoded block (``columns._Ragged``)."""

    values: np.ndarray[Any, Any]  # flat, in the stored dtype (complex as pairs of reals)
    offsets: np.ndarray[Any, Any]
    shapes: np.ndarray[Any, Any] | None  # stored shapes: complex fields end with a 2

    def row(self, i: int) -> np.ndarray[Any, Any]: ...


def check_form(schema: Schema, form: str) -> None:
    """Raise ``ValueError`` for an unknown form, or one that would add a field already there."""
    if form not in FORMS:
        raise ValueError(f"ragged: expected one of {FORMS}, found {form!r}")
    names = set(schema.names)
    for field in schema.fields:
        if field.kind != "array" or field.fixed:
            continue
        for suffix in _EXTRA[form]:
            if f"{field.name}{suffix}" in names:
                raise ValueError(
                    f"ragged={form!r} would add field {field.name + suffix!r}, which the "
                    "snapshot already has; use ragged='list'"
                )


class RaggedRows:
    """Rows of a varying-shape field, not yet copied: row ``i`` is row ``rows[i]`` of block
    ``cols[which[i]]``. Slice it, then take the slice as views, packed or padded.

    Made once per chunk (thousands of rows): the per-row bounds are computed here, block by
    block, so that a batch's slice costs no per-row Python work until its values are copied.
    """

    def __init__(
        self,
        field: Field,
        cols: Sequence[BlockRagged],
        which: np.ndarray[Any, Any],
        rows: np.ndarray[Any, Any],
    ) -> None:
        self.field, self.cols, self.which, self.rows = field, list(cols), which, rows
        n = len(rows)
        rank = len(field.storage_shape())
        self.shapes: np.ndarray[Any, Any] | None = None
        if not self.cols:
            self.starts = self.stops = np.empty(0, np.int64)
        elif len(self.cols) == 1:
            col = self.cols[0]
            self.starts = col.offsets[rows].astype(np.int64)
            self.stops = col.offsets[rows + 1].astype(np.int64)
            if rank > 1 and col.shapes is not None:
                self.shapes = col.shapes[rows].astype(np.int64)
        else:
            # The blocks' offsets (and shapes) end to end, indexed once: no pass per block.
            sizes = [len(c.offsets) for c in self.cols]
            at = np.cumsum([0, *sizes[:-1]])[which] + rows
            offsets = np.concatenate([c.offsets for c in self.cols]).astype(np.int64)
            self.starts, self.stops = offsets[at], offsets[at + 1]
            if rank > 1 and all(c.shapes is not None for c in self.cols):
                stored = [c.shapes for c in self.cols if c.shapes is not None]
                first = np.cumsum([0, *(len(s) for s in stored[:-1])])
                self.shapes = np.concatenate(stored).astype(np.int64)[first[which] + rows]
        if rank > 1 and self.shapes is None:
            self.shapes = np.zeros((n, rank), np.int64)
        self._flat = rank == 1 and field.np_dtype.kind != "c"  # a row is a bare slice

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, part: slice | np.ndarray[Any, Any]) -> RaggedRows:
        """The rows in ``part``: a slice, or an array of row numbers in any order."""
        sliced = RaggedRows.__new__(RaggedRows)
        sliced.field, sliced.cols = self.field, self.cols
        sliced.which, sliced.rows = self.which[part], self.rows[part]
        sliced.starts, sliced.stops = self.starts[part], self.stops[part]
        sliced.shapes = None if self.shapes is None else self.shapes[part]
        sliced._flat = self._flat
        return sliced

    @classmethod
    def join(cls, parts: Sequence[RaggedRows]) -> RaggedRows:
        """The rows of ``parts`` one after another (blocks of several chunks, or of several
        snapshots): only the rows' indices are joined, no value is copied."""
        joined = RaggedRows.__new__(RaggedRows)
        joined.field, joined._flat = parts[0].field, parts[0]._flat
        bases = np.cumsum([0, *(len(p.cols) for p in parts[:-1])])
        joined.cols = [c for p in parts for c in p.cols]
        joined.which = np.concatenate([p.which + b for p, b in zip(parts, bases, strict=True)])
        joined.rows = np.concatenate([p.rows for p in parts])
        joined.starts = np.concatenate([p.starts for p in parts])
        joined.stops = np.concatenate([p.stops for p in parts])
        shapes = [p.shapes for p in parts if p.shapes is not None]
        joined.shapes = np.concatenate(shapes) if len(shapes) == len(parts) else None
        return joined

    def arrays(self) -> list[np.ndarray[Any, Any]]:
        """The rows as read-only views into the blocks, one ndarray each."""
        cols = self.cols
        if self._flat:  # 1-D: slices made by C-level map calls, no Python statement per row
            return self._views()
        return [cols[w].row(r) for w, r in zip(self.which.tolist(), self.rows.tolist())]

    def _views(self) -> list[np.ndarray[Any, Any]]:
        """Each row's stored values, a slice of its block's values."""
        blocks = [c.values for c in self.cols]
        sources = map(blocks.__getitem__, self.which.tolist())
        bounds = map(slice, self.starts.tolist(), self.stops.tolist())
        views: list[np.ndarray[Any, Any]] = list(map(_slice, sources, bounds))
        return views

    def contiguous(self) -> bool:
        """Whether the rows lie one after another in one block (their values are one slice)."""
        return len(self.cols) == 1 and bool(np.array_equal(self.starts[1:], self.stops[:-1]))

    def fill_values(self, out: np.ndarray[Any, Any]) -> None:
        """Copy the rows' stored values one after another into ``out`` (1-D, of the stored
        dtype, ``sum(stops - starts)`` long): one ``np.concatenate`` into ``out``, whose copies
        run without the GIL; the per-row views are made by C-level ``map`` calls."""
        if not len(self.rows):
            return
        if self.contiguous():
            np.copyto(out, self.cols[0].values[int(self.starts[0]) : int(self.stops[-1])])
            return
        np.concatenate(self._views(), out=out)

    def pack(self) -> Packed:
        """The rows copied into one buffer: values, offsets and (rank > 1) shapes."""
        lengths = self.stops - self.starts
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        first = self.cols[0].values if self.cols else np.empty(0, self.field.storage_dtype())
        if self.contiguous():
            # consecutive rows of one block (an unshuffled read): a read-only view, no copy
            values = first[int(self.starts[0]) : int(self.stops[-1])] if len(lengths) else first[:0]
        elif len(lengths):
            # One concatenate of per-row slices: faster than a memcpy loop over memoryviews
            # (0.15 against 0.22 ms for 256 rows of ~300 int32 from 120 blocks).
            values = np.concatenate(self._views())
        else:
            values = first[:0].copy()
        return _from_storage(self.field, values, offsets, self.shapes)


_slice: Any = operator.getitem  # array[bounds]; typed loosely, as numpy's overloads confuse map


def _from_storage(
    field: Field,
    values: np.ndarray[Any, Any],
    offsets: np.ndarray[Any, Any],
    shapes: np.ndarray[Any, Any] | None,
) -> Packed:
    """Stored values (complex as pairs of reals) as the field's dtype."""
    if field.np_dtype.kind == "c":
        values, offsets = values.view(field.np_dtype), offsets // 2
        shapes = None if shapes is None else np.ascontiguousarray(shapes[:, :-1])
    if shapes is not None and shapes.shape[1] == 1:
        shapes = None  # a complex 1-D field: its stored shape was (n, 2)
    return Packed(values, offsets, shapes)


def pack_arrays(arrays: Sequence[np.ndarray[Any, Any]], field: Field) -> Packed:
    """A list of varying-shape arrays of ``field`` in one buffer (one copy)."""
    ndim = len(field.shape or ())
    sizes = np.fromiter((a.size for a in arrays), np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    flats = [np.asarray(a, field.np_dtype).reshape(-1) for a in arrays]
    values = np.concatenate(flats) if flats else np.empty(0, field.np_dtype)
    shapes = None
    if ndim > 1:
        shapes = np.array([a.shape for a in arrays], np.int64).reshape(len(arrays), ndim)
    return Packed(values, offsets, shapes)


def _concat(packs: Sequence[Packed]) -> Packed:
    """Packed batches one after the other (for a batch that straddles two chunks)."""
    if len(packs) == 1:
        return packs[0]
    ends = np.cumsum([0] + [int(p.offsets[-1]) for p in packs[:-1]])
    offsets = np.concatenate(
        [packs[0].offsets[:1]] + [p.offsets[1:] + e for p, e in zip(packs, ends)]
    )
    values = np.concatenate([p.values for p in packs])
    shapes = None
    if packs[0].shapes is not None:
        shapes = np.concatenate([p.shapes for p in packs if p.shapes is not None])
    return Packed(values, offsets - offsets[0], shapes)


def pad_ragged(
    arrays: list[np.ndarray[Any, Any]], field: Field
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Zero-pad a batch of varying-shape arrays to their largest shape.

    Returns the padded array ``(batch, *max_shape)`` and the true shapes: ``(batch,)`` lengths
    for 1-D fields, ``(batch, ndim)`` for higher ranks.
    """
    shapes, top = pad_shapes(arrays, field)
    padded = np.zeros((len(arrays), *top), dtype=field.np_dtype)
    pad_into(arrays, padded)
    return padded, shapes[:, 0].copy() if shapes.shape[1] == 1 else shapes


def pad_shapes(
    arrays: Sequence[np.ndarray[Any, Any]], field: Field
) -> tuple[np.ndarray[Any, Any], tuple[int, ...]]:
    """The arrays' shapes, int64 ``(batch, ndim)``, and the largest shape, to pad them to."""
    ndim = len(field.shape or ())
    shapes = np.array([a.shape for a in arrays], dtype=np.int64).reshape(len(arrays), ndim)
    top = shapes.max(axis=0) if len(arrays) else np.zeros(ndim, np.int64)
    return shapes, tuple(top.tolist())


def pad_into(arrays: Sequence[np.ndarray[Any, Any]], padded: np.ndarray[Any, Any]) -> None:
    """Copy each array into the corner of its row of ``padded`` (already zeroed)."""
    for out, a in zip(padded, arrays):
        out[tuple(slice(0, n) for n in a.shape)] = a


def emit(field: Field, parts: Sequence[RaggedRows], form: str, batch: dict[str, Any]) -> None:
    """Put a batch's rows of ``field`` (the slices ``parts``, in order) into ``batch`` in the
    form ``form``, with the fields that form adds (see :func:`check_form`)."""
    name = field.name
    if form == "packed":
        packed = _concat([p.pack() for p in parts])
        batch[name] = packed.values
        batch[f"{name}_offsets"] = packed.offsets
        if packed.shapes is not None:
            batch[f"{name}_shapes"] = packed.shapes
        return
    arrays = [a for p in parts for a in p.arrays()]
    if form == "pad":
        batch[name], batch[f"{name}_lengths"] = pad_ragged(arrays, field)
    else:
        batch[name] = arrays


def inner_size(field: Field) -> int | None:
    """Elements per leading row when only the first dimension varies (``(None, 3)`` gives 3),
    else None."""
    shape = field.shape or ()
    if not shape or shape[0] is not None or None in shape[1:]:
        return None
    return math.prod(int(d) for d in shape[1:] if d is not None)
