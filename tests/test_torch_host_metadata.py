"""A host's DataLoader workers share one metadata fetch (issue 28): across the main process and
2-4 real worker processes on a remote (simulated) store, opening the snapshot reads the commit
record, manifest and index at most 3 times in all, counted by a store wrapper that logs every
read of every process to one file. The pin (:mod:`snapstore.storage.pins`) reads the commit
record once more, in the background, to confirm the snapshot still stands: counted apart."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import snapstore  # noqa: E402
from snapstore.storage.fsspec_store import FsspecStore  # noqa: E402
from snapstore.storage.simulate import simulated_store  # noqa: E402
from snapstore.torch import SnapshotIterableDataset  # noqa: E402

METADATA = ("COMMIT", "manifest", "index")
PINS = "snapstore.storage.pins"


def numbers(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"x": i}


def count_reads(monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
    """Every read of a FsspecStore, in this process and in those forked from it, appends
    ``pid pin path`` to ``log`` (pin: 1 when the pin reads), in one write with O_APPEND so
    that the lines of processes do not interleave."""

    def logged(read: Any) -> Any:
        def wrapper(self: FsspecStore, path: str, *args: Any) -> Any:
            caller, pin = sys._getframe(1), False
            while caller is not None and not pin:
                pin, caller = caller.f_globals.get("__name__") == PINS, caller.f_back
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, f"{os.getpid()} {int(pin)} {path}\n".encode())
            finally:
                os.close(fd)
            return read(self, path, *args)

        return wrapper

    monkeypatch.setattr(FsspecStore, "read_bytes", logged(FsspecStore.read_bytes))
    monkeypatch.setattr(FsspecStore, "read_range", logged(FsspecStore.read_range))


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_of_a_host_share_one_metadata_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    root = str(tmp_path / "root")
    fingerprint = snapstore.snapshot(numbers, root=root)(400).materialize().fingerprint
    log = tmp_path / "reads.log"
    count_reads(monkeypatch, log)
    store = simulated_store(root, ttfb=0.001)
    ds = SnapshotIterableDataset(fingerprint, root=store, batch_size=16, shuffle=True)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=workers, multiprocessing_context="fork"
    )
    got = sorted(x for batch in loader for x in batch["x"].tolist())
    assert got == list(range(400))
    reads = [line.split(" ", 2) for line in log.read_text().splitlines()]
    assert len({pid for pid, _, _ in reads}) >= workers, reads  # the workers read blocks
    names = [(pid, pin, path.rsplit("/", 1)[-1]) for pid, pin, path in reads]
    opening = Counter((pid, name) for pid, pin, name in names
                      if pin == "0" and name.startswith(METADATA))  # fmt: skip
    assert sum(opening.values()) <= 3, opening
    assert {pid for pid, _ in opening} == {str(os.getpid())}, opening  # the main process's
    confirms = [pid for pid, pin, name in names if pin == "1" and name == "COMMIT"]
    # The pin's confirmation, in the background: at most once per host, never per worker.
    assert len(confirms) <= 1 and set(confirms) <= {str(os.getpid())}, names
