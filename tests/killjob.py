"""Kill a job that computes a partitioned stage mid-way, and check what it left behind.

Shared by the engine tests (processes, Dask, Ray): the job runs in its own process group (its
workers, scheduler or local cluster with it), writes one line per item it starts to ``log``, and
is killed with SIGKILL once ``lines`` items have started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore

# The start of a job script: a partitioned stage that logs each item it starts to ``log`` and
# sleeps ``$SLOW`` seconds per item. The script adds its engine set-up under its own
# ``if __name__ == "__main__":`` and calls ``run(engine)``.
JOB_STAGE = """
import json, os, sys, time
import snapstore

def stage(items, log=""):
    for item in items:
        with open(log, "a") as f:
            f.write(f"{item}\\n")
        time.sleep(float(os.environ.get("SLOW", "0")))
        yield {"item": item}

def run(engine):
    snap = snapstore.snapshot(stage, root=sys.argv[1], partition_by="items", ignore=("log",),
                              engine=engine)(list(range(8)), log=sys.argv[2])
    print(json.dumps([int(s["item"]) for s in snap]))
"""


def started(log: Path) -> set[int]:
    """The items the job's stage started (first field of each line of ``log``)."""
    if not log.exists():
        return set()
    return {int(line.split()[0]) for line in log.read_text().splitlines() if line.strip()}


def kill_mid_way(
    cmd: list[str], log: Path, *, lines: int, env: dict[str, str], timeout: float = 120.0
) -> None:
    """Start ``cmd`` in a new session and SIGKILL its whole group once ``lines`` items started."""
    proc = subprocess.Popen(
        cmd, env={**os.environ, **env}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.time() + timeout
    while len(started(log)) < lines and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, f"the job ended before it was killed: {proc.communicate()}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def left_behind(root: Path, partitions: int, settle: float = 0.0) -> set[int]:
    """Assert nothing is visible under ``root``; return the items of the committed partitions
    (one item each: ``JOB_STAGE`` partitions one input per partition, so an item is its
    partition).

    Partitions are found where a partitioned stage keeps them, ``parts/<stage key>/<partition
    fingerprint>/`` at the root, and each committed one is read whole (its commit record names
    a run whose blocks all check out).

    ``settle``: wait until the committed set has not changed for this many seconds, for
    engines whose workers outlive the killed job (Ray's are not in its process group) and may
    still commit the partition they were computing.
    """
    store = LocalStore(root)

    def committed() -> set[int]:
        found: list[int] = []
        for commit in sorted(root.glob("parts/*/*/COMMIT")):
            where = commit.parent.relative_to(root).as_posix()
            reader = SnapshotReader(store, where)
            try:
                found += [int(s["item"]) for s in reader]
            finally:
                reader.close()
        assert len(found) == len(set(found)), f"an item in two partitions: {sorted(found)}"
        return set(found)

    done, still = committed(), time.monotonic()
    while time.monotonic() - still < settle:
        time.sleep(0.1)
        if committed() != done:
            done, still = committed(), time.monotonic()
    snapshots = [p for p in root.iterdir() if len(p.name) == 32]
    assert not any((fp / "COMMIT").exists() for fp in snapshots), "a killed job's snapshot shows"
    assert len(done) < partitions
    return done
