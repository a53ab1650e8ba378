"""Partitions reused across calls of a stage whose inputs changed (issue 25).

A partitioned stage over ``snapstore.files(...)`` is materialized, its input list edited at
random (an insertion, a deletion, a reordering, a file's content changed, a subset taken) and
materialized again on the same root (``files()`` orders files by name, so a reordering is the
same list and an insertion lands in name order). The partitions computed the second time are
exactly the edited list's partitions that no earlier call had (by their members' names and
identities), so within the bounds the design promises, and the samples equal those of the same
call on an empty root. Then two jobs (processes) assembling different snapshots over shared
partitions at once, on a local root and on fake-gcs-server: both commit, each reads its own
samples, and every shared partition is computed once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from killjob import JOB_STAGE, started

import snapstore
from snapstore.fingerprint.partition import members
from snapstore.write.boundaries import content_boundaries

SIZE = 3  # partition_size: a dozen files make four partitions on average
FILES = 12


def stage(paths: snapstore.Inputs, log: str = "") -> Iterator[dict[str, Any]]:
    """Each file's name and bytes; one line per partition computed (its members) in ``log``."""
    with open(log, "a") as f:
        f.write("|".join(paths.names) + "\n")
    for path in paths:
        with open(path, "rb") as f:
            yield {"name": os.path.basename(path), "data": f.read()}


def stage_on(root: Path) -> snapstore.Stage:
    return snapstore.snapshot(
        stage, root=str(root), partition_by="paths", partition_size=SIZE, ignore=("log",),
        engine="thread",
    )  # fmt: skip


def materialize(root: Path, paths: list[str], log: Path) -> tuple[list[Any], list[str]]:
    """The samples (name, bytes) in order, and the partitions computed (their members)."""
    log.write_text("")
    with stage_on(root)(snapstore.files(paths), log=str(log)).materialize() as snap:
        samples = [(s["name"], bytes(s["data"])) for s in snap]
    return samples, [line for line in log.read_text().splitlines() if line]


def partitions(paths: list[str]) -> list[tuple[tuple[str, str], ...]]:
    """The partitions of ``paths`` by their members (name, identity), as the stage cuts them."""
    found = members(snapstore.files(paths))
    return [tuple(found[r.start : r.stop]) for r in content_boundaries([n for n, _ in found], SIZE)]


def write(path: Path, version: int) -> str:
    # A new version has another length, so the file's identity (size, mtime) surely changes.
    path.write_bytes(f"{path.name} v{version} ".encode() * version)
    return str(path)


@st.composite
def edits(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["insert", "delete", "reorder", "modify", "subset"]))
    if kind in ("insert", "delete", "modify"):
        return kind, draw(st.integers(0, FILES - (kind != "insert")))
    if kind == "reorder":
        return kind, draw(st.permutations(range(FILES)))
    keep = draw(st.lists(st.booleans(), min_size=FILES, max_size=FILES).filter(any))
    return kind, [i for i, k in enumerate(keep) if k]


def apply(kind: str, arg: Any, paths: list[str], data: Path) -> list[str]:
    """The edited input list (a modified file is rewritten on disk, same name)."""
    if kind == "insert":
        return [*paths[:arg], write(data / "inserted.bin", 1), *paths[arg:]]
    if kind == "delete":
        return paths[:arg] + paths[arg + 1 :]
    if kind == "modify":
        write(Path(paths[arg]), 2)
        return list(paths)
    return [paths[i] for i in arg]  # reorder, subset


BOUNDS = {"insert": 2, "delete": 2, "modify": 1}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edit=edits())
def test_an_edited_input_list_computes_only_its_new_partitions(edit: tuple[str, Any]) -> None:
    kind, arg = edit
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        data, log = where / "data", where / "log"
        data.mkdir()
        paths = [write(data / f"f{i:03d}.bin", 1) for i in range(FILES)]
        before = partitions(paths)
        _, first = materialize(where / "root", paths, log)
        assert len(first) == len(before)

        edited = apply(kind, arg, paths, data)
        samples, computed = materialize(where / "root", edited, log)

        new = [p for p in partitions(edited) if p not in set(before)]
        assert sorted(computed) == sorted("|".join(n for n, _ in p) for p in new), edit
        if kind in BOUNDS:
            assert len(computed) <= BOUNDS[kind], (edit, computed)
        if kind == "modify":
            assert len(computed) == 1, (edit, computed)
        scratch, _ = materialize(where / "scratch", edited, log)
        assert samples == scratch
        ordered = list(snapstore.files(edited))  # files() orders its files by name
        assert [name for name, _ in samples] == [os.path.basename(p) for p in ordered]
        assert all(data == Path(p).read_bytes() for (_, data), p in zip(samples, ordered))


# -- two jobs over shared partitions at once -----------------------------------------------------

# JOB_STAGE's stage (one item per partition, each logged as it starts), over a window of items
# given on the command line, on a root opened from a URL and options; started when ``go`` exists.
WINDOW_JOB = (
    JOB_STAGE
    + """
if __name__ == "__main__":
    url, options, log, go, first, last = sys.argv[1:7]
    store = snapstore.open_store(url, **json.loads(options))
    items = list(range(int(first), int(last)))
    open(f"{go}.ready-{first}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    stage_ = snapstore.snapshot(stage, root=store, partition_by="items", ignore=("log",),
                                engine="thread")
    snap = stage_(items, log=log).materialize()
    print(json.dumps({"fp": snap.fingerprint, "items": [int(s["item"]) for s in snap]}))
"""
)


def run_two_jobs(tmp: Path, url: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    job, log, go = tmp / "window.py", tmp / "log", tmp / "go"
    job.write_text(WINDOW_JOB)
    windows = [(0, 8), (4, 12)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(job), url, json.dumps(options), str(log), str(go), str(a), str(b)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "SLOW": "0.05"},
        )
        for a, b in windows
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp.glob("go.ready-*"))) < len(procs) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()  # both at once: they race for the shared partitions 4..7
    results = []
    for proc, (a, b) in zip(procs, windows):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        result = json.loads(out)
        assert result["items"] == list(range(a, b)), result  # exactly its own samples
        results.append(result)
    lines = [int(x) for x in log.read_text().split()]
    assert sorted(lines) == list(range(12)), lines  # each partition computed once, shared too
    assert started(log) == set(range(12))
    return results


def test_two_jobs_assemble_different_snapshots_over_shared_partitions_locally(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    a, b = run_two_jobs(tmp_path, str(root), {})
    assert a["fp"] != b["fp"]
    assert all((root / r["fp"] / "COMMIT").exists() for r in (a, b))
    assert len(list(root.glob("parts/*/*/COMMIT"))) == 12  # stored once each


def test_two_jobs_assemble_different_snapshots_over_shared_partitions_on_gcs(
    tmp_path: Path, gcs_root: tuple[str, dict[str, Any]]
) -> None:
    url, options = gcs_root
    a, b = run_two_jobs(tmp_path, url, options)
    store = snapstore.open_store(url, **options)
    assert a["fp"] != b["fp"]
    assert all(store.exists(f"{r['fp']}/COMMIT") for r in (a, b))
    for r in (a, b):
        with snapstore.open(r["fp"], root=store) as snap:
            assert sorted(int(s["item"]) for s in snap) == sorted(r["items"])
    commits = [k for k in store.list_tree("parts") if k.endswith("/COMMIT")]
    assert len(commits) == 12, commits
