"""Roots that would pass silently and are refused: a file, a URL with a mistyped separator, an
empty path, a number or bytes; and a root that does not exist, which open() names as such."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.main import main
from snapstore.errors import SnapshotNotFoundError, StoreError
from snapstore.manage import copy_snapshot, find_garbage, list_snapshots, resolve_fingerprint
from snapstore.storage.store import FsspecStore, LocalStore, open_store


def squares(n: int):
    for i in range(n):
        yield {"x": i * i}


@pytest.fixture
def afile(tmp_path: Path) -> Path:
    path = tmp_path / "afile"
    path.write_text("not a directory")
    return path


def test_a_root_that_is_a_file_is_refused(afile: Path) -> None:
    expected = rf"cannot use {afile} as a snapstore root: expected a directory .* is a file; pass"
    with pytest.raises(StoreError, match=expected):
        open_store(str(afile))
    with pytest.raises(StoreError, match=expected):
        LocalStore(afile)
    with pytest.raises(StoreError, match="is a file"):
        snapstore.open("abc", root=str(afile))
    with pytest.raises(StoreError, match="is a file"):
        snapstore.snapshot(squares, root=afile)(3)
    with pytest.raises(StoreError, match="is a file") as caught:
        open_store(f"file://{afile}")
    assert caught.value.errno == errno.ENOTDIR  # a StoreError is an OSError


def test_a_root_under_a_file_is_refused(afile: Path) -> None:
    with pytest.raises(StoreError, match=rf"{afile}/snaps is under {afile}, which is a file"):
        open_store(str(afile / "snaps"))


@pytest.mark.parametrize(
    ("root", "meant"),
    [
        ("s3:/bucket/snaps", "s3://bucket/snaps"),
        ("s3:bucket/snaps", "s3://bucket/snaps"),
        ("gs:/bucket/snaps", "gs://bucket/snaps"),
        ("gcs:/bucket", "gcs://bucket"),
        ("hdfs:/namenode/snaps", "hdfs://namenode/snaps"),
        ("memory:/x", "memory://x"),
        ("file:/tmp/snaps", "file:///tmp/snaps"),
        (Path("s3://bucket/snaps"), "s3://bucket/snaps"),  # a URL wrapped in a Path loses a /
    ],
)
def test_a_url_with_a_mistyped_separator_is_refused(
    root: str | Path, meant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=f"did you mean '{meant}'") as caught:
        open_store(root)
    assert f"write './{root}'" in str(caught.value)  # the way to a local directory of that name
    with pytest.raises(StoreError, match=f"did you mean '{meant}'"):
        snapstore.snapshot(squares, root=root)(3).materialize()
    with pytest.raises(StoreError, match=f"did you mean '{meant}'"):
        snapstore.open("abc", root=root)
    assert list(tmp_path.iterdir()) == []  # nothing was written under the working directory


def test_the_root_from_the_environment_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPSTORE_ROOT", "gs:/bucket/snaps")
    with pytest.raises(StoreError, match="did you mean 'gs://bucket/snaps'"):
        open_store()


def test_drive_letters_and_explicit_local_paths_stay_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for root in ("C:/snaps", "./s3:/bucket", "data/s3:/x"):
        store = open_store(root)
        assert isinstance(store, LocalStore) and store.root == tmp_path / root.removeprefix("./")
    assert isinstance(open_store("memory://fine"), FsspecStore)


def test_open_says_when_the_root_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(SnapshotNotFoundError, match="does not exist") as caught:
        snapstore.open("abc", root=str(missing))
    assert f"expected a root directory at {missing}" in str(caught.value)
    assert not missing.exists()  # looking created nothing
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SnapshotNotFoundError, match="no committed snapshot matches 'abc' under"):
        snapstore.open("abc", root=str(empty))


class _BytesPath:
    """An os.PathLike whose path is bytes."""

    def __init__(self, path: bytes) -> None:
        self.path = path

    def __fspath__(self) -> bytes:
        return self.path


_EXPECTED = "root: expected a local path (str or os.PathLike), a URL"


@pytest.mark.parametrize(
    ("root", "error", "found"),
    [
        ("", ValueError, "found '', an empty path, which would put snapshots in the working"),
        ("  ", ValueError, "found '  ', an empty path"),
        (123, TypeError, "found int 123"),
        (1.5, TypeError, "found float 1.5"),
        (b"/data/snaps", TypeError, "found bytes b'/data/snaps': pass the path as a str"),
        (bytearray(b"/data"), TypeError, "found bytearray bytearray(b'/data')"),
        (_BytesPath(b"/data/snaps"), TypeError, "pass the path as a str ('/data/snaps')"),
        (["/data/snaps"], TypeError, "found list ['/data/snaps']"),
    ],
)
def test_a_root_of_the_wrong_kind_is_refused_where_it_is_given(
    root: object,
    error: type[Exception],
    found: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    expected = re.escape(_EXPECTED) + ".*" + re.escape(found)
    with pytest.raises(error, match=expected):
        snapstore.StageOptions(root=root)  # type: ignore[arg-type]
    with pytest.raises(error, match=expected):
        snapstore.snapshot(squares, root=root)  # type: ignore[call-overload]
    with pytest.raises(error, match=expected):
        snapstore.StageOptions().replace(root=root)
    with pytest.raises(error, match=expected):
        snapstore.open("abc", root=root)  # type: ignore[arg-type]
    with pytest.raises(error, match=expected):
        open_store(root)  # type: ignore[arg-type]
    with pytest.raises(error, match=re.escape(found)) as caught:
        list_snapshots(root)  # type: ignore[arg-type]
    assert str(caught.value).startswith("store: expected")
    with pytest.raises(error, match=r"^dst: expected"):
        copy_snapshot(str(tmp_path), "abc", root)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []  # nothing was written under the working directory


def test_manage_functions_take_a_root_as_well_as_a_store(tmp_path: Path) -> None:
    snap = snapstore.snapshot(squares, root=tmp_path)(3).materialize()
    assert [i["fingerprint"] for i in list_snapshots(tmp_path)] == [snap.fingerprint]
    assert resolve_fingerprint(str(tmp_path), snap.fingerprint[:8]) == snap.fingerprint
    assert find_garbage(str(tmp_path)) == []
    with pytest.raises(
        TypeError, match=r"^store: expected a Store, a local path or a URL, found None"
    ):
        list_snapshots(None)  # type: ignore[arg-type]


def test_the_cli_refuses_an_empty_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["--root", "", "ls"])
    assert result.exit_code == 2
    assert "--root: expected a local path" in result.output
    assert "found '', an empty path" in result.output
    result = CliRunner().invoke(main, ["--root", str(tmp_path), "cp", "abc", ""])
    assert result.exit_code == 2 and "DEST_ROOT: expected a local path" in result.output
    assert list(tmp_path.iterdir()) == []


def test_torch_datasets_check_the_root() -> None:
    torch_datasets = pytest.importorskip("snapstore.torch")
    with pytest.raises(TypeError, match=re.escape(_EXPECTED) + ".*found int 123"):
        torch_datasets.SnapshotIterableDataset("abc", root=123, batch_size=2)
