"""Partitioned stages on a local dask.distributed cluster (2 worker processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

distributed = pytest.importorskip(
    "distributed", reason="dask.distributed is not installed: pip install 'snapstore[dask]'"
)

from killjob import JOB_STAGE, kill_mid_way, left_behind, started  # noqa: E402

import snapstore  # noqa: E402
from snapstore.manage.gc import find_garbage  # noqa: E402
from snapstore.write.engines import DaskEngine  # noqa: E402
from snapstore.write.jobs import partition_layout  # noqa: E402
from snapstore.write.partitions import partition_dir  # noqa: E402


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        memory_limit="600MiB",
        dashboard_address=None,
        host="127.0.0.1",
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def tokens(items: list[int], log: str = "", flaky: str = ""):
    """The stage; ``flaky`` names a directory where a partition's first attempt fails."""
    for item in items:
        if flaky:
            marker = Path(flaky) / f"failed-{item}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                raise OSError(f"transient failure on item {item}")
        if log:
            with open(log, "a") as f:
                f.write(f"{item} {os.getpid()}\n")
        for i in range(5):
            yield {"item": item, "i": i, "t": np.arange(3, dtype=np.int32) + item * i}


def stage(root: Path, **settings: Any) -> Any:
    return snapstore.snapshot(
        tokens, root=root, partition_by="items", ignore=("log", "flaky"), **settings
    )


def rows(snap: snapstore.Snapshot) -> list[tuple[int, int, list[int]]]:
    return [(int(s["item"]), int(s["i"]), s["t"].tolist()) for s in snap]


def test_dask_writes_what_a_local_write_writes(client: Any, tmp_path: Path) -> None:
    log = tmp_path / "log"
    on_dask = stage(tmp_path / "dask", engine=client)(list(range(6)), log=str(log))
    local = stage(tmp_path / "local", engine="thread")(list(range(6)))
    assert on_dask.fingerprint == local.fingerprint
    assert rows(on_dask) == rows(local)
    workers = {int(line.split()[1]) for line in log.read_text().splitlines()}
    assert os.getpid() not in workers and workers <= set(client.run(os.getpid).values())
    # engine="dask" finds the current client.
    again = stage(tmp_path / "named", engine="dask")(list(range(6)))
    assert rows(again) == rows(local)
    for snap in (on_dask, local, again):
        snap.close()


def test_a_task_that_fails_once_is_retried_without_duplicates(client: Any, tmp_path: Path) -> None:
    flaky = tmp_path / "flaky"
    flaky.mkdir()
    root = tmp_path / "root"
    call = stage(root, engine=DaskEngine(client, retries=1))
    snap = call(list(range(4)), flaky=str(flaky))
    assert rows(snap) == rows(stage(tmp_path / "local", engine="thread")(list(range(4))))
    assert len(list(flaky.iterdir())) == 4  # every partition failed once
    store = snap.store
    layout = partition_layout(call.job(snap))  # parts/<stage key>/<partition fingerprint>
    assert snap.manifest["shared_partitions"] == [
        f"{layout.base.rsplit('/', 1)[-1]}/{layout.name(p)}" for p in range(4)
    ]
    for p in range(4):  # the failed attempts committed nothing: one run per partition
        committed = json.loads(store.read_bytes(f"{partition_dir(layout, p)}/COMMIT"))
        runs = store.list_dir(f"{partition_dir(layout, p)}/runs")
        assert committed["run"] in runs
    assert not find_garbage(store, min_age=0)  # failed attempts leave no uncommitted runs
    snap.close()


def test_without_retries_the_failure_reaches_the_caller(client: Any, tmp_path: Path) -> None:
    flaky = tmp_path / "flaky"
    flaky.mkdir()
    call = stage(tmp_path / "root", engine=DaskEngine(client, retries=0))
    with pytest.raises(OSError, match="transient failure on item") as info:
        call(list(range(3)), flaky=str(flaky)).materialize()
    assert "partition" in "\n".join(info.value.__notes__)
    assert not call(list(range(3))).committed


JOB = (
    JOB_STAGE
    + """
import distributed

if __name__ == "__main__":
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, host="127.0.0.1")
    client = distributed.Client(cluster)
    run(client)
    client.close()
    cluster.close()
"""
)


def test_a_killed_job_leaves_nothing_visible_and_the_rerun_completes(tmp_path: Path) -> None:
    root, log = tmp_path / "root", tmp_path / "log"
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB))
    cmd = [sys.executable, str(job), str(root), str(log)]
    kill_mid_way(cmd, log, lines=3, env={"SLOW": "0.5"})  # with its scheduler and workers
    first = started(log)
    done = left_behind(root, 8)
    assert done <= first
    log.unlink()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == list(range(8))
    assert {int(x) for x in log.read_text().split()} == set(range(8)) - done
