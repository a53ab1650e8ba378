"""A job computing a partitioned stage on Ray, killed mid-way, with its local Ray instance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from killjob import JOB_STAGE, kill_mid_way, left_behind, started

pytest.importorskip("ray", reason="Ray is not installed: pip install 'snapstore[ray]'")

JOB = (
    JOB_STAGE
    + """
import ray

if __name__ == "__main__":
    ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False,
             log_to_driver=False)
    run("ray")
    ray.shutdown()
"""
)


def test_a_killed_ray_job_leaves_nothing_visible_and_the_rerun_completes(tmp_path: Path) -> None:
    root, log = tmp_path / "root", tmp_path / "log"
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB))
    cmd = [sys.executable, str(job), str(root), str(log)]
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    kill_mid_way(cmd, log, lines=3, env={**env, "SLOW": "1.0"})  # the driver and its local Ray
    # Ray's worker processes are not in the driver's process group: a task that was running may
    # still finish and commit its partition (harmless: the rerun skips it).
    done = left_behind(root, 8, settle=3.0)
    assert done <= started(log)
    log.unlink()
    run = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env={**os.environ, **env}
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == list(range(8))
    assert {int(x) for x in log.read_text().split()} == set(range(8)) - done
