"""One stage, one fingerprint however its file is started: ``python prep.py``, ``python -m prep``
or ``import prep`` from another script (fingerprint scheme 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import snapstore
from snapstore.fingerprint.importname import module_name
from snapstore.fingerprint.partition import members
from snapstore.write.boundaries import content_boundaries

REPO_ROOT = Path(__file__).resolve().parents[1]

PREP = """
import os

import numpy as np
import snapstore


def helper(i):
    return np.int64(i * 3)


@snapstore.snapshot(partition_by={partition_by}, partition_size=2, engine={engine!r})
def tokenized(ids, scale=1):
    with open(os.environ["RUNS_LOG"], "a") as log:
        log.write(f"{{len(ids)}}\\n")
    for i in ids:
        yield {{"x": helper(i) * scale}}


if __name__ == "__main__":
    snap = tokenized(list(range(6)), scale=2)
    snap.materialize()
    print("RESULT", snap.fingerprint, tokenized.name, len(snap))
"""

TRAIN = """
import {import_line}

snap = prep.tokenized(list(range(6)), scale=2)
snap.materialize()
print("RESULT", snap.fingerprint, prep.tokenized.name, len(snap))
"""


def _run(args: list[str], cwd: Path, root: Path, log: Path, tag: str = "RESULT") -> list[str]:
    env = {
        **os.environ,
        "SNAPSTORE_ROOT": str(root),
        "RUNS_LOG": str(log),
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONHASHSEED": "random",
    }
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith(tag))
    return line.split()[1:]


def _project(tmp_path: Path, package: str | None, **settings: object) -> tuple[Path, Path]:
    """The user's project directory and the folder holding prep.py."""
    project = tmp_path / "project"
    home = project / package if package else project
    home.mkdir(parents=True)
    if package:
        (home / "__init__.py").write_text("")
    code = {"partition_by": None, "engine": None, **settings}
    (home / "prep.py").write_text(PREP.format(**code))
    import_line = f"{package}.prep as prep" if package else "prep"
    (project / "train.py").write_text(TRAIN.format(import_line=import_line))
    return project, home


@pytest.mark.parametrize("package", [None, "pkg"])
def test_script_module_and_import_share_one_fingerprint(
    tmp_path: Path, package: str | None
) -> None:
    project, home = _project(tmp_path, package)
    root, log = tmp_path / "snaps", tmp_path / "runs.log"
    dotted = f"{package}.prep" if package else "prep"
    script = _run([str(home / "prep.py")], project, root, log)
    as_module = _run(["-m", dotted], project, root, log)
    imported = _run(["train.py"], project, root, log)
    assert script == as_module == imported
    assert script[1] == f"{dotted}.tokenized"  # the name ls, diff and the manifest show
    assert log.read_text().splitlines() == ["6"], "the stage must run once across the three"
    assert [p.name for p in root.iterdir() if p.is_dir()] == [script[0]]


def test_process_engine_runs_a_script_stage_under_its_import_name(tmp_path: Path) -> None:
    project, home = _project(tmp_path, None, partition_by='"ids"', engine="process")
    root, log = tmp_path / "snaps", tmp_path / "runs.log"
    script = _run([str(home / "prep.py")], project, root, log)
    imported = _run(["train.py"], project, root, log)
    assert script == imported and script[2] == "6"
    # The partitions the inputs' names choose (about 2 inputs each), each computed once.
    names = [name for name, _ in members(list(range(6)))]
    sizes = [len(span) for span in content_boundaries(names, 2)]
    assert 1 < len(sizes) < 6
    assert sorted(log.read_text().splitlines()) == sorted(map(str, sizes)), "computed once"


def test_helpers_of_the_script_are_named_as_imported(tmp_path: Path) -> None:
    project, home = _project(tmp_path, None)
    code = """
import sys
sys.path.insert(0, ".")
import snapstore.fingerprint.digest as f
import __main__ as m
fp = f.fingerprint_stage(m.tokenized.fn, ([1],), {}, format_version=1)
print("CODE", ",".join(sorted(fp.details["code"]["functions"])), fp.details["stage"])
"""
    with (home / "prep.py").open("a") as prep:
        prep.write(code)
    out = _run([str(home / "prep.py")], project, tmp_path / "snaps", tmp_path / "log", "CODE")
    assert out[-1] == "prep.tokenized"
    assert out[0].split(",") == ["prep.helper", "prep.tokenized"]


def test_code_without_a_file_keeps_main(monkeypatch: pytest.MonkeyPatch) -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec("def stage():\n    yield {'x': 1}\n", namespace)
    stage = namespace["stage"]
    assert module_name("__main__", namespace) == "__main__"  # not pytest's own __main__
    assert (
        snapstore.fingerprint.digest.fingerprint_stage(stage, (), {}, format_version=1).details[
            "stage"
        ]
        == "__main__.stage"
    )


def test_module_name_of_a_script_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "a" / "b" / "__init__.py").write_text("")
    main = type(sys)("__main__")
    main.__file__ = str(tmp_path / "a" / "b" / "prep.py")
    main.__spec__ = None
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setitem(sys.modules, "__mp_main__", main)  # as a spawned worker has them
    assert module_name("__main__") == "a.b.prep"
    assert module_name("__mp_main__") == "a.b.prep"  # a spawned worker agrees
    assert module_name("helpers") == "helpers"
    main.__file__ = str(tmp_path / "not-a-name.py")
    assert module_name("__main__") == "__main__"  # nothing imports it under another name


def test_miss_explanation_names_the_old_script_name(tmp_path: Path) -> None:
    def stage(n: int):  # type: ignore[no-untyped-def]
        for i in range(n):
            yield {"x": i}

    old = snapstore.snapshot(stage, root=tmp_path, version="before")
    old.name = f"__main__.{stage.__qualname__}"  # as an earlier snapstore named a script's stage
    old(3).materialize()
    new = snapstore.snapshot(stage, root=tmp_path, version="after")
    explained = new.explain_miss(new(3))
    assert explained is not None
    assert "old script name __main__." in explained["differences"][0]
    assert new.name in explained["differences"][0]
