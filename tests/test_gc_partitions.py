"""gc of partitions: unused ones of a committed snapshot, gone Ray Data jobs' of an uncommitted
one, empty ``parts`` directories; a used or a partitioned stage's partition never."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import snapstore
from snapstore.format import layout as fmt
from snapstore.manage.gc import Garbage, collect_garbage, find_garbage
from snapstore.storage.claims import acquire
from snapstore.storage.store import LocalStore, Store
from snapstore.write.partitions import PARTS_DIR, commit_partitions, partition_dir, write_partition

HOUR = 3600.0
FP = "f" * 32
JOB = 7 * 10**6  # a Ray Data write job's partitions: job * 10**6 + task index
# Partitions are written now (their run names say so): judge them an hour later, or right away.


def soon() -> float:
    """A minute from now (times are taken when a test runs, not when the module is imported)."""
    return time.time() + 60


def later() -> float:
    """Two hours from now: older than the default min_age."""
    return time.time() + 2 * HOUR


class FixedClock:
    """A claim created and beating at ``later()``."""

    def time(self) -> float:
        return later()

    def monotonic(self) -> float:
        return 0.0

    def sleep(self, seconds: float) -> None:
        pass


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "snaps")


def write(store: Store, partition: int, n: int = 3) -> None:
    base = partition * 100
    assert write_partition(store, FP, partition, lambda: ({"x": base + i} for i in range(n)))


def crash_run(store: Store, partition: int) -> str:
    """An attempt that crashed long ago inside ``partition``."""
    run = f"{partition_dir(FP, partition)}/runs/20200101T000000-host-9-abcdef01"
    store.write_bytes(f"{run}/shard-00000.snap", b"junk")
    return run


def kinds(found: list[Garbage]) -> dict[str, str]:
    return {g.path: g.kind for g in found}


def test_unused_partitions_of_a_committed_snapshot_are_garbage_once_old(store: LocalStore) -> None:
    for p in (0, 1, 2, JOB, JOB + 1):
        write(store, p)
    assert commit_partitions(store, FP, [0, 1])  # 2 and the job's lost (or were never used)
    assert find_garbage(store, min_age=HOUR, now=soon()) == []  # young: left alone
    found = find_garbage(store, min_age=HOUR, now=later())
    unused = {partition_dir(FP, p) for p in (2, JOB, JOB + 1)}
    assert kinds(found) == dict.fromkeys(unused, "partition")
    assert all("committed snapshot does not use" in g.reason and g.bytes > 0 for g in found)

    assert {g.path for g in collect_garbage(store, min_age=HOUR, now=later())} == unused
    assert sorted(store.list_dir(f"{FP}/{PARTS_DIR}")) == ["000000", "000001"]
    with snapstore.open(FP, root=store) as snap:
        assert [s["x"] for s in snap] == [0, 1, 2, 100, 101, 102]
    # The used partitions are never garbage, however old.
    assert find_garbage(store, min_age=HOUR, now=later() + 1000 * HOUR) == []


def test_a_used_partition_keeps_its_committed_run_and_loses_crashed_ones(store: LocalStore) -> None:
    write(store, 0)
    crashed = crash_run(store, 0)
    assert commit_partitions(store, FP, 1)
    assert kinds(find_garbage(store, min_age=HOUR, now=later())) == {crashed: "run"}


def test_a_partitioned_stage_partition_of_an_uncommitted_snapshot_is_never_garbage(
    store: LocalStore,
) -> None:
    for p in (0, 1):
        write(store, p)
    assert find_garbage(store, min_age=HOUR, now=later() + 1000 * HOUR) == []  # a rerun resumes


def test_a_gone_ray_job_partitions_of_an_uncommitted_snapshot_are_garbage(
    store: LocalStore,
) -> None:
    write(store, 0)  # a partitioned stage's: kept
    for p in (JOB, JOB + 1):
        write(store, p)
    crashed = crash_run(store, JOB + 1)
    assert kinds(find_garbage(store, min_age=HOUR, now=soon())) == {crashed: "run"}  # only that
    found = find_garbage(store, min_age=HOUR, now=later())
    jobs = {partition_dir(FP, p) for p in (JOB, JOB + 1)}
    assert kinds(found) == dict.fromkeys(jobs, "partition")  # not also the crashed run inside
    assert all("Ray Data write job that is gone" in g.reason for g in found)
    collect_garbage(store, min_age=HOUR, now=later())
    assert store.list_dir(f"{FP}/{PARTS_DIR}") == ["000000"]


def test_a_live_claim_protects_a_running_ray_job(store: LocalStore) -> None:
    for p in (JOB, JOB + 1):
        write(store, p)
    crashed = crash_run(store, JOB)  # a failed attempt of a task the running job retried
    claim, _ = acquire(store, FP, lease=60, clock=FixedClock())
    assert claim is not None
    assert find_garbage(store, min_age=HOUR, now=later()) == []
    claim.release()
    found = kinds(find_garbage(store, min_age=HOUR, now=later()))
    assert found[partition_dir(FP, JOB)] == "partition" and crashed not in found
    assert found[f"{FP}/claims"] == "claims"


def test_a_ray_job_partition_younger_than_min_age_is_kept(store: LocalStore) -> None:
    write(store, JOB)
    assert find_garbage(store, min_age=HOUR, now=soon()) == []
    assert find_garbage(store, min_age=0, now=soon()) != []


def test_nothing_left_removes_the_fingerprint_directory(store: LocalStore, tmp_path: Path) -> None:
    write(store, JOB)
    found = kinds(find_garbage(store, min_age=HOUR, now=later()))
    assert found == {partition_dir(FP, JOB): "partition", FP: "directory"}
    collect_garbage(store, min_age=HOUR, now=later())
    assert not (tmp_path / "snaps" / FP).exists()


def test_an_empty_parts_directory_counts_as_nothing_left(store: LocalStore, tmp_path: Path) -> None:
    (tmp_path / "snaps" / FP / PARTS_DIR).mkdir(parents=True)  # its partitions were removed
    assert kinds(find_garbage(store, min_age=HOUR, now=soon())) == {FP: "directory"}
    collect_garbage(store, min_age=HOUR, now=soon())
    assert not (tmp_path / "snaps" / FP).exists()

    # Under a committed snapshot the empty parts directory goes, the snapshot stays.
    snap = snapstore.snapshot(lambda n: ({"x": i} for i in range(n)), root=store)(4)
    snap.materialize()
    snap.close()
    other = snap.fingerprint
    (tmp_path / "snaps" / other / PARTS_DIR).mkdir()
    assert kinds(find_garbage(store, now=soon())) == {f"{other}/{PARTS_DIR}": "directory"}
    collect_garbage(store, now=soon())
    assert not (tmp_path / "snaps" / other / PARTS_DIR).exists()
    with snapstore.open(other, root=store) as again:
        assert [s["x"] for s in again] == [0, 1, 2, 3]


def test_a_damaged_commit_record_keeps_every_partition(store: LocalStore) -> None:
    for p in (0, JOB):
        write(store, p)
    assert commit_partitions(store, FP, [0])
    commit = f"{FP}/{fmt.COMMIT_NAME}"
    store.remove_tree(commit)
    store.write_bytes(commit, b"not json")
    assert find_garbage(store, min_age=0, now=later()) == []


def test_an_empty_partition_the_manifest_names_is_used(store: LocalStore) -> None:
    assert write_partition(store, FP, 0, lambda: iter(()))  # no shard points into it
    write(store, 1)
    assert commit_partitions(store, FP, 2)
    assert find_garbage(store, min_age=0, now=later()) == []
    ids = [JOB + 1, JOB]
    for p in ids:
        assert write_partition(store, "e" * 32, p, lambda: iter(()))
    assert commit_partitions(store, "e" * 32, ids)  # named by partition_ids
    assert find_garbage(store, min_age=0, now=later()) == []
