"""Management of snapshots that share partitions (issue 25, item 5): ls, info, du, diff, cp and
verify on a root where a partitioned stage over ``snapstore.files(...)`` was materialized for a
list of files, a prefix of it and the list with one file added.

What each snapshot shares is worked out here from the content-defined boundaries
(:func:`snapstore.write.boundaries.content_boundaries`) of the file names, not from the code
under test.
"""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.main import main
from snapstore.manage.copy import copy_snapshot
from snapstore.manage.verify import SharedChecks, verify_snapshot
from snapstore.read.reader import SnapshotReader, load_manifest
from snapstore.storage.store import LocalStore, open_store
from snapstore.write.boundaries import content_boundaries

SIZE = 4  # partition_size: about 4 files per partition
NAMES = [f"f{i:02d}.txt" for i in range(40)]
ADDED = "f10b.txt"  # sorts between f10.txt and f11.txt


def lengths(paths: Any) -> Any:
    for path in paths:
        with open(path) as f:
            yield {"name": Path(path).name, "words": len(f.read().split())}


def stage(root: Path) -> Any:
    return snapstore.snapshot(lengths, root=str(root), partition_by="paths",
                              partition_size=SIZE, engine="thread")  # fmt: skip


def groups(names: list[str]) -> list[tuple[str, ...]]:
    """The files of each partition of a call over ``names``, in order."""
    return [tuple(names[i] for i in r) for r in content_boundaries(names, SIZE)]


class Grown:
    """The root: snapshots ``full`` (40 files), ``prefix`` (the first 20) and ``added`` (41)."""

    def __init__(self, base: Path) -> None:
        self.root, data = base / "root", base / "data"
        data.mkdir()
        for name in NAMES:
            (data / name).write_text(f"the words of {name}\n")
        files = [str(data / n) for n in NAMES]
        self.full = stage(self.root)(snapstore.files(files)).materialize().fingerprint
        self.prefix = stage(self.root)(snapstore.files(files[:20])).materialize().fingerprint
        (data / ADDED).write_text("a file that came later\n")
        with_added = sorted([*NAMES, ADDED])
        call = stage(self.root)(snapstore.files([str(data / n) for n in with_added]))
        self.added = call.materialize().fingerprint
        self.names = {self.full: NAMES, self.prefix: NAMES[:20], self.added: with_added}
        store = LocalStore(self.root)
        self.refs = {fp: load_manifest(store, fp)["shared_partitions"] for fp in self.names}
        # Each partition by its files (their contents did not change between the calls).
        self.by_files = {
            g: ref
            for fp, names in self.names.items()
            for g, ref in zip(groups(names), self.refs[fp], strict=True)
        }

    def dir_bytes(self, rel: str) -> int:
        return sum(p.stat().st_size for p in (self.root / rel).rglob("*") if p.is_file())

    def users(self, ref: str) -> set[str]:
        return {fp for fp, refs in self.refs.items() if ref in refs}


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Grown:
    return Grown(tmp_path_factory.mktemp("grown"))


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


def cli_json(*args: str) -> Any:
    code, out = cli(*args, "--json")
    assert code == 0, out
    return json.loads(out)


def test_the_calls_share_partitions(grown: Grown) -> None:
    """The premise: the prefix and the added file reuse most partitions of the full list."""
    full, prefix, added = (set(grown.refs[fp]) for fp in (grown.full, grown.prefix, grown.added))
    assert len(full & prefix) >= 3 and len(full & added) >= len(full) - 2
    assert len(full | prefix | added) == len(grown.by_files)  # one ref per distinct partition


def test_ls_and_info_show_partitions_and_how_many_are_shared(grown: Grown) -> None:
    listed = cli_json("--root", str(grown.root), "ls")
    by_fp = {i["fingerprint"]: i for i in listed["snapshots"]}
    assert set(by_fp) == set(grown.names)
    for fp, refs in grown.refs.items():
        info = by_fp[fp]
        shared = [r for r in refs if len(grown.users(r)) > 1]
        part_bytes = sum(grown.dir_bytes(f"parts/{r}") for r in refs)
        assert info["partitions"] == len(groups(grown.names[fp])) == len(refs)
        assert info["partitions_shared"] == len(shared) > 0
        assert info["partition_bytes"] == part_bytes
        assert info["shared_bytes"] == sum(grown.dir_bytes(f"parts/{r}") for r in shared)
        assert info["bytes"] == grown.dir_bytes(fp) + part_bytes
        assert info["shared_with"] == sorted({u for r in shared for u in grown.users(r)} - {fp})
        assert cli_json("--root", str(grown.root), "info", fp[:8]) == {
            **info,
            "integrity": "commit record, manifest and block index valid; blocks not read",
        }
    # The total counts each partition once: every file under the root, once.
    assert listed["total_bytes"] == grown.dir_bytes("") < sum(i["bytes"] for i in by_fp.values())
    code, table = cli("--root", str(grown.root), "ls")
    assert code == 0 and "PARTS" in table.splitlines()[0]
    for fp, info in by_fp.items():
        row = next(line for line in table.splitlines() if line.startswith(fp[:12]))
        assert f"{info['partitions']} ({info['partitions_shared']} shared)" in row
    code, text = cli("--root", str(grown.root), "info", grown.prefix)
    line = next(x for x in text.splitlines() if x.startswith("partitions "))
    assert f"{by_fp[grown.prefix]['partitions_shared']} shared" in line
    assert grown.full[:12] in line and grown.added[:12] in line


def test_du_counts_shared_bytes_once(grown: Grown) -> None:
    usage = cli_json("--root", str(grown.root), "du")
    everything = grown.dir_bytes("")
    assert usage["total_bytes"] == everything
    (row,) = usage["stages"]
    assert row["snapshots"] == 3 and row["bytes"] == everything
    assert row["partitions"] == len(grown.by_files)
    shared = [r for r in grown.by_files.values() if len(grown.users(r)) > 1]
    shared_bytes = sum(grown.dir_bytes(f"parts/{r}") for r in shared)
    assert usage["shared_bytes"] == row["shared_bytes"] == shared_bytes > 0
    saved = sum((len(grown.users(r)) - 1) * grown.dir_bytes(f"parts/{r}") for r in shared)
    assert usage["saved_bytes"] == saved
    assert usage["unreferenced_partitions"] == {"partitions": 0, "bytes": 0}
    code, text = cli("--root", str(grown.root), "du")
    assert code == 0 and "PARTITIONS" in text and "SHARED" in text
    assert "shared:" in text and "counted once" in text


def test_du_shows_partitions_no_snapshot_uses(grown: Grown, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(grown.root, root)
    shutil.rmtree(root / grown.prefix)  # its own partition is left behind
    stage_key = grown.refs[grown.full][0].split("/")[0]
    (root / "parts" / stage_key / "pins").mkdir()  # a job's pin on the stage: no partition
    (root / "parts" / stage_key / "pins" / "job-1").write_text("pinned")
    own = [r for r in grown.refs[grown.prefix] if grown.users(r) == {grown.prefix}]
    usage = cli_json("--root", str(root), "du")
    assert usage["unreferenced_partitions"] == {
        "partitions": len(own),
        "bytes": sum(grown.dir_bytes(f"parts/{r}") for r in own),
    }
    assert len(own) >= 1 and usage["total_bytes"] == grown.dir_bytes("") - grown.dir_bytes(
        grown.prefix
    )


@pytest.mark.parametrize("which", ["added", "prefix"])
def test_diff_says_which_partitions_are_shared_new_and_dropped(grown: Grown, which: str) -> None:
    new_fp = getattr(grown, which)
    a, b = groups(grown.names[grown.full]), groups(grown.names[new_fp])
    result = cli_json("--root", str(grown.root), "diff", grown.full, new_fp)
    assert result["partitions"] == {
        "shared": [grown.by_files[g] for g in b if g in a],
        "new": [grown.by_files[g] for g in b if g not in a],
        "dropped": [grown.by_files[g] for g in a if g not in b],
    }
    if which == "added":  # one file inserted: one partition changed
        assert (len(result["partitions"]["new"]), len(result["partitions"]["dropped"])) == (1, 1)
    code, text = cli("--root", str(grown.root), "diff", grown.full, new_fp)
    assert code == 0
    counts = {k: len(v) for k, v in result["partitions"].items()}
    assert f"{counts['shared']} shared, {counts['new']} new, {counts['dropped']} dropped" in text


def test_diff_of_unpartitioned_snapshots_has_no_partitions(tmp_path: Path) -> None:
    make = snapstore.snapshot(lambda n: ({"x": i} for i in range(n)), root=str(tmp_path))
    a, b = make(3).materialize().fingerprint, make(4).materialize().fingerprint
    assert cli_json("--root", str(tmp_path), "diff", a, b)["partitions"] is None


class CountingStore(LocalStore):
    """A local store that records the paths it reads (ranges and whole files)."""

    def __init__(self, root: Any) -> None:
        super().__init__(root)
        self.reads: collections.Counter[str] = collections.Counter()

    def read_range(self, path: str, start: int, length: int) -> Any:
        self.reads[path] += 1
        return super().read_range(path, start, length)

    def read_bytes(self, path: str) -> bytes:
        self.reads[path] += 1
        return super().read_bytes(path)


def samples(fp: str, root: Any, **options: Any) -> list[tuple[str, int]]:
    with snapstore.open(fp, root=root, **options) as snap:
        return [(s["name"], int(s["words"])) for s in snap]


def partition_shard_bytes(grown: Grown, refs: list[str]) -> int:
    store = LocalStore(grown.root)
    return sum(
        int(entry["size"])
        for ref in refs
        for entry in SnapshotReader(store, f"parts/{ref}").manifest["shards"]
    )


def test_cp_to_a_local_root_skips_the_partitions_already_there(
    grown: Grown, tmp_path: Path
) -> None:
    dst = LocalStore(tmp_path / "dst")
    first = copy_snapshot(grown.root, grown.prefix, dst)
    prefix_refs = grown.refs[grown.prefix]
    assert (first.partitions_copied, first.partitions_present) == (len(prefix_refs), 0)
    assert first.bytes_copied == partition_shard_bytes(grown, prefix_refs)
    src = CountingStore(grown.root)
    second = copy_snapshot(src, grown.full, dst)
    present = [r for r in grown.refs[grown.full] if r in prefix_refs]
    missing = [r for r in grown.refs[grown.full] if r not in prefix_refs]
    assert present and missing
    assert (second.partitions_copied, second.partitions_present) == (len(missing), len(present))
    assert second.bytes_copied == partition_shard_bytes(grown, missing)
    assert second.bytes_skipped == 0
    # Nothing of a partition already there was read from the source.
    assert not [p for p in src.reads if any(p.startswith(f"parts/{r}/") for r in present)]
    for fp in (grown.prefix, grown.full):
        assert samples(fp, dst) == samples(fp, grown.root)
        assert load_manifest(dst, fp)["shared_partitions"] == grown.refs[fp]
    assert copy_snapshot(grown.root, grown.full, dst).already_present
    # At the destination the partitions are shared as at the source.
    code, out = cli("--root", str(tmp_path / "dst"), "verify", "--all")
    assert code == 0 and f"{len(set(prefix_refs) | set(missing))} shared partition(s)" in out
    info = cli_json("--root", str(tmp_path / "dst"), "info", grown.full)
    assert info["partitions_shared"] == len(present)


def test_cp_resumes_an_interrupted_copy_of_partitions(
    grown: Grown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = LocalStore(grown.root), LocalStore(tmp_path / "dst")
    real, calls = src.read_range, [0]

    def failing(path: str, start: int, length: int) -> Any:
        calls[0] += 1
        if calls[0] > 5:
            raise OSError("the network went away")
        return real(path, start, length)

    monkeypatch.setattr(src, "read_range", failing)
    with pytest.raises(OSError):
        copy_snapshot(src, grown.full, dst, jobs=1)
    assert not list((tmp_path / "dst").rglob("COMMIT"))  # nothing visible, no partition either
    monkeypatch.setattr(src, "read_range", real)
    result = copy_snapshot(src, grown.full, dst, jobs=1)
    total = partition_shard_bytes(grown, grown.refs[grown.full])
    assert result.committed and result.bytes_skipped > 0
    assert result.bytes_copied + result.bytes_skipped == total
    assert samples(grown.full, dst) == samples(grown.full, grown.root)


def test_cp_to_gcs_skips_the_partitions_already_there(
    grown: Grown, gcs_root: tuple[str, dict[str, Any]]
) -> None:
    url, options = gcs_root
    dst = open_store(url, **options)
    calls: collections.Counter[str] = collections.Counter()
    for name in ("list_tree", "list_dir", "exists", "size"):
        real = getattr(dst, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kw)

        setattr(dst, name, counted)
    first = copy_snapshot(grown.root, grown.prefix, dst)
    assert first.partitions_copied == len(grown.refs[grown.prefix])
    calls.clear()
    second = copy_snapshot(grown.root, grown.full, dst)
    present = [r for r in grown.refs[grown.full] if r in grown.refs[grown.prefix]]
    missing = [r for r in grown.refs[grown.full] if r not in present]
    assert (second.partitions_copied, second.partitions_present) == (len(missing), len(present))
    assert second.bytes_copied == partition_shard_bytes(grown, missing)
    # Which partitions are there: listings, not a request per partition or per shard.
    assert calls["list_tree"] + calls["list_dir"] <= 2 and calls["exists"] <= 2
    assert calls["size"] == sum(  # each shard written is checked once, nothing else asked
        len(SnapshotReader(LocalStore(grown.root), f"parts/{r}").manifest["shards"])
        for r in missing
    )
    assert samples(grown.full, url, **options) == samples(grown.full, grown.root)
    given = [f"-o{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in options.items()]
    code, out = cli("--root", url, *given, "cp", grown.full[:10], str(grown.root))
    assert code == 0 and "already present" in out


def test_verify_all_reads_each_partition_once(grown: Grown) -> None:
    fps = [grown.full, grown.prefix, grown.added]
    alone: dict[str, collections.Counter[str]] = {}
    for fp in fps:  # the reads of each snapshot verified on its own
        store = CountingStore(grown.root)
        assert verify_snapshot(store, fp).ok
        alone[fp] = store.reads
    together = CountingStore(grown.root)
    checked = SharedChecks()
    reports = [verify_snapshot(together, fp, checked=checked) for fp in fps]
    assert all(r.ok for r in reports)
    shards = {p for fp in fps for p in alone[fp] if p.startswith("parts/")}
    for path in shards:
        first = next(fp for fp in fps if path in alone[fp])
        assert together.reads[path] == alone[first][path], path  # read once, not per snapshot
    assert len(checked.partitions) == len(grown.by_files)
    for report, fp in zip(reports, fps):
        assert report.blocks == len(SnapshotReader(LocalStore(grown.root), fp).index)
    # Through the command: the bytes actually read add up to the distinct partitions' blocks.
    data = cli_json("--root", str(grown.root), "verify", "--all")
    store = LocalStore(grown.root)
    distinct = sum(
        int(SnapshotReader(store, f"parts/{r}").index["length"].sum())
        for r in grown.by_files.values()
    )
    assert data["partitions"] == len(grown.by_files)
    assert sum(s["bytes"] - s["bytes_reused"] for s in data["snapshots"]) == distinct
    assert sum(s["bytes_reused"] for s in data["snapshots"]) > 0


def test_verify_catches_a_corrupted_byte_in_a_shared_partition(
    grown: Grown, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(grown.root, root)
    # A partition of the full list and of the list with a file added, not of the prefix.
    ref = next(r for r in grown.refs[grown.full] if grown.users(r) == {grown.full, grown.added})
    part = SnapshotReader(LocalStore(root), f"parts/{ref}")
    shard, offset = part.shard_paths[0], int(part.index["offset"][0])
    data = bytearray((root / shard).read_bytes())
    data[offset + 8] ^= 0xFF
    (root / shard).write_bytes(bytes(data))
    code, out = cli("--root", str(root), "verify", "--all", "--json")
    assert code == 1
    by_fp = {s["fingerprint"]: s for s in json.loads(out)["snapshots"]}
    assert by_fp[grown.prefix]["ok"]
    for fp in (grown.full, grown.added):
        (problem,) = by_fp[fp]["problems"]
        assert (problem["kind"], problem["shard"], problem["offset"]) == ("block", shard, offset)
        assert f"parts/{ref}" in problem["message"] and "snapstore rm" in problem["message"]
    report = verify_snapshot(LocalStore(root), grown.added)  # on its own: found as well
    assert [p["shard"] for p in report.errors] == [shard]


def test_verify_checks_a_shared_partitions_own_files(grown: Grown, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(grown.root, root)
    ref = grown.refs[grown.prefix][0]
    (root / "parts" / ref / "COMMIT").unlink()  # its blocks still read; gc would remove it
    checked = SharedChecks()
    reports = {fp: verify_snapshot(LocalStore(root), fp, checked=checked) for fp in grown.names}
    for fp, report in reports.items():
        kinds = [(p["kind"], p["shard"]) for p in report.problems]
        assert kinds == ([("partition", f"parts/{ref}")] if ref in grown.refs[fp] else [])
