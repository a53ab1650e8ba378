"""Partitions reused when the inputs change (issue 25): what an edit of the input list costs.

A stage over ``--files`` (1,000) local files of 4 KiB declared with ``snapstore.files(...)``,
``partition_by``, ``partition_size=10``, on the thread engine (default workers). Its cost is a
**sleep** of ``--cost`` (5 ms) per input after reading the file: deterministic, and the stand-in
for decoding or a download (real CPU work would only add noise on this shared machine). The
stage appends one line per partition it computes (its members' names) to a log, which is how
partitions computed are counted. Every figure is measured in the same run, against the first
materialization of the 1,000 files:

(a) one file added in the middle of the sorted list, (b) one file removed, (c) the first 500
files (``files(...)[:500]``), (d) one file's content changed (same name, same size), each on the
root the first run filled; then the bytes under the root against one full snapshot plus the
partitions (a)-(d) computed; (e) the stage's code changed (the stage's module rewritten and
reloaded: every partition computed, and ``snap.miss_explanation`` says why); (f) on a fresh
root, 6 jobs (processes) started together over 6 overlapping windows of 500 files: every
distinct partition computed exactly once across them; (g) in an in-memory bucket, 1,000
partitions (``partition_size=1``) computed by two calls over the halves, then the whole list
materialized through ``simulated_store(root, ttfb=0.05, record=True)`` over it: nothing to
compute, only to assemble. Its trace gives the sequential round trips (``simulate.round_trips``:
groups of overlapping requests), split into those before the partitions' listing (the lookup
and the miss explanation every miss costs), the assembly proper (from the listing to the
snapshot's commit record) and the cleanup after it; ``--groups`` prints each round trip.

    python benchmarks/bench_partitions.py                       # ~30 s
    python benchmarks/bench_partitions.py --files 60 --assemble 40 --cost 0.001 --ttfb 0.005
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import snapstore
from snapstore.storage.simulate import Request, round_trips, simulated_store
from snapstore.write.boundaries import content_boundaries

# The stage, as a module of its own so that jobs in other processes import it and a code change
# is a rewrite of the same function (same stage name, other code).
STAGE = '''
import os
import time

COST = {cost!r}


def stage(paths, log=""):
    """Read each file, wait COST seconds (the stand-in for preprocessing), yield it."""
    with open(log, "a") as f:  # one line per partition computed: its members
        f.write("|".join(paths.names) + "\\n")
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        time.sleep(COST)
        yield {{"path": os.path.basename(path), "data": data{extra}}}
'''

FILE_BYTES = 4096
WINDOWS = 6  # sweep jobs
CREATES = ("open(xb)", "pipe_file")  # how a store creates a commit record


def write_stage(where: Path, cost: float, version: int) -> ModuleType:
    """(Re)write the stage's module ``partstage`` under ``where`` and import it afresh."""
    extra = "" if version == 1 else f', "version": {version}'
    (where / "partstage.py").write_text(STAGE.format(cost=cost, extra=extra))
    importlib.invalidate_caches()
    if "partstage" in sys.modules:
        return importlib.reload(sys.modules["partstage"])
    return importlib.import_module("partstage")


def make_files(directory: Path, n: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = directory / f"f{i * 10:06d}.bin"  # gaps: room to add a file in the middle
        path.write_bytes(os.urandom(FILE_BYTES))
        paths.append(str(path))
    return paths


def stage_of(module: ModuleType, root: Any, size: int = 10) -> Any:
    return snapstore.snapshot(
        module.stage, root=root, partition_by="paths", partition_size=size,
        ignore=("log",), engine="thread",
    )  # fmt: skip


class Step:
    """One materialization: wall seconds, partitions computed, whether it read right."""

    def __init__(self, stage: Any, paths: list[str] | Any, log: Path) -> None:
        log.write_text("")
        start = time.perf_counter()
        inputs = paths if isinstance(paths, snapstore.Inputs) else snapstore.files(paths)
        self.snap = stage(inputs, log=str(log)).materialize()
        self.seconds = time.perf_counter() - start
        self.computed = [line for line in log.read_text().splitlines() if line]
        with self.snap:
            read = [s["path"] for s in self.snap]
        self.right = read == [os.path.basename(p) for p in inputs]

    @property
    def cells(self) -> str:
        """Partitions and inputs computed, and wall seconds, as table cells."""
        inputs = sum(len(line.split("|")) for line in self.computed)
        return f"{len(self.computed):>9}{inputs:>8,}{self.seconds:>8.2f}"


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def partition_dirs(root: Path) -> dict[str, int]:
    """Every shared partition directory under ``root`` with its bytes."""
    return {str(d): disk_bytes(d) for d in root.glob("parts/*/*") if d.is_dir()}


def sweep_job(argv: list[str]) -> None:
    """One job of (f), in its own process: wait for the go file, then materialize a window."""
    where, root, log, go, first, last = argv
    sys.path.insert(0, where)
    module = importlib.import_module("partstage")
    paths = Path(where, "paths.txt").read_text().splitlines()[int(first) : int(last)]
    inputs = snapstore.files(paths)
    Path(f"{go}.ready-{first}").touch()
    while not os.path.exists(go):
        time.sleep(0.005)
    snap = stage_of(module, root)(inputs, log=log).materialize()
    with snap:
        if [s["path"] for s in snap] != [os.path.basename(p) for p in paths]:
            raise SystemExit(f"job over {first}:{last} read the wrong samples")


def run_sweep(where: Path, paths: list[str]) -> tuple[list[str], set[tuple[str, ...]], float]:
    """(f): start the jobs, let them go together. The log's lines, the distinct partitions of
    the windows (by their members' names), and the seconds from go to the last job's end."""
    log, go, n = where / "sweep.log", str(where / "go"), len(paths)
    (where / "paths.txt").write_text("\n".join(paths))
    step = n // (WINDOWS + 4)  # windows of half the files, overlapping, covering them all
    spans = [(j * step, j * step + n // 2) for j in range(WINDOWS - 1)] + [(n - n // 2, n)]
    me = str(Path(__file__).resolve())
    root = str(where / "root-f")
    jobs = [
        subprocess.Popen(
            [sys.executable, me, "--job", str(where), root, str(log), go, str(a), str(b)]
        )
        for a, b in spans
    ]
    while len(list(where.glob("go.ready-*"))) < len(jobs):
        if any(j.poll() is not None for j in jobs):
            raise RuntimeError("a sweep job ended before it started")
        time.sleep(0.01)
    start = time.perf_counter()
    Path(go).touch()
    codes = [j.wait(timeout=300) for j in jobs]
    seconds = time.perf_counter() - start
    if any(codes):
        raise RuntimeError(f"sweep jobs failed: exit codes {codes}")
    names = snapstore.files(paths).names
    expected = set()
    for a, b in spans:
        part = names[a:b]
        expected |= {tuple(part[r.start : r.stop]) for r in content_boundaries(part, 10)}
    return log.read_text().splitlines(), expected, seconds


def traced_groups(trace: list[Request]) -> list[list[Request]]:
    """The trace as round trips (as simulate.round_trips counts them): groups of overlapping
    requests, in time order."""
    groups: list[list[Request]] = []
    frontier = float("-inf")
    for r in sorted(trace, key=lambda r: r.start):
        if r.start >= frontier:
            groups.append([])
        groups[-1].append(r)
        frontier = max(frontier, r.end)
    return groups


def describe(group: list[Request]) -> str:
    """What a round trip sent: counts of (method, file name)."""
    kinds = collections.Counter(f"{r.name} {r.path.rsplit('/', 1)[-1][:14]}" for r in group)
    return ", ".join(f"{n} x {k}" if n > 1 else k for k, n in kinds.most_common(3))


def assemble(where: Path, module: ModuleType, paths: list[str], ttfb: float) -> dict[str, Any]:
    """(g): the partitions (one input each) computed by two calls over the halves into an
    in-memory bucket, then the whole list materialized through the simulated bucket over it:
    nothing to compute, only to assemble."""
    root, log = f"memory://bench-partitions-{uuid.uuid4().hex[:8]}", where / "g.log"
    half = len(paths) // 2
    for part in (paths[:half], paths[half:]):
        Step(stage_of(module, root, size=1), part, log)
    sim = simulated_store(root, ttfb=ttfb, record=True)
    log.write_text("")
    inputs = snapstore.files(paths)
    start = time.perf_counter()
    snap = stage_of(module, sim, size=1)(inputs, log=str(log)).materialize()
    seconds = time.perf_counter() - start
    trace = list(sim.fs.trace or [])
    with snapstore.open(snap.fingerprint, root=root) as read:
        right = [s["path"] for s in read] == [os.path.basename(p) for p in paths]
    computed = len([x for x in log.read_text().splitlines() if x])
    groups = traced_groups(trace)
    listing = next(i for i, g in enumerate(groups) if g[0].name == "find")
    record = f"{snap.fingerprint}/COMMIT"
    commit = next(
        i
        for i, g in enumerate(groups)
        if any(r.path.endswith(record) and r.name in CREATES for r in g)
    )
    return {
        "seconds": seconds,
        "computed": computed,
        "right": right,
        "groups": groups,
        "listing": listing,
        "commit": commit,
        "requests": len(trace),
        "check": round_trips(trace),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--assemble", type=int, default=1000, help="partitions assembled in (g)")
    parser.add_argument("--cost", type=float, default=0.005, help="seconds of work per input")
    parser.add_argument("--ttfb", type=float, default=0.05, help="(g): seconds per request")
    parser.add_argument("--groups", action="store_true", help="(g): print every round trip")
    parser.add_argument("--job", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        return sweep_job(args.job)
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        run(Path(tmp), args)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def run(where: Path, args: argparse.Namespace) -> None:
    sys.path.insert(0, str(where))
    module = write_stage(where, args.cost, version=1)
    paths = make_files(where / "data", args.files)
    root, log = where / "root", where / "stage.log"
    stage = stage_of(module, root)
    first = Step(stage, paths, log)
    full_bytes, before = disk_bytes(root), partition_dirs(root)

    mid = len(paths) // 2
    added = str(Path(paths[mid]).with_name(f"f{mid * 10 - 5:06d}.bin"))
    Path(added).write_bytes(os.urandom(FILE_BYTES))
    third = len(paths) // 3
    edits = [
        ("(a) one file added in the middle", Step(stage, [*paths[:mid], added, *paths[mid:]], log)),
        ("(b) one file removed", Step(stage, paths[:third] + paths[third + 1 :], log)),
        (f"(c) the first half, files(...)[:{mid}]", Step(stage, snapstore.files(paths)[:mid], log)),
    ]
    changed = Path(paths[len(paths) * 7 // 10])
    changed.write_bytes(os.urandom(FILE_BYTES))  # same name, same size, new content and mtime
    edits.append(("(d) one file's content changed", Step(stage, paths, log)))
    new_bytes = sum(size for d, size in partition_dirs(root).items() if d not in before)
    edited_bytes = disk_bytes(root)
    code = Step(stage_of(write_stage(where, args.cost, version=2), root), paths, log)
    why = (code.snap.miss_explanation or {}).get("differences") or ["(no explanation)"]

    module = write_stage(where, args.cost, version=1)
    lines, expected, sweep_s = run_sweep(where, paths)
    g = assemble(where, module, paths[: args.assemble], args.ttfb)

    n = len(paths)
    print(
        f"# {n:,} files of {FILE_BYTES} B, partition_size=10, thread engine, "
        f"{args.cost * 1000:g} ms sleep per input"
    )
    print(f"{'':44}{'computed':>9}{'inputs':>8}{'wall s':>8}{'vs first':>9}{'read ok':>8}  target")
    print(f"{'first materialization':44}{first.cells}{'100%':>9}{first.right!s:>8}")
    bounds = {"(a)": 2, "(b)": 2, "(c)": 1, "(d)": 1}
    for label, step in edits:
        bound = bounds[label[:3]]
        share = step.seconds / first.seconds
        target = f"<= {bound} computed" if label[:3] != "(d)" else "1 computed"
        ok = len(step.computed) <= bound if label[:3] != "(d)" else len(step.computed) == 1
        if label.startswith("(a)"):
            target += ", <= 5% wall"
            ok = ok and share <= 0.05
        print(
            f"{label:44}{step.cells}{share:>9.1%}"
            f"{step.right!s:>8}  {target}: {verdict(ok and step.right)}"
        )
    share = code.seconds / first.seconds
    ok = len(code.computed) == len(first.computed) and why != ["(no explanation)"]
    print(
        f"{'(e) the stage code changed':44}{code.cells}"
        f"{share:>9.1%}{code.right!s:>8}  all computed, explained: {verdict(ok)}"
    )
    print(f"    miss explanation: {'; '.join(why)}")

    full, new, edited = (x / 1e6 for x in (full_bytes, new_bytes, edited_bytes))
    ratio = edited / (full + new)
    print(f"\nbytes under the root after (a)-(d) (MB){edited:>14.2f}")
    print(f"one full snapshot + new partitions (MB) {full:>10.2f} + {new:.2f}")
    print(f"  ratio{ratio:>43.3f}x  target <= 1.1x: {verdict(ratio <= 1.1)}")

    counts = collections.Counter(lines)
    twice = sum(1 for c in counts.values() if c > 1)
    computed = {tuple(line.split("|")) for line in counts}
    ok = twice == 0 and computed == expected
    print(
        f"\n(f) sweep of {WINDOWS} jobs over overlapping windows of {n // 2:,} files "
        f"({sweep_s:.1f} s)"
    )
    print(f"  distinct partitions of the windows{len(expected):>16,}")
    print(f"  partition computations across the jobs{len(lines):>12,}")
    print(
        f"  computed more than once / never{twice:>18} / {len(expected - computed)}"
        f"  target each exactly once: {verdict(ok)}"
    )

    groups, listing, commit = g["groups"], g["listing"], g["commit"]
    assembly = commit - listing + 1
    span = groups[commit][-1].end - groups[listing][0].start
    ms = args.ttfb * 1000
    print(
        f"\n(g) {args.assemble:,} existing partitions assembled at {ms:g} ms a request "
        f"(computed {g['computed']}, read ok {g['right']})"
    )
    print(
        f"  materialize(): requests / round trips / s{g['requests']:>9,} / {g['check']} / "
        f"{g['seconds']:.2f}"
    )
    print(f"  before the partitions' listing{listing:>20} round trips (lookup, miss explanation)")
    print(
        f"  assembly: listing to commit record{assembly:>16} round trips  target <= 5: "
        f"{verdict(assembly <= 5)}"
    )
    print(f"    its wall time{span:>35.2f} s = {span / args.ttfb:.0f} x ttfb")
    print(f"  after the commit record{len(groups) - commit - 1:>27} round trips (claims cleanup)")
    if args.groups:
        t0 = groups[0][0].start
        for group in groups:
            took = max(r.end for r in group) - group[0].start
            print(
                f"    {group[0].start - t0:7.2f} s {len(group):>5} requests {took:6.2f} s  "
                f"{describe(group)}"
            )


if __name__ == "__main__":
    main()
