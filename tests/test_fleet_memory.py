"""Issue 14's fleet index at CI size: a crafted snapshot of 1M blocks, opened in fresh processes
that read rank 0 of 8's first shuffled batch. The private (anonymous) memory a reader gains
stays small with the per-host index copy, and would not without it (the same measurement with
the index kept in memory), so the bound means something. No timing is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks" / "bench_fleet_index.py"
BLOCKS = 1 << 20
MB = 1 << 20
# With the copy a reader gains ~2 MB; the index kept in memory costs 56 bytes per block (48 of
# rows, 8 of offsets): 56 MB here, and the plan added 40 more per block before issue 14.
BOUND = 20 * MB


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench_fleet_index as bench
    finally:
        sys.path.remove(str(BENCH.parent))
    root = str(tmp_path_factory.mktemp("fleet"))
    warm = bench.write_source(root)
    return {"root": root, "fingerprint": bench.craft_snapshot(root, warm, BLOCKS), "warm": warm}


def first_batch(fleet: dict[str, str], index_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """The bench's child: open, first batch of rank 0 of 8; seconds and RssAnon growth."""
    env = {**os.environ, "SNAPSTORE_INDEX_DIR": str(index_dir), "PYTHONPATH": str(REPO)}
    args = json.dumps({**fleet, **kwargs})
    out = subprocess.run(
        [sys.executable, str(BENCH), "--child", "first_batch", args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["samples"] == 256
    return result


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
def test_readers_of_a_million_blocks_stay_small(fleet: dict[str, str], tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    first = first_batch(fleet, index_dir)  # decodes index.bin into the per-host copy
    (copy,) = index_dir.glob(f"{fleet['fingerprint']}-*")
    assert copy.stat().st_size >= 56 * BLOCKS
    later = first_batch(fleet, index_dir)  # maps it
    in_memory = first_batch(fleet, index_dir, shared=False)
    # The first reader decodes in chunks of 3 MB (16 MB at the peak when measured, zstd's
    # buffers and freed chunks malloc keeps included); the rest are the same at 16M blocks.
    assert first["growth"] < BOUND and first["peak_growth"] < 2 * BOUND, first
    assert later["growth"] < BOUND and later["peak_growth"] < BOUND, later
    assert in_memory["growth"] > 2 * BOUND, in_memory  # the measurement sees an index
