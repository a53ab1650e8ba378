"""The verdict of real reads, traced by the reader's own spans: the three staged read scenarios
of issue 27 (a slow training step, a slow bucket, too few decode threads), a slow stage
function on the write side (from the writer's spans), and :func:`snapstore.watch.watch` over a
DataLoader with workers.

Each scenario is staged with a wide margin around the thresholds (snapstore.verdict), so the
verdict does not depend on this machine's speed; tests/test_verdict.py checks the rules on
synthetic traces.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import snapstore
from snapstore import tracing
from snapstore.storage.simulate import simulated_store
from snapstore.verdict import Verdict, analyze, check_events
from snapstore.watch import watch

SAMPLES = 20_000


def tokens(n: int) -> Iterator[dict[str, Any]]:
    """bench_format's tok workload, smaller: int32 tokens of skewed length, Zipf ids."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(5.45, 0.65, n), 64, 1024).astype(np.int64)
    for i in range(n):
        values = np.minimum(rng.zipf(1.2, lengths[i]), 50_000).astype(np.int32)
        yield {"tokens": values, "id": i}


def features(n: int) -> Iterator[dict[str, Any]]:
    """float32[1024] vectors of 16 levels: zstd shrinks them ~4x, so decoding them costs ~5x
    gathering their rows into batches; one decode thread cannot keep up with one assembler."""
    rng = np.random.default_rng(0)
    levels = rng.normal(size=16).astype(np.float32)
    for i in range(n):
        yield {"x": levels[rng.integers(0, 16, 1024)], "id": i}


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("verdict-reads")
    return snapstore.snapshot(tokens, root=str(root))(SAMPLES).materialize()


def traced_read(
    path: Path, snap: snapstore.Snapshot, step: float = 0.0, epochs: int = 1, **settings: Any
) -> Verdict:
    """Read ``epochs`` shuffled epochs inside ``snapstore.trace(path)``, sleeping ``step`` s
    per batch as a training step would; the trace's verdict."""
    with snapstore.trace(path):
        reader = snap.batches(256, shuffle=True, **settings)
        for epoch in range(epochs):
            reader.set_epoch(epoch)
            for _ in reader:
                time.sleep(step)
        reader.close()
    assert check_events(json.loads(path.read_text())) == []
    return analyze(path)


def test_a_slow_training_step(tmp_path: Path, snap: snapstore.Snapshot) -> None:
    verdict = traced_read(tmp_path / "t.json", snap, step=0.015, window_bytes=1 << 20)
    assert verdict.bottleneck == "step", verdict.text()
    assert verdict.input_bound < 0.1
    assert len(verdict.consumers) == 1


def test_a_slow_bucket(tmp_path: Path, snap: snapstore.Snapshot) -> None:
    bucket = snapstore.open(snap.fingerprint, root=simulated_store(snap.store, ttfb=0.05))
    verdict = traced_read(tmp_path / "t.json", bucket, max_requests=1, window_bytes=1 << 20)
    assert verdict.bottleneck == "latency", verdict.text()
    assert verdict.latency_p95 >= 0.05
    assert verdict.requests > 0 and verdict.in_flight > 0.5


def test_too_few_decode_threads(tmp_path: Path) -> None:
    vectors = snapstore.snapshot(features, root=str(tmp_path / "root"))(10_000).materialize()
    verdict = traced_read(
        tmp_path / "t.json", vectors, epochs=2, decode_threads=1, window_bytes=4 << 20
    )
    assert verdict.bottleneck == "decode", verdict.text()
    assert verdict.decode_threads == 1
    assert "raise decode_threads (now 1)" in verdict.advice


def test_a_slow_stage_function(tmp_path: Path) -> None:
    def slow(n: int) -> Iterator[dict[str, Any]]:
        for sample in tokens(n):
            time.sleep(0.002)
            yield sample

    path = tmp_path / "t.json"
    with snapstore.trace(path):
        snapstore.snapshot(slow, root=str(tmp_path / "root"))(300).materialize()
    verdict = analyze(path)
    assert verdict.bottleneck == "stage-code", verdict.text()
    assert verdict.write is not None and verdict.write.stage_share > 0.5


@pytest.fixture(autouse=True)
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """watch()'s temporary folders under the test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_watch_a_plain_loop(tmp_path: Path, snap: snapstore.Snapshot) -> None:
    """watch() turns recording on for the epoch only, and its verdict is the loop's; of its
    temporary traces, the last epoch's stays."""
    reports: list[Verdict] = []
    watched = watch(snap.batches(256, window_bytes=1 << 20), report=reports.append)
    assert not tracing.enabled()
    for _ in watched:
        assert tracing.enabled()
        time.sleep(0.015)
    assert not tracing.enabled()
    assert reports == [watched.verdict]
    verdict = reports[0]
    assert verdict.bottleneck == "step", verdict.text()
    assert [c.loop for c in verdict.consumers] == [True]
    assert verdict.stages["decode"].busy > 0  # the reader's spans, in the same process
    assert watched.path is not None and watched.path.is_file()
    first = watched.path
    for _ in watched:
        pass
    assert watched.path != first and watched.path.is_file() and not first.exists()
    assert [p.name for p in tmp_path.glob("snapstore-trace-*/*.json")] == ["epoch-2.json"]


def test_watch_inside_a_trace_keeps_recording(tmp_path: Path, snap: snapstore.Snapshot) -> None:
    path = tmp_path / "outer.json"
    with snapstore.trace(path):
        watched = watch(snap.batches(256, window_bytes=1 << 20), report=None)
        for _ in range(2):
            for _ in watched:
                pass
            assert tracing.enabled()
            assert watched.path == path
    assert watched.verdict is not None
    assert len(watched.verdict.consumers) == 1  # the second epoch's spans only
    assert watched.verdict.consumers[0].wall < 5


def test_watch_breaking_out_of_the_loop(snap: snapstore.Snapshot) -> None:
    watched = watch(snap.batches(256, window_bytes=1 << 20), report=None)
    for k, _ in enumerate(watched):
        if k == 3:
            break
    assert not tracing.enabled()
    assert watched.verdict is not None


def test_watch_a_dataloader_with_workers(tmp_path: Path) -> None:
    """Two epochs of a DataLoader with two persistent workers and a 50 ms step: the loop's track
    and each worker's, the input-bound share the loop's, the stages the workers'. The second
    epoch (the workers started) is not input-bound."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from snapstore.torch import SnapshotIterableDataset

    snap = snapstore.snapshot(tokens, root=str(tmp_path / "root"))(5000).materialize()
    dataset = SnapshotIterableDataset(snap, batch_size=256, window_bytes=1 << 20)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
    path = tmp_path / "epochs.json"
    verdicts: list[Verdict] = []
    with snapstore.trace(path):  # before the workers start, for them to record every epoch
        watched = watch(loader, report=verdicts.append)
        for _ in range(2):
            for _ in watched:
                time.sleep(0.05)
    assert verdicts[1].bottleneck == "step", verdicts[1].text()
    for verdict in verdicts:
        assert [c.label for c in verdict.consumers][1:] == ["rank 0 worker 0", "rank 0 worker 1"]
        assert [c.loop for c in verdict.consumers] == [True, False, False]
        assert verdict.stages["decode"].busy > 0 and verdict.stages["assemble"].busy > 0
        assert 0.9 < verdict.wall < 3
    assert check_events(json.loads(path.read_text())) == []


def test_watch_a_failing_loader_or_loop(snap: snapstore.Snapshot) -> None:
    """An error reaches the caller unchanged and recording stops: from the loader, with no
    verdict; from the loop's body (which ends the iteration as a break does), with the verdict
    of what the epoch did."""

    def failing() -> Iterator[int]:
        yield 1
        raise KeyError("loader")

    watched = watch(failing(), report=None)
    with pytest.raises(KeyError, match="loader"):
        for _ in watched:
            pass
    assert not tracing.enabled() and watched.verdict is None
    watched = watch(snap.batches(256, window_bytes=1 << 20), report=None)
    with pytest.raises(KeyError, match="loop"):
        for _ in watched:
            raise KeyError("loop")
    assert not tracing.enabled() and watched.verdict is not None
