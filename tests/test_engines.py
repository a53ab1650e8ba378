"""Partitioned stages on engines: local processes (the default) and threads.

Ray and Dask run the same tasks; their tests live in test_ray.py and test_dask.py.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from killjob import kill_mid_way, left_behind, started

import snapstore
from snapstore.write.engines import (
    CannotTravelError,
    FunctionRef,
    ProcessEngine,
    ThreadEngine,
    make_engine,
    usable_cores,
)
from snapstore.write.jobs import partition_layout
from snapstore.write.partitions import partition_done


def squares(items: list[int], log: str = "", fail_at: int = -1, crash_at: int = -1):
    """A stage that can be found by name: module ``test_engines``, importable by workers."""
    for item in items:
        if log:
            with open(log, "a") as f:
                f.write(f"{item} {os.getpid()}\n")
            meet_others(Path(log))
        if item == fail_at:
            raise RuntimeError(f"item {item} is bad")
        if item == crash_at:
            os._exit(3)  # the worker process dies without a word
        for i in range(4):
            yield {"item": item, "i": i, "v": np.full(8, item * i, np.int64)}


def meet_others(log: Path) -> None:
    """With $MEET_WORKERS=n, wait (up to 60 s) until n processes have logged: a worker that
    started first would otherwise take every partition on a busy machine before the others
    are up, and a test of how many workers did the work would depend on timing."""
    wanted = int(os.environ.get("MEET_WORKERS", "0"))
    deadline = time.monotonic() + 60
    while len({pid for _, pid in logged(log)}) < wanted and time.monotonic() < deadline:
        time.sleep(0.01)


def logged(log: Path) -> list[tuple[int, int]]:
    if not log.exists():
        return []
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines()]  # type: ignore[misc]


def stage(root: Path | Any, **settings: Any) -> Any:
    settings.setdefault("partition_by", "items")
    # fail_at and crash_at stand for transient trouble: left out of the fingerprint, so the
    # rerun without them continues the same snapshot.
    return snapstore.snapshot(squares, root=root, ignore=("log", "fail_at", "crash_at"), **settings)


def values(snap: snapstore.Snapshot) -> list[tuple[int, int, int]]:
    return [(int(s["item"]), int(s["i"]), int(s["v"].sum())) for s in snap]


def test_process_engine_writes_what_one_process_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "log"
    monkeypatch.setenv("MEET_WORKERS", "2")  # each partition waits until both workers are up
    snap = stage(tmp_path / "a", engine="process", workers=2)(list(range(6)), log=str(log))
    plain = snapstore.snapshot(squares, root=tmp_path / "b", ignore=("log", "fail_at", "crash_at"))(
        list(range(6))
    )
    assert snap.fingerprint == plain.fingerprint  # the engine is not part of the identity
    assert values(snap) == values(plain)
    assert snap.manifest["partitions"] == 6
    pids = {pid for _, pid in logged(log)}
    assert os.getpid() not in pids and len(pids) == 2  # two worker processes did the work
    assert sorted(item for item, _ in logged(log)) == list(range(6))  # each partition once
    snap.close()
    plain.close()


def test_thread_engine_and_fallback_for_a_closure(tmp_path: Path, caplog: Any) -> None:
    def local_stage(items: list[int]):
        for item in items:
            yield {"item": item}

    with caplog.at_level(logging.WARNING, logger="snapstore"):
        snap = snapstore.snapshot(local_stage, root=tmp_path, partition_by="items")(list(range(5)))
        assert [int(s["item"]) for s in snap] == list(range(5))
    assert "cannot be found by name in another process" in caplog.text
    assert "on threads instead" in caplog.text
    with pytest.raises(CannotTravelError, match="lambda, a closure, defined inside a function"):
        snapstore.snapshot(
            local_stage, root=tmp_path / "x", partition_by="items", engine="process"
        )([1, 2]).materialize()
    threads = snapstore.snapshot(
        local_stage, root=tmp_path / "t", partition_by="items", engine="thread"
    )
    assert [int(s["item"]) for s in threads(list(range(5)))] == list(range(5))


def test_progress_reports_every_partition(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    snap = stage(tmp_path, engine="process", workers=2)(list(range(5)))
    snap.materialize(progress=lambda samples, stored: seen.append((samples, stored)))
    assert [s for s, _ in seen] == [4, 8, 12, 16, 20]
    assert all(b > a for (_, a), (_, b) in itertools.pairwise(seen))


def test_a_failing_partition_is_reported_with_its_traceback(tmp_path: Path) -> None:
    root, log = tmp_path / "root", tmp_path / "log"
    call = stage(root, engine="process", workers=2)
    with pytest.raises(RuntimeError, match="item 3 is bad") as info:
        call(list(range(8)), log=str(log), fail_at=3).materialize()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "partition 3 of stage" in notes and "it raised" in notes
    assert "a rerun computes only the missing ones" in notes
    assert "in squares" in str(info.value.__cause__)  # the worker's traceback came along
    snap = call(list(range(8)), log=str(log), fail_at=3)
    assert not snap.committed
    layout = partition_layout(call.job(snap))  # parts/<stage key>/<partition fingerprint>
    done = [p for p in range(8) if partition_done(snap.store, layout, p)]
    assert 3 not in done and set(range(3)) <= set(done)  # started before 3 failed: kept
    assert max(item for item, _ in logged(log)) <= 4  # nothing new started after the failure
    log.unlink()
    again = stage(root, engine="process", workers=2)(list(range(8)), log=str(log)).materialize()
    assert [i for i, _ in sorted(logged(log))] == sorted(set(range(8)) - set(done))
    assert [v[0] for v in values(again)][::4] == list(range(8))
    again.close()


def test_a_worker_that_dies_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "root"
    call = stage(root, engine="process", workers=2)
    with pytest.raises(BrokenProcessPool) as info:
        call(list(range(6)), crash_at=2).materialize()
    note = "\n".join(info.value.__notes__)
    # Partition 2's worker died; whichever partition ran beside it failed with the pool.
    assert "worker process died" in note or "worker processes of stage" in note, note
    assert "a rerun computes only the missing ones" in note
    assert not call(list(range(6)), crash_at=2).committed
    snap = stage(root, engine="process", workers=2)(list(range(6)))
    assert [v[0] for v in values(snap)][::4] == list(range(6))


def test_what_cannot_travel_is_refused_clearly(tmp_path: Path) -> None:
    lock = threading.Lock()

    def with_lock(items: list[int], handle: Any = None):
        yield from ({"item": i} for i in items)

    engine = ProcessEngine(2)
    task_args = {"items": [1], "handle": lock}
    from snapstore.storage.store import open_store
    from snapstore.write.engines import PartitionTask

    task = PartitionTask(squares, "squares", (), task_args, open_store(tmp_path), "f" * 32, 0)
    with pytest.raises(CannotTravelError, match="do not pickle"):
        engine.prepare(task, squares)
    memory = PartitionTask(squares, "squares", ([1],), {}, open_store("memory://e"), "f" * 32, 0)
    with pytest.raises(CannotTravelError, match="memory:// store lives in this process only"):
        engine.prepare(memory, squares)
    # The default engine runs a memory store's partitions on threads.
    snap = stage("memory://engines")(list(range(3)))
    assert [v[0] for v in values(snap)][::4] == [0, 1, 2]


def test_engine_settings_are_checked_up_front(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="engine: expected one of"):
        stage(tmp_path, engine="spark")
    with pytest.raises(ValueError, match="workers: expected an int >= 1, found 0"):
        stage(tmp_path, workers=0)
    with pytest.raises(ValueError, match="apply to partitioned stages"):
        snapstore.snapshot(squares, root=tmp_path, engine="thread")
    with pytest.raises(ValueError, match="pass workers to the engine object"):
        make_engine(ThreadEngine(2), 3)
    assert make_engine(None).workers == usable_cores()
    assert FunctionRef.of(squares) == FunctionRef("test_engines", "squares")
    assert FunctionRef.of(lambda: None) is None


SCRIPT = """
import os, sys, json
import numpy as np
import snapstore

@snapstore.snapshot(root=sys.argv[1], partition_by="items", ignore=("log",), workers=2)
def stage(items, log=""):
    for item in items:
        with open(log, "a") as f:
            f.write(f"{item} {os.getpid()}\\n")
        deadline = time.time() + 60  # with $MEET_WORKERS=n, until n processes have logged
        while len({line.split()[1] for line in open(log)}) < int(os.environ.get("MEET_WORKERS", 0)):
            if time.time() > deadline:
                break
            time.sleep(0.01)
        time.sleep(float(os.environ.get("SLOW", "0")))
        yield {"item": item, "v": np.full(16, item, np.int32)}

import time
"""

GUARDED = (
    SCRIPT
    + """
if __name__ == "__main__":
    snap = stage(list(range(8)), log=sys.argv[2])
    print(json.dumps({"pid": os.getpid(), "items": [int(s["item"]) for s in snap]}))
"""
)

UNGUARDED = (
    SCRIPT
    + """
snap = stage(list(range(8)), log=sys.argv[2])
print(json.dumps({"pid": os.getpid(), "items": [int(s["item"]) for s in snap]}))
"""
)


def script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_guarded_script_runs_on_processes_and_an_unguarded_one_on_threads(
    tmp_path: Path,
) -> None:
    for text, on_processes in ((GUARDED, True), (UNGUARDED, False)):
        log = tmp_path / f"log-{on_processes}"
        cmd = [sys.executable, str(script(tmp_path, text)), str(tmp_path / "r"), str(log)]
        # On processes, each partition waits until both workers are up: on a busy machine the
        # first could otherwise take all eight before the second starts.
        env = {**os.environ, "MEET_WORKERS": "2" if on_processes else "0"}
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout)
        pids = {pid for _, pid in logged(log)}
        assert result["items"] == list(range(8)) or not on_processes  # second run: a hit
        if on_processes:
            assert result["pid"] not in pids and len(pids) == 2
        else:
            assert pids in (set(), {result["pid"]})  # threads of the job, or already committed
        shutil.rmtree(tmp_path / "r", ignore_errors=True)
        if not on_processes:
            assert "if __name__ == '__main__':" in run.stderr and "threads instead" in run.stderr


def test_a_killed_job_leaves_nothing_visible_and_the_rerun_computes_the_rest(
    tmp_path: Path,
) -> None:
    root, log = tmp_path / "root", tmp_path / "log"
    job = script(tmp_path, GUARDED)
    kill_mid_way([sys.executable, str(job), str(root), str(log)], log, lines=3, env={"SLOW": "0.3"})
    first = started(log)
    done = left_behind(root, 8)
    assert done <= first  # committed partitions are ones the killed job computed
    log.unlink()
    run = subprocess.run(
        [sys.executable, str(job), str(root), str(log)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["items"] == list(range(8))
    assert {item for item, _ in logged(log)} == set(range(8)) - done  # only the missing ones


class BrokenPool:
    """A pool that has lost a worker: every submit fails as ProcessPoolExecutor's does then."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        raise BrokenProcessPool("A child process terminated abruptly")

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass


def test_a_pool_broken_between_partitions_is_reported(tmp_path: Path) -> None:
    from concurrent.futures import Future

    from snapstore.storage import claims
    from snapstore.storage.store import LocalStore
    from snapstore.write.engines import PartitionTask
    from snapstore.write.parallel import PartitionJob, _launch

    store = LocalStore(tmp_path)
    tasks = [PartitionTask(squares, "squares", ([p],), {}, store, "f" * 32, p) for p in range(3)]
    job = PartitionJob(
        store, "f" * 32, "squares", tasks, 60.0, claims.SystemClock(), lambda p, s: False,
        committed=lambda: False,
    )  # fmt: skip
    engine = ProcessEngine(2)
    running: dict[Any, Any] = {Future(): (9, None)}  # a partition whose future will report
    pending = list(tasks)
    assert _launch(job, engine, BrokenPool(), pending, running) == (False, False)
    assert pending == tasks and claims.inspect_claim(store, "f" * 32 + "/parts/000000").expired(
        time.time()
    )  # the claim taken for the submit was released
    with pytest.raises(BrokenProcessPool) as info:
        _launch(job, engine, BrokenPool(), pending, {})
    assert "died before partition 0 could start" in "\n".join(info.value.__notes__)
