"""Tracing (issue 27): what the hooks cost, and whether the verdict names the right bottleneck.

Targets, one run:

- **off**: tracing off, the read's throughput within 1% of a build without the tracing hooks.
  The baseline is a ``git worktree`` of the commit before the first that hooked the reader
  (``bd4a8e8``; ``--baseline`` to name another), read in a child process whose
  ``PYTHONPATH`` is that worktree; the current build is this checkout's working tree, or
  ``--current COMMIT`` (the commit that added the hooks, to compare the hooks alone: later
  commits change the reader too).
- **on**: tracing on (``$SNAPSTORE_TRACE``) at most 5% slower than off.
- **verdicts**: the four staged scenarios, each read or written inside ``snapstore.trace``:
  a slow stage function (2 ms per sample: ``stage-code``), a slow bucket (50 ms first byte, one
  request at a time: ``latency``), too few decode threads (one, over vectors that decode 5x
  slower than they assemble: ``decode``), a slow training step (15 ms per batch: ``step``).
- **ranks**: one epoch by 2 ranks x 2 DataLoader workers (``RANK``, ``WORLD_SIZE`` and a
  shared ``TORCHELASTIC_RUN_ID``, as torchrun sets them) over a 50 ms simulated bucket, each
  rank recording with ``$SNAPSTORE_TRACE``: the merged trace holds the 4 consumers' tracks and
  passes the trace-event schema check (:func:`snapstore.verdict.check_events`; the
  ``perfetto`` package's trace processor downloads a binary on first use, so it is not run).

Reads are the tok workload of bench_format.py (200,000 samples), shuffled, batches of 256,
every byte copied by the consumer (``touch``), one reader per process, warm page cache.

- off: ``--pairs`` rounds of three child processes in alternating order: the baseline, the
  current build, and the baseline again from a second worktree (a control: the same build
  measured twice), each reading ``--epochs`` epochs. The figure is the fastest epoch of all the
  current build's against the baseline's (the least disturbed of each: a busy machine only
  slows runs down), in samples/s (per CPU-second beside it); the control's, the same figure
  between two copies of the baseline, is the noise floor. Beside them, the hooks' cost by
  count: the spans an epoch records times the cost of one ``tracing.span`` while off.
- on: 3 processes, each a warm-up epoch then ``--pairs`` rounds of three epochs, off, on (a
  ``snapstore.trace`` block around the epoch, entered and left outside the timing) and off
  again (the control), in alternating order, with the same reader and page cache; per process
  the fastest epoch on against the fastest off, the median of the 3; and the cost by count of
  recording (each span recorded and appended to the part).

A figure short of its goal is marked NOISE, not MISS, when its control differs from 1 by more
than the goal allows (on a busy machine an A/A comparison cannot resolve 1%). Exits 1 on a
MISS.

    python benchmarks/bench_trace.py                # tok 200,000 samples, 7 rounds of 5 epochs
    python benchmarks/bench_trace.py --current 43b6a4a    # the hooks alone, against bd4a8e8
    python benchmarks/bench_trace.py --scale 0.1 --pairs 3 --epochs 3    # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from bench_format import BATCH, HERE, WORKLOADS, _warm, print_rows, touch

REPO = HERE.parent
RUN_ID = "bench-trace-ranks"


# -- children ----------------------------------------------------------------------------------


def child_write(workload: str, n: int, root: str) -> dict[str, Any]:
    import snapstore

    def stage(n: int) -> Iterator[dict[str, Any]]:
        yield from (features(n) if workload == "vectors" else WORKLOADS[workload](n))

    return {"fingerprint": snapstore.snapshot(stage, root=root)(n).materialize().fingerprint}


def features(n: int) -> Iterator[dict[str, Any]]:
    """float32[1024] vectors of 16 levels: zstd shrinks them ~4x, and decoding them costs ~5x
    gathering their rows into batches."""
    rng = np.random.default_rng(0)
    levels = rng.normal(size=16).astype(np.float32)
    for i in range(n):
        yield {"x": levels[rng.integers(0, 16, 1024)], "id": i}


def child_read(root: str, fingerprint: str, epochs: int) -> dict[str, Any]:
    """``epochs`` shuffled epochs with one reader, every batch through ``touch``."""
    import snapstore

    _warm(root)
    snap = snapstore.open(fingerprint, root=root)
    reader = snap.batches(BATCH, shuffle=True)
    scratch: dict[str, np.ndarray] = {}
    seconds, cpu, samples = [], [], 0
    for epoch in range(epochs):
        reader.set_epoch(epoch)
        samples = 0
        t, c = time.perf_counter(), time.process_time()
        for batch in reader:
            touch(batch, scratch)
            samples += len(batch["id"])
        seconds.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    reader.close()
    snap.close()
    return {
        "sps": samples / min(seconds),
        "cpu": samples / min(cpu),
        "module": snapstore.__file__,
        "tracing": bool(os.environ.get("SNAPSTORE_TRACE")),
    }


def child_onoff(root: str, fingerprint: str, pairs: int, trace: str) -> dict[str, Any]:
    """In one process, one reader: a warm-up epoch, then ``pairs`` rounds of epochs off, on
    (inside ``snapstore.trace``, entered and left outside the timing) and off again (a
    control), in alternating order. Each epoch's wall and CPU seconds by mode, the spans an
    epoch records, and the cost of one ``tracing.span`` while off and while on (recorded, then
    appended to the part)."""
    import snapstore
    from snapstore import tracing

    _warm(root)
    snap = snapstore.open(fingerprint, root=root)
    reader = snap.batches(BATCH, shuffle=True)
    scratch: dict[str, np.ndarray] = {}

    def epoch(number: int) -> tuple[float, float]:
        reader.set_epoch(number)
        t, c = time.perf_counter(), time.process_time()
        for batch in reader:
            touch(batch, scratch)
        return time.perf_counter() - t, time.process_time() - c

    epoch(0)
    timed: dict[str, list[tuple[float, float]]] = {"off": [], "on": [], "control": []}
    spans, number = 0, 0
    for k in range(pairs):
        for mode in list(timed) if k % 2 == 0 else list(timed)[::-1]:
            number += 1
            if mode == "on":
                with snapstore.trace(f"{trace}-{k}.json"):
                    timed[mode].append(epoch(number))
                spans = sum(1 for e in tracing.read_events(f"{trace}-{k}.json") if e["ph"] == "X")
            else:
                timed[mode].append(epoch(number))
    reader.close()
    return {"timed": timed, "spans": spans, **span_costs(f"{trace}-costs.json")}


def span_costs(trace: str, n: int = 20_000) -> dict[str, float]:
    """Seconds per ``tracing.span`` block while off, and while on with its part's append
    (fastest of 3 rounds of ``n``)."""
    from snapstore import tracing

    def spans() -> float:
        t = time.perf_counter()
        for _ in range(n):
            with tracing.span("decode", "read"):
                pass
        tracing.flush()
        return (time.perf_counter() - t) / n

    off = min(spans() for _ in range(3))
    with tracing.trace(trace):
        on = min(spans() for _ in range(3))
    return {"off_s": off, "on_s": on}


def child_scenario(name: str, root: str, fingerprint: str, trace: str) -> dict[str, Any]:
    """One staged scenario inside ``snapstore.trace(trace)``; its verdict."""
    import snapstore
    from snapstore.storage.simulate import simulated_store
    from snapstore.verdict import analyze
    from snapstore.write.engines import usable_cores

    with snapstore.trace(trace):
        if name == "slow stage function":

            def slow(n: int) -> Iterator[dict[str, Any]]:
                for sample in WORKLOADS["tok"](n):
                    time.sleep(0.002)
                    yield sample

            snapstore.snapshot(slow, root=root)(500).materialize()
        else:
            store: Any = root
            settings: dict[str, Any] = {"window_bytes": 2 << 20}
            epochs, step = 1, 0.0
            if name == "slow bucket":
                store = simulated_store(root, ttfb=0.05)
                settings["max_requests"] = 1
            elif name == "too few decode threads":
                settings |= {"decode_threads": 1, "window_bytes": 4 << 20}
                epochs = 2
            else:
                step = 0.015
            snap = snapstore.open(fingerprint, root=store)
            reader = snap.batches(BATCH, shuffle=True, **settings)
            for epoch in range(epochs):
                reader.set_epoch(epoch)
                for _ in reader:
                    time.sleep(step)
            reader.close()
    verdict = analyze(trace, cpus=usable_cores())
    return {"bottleneck": verdict.bottleneck, "text": verdict.text()}


def child_rank(root: str, fingerprint: str, rank: int) -> dict[str, Any]:
    """One rank of 2: an epoch through a DataLoader with 2 workers over a 50 ms bucket (run
    with $SNAPSTORE_TRACE set: the workers record too)."""
    from torch.utils.data import DataLoader

    import snapstore
    from snapstore.storage.simulate import simulated_store
    from snapstore.torch import SnapshotIterableDataset

    snap = snapstore.open(fingerprint, root=simulated_store(root, ttfb=0.05))
    dataset = SnapshotIterableDataset(snap, batch_size=BATCH, rank=rank, world_size=2)
    batches = sum(1 for _ in DataLoader(dataset, batch_size=None, num_workers=2))
    return {"batches": batches}


CHILDREN = {
    "write": child_write,
    "read": child_read,
    "onoff": child_onoff,
    "scenario": child_scenario,
    "rank": child_rank,
}


def run_child(
    child: str, build: Path = REPO, env: dict[str, str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """``child`` in a fresh interpreter importing snapstore from ``build``; its result."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSTORE_TRACE")}
    environ |= {"PYTHONPATH": f"{build}{os.pathsep}{HERE}"} | (env or {})
    out = subprocess.run(
        [sys.executable, __file__, "--child", child, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        env=environ,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {child} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- the baseline build ------------------------------------------------------------------------


def hookless_commit() -> str | None:
    """The parent of the first commit that named snapstore.tracing in the reader (a module of
    snapstore/read or snapstore/format), or None outside a git checkout."""
    git = ["git", "-C", str(REPO)]
    found = subprocess.run(
        [*git, "log", "--reverse", "-S", "tracing", "--format=%H", "--",
         "snapstore/read", "snapstore/format"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    first = found.stdout.split()[:1]
    if found.returncode != 0 or not first:
        return None
    parent = subprocess.run([*git, "rev-parse", f"{first[0]}^"], capture_output=True, text=True)
    return parent.stdout.strip() or None


def worktree(commit: str, where: Path) -> Path:
    """A detached worktree of ``commit`` at ``where`` (removed by :func:`remove_worktree`)."""
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), commit],
        check=True,
        capture_output=True,
    )
    return where


def remove_worktree(where: Path) -> None:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], capture_output=True
    )


# -- the checks --------------------------------------------------------------------------------


def spread(ratios: list[float]) -> str:
    return f"median {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"


def judge(ratio: float, goal: float, control: float) -> str:
    """PASS at or above ``goal``; below it, NOISE when the same build measured twice
    (``control``, a ratio that should be 1) differs from itself by more than the goal allows:
    the measurement cannot tell the goal met from missed; else MISS."""
    if ratio >= goal:
        return "PASS"
    return "NOISE" if abs(1 - control) > 1 - goal else "MISS"


def check_off(
    read: dict[str, Any], pairs: int, commit: str, current: str | None, tmp: Path
) -> list[tuple[str, ...]]:
    """Tracing off against the build of ``commit`` (the current one: this working tree, or the
    commit ``current``), and, as a control, ``commit`` against a second copy of itself: child
    processes in alternating order, ``pairs`` of each; the fastest epoch of each side against
    the baseline's. The rows."""
    trees = [worktree(commit, tmp / "baseline"), worktree(commit, tmp / "control")]
    got: dict[str, list[dict[str, Any]]] = {"without": [], "with": [], "control": []}
    try:
        sides: dict[str, dict[str, Any]] = {
            "without": {"build": trees[0]},
            "with": {},
            "control": {"build": trees[1]},
        }
        if current is not None:
            trees.append(worktree(current, tmp / "current"))
            sides["with"] = {"build": trees[2]}
        module = run_child("read", **sides["without"], **read | {"epochs": 1})["module"]
        if not module.startswith(str(trees[0])):
            raise RuntimeError(f"the baseline child imported {module}, not {trees[0]}'s")
        for k in range(pairs):
            for name in list(sides) if k % 2 == 0 else list(sides)[::-1]:
                got[name].append(run_child("read", **sides[name], **read))
    finally:
        for tree in trees:
            remove_worktree(tree)
    best = {side: max(r["sps"] for r in runs) for side, runs in got.items()}
    print(
        f"baseline {commit[:12]} (no hooks): fastest epoch {best['without']:,.0f} samples/s; "
        f"current ({current[:12] if current else 'this working tree'}): {best['with']:,.0f}; "
        f"the baseline again (control): {best['control']:,.0f}"
    )
    rows = []
    for key, label in (("sps", "samples/s"), ("cpu", "samples per CPU-second")):
        base = max(r[key] for r in got["without"])
        ratio, control = (max(r[key] for r in got[side]) / base for side in ("with", "control"))
        ok = judge(ratio, 0.99, control) if key == "sps" else ""
        rows.append((f"off / no hooks: fastest {label}", f"{ratio:.3f}", ">= 0.99" * bool(ok), ok))
        rows.append((f"  control: no hooks / no hooks, {label}", f"{control:.3f}", "", ""))
    return rows


def check_on(read: dict[str, Any], pairs: int, tmp: Path) -> list[tuple[str, ...]]:
    """Tracing on against off, epochs alternating in each of 3 processes, with a second off
    epoch in each round as a control: the rows (per process, its fastest epoch on against its
    fastest off; the median of the 3)."""
    got = [
        run_child("onoff", root=read["root"], fingerprint=read["fingerprint"], pairs=pairs,
                  trace=str(tmp / f"onoff-{k}"))
        for k in range(3)
    ]  # fmt: skip
    rows = []
    for k, label in ((0, "samples/s"), (1, "samples per CPU-second")):
        fastest = [{m: min(t[k] for t in g["timed"][m]) for m in g["timed"]} for g in got]
        ratios = [f["off"] / f["on"] for f in fastest]
        controls = [f["off"] / f["control"] for f in fastest]
        ratio, control = statistics.median(ratios), statistics.median(controls)
        ok = judge(ratio, 0.95, control) if k == 0 else ""
        rows.append((f"on / off: fastest {label}", spread(ratios), ">= 0.95" * bool(ok), ok))
        rows.append((f"  control: off / off, {label}", spread(controls), "", ""))
    last = got[-1]
    epoch = min(t[0] for t in last["timed"]["off"])
    print(
        f"an epoch ({epoch:.3f} s) records {last['spans']} spans; a span costs "
        f"{last['off_s'] * 1e9:.0f} ns off, {last['on_s'] * 1e6:.1f} us on (recorded, appended)"
    )
    for mode in ("off", "on"):
        share = last["spans"] * last[f"{mode}_s"] / epoch
        rows.append((f"{mode}: spans x cost of one / epoch", f"{share:.3%}", "", ""))
    return rows


def check_ranks(root: str, fingerprint: str, tmp: Path) -> dict[str, Any]:
    """2 ranks x 2 DataLoader workers recording one trace; its consumer tracks and problems."""
    from snapstore import tracing
    from snapstore.verdict import analyze, check_events

    path = tmp / "ranks.json"
    env = {"SNAPSTORE_TRACE": str(path), "TORCHELASTIC_RUN_ID": RUN_ID, "WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", "rank", json.dumps(kwargs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{HERE}", "RANK": str(r)} | env,
        )
        for r, kwargs in enumerate(
            {"root": root, "fingerprint": fingerprint, "rank": r} for r in range(2)
        )
    ]
    for proc in ranks:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"a rank failed:\n{err}")
    tracing.merge(path, RUN_ID)  # the last rank to exit merged; again, in case of a late part
    trace = json.loads(path.read_text())
    verdict = analyze(trace["traceEvents"])
    readers = [c for c in verdict.consumers if c.reader_wall > 0]
    return {
        "tracks": len(readers),
        "labels": sorted(c.label for c in readers),
        "problems": check_events(trace),
        "events": len(trace["traceEvents"]),
    }


EXPECTED = {
    "slow stage function": "stage-code",
    "slow bucket": "latency",
    "too few decode threads": "decode",
    "slow training step": "step",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the workload sizes")
    parser.add_argument("--pairs", type=int, default=7, help="rounds of reads per comparison")
    parser.add_argument("--epochs", type=int, default=5, help="epochs per read (fastest kept)")
    parser.add_argument("--baseline", default=None, help="commit without hooks (default: found)")
    parser.add_argument(
        "--current", default=None, help="commit with hooks (default: this working tree)"
    )
    parser.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="?", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(CHILDREN[options.child](**json.loads(options.args))))
        return
    rows = [("target", "measured", "goal", "")]
    with tempfile.TemporaryDirectory(dir=options.tmp, prefix="snapstore-bench-trace-") as tmp:
        base = Path(tmp)
        tok_root, vec_root = str(base / "tok"), str(base / "vectors")
        n = max(BATCH, int(200_000 * options.scale))
        tok = run_child("write", workload="tok", n=n, root=tok_root)["fingerprint"]
        read = {"root": tok_root, "fingerprint": tok, "epochs": options.epochs}
        commit = options.baseline or hookless_commit()
        if commit is None:
            rows.append(("off / no hooks", "no git checkout", ">= 0.99", "SKIP"))
        else:
            rows += check_off(read, options.pairs, commit, options.current, base)
        rows += check_on(read, options.pairs, base)
        small = 20_000  # the scenarios' sizes: what their verdicts need, whatever --scale
        small_tok = run_child("write", workload="tok", n=small, root=str(base / "small"))
        vectors = run_child("write", workload="vectors", n=small // 2, root=vec_root)
        for k, (name, expected) in enumerate(EXPECTED.items()):
            snap = vectors if name == "too few decode threads" else small_tok
            root = vec_root if snap is vectors else str(base / "small")
            if name == "slow stage function":
                root = str(base / f"stage-{k}")
            got = run_child(
                "scenario",
                name=name,
                root=root,
                fingerprint=snap["fingerprint"],
                trace=str(base / f"scenario-{k}.json"),
            )
            print(f"-- {name}\n{got['text']}\n")
            ok = "PASS" if got["bottleneck"] == expected else "MISS"
            rows.append((f"verdict: {name}", got["bottleneck"], expected, ok))
        ranks = check_ranks(str(base / "small"), small_tok["fingerprint"], base)
        print(f"2 ranks x 2 workers: {ranks['events']} events, tracks {ranks['labels']}")
        for problem in ranks["problems"][:5]:
            print(f"  schema: {problem}")
        ok = "PASS" if ranks["tracks"] == 4 else "MISS"
        rows.append(("2 ranks x 2 workers: consumer tracks", str(ranks["tracks"]), "4", ok))
        problems = len(ranks["problems"])
        ok = "PASS" if not problems else "MISS"
        rows.append(("  trace-event schema problems", str(problems), "0", ok))
    print()
    print_rows(rows)
    if any(r[-1] == "MISS" for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
