"""benchmarks/bench_partitions.py runs end to end on a small size (no figure is checked: only
what is counted, never a timing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROWS = ("fir", "(a)", "(b)", "(c)", "(d)", "(e)")  # the table's rows
BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_partitions.py"


def test_bench_partitions_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(BENCH), "--files", "60", "--assemble", "40", "--cost", "0.001"]
    cmd += ["--ttfb", "0.005"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line[:3] in ROWS]
    assert len(rows) == 6, out.stdout  # the first run, then (a) to (e)
    assert all(line[44:].split()[4] == "True" for line in rows), out.stdout  # read right
    assert "each exactly once: PASS" in out.stdout, out.stdout
    assert "miss explanation: code: " in out.stdout, out.stdout
    assert "(computed 0, read ok True)" in out.stdout, out.stdout
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed
