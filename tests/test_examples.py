"""Examples run as scripts, on small sizes, and print what a person wants to see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from snapstore.fingerprint.partition import members
from snapstore.write.boundaries import content_boundaries

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart(tmp_path: Path) -> None:
    root = tmp_path / "root"
    cmd = [sys.executable, str(EXAMPLES / "quickstart.py"), "--samples", "300", "--root", str(root)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "first run (compute + write)" in first.stdout
    assert "epoch from the snapshot" in first.stdout and "x faster" in first.stdout
    assert "FINGERPRINT" in first.stdout and "committed" in first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "first run (already committed)     an earlier run's snapshot, created" in second.stdout
    assert f"under {root}: nothing to compute" in second.stdout  # where it was found; no 0.00 s
    assert first.stdout.split()[1] == second.stdout.split()[1]  # same fingerprint in a new process


def test_sweep_computes_each_partition_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    cmd = [sys.executable, str(EXAMPLES / "sweep.py"), "--jobs", "3", "--samples", "600",
           "--root", str(root)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "stage ran once per partition: 12 calls for 12 partitions" in run.stdout, run.stdout
    assert "all 3 jobs read fingerprint" in run.stdout, run.stdout
    assert "UNEXPECTED" not in run.stdout
    table = [line.split() for line in run.stdout.splitlines() if line.split()[:1] in (["0"],
             ["1"], ["2"])]  # fmt: skip
    assert len(table) == 3 and sum(int(row[2]) for row in table) == 12, run.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "stage calls: 0 (the snapshot was already committed" in again.stdout, again.stdout


def test_gcs_against_the_emulator() -> None:
    from servers import fake_gcs_binary  # skips when the wrapper or its binary is missing

    binary = fake_gcs_binary()
    try:
        subprocess.run([str(binary), "-help"], capture_output=True, timeout=30)
    except OSError as exc:  # e.g. ENOEXEC: a binary for another platform
        pytest.skip(f"cannot run fake-gcs-server ({binary}): {exc}")
    cmd = [sys.executable, str(EXAMPLES / "gcs.py"), "--samples", "3000"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "writing to gs://snapstore-example/snaps" in out, out
    assert "write (compute + upload)" in out and "ok, " in out, out
    assert "3000 samples" in out and "samples/s" in out and "requests" in out, out
    assert "cache hit, stage not run" in out, out
    assert "stopped fake-gcs-server" in out, out


def test_torch_training(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = str(EXAMPLES / "torch_training.py")
    cmd = [sys.executable, script, "--samples", "512", "--root", str(root), "--steps", "12"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "samples/s" in done.stdout and "loss" in done.stdout
    assert "checkpoint at step 6" in done.stdout
    assert "resumed at batch 6: next batch ids match" in done.stdout


def test_ray_materialize() -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'snapstore[ray]'")
    cmd = [sys.executable, str(EXAMPLES / "ray_materialize.py"), "--seeds", "100", "--rows", "800"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    # About 25 seeds per partition, at the boundaries the seeds choose.
    spans = content_boundaries([name for name, _ in members(list(range(100)))], 25)
    assert f"engine='ray': 100 samples in {len(spans)} partitions" in out, out
    assert "same fingerprint and samples as a local write: True" in out, out
    assert "second call: committed already" in out and "(True)" in out, out
    assert "800 rows in 4 partitions" in out, out
    assert "read back as a Ray Dataset: 800 rows, columns ['id', 'tokens']" in out, out
    assert "second write_snapshot: committed already" in out, out
