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
    assert lines["memmap read the same order"][-2:] == ["True", "True"]
    for label in ("shuffled read: snapstore (samples/s)", "first batch, from open: memmap (ms)"):
        assert label in lines, out.stdout


def test_bench_reader_smoke(tmp_path: Path) -> None:
    script = BENCH.parent / "bench_reader.py"
    cmd = [sys.executable, str(script), "--scale", "0.01", "--rss-scale", "0.5"]
    cmd += ["--ttfb", "0.01", "--repeat", "1", "--tmp", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    labels = {line.strip().split("  ")[0] for line in out.stdout.splitlines()}
    for label in (
        "epoch at ttfb 0 (samples/s)",
        "epoch at ttfb 10 ms (samples/s)",
        "epoch at 10 ms, max_requests=1 (samples/s)",
        "stats() at 10 ms: startup (ms)",
        "concurrency: mean in flight",
        "stall / (wall - startup)",
        "prefetch budget (MB)",
        "peak anon RSS at 10 ms, 1x (MB)",
        "peak anon RSS at 10 ms, 0.5x (MB)",
    ):
        assert label in labels, f"{label!r} missing from:\n{out.stdout}"
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed


def test_bench_gcs_smoke(tmp_path: Path) -> None:
    script = BENCH.parent / "bench_gcs.py"
    cmd = [sys.executable, str(script), "--scale", "0.01", "--tmp", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "gcsfs, 50 ms first byte (samples/s)" in out.stdout
    assert "ttfb / local" in out.stdout


def test_bench_torch_smoke(tmp_path: Path) -> None:
    script = BENCH.parent / "bench_torch.py"
    cmd = [sys.executable, str(script), "--samples", "600", "--tmp", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    for transform in ("augment", "tensor"):
        assert f"{transform}: DataLoader 2 workers / one-process reader:" in out.stdout
    assert "DataLoader overhead, 0 workers / reader (no transform)" in out.stdout
    assert "tok: default ragged='list', 2 workers / 0 workers:" in out.stdout
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.strip()}
    for workload in ("img", "tok"):
        assert f"{workload}: DataLoader 2 workers, snapstore / memmap dataset:" in out.stdout
        assert rows[workload][-1] == "True", out.stdout  # both loaders read the same order


def test_bench_engines_smoke() -> None:
    script = BENCH.parent / "bench_engines.py"
    cmd = [sys.executable, str(script), "--partitions", "4", "--samples", "20", "--repeat", "1"]
    cmd += ["--numpy-samples", "40", "--torch-samples", "20", "--partition-size", "10"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    for label in ("process, 2 workers", "thread, 1 worker", "process: 2 workers / 1 worker"):
        assert label in out.stdout, out.stdout
    for case in ("numpy", "torch"):  # torch is installed for the tests (see README)
        assert f"# {case} stage, " in out.stdout, out.stdout
        assert f"{case} stage: default engine / plain loop" in out.stdout, out.stdout
    for label in ("plain loop, no snapstore", "default engine (", "thread, "):
        assert label in out.stdout, out.stdout


def test_bench_tensors_smoke(tmp_path: Path) -> None:
    script = BENCH.parent / "bench_tensors.py"
    cmd = [sys.executable, str(script), "--samples", "300", "--repeat", "1", "--tmp", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    for label in ("torch tensors, one dict per sample", "target <= 1.2x", "per-sample check"):
        assert label in out.stdout, out.stdout
    assert "every case wrote the same blocks     True" in out.stdout
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed


def test_bench_write_smoke() -> None:
    script = BENCH.parent / "bench_write.py"
    cmd = [sys.executable, str(script), "--scale", "0.002", "--only", "img-np,tok-np,text"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.strip()}
    for workload in ("img-np", "tok-np", "text"):
        assert workload in rows and "refused" not in rows[workload], out.stdout
    assert float(rows["tok-np"][8].rstrip("x")) > 2  # the tokens compress
    assert float(rows["img-np"][9]) > 0  # a validation figure per workload


def test_bench_validate_smoke() -> None:
    script = BENCH.parent / "bench_validate.py"
    cmd = [sys.executable, str(script), "--samples", "300", "--repeat", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()[1:]
    assert len(lines) == 16 and all(float(line.split()[-1]) > 0 for line in lines), out.stdout


def test_bench_fleet_index_smoke(tmp_path: Path) -> None:
    script = BENCH.parent / "bench_fleet_index.py"
    cmd = [sys.executable, str(script), "--blocks", "20000", "--processes", "2"]
    out = subprocess.run(
        [*cmd, "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    for label in (
        "index in memory (no per-host copy)",
        "per-host copy, first reader",
        "per-host copy, later reader",
        "2 readers together, slowest",
        "index copy in page cache (MB, once per host)",
        "(2 x anon + copy) / (2 x one + copy)",
    ):
        assert label in out.stdout, out.stdout
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed


def test_bench_listing_smoke() -> None:
    script = BENCH.parent / "bench_listing.py"
    cmd = [sys.executable, str(script), "--partitions", "300", "--claimed", "10"]
    cmd += ["--sample", "20", "--ttfb", "0.01"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for label in ("per-partition exists (20 timed, x15)", "partition status: prefix listings"):
        assert label in out.stdout, out.stdout
    assert "target: status in <= 3 round trips" in out.stdout


def test_bench_coldstart_smoke(tmp_path: Path) -> None:
    script = BENCH.parent / "bench_coldstart.py"
    cmd = [sys.executable, str(script), "--scale", "0.01", "--ttfb", "0.01", "--repeat", "1"]
    out = subprocess.run(
        [*cmd, "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    rows = {line.split("  ")[0]: line.split() for line in out.stdout.splitlines() if line}
    assert rows["round trips before the first block"][-4:] == ["2", "2", "<=", "2"], out.stdout
    assert rows["worker: metadata requests"][-3:] == ["0", "0", "0"], out.stdout
    assert "open -> first batch at 10 ms (s)" in out.stdout
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed


def test_bench_checksum_smoke() -> None:
    script = BENCH.parent / "bench_checksum.py"
    cmd = [sys.executable, str(script), "--seconds", "0.01", "--repeat", "1", "--sizes", "65536"]
    cmd += ["--gil-mb", "1", "--decode-mb", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {line.split("  ")[0].strip(): line for line in out.stdout.splitlines()}
    assert "crc32 (zlib)" in rows and "crc32c (crc32c/ICRAR)" in rows
    assert len(rows["crc32c (crc32c/ICRAR)"].split()) == 4  # name (2 words), GB/s, GIL share
    assert "decode, crc32" in rows and "decode, crc32c" in rows


def test_bench_trace_smoke(tmp_path: Path) -> None:
    script = BENCH.parent / "bench_trace.py"
    cmd = [sys.executable, str(script), "--scale", "0.01", "--pairs", "1", "--epochs", "1"]
    out = subprocess.run(
        [*cmd, "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    rows = {line.split("  ")[0]: line.split() for line in out.stdout.splitlines() if line}
    for scenario in (
        "slow stage function",
        "slow bucket",
        "too few decode threads",
        "slow training step",
    ):
        assert rows[f"verdict: {scenario}"][-1] == "PASS", out.stdout + out.stderr
    assert rows["2 ranks x 2 workers: consumer tracks"][-1] == "PASS", out.stdout
    assert "off / no hooks: fastest samples/s" in rows, out.stdout  # timings: not checked
    assert list(tmp_path.iterdir()) == []  # the scratch directory and worktrees are removed
