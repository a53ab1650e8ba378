"""gc and rm of shared partitions (``parts/<stage key>/<partition fp>``): a partition stays while
a committed snapshot references it, a claim holds it, a job of its stage is running or a reader
holds a snapshot made of it; ``rm`` frees the partitions only its snapshot used; and neither
takes a partition from under a job assembling a snapshot from it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.common import human_bytes
from snapstore.cli.main import main
from snapstore.errors import BusyError, SnapshotNotFoundError, SnapshotRemovedError
from snapstore.manage import gc
from snapstore.manage.catalog import remove_snapshot
from snapstore.manage.gc import collect_garbage, find_garbage
from snapstore.manage.release import PartitionRelease
from snapstore.read.reader import load_manifest
from snapstore.storage import claims
from snapstore.storage.store import LocalStore, Store
from snapstore.write.jobs import partition_layout
from snapstore.write.partitions import SHARED_DIR, holding_stage

HOUR = 3600.0


def items(values: list[int], fail_at: int = -1):
    """One partition per value (partition_size=1); ``fail_at`` raises at that value."""
    for value in values:
        if value == fail_at:
            raise ValueError(f"bad input {value}")
        for i in range(4):
            yield {"v": value, "x": np.full(16, value * 10 + i, np.int32)}


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "snaps")


def stage(store: Store):
    return snapstore.snapshot(
        items, root=store, partition_by="values", ignore=("fail_at",), engine="thread", workers=1
    )


def made(store: Store, values: list[int]) -> snapstore.Snapshot:
    snap = stage(store)(values)
    snap.materialize()
    return snap


def paths(snap: snapstore.Snapshot) -> list[str]:
    """Its partitions (read from the manifest without opening the snapshot: no reader pin)."""
    manifest = load_manifest(snap.store, snap.fingerprint)
    return [f"{SHARED_DIR}/{ref}" for ref in manifest["shared_partitions"]]


def rows(snap: snapstore.Snapshot) -> list[int]:
    return [int(s["x"][0]) for s in snap]


def read_all(store: Store, fingerprint: str) -> list[int]:
    snap = snapstore.open(fingerprint, root=store)
    try:
        return rows(snap)
    finally:
        snap.close()


def expected(values: list[int]) -> list[int]:
    return [v * 10 + i for v in values for i in range(4)]


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def later() -> float:
    return time.time() + 2 * HOUR


def test_referenced_partitions_survive_gc(store: LocalStore) -> None:
    snap = made(store, [0, 1, 2])
    before = files(store.root)
    for now in (None, later()):
        assert find_garbage(store, min_age=0, now=now) == []
        collect_garbage(store, min_age=0, now=now)
    assert files(store.root) == before
    assert read_all(store, snap.fingerprint) == expected([0, 1, 2])


def test_unreferenced_partitions_go_after_the_minimum_age(store: LocalStore) -> None:
    call = stage(store)
    snap = call([0, 1, 2], fail_at=2)
    with pytest.raises(ValueError, match="bad input 2"):
        snap.materialize()  # partitions of 0 and 1 committed, no snapshot references them
    layout = partition_layout(call.job(snap))
    done = [layout.dir(0), layout.dir(1)]
    assert find_garbage(store) == []  # computed just now: a rerun finds them
    garbage = find_garbage(store, min_age=HOUR, now=later())
    assert [(g.kind, g.path) for g in garbage if g.kind == "partition"] == [
        ("partition", p) for p in sorted(done)
    ]
    for g in garbage:
        if g.kind == "partition":
            assert "no committed snapshot references" in g.reason
            assert g.bytes == sum(
                f.stat().st_size for f in (store.root / g.path).rglob("*") if f.is_file()
            )
    assert {(g.kind, g.path) for g in garbage if g.kind != "partition"} == {
        ("directory", layout.base)
    }
    removed = collect_garbage(store, min_age=HOUR, now=later())
    assert removed == garbage
    assert files(store.root) == []  # the stage's directory and parts/ too
    assert rows(made(store, [0, 1])) == expected([0, 1])  # computed again


def test_an_uncommitted_partition_of_a_crashed_job_goes(store: LocalStore) -> None:
    snap = made(store, [0])
    layout = partition_layout(stage(store).job(stage(store)([5])))
    crashed = f"{layout.dir(0)}/runs/20200101T000000-host-9-abcdef01"
    store.write_bytes(f"{crashed}/shard-00000.snap", b"junk")
    (g,) = find_garbage(store, min_age=HOUR)
    assert (g.kind, g.path, g.bytes) == ("partition", layout.dir(0), 4)
    assert "left uncommitted" in g.reason
    collect_garbage(store, min_age=HOUR)
    assert not store.exists(layout.dir(0))
    assert rows(snap) == expected([0])


def test_rm_frees_only_the_partitions_no_other_snapshot_uses(store: LocalStore) -> None:
    a, b = made(store, [0, 1, 2]), made(store, [1, 2, 3])
    in_a, in_b = paths(a), paths(b)
    a.close()  # its pin gone
    shared = sorted(set(in_a) & set(in_b))
    assert len(shared) == 2 and in_a[0] not in in_b
    own = store.disk_usage(a.fingerprint) + store.disk_usage(in_a[0])
    reports: list[PartitionRelease] = []
    assert remove_snapshot(store, a.fingerprint, report=reports.append) == own
    (report,) = reports
    assert list(report.removed) == [in_a[0].removeprefix(f"{SHARED_DIR}/")]
    assert report.kept == {
        p.removeprefix(f"{SHARED_DIR}/"): "a committed snapshot references it" for p in shared
    }
    assert not store.exists(in_a[0]) and all(store.exists(p) for p in in_b)
    assert read_all(store, b.fingerprint) == expected([1, 2, 3])
    assert find_garbage(store, min_age=0) == []
    b.close()
    remove_snapshot(store, b.fingerprint)
    assert not any(store.exists(p) for p in in_b)
    assert {g.kind for g in find_garbage(store, min_age=0)} <= {"directory"}  # the stage's


def test_a_claimed_partition_survives(store: LocalStore) -> None:
    snap = made(store, [0, 1])
    (first, second) = paths(snap)
    claim, _ = claims.acquire(store, first, lease=60.0)
    assert claim is not None
    reports: list[PartitionRelease] = []
    remove_snapshot(store, snap.fingerprint, report=reports.append)
    ref = first.removeprefix(f"{SHARED_DIR}/")
    assert "holds a claim on it" in reports[0].kept[ref] and store.exists(first)
    assert not store.exists(second)
    assert find_garbage(store, min_age=0) == []  # the claim covers it
    collect_garbage(store, min_age=0)
    assert store.exists(f"{first}/COMMIT")
    claim.release()
    assert [g.path for g in find_garbage(store, min_age=0) if g.kind == "partition"] == [first]


def test_a_pinned_snapshots_partitions_survive(store: LocalStore) -> None:
    snap = made(store, [0, 1, 2])
    snap.close()
    parts = paths(snap)
    reader = snapstore.open(snap.fingerprint, root=store)
    it = iter(reader)
    first = [int(next(it)["x"][0]) for _ in range(2)]
    assert reader._guard is not None and reader._guard.wait(30) and reader._guard.pin
    with pytest.raises(BusyError, match="in use by reader"):
        remove_snapshot(store, snap.fingerprint)
    collect_garbage(store, min_age=0, now=time.time())
    assert all(store.exists(f"{p}/COMMIT") for p in parts)
    reports: list[PartitionRelease] = []
    remove_snapshot(store, snap.fingerprint, respect_pins=False, report=reports.append)
    assert set(reports[0].kept.values()) == {"a reader holds the snapshot"}
    assert all(store.exists(f"{p}/COMMIT") for p in parts)
    # The reader goes on to the end: its blocks lie in the partitions.
    assert first + [int(s["x"][0]) for s in it] == expected([0, 1, 2])
    reader.close()


def test_a_running_job_of_the_stage_holds_its_partitions(store: LocalStore) -> None:
    snap = made(store, [0, 1])
    parts = paths(snap)
    layout = partition_layout(stage(store).job(snap))
    with holding_stage(store, layout):  # a job between finding them and committing
        reports: list[PartitionRelease] = []
        remove_snapshot(store, snap.fingerprint, report=reports.append)
        assert set(reports[0].kept.values()) == {"a job of its stage is running"}
        assert find_garbage(store, min_age=0, now=time.time()) == []
    assert all(store.exists(f"{p}/COMMIT") for p in parts)
    assert {g.path for g in find_garbage(store, min_age=0)} >= set(parts)


def test_dry_run_removes_nothing(store: LocalStore) -> None:
    snap = made(store, [0, 1])
    parts = paths(snap)
    store.remove_tree(snap.fingerprint)  # its partitions, unreferenced
    before = files(store.root)
    found = collect_garbage(store, min_age=0, dry_run=True)
    assert {g.path for g in found if g.kind == "partition"} == set(parts)
    assert files(store.root) == before
    assert collect_garbage(store, min_age=0) == found
    assert files(store.root) == []


def test_the_command_line_says_what_rm_and_gc_do_to_shared_partitions(store: LocalStore) -> None:
    a, b = made(store, [0, 1, 2]), made(store, [1, 2, 3])
    in_a, in_b = paths(a), paths(b)
    a.close()
    b.close()
    root = str(store.root)
    before = files(store.root)
    code, out = cli("--root", root, "rm", "--dry-run", a.fingerprint)
    own = store.disk_usage(a.fingerprint) + store.disk_usage(in_a[0])
    assert code == 0 and files(store.root) == before
    assert f"would remove {a.fingerprint}  {human_bytes(own)}" in out
    assert "shared partitions: would remove 1 (" in out
    assert "; kept 2: a committed snapshot references it (2)" in out
    code, out = cli("--root", root, "rm", a.fingerprint)
    assert code == 0 and f"removed {a.fingerprint}  {human_bytes(own)}" in out
    assert "shared partitions: removed 1 (" in out and "; kept 2: " in out
    store.remove_tree(b.fingerprint)  # its partitions left unreferenced
    code, out = cli("--root", root, "gc", "--dry-run", "--min-age", "0")
    listed = [line for line in out.splitlines() if line.startswith("would remove partition")]
    assert len(listed) == 3 and all("no committed snapshot references" in x for x in listed)
    code, out = cli("--root", root, "gc", "--min-age", "0", "--json")
    removed = json.loads(out)["garbage"]
    assert {g["path"] for g in removed if g["kind"] == "partition"} == set(in_b)
    assert files(store.root) == []


def test_a_partition_whose_record_a_dead_remover_took_keeps_its_runs(store: LocalStore) -> None:
    snap = made(store, [0, 1])
    first = paths(snap)[0]
    (run,) = store.list_dir(f"{first}/runs")
    store.remove_tree(f"{first}/COMMIT")  # a remover died before putting it back
    assert read_all(store, snap.fingerprint) == expected([0, 1])
    assert find_garbage(store, min_age=0, now=later()) == []  # referenced: kept, runs too
    again = made(store, [0])  # a job finds it uncommitted: computes it again, another run
    assert rows(again) == expected([0]) and len(store.list_dir(f"{first}/runs")) == 2
    again.close()
    assert find_garbage(store, min_age=0, now=later()) == []  # the old run is still used
    assert read_all(store, snap.fingerprint) == expected([0, 1])
    snap.close()
    remove_snapshot(store, snap.fingerprint)
    assert store.exists(f"{first}/COMMIT")  # the new one's snapshot references it
    old = f"{first}/runs/{run}"
    assert [g.path for g in find_garbage(store, min_age=0, now=later())] == [old]


@pytest.mark.parametrize("remover", ["gc", "rm"])
def test_removal_racing_an_assembly_never_takes_a_partition_in_use(
    store: LocalStore, remover: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads race on the partitions of 0 and 1. One makes a snapshot of 0 and 1, reads
    it whole, then removes it (rm) or removes its directory and collects garbage (gc); the
    other makes snapshots of 0, 1 and one new input each, reads each whole, then removes it
    with rm. So the two partitions are often referenced by nothing, and removed, while a job
    assembles a snapshot from them: every snapshot must read whole (a partition either stays,
    or is found gone and computed again)."""
    victim = [0, 1]
    # gc judges every committed partition old (its minimum age is not what is tested here),
    # and keeps its minimum age for the snapshots' own runs being published.
    monkeypatch.setattr(gc, "_partition_started", lambda store, path: 0.0)
    shared = {ref.removeprefix(f"{SHARED_DIR}/") for ref in paths(made(store, victim))}
    stop = threading.Event()
    errors: list[BaseException] = []
    removed: list[str] = []  # partitions of 0 and 1 removed, by either thread

    def count(release: PartitionRelease) -> None:
        removed.extend(ref for ref in release.removed if ref in shared)

    def remove_loop() -> None:
        try:
            while not stop.is_set():
                snap = made(store, victim)
                assert rows(snap) == expected(victim)
                snap.close()
                if remover == "rm":
                    remove_snapshot(store, snap.fingerprint, report=count)
                else:
                    store.remove_tree(f"{snap.fingerprint}/COMMIT")
                    store.remove_tree(snap.fingerprint)
                    found = collect_garbage(store, min_age=HOUR)
                    removed.extend(g.path for g in found if g.kind == "partition")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=remove_loop, daemon=True)
    thread.start()
    try:
        rounds = 0
        while not errors and (rounds < 12 or (not removed and rounds < 100)):
            values = [0, 1, 100 + rounds]
            snap = made(store, values)
            try:
                assert rows(snap) == expected(values), f"round {rounds}"
            except (SnapshotRemovedError, SnapshotNotFoundError):
                pytest.fail(f"round {rounds}: the assembled snapshot was removed under it")
            snap.close()
            remove_snapshot(store, snap.fingerprint, report=count)
            rounds += 1
    finally:
        stop.set()
        thread.join(120)
    assert not errors, errors
    assert removed  # the race was run: partitions of 0 and 1 did go meanwhile
