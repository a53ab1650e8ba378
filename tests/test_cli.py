"""The snapstore command line, through click's CliRunner."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.main import human_bytes, main


def stage(n: int):
    for i in range(n):
        yield {"x": np.full((4, 4), i, np.float32), "label": i, "text": f"t{i}"}


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "root")


@pytest.fixture
def snap(root: str) -> snapstore.Snapshot:
    return snapstore.snapshot(stage, root=root)(20).materialize()


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


def test_ls_table_and_json(root: str, snap: snapstore.Snapshot) -> None:
    code, out = run("--root", root, "ls")
    assert code == 0
    assert snap.fingerprint[:12] in out and "test_cli.stage" in out and "committed" in out
    assert "FINGERPRINT" in out and "1 snapshot(s)" in out
    code, out = run("--root", root, "ls", "--json")
    data = json.loads(out)
    assert data["snapshots"][0]["fingerprint"] == snap.fingerprint
    assert data["snapshots"][0]["samples"] == 20 and data["snapshots"][0]["state"] == "committed"


def test_root_from_environment(root: str, snap: snapstore.Snapshot) -> None:
    code, out = run("ls", env={"SNAPSTORE_ROOT": root})
    assert code == 0 and snap.fingerprint[:12] in out


def test_ls_empty_root(root: str) -> None:
    code, out = run("--root", root, "ls")
    assert code == 0 and "no snapshots" in out


def test_ls_shows_incomplete_runs(root: str) -> None:
    (Path(root) / "abcdef" / "runs" / "r1").mkdir(parents=True)
    (Path(root) / "abcdef" / "runs" / "r1" / "shard-00000.snap").write_bytes(b"x" * 100)
    code, out = run("--root", root, "ls")
    assert code == 0 and "incomplete" in out and "abcdef" in out


def test_info_by_prefix(root: str, snap: snapstore.Snapshot) -> None:
    code, out = run("--root", root, "info", snap.fingerprint[:8])
    assert code == 0
    assert snap.fingerprint in out and "samples      20" in out
    assert "float32[4,4]" in out and "label" in out and "arguments" in out
    code, out = run("--root", root, "info", snap.fingerprint, "--json")
    info = json.loads(out)
    assert info["samples"] == 20 and info["schema"][0]["shape"] == [4, 4]
    assert set(info["fingerprint_parts"]) >= {"code", "arguments", "format", "version"}


def test_info_unknown_fingerprint(root: str, snap: snapstore.Snapshot) -> None:
    code, out = run("--root", root, "info", "zzzz")
    assert code == 1 and "no snapshot matches 'zzzz'" in out


def test_info_reports_corruption(root: str, snap: snapstore.Snapshot) -> None:
    run_dir = next((Path(root) / snap.fingerprint / "runs").iterdir())
    (run_dir / "manifest.json").write_text("{}")
    code, out = run("--root", root, "info", snap.fingerprint)
    assert code == 1 and "corrupt" in out


def test_rm_dry_run_then_rm(root: str, snap: snapstore.Snapshot) -> None:
    code, out = run("--root", root, "rm", "--dry-run", snap.fingerprint[:10])
    assert code == 0 and "would remove" in out and snap.committed
    code, out = run("--root", root, "rm", snap.fingerprint[:10])
    assert code == 0 and f"removed {snap.fingerprint}" in out and "freed" in out
    assert not snap.committed and not (Path(root) / snap.fingerprint).exists()
    code, out = run("--root", root, "rm", snap.fingerprint)
    assert code == 1 and "no snapshot matches" in out


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB"


def test_installed_command_runs(root: str, snap: snapstore.Snapshot, tmp_path: Path) -> None:
    """The console script is installed, and installing puts no module named `cli` on the path."""
    exe = shutil.which("snapstore")
    if exe is None:
        pytest.skip("the snapstore console script is not installed (pip install -e .)")
    out = subprocess.run([exe, "--root", root, "ls"], capture_output=True, text=True, check=True)
    assert snap.fingerprint[:12] in out.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import cli"], cwd=tmp_path, capture_output=True, text=True
    )
    assert probe.returncode != 0 and "No module named 'cli'" in probe.stderr


def test_rm_refuses_paths_outside_the_root(
    root: str, snap: snapstore.Snapshot, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "COMMIT").write_text("{}")
    for name in ("../victim", "/tmp", "a/b", ".."):
        code, out = run("--root", root, "rm", name)
        assert code == 1 and "is not a fingerprint" in out
    assert (victim / "COMMIT").exists()


def test_rm_resolves_every_name_before_removing(root: str, snap: snapstore.Snapshot) -> None:
    code, out = run("--root", root, "rm", snap.fingerprint, "ffff")
    assert code == 1 and "no snapshot matches 'ffff'" in out
    assert snap.committed  # nothing was removed


def test_incomplete_runs_can_be_inspected_and_removed(root: str) -> None:
    run_dir = Path(root) / "abcdef" / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "shard-00000.snap").write_bytes(b"x" * 100)
    (Path(root) / "not-a-snapshot").mkdir()
    code, out = run("--root", root, "ls")
    assert "not-a-snapshot" not in out
    code, out = run("--root", root, "info", "abc", "--json")
    assert code == 1 and json.loads(out)["state"] == "incomplete"
    code, out = run("--root", root, "rm", "abc")
    assert code == 0 and not (Path(root) / "abcdef").exists()


def test_store_errors_are_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, out = run("--root", str(blocker / "sub"), "info", "abc")
    assert code == 1 and "Traceback" not in out and out.startswith("error:")


COMMANDS = [["ls"], ["info", "abc"], ["diff", "abc", "abd"], ["rm", "abc"], ["gc", "--dry-run"],
            ["du"], ["verify", "--all"], ["head", "abc"], ["bench", "abc"]]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_root_that_is_a_file_is_an_error(tmp_path: Path, command: list[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    code, out = run("--root", str(afile), *command)
    assert code == 1 and out.startswith(f"error: cannot use {afile} as a snapstore root")
    assert f"but {afile} is a file; pass a directory as the root" in out


def test_cp_to_a_file_is_an_error(root: str, snap: snapstore.Snapshot, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    code, out = run("--root", root, "cp", snap.fingerprint, str(afile))
    assert code == 1 and f"{afile} is a file" in out


def test_a_mistyped_url_root_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for command in (["ls"], ["gc"]):
        code, out = run("--root", "s3:/bucket/snaps", *command)
        assert code == 1 and "did you mean 's3://bucket/snaps'?" in out
    assert list(tmp_path.iterdir()) == []  # no ./s3: directory


def test_a_root_that_does_not_exist_is_named_as_such(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "such")
    code, out = run("--root", missing, "ls")
    assert code == 0 and out.startswith(f"no snapshots under {missing}: the directory does not")
    code, out = run("--root", missing, "verify", "--all")
    assert code == 0 and "does not exist" in out
    code, out = run("--root", missing, "info", "abc")
    assert code == 1 and f"expected a root directory at {missing}, found none" in out
    code, out = run("--root", str(tmp_path), "ls")  # exists, empty: just empty
    assert out == f"no snapshots under {tmp_path}\n"


def test_ls_shows_last_read_as_created_is_shown(root: str, snap: snapstore.Snapshot) -> None:
    assert len(snap) == 20  # a read: records the hour (in the background)
    assert snap._guard is not None and snap._guard.wait(30)
    _, out = run("--root", root, "ls", "--json")
    last_read = json.loads(out)["snapshots"][0]["last_read"]
    assert last_read.endswith(":00:00+00:00")  # recorded to the hour
    _, out = run("--root", root, "ls")
    row = out.splitlines()[1].split()
    assert row[3] == last_read[:19]  # 2026-11-24T12:00:00, as CREATED: 2026-11-24T12:34:56
    assert len(row[2]) == len(row[3]) == 19
    _, out = run("ls", "--help")
    assert "LAST READ is recorded to the hour" in " ".join(out.split())
