"""Examples run as scripts, on small sizes, and print what a person wants to see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert "first run (already committed)" in second.stdout
    assert first.stdout.split()[1] == second.stdout.split()[1]  # same fingerprint in a new process
