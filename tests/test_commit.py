"""Crash safety: an exception or a kill at any instant leaves no visible snapshot and no
leftover that blocks the next attempt; concurrent writers of one fingerprint commit once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import snapstore
import snapstore.manage.catalog
from snapstore.errors import SnapshotNotFoundError
from snapstore.storage.store import LocalStore, Store
from snapstore.write.writer import SnapshotWriter, WriteOptions


def visible(store: Store, fp: str) -> bool:
    try:
        snapstore.open(fp, root=store)
    except SnapshotNotFoundError:
        return False
    return True


def test_exception_in_stage_leaves_nothing_and_rerun_succeeds(store: Store) -> None:
    fail = {"at": 50}

    def stage(n: int):
        for i in range(n):
            if i == fail["at"]:
                raise ValueError("decode failed")
            yield {"x": np.full(1000, i, np.int64)}

    snap = snapstore.snapshot(
        stage, root=store, options=WriteOptions(block_min_rows=1, block_bytes=8000)
    )(100)
    with pytest.raises(ValueError, match="decode failed") as info:
        snap.materialize()
    assert any("nothing was committed" in note for note in getattr(info.value, "__notes__", []))
    assert not snap.committed and not visible(store, snap.fingerprint)
    assert store.list_dir(f"{snap.fingerprint}/runs") == []  # the aborted run was cleaned up
    fail["at"] = -1
    snap.materialize()
    assert visible(store, snap.fingerprint) and len(snap) == 100
    assert int(snap[99]["x"][0]) == 99


def test_keyboard_interrupt_leaves_nothing(store: Store) -> None:
    def stage():
        yield {"x": 1}
        raise KeyboardInterrupt

    snap = snapstore.snapshot(stage, root=store)()
    with pytest.raises(KeyboardInterrupt):
        snap.materialize()
    assert not snap.committed


def test_losing_writer_discards_its_run(store: Store) -> None:
    a = SnapshotWriter(store, "fp")
    b = SnapshotWriter(store, "fp")
    for w, value in ((a, 1), (b, 2)):
        for _ in range(10):
            w.add({"x": value})
    assert a.commit() is True
    assert b.commit() is False
    assert store.list_dir("fp/runs") == [a.run]
    reader = snapstore.open("fp", root=store)
    assert [s["x"] for s in reader] == [1] * 10


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, snapstore
    from snapstore.write.writer import WriteOptions

    def slow(n):
        for i in range(n):
            if i == 300:
                print("WRITING", flush=True)
            yield {"x": np.full(2048, i, np.int32)}

    options = WriteOptions(block_min_rows=1, block_bytes=16384, shard_bytes=65536)
    stage = snapstore.snapshot(slow, root=sys.argv[1], options=options)
    snap = stage(10**9 if sys.argv[2] == "forever" else 2000)
    print(snap.fingerprint, flush=True)
    snap.materialize()
    print("DONE", len(snap), flush=True)
    """
)


def run_writer(tmp_path: Path, root: str, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "writer_stage.py"
    script.write_text(KILL_SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), root, mode], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_sigkill_mid_write_leaves_nothing_and_rerun_succeeds(tmp_path: Path, delay: float) -> None:
    root = str(tmp_path / "root")
    proc = run_writer(tmp_path, root, "forever")
    assert proc.stdout is not None
    fp = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "WRITING"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    store = LocalStore(root)
    assert not visible(store, fp)
    runs = store.list_dir(f"{fp}/runs")
    assert len(runs) == 1 and store.list_dir(f"{fp}/runs/{runs[0]}")  # garbage, but invisible

    # The rerun (different n, so run the finite variant under its own fingerprint) and the
    # same fingerprint's rerun both commit despite the leftover run directory.
    writer = SnapshotWriter(store, fp)
    writer.add({"x": np.zeros(2048, np.int32)})
    assert writer.commit()
    assert visible(store, fp)


def test_killed_writer_then_full_rerun(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    proc = run_writer(tmp_path, root, "finite")
    assert proc.stdout is not None
    fp = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "WRITING"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not visible(LocalStore(root), fp)
    rerun = run_writer(tmp_path, root, "finite")
    out, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, out
    assert out.split()[0] == fp and "DONE 2000" in out
    snap = snapstore.open(fp, root=root)
    assert len(snap) == 2000 and int(snap[1999]["x"][0]) == 1999


def kill_at_random_moments(tmp_path: Path, runs: int, seed: int) -> dict[str, int]:
    """Start the finite writer, SIGKILL it after a random delay (from start-up to past its
    commit), check nothing partial is visible, and rerun it to completion; ``runs`` times."""
    import random

    rng = random.Random(seed)
    outcomes = {"killed before commit": 0, "finished before the kill": 0}
    root = str(tmp_path / "root")
    began = time.perf_counter()
    probe = run_writer(tmp_path, root, "finite")  # how long one full write takes here
    out, _ = probe.communicate(timeout=120)
    duration = time.perf_counter() - began
    fp = out.split()[0]
    for _ in range(runs):
        snapstore.manage.catalog.remove_snapshot(LocalStore(root), fp)
        proc = run_writer(tmp_path, root, "finite")
        time.sleep(rng.uniform(0, duration * 1.1))
        proc.kill()
        proc.wait(timeout=30)
        store = LocalStore(root)
        if visible(store, fp):  # it committed before the kill: then it is whole
            outcomes["finished before the kill"] += 1
        else:
            outcomes["killed before commit"] += 1
        rerun = run_writer(tmp_path, root, "finite")
        out, _ = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, out
        snap = snapstore.open(fp, root=root)
        assert len(snap) == 2000
        assert [int(s["x"][0]) for s in snap] == list(range(2000))
        snap.close()
    return outcomes


def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    outcomes = kill_at_random_moments(tmp_path, runs=4, seed=1)
    assert sum(outcomes.values()) == 4


@pytest.mark.slow
def test_sigkill_at_thirty_random_moments(tmp_path: Path) -> None:
    outcomes = kill_at_random_moments(tmp_path, runs=30, seed=2)
    assert outcomes["killed before commit"] >= 10  # the kills did land mid-write
