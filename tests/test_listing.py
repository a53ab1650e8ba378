"""Listings instead of one request per item: partition status, ls and gc in a bounded number of
sequential round trips, traced through the recording latency simulator (issue 14)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import snapstore
from snapstore.manage.catalog import describe, list_fingerprints, list_snapshots
from snapstore.manage.gc import find_garbage
from snapstore.storage import claims
from snapstore.storage.cache import BlockCache, CachedStore
from snapstore.storage.listing import ListedStore, map_concurrently
from snapstore.storage.simulate import LIST_PAGE, round_trips, simulated_store
from snapstore.storage.store import FsspecStore, Store, open_store
from snapstore.write.engines import PartitionTask
from snapstore.write.parallel import PartitionJob, compute_partitions
from snapstore.write.partitions import (
    partition_dir,
    partition_status,
    remove_partition_claims,
    status_prefixes,
)

FP = "f" * 32


def craft(
    store: Store, committed: Iterable[int], claimed: dict[int, list[str]], run_files: int = 3
) -> None:
    """The files of a partitioned stage as listings see them (contents do not matter for
    status): a committed partition has its commit record and a run of ``run_files`` files."""
    paths = []
    for p in committed:
        where = partition_dir(FP, p)
        run = f"{where}/runs/20261125T000000-r{p}"
        paths += [f"{where}/COMMIT"]
        paths += [f"{run}/{name}" for name in ("manifest.json", "index.bin", "s0")[:run_files]]
    for p, names in claimed.items():
        paths += [f"{partition_dir(FP, p)}/claims/{name}" for name in names]
    if isinstance(store, FsspecStore):  # one batch: gcsfs sends them concurrently
        store.fs.pipe({f"{store.root}/{path}": b"x" for path in paths})
    else:
        map_concurrently(lambda path: store.write_bytes(path, b"x"), paths, 32)


_MEMORY: list[FsspecStore] = []


def memory_store() -> FsspecStore:
    """A fresh root on fsspec's memory filesystem, removed after the test (the filesystem is
    one dict per process, which its recursive calls scan whole: leftovers slow later tests)."""
    store = open_store(f"memory://listing-{uuid.uuid4().hex}")
    assert isinstance(store, FsspecStore)
    _MEMORY.append(store)
    return store


@pytest.fixture(autouse=True)
def _remove_memory_roots() -> Iterator[None]:
    yield
    while _MEMORY:
        store = _MEMORY.pop()
        with contextlib.suppress(FileNotFoundError):  # never written to
            store.fs.rm(store.root, recursive=True)


def traced(store: Store, ttfb: float = 0.1) -> FsspecStore:
    """A recording simulation; 100 ms per request, so that requests sent together by threads
    that start one after another on a busy machine still overlap."""
    return simulated_store(store, ttfb=ttfb, record=True)


def trace_of(store: FsspecStore) -> list[Any]:
    assert store.fs.trace is not None
    return list(store.fs.trace)


def task(p: int, store: Store) -> PartitionTask:
    return PartitionTask(lambda: iter(()), "stage", (), {}, store, FP, p)


def job_over(store: Store, partitions: Iterable[int]) -> PartitionJob:
    tasks = [task(p, store) for p in partitions]
    return PartitionJob(
        store, FP, "stage", tasks, 60.0, claims.SystemClock(), lambda p, s: False, lambda: False
    )


def test_status_prefixes_cover_the_partitions_in_at_most_one_round_of_listings() -> None:
    assert status_prefixes(range(3)) == ["0000"]
    assert status_prefixes(range(2000)) == [f"{i:04d}" for i in range(20)]
    assert len(status_prefixes(range(10_000))) == 100
    assert status_prefixes(range(100_000)) == [f"{i:03d}" for i in range(100)]  # coarser
    assert status_prefixes([1_000_003, 7]) == ["0000", "10000"]  # a Ray job's 7-digit ids


def test_status_of_2000_partitions_in_at_most_3_round_trips() -> None:
    inner = memory_store()
    held = {1: ["beat-00000000-00000003", "claim-00000000"], 1999: ["claim-00000000"]}
    craft(inner, range(0, 2000, 2), {**held, 4: ["claim-00000000"]})  # 4: committed too
    store = traced(inner)
    status = partition_status(store, FP, range(2000))
    assert status.committed == frozenset(range(0, 2000, 2))
    assert status.claims == held  # a committed partition's claims do not matter
    trace = trace_of(store)
    assert {r.name for r in trace} == {"find"} and len(trace) == 20  # 20 listings at once
    assert round_trips(trace) <= 3
    assert partition_status(inner, FP, range(2000)) == status  # the same without the simulator


def test_a_listing_of_more_than_a_page_costs_a_round_trip_per_page() -> None:
    inner = memory_store()
    craft(inner, range(600), {})  # 2,400 objects under one prefix
    store = traced(inner, ttfb=0.01)
    assert len(store.list_tree(f"{FP}/parts")) == 2400
    assert round_trips(trace_of(store)) == -(-2400 // LIST_PAGE)


def test_a_job_knows_every_partition_committed_from_listings_alone() -> None:
    inner = memory_store()
    craft(inner, range(2000), {})
    store = traced(inner)
    job = job_over(store, range(2000))
    assert compute_partitions(job, snapstore.write.engines.ThreadEngine(2), lambda: iter(()))
    assert job.finished == 2000
    trace = trace_of(store)
    assert {r.name for r in trace} == {"find"} and round_trips(trace) <= 3  # no exists each


def test_claims_seen_in_the_listing_are_read_concurrently() -> None:
    inner = memory_store()
    for p in range(100):  # another job holds 100 partitions, and beats
        claim, _ = claims.acquire(inner, partition_dir(FP, p), lease=60.0, owner="other")
        assert claim is not None
        claim.beat()
    craft(inner, range(100, 500), {})
    store = traced(inner)
    job = job_over(store, range(500))
    pending = job.refresh(job.tasks)
    states = job.claim_states(pending)
    assert [t.partition for t in pending] == list(range(100))
    assert all(s.holder["owner"] == "other" and s.beat == 0 for s in states.values())
    assert sorted(states) == list(range(100))
    # One round of listings, then each claim and its heartbeat, all partitions at once.
    assert round_trips(trace_of(store)) <= 3 + 2


@pytest.fixture
def many_snapshots() -> Iterator[FsspecStore]:
    """30 committed snapshots, one read (pins), one uncommitted run and a partitioned one."""

    def stage(i: int) -> Iterator[dict[str, Any]]:
        yield from ({"x": np.full(3, i)} for _ in range(5))

    def parted(items: list[int]) -> Iterator[dict[str, Any]]:
        yield from ({"x": np.full(3, i)} for i in items)

    store = memory_store()
    for i in range(30):
        snapstore.snapshot(stage, root=store)(i).materialize()
    parts = snapstore.snapshot(parted, root=store, partition_by="items", partition_size=2)
    parts([1, 2, 3]).materialize()
    store.write_bytes(f"{'a' * 32}/runs/20200101T000000-x/shard-00000.snap", b"left by a crash")
    yield store


def test_ls_over_many_snapshots_in_a_bounded_number_of_round_trips(
    many_snapshots: FsspecStore,
) -> None:
    inner = many_snapshots
    want = [describe(inner, fp) for fp in list_fingerprints(inner, committed_only=False)]
    store = traced(inner)
    got = list_snapshots(store)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert len(got) == 32
    # The root, every fingerprint's tree at once, then each snapshot's reads concurrently
    # (commit record, manifest): not one request per directory per snapshot.
    assert round_trips(trace_of(store)) <= 6


def test_gc_over_many_snapshots_in_a_bounded_number_of_round_trips(
    many_snapshots: FsspecStore,
) -> None:
    inner = many_snapshots
    want = find_garbage(inner, min_age=0)
    assert any(g.kind == "run" for g in want)  # the crashed run
    store = traced(inner)
    assert find_garbage(store, min_age=0) == want
    assert round_trips(trace_of(store)) <= 6


def test_a_listed_store_refuses_a_size_it_did_not_list() -> None:
    listed = ListedStore(memory_store(), "fp", {"a": 3})
    assert listed.size("fp/a") == 3
    with pytest.raises(FileNotFoundError):
        listed.size("fp/b")


def test_partition_status_on_the_gcs_emulator(gcs_root: tuple[str, dict[str, Any]]) -> None:
    url, options = gcs_root
    store = open_store(url, **options)
    held = {6: ["beat-00000000-00000001", "claim-00000000"], 1200: ["claim-00000000"]}
    committed = [p for p in range(1500) if p % 3]
    craft(store, committed, held, run_files=1)  # fake-gcs-server slows as a bucket grows
    status = partition_status(store, FP, range(1500))
    assert status.committed == frozenset(committed) and status.claims == held
    # gcsfs pages a listing of more than 1,000 objects: all of them come back.
    assert len(store.list_tree(f"{FP}/parts")) == 2 * len(committed) + 3
    assert len(store.list_tree(f"{FP}/parts", "0001")) == 2 * sum(p // 100 == 1 for p in committed)
    simulated = traced(store, ttfb=0.05)
    assert partition_status(simulated, FP, range(1500)) == status
    assert round_trips(trace_of(simulated)) <= 3


def test_claims_of_committed_partitions_are_removed_at_once() -> None:
    inner = memory_store()
    craft(inner, range(300), {p: ["claim-00000000", "released-00000000"] for p in range(0, 300, 2)})
    store = traced(inner)
    remove_partition_claims(store, FP, range(200))
    left = partition_status(inner, FP, range(300))
    assert left.committed == frozenset(range(300))
    tree = inner.list_tree(f"{FP}/parts")
    assert sorted({int(k[:6]) for k in tree if "/claims/" in k}) == list(range(200, 300, 2))
    assert round_trips(trace_of(store)) <= 3  # the listings, then every removal at once


def test_describe_answers_from_one_listing(many_snapshots: FsspecStore) -> None:
    inner = many_snapshots
    fp = next(fp for fp in list_fingerprints(inner) if describe(inner, fp).get("shards"))
    store = traced(inner)
    assert describe(store, fp) == describe(inner, fp)
    assert round_trips(trace_of(store)) <= 3  # the listing, the commit record, the manifest


def test_a_cached_store_lists_through_its_store(tmp_path: Path) -> None:
    inner = memory_store()
    craft(inner, range(3), {})
    cached = CachedStore(traced(inner, ttfb=0.0), BlockCache(tmp_path, 1 << 20))
    assert cached.list_tree(f"{FP}/parts") == inner.list_tree(f"{FP}/parts")
    assert cached.list_tree(FP, "parts/000001/") == inner.list_tree(FP, "parts/000001/")
