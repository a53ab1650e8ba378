"""Varying-shape fields through real DataLoader workers: every ragged form equals one process."""

from __future__ import annotations

import copy
import itertools
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import snapstore  # noqa: E402
from snapstore.torch import RaggedList, SnapshotIterableDataset, to_tensors  # noqa: E402

DataLoader = torch.utils.data.DataLoader
N = 120
FORMS = ("list", "nested", "packed", "pad")
pytestmark = [
    # torch's own note on the strided layout, which "nested" uses for fields with several
    # varying dimensions
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype"),
]


def expected(i: int) -> dict[str, np.ndarray]:
    """Sample i's varying-shape fields: 1-D tokens (every 5th empty), 2-D grids of varying
    height and width, and rows of 3 (only the first dimension varies; every 4th has none)."""
    return {
        "tok": np.arange(i % 5, dtype=np.int32) + i,
        "grid": np.full((1 + i % 3, 1 + i % 2), i, np.float32),
        "rows": np.full((i % 4, 3), i, np.int16),
    }


def stage(n: int) -> Any:
    for i in range(n):
        yield {"id": i, **expected(i)}


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("ragged") / "root"
    options = snapstore.WriteOptions(block_bytes=256, block_min_rows=4)
    return snapstore.snapshot(stage, root=root, options=options)(N).materialize()


def unpack(batch: dict[str, Any], name: str, form: str) -> list[np.ndarray]:
    """A batch's samples of field ``name`` as numpy arrays, whatever the form."""
    value = batch[name]
    if form == "list":
        assert isinstance(value, RaggedList)
        return [t.numpy() for t in value]
    if form == "nested":
        assert value.is_nested
        return [t.numpy() for t in value.unbind()]
    if form == "packed":
        offsets = batch[f"{name}_offsets"].tolist()
        shapes = batch[f"{name}_shapes"].tolist() if f"{name}_shapes" in batch else None
        flat = [value[a:b].numpy() for a, b in itertools.pairwise(offsets)]
        return flat if shapes is None else [f.reshape(s) for f, s in zip(flat, shapes)]
    lengths = batch[f"{name}_lengths"].reshape(len(value), -1).tolist()
    return [row[tuple(slice(0, n) for n in shape)].numpy() for row, shape in zip(value, lengths)]


def read(snap: snapstore.Snapshot, form: str, workers: int) -> tuple[dict[int, Any], set[Any]]:
    """Every sample read through the loader, by id, and the (field, kind, dtype) seen."""
    ds = SnapshotIterableDataset(snap, batch_size=16, ragged=form, seed=1)
    samples: dict[int, Any] = {}
    kinds = set()
    for batch in DataLoader(ds, batch_size=None, num_workers=workers):
        for name in ("tok", "grid", "rows"):
            value = batch[name]
            layout = value.layout if isinstance(value, torch.Tensor) else None
            kinds.add(
                (name, type(value).__name__, str(layout), str(unpack(batch, name, form)[0].dtype))
            )
        for k, i in enumerate(batch["id"].tolist()):
            samples[i] = {name: unpack(batch, name, form)[k] for name in ("tok", "grid", "rows")}
    return samples, kinds


@pytest.mark.parametrize("form", FORMS)
def test_workers_give_the_in_process_batches(snap: snapstore.Snapshot, form: str) -> None:
    one, one_kinds = read(snap, form, 0)
    two, two_kinds = read(snap, form, 2)
    assert sorted(one) == sorted(two) == list(range(N))
    assert one_kinds == two_kinds
    for i in range(N):
        for name, want in expected(i).items():
            for got in (one[i][name], two[i][name]):
                assert got.dtype == want.dtype and got.shape == want.shape, (form, i, name)
                np.testing.assert_array_equal(got, want)


def test_forms_are_what_the_guide_says(snap: snapstore.Snapshot) -> None:
    batch = next(iter(SnapshotIterableDataset(snap, batch_size=16, ragged="nested", seed=1)))
    assert batch["tok"].layout == torch.jagged and batch["rows"].layout == torch.jagged
    assert batch["rows"].shape[2] == 3
    assert batch["grid"].layout == torch.strided  # two varying dimensions: not jagged
    packed = next(iter(SnapshotIterableDataset(snap, batch_size=16, ragged="packed", seed=1)))
    assert set(packed) == {
        "id", "tok", "tok_offsets", "grid", "grid_offsets", "grid_shapes", "rows",
        "rows_offsets", "rows_shapes",
    }  # fmt: skip
    assert packed["tok_offsets"].dtype == torch.int64 and packed["tok_offsets"].shape == (17,)


def test_list_items_view_one_buffer_after_the_worker_hop(snap: snapstore.Snapshot) -> None:
    ds = SnapshotIterableDataset(snap, batch_size=16, seed=1)
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        tokens = batch["tok"]
        base = tokens.values.untyped_storage().data_ptr()
        assert all(t.untyped_storage().data_ptr() == base for t in tokens)
        assert tokens.offsets.tolist()[-1] == sum(len(t) for t in tokens)


def test_ragged_list_pickles_as_one_buffer() -> None:
    values = torch.arange(6, dtype=torch.int32)
    tokens = RaggedList(values, torch.tensor([0, 2, 2, 6]))
    _, (sent, offsets, shapes) = tokens.__reduce_ex__(2)
    assert sent is values and offsets.tolist() == [0, 2, 2, 6] and shapes is None
    back = pickle.loads(pickle.dumps(tokens))
    assert type(back) is RaggedList and [t.tolist() for t in back] == [[0, 1], [], [2, 3, 4, 5]]
    assert type(copy.copy(tokens)) is RaggedList and copy.copy(tokens).values is values
    deep = copy.deepcopy(tokens)
    assert deep.values is not values and torch.equal(deep.values, values)


def test_changed_ragged_list_is_packed_again() -> None:
    tokens = RaggedList(torch.arange(6), torch.tensor([0, 2, 6]))
    tokens[0] = torch.tensor([7, 8, 9])
    tokens.append(torch.tensor([1]))
    back = pickle.loads(pickle.dumps(tokens))
    assert type(back) is RaggedList and back.offsets.tolist() == [0, 3, 7, 8]
    assert [t.tolist() for t in back] == [[7, 8, 9], [2, 3, 4, 5], [1]]
    tokens.append("not a tensor")
    assert type(pickle.loads(pickle.dumps(tokens))) is list


def test_ragged_list_of_higher_rank_items() -> None:
    grids = RaggedList.from_tensors([torch.ones(2, 3), torch.zeros(0, 3), torch.ones(1, 1)])
    assert grids.shapes is not None and grids.shapes.tolist() == [[2, 3], [0, 3], [1, 1]]
    back = pickle.loads(pickle.dumps(grids))
    assert [tuple(t.shape) for t in back] == [(2, 3), (0, 3), (1, 1)]
    with pytest.raises(ValueError, match="one dtype and rank"):
        RaggedList.from_tensors([torch.ones(2), torch.ones(2, dtype=torch.int64)])
    with pytest.raises(ValueError, match="last offset"):
        RaggedList(torch.arange(3), torch.tensor([0, 4]))


def test_pin_memory_pins_the_buffer_once(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = []

    def fake_pin(self: Any, *args: Any) -> Any:  # no accelerator here: stand in for pinning
        pinned.append(self.numel())
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    from torch.utils.data._utils.pin_memory import pin_memory

    batch = {"tok": RaggedList(torch.arange(10), torch.tensor([0, 4, 10]))}
    out = pin_memory(batch)
    assert pinned == [10] and type(out["tok"]) is RaggedList
    assert [t.tolist() for t in out["tok"]] == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]


def test_to_tensors_packs_a_list_of_arrays() -> None:
    arrays = [np.arange(3, dtype=np.int16), np.arange(0, dtype=np.int16)]
    for a in arrays:
        a.flags.writeable = False
    out = to_tensors({"tok": arrays, "mixed": [np.zeros(2, np.int8), np.zeros(2, np.int64)]})
    assert type(out["tok"]) is RaggedList and out["tok"].values.dtype == torch.int16
    assert [t.tolist() for t in out["tok"]] == [[0, 1, 2], []]
    assert type(out["mixed"]) is list and [t.dtype for t in out["mixed"]] == [
        torch.int8,
        torch.int64,
    ]


def test_unknown_form_raises_in_the_constructor(snap: snapstore.Snapshot, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ragged: expected one of \('list', 'nested'"):
        SnapshotIterableDataset(snap, batch_size=4, ragged="ragged")  # type: ignore[arg-type]


def test_share_batch_puts_every_tensor_in_one_shared_buffer() -> None:
    from snapstore.torch_ragged import share_batch

    tokens = RaggedList.from_tensors([torch.arange(3, dtype=torch.int32), torch.arange(0).int()])
    batch = {
        "tokens": tokens,
        "id": torch.tensor([7, 8]),
        "x": torch.arange(12, dtype=torch.float64).reshape(2, 6).t(),  # not contiguous
        "meta": {"ok": torch.tensor([True, False])},
        "name": ["a", "b"],
    }
    expected = {k: v for k, v in batch.items()}
    shared = share_batch(dict(batch))
    storages = {
        t.untyped_storage().data_ptr()
        for t in (shared["tokens"].values, shared["id"], shared["x"], shared["meta"]["ok"])
    }
    assert len(storages) == 1 and shared["id"].is_shared()
    assert isinstance(shared["tokens"], RaggedList) and shared["tokens"]._intact()
    assert [t.tolist() for t in shared["tokens"]] == [[0, 1, 2], []]
    assert torch.equal(shared["x"], expected["x"]) and torch.equal(shared["id"], expected["id"])
    assert shared["meta"]["ok"].tolist() == [True, False] and shared["name"] == ["a", "b"]
    one = {"id": torch.tensor([1])}
    assert share_batch(one) is one and not one["id"].is_shared()  # one tensor: nothing to gain
