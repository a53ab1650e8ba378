"""Traces of reading (snapstore.tracing's read spans): valid trace-event JSON, one track group
per consumer of 2 ranks x 2 real DataLoader workers over a simulated 50 ms bucket, the spans and
their args, nothing when off, $SNAPSTORE_TRACE in a fresh process, torch.profiler ranges.

The ``perfetto`` package's trace processor is not used: it downloads its binary on first use,
which cannot be done without network access; :func:`check_trace_file` checks the schema.
"""

from __future__ import annotations

import collections
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import snapstore
from snapstore import tracing
from snapstore.storage.simulate import simulated_store

N = 400  # 25 blocks of 16 samples
REPO = Path(__file__).resolve().parents[1]
SPANS = {"open", "request", "decode", "assemble", "wait", "pass"}
METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def samples(n: int) -> Any:
    for i in range(n):
        yield {"id": i, "x": np.full(64, i, np.float32)}


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("tracing") / "root"
    options = snapstore.WriteOptions(block_bytes=4096, block_min_rows=16)
    return snapstore.snapshot(samples, root=root, options=options)(N).materialize()


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (trace viewers refuse it)")


def check_trace_file(path: Path) -> list[dict[str, Any]]:
    """The events of a merged trace, after checking it is Chrome trace-event JSON: one object
    with a ``traceEvents`` list; every event with ``ph``, ``name``, ``pid`` and ``tid``; complete
    events (X) with numeric ``ts`` and ``dur >= 0``; metadata events (M) naming a process or a
    thread (or ordering them); ``args`` an object; no NaN or Infinity."""
    trace = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    assert isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list)
    events: list[dict[str, Any]] = trace["traceEvents"]
    assert events
    for e in events:
        assert {"ph", "name", "pid", "tid"} <= set(e), e
        assert isinstance(e["name"], str) and isinstance(e["pid"], int), e
        assert isinstance(e["tid"], int), e
        assert isinstance(e.get("args", {}), dict), e
        if e["ph"] == "X":
            assert all(isinstance(e[k], (int, float)) for k in ("ts", "dur")), e
            assert e["dur"] >= 0 and math.isfinite(e["ts"]), e
        elif e["ph"] == "M":
            assert e["name"] in METADATA, e
            key = "name" if e["name"].endswith("_name") else "sort_index"
            value = e["args"][key]
            assert isinstance(value, str if key == "name" else int), e
        else:
            assert e["ph"] == "i" and isinstance(e["ts"], (int, float)), e
    return events


def spans(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X" and e["cat"] == "read" and e["name"] == name]


def labels(events: list[dict[str, Any]]) -> dict[int, str]:
    """Each process's label (its last process_name event)."""
    return {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}


RANK = """
import os, sys, torch
from snapstore.storage.simulate import simulated_store
from snapstore.torch import SnapshotIterableDataset

root, fingerprint, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = simulated_store(root, ttfb=0.05)
ds = SnapshotIterableDataset(fingerprint, root=store, batch_size=16, rank=rank, world_size=2)
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
print(sum(len(batch["id"]) for batch in loader))
"""


def test_two_ranks_of_two_workers_over_a_slow_bucket(
    snap: snapstore.Snapshot, tmp_path: Path
) -> None:
    """One epoch by 2 rank processes x 2 DataLoader workers each, recording through
    $SNAPSTORE_TRACE as torchrun's ranks would (one run id): every consumer's track group."""
    pytest.importorskip("torch")
    path = tmp_path / "epoch.json"
    env = {**os.environ, tracing.ENV: str(path), tracing.RUN_ENV: "job-1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    root = str(snap.store.root)
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, root, snap.fingerprint, str(rank)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for proc in ranks:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert int(out) == N // 2
    # Each rank merged at its exit; merged again here, as `snapstore trace merge` does, in case
    # the first to exit merged before the other's last part was written.
    events = check_trace_file(tracing.merge(path, run="job-1"))

    named = labels(events)
    workers = {f"rank {r} worker {w}": r * 2 + w for r in range(2) for w in range(2)}
    by_label = {label: pid for pid, label in named.items()}
    assert set(workers) <= set(by_label), named
    assert {"rank 0", "rank 1"} <= set(by_label)  # the rank processes, from $RANK
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    for label, consumer in workers.items():
        pid = by_label[label]
        assert order[pid] == consumer
        mine = [e for e in events if e["pid"] == pid]
        (done,) = spans(mine, "pass")
        rank, worker = divmod(consumer, 2)
        assert (done["args"]["rank"], done["args"]["worker"]) == (rank, worker)
        assert done["args"]["samples"] == N // 4 and done["args"]["num_workers"] == 2
        for name in ("request", "decode", "assemble", "wait"):
            assert spans(mine, name), (label, name)
        # A 50 ms bucket: every request takes at least its time to first byte.
        assert min(e["dur"] for e in spans(mine, "request")) >= 45_000
    for rank in range(2):  # the ranks opened the snapshot; their workers made no such request
        opened = spans([e for e in events if e["pid"] == by_label[f"rank {rank}"]], "open")
        assert {Path(e["args"]["path"]).name for e in opened} >= {"COMMIT", "manifest.json"}
    assert not [e for e in events if e["name"] == "open" and e["pid"] in order]


def test_the_read_spans_and_their_args(snap: snapstore.Snapshot, tmp_path: Path) -> None:
    store = simulated_store(snap.store.root, ttfb=0.002)
    path = tmp_path / "read.json"
    with snapstore.trace(path):
        opened = snapstore.open(snap.fingerprint, root=store)
        reader = opened.batches(16, shuffle=True, seed=1, window_blocks=4)
        assert sum(len(b["id"]) for b in reader) == N
        stats = reader.stats()
        # Flushed as the pass ended, before the block ends: a persistent worker's part is
        # on disk when its epoch ends.
        assert len(spans(tracing.read_events(path), "pass")) == 1
        mixture = snapstore.mix([opened, opened], [0.5, 0.5], samples=N // 2)
        mixed = mixture.batches(16, seed=1)
        assert sum(len(b["id"]) for b in mixed) == N // 2
    events = check_trace_file(path)
    assert {e["name"] for e in events if e["ph"] == "X"} == SPANS

    files = {Path(e["args"]["path"]).name for e in spans(events, "open")}
    assert files == {"COMMIT", "manifest.json", "index.bin"}
    assert all(e["args"]["bytes"] > 0 for e in spans(events, "open"))

    passes = spans(events, "pass")
    assert [(p["args"]["samples"], p["args"]["batches"]) for p in passes] == [
        (N, len(reader)),
        (N // 2, len(mixed)),
    ]
    assert all(p["args"]["epoch"] == p["args"]["rank"] == p["args"]["worker"] == 0 for p in passes)
    ended = passes[0]["ts"] + passes[0]["dur"]
    first = [e for e in events if e["ph"] == "X" and e["ts"] <= ended]

    requests = spans(first, "request")
    assert len(requests) == stats.requests
    assert sum(e["args"]["bytes"] for e in requests) == stats.bytes
    decodes = spans(first, "decode")
    assert sum(e["args"]["blocks"] for e in decodes) == sum(e["args"]["blocks"] for e in requests)
    assert sum(e["args"]["blocks"] for e in decodes) == stats.blocks
    assert all(0 <= e["args"]["block"] < opened.manifest["num_blocks"] for e in decodes)
    assert all(e["args"]["bytes"] > 0 for e in decodes)

    built = [e for e in spans(first, "assemble") if "batch" in e["args"]]
    assert [e["args"]["batch"] for e in built] == list(range(len(reader)))
    assert sum(e["args"]["samples"] for e in built) == N
    located = [e for e in spans(first, "assemble") if "chunk" in e["args"]]
    assert sum(e["args"]["samples"] for e in located) == N
    waits = spans(first, "wait")
    assert waits and all(0 <= e["args"]["batch"] <= len(reader) for e in waits)

    # Each kind of work on its own threads: the consumer waits, the others work.
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    consumer = {e["tid"] for e in waits}
    assert consumer == {threading.get_native_id()}
    for name, prefix in (("decode", "snapstore-decode"), ("request", "snapstore-fetch")):
        assert {threads[e["tid"]].split("_")[0] for e in spans(first, name)} == {prefix}
    assert {threads[e["tid"]] for e in built} == {"snapstore-assemble"}
    mixed_built = [e for e in spans(events, "assemble") if e["ts"] > ended]
    assert {threads[e["tid"]] for e in mixed_built} == {"snapstore-mix-assemble"}
    assert {e["args"]["source"] for e in mixed_built if "source" in e["args"]} == {0, 1}


def test_off_records_nothing_and_writes_nothing(
    snap: snapstore.Snapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(tracing.ENV, raising=False)
    assert not tracing.enabled()

    def recorded(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a span was made while nothing records")

    monkeypatch.setattr(tracing._Span, "__init__", recorded)
    monkeypatch.setattr(tracing._Recorder, "add", recorded)
    monkeypatch.setattr(tracing._Recorder, "add_span", recorded)
    monkeypatch.chdir(tmp_path)
    store = simulated_store(snap.store.root, ttfb=0.001)
    opened = snapstore.open(snap.fingerprint, root=store)
    assert sum(len(b["id"]) for b in opened.batches(16, shuffle=True)) == N
    mixed = snapstore.mix([opened, opened], samples=64).batches(16)
    assert sum(len(b["id"]) for b in mixed) == 64
    assert list(tmp_path.iterdir()) == []
    assert not any(t.name == "snapstore-trace-flush" for t in threading.enumerate())


CHILD = """
import sys
import snapstore
snap = snapstore.open(sys.argv[1], root=sys.argv[2])
print(sum(len(b["id"]) for b in snap.batches(32, shuffle=True)))
"""


def test_the_environment_variable_traces_a_process(
    snap: snapstore.Snapshot, tmp_path: Path
) -> None:
    """$SNAPSTORE_TRACE alone, no code: the process leaves a merged trace when it exits."""
    path = tmp_path / "child.json"
    env = {k: v for k, v in os.environ.items() if k not in (tracing.RUN_ENV, "RANK")}
    env[tracing.ENV] = str(path)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    root = str(snap.store.root)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, snap.fingerprint, root],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == N
    events = check_trace_file(path)
    assert {e["name"] for e in events if e["ph"] == "X"} == SPANS - {"request"}  # a local store
    (passed,) = spans(events, "pass")
    assert passed["args"]["samples"] == N
    assert {e["pid"] for e in events} == {passed["pid"]}


def test_torch_profiler_shows_snapstore_ranges(snap: snapstore.Snapshot) -> None:
    """While torch.profiler records (snapstore's own recording off), spans are ranges in its
    trace: the profiling thread's by default, every thread's with profile_all_threads."""
    torch = pytest.importorskip("torch")
    profiler = pytest.importorskip("torch.profiler")
    from snapstore.torch import SnapshotIterableDataset

    assert not tracing.enabled()
    store = simulated_store(snap.store.root, ttfb=0.002)

    def ranges(**options: Any) -> set[str]:
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU], **options) as prof:
            ds = SnapshotIterableDataset(snap.fingerprint, root=store, batch_size=32)
            loader = torch.utils.data.DataLoader(ds, batch_size=None)
            assert sum(len(b["id"]) for b in loader) == N
        return {e.key for e in prof.key_averages() if e.key.startswith("snapstore.")}

    assert {"snapstore.read.open", "snapstore.read.wait"} <= ranges()
    try:
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):  # PyTorch before 2.7
        return
    everywhere = ranges(experimental_config=config)
    assert {f"snapstore.read.{name}" for name in SPANS - {"pass"}} <= everywhere


def test_sort_index_orders_labelled_processes(tmp_path: Path) -> None:
    path = tmp_path / "labels.json"
    with snapstore.trace(path):
        tracing.label_process("rank 1 worker 0", sort_index=2)
        with tracing.span("wait", "read"):
            pass
    events = check_trace_file(path)
    counts = collections.Counter(e["name"] for e in events if e["ph"] == "M")
    assert counts["process_name"] == counts["process_sort_index"] == 1
    assert labels(events) == {os.getpid(): "rank 1 worker 0"}
