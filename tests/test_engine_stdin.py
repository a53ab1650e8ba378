"""A partitioned stage called from a program read from standard input (``python -``): spawned
worker processes cannot start from "<stdin>" (each died at start, and the job failed with
BrokenProcessPool), so the process engine falls back to threads, with a warning that says why."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_a_program_from_stdin_runs_its_partitions_on_threads(tmp_path: Path) -> None:
    (tmp_path / "stagemod.py").write_text(
        textwrap.dedent(
            """
            import snapstore

            @snapstore.snapshot(partition_by="items", partition_size=2)
            def doubled(items):
                for i in items:
                    yield {"x": 2 * i}
            """
        )
    )
    program = textwrap.dedent(
        """
        import logging
        logging.basicConfig(level=logging.WARNING)
        import stagemod
        snap = stagemod.doubled(list(range(12)))
        print(sorted(s["x"] for s in snap.materialize()))
        """
    )
    done = subprocess.run(
        [sys.executable, "-"],
        input=program,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=180,
        env={"PYTHONPATH": str(tmp_path), "SNAPSTORE_ROOT": str(tmp_path / "root"), "PATH": ""},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([2 * i for i in range(12)])
    assert "is not a file that a spawned process can start from" in done.stderr
    assert "Running the partitions on threads instead" in done.stderr
