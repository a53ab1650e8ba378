"""Batches assembled on the assembler thread (snapstore.read.assemble, snapstore.format.handoff)
equal what the former consumer-thread assembly made, exactly (types, dtypes, shapes, key order), for
every field kind and any seed, epoch, rank and worker split; and every sample in them equals
``sample(i)`` in the plan's order. Errors reach the consumer unchanged; closing mid-epoch stops the
threads."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kinds_oracle import FORMS, assert_same, row_of, write_rows
from test_sample_kinds_roundtrip import datasets

import snapstore
from snapstore.format.columns import RowCopy, gather, nest_batch
from snapstore.format.handoff import Handoff
from snapstore.format.plan import PlanOptions
from snapstore.format.ragged import RaggedRows, emit
from snapstore.read.assemble import BatchBuilder, allocate_arrays
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore

# -- the former assembly, kept here as the reference -------------------------------------------


def former_batches(batches: snapstore.BatchReader, start: int = 0) -> list[dict[str, Any]]:
    """What BatchReader yielded before issue 15: each chunk gathered once on the consumer's
    thread (columns.gather), batches sliced from it (the former ``_take``)."""
    reader, size = batches.reader, batches.batch_size
    prefetcher = reader.prefetch(batches.plan.chunks(start), first_part=size, budget_bytes=1 << 20)
    pieces: collections.deque[list[Any]] = collections.deque()
    buffered, out = 0, []
    for idx, decoded in prefetcher:
        blocks, rows = reader.locate(idx)
        unique, which = np.unique(blocks, return_inverse=True)
        pieces.append([gather(reader.schema, [decoded[int(b)] for b in unique], which, rows), 0])
        pieces[-1].append(len(idx))
        buffered += len(idx)
        while buffered >= size:
            buffered -= size
            out.append(_former_take(reader, pieces, size, batches.ragged))
    if buffered and not batches.options.drop_last:
        out.append(_former_take(reader, pieces, buffered, batches.ragged))
    return out


def _former_take(
    reader: SnapshotReader, pieces: collections.deque[list[Any]], size: int, form: str
) -> dict[str, Any]:
    parts = []
    while size:
        piece = pieces[0]
        columns, start, stop = piece
        count = min(size, stop - start)
        parts.append((columns, start, start + count))
        piece[1] += count
        size -= count
        if piece[1] == stop:
            pieces.popleft()
    batch: dict[str, Any] = {}
    for field in reader.schema.flat().fields:
        sliced = [columns[field.name][a:b] for columns, a, b in parts]
        if isinstance(sliced[0], RaggedRows):
            emit(field, sliced, form, batch)
            continue
        sliced = [p.materialize() if isinstance(p, RowCopy) else p for p in sliced]
        if len(sliced) == 1:
            batch[field.name] = sliced[0]
        elif isinstance(sliced[0], np.ndarray):
            batch[field.name] = np.concatenate(sliced)
        else:
            batch[field.name] = [item for part in sliced for item in part]
    return nest_batch(reader.schema, batch, form)


# -- every field kind, any split ---------------------------------------------------------------


@st.composite
def with_large_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    """The sample-kinds datasets, with rows of 1 KiB and more (copied from per-row views) and
    complex varying-shape arrays beside them, some of the time."""
    samples = draw(datasets())
    if draw(st.booleans()):
        for i, s in enumerate(samples):
            s["img"] = np.full((8, 8, 17), i, np.uint8)  # 1,088 bytes a row
            s["label"] = np.int32(i)  # a numpy-scalar label
    if draw(st.booleans()):
        for i, s in enumerate(samples):
            s["wave"] = np.arange(i % 4, dtype=np.complex64) * (1 + 1j) + i
    return samples


def check_split(reader: SnapshotReader, form: str, draw: st.DrawFn) -> None:
    options = PlanOptions(
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32)),
        window_blocks=draw(st.integers(1, 3)),
        drop_last=draw(st.booleans()),
    )
    world_size, num_workers = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    place = {"rank": draw(st.integers(0, world_size - 1)), "world_size": world_size}
    place |= {"worker": draw(st.integers(0, num_workers - 1)), "num_workers": num_workers}
    size = draw(st.integers(1, 6))
    batches = snapstore.BatchReader(
        reader, size, options=options, epoch=draw(st.integers(0, 3)), ragged=form, **place
    )
    start = draw(st.integers(0, batches.plan.num_samples))
    batches.set_state(batches.get_state() | {"position": start})
    got = list(batches)
    want = former_batches(batches, start)
    assert len(got) == len(want)
    order = np.concatenate(list(batches.plan.chunks(start)) or [np.empty(0, np.int64)])
    position = 0
    for k, (new, old) in enumerate(zip(got, want, strict=True)):
        assert_same(new, old, f"batch {k}, ragged={form}")
        count = min(size, len(order) - position)
        for j in range(count):
            i = int(order[position + j])
            assert_same(row_of(new, reader.schema.fields, j, form), reader.sample(i), f"{i}")
        position += count
    assert batches.get_state()["position"] == start + position


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(samples=with_large_rows(), block_rows=st.sampled_from([1, 3]), data=st.data())
def test_batches_equal_the_former_assembly(
    tmp_path_factory: Any, samples: list[dict[str, Any]], block_rows: int, data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("assemble")
    # The schema all the samples show, declared: small first blocks could not tell it.
    whole = write_rows(LocalStore(root / "whole"), samples, block_min_rows=len(samples))
    reader = write_rows(LocalStore(root / "rows"), samples, whole.schema, block_min_rows=block_rows)
    check_split(reader, data.draw(st.sampled_from(FORMS)), data.draw)
    reader.close()
    whole.close()


def test_every_array_is_the_allocators(tmp_path: Any) -> None:
    """With an allocator every array of a batch is one it returned (none a view of a block, even
    unshuffled), all requested at once per batch; batches equal those without one."""
    samples = [
        {"img": np.full((4, 4, 3), i, np.uint8), "tok": np.arange(i % 5, dtype=np.int32), "n": i}
        for i in range(40)
    ]
    reader = write_rows(LocalStore(tmp_path), samples, block_min_rows=8)
    calls: list[list[np.ndarray]] = []

    def allocate(specs: Any) -> list[np.ndarray]:
        arrays = allocate_arrays(specs)
        calls.append(arrays)
        return arrays

    for form in ("packed", "pad"):
        for shuffle in (False, True):
            options = PlanOptions(shuffle=shuffle, window_blocks=2)
            plain = list(snapstore.BatchReader(reader, 16, options=options, ragged=form))
            calls.clear()
            given = snapstore.BatchReader(reader, 16, options=options, ragged=form)
            given.allocate = allocate
            got = list(given)
            assert len(calls) == len(got) == len(plain)
            for batch, arrays, want in zip(got, calls, plain, strict=True):
                assert [id(a) for a in batch.values()] == [id(a) for a in arrays]
                assert all(a.flags.writeable for a in batch.values())
                assert_same(batch, want, f"ragged={form}, shuffle={shuffle}")
    reader.close()


def test_lists_allocate_nothing(tmp_path: Any) -> None:
    """str fields and ragged='list' are lists: the allocator is never called for them."""
    samples = [{"s": str(i), "t": np.arange(i)} for i in range(9)]
    reader = write_rows(LocalStore(tmp_path), samples, block_min_rows=3)

    def allocate(specs: Any) -> list[np.ndarray]:
        raise AssertionError(f"allocated {specs}")

    options = PlanOptions(shuffle=True)
    batches = snapstore.BatchReader(reader, 4, options=options, allocate=allocate)
    order = np.concatenate(list(batches.plan.chunks(0))).tolist()
    assert [s for b in batches for s in b["s"]] == [str(i) for i in order]
    assert BatchBuilder(reader.schema, "list", allocate).views is False
    reader.close()


# -- threads and errors -------------------------------------------------------------------------


def _images(tmp_path: Any, n: int = 600) -> SnapshotReader:
    samples = [{"img": np.full((16, 16, 3), i % 251, np.uint8), "n": i} for i in range(n)]
    return write_rows(LocalStore(tmp_path), samples, block_min_rows=20, block_bytes=1)


def _assemblers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "snapstore-assemble"]


def test_close_mid_epoch_stops_the_assembler(tmp_path: Any) -> None:
    reader = _images(tmp_path)
    batches = snapstore.BatchReader(reader, 8, options=PlanOptions(shuffle=True, window_blocks=2))
    it = iter(batches)
    next(it)
    time.sleep(0.05)  # the assembler fills its queue and waits
    assert len(_assemblers()) == 1
    batches.close()
    assert not _assemblers()
    assert not [t for t in threading.enumerate() if t.name.startswith("snapstore-decode")]
    assert batches.get_state()["position"] == 8
    # an abandoned iterator stops them too, when it is collected
    it = iter(batches)
    next(it)
    del it
    assert not _assemblers()
    reader.close()


def test_close_while_the_assembler_waits_for_blocks(tmp_path: Any) -> None:
    """The assembler waits inside the prefetcher for a slow read; close() still returns."""
    reader = _images(tmp_path)
    fetch, slow = reader._fetch, threading.Event()

    def slow_fetch(path: str, start: int, length: int) -> Any:
        if slow.is_set():
            time.sleep(0.5)
        return fetch(path, start, length)

    reader._fetch = slow_fetch  # type: ignore[method-assign]
    batches = snapstore.BatchReader(reader, 8, options=PlanOptions(shuffle=True, window_blocks=1))
    it = iter(batches)
    next(it)
    slow.set()
    began = time.perf_counter()
    batches.close()
    assert time.perf_counter() - began < 2.0
    assert not _assemblers()
    del it
    reader.close()


class Boom(Exception):
    pass


def test_errors_reach_the_consumer_unchanged(tmp_path: Any) -> None:
    """A read that fails is raised in the consumer's loop, the same exception object, after the
    batches made before it; the threads are stopped afterwards."""
    reader = _images(tmp_path)
    fetch, calls, error = reader._fetch, [0], Boom("shard read failed")

    def failing(path: str, start: int, length: int) -> Any:
        calls[0] += 1
        if calls[0] > 12:
            raise error
        return fetch(path, start, length)

    reader._fetch = failing  # type: ignore[method-assign]
    batches = snapstore.BatchReader(
        reader, 8, options=PlanOptions(window_blocks=2), decode_threads=1, max_requests=1
    )
    got = 0
    with pytest.raises(Boom) as caught:
        for _ in batches:
            got += 1
    assert caught.value is error
    assert got > 0
    assert not _assemblers()
    reader.close()


def test_handoff_delivers_in_order_then_the_error() -> None:
    error = ValueError("item 5")

    def items() -> Any:
        yield from range(5)
        raise error

    handoff = Handoff(items(), depth=2, name="test-handoff", wake=lambda: None)
    got = []
    with pytest.raises(ValueError) as caught:
        for i in handoff:
            got.append(i)
    assert got == [0, 1, 2, 3, 4] and caught.value is error
    handoff.close()
    assert not handoff.running


def test_handoff_close_drops_what_was_made_and_closes_the_items() -> None:
    closed = threading.Event()

    def items() -> Any:
        try:
            yield from range(1000)
        finally:
            closed.set()

    handoff = Handoff(items(), depth=3, name="test-handoff", wake=lambda: None)
    assert next(handoff) == 0
    handoff.close()
    assert closed.is_set() and not handoff.running
    assert list(handoff) == []
