"""``kill -9`` of a partitioned stage's job at random points, with shared partitions (issue 25).

While partitions are written, and while a snapshot is assembled from partitions that exist:
nothing partial is ever visible (no commit record of the snapshot, or a whole one; every
committed partition reads whole), and a rerun completes and reads right. The jobs are
:data:`killjob.JOB_STAGE` (eight items, one per partition) on the thread engine; the random
points come from a seed printed with each test (``-s`` shows it).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from killjob import JOB_STAGE, kill_mid_way, started

import snapstore
from snapstore.errors import SnapshotNotFoundError
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore

ITEMS = list(range(8))

# JOB_STAGE's run, on a simulated bucket at $TTFB seconds a request when set (so that a snapshot's
# assembly takes long enough to be killed in the middle); writes ``<log>.began`` first.
JOB = (
    JOB_STAGE
    + """
if __name__ == "__main__":
    from snapstore.storage.simulate import simulated_store

    ttfb = float(os.environ.get("TTFB", "0"))
    if ttfb:
        plain = snapstore.snapshot
        snapstore.snapshot = lambda fn, root, **kw: plain(
            fn, root=simulated_store(root, ttfb=ttfb), **kw
        )
    open(sys.argv[2] + ".began", "w").close()
    run("thread")
"""
)


@pytest.fixture
def seeded() -> random.Random:
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"random kill points: seed {seed}")
    return random.Random(seed)


def job_cmd(tmp: Path) -> tuple[list[str], Path, Path]:
    job, root, log = tmp / "job.py", tmp / "root", tmp / "log"
    job.write_text(JOB)
    return [sys.executable, str(job), str(root), str(log)], root, log


def rerun(cmd: list[str], log: Path) -> set[int]:
    """Run the job to the end; it reads every item in order. The items it computed."""
    log.unlink(missing_ok=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ITEMS
    return started(log)


def snapshots(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if len(p.name) == 32] if root.exists() else []


def committed_partitions(root: Path) -> set[int]:
    """The items of the committed partitions, each read whole (every block checked)."""
    store, found = LocalStore(root), []
    for commit in root.glob("parts/*/*/COMMIT"):
        reader = SnapshotReader(store, commit.parent.relative_to(root).as_posix())
        try:
            found += [int(s["item"]) for s in reader]
        finally:
            reader.close()
    assert len(found) == len(set(found)), found
    return set(found)


def test_killed_while_partitions_are_written(tmp_path: Path, seeded: random.Random) -> None:
    cmd, root, log = job_cmd(tmp_path)
    done: set[int] = set()
    computed: set[int] = set()
    for _ in range(3):
        if len(ITEMS) - len(done) < 2:
            break
        log.unlink(missing_ok=True)
        # Killed once `lines` of the items left have started: the other worker thread is then
        # anywhere in its partition (computing, writing blocks, committing).
        lines = seeded.randint(1, len(ITEMS) - len(done) - 1)
        slow = f"{seeded.uniform(0.01, 0.05):.3f}"
        t = time.monotonic()
        kill_mid_way(cmd, log, lines=lines, env={"SLOW": slow})
        print("kill", lines, slow, time.monotonic() - t)
        computed |= started(log)
        now = committed_partitions(root)  # each one whole
        assert not any((p / "COMMIT").exists() for p in snapshots(root)), "a snapshot shows"
        assert done <= now <= computed, (done, now, computed)
        done = now
    assert set(ITEMS) - done <= rerun(cmd, log) <= set(ITEMS) - done
    assert committed_partitions(root) == set(ITEMS)


def test_killed_while_the_snapshot_is_assembled(tmp_path: Path, seeded: random.Random) -> None:
    cmd, root, log = job_cmd(tmp_path)
    rerun(cmd, log)  # every partition computed, and the snapshot committed
    (fp,) = snapshots(root)
    store = LocalStore(root)
    for round_ in range(4):
        shutil.rmtree(fp)  # as if the partitions had been computed by calls of other lists
        began = Path(f"{log}.began")
        began.unlink(missing_ok=True)
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, "TTFB": "0.02"},
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not began.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        if round_ % 2:  # anywhere in the ~15 round trips of 20 ms up to the commit record
            time.sleep(seeded.uniform(0.0, 0.4))
        else:  # while the snapshot's index, manifest and commit record are written
            while not (fp / "runs").exists() and proc.poll() is None:
                time.sleep(0.001)
            time.sleep(seeded.uniform(0.0, 0.06))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if (fp / "COMMIT").exists():  # killed after the commit: the snapshot is whole
            with snapstore.open(fp.name, root=root) as snap:
                assert [int(s["item"]) for s in snap] == ITEMS
        else:
            with pytest.raises(SnapshotNotFoundError):
                snapstore.open(fp.name, root=store)
            fp.mkdir(exist_ok=True)  # for the next round's rmtree
        assert committed_partitions(root) == set(ITEMS)  # the partitions are untouched
    shutil.rmtree(fp)
    assert rerun(cmd, log) == set()  # assembled again; nothing computed
    assert (fp / "COMMIT").exists()
