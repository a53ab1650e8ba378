"""``snapstore bench --trace``, ``trace summary`` and ``trace merge`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import numpy as np
from click.testing import CliRunner

import snapstore
from snapstore import tracing
from snapstore.cli.main import main
from snapstore.verdict import Bottleneck


def numbers(n: int):
    for i in range(n):
        yield {"x": np.full(64, i, np.float32), "label": i}


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def span(name: str, at: float, seconds: float, pid: int = 1, tid: int = 1, **args: object):
    event = {"ph": "X", "name": name, "cat": "read", "ts": at * 1e6, "dur": seconds * 1e6}
    return event | {"pid": pid, "tid": tid, "args": args}


def latency_trace(path: Path) -> Path:
    """A reader waiting 60 of every 100 ms on two 50 ms requests in flight, as parts."""
    events = [span("pass", 0, 10)]
    for b in range(100):
        events.append(span("wait", b / 10, 0.06, batch=b))
        events += [span("request", b / 10, 0.05, tid=2 + k, bytes=1 << 20) for k in range(2)]
        events.append(span("decode", b / 10 + 0.06, 0.005, tid=9))
    part = tracing.parts_dir(path) / "run1-host-1.jsonl"
    part.parent.mkdir(parents=True)
    part.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_bench_trace_prints_the_verdict(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    snap = snapstore.snapshot(numbers, root=root)(3000).materialize()
    path = tmp_path / "bench.json"
    code, out = run("--root", root, "bench", snap.fingerprint, "--trace", str(path))
    assert code == 0, out
    table, verdict = out.split("\n\n")
    assert table.startswith("snapshot ")
    assert verdict.startswith("input-bound ")
    assert "  decode " in verdict and "\nbottleneck    " in verdict
    assert f"trace         {path}" in verdict
    events = json.loads(path.read_text())["traceEvents"]
    assert {"pass", "decode", "assemble"} <= {e["name"] for e in events}
    code, out = run("--root", root, "bench", snap.fingerprint, "--trace", str(path), "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["trace"]["path"] == str(path)
    assert data["trace"]["verdict"]["bottleneck"] in get_args(Bottleneck)  # timing decides
    assert data["trace"]["verdict"]["consumers"][0]["reader_wall"] > 0


def test_bench_without_trace_records_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    snap = snapstore.snapshot(numbers, root=root)(500).materialize()
    code, out = run("--root", root, "bench", snap.fingerprint, "--json")
    assert code == 0 and "trace" not in json.loads(out)
    assert not tracing.enabled()


def test_trace_summary_of_parts_and_merged(tmp_path: Path) -> None:
    path = latency_trace(tmp_path / "t.json")
    code, out = run("trace", "summary", str(path))
    assert code == 0, out
    assert out.startswith("input-bound   60% of 10.00 s waiting for batches (1 consumer;")
    assert "bottleneck    the store's latency (p95 50 ms, 1.0 requests in flight)" in out
    code, out = run("trace", "merge", str(path))
    assert (code, out) == (0, f"merged 401 events from 1 part(s) into {path}\n")
    code, out = run("trace", "summary", str(path), "--json")
    data = json.loads(out)
    assert data["trace"] == str(path) and data["events"] == 401
    assert data["bottleneck"] == "latency" and data["requests"] == 200
    # A ceiling near the 21 MB/s fetched: the bandwidth, not the latency.
    code, out = run("trace", "summary", str(path), "--bandwidth", "25MB/s")
    assert "bottleneck    the store's bandwidth" in out


def test_trace_summary_cpus(tmp_path: Path) -> None:
    events = [span("pass", 0, 1.0), span("wait", 0.1, 0.5, batch=3)]
    events += [span("decode", 0, 0.95, tid=t) for t in (2, 3)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert "raise decode_threads (now 2)" in run("trace", "summary", str(path))[1]
    code, out = run("trace", "summary", str(path), "--cpus", "2")
    assert code == 0, out
    assert "bottleneck    CPU: the readers keep 1.9 of the 2 cores busy" in out


def test_trace_summary_warns_about_malformed_events(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    events = [span("pass", 0, 1.0), {"ph": "X", "name": "x", "ts": 0, "pid": 1, "tid": 1}]
    path.write_text(json.dumps({"traceEvents": events}))
    result = CliRunner().invoke(main, ["trace", "summary", str(path)])
    assert result.exit_code == 0
    assert "warning: not trace event format: event 1: a complete event needs a duration" in (
        result.output
    )


def test_trace_commands_without_a_trace(tmp_path: Path) -> None:
    code, out = run("trace", "summary", str(tmp_path / "none.json"))
    assert code == 2 and "no trace at" in out and "none.json.parts/" in out
    code, out = run("trace", "merge", str(tmp_path / "none.json"))
    assert code == 2 and "no parts of a trace in" in out
    latency_trace(tmp_path / "t.json")
    code, out = run("trace", "merge", str(tmp_path / "t.json"), "--run", "other")
    assert code == 2 and "whose names start with 'other'" in out
    code, out = run("trace", "merge", str(tmp_path / "t.json"), "--run", "run1")
    assert code == 0 and out.startswith("merged 401 events from 1 part(s)")


def test_trace_summary_of_a_file_that_is_not_a_trace(tmp_path: Path) -> None:
    for name, text in (("object.json", '{"x": 1}'), ("text.json", "not json")):
        path = tmp_path / name
        path.write_text(text)
        result = CliRunner().invoke(main, ["trace", "summary", str(path)])
        assert result.exit_code == 2, result.output
        assert "is not a trace" in result.output and "Traceback" not in result.output
