"""Reader pins: an open snapshot is never removed under its reader; last-read times."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import snapstore
from snapstore.errors import BusyError, SnapshotNotFoundError, SnapshotRemovedError, StoreError
from snapstore.manage.catalog import describe, remove_snapshot
from snapstore.manage.gc import find_garbage
from snapstore.storage import pins
from snapstore.storage.store import LocalStore, Store


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
    assert len(snap) == 20  # opening the reader pins it, in the background
    assert snap._guard is not None and snap._guard.wait(30)
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


def test_a_pin_released_after_removal_saw_it_still_stops_the_removal(tmp_path: Path) -> None:
    """The remover deletes the record, sees a reader's pin and puts the record back; the
    reader closes at that moment. The removal still stops there: going on (because a second
    look finds no pin) would remove the run's files under a record just put back, and a
    reader opening then would find the snapshot damaged, not removed."""
    store = LocalStore(tmp_path)
    fp = committed(store)
    commit = f"{fp}/COMMIT"
    create_if_absent = store.create_if_absent
    handle: list[pins.Pin | None] = []

    def remove_tree(path: str) -> None:
        LocalStore.remove_tree(store, path)
        if path == commit and not handle:
            handle.append(pins.pin(store, fp))  # a reader pins as the record goes

    def restore(path: str, data: bytes) -> bool:
        created = create_if_absent(path, data)
        if path == commit and handle and handle[0] is not None:
            handle[0].release()  # ...and closes as the record comes back
            handle[0] = None
        return created

    store.remove_tree = remove_tree  # type: ignore[method-assign]
    store.create_if_absent = restore  # type: ignore[method-assign]
    with pytest.raises(BusyError, match="is in use by reader"):
        remove_snapshot(store, fp)
    assert handle == [None]
    snap = snapstore.open(fp, root=store)
    assert [s["x"] for s in snap] == [i * i for i in range(20)]
    snap.close()


def test_a_reader_whose_pin_comes_after_removal_looked_stops_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader read the commit record and started reading; the removal ran to its end
    before the reader's pin was written. The confirm-read after the pin finds no record, and
    the reader stops at its next batch with SnapshotRemovedError (not a damaged-snapshot
    error), having yielded only intact batches."""
    monkeypatch.setattr(pins, "CONFIRM_DELAYS", (0.0, 0.01))
    store = LocalStore(tmp_path)
    fp = committed(store, 200)
    write_bytes = store.write_bytes

    def pin_after_removal(path: str, data: bytes) -> None:
        if "/pins/pin-" in path and store.exists(f"{fp}/COMMIT"):
            remove_snapshot(store, fp)  # no pin yet: the removal goes through
        write_bytes(path, data)

    store.write_bytes = pin_after_removal  # type: ignore[method-assign]
    snap = snapstore.open(fp, root=store)
    batches = iter(snap.batches(16))
    first = next(batches)
    assert first["x"].tolist() == [i * i for i in range(16)]
    assert snap._guard is not None and snap._guard.wait(30)
    assert snap._guard.lost is not None and "was removed" in snap._guard.lost
    # Nothing to protect: its pin is down, and what the pin made again is gone with it.
    assert snap._guard.pin is None and not (tmp_path / fp).exists()
    with pytest.raises(SnapshotRemovedError, match=r"was removed .*Open it again"):
        next(batches)
    snap.close()
    assert not store.exists(f"{fp}/COMMIT")


def test_a_reader_whose_pin_comes_before_removal_looked_keeps_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The removal deleted the commit record; then the reader (which had read it before)
    starts reading and writes its pin; then the removal looks for pins, finds it, and puts the
    record back. The reader's confirm-read finds the record (at once or on a later try) and
    reads every sample."""
    monkeypatch.setattr(pins, "CONFIRM_DELAYS", (0.0, 0.05, 0.1, 0.5, 1.0))
    store = LocalStore(tmp_path)
    fp = committed(store, 200)
    commit = f"{fp}/COMMIT"
    snap = snapstore.open(fp, root=store)  # the commit record, manifest and index are read
    remove_tree = store.remove_tree
    got: list[int] = []

    def reader_starts_meanwhile(path: str) -> None:
        remove_tree(path)
        if path == commit and not got:
            batches = iter(snap.batches(16))
            got.extend(next(batches)["x"].tolist())
            guard = snap._guard
            assert guard is not None
            while guard.pin is None:  # the pin goes out once the first requests are out
                guard.wait(0.01)
            got.extend(x for b in batches for x in b["x"].tolist())

    store.remove_tree = reader_starts_meanwhile  # type: ignore[method-assign]
    with pytest.raises(BusyError):
        remove_snapshot(store, fp)
    store.remove_tree = remove_tree  # type: ignore[method-assign]
    assert got == [i * i for i in range(200)]
    assert snap._guard is not None and snap._guard.wait(30) and snap._guard.lost is None
    assert store.exists(commit)
    snap.close()


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
            except SnapshotNotFoundError:  # SnapshotRemovedError included
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
    try:
        for _ in range(200):
            try:
                remove_snapshot(store, fp)
                removed = True
                break
            except BusyError:
                continue
    finally:
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


def test_a_reader_that_exits_at_once_leaves_no_pin(tmp_path: Path) -> None:
    """The pin is written in the background; a process that exits while it is on its way
    still takes it down (and one that never read writes none)."""
    store = LocalStore(tmp_path)
    fp = committed(store)
    script = (
        "import sys, snapstore\n"
        "from snapstore.storage.simulate import simulated_store\n"
        "snap = snapstore.open(sys.argv[2], root=simulated_store(sys.argv[1], ttfb=0.05))\n"
        "print(snap[0])\n"
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", script, str(tmp_path), fp], check=True)
    assert [n for n in store.list_dir(f"{fp}/pins") if n.startswith("pin-")] == []
    assert pins.last_read(store, fp) is not None  # the read was recorded


PINNER = """
import sys, snapstore
from snapstore.storage import pins
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


def test_removal_lets_a_file_go_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader renames its pin from a temporary name while removal lists the directory: the
    file removal meant to delete is already gone, and that is not an error (CI once failed
    here with FileNotFoundError)."""
    store = LocalStore(tmp_path)
    fp = committed(store, 10)
    (tmp_path / fp / "pins").mkdir(exist_ok=True)
    (tmp_path / fp / "pins" / ".read-x.tmp").write_bytes(b"{}")
    real_unlink = os.unlink

    def renamed_meanwhile(path: Any, *args: Any, **kwargs: Any) -> None:
        real_unlink(path, *args, **kwargs)
        if str(path).endswith(".tmp"):  # gone before removal got to it
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))

    monkeypatch.setattr(os, "unlink", renamed_meanwhile)
    remove_snapshot(store, fp)
    assert not (tmp_path / fp).exists()


OPEN_AND_EXIT = """
import json, sys, snapstore
url, options, fp = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
snap = snapstore.open(fp, root=snapstore.open_store(url, **options))
print(len(snap), snap[0]["x"])
assert snap._guard.wait(30)  # pinned; the process exits with the snapshot open (no close())
"""


def test_a_reader_on_a_bucket_that_exits_without_closing_takes_its_pin_down(
    remote_root: tuple[str, dict[str, object]],
) -> None:
    """gcsfs and s3fs close their sessions at exit; the pins come down first, while the store
    still works, and no renewal fails noisily on a closed session."""
    url, options = remote_root
    store = snapstore.open_store(url, **options)
    fp = committed(store)
    done = subprocess.run(
        [sys.executable, "-c", OPEN_AND_EXIT, url, json.dumps(options), fp],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["20", "0"]
    assert "Traceback" not in done.stderr, done.stderr
    assert [n for n in store.list_dir(f"{fp}/pins") if n.startswith("pin-")] == []
    assert pins.last_read(store, fp) is not None


HANG_AT_EXIT = """
import sys, snapstore
from snapstore.storage.simulate import simulated_store
store = simulated_store(sys.argv[1], ttfb=0.01)
snap = snapstore.open(sys.argv[2], root=store)
print(snap[0]["x"])
assert snap._guard.wait(30)
store.fs.ttfb = 600.0  # the store stops answering: taking the pin down would never end
"""


def test_exit_does_not_wait_for_a_store_that_stopped_answering(tmp_path: Path) -> None:
    """Taking pins down at exit is bounded (pins expire anyway): a process whose store stopped
    answering still exits, instead of hanging on the release (the timeout is a hang guard)."""
    fp = committed(LocalStore(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", HANG_AT_EXIT, str(tmp_path), fp],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["0"]
