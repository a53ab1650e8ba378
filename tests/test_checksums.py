"""Block and file checksums: CRC-32C in format version 3, CRC-32 read in versions 1 and 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from golden_samples import GOLDEN_V1, GOLDEN_V2

import snapstore
from snapstore.errors import CorruptBlockError, FormatError
from snapstore.format import layout as fmt
from snapstore.format.checksums import CHECKSUMS, CRC32, CRC32C, WRITTEN, snapshot_checksum
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore
from snapstore.write.partitions import commit_partitions, partition_dir, write_partition
from snapstore.write.writer import SnapshotWriter, WriteOptions

GOLDEN = Path(__file__).with_name("golden")


def test_check_values() -> None:
    """The standard check values of both CRCs (the CRC of ASCII "123456789")."""
    assert CRC32(b"123456789") == 0xCBF43926
    assert CRC32C(b"123456789") == 0xE3069283
    assert WRITTEN is CRC32C and set(CHECKSUMS) == {"crc32", "crc32c"}


@pytest.mark.parametrize("checksum", [CRC32, CRC32C], ids=["crc32", "crc32c"])
def test_running_checksum_equals_whole(checksum) -> None:
    data = np.random.default_rng(1).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    view = memoryview(data)
    value = 0
    for start in range(0, len(data), 7_777):
        value = checksum.update(view[start : start + 7_777], value)
    assert value == checksum(data) == checksum(np.frombuffer(data, np.uint8))


def write(root: Path, level: int) -> SnapshotReader:
    store = LocalStore(root)
    options = WriteOptions(block_min_rows=1, block_bytes=2048, compression_level=level)
    writer = SnapshotWriter(store, "fp", options=options)
    for i in range(60):
        writer.add({"x": np.full(100, i, np.int32), "t": f"row {i}" * (i % 3)})
    assert writer.commit()
    return SnapshotReader(store, "fp")


@pytest.mark.parametrize("level", [0, 3], ids=["raw", "zstd"])
def test_version_3_round_trip_records_crc32c(tmp_path: Path, level: int) -> None:
    reader = write(tmp_path, level)
    manifest = reader.manifest
    assert manifest["format_version"] == fmt.FORMAT_VERSION and manifest["checksum"] == "crc32c"
    assert reader.checksum is CRC32C and "crc32" not in manifest["index"]
    index_bytes = (tmp_path / reader.run_dir / fmt.INDEX_NAME).read_bytes()
    assert manifest["index"]["checksum"] == CRC32C(index_bytes)
    for entry in reader.index:
        stored = reader.store.read_range(
            reader.shard_paths[int(entry["shard"])], int(entry["offset"]), int(entry["length"])
        )
        assert int(entry["checksum"]) == CRC32C(stored) != CRC32(stored)
    assert [s["t"] for s in reader] == [f"row {i}" * (i % 3) for i in range(60)]
    reader.close()


def flip_every_byte(reader: SnapshotReader, block: int) -> int:
    """Flip each stored byte of ``block`` in turn: every flip is a CorruptBlockError naming
    the shard and the block's offset. Returns the number of bytes flipped."""
    entry = reader.index[block]
    shard = reader.shard_paths[int(entry["shard"])]
    offset, length = int(entry["offset"]), int(entry["length"])
    data = bytearray(reader.store.read_range(shard, offset, length))
    arrow = reader.schema.arrow_schema()
    for i in range(length):
        data[i] ^= 0xFF
        with pytest.raises(CorruptBlockError) as info:
            fmt.decode_block(bytes(data), entry, arrow, shard, checksum=reader.checksum)
        assert info.value.shard == shard and info.value.offset == offset
        assert f"offset {offset} of shard {shard!r}" in str(info.value)
        data[i] ^= 0xFF
    fmt.decode_block(bytes(data), entry, arrow, shard, checksum=reader.checksum)
    return length


@pytest.mark.parametrize("level", [0, 3], ids=["raw", "zstd"])
def test_every_flipped_byte_of_a_block_is_reported(tmp_path: Path, level: int) -> None:
    reader = write(tmp_path, level)
    assert all(flip_every_byte(reader, block) > 0 for block in (0, reader.num_blocks - 1))
    reader.close()


@pytest.mark.parametrize(
    ("name", "fingerprint"), [("format-v1", GOLDEN_V1), ("format-v2", GOLDEN_V2)]
)
def test_every_flipped_byte_of_an_older_block_is_reported(
    tmp_path: Path, name: str, fingerprint: str
) -> None:
    """Version 1 and 2 blocks are checked with CRC-32, their own algorithm."""
    shutil.copytree(GOLDEN / name, tmp_path / name)
    reader = SnapshotReader(LocalStore(tmp_path / name), fingerprint)
    assert reader.checksum is CRC32 and "checksum" not in reader.manifest
    codecs = reader.index["codec"].tolist()
    for codec in (fmt.CODEC_ZSTD, fmt.CODEC_RAW):
        flip_every_byte(reader, codecs.index(codec))
    reader.close()


def test_snapshot_checksum_by_version() -> None:
    assert snapshot_checksum({"format_version": 1}, "m") is CRC32
    assert snapshot_checksum({"format_version": 2, "checksum": "crc32c"}, "m") is CRC32
    assert snapshot_checksum({"format_version": 3, "checksum": "crc32c"}, "m") is CRC32C
    assert snapshot_checksum({"format_version": 3, "checksum": "crc32"}, "m") is CRC32


@pytest.mark.parametrize("found", ["xxh3-64", None, 7])
def test_unknown_algorithm_is_a_clear_format_error(tmp_path: Path, found: object) -> None:
    write(tmp_path / "snaps", 0).close()
    (path,) = (tmp_path / "snaps" / "fp" / "runs").glob("*/manifest.json")
    manifest = fmt.load_json(path.read_bytes(), "m")
    if found is None:
        del manifest["checksum"]
    else:
        manifest["checksum"] = found
    data = fmt.dump_json(manifest)
    path.write_bytes(data)
    record = fmt.load_json((tmp_path / "snaps" / "fp" / "COMMIT").read_bytes(), "c")
    record.update(manifest_size=len(data), manifest_crc32=fmt.CommitRecord.checksum(data))
    (tmp_path / "snaps" / "fp" / "COMMIT").write_bytes(fmt.dump_json(record))
    with pytest.raises(FormatError) as info:
        len(snapstore.open("fp", root=str(tmp_path / "snaps")))
    message = str(info.value)
    assert f"names checksum algorithm {found!r}" in message and str(path) in message
    assert "this snapstore reads 'crc32', 'crc32c'" in message
    assert "Upgrade snapstore" in message


def test_software_crc32c_is_not_silent() -> None:
    """Without the CPU instruction (simulated through the crc32c package's own switch), the
    checksums are still right and importing snapstore logs a warning (never silently slow)."""
    code = "import snapstore.format.checksums as c; assert c.CRC32C(b'123456789') == 0xE3069283"
    env = {**os.environ, "CRC32C_SKIP_HW_PROBE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "no CRC-32C instruction" in out.stderr and "slower" in out.stderr


def test_partitions_of_another_algorithm_are_not_assembled(tmp_path: Path) -> None:
    """The assembled manifest names one algorithm: a partition with CRC-32 blocks (made here
    by relabelling a partition's manifest as version 2) is refused, naming it."""
    store = LocalStore(tmp_path)
    for p in range(2):
        assert write_partition(store, "fp", p, lambda p=p: ({"x": p * 10 + i} for i in range(5)))
    part = tmp_path / partition_dir("fp", 1)
    (path,) = part.glob("runs/*/manifest.json")
    manifest = fmt.load_json(path.read_bytes(), "m")
    manifest["format_version"] = 2
    del manifest["checksum"], manifest["index"]["checksum"]
    manifest["index"]["crc32"] = CRC32((path.parent / fmt.INDEX_NAME).read_bytes())
    data = fmt.dump_json(manifest)
    path.write_bytes(data)
    record = fmt.load_json((part / fmt.COMMIT_NAME).read_bytes(), "c")
    record.update(manifest_size=len(data), manifest_crc32=fmt.CommitRecord.checksum(data))
    (part / fmt.COMMIT_NAME).write_bytes(fmt.dump_json(record))
    with pytest.raises(FormatError, match="partition 1 of fp has crc32 block checksums"):
        commit_partitions(store, "fp", 2)
    assert not (tmp_path / "fp" / fmt.COMMIT_NAME).exists()
