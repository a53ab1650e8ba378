"""Batches onto a device ahead of the step (issue 30): the prefetch loop through a stand-in
transfer that records its calls and completes copies when told, pass-through on the CPU, the
pinning hook of the pool's segments, and (where a GPU is present) real streams and pinning."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_torch_pool import send  # noqa: E402

import snapstore  # noqa: E402
from snapstore import torch_pool  # noqa: E402
from snapstore.torch import RaggedList, SnapshotIterableDataset, to_device  # noqa: E402
from snapstore.torch_device import DeviceLoader, move_batch  # noqa: E402
from snapstore.torch_pool import SegmentPool  # noqa: E402
from snapstore.torch_ragged import share_batch  # noqa: E402

DataLoader = torch.utils.data.DataLoader
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = [
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype"),
]


class FakeCopied:
    def __init__(self, log: list[str], number: int) -> None:
        self.log, self.number, self.complete, self.waited = log, number, False, False

    def wait(self) -> None:
        self.waited = True
        self.log.append(f"wait {self.number}")

    def done(self) -> bool:
        return self.complete

    def synchronize(self) -> None:
        self.complete = True
        self.log.append(f"sync {self.number}")


class FakeTransfer:
    """A "device" that clones tensors and completes a batch's copies only when told."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.started: list[FakeCopied] = []
        self.copied: list[torch.Tensor] = []  # the sources, in the order they were copied

    def copy(self, batch: Any) -> tuple[Any, FakeCopied]:
        def one(tensor: torch.Tensor) -> torch.Tensor:
            self.copied.append(tensor)
            return tensor.clone()

        moved = move_batch(batch, one)
        self.copied = []  # keep no reference to the host batch
        copied = FakeCopied(self.log, len(self.started))
        self.log.append(f"copy {len(self.started)}")
        self.started.append(copied)
        return moved, copied

    def complete(self, upto: int) -> None:
        for copied in self.started[:upto]:
            copied.complete = True


def batches(n: int) -> list[dict[str, Any]]:
    return [{"x": torch.full((4,), i), "i": i} for i in range(n)]


def test_cpu_passes_batches_through_unchanged() -> None:
    given = batches(5)
    for device in ("cpu", torch.device("cpu")):
        got = list(to_device(given, device))
        assert len(got) == 5
        assert all(a is b for a, b in zip(got, given))
    assert len(to_device(given, "cpu")) == 5
    with pytest.raises(TypeError):
        len(to_device(iter(given), "cpu"))


@pytest.mark.parametrize(
    ("device", "prefetch", "message"),
    [
        ("gpu", 2, "expected a device such as"),
        (3.5, 2, "expected a device such as"),
        ("meta", 2, "expected 'cpu' or a CUDA device, found 'meta'"),
        ("cpu", 0, "prefetch as a whole number >= 1"),
        ("cpu", True, "prefetch as a whole number >= 1"),
        ("cpu", 1.5, "found 1.5"),
    ],
)
def test_bad_arguments_are_value_errors(device: Any, prefetch: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_device(batches(1), device, prefetch)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_cuda_without_a_gpu_says_so() -> None:
    with pytest.raises(ValueError, match="expected a CUDA device to be available"):
        to_device(batches(1), "cuda")


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_order_and_prefetch_depth(prefetch: int) -> None:
    transfer = FakeTransfer()
    pulled: list[int] = []

    def source() -> Iterator[dict[str, Any]]:
        for batch in batches(7):
            pulled.append(batch["i"])
            yield batch

    loader = DeviceLoader(source(), transfer, prefetch)
    seen = []
    for step, batch in enumerate(loader):
        # When batch `step` is handed over, exactly `prefetch` batches after it were started.
        assert len(transfer.started) == min(7, step + 1 + prefetch)
        assert len(pulled) == len(transfer.started)
        assert transfer.started[step].waited
        assert not any(c.waited for c in transfer.started[step + 1 :])
        seen.append(batch["i"])
        assert torch.equal(batch["x"], torch.full((4,), step))
        transfer.complete(step + 1)
    assert seen == list(range(7))
    # each batch's copy is started before it is waited on, and waited on in order
    waits = [e for e in transfer.log if e.startswith("wait")]
    assert waits == [f"wait {i}" for i in range(7)]
    assert transfer.log.index("copy 3") < transfer.log.index("wait 3")


def test_host_batches_are_kept_until_their_copies_complete() -> None:
    transfer = FakeTransfer()
    given = [torch.full((8,), i) for i in range(5)]
    alive = [weakref.ref(t) for t in given]

    def source() -> Iterator[dict[str, Any]]:  # holds no batch it has handed over
        while given:
            yield {"x": given.pop(0)}

    loader = DeviceLoader(source(), transfer, 1)
    iterator = iter(loader)
    next(iterator)
    next(iterator)  # batches 0 and 1 handed over, 2 started; nothing completed
    gc.collect()
    assert all(ref() is not None for ref in alive[:3])
    transfer.complete(1)
    next(iterator)  # the loop looks at completions as it hands over the next batch
    gc.collect()
    assert alive[0]() is None
    assert all(ref() is not None for ref in alive[1:])
    iterator.close()  # closing early waits for every copy still running, then lets go
    gc.collect()
    assert all(ref() is None for ref in alive[:4])
    assert alive[4]() is not None  # never pulled from the source
    assert {"sync 1", "sync 2", "sync 3"} <= set(transfer.log)


def test_a_ragged_list_moves_as_views_of_one_tensor() -> None:
    ragged = RaggedList(torch.arange(10, dtype=torch.int32), torch.tensor([0, 3, 3, 10]))
    transfer = FakeTransfer()
    (moved,) = DeviceLoader([{"tok": ragged, "name": "a"}], transfer, 2)
    tok = moved["tok"]
    assert isinstance(tok, RaggedList)
    assert tok.values is not ragged.values
    assert tok.values.data_ptr() != ragged.values.data_ptr()
    assert [t.tolist() for t in tok] == [t.tolist() for t in ragged]
    base = tok.values.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in tok)
    assert torch.equal(tok.offsets, ragged.offsets)
    assert moved["name"] == "a"
    # a list changed after it was made is packed again, then moved as one tensor
    ragged[0] = torch.tensor([7, 7], dtype=torch.int32)
    (moved,) = DeviceLoader([{"tok": ragged}], FakeTransfer(), 1)
    assert moved["tok"][0].tolist() == [7, 7]
    assert moved["tok"][0].untyped_storage().data_ptr() == moved["tok"].values.data_ptr()


def test_packed_nested_and_other_values() -> None:
    values = torch.arange(6, dtype=torch.int32)
    offsets = torch.tensor([0, 2, 6])
    batch = {
        "tok": values,
        "tok_offsets": offsets,
        "meta": {"ids": torch.tensor([1, 2]), "names": ["a", "b"], "n": 2},
        "pair": (torch.ones(2), "x"),
        "jagged": torch.nested.nested_tensor_from_jagged(torch.ones(6, 2), offsets),
    }
    transfer = FakeTransfer()
    copied: list[torch.Tensor] = []
    moved = move_batch(batch, lambda t: copied.append(t) or t.clone())
    assert [id(t) for t in copied] == [id(batch[k]) for k in ("tok", "tok_offsets")] + [
        id(batch["meta"]["ids"]),
        id(batch["pair"][0]),
        id(batch["jagged"]),
    ]
    assert moved["tok"] is not values and torch.equal(moved["tok"], values)
    assert moved["tok_offsets"] is not offsets and torch.equal(moved["tok_offsets"], offsets)
    assert moved["meta"]["names"] is batch["meta"]["names"] and moved["meta"]["n"] == 2
    assert isinstance(moved["pair"], tuple) and moved["pair"][1] == "x"
    assert moved["jagged"].is_nested
    (through,) = DeviceLoader([batch], transfer, 2)
    assert through.keys() == batch.keys()


def pooled_batch(pool: SegmentPool, fill: int) -> dict[str, Any]:
    (values,) = pool.allocate([((256, 128), np.dtype(np.float32))])
    values[:] = fill
    return share_batch({"x": torch.from_numpy(values)})


def test_a_pool_segment_is_released_only_after_its_copy(pool: SegmentPool) -> None:
    transfer = FakeTransfer()
    received = [send(pooled_batch(pool, 1))]
    segment = pool.segments[0]
    iterator = iter(DeviceLoader(iter(received), transfer, 1))
    del received
    batch = next(iterator)
    assert float(batch["x"][0, 0]) == 1.0
    gc.collect()
    assert not segment.free()  # handed over, copy not complete: the host batch is held
    transfer.complete(1)
    with pytest.raises(StopIteration):
        next(iterator)
    gc.collect()
    assert segment.free()


def test_the_map_hook_runs_once_per_segment_and_undoes_before_unmapping(
    pool: SegmentPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch_pool, "_MAP_HOOKS", [])
    monkeypatch.setattr(torch_pool, "_RECEIVED", {})
    calls: list[tuple[str, int, int]] = []

    def hook(address: int, size: int) -> Any:
        calls.append(("map", address, size))
        # the mapping is still there when the undo runs: read its header
        return lambda: calls.append(
            (
                "undo",
                address,
                int(
                    np.ctypeslib.as_array((np.ctypeslib.ctypes.c_int64 * 1).from_address(address))[
                        0
                    ]
                ),
            )
        )

    first = send(pooled_batch(pool, 1))
    torch_pool.on_map(hook)  # a segment mapped already is hooked too
    torch_pool.on_map(hook)  # once
    assert [c[0] for c in calls] == ["map"]
    del first
    gc.collect()
    for fill in (2, 3):
        batch = send(pooled_batch(pool, fill))  # the same segment again: not hooked again
        del batch
        gc.collect()
    assert [c[0] for c in calls] == ["map"]
    assert calls[0][2] == 64 + pool.segments[0].capacity
    torch_pool._RECEIVED.clear()  # as forget_exited does when the worker is gone
    gc.collect()
    assert [c[0] for c in calls] == ["map", "undo"]
    assert calls[1][1] == calls[0][1] and calls[1][2] == 3  # the last generation released


def stage(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {
            "image": np.full((32, 32, 3), i % 251, np.uint8),
            "id": i,
            "tok": np.arange(i % 9 + 1, dtype=np.int32) + i,
        }


def test_a_dataloader_with_workers_through_to_device_cpu(tmp_path: Any) -> None:
    options = snapstore.WriteOptions(block_bytes=1 << 16, block_min_rows=8)
    snap = snapstore.snapshot(stage, root=tmp_path / "root", options=options)(300).materialize()

    def loader() -> Any:  # a fresh one each time: a second pass over one is another order
        dataset = SnapshotIterableDataset(snap, batch_size=32, seed=3, ragged="list")
        return DataLoader(dataset, batch_size=None, num_workers=2)

    expected = [
        (b["id"].tolist(), b["image"].clone(), [t.tolist() for t in b["tok"]]) for b in loader()
    ]
    got = [
        (b["id"].tolist(), b["image"].clone(), [t.tolist() for t in b["tok"]])
        for b in to_device(loader(), "cpu")
    ]
    assert len(got) == len(expected) == 10
    for (ids, image, tok), (ids2, image2, tok2) in zip(got, expected):
        assert ids == ids2 and tok == tok2 and torch.equal(image, image2)


@CUDA
def test_cuda_batches_arrive_on_the_device_in_order() -> None:
    ragged = [
        RaggedList(torch.arange(i + 3, dtype=torch.int32), torch.tensor([0, 1, i + 3]))
        for i in range(6)
    ]
    given = [{"x": torch.full((1024,), i), "tok": ragged[i], "i": i} for i in range(6)]
    for step, batch in enumerate(to_device(given, "cuda", prefetch=2)):
        torch.cuda.current_stream().synchronize()
        assert batch["x"].is_cuda and int(batch["x"][0]) == step and batch["i"] == step
        assert batch["tok"].values.is_cuda
        assert [t.tolist() for t in batch["tok"]] == [t.tolist() for t in ragged[step]]


@CUDA
def test_cuda_pool_segments_are_pinned(pool: SegmentPool) -> None:
    from snapstore.torch_device import pin_pool_segments

    pin_pool_segments()
    batch = send(pooled_batch(pool, 5))
    assert batch["x"].is_pinned()
    (moved,) = to_device([batch], "cuda")
    assert float(moved["x"][0, 0].cpu()) == 5.0


BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu.py"


def test_bench_gpu_cpu_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(BENCH), "--cpu-smoke", "--tmp", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=BENCH.parent)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith(("img ", "tok "))]
    paths = {" ".join(r[1:-5]) for r in rows if len(r) == 7 or len(r) == 8}
    assert paths == {"on device", "memmap pin", "snap pin", "to_device"}, out.stdout
    for workload in ("img", "tok"):
        assert f"{workload}: input wait at 10 ms, to_device:" in out.stdout
        assert f"{workload}: H2D flat out, to_device / pinned peak:" in out.stdout
        assert (
            f"{workload}: main-process CPU per batch at 10 ms, to_device / snap pin:" in out.stdout
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the run without CUDA")
def test_bench_gpu_without_cuda_measures_nothing() -> None:
    out = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "no CUDA device: nothing measured" in out.stdout
