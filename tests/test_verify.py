"""``snapstore verify`` and :func:`snapstore.manage.verify.verify_snapshot`: every damage is
found."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.main import main
from snapstore.format import layout as fmt
from snapstore.manage import verify
from snapstore.manage.verify import plan_ranges, verify_snapshot
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import FsspecStore, LocalStore, Store
from snapstore.write.writer import WriteOptions

# Small blocks and shards, so a snapshot of 300 samples has many blocks in several shards.
OPTIONS = WriteOptions(block_min_rows=1, block_bytes=2048, shard_bytes=16384, compression_level=0)


def stage(n: int):
    for i in range(n):
        yield {"x": np.arange(i, i + 64, dtype=np.int32), "label": i}


def parted_stage(items: list[int]):
    for i in items:
        yield {"x": np.full(8, i, np.int32), "label": i}


def write(root: str | Store, n: int = 300, options: WriteOptions = OPTIONS) -> str:
    snap = snapstore.snapshot(stage, root=root, options=options)(n).materialize()
    return snap.fingerprint


@pytest.fixture
def local(tmp_path: Path) -> tuple[str, str, SnapshotReader]:
    root = str(tmp_path / "root")
    fp = write(root)
    reader = SnapshotReader(LocalStore(root), fp)
    assert len(reader.shard_paths) >= 3 and reader.num_blocks >= 10
    return root, fp, reader


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize("level", [0, 3])
def test_clean_snapshot_passes(store: Store, level: int) -> None:
    options = WriteOptions(block_min_rows=1, block_bytes=2048, compression_level=level)
    fp = write(store, options=options)
    seen: list[tuple[int, int]] = []
    report = verify_snapshot(store, fp, progress=lambda done, total: seen.append((done, total)))
    assert report.ok and report.problems == []
    reader = SnapshotReader(store, fp)
    assert report.blocks == reader.num_blocks
    assert report.bytes == int(reader.index["length"].sum()) == seen[-1][0] == seen[-1][1]
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert (reader.index["codec"] == level // 3).all() and reader.num_blocks > 1


@pytest.mark.parametrize("whole", [True, False])
def test_clean_snapshot_passes_on_gcs(gcs_server, monkeypatch, whole: bool) -> None:
    if not whole:  # range reads of at most 3 KiB instead of one read per shard
        monkeypatch.setattr(verify, "_WHOLE_SHARD_BYTES", 0)
        monkeypatch.setattr(verify, "_MAX_REQUEST_BYTES", 3000)
    store = gcs_server.store()
    try:
        fp = write(store, 100)
        report = verify_snapshot(store, fp, jobs=4)
        assert report.ok and report.problems == [] and report.blocks > 1
    finally:
        store.close()


def test_cli_clean_and_prefix(local) -> None:
    root, fp, reader = local
    code, out = run("--root", root, "verify", fp[:8])
    assert code == 0, out
    assert out.splitlines()[0].startswith(f"OK      {fp}  {reader.num_blocks} block(s)")
    assert "1 snapshot(s) verified, 0 failed" in out


def flip(root: str, shard: str, position: int) -> None:
    path = Path(root) / shard
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_flipped_block_is_reported(local) -> None:
    root, fp, reader = local
    bad = [1, reader.num_blocks - 1]
    for block in bad:
        entry = reader.index[block]
        shard = reader.shard_paths[int(entry["shard"])]
        flip(root, shard, int(entry["offset"]) + int(entry["length"]) // 2)
    report = verify_snapshot(LocalStore(root), fp, jobs=3)
    assert not report.ok and report.blocks == reader.num_blocks
    expected = [
        (reader.shard_paths[int(reader.index[b]["shard"])], int(reader.index[b]["offset"]))
        for b in bad
    ]
    assert [(p["kind"], p["shard"], p["offset"]) for p in report.problems] == [
        ("block", s, o) for s, o in sorted(expected)
    ]
    assert "checksum mismatch" in report.problems[0]["message"]
    assert "snapstore rm" in report.problems[0]["message"]
    assert "snapstore verify" not in report.problems[0]["message"]
    code, out = run("--root", root, "verify", fp)
    assert code == 1 and out.startswith(f"FAILED  {fp}") and "2 problem(s)" in out
    shard, offset = expected[0]
    assert f"  error block: block at offset {offset} of shard '{shard}' is corrupt" in out


@pytest.mark.parametrize("whole", [True, False])
def test_damage_on_a_remote_store(monkeypatch, whole: bool) -> None:
    """The paths remote stores take: whole shards in one read, or coalesced range reads."""
    if not whole:
        monkeypatch.setattr(verify, "_WHOLE_SHARD_BYTES", 0)
        monkeypatch.setattr(verify, "_MAX_REQUEST_BYTES", 3000)
    fs = fsspec.filesystem("memory")
    store = FsspecStore(fs, f"/snaps-{uuid.uuid4().hex}")
    fp = write(store)
    reader = SnapshotReader(store, fp)
    entry = reader.index[3]
    shard = reader.shard_paths[int(entry["shard"])]
    data = bytearray(fs.cat_file(f"{store.url}/{shard}"))
    data[int(entry["offset"]) + 5] ^= 0xFF
    data[-1] ^= 0xFF  # the footer magic
    fs.pipe_file(f"{store.url}/{shard}", bytes(data))
    report = verify_snapshot(store, fp, jobs=2)
    assert [(p["kind"], p["shard"], p["offset"]) for p in report.problems] == [
        ("footer", shard, None),
        ("block", shard, int(entry["offset"])),
    ]
    assert report.blocks == reader.num_blocks


def test_truncated_shard(local) -> None:
    root, fp, reader = local
    shard = reader.shard_paths[1]
    path = Path(root) / shard
    last = reader.index[reader.index["shard"] == 1][-1]
    path.write_bytes(path.read_bytes()[: int(last["offset"]) + 10])
    report = verify_snapshot(LocalStore(root), fp)
    kinds = [(p["kind"], p["shard"], p["offset"]) for p in report.problems]
    assert ("size", shard, None) in kinds and ("block", shard, int(last["offset"])) in kinds
    assert len(kinds) == 2 and "truncated" in report.problems[0]["message"]
    assert run("--root", root, "verify", fp)[0] == 1


def test_missing_shard(local) -> None:
    root, fp, reader = local
    (Path(root) / reader.shard_paths[0]).unlink()
    report = verify_snapshot(LocalStore(root), fp)
    assert [(p["kind"], p["shard"]) for p in report.problems] == [
        ("missing", reader.shard_paths[0])
    ]
    assert report.blocks == reader.num_blocks - int((reader.index["shard"] == 0).sum())
    code, out = run("--root", root, "verify", fp)
    assert code == 1 and "error missing" in out and "is missing" in out


def test_footer_that_disagrees_with_the_index(local) -> None:
    root, fp, reader = local
    shard = reader.shard_paths[0]
    path = Path(root) / shard
    entries = reader.index[reader.index["shard"] == 0]
    footer_at = int(entries[-1]["offset"] + entries[-1]["length"])
    data = bytearray(path.read_bytes())
    # The checksum of the footer's second row: the block itself is intact.
    data[footer_at + fmt.INDEX_DTYPE.itemsize + 40] ^= 0x01
    path.write_bytes(bytes(data))
    report = verify_snapshot(LocalStore(root), fp)
    assert [(p["kind"], p["shard"], p["offset"]) for p in report.problems] == [
        ("footer", shard, footer_at)
    ]
    assert str(int(entries[1]["offset"])) in report.problems[0]["message"]
    assert not report.ok


def test_bad_magic_and_footer_magic(local) -> None:
    root, fp, reader = local
    shard = reader.shard_paths[2]
    size = (Path(root) / shard).stat().st_size
    flip(root, shard, 0)
    flip(root, shard, size - 1)
    report = verify_snapshot(LocalStore(root), fp)
    assert sorted(p["kind"] for p in report.problems) == ["footer", "magic"]


def test_foreign_file_is_a_warning(local) -> None:
    root, fp, reader = local
    (Path(root) / reader.run_dir / "notes.txt").write_text("hello")
    report = verify_snapshot(LocalStore(root), fp)
    assert report.ok and report.errors == []
    assert [(p["kind"], p["shard"]) for p in report.warnings] == [
        ("foreign", f"{reader.run_dir}/notes.txt")
    ]
    code, out = run("--root", root, "verify", fp)
    assert code == 0 and "1 warning(s)" in out and "warning foreign" in out


def test_corrupt_manifest_is_a_problem(local) -> None:
    root, fp, reader = local
    (Path(root) / reader.run_dir / "manifest.json").write_text("{}")
    report = verify_snapshot(LocalStore(root), fp)
    assert [p["kind"] for p in report.problems] == ["manifest"] and not report.ok


def test_missing_index_is_a_problem(local) -> None:
    root, fp, reader = local
    (Path(root) / reader.run_dir / "index.bin").unlink()
    report = verify_snapshot(LocalStore(root), fp)
    assert [p["kind"] for p in report.problems] == ["index"]


def test_partitioned_snapshot(store: Store) -> None:
    snap = snapstore.snapshot(parted_stage, root=store, partition_by="items", partition_size=2)
    fp = snap(list(range(7))).materialize().fingerprint
    reader = SnapshotReader(store, fp)
    assert all(s.get("shared") for s in reader.manifest["shards"])  # in parts/ at the root
    assert len(reader.manifest["shared_partitions"]) == reader.manifest["partitions"] > 1
    report = verify_snapshot(store, fp)
    assert report.ok and report.problems == [] and report.blocks == reader.num_blocks


def test_all_and_json_shape(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    good = write(root, 50)
    bad = write(root, 60)
    reader = SnapshotReader(LocalStore(root), bad)
    entry = reader.index[0]
    flip(root, reader.shard_paths[0], int(entry["offset"]) + 1)
    code, out = run("--root", root, "verify", "--all", "--json")
    assert code == 1
    data = json.loads(out)
    assert list(data) == ["root", "snapshots", "partitions"]
    assert data["root"] == LocalStore(root).url and data["partitions"] == 0
    by_fp = {s["fingerprint"]: s for s in data["snapshots"]}
    assert set(by_fp) == {good, bad}
    for snap in data["snapshots"]:
        assert list(snap) == [
            "fingerprint", "ok", "blocks", "bytes", "bytes_reused", "seconds", "problems",
        ]  # fmt: skip
        assert isinstance(snap["blocks"], int) and isinstance(snap["bytes"], int)
        assert isinstance(snap["seconds"], float) and snap["blocks"] > 0
    assert by_fp[good]["ok"] is True and by_fp[good]["problems"] == []
    assert by_fp[bad]["ok"] is False
    (problem,) = by_fp[bad]["problems"]
    assert list(problem) == ["kind", "shard", "offset", "message"]
    assert problem["kind"] == "block" and problem["shard"] == reader.shard_paths[0]
    assert problem["offset"] == int(entry["offset"]) and "corrupt" in problem["message"]
    code, out = run("--root", root, "verify", "--all")
    assert code == 1 and "2 snapshot(s) verified, 1 failed" in out


def test_usage_errors(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    assert run("--root", root, "verify")[0] == 2
    code, out = run("--root", root, "verify", "--all")
    assert code == 0 and "no snapshots" in out
    result = CliRunner().invoke(main, ["--root", root, "verify", "abc"])
    assert result.exit_code == 1 and "error:" in result.output


def test_plan_ranges_coalesces_up_to_the_limit() -> None:
    offsets, lengths = np.array([64, 128, 256, 4096]), np.array([50, 100, 3000, 10])
    assert plan_ranges(offsets, lengths, 0) == [
        (64, 50, [0]),
        (128, 100, [1]),
        (256, 3000, [2]),
        (4096, 10, [3]),
    ]
    assert plan_ranges(offsets, lengths, 1000) == [
        (64, 164, [0, 1]),
        (256, 3000, [2]),
        (4096, 10, [3]),
    ]
    assert plan_ranges(offsets, lengths, 1 << 20) == [(64, 4042, [0, 1, 2, 3])]
