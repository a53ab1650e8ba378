"""Where a materialization's time went: the stage's own code against snapstore's work.

No timing thresholds: a stage that sleeps spends at least its sleeps in the stage, a stage that
hands out ready arrays while zstd level 19 compresses them leaves the stage's thread waiting on
snapstore, and the stage's thread's figures are parts of the wall time. Those relations hold on
a loaded machine too.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import snapstore
from snapstore import tracing
from snapstore.storage import claims
from snapstore.write.progress import Display
from snapstore.write.times import MIN_SECONDS, WriteTimes, conclusion, summary
from snapstore.write.writer import WriteOptions

SLEEP = 0.02  # seconds per sample of the slow stage
WRITE = {"stage", "validate", "encode", "compress", "upload", "commit"}


def slow(n: int):
    for i in range(n):
        time.sleep(SLEEP)
        yield {"x": i}


def parted(items: list[int]):
    """A stage found by name (module ``test_write_times``), so process workers can run it."""
    for item in items:
        for j in range(5):
            time.sleep(0.01)
            yield {"item": item, "j": j}


_READY = np.random.default_rng(0).integers(0, 16, (512, 4096), dtype=np.uint8)


def ready(n: int):
    """Arrays made beforehand (the stage does nothing) that compress 2x, slowly at level 19."""
    for i in range(n):
        yield {"v": _READY[i % len(_READY)]}


def batched(n: int):
    for start in range(0, n, 5):
        time.sleep(5 * SLEEP)
        yield snapstore.Columns({"x": np.arange(start, min(start + 5, n))})


def test_a_slow_stage_is_named(tmp_path: Path) -> None:
    snap = snapstore.snapshot(slow, root=tmp_path)(40).materialize(progress=False)
    times = snap.write_times
    assert times is not None and times.computed and times.samples == 40
    assert times.stage >= 40 * SLEEP  # every sleep is inside the stage's code
    assert times.stage_share > 0.5 and times.bottleneck == "stage"
    assert conclusion(times).startswith("Your stage function takes most of the time")
    assert times.workers == 0 and times.partitions == 0 and times.claim == 0


def test_heavy_compression_names_snapstore(tmp_path: Path) -> None:
    options = WriteOptions(compression_level=19, threads=1)
    stage = snapstore.snapshot(ready, root=tmp_path, options=options)
    times = stage(512).materialize(progress=False).write_times
    assert times is not None
    assert times.stage_share < 0.5 and times.bottleneck == "compress"
    # The stage's thread waited for the encoding thread; compression was most of its work.
    assert times.blocked > times.stage and times.compress > times.encode
    # The wording, judged as a run long enough to judge (a fast machine finishes this one
    # under MIN_SECONDS, which the conclusion declines to judge): the same shares, scaled.
    scale = max(1.0, 2 * MIN_SECONDS / max(times.stage_threads + times.claim, 1e-9))
    seconds = ("wall", "stage", "validate", "blocked", "commit", "encode", "compress", "upload")
    scaled = dataclasses.replace(
        times, **{f: getattr(times, f) * scale for f in (*seconds, "claim")}
    )
    text = conclusion(scaled)
    assert text.startswith("snapstore's work dominates, compress most")
    assert "compression_level" in text and "Where the time goes" in text


@pytest.mark.parametrize("fn", [slow, batched], ids=["dicts", "columns"])
def test_the_stage_threads_figures_add_up_to_the_wall_time(tmp_path: Path, fn: Any) -> None:
    times = snapstore.snapshot(fn, root=tmp_path)(40).materialize(progress=False).write_times
    assert times is not None
    accounted = times.stage + times.validate + times.blocked + times.commit + times.claim
    assert times.stage_threads == pytest.approx(accounted - times.claim)
    # Parts of the wall time, one after the other on one thread; the rest is the job's set-up
    # (claim, listing the stage's earlier snapshots), small beside the stage's sleeps.
    assert 0.5 * times.wall <= accounted <= times.wall + 1e-3
    assert min(times.validate, times.encode, times.upload, times.commit) > 0


def test_the_info_line_says_where_the_time_went(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="snapstore"):
        snapstore.snapshot(slow, root=tmp_path)(40).materialize(progress=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "snapstore.write.times"]
    assert len(lines) == 1 and lines[0].startswith("snapstore: materialized 40 samples (")
    assert f"of {__name__}.slow in " in lines[0]
    for part in ("your stage", "snapstore", "waited", "validate", "compress", "upload", "commit"):
        assert part in lines[0]
    assert lines[0].endswith("to compute it in parallel.")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="snapstore"):
        again = snapstore.snapshot(slow, root=tmp_path)(40).materialize(progress=False)
    assert again.write_times is None  # found: nothing computed, no line
    assert not [r for r in caplog.records if r.name == "snapstore.write.times"]


def test_a_thread_engine_rolls_up_its_workers_times(tmp_path: Path) -> None:
    stage = snapstore.snapshot(
        parted, root=tmp_path, partition_by="items", partition_size=1, engine="thread", workers=2
    )
    times = stage(list(range(4))).materialize(progress=False).write_times
    assert times is not None and times.partitions == 4 and times.workers == 2
    assert times.samples == 20 and times.stage >= 20 * 0.01
    assert times.commit > 0  # each partition's, and the assembly's
    assert "in 4 partitions on 2 workers" in summary(times)
    assert "summed over the workers" in summary(times)


def test_process_workers_send_their_times_and_trace_as_engine_workers(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    stage = snapstore.snapshot(
        parted, root=tmp_path / "root", partition_by="items", partition_size=1,
        engine="process", workers=2,
    )  # fmt: skip
    with snapstore.trace(path):
        times = stage(list(range(4))).materialize(progress=False).write_times
    assert times is not None and times.partitions == 4 and times.stage >= 20 * 0.01
    events = tracing.read_events(path)
    labels = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    workers = {pid for pid, name in labels.items() if "engine worker" in name}
    assert workers and os.getpid() not in workers
    spans = Counter((e["pid"] in workers, e["name"]) for e in events if e.get("cat") == "write")
    assert all(spans[True, name] for name in WRITE)  # each step, in the workers
    assert spans[False, "commit"] == 1  # the assembly, in the job's process


def test_the_trace_holds_the_write_spans(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    with snapstore.trace(path):
        snap = snapstore.snapshot(slow, root=tmp_path / "root")(40).materialize(progress=False)
    times = snap.write_times
    assert times is not None
    mine = [e for e in tracing.read_events(path) if e.get("cat") == "write"]
    assert {e["name"] for e in mine} >= WRITE
    assert {e["pid"] for e in mine} == {os.getpid()}
    threads = {e["name"]: e["tid"] for e in mine}
    assert threads["stage"] == threads["validate"] == threads["commit"]  # the stage's thread
    assert threads["encode"] != threads["stage"] != threads["upload"]
    # The stage's spans are its seconds, block by block (microseconds in the trace).
    staged = sum(e["dur"] for e in mine if e["name"] == "stage") / 1e6
    assert staged == pytest.approx(times.stage, rel=0.1, abs=0.01)
    assert sum(e["args"]["samples"] for e in mine if e["name"] == "stage") == 40


def test_a_wait_for_another_jobs_claim_is_counted_and_traced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stage = snapstore.snapshot(slow, root=tmp_path / "root", lease=2.0)
    snap = stage(5)
    holder, _ = claims.acquire(snap.store, snap.fingerprint, lease=30.0, owner="holder")
    assert holder is not None

    def release_once_waited_for() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any("waiting for job holder" in r.getMessage() for r in list(caplog.records)):
                break
            time.sleep(0.01)
        holder.release()  # given up without a commit: the waiting job computes

    thread = threading.Thread(target=release_once_waited_for)
    thread.start()
    path = tmp_path / "trace.json"
    with caplog.at_level(logging.INFO, logger="snapstore"), snapstore.trace(path):
        snap.materialize(progress=False)
    thread.join()
    times = snap.write_times
    assert times is not None and times.computed and times.claim > 0
    assert [e["name"] for e in tracing.read_events(path) if e.get("name") == "claim"] == ["claim"]


def test_a_display_prints_the_line_unless_the_log_shows_it_there() -> None:
    logger = logging.getLogger("snapstore.write.times")
    shown = io.StringIO()
    display = Display("stage", file=shown)
    display(10, 100)
    display.summary("snapstore: materialized 10 samples", logger)
    display.close(True)
    assert shown.getvalue().endswith("snapstore: materialized 10 samples\n")

    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        display = Display("stage", file=logged)
        display(10, 100)
        display.summary("snapstore: materialized 10 samples", logger)
        display.close(True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert "materialized" not in logged.getvalue()  # the record itself is written there


def test_times_add_up_and_the_conclusion_names_the_bottleneck() -> None:
    total = WriteTimes(wall=3.0, threads=1)
    for _ in range(2):
        part = WriteTimes(stage=0.5, validate=1.0, blocked=0.1, commit=0.1, encode=0.2,
                          samples=10, partitions=1, threads=2, computed=True)  # fmt: skip
        total.add(part)
    assert total.wall == 3.0 and total.samples == 20 and total.partitions == 2
    assert total.threads == 2 and total.computed
    assert total.stage_share == pytest.approx(1.0 / 3.4)
    assert total.bottleneck == "validate" and "snapstore.Columns" in conclusion(total)
    assert WriteTimes(wall=10, stage=1, claim=8).bottleneck == "claim"
    assert "waiting for other jobs" in conclusion(WriteTimes(wall=10, stage=1, claim=8))
    assert WriteTimes().bottleneck == "stage"  # nothing measured: nothing to blame
    assert "too little to say" in conclusion(WriteTimes(wall=0.1, stage=0.01, commit=0.05))
    assert set(total.as_dict()) >= {"stage_share", "bottleneck", "wall", "claim"}
