"""The process engine sizes its workers' numeric thread pools (OpenMP, BLAS, torch) to their
share of the cores, keeps what the user set, and leaves the parent's environment as it was.

The pools are read back inside the workers: the variables they were started with, the BLAS and
OpenMP pools threadpoolctl finds loaded, and torch's intra-op threads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import threadpoolctl

import snapstore
from snapstore.write.engines import THREAD_VARIABLES, ProcessEngine, thread_pool_env, usable_cores

try:
    import torch
except ImportError:  # the torch extra is optional; numpy's BLAS is always there
    torch = None


def pools(items: list[int]) -> Iterator[dict[str, Any]]:
    """A stage reporting the thread pools of the process it runs in (found by name: workers
    import it from this module)."""
    if torch is not None:
        torch.zeros(2) @ torch.zeros(2)  # torch's pools exist once it has computed something
    info = threadpoolctl.threadpool_info()
    report = {
        "pid": os.getpid(),
        "env": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "blas": sorted({pool["num_threads"] for pool in info if pool["user_api"] == "blas"}),
        "openmp": sorted({pool["num_threads"] for pool in info if pool["user_api"] == "openmp"}),
        "torch": None if torch is None else torch.get_num_threads(),
    }
    for item in items:
        yield {"item": item, "report": json.dumps(report)}


def reports(tmp_path: Path, workers: int) -> list[dict[str, Any]]:
    """What every worker of a ``workers``-process job reported, checking that the job ran on
    workers and left the parent's environment as it was."""
    before = dict(os.environ)
    stage = snapstore.snapshot(
        pools, root=tmp_path, partition_by="items", engine=ProcessEngine(workers)
    )
    snap = stage(list(range(2 * workers))).materialize()
    found = {s["report"] for s in snap}
    snap.close()
    assert dict(os.environ) == before  # the variables were set for the workers' start only
    out = [json.loads(text) for text in found]
    assert os.getpid() not in {r["pid"] for r in out}
    return out


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the pool variables set, as on a machine where nobody thought of them."""
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("unset")
def test_each_worker_gets_its_share_of_the_cores(tmp_path: Path) -> None:
    workers = 2
    share = max(1, usable_cores() // workers)
    for report in reports(tmp_path, workers):
        assert report["env"] == dict.fromkeys(THREAD_VARIABLES, str(share))
        assert report["blas"] == [share]  # numpy's OpenBLAS, sized when the worker loaded it
        assert report["openmp"] in ([], [share])
        assert report["torch"] in (None, share)


@pytest.mark.usefixtures("unset")
def test_a_users_omp_num_threads_is_kept_and_speaks_for_blas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One worker would get every core; the user asked for one thread.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for report in reports(tmp_path, 1):
        env = report["env"]
        assert env["OMP_NUM_THREADS"] == "1"
        # OpenBLAS, MKL, BLIS and numexpr read OMP_NUM_THREADS when their own is unset.
        for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
            assert env[name] is None, name
        assert env["VECLIB_MAXIMUM_THREADS"] == str(usable_cores())
        assert report["blas"] == [1] and report["torch"] in (None, 1)


def test_thread_pool_env_keeps_every_variable_the_user_set() -> None:
    share = str(max(1, usable_cores() // 2))
    assert thread_pool_env(2, {}) == dict.fromkeys(THREAD_VARIABLES, share)
    assert thread_pool_env(4 * usable_cores(), {}) == dict.fromkeys(THREAD_VARIABLES, "1")
    mine = thread_pool_env(2, {"OPENBLAS_NUM_THREADS": "3", "MKL_NUM_THREADS": " "})
    assert "OPENBLAS_NUM_THREADS" not in mine  # the user's value is the one workers see
    assert mine["MKL_NUM_THREADS"] == share  # blank is unset, for the libraries as for us
    assert thread_pool_env(2, {"OMP_NUM_THREADS": "3"}) == {"VECLIB_MAXIMUM_THREADS": share}
    every = dict.fromkeys(THREAD_VARIABLES, "2")
    assert thread_pool_env(2, every) == {}
