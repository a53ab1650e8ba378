"""snapstore.verdict on synthetic traces: the figures it adds up and the bottleneck it names.

Each staged scenario of issue 27 is a trace built here span by span, as the reader and the
writer record them (see snapstore.tracing's vocabulary): a slow stage function (write side),
a slow bucket (latency), too few decode threads, a slow training step; and the other rules
(assembly, the first window, bandwidth, the hand-off), the roll-up across processes, and the
thresholds at their edges. tests/test_verdict_reads.py runs the read scenarios for real.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from snapstore import tracing
from snapstore.verdict import (
    BUSY,
    FIRST_WINDOW,
    INPUT_BOUND,
    SATURATED,
    STORE_BUSY,
    StageTime,
    analyze,
    check_events,
    read_bottleneck,
)

Events = list[dict[str, Any]]


def span(name: str, cat: str, at: float, seconds: float, pid: int = 1, tid: int = 1, **args: Any):
    """One complete event; times in seconds here, microseconds in the event."""
    event = {"ph": "X", "name": name, "cat": cat, "ts": at * 1e6, "dur": seconds * 1e6}
    event |= {"pid": pid, "tid": tid}
    return event | ({"args": args} if args else {})


def label(pid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}


def reader(
    *,
    pid: int = 1,
    at: float = 0.0,
    batches: int = 100,
    period: float = 0.1,
    wait: float = 0.0,
    first: float | None = None,
    decode: float = 0.01,
    threads: int = 4,
    assemble: float = 0.005,
    requests: int = 0,
    latency: float = 0.05,
    nbytes: int = 1 << 20,
) -> Events:
    """One pass of ``batches`` batches, one every ``period`` seconds: the consumer waits
    ``wait`` s for each (``first`` s for the first); per batch, ``decode`` s of decoding spread
    over ``threads`` threads, ``assemble`` s on the assembler thread and ``requests`` requests
    of ``latency`` s each, back to back on as many I/O threads."""
    first = wait if first is None else first
    events = [span("pass", "read", at, first + batches * period, pid, 1)]
    events.append(span("open", "read", at, 0.002, pid, 1))
    t = at
    for b in range(batches):
        length = first if b == 0 else wait
        if length:
            events.append(span("wait", "read", t, length, pid, 1, batch=b))
        start = t + length - period if b else t
        for k in range(threads):
            share = decode / threads
            events.append(span("decode", "read", start + k * 1e-4, share, pid, 100 + k))
        events.append(span("assemble", "read", start + decode, assemble, pid, 50))
        for k in range(requests):
            events.append(
                span("request", "read", start, latency, pid, 200 + k, bytes=nbytes, attempt=0)
            )
        t += length if b == 0 else period
    return events


# -- the four staged scenarios ------------------------------------------------------------------


def test_slow_training_step_is_not_input_bound() -> None:
    # The consumer takes 100 ms per batch and waits 2 ms for each: 2% input-bound.
    verdict = analyze(reader(wait=0.002, requests=2))
    assert verdict.bottleneck == "step"
    assert verdict.input_bound == pytest.approx(0.002 / 0.1, rel=0.05)
    assert verdict.advice == "the training step: the input pipeline keeps up"


def test_slow_bucket_is_the_stores_latency() -> None:
    # Two requests of 50 ms in flight all the time; the consumer waits 60 of every 100 ms; the
    # decoders and the assembler are mostly idle.
    verdict = analyze(reader(wait=0.06, requests=2, latency=0.05))
    assert verdict.bottleneck == "latency"
    assert verdict.latency_p95 == pytest.approx(0.05)
    assert verdict.requests == 200
    assert verdict.in_flight == pytest.approx(1.0, rel=0.05)
    assert verdict.advice.startswith("the store's latency (p95 50 ms, 1.0 requests in flight)")
    assert "raise max_requests / prefetch_bytes" in verdict.advice
    assert "snapstore.storage.cache.cached_store" in verdict.advice


def test_too_few_decode_threads_is_cpu_decoding() -> None:
    # One decode thread busy 95 of every 100 ms.
    verdict = analyze(reader(wait=0.05, decode=0.095, threads=1, requests=1, latency=0.01))
    assert verdict.bottleneck == "decode"
    assert verdict.decode_threads == 1
    assert verdict.stages["decode"].utilization == pytest.approx(0.95, rel=0.05)
    assert verdict.advice == (
        "CPU: decoding — raise decode_threads (now 1) or DataLoader num_workers"
    )


def write_events(
    pid: int = 7, samples: int = 100, stage: float = 0.01, work: dict[str, float] | None = None
) -> Events:
    """A writing process: per sample, ``stage`` s in the stage's code, then ``work`` s in each
    of snapstore's parts on the same thread."""
    work = work if work is not None else {"validate": 0.0005, "encode": 0.0005}
    events, t = [], 0.0
    for _ in range(samples):
        events.append(span("stage", "write", t, stage, pid))
        t += stage
        for name, seconds in work.items():
            events.append(span(name, "write", t, seconds, pid))
            t += seconds
    events.append(span("commit", "write", t, 0.01, pid))
    return events


def test_slow_stage_function_is_the_stages_own_code() -> None:
    verdict = analyze(write_events())
    assert verdict.bottleneck == "stage-code"
    assert verdict.write is not None
    assert verdict.write.stage_share == pytest.approx(1 / 1.1, rel=0.02)
    assert "speed up the stage function" in verdict.advice
    assert verdict.consumers == ()
    assert "the stage's own code 90%" in verdict.text()


# -- the other rules ----------------------------------------------------------------------------


def test_snapstore_write_work_names_the_biggest_part() -> None:
    work = {"validate": 0.001, "encode": 0.002, "compress": 0.02, "upload": 0.004}
    verdict = analyze(write_events(stage=0.002, work=work))
    assert verdict.bottleneck == "snapstore-write"
    assert verdict.advice.startswith("snapstore's work: compress — a lower compression_level")
    assert verdict.write is not None
    assert verdict.write.work["compress"] == pytest.approx(2.0)


def test_waiting_for_another_jobs_claim() -> None:
    events = [span("claim", "write", 0, 30.0), *write_events(stage=0.001)]
    events[0]["ts"] = -30e6
    assert analyze(events).bottleneck == "claim"


def test_a_saturated_assembler() -> None:
    verdict = analyze(reader(wait=0.05, assemble=0.09, decode=0.02))
    assert verdict.bottleneck == "assemble"
    assert verdict.advice == "one assembler per reader — more DataLoader workers"


def test_most_wait_before_the_first_batch_is_the_first_window() -> None:
    verdict = analyze(reader(wait=0.0, first=8.0, batches=20, requests=2))
    assert verdict.first_wait == pytest.approx(8.0)
    assert verdict.bottleneck == "first-window"
    assert "smaller window_bytes" in verdict.advice


def test_bandwidth_only_against_a_ceiling() -> None:
    events = reader(wait=0.06, requests=4, nbytes=25 << 20)
    rate = analyze(events).bytes_per_s
    assert analyze(events).bottleneck == "latency"  # a trace alone cannot know a ceiling
    assert analyze(events, bandwidth=rate / 0.9).bottleneck == "bandwidth"
    assert analyze(events, bandwidth=rate * 2).bottleneck == "latency"


def test_no_busy_stage_is_the_hand_off() -> None:
    verdict = analyze(reader(wait=0.05, requests=0))
    assert verdict.bottleneck == "hand-off"
    assert "more DataLoader workers" in verdict.advice


def test_nothing_recorded() -> None:
    verdict = analyze([label(1, "rank 0")])
    assert verdict.bottleneck == "unknown"
    assert "was recording on" in verdict.text()


def stage_times(**utilization: float) -> dict[str, StageTime]:
    """Stages of one thread each at the given utilizations (``request``: in flight)."""
    stages = {n: StageTime(n) for n in ("open", "request", "decode", "assemble")}
    for name, use in utilization.items():
        stages[name] = StageTime(name, busy=use, threads=1, share=use, utilization=use)
    return stages


@pytest.mark.parametrize(
    ("input_bound", "expected"),
    [(INPUT_BOUND - 0.001, "step"), (INPUT_BOUND, "latency")],
)
def test_input_bound_threshold(input_bound: float, expected: str) -> None:
    stages = stage_times(request=STORE_BUSY)
    got = read_bottleneck(input_bound=input_bound, wait=1.0, first_wait=0.0, stages=stages)
    assert got[0] == expected


@pytest.mark.parametrize(
    ("first_wait", "utilization", "expected"),
    [
        (FIRST_WINDOW, SATURATED, "first-window"),
        (FIRST_WINDOW - 0.01, SATURATED, "decode"),
        (0.0, SATURATED - 0.01, "decode"),  # short of saturation, yet the busiest: BUSY
        (0.0, BUSY, "decode"),
        (0.0, BUSY - 0.01, "hand-off"),
    ],
)
def test_first_window_and_cpu_stage_thresholds(
    first_wait: float, utilization: float, expected: str
) -> None:
    stages = stage_times(decode=utilization, assemble=utilization / 2)
    got = read_bottleneck(input_bound=0.5, wait=1.0, first_wait=first_wait, stages=stages)
    assert got[0] == expected


def test_a_saturated_stage_before_a_busy_store_before_a_busy_stage() -> None:
    figures = {"input_bound": 0.5, "wait": 1.0, "first_wait": 0.0}
    busy_store = stage_times(decode=SATURATED, request=3.0)
    assert read_bottleneck(**figures, stages=busy_store)[0] == "decode"
    busy_store = stage_times(assemble=SATURATED - 0.01, request=3.0)
    assert read_bottleneck(**figures, stages=busy_store)[0] == "latency"
    assert read_bottleneck(**figures, stages=stage_times(assemble=0.6))[0] == "assemble"


def test_every_core_busy_is_the_cpu() -> None:
    """Two decode threads at 75% and the assembler at 47% on 2 cores (as measured here): more
    threads cannot help, whatever the stages' own use."""
    stages = stage_times(assemble=0.47)
    stages["decode"] = StageTime("decode", busy=1.5, threads=2, share=1.5, utilization=0.75)
    figures = {"input_bound": 0.9, "wait": 1.0, "first_wait": 0.0, "stages": stages}
    assert read_bottleneck(**figures, cpu_use=1.97)[0] == "decode"  # cores unknown
    kind, advice = read_bottleneck(**figures, cpu_use=1.97, cpus=2)
    assert kind == "cpu"
    assert advice.startswith("CPU: the readers keep 2.0 of the 2 cores busy")
    assert read_bottleneck(**figures, cpu_use=1.97, cpus=4)[0] == "decode"
    events = reader(wait=0.05, decode=0.19, threads=2, assemble=0.09, period=0.1)
    assert analyze(events).cpu_use == pytest.approx(2.8, rel=0.05)
    assert analyze(events, cpus=2).bottleneck == "cpu"
    assert analyze(events, cpus=8).bottleneck == "decode"  # 95% of 2 threads


# -- the roll-up ----------------------------------------------------------------------------------


def test_dataloader_loop_and_its_workers() -> None:
    """A training loop (the main process, train spans) waits 60% of its time; its two workers'
    single decode threads are saturated: the input-bound share is the loop's, the stages the
    workers'."""
    events: Events = [label(10, "rank 0"), label(11, "rank 0 worker 0"), label(12, "worker 1")]
    t = 0.0
    events.append(span("epoch", "train", 0.0, 10.0, pid=10))
    for b in range(100):
        events.append(span("wait", "train", t, 0.06, pid=10, batch=b))
        events.append(span("step", "train", t + 0.06, 0.04, pid=10, batch=b))
        t += 0.1
    for pid in (11, 12):
        events += reader(pid=pid, wait=0.0, decode=0.19, threads=1, batches=50, period=0.2)
    verdict = analyze(events)
    assert verdict.input_bound == pytest.approx(0.6, rel=0.02)
    assert verdict.wall == pytest.approx(10.0)
    assert [c.label for c in verdict.consumers] == ["rank 0", "rank 0 worker 0", "worker 1"]
    assert [c.loop for c in verdict.consumers] == [True, False, False]
    assert verdict.bottleneck == "decode"
    assert verdict.stages["decode"].busy == pytest.approx(2 * 50 * 0.19)
    assert "per consumer  rank 0 60%, rank 0 worker 0 0%" in verdict.text()


def test_decode_threads_are_counted_per_pass() -> None:
    """Each pass makes its own decode pool (new thread ids): two passes of 2 threads are 2
    threads, not 4."""
    first = reader(threads=2, batches=10)
    second = reader(at=2.0, threads=2, batches=10)
    for e in second:
        e["tid"] += 1000 if e["name"] == "decode" else 0
    verdict = analyze(first + second)
    assert verdict.decode_threads == 2
    assert len(verdict.consumers) == 1
    assert verdict.consumers[0].first_wait == 0.0


def test_first_waits_per_pass() -> None:
    events = reader(wait=0.01, first=0.5, batches=10) + reader(
        at=5.0, wait=0.01, first=0.3, batches=10
    )
    consumer = analyze(events).consumers[0]
    assert consumer.first_wait == pytest.approx(0.8)
    assert consumer.wait == pytest.approx(0.8 + 18 * 0.01)


def test_first_waits_of_unnumbered_waits() -> None:
    """Waits without a batch number: the first of each pass is the wait for its first batch."""
    events = reader(wait=0.01, first=0.5, batches=10) + reader(
        at=5.0, wait=0.01, first=0.3, batches=10
    )
    for e in events:
        e.get("args", {}).pop("batch", None)
    assert analyze(events).consumers[0].first_wait == pytest.approx(0.8)


def test_figures_per_consumer_and_added_up() -> None:
    events = reader(pid=1, wait=0.06, requests=2) + reader(pid=2, wait=0.02, requests=2)
    verdict = analyze(events)
    a, b = verdict.consumers
    assert a.input_bound > b.input_bound
    assert verdict.wait == pytest.approx(a.wait + b.wait)
    assert verdict.input_bound == pytest.approx((a.wait + b.wait) / (a.wall + b.wall))
    assert verdict.bytes == a.bytes + b.bytes == 400 << 20
    # Both read at once: the job's bytes/s is twice one consumer's.
    assert verdict.bytes_per_s == pytest.approx(a.bytes_per_s + b.bytes_per_s, rel=0.05)


def test_only_the_spans_of_a_time_window() -> None:
    old = reader(wait=0.002, batches=10)  # a slow step, long ago
    new = reader(at=100.0, wait=0.08, requests=2, batches=10)
    assert analyze(old + new, start=99e6).bottleneck == "latency"
    assert analyze(old + new, end=50e6).bottleneck == "step"


# -- the report and the file --------------------------------------------------------------------


def test_text_and_dict() -> None:
    verdict = analyze(reader(wait=0.06, requests=2) + write_events(pid=9))
    text = verdict.text()
    assert text.splitlines()[0].startswith("input-bound   60%")
    for line in ("  decode", "  request", "requests      200", "writes        the stage"):
        assert line in text, text
    assert text.splitlines()[-1].startswith("bottleneck    the store's latency")
    plain = json.loads(json.dumps(verdict.as_dict(), allow_nan=False))
    assert plain["bottleneck"] == "latency"
    assert plain["stages"]["decode"]["threads"] == 4
    assert str(verdict) == text


def test_no_requests_means_no_latency() -> None:
    verdict = analyze(reader(wait=0.002))
    assert math.isnan(verdict.latency_mean) and verdict.as_dict()["latency_p95"] is None
    assert "requests      none (a local store" in verdict.text()


def test_a_trace_file_merged_or_in_parts(tmp_path) -> None:
    path = tmp_path / "t.json"
    part = tracing.parts_dir(path) / "run-host-1.jsonl"
    part.parent.mkdir()
    part.write_text("".join(json.dumps(e) + "\n" for e in reader(wait=0.06, requests=2)))
    assert analyze(path).bottleneck == "latency"  # not merged yet: its parts
    tracing.merge(path, run="")
    assert not check_events(json.loads(path.read_text()))
    verdict = analyze(path)
    assert verdict.bottleneck == "latency" and verdict.trace == str(path)
    assert f"trace         {path}" in verdict.text()


def test_check_events() -> None:
    good = [*reader(batches=2), label(1, "rank 0")]
    good.append({"ph": "i", "s": "t", "name": "x", "ts": 1, "pid": 1, "tid": 1})
    good.append({"ph": "M", "name": "process_sort_index", "pid": 1, "args": {"sort_index": 0}})
    assert check_events({"traceEvents": good, "displayTimeUnit": "ms"}) == []
    bad: list[Any] = [
        {"ph": "X", "name": "a", "ts": 0, "pid": 1, "tid": 1},  # no duration
        {"ph": "Q", "name": "a"},
        {"ph": "X", "name": "a", "ts": "0", "dur": 1, "pid": 1, "tid": 1},
        {"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": "1", "tid": 1},
        {"ph": "M", "name": "what", "pid": 1},
        {"ph": "i", "s": "x", "name": "a", "ts": 0, "pid": 1, "tid": 1},
        "event",
    ]
    problems = check_events(bad)
    assert len(problems) == len(bad), problems
    assert check_events({"traceEvents": [], "displayTimeUnit": "s"})
    assert check_events({"events": []}) == ["expected a list of events, found NoneType"]
