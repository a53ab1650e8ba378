"""The per-host block index copy: made once, mapped by every reader, checked on open, refetched
when corrupt or stale, made safely by racing processes, and skipped where it cannot be written."""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import snapstore
from snapstore.errors import FormatError
from snapstore.format import layout as fmt
from snapstore.read.reader import SnapshotReader
from snapstore.storage import hostindex
from snapstore.storage.store import LocalStore
from snapstore.write.writer import WriteOptions

REPO = Path(__file__).resolve().parents[1]


def stage(n: int) -> Any:
    for i in range(n):
        yield {"id": i, "tok": np.arange(i % 5, dtype=np.int32)}


class CountingStore(LocalStore):
    """A local store that records the paths it reads whole."""

    def __init__(self, root: Any) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def read_bytes(self, path: str) -> bytes:
        self.reads.append(path)
        return super().read_bytes(path)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A snapshot of 997 samples in 40 blocks: (root, fingerprint)."""
    root = tmp_path_factory.mktemp("hostindex")
    options = WriteOptions(block_min_rows=1, block_bytes=400)
    snap = snapstore.snapshot(stage, root=str(root), options=options)(997)
    snap.materialize()
    fingerprint = snap.fingerprint
    snap.close()
    return root, fingerprint


@pytest.fixture
def index_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh per-host index directory, used from 4 blocks on (chunks of 3 rows)."""
    directory = tmp_path / "index"
    monkeypatch.setenv(hostindex.INDEX_DIR_ENV, str(directory))
    monkeypatch.setattr(hostindex, "MIN_BLOCKS", 4)
    monkeypatch.setattr(hostindex, "_CHUNK_ROWS", 3)
    monkeypatch.setattr(hostindex, "_warned", set())
    return directory


def open_reader(built: tuple[Path, str]) -> tuple[SnapshotReader, CountingStore]:
    store = CountingStore(built[0])
    return SnapshotReader(store, built[1]), store


def index_reads(store: CountingStore) -> int:
    return sum(path.endswith(fmt.INDEX_NAME) for path in store.reads)


def the_copy(index_dir: Path) -> Path:
    (copy,) = index_dir.iterdir()
    return copy


def expected(built: tuple[Path, str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The index and offsets, decoded here from the snapshot's index.bin."""
    (path,) = built[0].glob(f"{built[1]}/runs/*/{fmt.INDEX_NAME}")
    index = fmt.read_index(path.read_bytes(), str(path))
    return index, np.concatenate(([0], np.cumsum(index["rows"].astype(np.int64))))


def test_made_once_then_mapped_without_reading_the_index(built, index_dir: Path) -> None:
    index, offsets = expected(built)
    assert not index_dir.exists()
    first, store = open_reader(built)
    assert index_reads(store) == 1 and len(list(index_dir.iterdir())) == 1
    second, store = open_reader(built)
    assert index_reads(store) == 0  # mapped from the copy
    for reader in (first, second):
        assert isinstance(reader.index.base, memoryview)  # file-backed, not a private array
        assert np.array_equal(reader.index, index) and np.array_equal(reader.offsets, offsets)
        assert not reader.index.flags.writeable and not reader.offsets.flags.writeable
        assert len(reader) == 997 and reader.sample(500)["id"] == 500
    copy = the_copy(index_dir)
    assert hostindex.verify(copy) and first.index_copy == second.index_copy == copy
    run = second.manifest["run"]
    assert hostindex.cached(built[1], run, second.manifest["index"]) == copy
    assert hostindex.exists(built[1], run) and not hostindex.exists(built[1], "other-run")
    assert copy.name.startswith(f"{built[1]}-{run}-")


def test_batches_from_the_copy_equal_those_from_memory(
    built, index_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def ids(**kw: Any) -> list[int]:
        with snapstore.open(built[1], root=str(built[0])) as snap:
            return [int(i) for b in snap.batches(64, shuffle=True, seed=5, **kw) for i in b["id"]]

    mapped = [ids(rank=r, world_size=3) for r in range(3)]
    assert index_dir.exists()
    monkeypatch.setattr(hostindex, "MIN_BLOCKS", 1 << 62)
    assert mapped == [ids(rank=r, world_size=3) for r in range(3)]


def test_below_the_threshold_nothing_is_written(built, index_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(hostindex, "MIN_BLOCKS", 41)  # the snapshot has 40 blocks
    reader, store = open_reader(built)
    assert index_reads(store) == 1 and not index_dir.exists() and reader.index_copy is None
    assert reader.index.flags.owndata or not isinstance(reader.index.base, memoryview)


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: flip(p, 0),  # magic
        lambda p: flip(p, 8),  # block count
        lambda p: p.write_bytes(p.read_bytes()[:-5]),  # truncated
        lambda p: p.write_bytes(p.read_bytes()[:30]),  # truncated inside the header
        lambda p: p.write_bytes(p.read_bytes() + b"\0"),  # too long
        lambda p: p.write_bytes(b""),
    ],
    ids=["magic", "count", "truncated", "header", "long", "empty"],
)
def test_corrupt_copy_is_removed_and_refetched(
    built, index_dir: Path, damage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    index, offsets = expected(built)
    open_reader(built)
    copy = the_copy(index_dir)
    damage(copy)
    assert not hostindex.verify(copy)
    with caplog.at_level(logging.WARNING, logger="snapstore.hostindex"):
        reader, store = open_reader(built)
    assert index_reads(store) == 1  # fetched again
    assert "removing it and reading again" in caplog.text
    assert np.array_equal(reader.index, index) and np.array_equal(reader.offsets, offsets)
    assert hostindex.verify(the_copy(index_dir))  # and written again


def test_body_damage_is_found_by_verify(built, index_dir: Path) -> None:
    open_reader(built)
    copy = the_copy(index_dir)
    flip(copy, hostindex.HEADER_BYTES + 10)
    assert not hostindex.verify(copy)  # and opening finds it: see the planted copy below


def test_stale_copy_of_another_index_is_refetched(built, index_dir: Path) -> None:
    first, _ = open_reader(built)
    copy = the_copy(index_dir)
    data = bytearray(copy.read_bytes())  # the header names another source CRC
    struct.pack_into("<I", data, 24, (first.manifest["index"]["checksum"] + 1) & 0xFFFFFFFF)
    copy.write_bytes(bytes(data))
    reader, store = open_reader(built)
    assert index_reads(store) == 1 and hostindex.verify(the_copy(index_dir))
    assert np.array_equal(reader.offsets, first.offsets)


def test_copies_of_older_runs_are_replaced(built, index_dir: Path) -> None:
    index_dir.mkdir()
    older = index_dir / f"{built[1]}-20200101T000000-old-1-deadbeef-0badf00d.idx"
    older.write_bytes(b"an older run's copy")
    other = index_dir / f"{'e' * 32}-20200101T000000-old-1-deadbeef-0badf00d.idx"
    other.write_bytes(b"another snapshot's copy")
    open_reader(built)
    names = sorted(p.name for p in index_dir.iterdir())
    assert other.name in names and older.name not in names and len(names) == 2


def test_unwritable_directory_keeps_the_index_in_memory(
    built, tmp_path: Path, index_dir: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    monkeypatch.setenv(hostindex.INDEX_DIR_ENV, str(blocker / "index"))  # even root cannot
    index, offsets = expected(built)
    with caplog.at_level(logging.DEBUG, logger="snapstore.hostindex"):
        readers = [open_reader(built)[0] for _ in range(3)]
    for reader in readers:
        assert np.array_equal(reader.index, index) and np.array_equal(reader.offsets, offsets)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "keeping it in memory" in warnings[0].getMessage()


def test_a_corrupt_source_leaves_no_copy(built, index_dir: Path) -> None:
    reader = SnapshotReader(LocalStore(built[0]), built[1])
    run, entry = reader.manifest["run"], reader.manifest["index"]
    data = (built[0] / reader.run_dir / fmt.INDEX_NAME).read_bytes()
    the_copy(index_dir).unlink()  # the reader made one

    def refuse(rows: np.ndarray[Any, Any]) -> None:
        if int(rows["rows"].sum()) > 50:
            raise FormatError("points outside the shards")

    with pytest.raises(FormatError, match="outside"):
        hostindex.create(built[1], run, entry, data, refuse)
    with pytest.raises(FormatError, match="bad magic"):
        hostindex.create(built[1], run, entry, b"x" * 20, lambda rows: None)
    short = fmt.write_index(reader.index[:-1])
    short = short[:8] + struct.pack("<Q", reader.num_blocks) + short[16:]
    with pytest.raises(FormatError, match="holds fewer"):
        hostindex.create(built[1], run, entry, short, lambda rows: None)
    assert list(index_dir.iterdir()) == []  # temporary files removed too


def test_processes_racing_to_make_the_copy(built, index_dir: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from snapstore.storage import hostindex
        from snapstore.read.reader import SnapshotReader
        from snapstore.storage.store import LocalStore
        hostindex.MIN_BLOCKS, hostindex._CHUNK_ROWS = 4, 3
        while time.time() < float(sys.argv[1]):
            pass
        for _ in range(5):
            reader = SnapshotReader(LocalStore({str(built[0])!r}), {built[1]!r})
            assert len(reader) == 997 and int(reader.offsets[-1]) == 997
        print(int(reader.offsets[20]))
        """
    )
    env = {**os.environ, hostindex.INDEX_DIR_ENV: str(index_dir), "PYTHONPATH": str(REPO)}
    start = str(__import__("time").time() + 2.0)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, start],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(6)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert len({out for out, _ in outs}) == 1
    assert hostindex.verify(the_copy(index_dir))  # one copy, whole; no temporary file left


# --- trust: the copy is used only from a private directory, and only with a checked body -------


def plant(built: tuple[Path, str], index_dir: Path) -> tuple[Path, np.ndarray[Any, Any]]:
    """Replace the copy's offsets with others, keeping its header (magic, blocks, source size
    and checksum, body checksum) as it was: what another user could write. Returns the copy and
    the true offsets."""
    reader, _ = open_reader(built)
    copy = the_copy(index_dir)
    data = bytearray(copy.read_bytes())
    blocks = reader.num_blocks
    start = hostindex.HEADER_BYTES + blocks * fmt.INDEX_DTYPE.itemsize
    planted = reader.offsets.copy()
    planted[1:-1] += 1  # the same total, every block's samples one off: reads go astray
    data[start:] = planted.tobytes()
    copy.write_bytes(bytes(data))
    return copy, expected(built)[1]


def test_a_planted_copy_with_a_valid_header_is_found_and_made_again(
    built, index_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy, offsets = plant(built, index_dir)
    assert not hostindex.verify(copy)
    with caplog.at_level(logging.WARNING, logger="snapstore.hostindex"):
        reader, store = open_reader(built)
    assert np.array_equal(reader.offsets, offsets), "the planted body was used"
    assert index_reads(store) == 1 and "body" in caplog.text
    assert hostindex.verify(the_copy(index_dir))  # made again
    again, store = open_reader(built)  # and a good copy is used
    assert index_reads(store) == 0 and np.array_equal(again.offsets, offsets)


def test_a_directory_others_can_write_is_refused(
    built, index_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index_dir.mkdir()
    index_dir.chmod(0o777)
    index, offsets = expected(built)
    with caplog.at_level(logging.WARNING, logger="snapstore.hostindex"):
        reader, store = open_reader(built)
    assert reader.index_copy is None and list(index_dir.iterdir()) == []
    assert np.array_equal(reader.index, index) and np.array_equal(reader.offsets, offsets)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "0o777" in warning and "chmod 700" in warning and hostindex.INDEX_DIR_ENV in warning
    # A copy planted there (header and body both consistent) is not used either.
    index_dir.chmod(0o700)
    open_reader(built)
    copy = the_copy(index_dir)
    assert hostindex.verify(copy)
    planted, _ = plant(built, index_dir)
    data = bytearray(planted.read_bytes())
    body = hostindex.CRC32C.update(bytes(data[hostindex.HEADER_BYTES :]), 0)
    struct.pack_into("<I", data, 28, body)  # a planter rewrites the body checksum too
    planted.write_bytes(bytes(data))
    assert hostindex.verify(planted)
    index_dir.chmod(0o777)
    reader, store = open_reader(built)
    assert index_reads(store) == 1 and reader.index_copy is None
    assert np.array_equal(reader.offsets, offsets), "a copy from a shared directory was used"
    assert not hostindex.exists(built[1], reader.manifest["run"])


def test_a_directory_of_another_user_is_refused(
    built, index_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    index_dir.mkdir(mode=0o700)
    os.chown(index_dir, 12345, 12345)
    with caplog.at_level(logging.WARNING, logger="snapstore.hostindex"):
        reader, _ = open_reader(built)
    assert reader.index_copy is None and list(index_dir.iterdir()) == []
    assert "owned by uid 12345" in caplog.text


def test_the_directory_is_made_private(built, index_dir: Path) -> None:
    open_reader(built)
    assert index_dir.stat().st_mode & 0o777 == 0o700
