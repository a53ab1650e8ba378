"""Reader pins: an open snapshot is never removed under its reader; last-read times."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import snapstore
from snapstore import pins
from snapstore.catalog import describe, remove_snapshot
from snapstore.errors import BusyError, SnapshotNotFoundError, StoreError
from snapstore.gc import find_garbage
from snapstore.store import LocalStore, Store


def squares(n: int):
    for i in range(n):
        yield {"x": i * i}


def committed(store: Store, n: int = 20) -> str:
    snap = snapstore.snapshot(squares, root=store)(n)
    snap.materialize()
    snap.close()
    return snap.fingerprint


def test_an_open_snapshot_is_pinned_until_closed(store: Store) -> None:
    fp = committed(store)
    assert pins.live_pins(store, fp) == [] and pins.last_read(store, fp) is None
    snap = snapstore.open(fp, root=store)
    assert len(snap) == 20  # opening the reader pins it
    (pin,) = pins.live_pins(store, fp)
    assert pin.pid > 0 and describe(store, fp)["readers"] == 1
    assert pins.last_read(store, fp) is not None
    with pytest.raises(BusyError, match=r"is in use by reader .*; it was not removed"):
        remove_snapshot(store, fp)
    snap.close()
    assert pins.live_pins(store, fp) == []
    remove_snapshot(store, fp)
    with pytest.raises(SnapshotNotFoundError):
        snapstore.open(fp, root=store)


def test_pins_renew_and_expire(store: Store) -> None:
    fp = committed(store)
    handle = pins.Pin(store, fp, lease=10.0)
    handle.renew()
    (info,) = pins.live_pins(store, fp)
    assert info.live(info.time + 9) and not info.live(info.time + 11)
    handle.renew()
    names = store.list_dir(f"{fp}/pins")
    assert len([n for n in names if n.startswith("pin-")]) == 1  # the previous one is deleted
    handle.release()
    handle.release()
    assert pins.live_pins(store, fp) == []


def test_a_reader_that_starts_during_removal_keeps_the_snapshot(tmp_path: Path) -> None:
    """The race: a reader pins just after the remover deleted the commit record. The remover
    sees the pin, puts the record back and gives up; the reader reads everything."""
    store = LocalStore(tmp_path)
    fp = committed(store)
    commit = f"{fp}/COMMIT"
    remove_tree = store.remove_tree
    reader: list[snapstore.Snapshot] = []

    def racing_remove(path: str) -> None:
        remove_tree(path)
        if path == commit and not reader:
            pins.pin(store, fp)  # a reader pins, having read COMMIT just before it vanished
            reader.append(snapstore.Snapshot(store, fp))

    store.remove_tree = racing_remove  # type: ignore[method-assign]
    with pytest.raises(BusyError):
        remove_snapshot(store, fp)
    store.remove_tree = remove_tree  # type: ignore[method-assign]
    assert [s["x"] for s in reader[0]] == [i * i for i in range(20)]


def test_removal_and_readers_racing_in_threads(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    fp = committed(store, 200)
    stop = threading.Event()
    failures: list[BaseException] = []
    reads = [0]

    def read_loop() -> None:
        while not stop.is_set():
            try:
                snap = snapstore.Snapshot(store, fp)
                total = sum(s["x"] for s in snap)
            except SnapshotNotFoundError:
                continue  # removed before this reader pinned: a cache miss, not an error
            except BaseException as exc:  # anything else means data vanished under a reader
                failures.append(exc)
                return
            snap.close()
            assert total == sum(i * i for i in range(200))
            reads[0] += 1

    threads = [threading.Thread(target=read_loop) for _ in range(3)]
    for t in threads:
        t.start()
    removed = False
    for _ in range(200):
        try:
            remove_snapshot(store, fp)
            removed = True
            break
        except BusyError:
            continue
    stop.set()
    for t in threads:
        t.join()
    assert not failures, failures[0]
    assert reads[0] > 0 or removed


def test_unwritable_store_reads_unpinned(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    fp = committed(store)

    def refuse(path: str, data: bytes) -> None:
        raise StoreError(f"cannot write {path}: read-only")

    store.write_bytes = refuse  # type: ignore[method-assign]
    pins._warned = False
    snap = snapstore.open(fp, root=store)
    assert [s["x"] for s in snap][:3] == [0, 1, 4]
    assert "reading it unpinned" in caplog.text
    snap.close()


PINNER = """
import sys, snapstore
from snapstore import pins
store = snapstore.open_store(sys.argv[1])
pins.pin(store, sys.argv[2])
import os; os._exit(0)  # dies without releasing
"""


def test_pins_of_dead_readers_are_not_live_and_are_garbage(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    fp = committed(store)
    subprocess.run([sys.executable, "-c", PINNER, str(tmp_path), fp], check=True)
    assert [n for n in store.list_dir(f"{fp}/pins") if n.startswith("pin-")]
    assert pins.live_pins(store, fp) == []
    kinds = [g.kind for g in find_garbage(store, min_age=0)]
    assert kinds.count("pin") == 1
    remove_snapshot(store, fp)  # a dead reader does not block removal


def test_an_unreadable_pin_counts_as_live(store: Store) -> None:
    fp = committed(store)
    store.write_bytes(f"{fp}/pins/pin-someone-00000000", json.dumps({"x": 1}).encode())
    assert len(pins.live_pins(store, fp)) == 1
