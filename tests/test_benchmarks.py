"""The benchmark scripts run end to end on tiny sizes (figures are not checked here: timings
never belong in a unit test; this only keeps the scripts from rotting)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_format.py"


def test_bench_format_smoke(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(BENCH),
        "--scale",
        "0.01",
        "--rss-scale",
        "0",
        "--tmp",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = {line.split("  ")[0]: line.split() for line in out.stdout.splitlines() if line}
    assert lines["every sample read exactly once"][-2:] == ["True", "True"]
    assert "shuffled read: snapstore (samples/s)" in lines
