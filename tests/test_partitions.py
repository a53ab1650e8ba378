"""Partitioned stages: written partition by partition, resumed after crashes, shared in sweeps."""

from __future__ import annotations

import json
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
from snapstore.errors import SchemaError
from snapstore.fingerprint.partition import members
from snapstore.manage.gc import collect_garbage, find_garbage
from snapstore.storage.store import LocalStore, Store
from snapstore.write.boundaries import content_boundaries
from snapstore.write.partitions import commit_partitions, partition_dir, write_partition


def make_stage(log: list[list[str]]):
    def stage(paths, scale=1):
        log.append(list(paths))
        for p in paths:
            for i in range(3):
                yield {"p": p, "x": np.full(4, i * scale, np.int32)}

    return stage


def test_partitioned_equals_unpartitioned(store: Store, tmp_path: Path) -> None:
    calls: list[list[str]] = []
    stage = make_stage(calls)
    parted = snapstore.snapshot(stage, root=store, partition_by="paths", partition_size=2)
    snap = parted(list("abcde"), scale=2)
    plain = snapstore.snapshot(stage, root=tmp_path / "plain")(list("abcde"), scale=2)
    assert snap.fingerprint == plain.fingerprint  # partitioning is not part of the identity
    got = [(s["p"], int(s["x"][0])) for s in snap]
    assert got == [(s["p"], int(s["x"][0])) for s in plain]
    assert got[:4] == [("a", 0), ("a", 2), ("a", 4), ("b", 0)]
    # The partitions are the ones the inputs' names choose (about 2 inputs each): here a
    # partition of several inputs among single ones.
    names = [name for name, _ in members(list("abcde"))]
    expected = [list("abcde")[r.start : r.stop] for r in content_boundaries(names, 2)]
    assert any(len(group) > 1 for group in expected) and len(expected) < 5
    n = len(expected)
    assert sorted(calls[:n]) == sorted(expected)  # once per partition
    assert calls[n:] == [list("abcde")]  # then the unpartitioned call, whole
    assert snap.manifest["partitions"] == n
    batch = next(iter(snap.batches(15, shuffle=True)))
    assert sorted(batch["p"]) == sorted(list("abcde") * 3)
    assert parted(list("abcde"), scale=2).committed
    snap.close()
    plain.close()


FLAKY = """
import json, os, sys, time
import numpy as np, snapstore

root, log = sys.argv[1], sys.argv[2]
store = snapstore.open_store(root, **json.loads(sys.argv[3]))

# One partition at a time, in order, unless the test asks for an engine.
@snapstore.snapshot(root=store, partition_by="items", lease=5.0,
                    engine=os.environ.get("ENGINE", "thread"),
                    workers=int(os.environ.get("WORKERS", "1")))
def stage(items):
    for item in items:
        with open(log, "a") as f:
            f.write(f"{item}\\n")
        if item == int(os.environ.get("FAIL_AT", "-1")):  # read at run time: not hashed
            raise RuntimeError(f"item {item} is bad")
        time.sleep(float(os.environ.get("SLOW", "0")))
        for i in range(50):
            yield {"item": item, "i": i, "v": np.full(64, item, np.float32)}

snap = stage(list(range(8)))
print(json.dumps({"fingerprint": snap.fingerprint, "n": len(snap),
                  "items": [int(s["item"]) for s in snap][::50]}))
"""


def run(
    script: Path,
    root: Path | str,
    log: Path,
    fail_at: int = -1,
    options: dict | None = None,
    **env: str,
):
    env["FAIL_AT"] = str(fail_at)
    return subprocess.Popen(
        [sys.executable, str(script), str(root), str(log), json.dumps(options or {})],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


@pytest.fixture
def flaky(tmp_path: Path) -> Path:
    script = tmp_path / "flaky.py"
    script.write_text(textwrap.dedent(FLAKY))
    return script


def logged(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def test_a_failed_partition_keeps_the_finished_ones(flaky: Path, tmp_path: Path) -> None:
    root, log = tmp_path / "root", tmp_path / "log"
    out, err = run(flaky, root, log, fail_at=5).communicate(timeout=120)
    assert "item 5 is bad" in err and "The 5 finished partitions are kept" in err
    assert logged(log) == [0, 1, 2, 3, 4, 5]
    log.unlink()
    out, err = run(flaky, root, log).communicate(timeout=120)
    result = json.loads(out)
    assert logged(log) == [5, 6, 7]  # only the missing partitions were computed
    assert result["n"] == 400 and result["items"] == list(range(8))


def test_a_killed_writer_resumes_where_it_stopped(flaky: Path, tmp_path: Path) -> None:
    root, log = tmp_path / "root", tmp_path / "log"
    proc = run(flaky, root, log, SLOW="0.15")
    deadline = time.time() + 60
    while len(logged(log)) < 4 and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = logged(log)
    assert 4 <= len(before) < 8
    log.unlink()
    out, err = run(flaky, root, log).communicate(timeout=120)
    assert json.loads(out)["items"] == list(range(8)), err
    redone = logged(log)
    # The partition being written at the kill is computed again; finished ones are not.
    assert redone[0] == before[-1] and redone == list(range(before[-1], 8))


@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_six_processes_share_the_partitions(
    flaky: Path, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    log = tmp_path / "log"
    if backend == "gcs":
        root, options = request.getfixturevalue("gcs_root")
    else:
        root, options = str(tmp_path / "root"), {}
    procs = [run(flaky, root, log, options=options, SLOW="0.2") for _ in range(6)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(out)
    assert sorted(logged(log)) == list(range(8))  # every partition computed exactly once
    assert len(set(results)) == 1 and json.loads(results[0])["n"] == 400


def test_partitions_with_different_inferred_schemas_are_refused(tmp_path: Path) -> None:
    def stage(items):
        for item in items:
            yield {"v": np.zeros(3, np.float32 if item else np.int64)}

    with pytest.raises(SchemaError, match=r"partitions of .* inferred different schemas"):
        snapstore.snapshot(stage, root=tmp_path, partition_by="items")([0, 1]).materialize()
    declared = snapstore.snapshot(
        stage,
        root=tmp_path / "declared",
        partition_by="items",
        schema={"v": ("float32", (3,))},
    )
    with pytest.raises(SchemaError):  # the declared schema refuses the int64 partition
        declared([0, 1]).materialize()


def test_empty_inputs_and_empty_partitions(tmp_path: Path) -> None:
    def stage(items):
        for item in items:
            yield from ({"x": item} for _ in range(item))

    parted = snapstore.snapshot(stage, root=tmp_path, partition_by="items")
    assert len(parted([])) == 0
    assert [s["x"] for s in parted([0, 2, 0, 1])] == [2, 2, 1]


def test_bad_partition_settings(tmp_path: Path) -> None:
    def stage(items):
        yield {"x": 1}

    with pytest.raises(ValueError, match=r"partition_by='paths' is not a parameter of"):
        snapstore.snapshot(stage, partition_by="paths")
    with pytest.raises(ValueError, match="partition_size: expected an int >= 1, found 0"):
        snapstore.snapshot(stage, partition_by="items", partition_size=0)
    with pytest.raises(TypeError, match=r"expected snapstore.files\(...\) or a sequence \(list,"):
        snapstore.snapshot(stage, root=tmp_path, partition_by="items")({1, 2}).materialize()


def test_gc_keeps_committed_partitions_and_removes_crashed_attempts(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    fp = "e" * 32
    for p in range(2):
        assert write_partition(store, fp, p, lambda p=p: ({"x": p * 10 + i} for i in range(5)))
    crashed = f"{partition_dir(fp, 1)}/runs/20200101T000000-host-9-abcdef01"
    store.write_bytes(f"{crashed}/shard-00000.snap", b"junk")
    assert commit_partitions(store, fp, 2)
    assert not commit_partitions(store, fp, 2)  # a second assembly loses, and cleans up
    assert {g.path for g in find_garbage(store, min_age=3600)} == {crashed}
    collect_garbage(store, min_age=3600)
    snap = snapstore.open(fp, root=store)
    assert [s["x"] for s in snap] == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]
    snap.close()
