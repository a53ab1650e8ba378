"""Copying snapshots between stores: snapstore.manage.copy and `snapstore cp`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.common import parse_options
from snapstore.cli.main import main
from snapstore.errors import CorruptBlockError, SnapshotNotFoundError, StoreError
from snapstore.format import layout as fmt
from snapstore.format.checksums import CRC32, CRC32C, Checksum
from snapstore.manage.copy import _BlockChecker, copy_run_name, copy_snapshot
from snapstore.read.reader import load_manifest
from snapstore.storage.store import FsspecStore, LocalStore, Store, open_store
from snapstore.write.partitions import commit_partitions, write_partition
from snapstore.write.writer import WriteOptions

# Small blocks and shards: a few hundred samples make several shards of several blocks.
SMALL = WriteOptions(shard_bytes=4096, block_bytes=1024, block_min_rows=1, compression_level=0)


def stage(n: int):
    for i in range(n):
        yield {"x": np.full(16, i, np.float32), "label": i, "text": f"t{i}"}


def parted_stage(items: list[int]):
    for item in items:
        for j in range(40):
            yield {"x": np.full(16, item * 100 + j, np.float32), "label": item}


def memory_store() -> FsspecStore:
    return FsspecStore(fsspec.filesystem("memory"), f"/copy-{uuid.uuid4().hex}")


def make(root: Any, n: int = 200) -> str:
    snap = snapstore.snapshot(stage, root=root, options=SMALL)(n).materialize()
    return str(snap.fingerprint)


def samples(fp: str, root: Any, **options: Any) -> list[tuple[list[float], int]]:
    with snapstore.open(fp, root=root, **options) as snap:
        return [(s["x"].tolist(), int(s["label"])) for s in snap]


def shard_sizes(store: Store, fp: str) -> list[int]:
    return [int(s["size"]) for s in load_manifest(store, fp)["shards"]]


def cp(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_local_to_memory_copies_every_shard_and_reads_back(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    fp = make(src)
    dst = memory_store()
    seen: list[tuple[int, int]] = []
    result = copy_snapshot(
        src, fp, dst, jobs=3, chunk_bytes=1000, progress=lambda *a: seen.append(a)
    )
    sizes = shard_sizes(src, fp)
    assert len(sizes) > 2
    assert result.status == "copied" and result.committed and not result.already_present
    assert result.bytes_copied == sum(sizes) and result.bytes_skipped == 0
    assert result.files == len(sizes) + 3  # shards, index, manifest, commit record
    assert seen[-1] == (sum(sizes), sum(sizes))
    assert samples(fp, dst) == samples(fp, src)
    manifest = load_manifest(dst, fp)
    assert manifest["run"] == result.run == copy_run_name(load_manifest(src, fp)["run"])
    assert manifest["copied_from"]["run"] == load_manifest(src, fp)["run"]


def test_copy_again_is_a_no_op(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    fp = make(src, 50)
    dst = LocalStore(tmp_path / "dst")
    assert copy_snapshot(src, fp, dst).committed
    before = sorted(p.name for p in (tmp_path / "dst" / fp / "runs").iterdir())
    again = copy_snapshot(src, fp, dst)
    assert again.already_present and again.run is None
    assert (again.bytes_copied, again.bytes_skipped, again.files) == (0, 0, 0)
    assert sorted(p.name for p in (tmp_path / "dst" / fp / "runs").iterdir()) == before
    code, out = cp("--root", str(tmp_path / "src"), "cp", fp[:10], str(tmp_path / "dst"))
    assert code == 0 and "already present" in out


def test_cli_memory_to_local_json(tmp_path: Path) -> None:
    src_url = f"memory://cp-src-{uuid.uuid4().hex}"
    fp = make(src_url)
    dest = str(tmp_path / "dst")
    code, out = cp("--root", src_url, "cp", fp, dest, "--jobs", "2", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert set(data) == {
        "fingerprint", "source", "destination", "bytes_copied", "bytes_skipped",
        "partitions_copied", "partitions_present", "files", "seconds", "status",
    }  # fmt: skip
    assert data["fingerprint"] == fp and data["status"] == "copied"
    assert data["destination"] == str(Path(dest).absolute()) and data["source"].endswith(
        src_url[9:]
    )
    assert data["bytes_copied"] == sum(shard_sizes(open_store(src_url), fp))
    assert samples(fp, dest) == samples(fp, src_url)
    code, out = cp("--root", src_url, "cp", fp, dest)
    assert code == 0 and "already present" in out


def test_cli_summary_line(tmp_path: Path) -> None:
    fp = make(tmp_path / "src", 30)
    code, out = cp("--root", str(tmp_path / "src"), "cp", fp, str(tmp_path / "dst"))
    assert code == 0 and out.startswith(f"copied {fp} to ") and "file(s)" in out


def test_local_to_gcs_and_back(tmp_path: Path, gcs_root: tuple[str, dict[str, Any]]) -> None:
    url, options = gcs_root
    fp = make(tmp_path / "src")
    args = [
        f"--dest-option={k}={json.dumps(v) if not isinstance(v, str) else v}"
        for k, v in options.items()
    ]
    code, out = cp("--root", str(tmp_path / "src"), "cp", fp, url, *args, "--json")
    assert code == 0, out
    assert json.loads(out)["status"] == "copied"
    assert samples(fp, url, **options) == samples(fp, tmp_path / "src")
    back = LocalStore(tmp_path / "back")
    result = copy_snapshot(open_store(url, **options), fp, back, jobs=4)
    assert result.committed and result.bytes_copied == sum(shard_sizes(back, fp))
    assert samples(fp, back) == samples(fp, tmp_path / "src")


def test_numbered_partitions_become_a_flat_run(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    fp = "ab" * 16  # a snapshot with partitions of its own, <fp>/parts/<p>, as engines write
    for p, item in enumerate([1, 2, 3]):
        write_partition(src, fp, p, lambda item=item: parted_stage([item]), options=SMALL)
    assert commit_partitions(src, fp, 3)
    source = load_manifest(src, fp)
    assert all("dir" in s for s in source["shards"])  # really partitioned
    dst = memory_store()
    result = copy_snapshot(src, fp, dst, chunk_bytes=700)
    copied = load_manifest(dst, fp)
    assert result.committed and result.partitions_copied == 0
    assert [s["path"] for s in copied["shards"]] == [
        f"shard-{i:05d}.snap" for i in range(len(source["shards"]))
    ]
    assert not any("dir" in s for s in copied["shards"])
    assert copied["index"] == source["index"] and copied["num_samples"] == 120
    assert samples(fp, dst) == samples(fp, src)


def test_shared_partitions_are_copied_with_the_snapshot(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    parted = snapstore.snapshot(parted_stage, root=src, partition_by="items", options=SMALL)
    fp = str(parted([1, 2, 3]).materialize().fingerprint)
    source = load_manifest(src, fp)
    assert all("shared" in s for s in source["shards"])  # really partitioned (shared ones)
    dst = memory_store()
    result = copy_snapshot(src, fp, dst, chunk_bytes=700)
    copied = load_manifest(dst, fp)
    assert result.committed and result.partitions_copied == len(source["shared_partitions"])
    assert copied["shards"] == source["shards"] or all("shared" in s for s in copied["shards"])
    assert copied["shared_partitions"] == source["shared_partitions"]
    for ref in copied["shared_partitions"]:
        assert dst.exists(f"parts/{ref}/COMMIT")
    assert copied["index"] == source["index"] and copied["num_samples"] == 120
    assert samples(fp, dst) == samples(fp, src)


def _interrupt_after(store: Store, monkeypatch: pytest.MonkeyPatch, reads: int) -> None:
    """Make ``store``'s range reads fail from the ``reads + 1``-th on."""
    real = store.read_range
    count = {"n": 0}

    def failing(path: str, start: int, length: int) -> Any:
        count["n"] += 1
        if count["n"] > reads:
            raise StoreError(f"injected failure reading {path}")
        return real(path, start, length)

    monkeypatch.setattr(store, "read_range", failing)


def test_interrupted_copy_is_invisible_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = LocalStore(tmp_path / "src")
    fp = make(src, 300)
    sizes = shard_sizes(src, fp)
    assert len(sizes) >= 4
    dst = LocalStore(tmp_path / "dst")
    with monkeypatch.context() as m:
        _interrupt_after(src, m, reads=3)  # one read per shard: three shards, then a failure
        with pytest.raises(StoreError, match="injected"):
            copy_snapshot(src, fp, dst, jobs=1, chunk_bytes=1 << 20)
    assert not (tmp_path / "dst" / fp / fmt.COMMIT_NAME).exists()
    with pytest.raises(SnapshotNotFoundError):
        snapstore.open(fp, root=dst)
    run_dir = tmp_path / "dst" / fp / "runs" / copy_run_name(load_manifest(src, fp)["run"])
    assert (run_dir / "shard-00003.snap").stat().st_size == 0  # opened, never written
    # Damage two finished shards: one truncated, one with a flipped byte inside a block.
    shard1 = run_dir / "shard-00001.snap"
    shard1.write_bytes(shard1.read_bytes()[: sizes[1] // 2])
    shard2 = run_dir / "shard-00002.snap"
    data = bytearray(shard2.read_bytes())
    data[len(fmt.SHARD_MAGIC) + 64] ^= 0xFF  # the first block starts at offset 64
    shard2.write_bytes(bytes(data))
    code, out = cp("--root", str(tmp_path / "src"), "cp", fp, str(tmp_path / "dst"), "--json")
    assert code == 0, out
    result = json.loads(out)
    assert result["status"] == "copied"
    assert result["bytes_skipped"] == sizes[0]
    assert result["bytes_copied"] == sum(sizes) - sizes[0]
    assert result["files"] == len(sizes) - 1 + 3
    assert samples(fp, dst) == samples(fp, src)


def test_uncommitted_source_is_refused(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    fp = "ab" * 16
    src.write_bytes(f"{fp}/runs/r1/shard-00000.snap", b"SNAPSHD1")
    dst = LocalStore(tmp_path / "dst")
    with pytest.raises(SnapshotNotFoundError, match=f"no committed snapshot {fp}"):
        copy_snapshot(src, fp, dst)
    with pytest.raises(SnapshotNotFoundError, match="is not a fingerprint"):
        copy_snapshot(src, "../x", dst)
    code, out = cp("--root", str(tmp_path / "src"), "cp", fp, str(tmp_path / "dst"))
    assert code == 1 and "error: no committed snapshot matches" in out
    assert not (tmp_path / "dst").exists()


def test_corrupt_source_block_is_refused_and_nothing_committed(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    fp = make(src, 40)
    manifest = load_manifest(src, fp)
    shard = tmp_path / "src" / fp / "runs" / manifest["run"] / manifest["shards"][0]["path"]
    data = bytearray(shard.read_bytes())
    data[64 + 10] ^= 0x01
    shard.write_bytes(bytes(data))
    dst = memory_store()
    with pytest.raises(CorruptBlockError, match="does not match its checksum"):
        copy_snapshot(src, fp, dst)
    assert not dst.exists(f"{fp}/{fmt.COMMIT_NAME}")


@pytest.mark.parametrize("checksum", [CRC32, CRC32C], ids=["crc32", "crc32c"])
def test_block_checker_across_any_chunking(checksum: Checksum) -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 1000, dtype=np.uint8).tobytes()
    blocks = np.zeros(3, fmt.INDEX_DTYPE)
    for i, (offset, length) in enumerate([(8, 100), (128, 0), (192, 700)]):
        blocks[i]["offset"], blocks[i]["length"] = offset, length
        blocks[i]["checksum"] = checksum(data[offset : offset + length])
    for chunk in (1, 7, 64, 100, 1000):
        checker = _BlockChecker(blocks, "s", checksum)
        for start in range(0, len(data), chunk):
            checker.feed(start, memoryview(data[start : start + chunk]))
        checker.finish()
    short = _BlockChecker(blocks, "s", checksum)
    short.feed(0, memoryview(data[:500]))
    with pytest.raises(CorruptBlockError, match="truncated"):
        short.finish()


def test_dest_options_parse_json_else_string(tmp_path: Path) -> None:
    assert parse_options(("a=1", "b=true", "c=hello", "d=http://h:1", 'e={"k": 2}')) == {
        "a": 1, "b": True, "c": "hello", "d": "http://h:1", "e": {"k": 2},
    }  # fmt: skip
    result = CliRunner().invoke(
        main, ["--root", str(tmp_path), "cp", "x", "y", "--dest-option", "novalue"]
    )
    assert result.exit_code == 2 and "KEY=VALUE" in result.output
