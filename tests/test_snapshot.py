"""The user-facing contract of snapshot(), Snapshot and open()."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import snapstore
from snapstore.errors import (
    AmbiguousFingerprintError,
    FingerprintError,
    SnapshotNotFoundError,
    SnapshotRemovedError,
    StageError,
)
from snapstore.manage.catalog import remove_snapshot
from snapstore.storage.store import LocalStore

CALLS: list[tuple] = []


@snapstore.snapshot
def squares(n: int, scale: int = 1):
    CALLS.append((n, scale))
    for i in range(n):
        yield {"x": i * i * scale, "v": np.full(3, i, np.float32)}


def test_decorator_forms_and_default_root(local_root: str) -> None:
    CALLS.clear()
    snap = squares(10)
    assert isinstance(snap, snapstore.Snapshot) and len(snap.fingerprint) == 32
    assert snap.store.url == str(Path(local_root).absolute())
    assert not snap.committed and CALLS == []  # nothing runs before materialize or a read
    assert snap.materialize() is snap and snap.committed and CALLS == [(10, 1)]
    assert len(snap) == 10 and snap[3]["x"] == 9 and [s["x"] for s in snap][-1] == 81
    again = squares(10, scale=1)  # the default spelled out: same fingerprint, no recompute
    assert again.fingerprint == snap.fingerprint
    again.materialize()
    assert CALLS == [(10, 1)]
    assert squares(10, 2).fingerprint != snap.fingerprint
    assert squares.__name__ == "squares"


def test_call_forms_are_equivalent(tmp_path: Path) -> None:
    def stage(n):
        yield from ({"i": i} for i in range(n))

    a = snapstore.snapshot(stage, root=str(tmp_path))(4)
    b = snapstore.snapshot(root=str(tmp_path))(stage)(4)
    assert a.fingerprint == b.fingerprint
    assert (
        snapstore.snapshot(stage, root=str(tmp_path), version="v2")(4).fingerprint != a.fingerprint
    )


def test_reading_materializes(tmp_path: Path) -> None:
    snap = snapstore.snapshot(lambda n: ({"i": i} for i in range(n)), root=str(tmp_path))(5)
    assert [s["i"] for s in snap] == [0, 1, 2, 3, 4] and snap.committed


def test_a_cache_hit_logs_one_info_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    stage = snapstore.snapshot(squares.__wrapped__, root=str(tmp_path))
    first = stage(6).materialize()
    stored = first.manifest["stored_bytes"]
    with caplog.at_level(logging.INFO, logger="snapstore"):
        again = stage(6).materialize()
        assert len(again) == 6 and again[0] is not None  # reading does not log the hit again
        assert len(first) == 6  # nor does reading what this process computed
    (line,) = [r for r in caplog.records if r.name.startswith("snapstore")]
    assert line.levelno == logging.INFO
    assert line.getMessage() == (
        f"snapstore: found snapshot {first.fingerprint} of test_snapshot.squares under "
        f"{tmp_path} (6 samples, {stored:,} bytes stored)"
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="snapstore"):
        stage(6).materialize()
    assert caplog.records == []  # at the default level a hit says nothing
    first.close()
    again.close()


def test_open_by_full_and_prefix(tmp_path: Path) -> None:
    snap = squares.__wrapped__  # the plain function
    s = snapstore.snapshot(snap, root=str(tmp_path))(6).materialize()
    assert len(snapstore.open(s.fingerprint, root=str(tmp_path))) == 6
    assert snapstore.open(s.fingerprint[:6], root=str(tmp_path)).fingerprint == s.fingerprint
    with pytest.raises(SnapshotNotFoundError, match="snapstore ls"):
        snapstore.open("ffffffff", root=str(tmp_path))
    with pytest.raises(SnapshotNotFoundError, match="no committed snapshot"):
        snapstore.open(s.fingerprint, root=str(tmp_path / "elsewhere"))


def test_ambiguous_prefix(tmp_path: Path) -> None:
    for fp in ("abc1", "abc2"):
        (tmp_path / fp).mkdir()
        (tmp_path / fp / "COMMIT").write_text("{}")
    with pytest.raises(AmbiguousFingerprintError, match="matches 2 snapshots"):
        snapstore.open("abc", root=str(tmp_path))


def test_unhashable_argument_is_an_error_not_a_random_key(tmp_path: Path) -> None:
    stage = snapstore.snapshot(lambda obj: iter([{"i": 1}]), root=str(tmp_path))
    with pytest.raises(FingerprintError, match="version="):
        stage(object())
    keyed = snapstore.snapshot(
        lambda obj: iter([{"i": 1}]), root=str(tmp_path), key=lambda obj: "fixed"
    )
    assert keyed(object()).fingerprint == keyed(object()).fingerprint


def test_non_iterable_stage(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="expected an iterable"):
        snapstore.snapshot(lambda: 3, root=str(tmp_path))().materialize()


def test_unknown_setting() -> None:
    with pytest.raises(TypeError, match="unexpected settings"):
        snapstore.snapshot(lambda: iter(()), rot="/tmp")


SCRIPT = textwrap.dedent(
    """
    import numpy as np, snapstore

    @snapstore.snapshot(root="unused")
    def tokenized(paths, max_len=1024, vocab={"a", "b", "c"}):
        for p in paths:
            yield {"tokens": np.zeros(max_len, np.int32)}

    print(tokenized(["x", "y"], max_len=512, vocab={"c", "b", "a"}).fingerprint)
    """
)


def test_same_call_same_fingerprint_in_fresh_processes(tmp_path: Path) -> None:
    results = []
    for seed, sub in (("1", "a"), ("2", "b")):
        cwd = tmp_path / sub
        cwd.mkdir()
        (cwd / "stage_mod.py").write_text(SCRIPT)
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "stage_mod.py"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(out.stdout.strip())
    assert results[0] == results[1] and len(results[0]) == 32


def test_open_reads_once_and_the_first_read_confirms_the_commit(tmp_path: Path) -> None:
    """open() reads the commit record, manifest and index; the first read reuses them (its pin
    confirms the record later, in the background). If the snapshot was removed since, the first
    read says so; if it was committed again, the first read finds the old files gone and reads
    the new record's afresh."""
    stage = snapstore.snapshot(squares.__wrapped__, root=str(tmp_path))
    fp = stage(6).materialize().fingerprint
    same = snapstore.open(fp, root=str(tmp_path))
    changed = snapstore.open(fp, root=str(tmp_path))
    removed = snapstore.open(fp, root=str(tmp_path))
    assert len(same) == 6
    # Its pin is written and confirmed in the background: let that finish before the removal
    # lists the pins, or a pin written after the listing stays until that reader lets it go.
    assert same._guard is None or same._guard.wait(10)
    old_run = changed._metadata.manifest["run"] if changed._metadata else None
    remove_snapshot(LocalStore(tmp_path), fp, respect_pins=False)
    with pytest.raises(SnapshotRemovedError, match=r"was removed .* as it was opened"):
        len(removed)
    assert not list(tmp_path.glob(f"{fp}/pins/pin-*"))  # its pin was released
    stage(6).materialize()  # committed again, by another run
    assert [s["x"] for s in changed] == [i * i for i in range(6)]
    assert changed.manifest["run"] != old_run
    for snap in (same, changed, removed):
        snap.close()


def test_a_pass_through_directory_is_removed_by_its_own_process_only(tmp_path: Path) -> None:
    """A forked DataLoader worker collects its copy of a pass-through Snapshot: that must not
    remove the directory the parent reads."""
    from snapstore.write.jobs import remove_owned

    directory = tmp_path / "snapstore-pass-x"
    directory.mkdir()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        remove_owned(str(directory), os.getppid())
        os._exit(0)
    os.waitpid(child, 0)
    assert directory.exists()
    remove_owned(str(directory), os.getpid())
    assert not directory.exists()
