"""A stage that reads declared files: its fingerprint follows the files, and a miss says which."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import snapstore


def decode(inputs: snapstore.Inputs, scale: int = 1):
    for path in inputs:
        data = np.frombuffer(Path(path).read_bytes(), dtype=np.uint8)
        yield {"pixels": data * scale, "name": os.path.basename(path)}


def write_files(directory: Path, n: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (directory / f"{i:03d}.bin").write_bytes(bytes([i]) * 16)


def test_fingerprint_follows_the_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_files(data, 5)
    stage = snapstore.snapshot(decode, root=str(tmp_path / "root"))
    first = stage(snapstore.files(str(data / "*.bin"))).materialize()
    assert [s["name"] for s in first] == [f"{i:03d}.bin" for i in range(5)]
    assert stage(snapstore.files(str(data / "*.bin"))).fingerprint == first.fingerprint

    st = (data / "002.bin").stat()
    os.utime(data / "002.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    touched = stage(snapstore.files(str(data / "*.bin")))
    assert touched.fingerprint != first.fingerprint
    (data / "005.bin").write_bytes(b"x" * 16)
    added = stage(snapstore.files(str(data / "*.bin"))).materialize()
    assert len(added) == 6
    assert added.miss_explanation is not None
    assert any("input" in d or "argument" in d for d in added.miss_explanation["differences"])


def test_moving_the_tree_keeps_the_content_hashed_fingerprint(tmp_path: Path) -> None:
    write_files(tmp_path / "a" / "data", 3)
    write_files(tmp_path / "b" / "elsewhere" / "data", 3)
    stage = snapstore.snapshot(decode, root=str(tmp_path / "root"))
    a = stage(snapstore.files(str(tmp_path / "a" / "data"), content_hash=True))
    b = stage(snapstore.files(str(tmp_path / "b" / "elsewhere" / "data"), content_hash=True))
    assert a.fingerprint == b.fingerprint


LOCK = __import__("threading").Lock()


def locked(n: int):
    with LOCK:
        yield from ({"i": i} for i in range(n))


def test_ignore_globals_reaches_the_fingerprint(tmp_path: Path) -> None:
    import pytest

    with pytest.raises(snapstore.FingerprintError, match="LOCK"):
        snapstore.snapshot(locked, root=str(tmp_path))(3)
    snap = snapstore.snapshot(locked, root=str(tmp_path), ignore_globals=["LOCK"])(3)
    assert [s["i"] for s in snap] == [0, 1, 2]
