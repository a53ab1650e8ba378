"""Every byte read is verified; corrupt, foreign or malicious files give clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import snapstore
from snapstore.errors import CorruptBlockError, FormatError, SnapshotNotFoundError
from snapstore.format import layout as fmt
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import LocalStore
from snapstore.write.writer import SnapshotWriter, WriteOptions


@pytest.fixture
def written(tmp_path):
    store = LocalStore(tmp_path / "snaps")
    writer = SnapshotWriter(
        store, "fp", options=WriteOptions(block_min_rows=1, block_bytes=4096, compression_level=0)
    )
    for i in range(200):
        writer.add({"x": np.full(256, i, np.int32)})
    assert writer.commit()
    return store, f"fp/runs/{writer.run}"


@pytest.mark.parametrize("block", [0, 5])
def test_flipped_byte_names_shard_and_offset(written, block: int) -> None:
    store, _ = written
    reader = SnapshotReader(store, "fp")
    entry = reader.index[block]
    shard = reader.shard_paths[int(entry["shard"])]
    path = store.root / shard
    data = bytearray(path.read_bytes())
    data[int(entry["offset"]) + int(entry["length"]) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    reader.close()
    reader = SnapshotReader(store, "fp")
    with pytest.raises(CorruptBlockError) as info:
        reader.load_block(block)
    assert info.value.shard.endswith(shard) and info.value.offset == int(entry["offset"])
    assert f"offset {int(entry['offset'])}" in str(info.value) and shard in str(info.value)
    with pytest.raises(CorruptBlockError):
        list(reader)  # iteration verifies as well
    reader.close()


def test_truncated_shard_is_caught_when_opening(written) -> None:
    store, run_dir = written
    path = store.root / run_dir / "shard-00000.snap"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(FormatError):
        reader = SnapshotReader(store, "fp")
        list(reader)


def test_corrupt_manifest_and_commit_record(written) -> None:
    store, run_dir = written
    manifest = store.root / run_dir / "manifest.json"
    original = manifest.read_bytes()
    manifest.write_bytes(original.replace(b'"num_samples": 200', b'"num_samples": 201'))
    with pytest.raises(FormatError, match="does not match its commit record"):
        SnapshotReader(store, "fp")
    manifest.write_bytes(original)
    (store.root / "fp" / "COMMIT").write_bytes(b"not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        SnapshotReader(store, "fp")


def rewrite_manifest(store: LocalStore, run_dir: str, change) -> None:
    path = store.root / run_dir / "manifest.json"
    manifest = json.loads(path.read_bytes())
    change(manifest)
    data = fmt.dump_json(manifest)
    path.write_bytes(data)
    record = json.loads((store.root / "fp" / "COMMIT").read_bytes())
    record.update(manifest_size=len(data), manifest_crc32=fmt.CommitRecord.checksum(data))
    (store.root / "fp" / "COMMIT").write_bytes(fmt.dump_json(record))


@pytest.mark.parametrize("bad", ["../../../etc/passwd", "/etc/passwd", "a/b", "", 7])
def test_manifest_pointing_outside_the_snapshot_is_refused(written, bad) -> None:
    store, run_dir = written
    rewrite_manifest(store, run_dir, lambda m: m["shards"][0].update(path=bad))
    with pytest.raises(FormatError, match="not a plain file name inside the snapshot"):
        SnapshotReader(store, "fp")


def test_index_pointing_past_a_shard_is_refused(written) -> None:
    store, run_dir = written
    rewrite_manifest(store, run_dir, lambda m: m["shards"][0].update(size=100))
    with pytest.raises(FormatError, match="points outside"):
        SnapshotReader(store, "fp")


def test_newer_format_version_is_refused(written) -> None:
    store, run_dir = written
    rewrite_manifest(store, run_dir, lambda m: m.update(format_version=99))
    with pytest.raises(FormatError, match="format version 99"):
        SnapshotReader(store, "fp")


def test_foreign_directory_is_not_a_snapshot(tmp_path) -> None:
    (tmp_path / "deadbeef" / "runs" / "x").mkdir(parents=True)
    (tmp_path / "deadbeef" / "runs" / "x" / "manifest.json").write_text("{}")
    with pytest.raises(SnapshotNotFoundError, match="no committed snapshot"):
        snapstore.open("deadbeef", root=str(tmp_path))


def test_foreign_index_is_refused() -> None:
    with pytest.raises(FormatError, match="bad magic"):
        fmt.read_index(b"PK\x03\x04" + b"\0" * 40, "index.bin")


def test_missing_shard_is_a_format_error(written) -> None:
    store, run_dir = written
    (store.root / run_dir / "shard-00000.snap").unlink()
    reader = SnapshotReader(store, "fp")
    with pytest.raises(FormatError, match="is missing"):
        reader.load_block(0)


def test_name_with_trailing_newline_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.check_name("shard-00000.snap\n", "shard")


def test_raw_length_is_checked(written) -> None:
    store, _ = written
    reader = SnapshotReader(store, "fp")
    entry = reader.index[0].copy()
    entry["raw_length"] = int(entry["length"]) + 1
    data = reader.store.read_range(
        reader.shard_paths[0], int(entry["offset"]), int(entry["length"])
    )
    with pytest.raises(CorruptBlockError, match="claims"):
        fmt.decode_block(
            data, entry, reader.schema.arrow_schema(), "shard", checksum=reader.checksum
        )


def test_blocks_are_aligned(written) -> None:
    store, _ = written
    reader = SnapshotReader(store, "fp")
    assert all(int(o) % fmt.BLOCK_ALIGNMENT == 0 for o in reader.index["offset"])
    assert reader.load_block(3).column("x").flags.aligned


@pytest.mark.parametrize("key", ["num_blocks", "shards", "schema", "index", "num_samples"])
def test_manifest_missing_a_key_is_a_format_error(written, key: str) -> None:
    store, run_dir = written
    rewrite_manifest(store, run_dir, lambda m: m.pop(key))
    with pytest.raises(FormatError):
        SnapshotReader(store, "fp")
