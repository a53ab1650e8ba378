"""Batches gathered straight into shared memory in DataLoader workers (issue 15): in the main
process every tensor of a batch is a view of one shared-memory storage, the batches equal the
one-process ones, and nothing in the worker copies them again."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import snapstore  # noqa: E402
from snapstore.torch import RaggedList, SnapshotIterableDataset, to_tensors  # noqa: E402
from snapstore.torch_ragged import (  # noqa: E402
    allocate_shared,
    from_packed,
    reader_form,
    share_batch,
)

DataLoader = torch.utils.data.DataLoader


def in_pool_segment(tensor: Any) -> bool:
    """Whether ``tensor``'s bytes lie in a mapping of a worker's pool segment (a memfd)."""
    start = tensor.untyped_storage().data_ptr()
    end = start + tensor.untyped_storage().nbytes()
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "memfd:snapstore-pool" in line:
                low, high = (int(x, 16) for x in line.split()[0].split("-"))
                if low <= start and end <= high:
                    return True
    return False


N = 150
FORMS = ("list", "nested", "packed", "pad")
pytestmark = [
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype"),
]


def stage(n: int) -> Any:
    for i in range(n):
        yield {
            "image": np.full((8, 8, 3), i % 251, np.uint8),
            "label": np.int16(i),  # a numpy-scalar label
            "id": i,
            "tok": np.arange(i % 7, dtype=np.int32) + i,
            "name": f"s{i}",
        }


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("shared") / "root"
    options = snapstore.WriteOptions(block_bytes=2048, block_min_rows=8)
    return snapstore.snapshot(stage, root=root, options=options)(N).materialize()


def _tensors(batch: dict[str, Any]) -> list[torch.Tensor]:
    """Every plain tensor of a batch (the values of a RaggedList, not its views)."""
    found = []
    for value in batch.values():
        if isinstance(value, RaggedList):
            found.append(value.values)
        elif isinstance(value, torch.Tensor) and not value.is_nested:
            found.append(value)
    return found


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        other = got[key]
        if isinstance(value, torch.Tensor) and value.is_nested:
            assert all(torch.equal(a, b) for a, b in zip(other.unbind(), value.unbind()))
        elif isinstance(value, torch.Tensor):
            assert other.dtype == value.dtype and torch.equal(other, value), key
        elif isinstance(value, RaggedList):
            assert isinstance(other, RaggedList) and len(other) == len(value)
            assert all(torch.equal(a, b) for a, b in zip(other, value)), key
        else:
            assert other == value, key


def _one_process(snap: snapstore.Snapshot, form: str, workers: int) -> list[dict[str, Any]]:
    """What the DataLoader's workers yield, read here: each worker's batches, taken in turn."""
    per_worker = []
    for worker in range(workers):
        reader = snap.batches(
            16, shuffle=True, seed=3, worker=worker, num_workers=workers, ragged=reader_form(form)
        )
        schema = reader.reader.schema
        per_worker.append([from_packed(to_tensors(b), schema, form) for b in reader])
    return [b for turn in zip(*per_worker, strict=True) for b in turn]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_batches_arrive_in_one_shared_buffer(
    snap: snapstore.Snapshot, form: str, context: str
) -> None:
    if context == "spawn" and form in ("nested", "pad"):
        pytest.skip("spawn is covered by the other forms (each spawn start costs seconds)")
    ds = SnapshotIterableDataset(snap, batch_size=16, seed=3, ragged=form)  # type: ignore[arg-type]
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    got = list(loader)
    want = _one_process(snap, form, 2)
    assert len(got) == len(want)
    for batch, expected in zip(got, want, strict=True):
        tensors = _tensors(batch)
        # Issue 24: the large tensors are views of one storage over a lease of the worker's
        # segment pool, the small ones (all of them here) copies sent in the message; none
        # travels as a torch segment of its own (is_shared() would be True).
        assert tensors and not any(t.is_shared() for t in tensors)
        pooled = [t for t in tensors if in_pool_segment(t)]
        assert len({t.untyped_storage().data_ptr() for t in pooled}) <= 1, form
        _same(batch, expected)
        assert batch["name"] == expected["name"]


def test_worker_gathers_into_shared_memory_without_another_copy(snap: snapstore.Snapshot) -> None:
    """What a worker does, in this process: the reader allocates from shared memory, the tensors
    are views of that buffer, and share_batch leaves them where they are."""
    for form in FORMS:
        reader = snap.batches(16, shuffle=True, seed=3, ragged=reader_form(form))
        reader.allocate = allocate_shared
        plain = snap.batches(16, shuffle=True, seed=3, ragged=reader_form(form))
        schema = reader.reader.schema
        for batch, want in zip(reader, plain, strict=True):
            tensors = from_packed(to_tensors(batch), schema, form)
            before = [t.data_ptr() for t in _tensors(tensors)]
            assert len({t.untyped_storage().data_ptr() for t in _tensors(tensors)}) == 1
            assert all(t.is_shared() for t in _tensors(tensors))
            shared = share_batch(tensors)
            assert [t.data_ptr() for t in _tensors(shared)] == before  # not copied again
            _same(shared, from_packed(to_tensors(want), schema, form))


def test_share_batch_still_copies_other_batches() -> None:
    batch = {"a": torch.arange(4), "b": torch.ones(3)}
    shared = share_batch(dict(batch))
    assert shared["a"].is_shared() and shared["a"].data_ptr() != batch["a"].data_ptr()
    assert shared["a"].untyped_storage().data_ptr() == shared["b"].untyped_storage().data_ptr()


def test_allocate_shared_aligns_every_array() -> None:
    specs = [((3,), np.dtype(np.uint8)), ((2, 2), np.dtype(np.float64)), ((0,), np.dtype(np.int64))]
    arrays = allocate_shared(specs)
    assert [(a.shape, a.dtype) for a in arrays] == [(s, d) for s, d in specs]
    assert all(a.ctypes.data % 64 == 0 for a in arrays)
    tensors = to_tensors({f"x{i}": a for i, a in enumerate(arrays)})
    assert all(t.is_shared() for t in tensors.values())
    arrays[1][:] = 7
    assert tensors["x1"].tolist() == [[7.0, 7.0], [7.0, 7.0]]  # a view, not a copy
