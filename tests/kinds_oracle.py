"""Helpers for the sample-kind tests: write samples as rows or columns, compare read-back values
exactly (types included), and take shuffled batches apart into per-sample rows again."""

from __future__ import annotations

from typing import Any

import numpy as np

import snapstore
from snapstore.format.plan import PlanOptions
from snapstore.format.schema import Field, Schema
from snapstore.read.batches import RAGGED_FORMS
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import Store
from snapstore.write.writer import SnapshotWriter, WriteOptions

# Every form of varying-shape fields the installed BatchReader offers ("list", "pad", ...).
FORMS = tuple(RAGGED_FORMS)


def write_rows(
    store: Store, samples: list[dict[str, Any]], schema: Schema | None = None, **options: Any
) -> SnapshotReader:
    """``samples`` through ``SnapshotWriter.add``, in blocks of ``block_min_rows`` (default 1)."""
    options.setdefault("block_min_rows", 1)
    options.setdefault("block_bytes", 1)
    writer = SnapshotWriter(store, "fp", schema=schema, options=WriteOptions(**options))
    try:
        for sample in samples:
            writer.add(sample)
    except BaseException:
        writer.abort()  # as snapshot() does: no run directory or encode threads left behind
        raise
    assert writer.commit()
    return SnapshotReader(store, "fp")


def write_columns(
    store: Store,
    samples: list[dict[str, Any]],
    chunk: int,
    schema: Schema | None = None,
    **options: Any,
) -> SnapshotReader:
    """The same samples as ``snapstore.Columns`` of ``chunk`` rows (lists of the rows' values)."""
    options.setdefault("block_min_rows", 1)
    options.setdefault("block_bytes", 1)
    writer = SnapshotWriter(store, "fp", schema=schema, options=WriteOptions(**options))
    try:
        for start in range(0, len(samples), chunk):
            rows = samples[start : start + chunk]
            writer.add(snapstore.Columns({k: [r[k] for r in rows] for k in rows[0]}))
    except BaseException:
        writer.abort()
        raise
    assert writer.commit()
    return SnapshotReader(store, "fp")


def assert_same(got: Any, want: Any, where: str) -> None:
    """Equal values of the same types: arrays of the same dtype and shape, nan equal to nan."""
    if want is None:
        assert got is None, f"{where}: {got!r} is not None"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{where}: {got!r}"
        for k in want:
            assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert type(got) is list and len(got) == len(want), f"{where}: {got!r} vs {want!r}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: {got!r} is not an array"
        assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{where}: {got!r} {want!r}"
        np.testing.assert_array_equal(got, want, err_msg=where)
    else:
        same = got == want or (got != got and want != want)  # nan
        assert type(got) is type(want) and same, f"{where}: {got!r} vs {want!r}"


def batch_rows(reader: SnapshotReader, form: str, batch_size: int) -> dict[int, dict[str, Any]]:
    """Every sample of a shuffled epoch, taken back out of its batch, by sample index."""
    options = PlanOptions(shuffle=True, seed=7, window_blocks=2)
    batches = snapstore.BatchReader(reader, batch_size, options=options, ragged=form)
    chunks = list(batches.plan.chunks(0))
    order = np.concatenate(chunks).tolist() if chunks else []
    rows: dict[int, dict[str, Any]] = {}
    position = 0
    for batch in batches:
        size = min(batch_size, len(order) - position)
        for j in range(size):
            rows[order[position + j]] = row_of(batch, reader.schema.fields, j, form)
        position += size
    return rows


def row_of(batch: dict[str, Any], fields: tuple[Field, ...], j: int, form: str) -> dict[str, Any]:
    """Row ``j`` of a batch (or of a nested dict's columns), as ``snap[i]`` gives it."""
    out: dict[str, Any] = {}
    for f in fields:
        valid = batch.get(f"{f.name}_valid") if f.masked else None
        if valid is not None and not valid[j]:
            out[f.name] = None
        elif f.kind == "struct":
            out[f.name] = row_of(batch[f.name], f.fields, j, form)
        elif f.kind == "array" and not f.fixed:
            out[f.name] = _ragged_row(batch, f, j, form)
        elif f.kind in ("int", "float", "bool"):
            out[f.name] = batch[f.name][j].item()
        else:
            out[f.name] = batch[f.name][j]
    return out


def _ragged_row(batch: dict[str, Any], f: Field, j: int, form: str) -> Any:
    name = f.name
    if form == "list":
        return batch[name][j]
    if form == "pad":
        lengths = np.atleast_1d(batch[f"{name}_lengths"][j])
        return batch[name][j][tuple(slice(0, int(n)) for n in lengths)]
    offsets = batch[f"{name}_offsets"]
    values = batch[name][offsets[j] : offsets[j + 1]]
    shapes = batch.get(f"{name}_shapes")
    return values if shapes is None else values.reshape(tuple(shapes[j]))
