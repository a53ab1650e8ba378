"""The prefetcher against injected latency, errors and short reads; its threads; its controller."""

from __future__ import annotations

import gc
import mmap
import threading
import time
from collections.abc import Callable
from typing import Any

import fsspec
import numpy as np
import pytest

import snapstore
from snapstore.errors import CorruptBlockError, FormatError
from snapstore.format.plan import EpochPlan, PlanOptions
from snapstore.read.prefetch import Concurrency, Prefetcher, SharedDecoders
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import FsspecStore, LocalStore
from snapstore.write.writer import WriteOptions

N = 3000


def stage(n: int):
    for i in range(n):
        yield {"id": i, "pad": np.full(40, i % 251, np.uint8)}


def write(root: Any) -> str:
    snap = snapstore.snapshot(
        stage, root=root, options=WriteOptions(block_min_rows=1, block_bytes=2048)
    )(N)
    snap.materialize()
    snap.close()
    return snap.fingerprint


@pytest.fixture
def remote() -> SnapshotReader:
    """A snapshot on fsspec's memory filesystem: the remote (threaded I/O) path."""
    fs = fsspec.filesystem("memory")
    root = f"/prefetch-{time.monotonic_ns()}"
    store = FsspecStore(fs, root)
    reader = SnapshotReader(store, write(store))
    assert not store.local and reader.num_blocks > 40
    yield reader
    reader.close()
    fs.rm(root, recursive=True)


def prefetcher(reader: SnapshotReader, fetch: Callable[..., Any] | None = None, **kw: Any):
    plan = EpochPlan(
        reader.index["rows"],
        epoch=1,
        rank=0,
        world_size=1,
        options=PlanOptions(shuffle=True, seed=5, window_blocks=kw.pop("window_blocks", 8)),
    )
    return plan, reader.prefetch(plan.chunks(), fetch=fetch, **kw)


def ids(reader: SnapshotReader, pf: Prefetcher) -> np.ndarray:
    out = []
    for idx, decoded in pf:
        blocks, rows = reader.locate(idx)
        out.extend(int(decoded[int(b)].column("id")[r]) for b, r in zip(blocks, rows))
    return np.array(out)


READER_THREADS = ("snapstore-prefetch", "snapstore-fetch", "snapstore-decode")


def snapstore_threads() -> list[threading.Thread]:
    """The reader's threads (pins and claims of open snapshots have their own)."""
    return [t for t in threading.enumerate() if t.name.startswith(READER_THREADS)]


def test_reads_the_plan_in_order(remote: SnapshotReader) -> None:
    plan, pf = prefetcher(remote)
    np.testing.assert_array_equal(ids(remote, pf), plan.order())
    stats = pf.snapshot_stats()
    assert stats.blocks == remote.num_blocks and stats.samples == N
    assert stats.requests <= remote.num_blocks
    stored = int(remote.index["length"].sum())  # plus the alignment padding between blocks
    assert stored <= stats.bytes < stored + 64 * stats.requests
    assert stats.retries == 0 and stats.max_in_flight >= 1
    assert not snapstore_threads()


def test_transient_errors_are_retried(remote: SnapshotReader) -> None:
    failures: dict[tuple[str, int], int] = {}
    lock = threading.Lock()

    def flaky(path: str, start: int, length: int) -> Any:
        with lock:
            seen = failures.get((path, start), 0)
            failures[(path, start)] = seen + 1
        if seen < 2:  # every request fails twice, then works
            raise ConnectionError("connection reset by peer")
        return remote.store.read_range(path, start, length)

    plan, pf = prefetcher(remote, flaky)
    np.testing.assert_array_equal(ids(remote, pf), plan.order())
    assert pf.snapshot_stats().retries >= 2 * pf.snapshot_stats().requests


def test_a_persistent_error_reaches_the_consumer_with_its_cause(remote: SnapshotReader) -> None:
    calls = []

    def broken(path: str, start: int, length: int) -> Any:
        calls.append(path)
        raise TimeoutError(f"read of {path} timed out")

    _, pf = prefetcher(remote, broken, max_requests=4)
    with pytest.raises(TimeoutError, match="timed out") as info:
        ids(remote, pf)
    assert info.value.__traceback__ is not None
    # The request that failed was tried 1 + 3 times; retries stop once the reader closes.
    assert len(calls) >= 4
    assert not snapstore_threads()


def test_a_permanent_error_is_not_retried(remote: SnapshotReader) -> None:
    calls = []

    def missing(path: str, start: int, length: int) -> Any:
        calls.append((path, start))
        raise FileNotFoundError(path)

    _, pf = prefetcher(remote, missing, max_requests=1)
    with pytest.raises(FileNotFoundError):
        ids(remote, pf)
    assert calls and len(set(calls)) == len(calls)  # no request was tried twice


def test_missing_shard_is_a_format_error_naming_it(remote: SnapshotReader) -> None:
    shard = remote.shard_paths[0]
    remote.store.fs.rm(remote.store._path(shard))
    _plan, pf = prefetcher(remote)
    with pytest.raises(FormatError, match=r"shard .* is missing; the snapshot is damaged"):
        ids(remote, pf)


def test_short_reads_are_completed(remote: SnapshotReader) -> None:
    def short(path: str, start: int, length: int) -> Any:
        return remote.store.read_range(path, start, max(1, length // 3))

    plan, pf = prefetcher(remote, short)
    np.testing.assert_array_equal(ids(remote, pf), plan.order())
    assert pf.snapshot_stats().retries == 0


def test_a_truncated_shard_is_reported(remote: SnapshotReader) -> None:
    def empty(path: str, start: int, length: int) -> Any:
        return b""

    _, pf = prefetcher(remote, empty, max_requests=2)
    with pytest.raises(FormatError, match=r"ends before byte \d+ \(read stopped at \d+\)"):
        ids(remote, pf)


def test_corrupt_bytes_raise_corrupt_block_error(remote: SnapshotReader) -> None:
    def corrupt(path: str, start: int, length: int) -> Any:
        data = bytearray(remote.store.read_range(path, start, length))
        data[len(data) // 2] ^= 0xFF
        return bytes(data)

    _, pf = prefetcher(remote, corrupt)
    with pytest.raises(CorruptBlockError, match="checksum mismatch") as info:
        ids(remote, pf)
    assert info.value.shard.startswith(remote.run_dir)


def test_injected_latency_is_hidden_by_parallel_requests(remote: SnapshotReader) -> None:
    """64 blocks in 8 windows behind 30 ms per request: requests overlap (about one round trip
    per window, not one per block)."""
    in_flight = [0, 0]
    lock = threading.Lock()

    def slow(path: str, start: int, length: int) -> Any:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
        time.sleep(0.03)
        with lock:
            in_flight[0] -= 1
        return remote.store.read_range(path, start, length)

    plan, pf = prefetcher(remote, slow, window_blocks=8, budget_bytes=1 << 20)
    began = time.perf_counter()
    np.testing.assert_array_equal(ids(remote, pf), plan.order())
    seconds = time.perf_counter() - began
    stats = pf.snapshot_stats()
    assert in_flight[1] >= 8 and stats.max_in_flight >= 8
    assert stats.concurrency > 2.0
    # One request after another would take requests x 30 ms; overlap makes it a fraction.
    assert seconds < 0.5 * stats.requests * 0.03


def test_budget_bounds_bytes_held_ahead(remote: SnapshotReader) -> None:
    window = 4
    budget = 16 << 10
    held: list[int] = []
    box: list[Prefetcher] = []

    def watch(path: str, start: int, length: int) -> Any:
        if box:
            held.append(box[0]._held)
        return remote.store.read_range(path, start, length)

    _, pf = prefetcher(remote, watch, window_blocks=window, budget_bytes=budget)
    box.append(pf)
    for _ in pf:
        time.sleep(0.001)  # a slow consumer: the prefetcher runs into the budget
    largest_chunk = window * int(remote.index["raw_length"].max())
    assert held and max(held) <= budget + largest_chunk


def test_a_window_larger_than_the_budget_does_not_deadlock(remote: SnapshotReader) -> None:
    plan, pf = prefetcher(remote, window_blocks=64, budget_bytes=1)
    np.testing.assert_array_equal(ids(remote, pf), plan.order())


def test_close_mid_epoch_stops_every_thread(remote: SnapshotReader) -> None:
    def slow(path: str, start: int, length: int) -> Any:
        time.sleep(0.01)
        return remote.store.read_range(path, start, length)

    _, pf = prefetcher(remote, slow)
    it = iter(pf)
    next(it)
    assert snapstore_threads()
    pf.close()
    pf.close()  # twice is fine
    assert not snapstore_threads()


def test_abandoned_iterators_stop_their_threads(tmp_path) -> None:
    snap = snapstore.open(write(tmp_path), root=tmp_path)
    reader = snap.batches(16, shuffle=True, window_blocks=4)
    it = iter(reader)
    next(it)
    assert snapstore_threads()
    del it
    gc.collect()
    assert not snapstore_threads()
    # A second abandoned pass, through a reader that is itself dropped.
    it = iter(snap.batches(16))
    next(it)
    del it
    gc.collect()
    assert not snapstore_threads()
    snap.close()


def test_local_store_reads_are_memory_map_views(tmp_path) -> None:
    fingerprint = write(tmp_path)
    reader = SnapshotReader(LocalStore(tmp_path), fingerprint)
    seen: list[Any] = []

    def spy(path: str, start: int, length: int) -> Any:
        data = reader.store.read_range(path, start, length)
        seen.append(data)
        return data

    plan, pf = prefetcher(reader, spy)
    np.testing.assert_array_equal(ids(reader, pf), plan.order())
    # A few blocks of one shard per request (never a copy): each a view into the shard's
    # mapping, spanning the gaps between its blocks.
    assert reader.num_blocks / 8 <= len(seen) < reader.num_blocks
    assert all(isinstance(d, memoryview) and isinstance(d.obj, mmap.mmap) for d in seen)
    reader.close()


def test_concurrency_follows_littles_law() -> None:
    c = Concurrency(maximum=64, initial=4)
    assert c.target() == 4  # nothing measured yet
    for _ in range(20):
        c.record_latency(0.05)
    now = 0.0
    for _ in range(20):
        now += 0.01  # 100 requests per second consumed
        c.record_consumed(1, now)
    # 100/s x 50 ms = 5 in flight, with 2x headroom: 10.
    assert c.target() == 10
    c.on_stall(limited=False)  # the budget held requests back: more concurrency would not help
    assert c.limit == 4
    c.on_stall(limited=True)
    assert c.limit == 10
    c.on_stall(limited=True)
    assert c.limit == 20
    c.on_stall(limited=True)
    c.on_stall(limited=True)
    assert c.limit == 64  # capped
    for _ in range(100):
        c.on_idle()  # nobody waits: drift back down to the estimate
    assert c.limit == 10


def test_concurrency_rejects_a_bad_maximum() -> None:
    with pytest.raises(ValueError, match="expected maximum >= 1, found 0"):
        Concurrency(0)


def test_through_the_latency_simulator_a_window_costs_about_one_round_trip(tmp_path) -> None:
    from snapstore.storage.simulate import simulated_store

    fingerprint = write(tmp_path)
    store = simulated_store(tmp_path, ttfb=0.05)
    snap = snapstore.open(fingerprint, root=store)
    reader = snap.batches(100, shuffle=True, window_blocks=16)
    blocks = len(snap._open().index)
    assert snap._guard is not None and snap._guard.wait(30)  # its requests are not the reads
    windows = -(-blocks // 16)
    store.fs.reset_counters()
    began = time.perf_counter()
    assert sum(len(b["id"]) for b in reader) == N
    seconds = time.perf_counter() - began
    # Each window's 16 blocks are requested together: 16 requests in flight at once, and the
    # epoch takes a few round trips per window at most, far from one round trip per block.
    assert store.fs.max_concurrent >= 16
    assert reader.stats().requests == store.fs.requests <= blocks  # adjacent blocks coalesce
    assert seconds < 0.05 * (3 * windows + 4) < 0.05 * blocks / 2
    snap.close()


def test_snapshot_close_stops_running_passes(tmp_path) -> None:
    snap = snapstore.open(write(tmp_path), root=tmp_path)
    passes = [iter(snap.batches(16, shuffle=True, window_blocks=2)) for _ in range(2)]
    for it in passes:
        next(it)
    assert snapstore_threads()
    snap.close()
    assert not snapstore_threads()
    assert len(list(snap.batches(1000))) == 3  # reading again reopens
    snap.close()


def test_latency_stats_stay_bounded_on_long_passes(remote: SnapshotReader) -> None:
    _, pf = prefetcher(remote)
    pf.close()
    for k in range(20_000):  # latencies 0..0.2 s, uniformly spread
        pf._busy += k / 100_000
        pf._sample_latency(k / 100_000)
    stats = pf.snapshot_stats()
    assert len(pf._latencies) == 4096
    assert stats.latency_mean == pytest.approx(0.1, rel=1e-3)
    assert stats.latency_p95 == pytest.approx(0.19, abs=0.005)


def test_earlier_chunks_are_decoded_first(remote: SnapshotReader) -> None:
    """Requests complete in any order; the decode threads take the earliest chunk's blocks
    first, so windows fetched ahead never hold up the one the consumer waits for."""
    plan = EpochPlan(
        remote.index["rows"], epoch=0, rank=0, world_size=1,
        options=PlanOptions(shuffle=True, seed=1, window_blocks=4),
    )  # fmt: skip
    first = {int(b) for b in remote.locate(next(iter(plan.chunks())))[0]}
    gate = threading.Event()
    order: list[int] = []
    decode = remote._decode

    def held_decode(block: int, data: Any) -> Any:
        gate.wait(10)  # the queue fills with every chunk's blocks meanwhile
        order.append(block)
        return decode(block, data)

    remote._decode = held_decode  # type: ignore[method-assign]

    def late_first(path: str, start: int, length: int) -> Any:
        entries = remote.index
        hit = (entries["offset"] >= start) & (entries["offset"] < start + length)
        if first & set(np.flatnonzero(hit).tolist()):
            time.sleep(0.2)  # the first window's requests are answered last
        return remote._fetch(path, start, length)

    pf = remote.prefetch(plan.chunks(), fetch=late_first, decode_threads=1, budget_bytes=1 << 30)
    time.sleep(0.5)  # every request answered and queued for decoding
    gate.set()
    assert sum(len(idx) for idx, _ in pf) == N
    # The block being decoded when the queue filled may be any; after it, the first window's.
    assert set(order[1 : 1 + len(first)]) == first, (sorted(first), order[: 2 * len(first)])


class _Member:
    """A stand-in prefetcher for SharedDecoders: queued chunks, the consumer's chunk."""

    def __init__(self, name: str, queued: list[int], waiting: int, log: list[str]) -> None:
        self.name, self.queued, self.waiting, self.log = name, sorted(queued), waiting, log

    def decode_urgency(self) -> float:
        return self.queued[0] - self.waiting if self.queued else float("inf")

    def decode_next(self) -> bool:
        if not self.queued:
            return False
        self.log.append(f"{self.name}{self.queued.pop(0)}")
        return True


def test_shared_decoders_decode_the_block_needed_soonest_first() -> None:
    """Source a's consumer waits for chunk 5 and its next queued block is of chunk 6; b's
    consumer waits for chunk 0 and b queued chunks 0 to 2: b's three go first, then a's."""
    log: list[str] = []
    shared = SharedDecoders(1)
    try:
        a, b = _Member("a", [6, 7], 5, log), _Member("b", [0, 1, 2], 0, log)
        shared.join(a)  # type: ignore[arg-type]
        shared.join(b)  # type: ignore[arg-type]
        for _ in range(6):  # one more task than blocks: it finds nothing and returns
            shared._run_one()
        assert log == ["b0", "a6", "b1", "a7", "b2"]
        shared.leave(b)  # type: ignore[arg-type]
        a.queued = [9]
        shared._run_one()
        assert log[-1] == "a9"
    finally:
        shared.shutdown()


def test_prefetchers_on_one_shared_pool_read_their_plans_and_stop(
    remote: SnapshotReader,
) -> None:
    shared = SharedDecoders(2)
    plans, pfs = zip(*(prefetcher(remote, decoders=shared) for _ in range(2)))
    try:
        for plan, pf in zip(plans, pfs):
            np.testing.assert_array_equal(ids(remote, pf), plan.order())
    finally:
        for pf in pfs:
            pf.close()
        shared.shutdown()
    assert not [t for t in snapstore_threads() if t.is_alive()]
