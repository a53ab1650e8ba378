"""Column building (snapstore.format.encode): numeric columns over their bytes, without pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from snapstore.format.encode import numeric_array

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "values",
    [
        np.array([True, False, True, True, False, False, True, False, True]),
        np.arange(10, dtype=np.uint16)[::3],  # not contiguous
        np.arange(5, dtype=np.float32),
        np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        np.array([], dtype=np.int8),
        np.array([], dtype=bool),
    ],
)
def test_numeric_array_holds_the_values(values: np.ndarray) -> None:
    array = numeric_array(values)
    assert array.to_pylist() == values.tolist()
    assert len(array) == len(values) and array.null_count == 0


def test_a_numeric_write_does_not_import_pandas(tmp_path: Path) -> None:
    """pa.array(ndarray) imports pandas (~0.3 s) in every writing process; numeric columns
    avoid it (strings still go through pa.array)."""
    script = f"""
import sys
import numpy as np
from snapstore.storage.store import LocalStore
from snapstore.write.writer import SnapshotWriter
writer = SnapshotWriter(LocalStore({str(tmp_path)!r}), "fp")
for i in range(300):
    writer.add({{"x": np.full(i % 7, i, np.int32), "img": np.zeros((2, 2), np.uint8),
                "label": np.int64(i), "n": i, "w": i / 2, "ok": i % 2 == 0}})
writer.commit()
print("pandas" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
