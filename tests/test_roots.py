"""Roots that would pass silently and are refused: a file, a URL with a mistyped separator; and
a root that does not exist, which open() names as such."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import snapstore
from snapstore.errors import SnapshotNotFoundError, StoreError
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
