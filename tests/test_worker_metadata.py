"""Workers inherit metadata: a dataset sent to another process carries the commit record,
manifest and index its sender read and verified, and relies on the sender's pin, so the worker's
first request is a block (issue 14)."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import snapstore
from snapstore.handle import SnapshotHandle
from snapstore.storage.simulate import simulated_store
from snapstore.torch import SnapshotIterableDataset


def numbers(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"x": i}


@pytest.fixture
def fingerprint(tmp_path: Path) -> str:
    return snapstore.snapshot(numbers, root=str(tmp_path))(300).materialize().fingerprint


def test_a_pickled_dataset_reads_only_blocks(tmp_path: Path, fingerprint: str) -> None:
    store = simulated_store(tmp_path, ttfb=0.001, record=True)
    ds = SnapshotIterableDataset(fingerprint, root=store, batch_size=32, shuffle=True)
    worker = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker receives
    fs = worker._location.open().store.fs  # its own filesystem object, as in a worker
    assert fs is not store.fs and fs.trace is not None
    fs.trace.clear()
    got = sorted(x for batch in worker for x in batch["x"].tolist())
    assert got == list(range(300))
    calls = [(r.name, r.path.rsplit("/", 1)[-1], r.ranged) for r in fs.trace]
    assert calls and all(ranged for _, _, ranged in calls), calls  # no metadata, no pin


def test_a_spawned_worker_makes_no_metadata_request(tmp_path: Path, fingerprint: str) -> None:
    """The same in a fresh interpreter, which rebuilds the store's filesystem for itself."""
    store = simulated_store(tmp_path, ttfb=0.001, record=True)
    ds = SnapshotIterableDataset(fingerprint, root=store, batch_size=32, shuffle=True)
    payload = tmp_path / "dataset.pkl"
    payload.write_bytes(pickle.dumps(ds))
    child = textwrap.dedent(
        f"""
        import pickle, sys
        ds = pickle.loads(open({str(payload)!r}, "rb").read())
        snap = ds._location.open()
        fs = snap.store.fs
        fs.trace = [] if fs.trace is None else fs.trace
        fs.trace.clear()
        n = sum(len(b["x"]) for b in ds)
        names = sorted({{(r.path.rsplit("/", 1)[-1], r.ranged) for r in fs.trace}})
        print(n, names)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    n, _, names = out.partition(" ")
    assert n == "300", out
    assert "COMMIT" not in names and "manifest" not in names and "pin" not in names, out
    assert "shard-00000.snap" in names, out


def test_a_handle_from_an_unpinned_sender_pins_for_itself(tmp_path: Path, fingerprint: str) -> None:
    """A snapshot that relies on another process's pin does not pass that reliance on: what it
    sends makes the next process read and pin for itself."""
    snap = snapstore.open(fingerprint, root=str(tmp_path))
    handle = SnapshotHandle(snap, "a test")
    first = pickle.loads(pickle.dumps(handle))
    opened = first.open()
    assert opened._pinned_elsewhere and opened._metadata is not None
    assert len(opened) == 300 and opened._guard is None
    second = pickle.loads(pickle.dumps(first))
    assert second._metadata is None  # its sender holds no pin of its own
    assert len(second.open()) == 300 and second.open()._guard is not None
    for s in (snap, opened, second.open()):
        s.close()


def test_a_forked_worker_inherits_metadata_and_the_pin(tmp_path: Path, fingerprint: str) -> None:
    """fork (Linux's default start method) copies the dataset instead of pickling it: the
    child starts from the parent's metadata and relies on the parent's pin as well."""
    import os

    ds = SnapshotIterableDataset(fingerprint, root=str(tmp_path), batch_size=32)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        snap = ds._location.open()
        ok = snap._pinned_elsewhere and snap._metadata is not None and snap._guard is None
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 1) == b"1"


def test_a_handle_loaded_after_its_sender_exited_pins_for_itself(
    tmp_path: Path, fingerprint: str
) -> None:
    snap = snapstore.open(fingerprint, root=str(tmp_path))
    handle = pickle.loads(pickle.dumps(SnapshotHandle(snap, "a test")))
    handle._sender = (handle._sender[0], 2**22 + 12345)  # no such process
    opened = handle.open()
    assert opened._metadata is not None and not opened._pinned_elsewhere
    assert len(opened) == 300 and opened._guard is not None
    opened.close()
    snap.close()
