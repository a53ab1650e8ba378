"""The block cache: hits across epochs, LRU eviction under a limit, corrupt entries, bypass of
blocks too large for it, and many threads and processes sharing one directory."""

from __future__ import annotations

import errno
import hashlib
import logging
import multiprocessing
import os
import pickle
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

import snapstore
from snapstore.read.reader import SnapshotReader
from snapstore.storage.cache import (
    BlockCache,
    CachedStore,
    block_key,
    cached_store,
    default_cache_dir,
)
from snapstore.storage.simulate import simulated_store
from snapstore.storage.store import FsspecStore, LocalStore, Store
from snapstore.write.writer import WriteOptions

N = 2000
HEADER = 64  # bytes of an entry's header


def stage(n: int) -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng(0)
    for i in range(n):
        yield {"id": i, "pad": rng.integers(0, 255, 40, dtype=np.uint8)}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, int, int]:
    """A local snapshot of many small blocks: (root, fingerprint, blocks, stored bytes)."""
    root = str(tmp_path_factory.mktemp("snaps"))
    snap = snapstore.snapshot(
        stage, root=root, options=WriteOptions(block_min_rows=1, block_bytes=2048)
    )(N)
    snap.materialize()
    snap.close()
    reader = SnapshotReader(LocalStore(root), snap.fingerprint)
    stored = int(reader.index["length"].astype(np.int64).sum())
    assert reader.num_blocks > 40
    return root, snap.fingerprint, reader.num_blocks, stored


def epoch_ids(snap: snapstore.Snapshot, epoch: int, seed: int = 0) -> list[list[int]]:
    """The sample ids of every batch of one shuffled epoch, checking each sample's payload."""
    batches = []
    for batch in snap.batches(64, shuffle=True, seed=seed, epoch=epoch):
        expected = np.stack([PADS[i] for i in batch["id"]])
        assert np.array_equal(batch["pad"], expected)
        batches.append(batch["id"].tolist())
    return batches


PADS = [s["pad"] for s in stage(N)]


def reference(root: str, fingerprint: str, epoch: int, seed: int = 0) -> list[list[int]]:
    with snapstore.open(fingerprint, root=root) as snap:
        return epoch_ids(snap, epoch, seed)


def files_under(directory: Path) -> list[Path]:
    return [Path(d) / f for d, _, names in os.walk(directory) for f in names]


def key(i: int) -> str:
    return block_key("memory://test", "shard", i * 100, 100)


# -- through a snapshot --------------------------------------------------------------------


def test_second_epoch_is_served_from_the_cache(
    written: tuple[str, str, int, int], tmp_path: Path
) -> None:
    root, fingerprint, blocks, stored = written
    store = cached_store(simulated_store(root, ttfb=0.0), tmp_path / "cache", 1 << 30)
    assert (store.local, store.coalesce, store.url) == (False, False, store.inner.url)
    with snapstore.open(fingerprint, root=store) as snap:
        assert epoch_ids(snap, 0) == reference(root, fingerprint, 0)
        assert (store.misses, store.bytes_from_remote) == (blocks, stored)
        store.reset_counters()
        assert epoch_ids(snap, 1) == reference(root, fingerprint, 1)
    assert store.misses == 0 and store.bytes_from_remote == 0
    assert store.hits >= blocks and store.bytes_from_cache >= stored
    scan = store.cache.scan()
    assert (scan.entries, scan.bytes) == (blocks, stored + blocks * HEADER)


def test_corrupt_and_truncated_entries_are_misses_and_refetched(
    written: tuple[str, str, int, int], tmp_path: Path
) -> None:
    root, fingerprint, blocks, _ = written
    store = cached_store(simulated_store(root, ttfb=0.0), tmp_path / "cache", 1 << 30)
    with snapstore.open(fingerprint, root=store) as snap:
        epoch_ids(snap, 0)
        entries = sorted(p for p in files_under(tmp_path / "cache") if not p.name.startswith("."))
        assert len(entries) == blocks
        flipped = bytearray(entries[0].read_bytes())
        flipped[HEADER + 3] ^= 0xFF
        entries[0].write_bytes(bytes(flipped))  # same length, wrong CRC
        with open(entries[1], "r+b") as f:
            f.truncate(HEADER + 5)
        entries[2].write_bytes(b"\0" * 200)  # not an entry at all
        store.reset_counters()
        assert epoch_ids(snap, 1) == reference(root, fingerprint, 1)
    assert store.misses == 3
    assert store.cache.verify() == [] and store.cache.scan().entries == blocks


def test_a_limit_below_one_block_bypasses_the_cache_and_warns_once(
    written: tuple[str, str, int, int], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, fingerprint, blocks, _ = written
    store = cached_store(simulated_store(root, ttfb=0.0), tmp_path / "cache", 100)
    with (
        caplog.at_level(logging.WARNING, "snapstore.storage.cache"),
        snapstore.open(fingerprint, root=store) as snap,
    ):
        for epoch in range(2):
            assert epoch_ids(snap, epoch) == reference(root, fingerprint, epoch)
    assert store.hits == 0 and store.misses >= 2 * blocks
    warnings = [r for r in caplog.records if r.name == "snapstore.cache"]
    assert len(warnings) == 1 and "does not fit" in warnings[0].getMessage()
    assert files_under(tmp_path / "cache") == []


def test_a_failing_cache_disk_only_costs_the_cache(
    written: tuple[str, str, int, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    root, fingerprint, _, _ = written

    def full(src: Any, dst: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    store = cached_store(simulated_store(root, ttfb=0.0), tmp_path / "cache", 1 << 30)
    with (
        caplog.at_level(logging.WARNING, "snapstore.storage.cache"),
        snapstore.open(fingerprint, root=store) as snap,
    ):
        assert epoch_ids(snap, 0) == reference(root, fingerprint, 0)
    assert store.hits == 0
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
    assert files_under(tmp_path / "cache") == []  # the temp files are gone too


def test_snapshots_write_and_read_through_a_cached_store(tmp_path: Path) -> None:
    remote = FsspecStore(fsspec.filesystem("memory"), f"/cache-{uuid.uuid4().hex}")
    store = CachedStore(remote, BlockCache(tmp_path / "cache", 1 << 20))
    snap = snapstore.snapshot(stage, root=store)(300).materialize()
    with snapstore.open(snap.fingerprint[:10], root=store) as again:
        assert [s["id"] for s in again] == list(range(300))
    assert store.misses > 0 and store.list_dir("") == [snap.fingerprint]
    store.remove_tree(snap.fingerprint)
    assert not remote.exists(snap.fingerprint)


def test_every_store_method_is_delegated() -> None:
    """A method added to Store must be forwarded to the remote store (or cached) on purpose."""
    methods = {n for n, v in vars(Store).items() if callable(v) and not n.startswith("_")}
    assert methods and {n for n in methods if n not in vars(CachedStore)} == set()


def test_a_cached_store_pickles(written: tuple[str, str, int, int], tmp_path: Path) -> None:
    root, fingerprint, _, _ = written
    store = cached_store(simulated_store(root, ttfb=0.0), tmp_path / "cache", 1 << 30)
    with snapstore.open(fingerprint, root=store) as snap:
        epoch_ids(snap, 0)
    copy = pickle.loads(pickle.dumps(store))
    assert (copy.url, copy.cache.directory, copy.hits) == (store.url, store.cache.directory, 0)
    with snapstore.open(fingerprint, root=copy) as snap:
        assert epoch_ids(snap, 2) == reference(root, fingerprint, 2)
    assert copy.misses == 0 and copy.hits > 0


def test_local_and_cached_stores_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="local store"):
        cached_store(tmp_path / "snaps", tmp_path / "cache", 1 << 20)
    with pytest.raises(ValueError, match="local store"):
        cached_store(LocalStore(tmp_path / "snaps"), tmp_path / "cache", 1 << 20)
    cached = cached_store(simulated_store(tmp_path, ttfb=0.0), tmp_path / "cache", 1 << 20)
    with pytest.raises(ValueError, match="already a CachedStore"):
        CachedStore(cached, cached.cache)
    with pytest.raises(ValueError, match="max_bytes"):
        BlockCache(tmp_path / "cache", -1)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SNAPSTORE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert default_cache_dir() == str(tmp_path / "xdg" / "snapstore-blocks")
    assert Path(default_cache_dir()).name == "snapstore-blocks"
    monkeypatch.setenv("SNAPSTORE_CACHE_DIR", str(tmp_path / "blocks"))
    assert default_cache_dir() == str(tmp_path / "blocks")
    store = cached_store(simulated_store(tmp_path, ttfb=0.0), None, 1 << 20)
    assert store.cache.directory == tmp_path / "blocks" and (tmp_path / "blocks" / "v2").is_dir()


# -- the cache alone -----------------------------------------------------------------------


def test_keys_name_a_byte_range_of_a_file_of_a_store(tmp_path: Path) -> None:
    base = block_key("gs://b/snaps", "fp/runs/r/shard-00000.snap", 0, 4096)
    assert len(base) == 64 and base == block_key(
        "gs://b/snaps", "fp/runs/r/shard-00000.snap", 0, 4096
    )
    others = {
        block_key("gs://c/snaps", "fp/runs/r/shard-00000.snap", 0, 4096),
        block_key("gs://b/snaps", "fp/runs/r/shard-00001.snap", 0, 4096),
        block_key("gs://b/snaps", "fp/runs/r/shard-00000.snap", 64, 4096),
        block_key("gs://b/snaps", "fp/runs/r/shard-00000.snap", 0, 4032),
    }
    assert base not in others and len(others) == 4
    with pytest.raises(ValueError, match="64 lowercase hex"):
        BlockCache(tmp_path, 1).get("../../etc/passwd")


def test_entries_round_trip_aligned_and_read_only(tmp_path: Path) -> None:
    cache = BlockCache(tmp_path, 1 << 20)
    assert cache.get(key(0)) is None
    assert cache.put(key(0), memoryview(b"x" * 100)) and cache.put(key(1), b"")
    data = cache.get(key(0))
    assert data is not None and bytes(data) == b"x" * 100 and data.readonly
    assert np.frombuffer(data, np.uint8).ctypes.data % 64 == 0
    empty = cache.get(key(1))
    assert empty is not None and bytes(empty) == b""
    path = tmp_path / "v2" / key(0)[:2] / key(0)
    assert path.stat().st_size == HEADER + 100


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1],  # truncated payload
        lambda b: b[:10],  # truncated header
        lambda b: b[:70] + bytes([b[70] ^ 1]) + b[71:],  # a flipped bit
        lambda b: b"SNAPBLK1" + b[8:],  # the entry format before CRC-32C
        lambda b: b + b"\0",  # trailing bytes
    ],
    ids=["payload", "header", "bit", "magic", "long"],
)
def test_a_damaged_entry_is_a_miss_and_removed(tmp_path: Path, damage: Any) -> None:
    cache = BlockCache(tmp_path, 1 << 20)
    cache.put(key(0), os.urandom(100))
    path = tmp_path / "v2" / key(0)[:2] / key(0)
    path.write_bytes(damage(path.read_bytes()))
    assert cache.get(key(0)) is None and not path.exists()
    cache.put(key(0), b"y" * 100)
    assert bytes(cache.get(key(0)) or b"") == b"y" * 100


def test_eviction_keeps_the_limit_and_removes_the_least_recently_used(tmp_path: Path) -> None:
    entry = HEADER + 100
    cache = BlockCache(tmp_path, 10 * entry)
    for i in range(10):
        assert cache.put(key(i), bytes([i]) * 100)
    assert cache.scan().evicted == 0
    assert cache.get(key(0)) is not None  # now the most recently used
    assert cache.put(key(10), b"z" * 100)  # over the limit: evict down to 90% of it
    present = [i for i in range(11) if cache.get(key(i)) is not None]
    assert present == [0, *range(3, 11)]
    for i in range(11, 40):
        cache.put(key(i), b"z" * 100)
        assert sum(p.stat().st_size for p in files_under(tmp_path)) <= 10 * entry
    present = [i for i in range(40) if cache.get(key(i)) is not None]
    assert len(present) >= 8 and present == list(range(40 - len(present), 40))


def test_trim_brings_a_directory_filled_by_others_under_the_limit(tmp_path: Path) -> None:
    entry = HEADER + 100
    mine, theirs = BlockCache(tmp_path, 40 * entry), BlockCache(tmp_path, 1 << 20)
    assert mine.trim() is None  # wrote nothing: no scan
    mine.put(key(0), b"a" * 100)  # scans: the size was unknown
    for i in range(45):
        theirs.put(key(100 + i), b"b" * 100)
    mine.put(key(1), b"a" * 100)  # its estimate (2 entries) is far from the limit: no scan
    assert len(files_under(tmp_path)) == 47
    scan = mine.trim()
    assert scan is not None and scan.evicted > 0 and scan.bytes <= 40 * entry
    assert sum(p.stat().st_size for p in files_under(tmp_path)) == scan.bytes
    assert mine.trim() is None


def test_concurrent_puts_and_gets_of_one_key(tmp_path: Path) -> None:
    cache = BlockCache(tmp_path, 1 << 20)
    payload = os.urandom(50_000)
    start = threading.Barrier(16)
    seen: list[bytes | None] = []

    def work(i: int) -> None:
        start.wait()
        for _ in range(20):
            if i % 2:
                assert cache.put(key(7), payload)
            else:
                got = cache.get(key(7))
                seen.append(None if got is None else bytes(got))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {s for s in seen if s is not None} <= {payload}
    assert bytes(cache.get(key(7)) or b"") == payload
    assert [p.name for p in files_under(tmp_path)] == [key(7)]  # no temp file left


def test_a_killed_writer_leaves_nothing_visible_and_its_temp_file_is_removed_when_old(
    tmp_path: Path,
) -> None:
    cache = BlockCache(tmp_path, 1 << 20)
    folder = tmp_path / "v2" / key(3)[:2]
    folder.mkdir()
    temp = folder / f".{key(3)}.4242.deadbeef.tmp"
    temp.write_bytes(b"SNAPBLK2" + b"\x10" * 30)  # a header cut short
    assert cache.get(key(3)) is None
    scan = cache.scan()
    assert temp.exists() and scan.stale_temps == 0 and scan.bytes == 38  # maybe still writing
    hour_ago = time.time() - 3600
    os.utime(temp, (hour_ago, hour_ago))
    assert cache.scan().stale_temps == 1 and not temp.exists()
    assert cache.get(key(3)) is None


def test_clear_and_verify(tmp_path: Path) -> None:
    cache = BlockCache(tmp_path, 1 << 20)
    for i in range(5):
        cache.put(key(i), b"q" * 10)
    (tmp_path / "v2" / key(2)[:2] / key(2)).write_bytes(b"junk")
    assert cache.verify() == [key(2)]
    cache.clear()
    assert files_under(tmp_path) == [] and cache.scan().entries == 0


# -- many processes on one directory -------------------------------------------------------


def read_in_process(
    root: str, fingerprint: str, cache_dir: str, limit: int, seed: int, start: Any, out: Any
) -> None:
    """A spawned worker: two epochs through a cache shared with the other workers."""
    try:
        store = cached_store(simulated_store(root, ttfb=0.001), cache_dir, limit)
        start.wait(timeout=60)
        with snapstore.open(fingerprint, root=store) as snap:
            digests = [digest(epoch_ids(snap, epoch, seed)) for epoch in range(2)]
        out.put((seed, digests, store.hits, store.misses))
    except BaseException:
        out.put((seed, traceback.format_exc(), 0, 0))


def digest(batches: list[list[int]]) -> str:
    return hashlib.sha256(repr(batches).encode()).hexdigest()


def test_processes_share_one_cache_directory(
    written: tuple[str, str, int, int], tmp_path: Path
) -> None:
    root, fingerprint, blocks, stored = written
    cache_dir = tmp_path / "cache"
    limit = (stored + blocks * HEADER) * 6 // 10  # evictions while the others read
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(4), ctx.Queue()
    workers = [
        ctx.Process(
            target=read_in_process,
            args=(root, fingerprint, str(cache_dir), limit, seed, start, out),
        )
        for seed in range(4)
    ]
    for w in workers:
        w.start()
    results = sorted(out.get(timeout=120) for _ in workers)
    for w in workers:
        w.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * 4
    for seed, digests, _, _ in results:
        assert isinstance(digests, list), digests  # else the worker's traceback
        assert digests == [digest(reference(root, fingerprint, e, seed)) for e in range(2)]
    assert sum(hits for _, _, hits, _ in results) > 0
    files = files_under(cache_dir)
    assert files and not [p for p in files if p.name.startswith(".")]  # no temp files
    assert sum(p.stat().st_size for p in files) <= limit
    assert BlockCache(cache_dir, limit).verify() == []
