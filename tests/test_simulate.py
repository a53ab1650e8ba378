"""LatencyFileSystem and simulated_store: requests cost what a bucket's would, and nothing else
changes. Timing bounds are generous multiples of the configured latency."""

from __future__ import annotations

import pickle
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

import snapstore
from snapstore.errors import FormatError, SnapshotNotFoundError
from snapstore.storage.simulate import LatencyFileSystem, Request, round_trips, simulated_store
from snapstore.storage.store import FsspecStore, LocalStore, Store

DATA = bytes(range(256)) * 40  # 10,240 bytes


@pytest.fixture
def mem() -> Iterator[tuple[Any, str]]:
    """The memory filesystem and a fresh directory on it holding DATA at ``<dir>/data``."""
    fs = fsspec.filesystem("memory")
    root = f"/simulate-{uuid.uuid4().hex}"
    fs.pipe_file(f"{root}/data", DATA)
    yield fs, root
    fs.rm(root, recursive=True)


def elapsed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def in_threads(n: int, fn: Callable[[], object]) -> float:
    """Run ``fn`` on ``n`` threads started together; the seconds until all are done."""
    barrier = threading.Barrier(n + 1)

    def run() -> None:
        barrier.wait()
        fn()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def test_range_read_is_one_request_of_its_size(mem: tuple[Any, str], monkeypatch) -> None:
    target, root = mem
    asked: list[tuple[Any, Any]] = []
    real = target.cat_file

    def spy(path: str, start: Any = None, end: Any = None, **kw: Any) -> bytes:
        asked.append((start, end))
        data: bytes = real(path, start=start, end=end, **kw)
        return data

    monkeypatch.setattr(target, "cat_file", spy)
    fs = LatencyFileSystem(target, ttfb=0)
    assert fs.cat_file(f"{root}/data", start=100, end=300) == DATA[100:300]
    assert (fs.requests, fs.bytes_read) == (1, 200)
    assert asked == [(100, 300)]  # the target saw the range, not a whole-file read
    assert fs.cat_file(f"{root}/data", start=-10) == DATA[-10:]
    assert fs.cat_file(f"{root}/data", start=10, end=-10) == DATA[10:-10]
    assert fs.cat_file(f"latency://{root}/data") == DATA
    assert (fs.requests, fs.bytes_read) == (4, 200 + 10 + len(DATA) - 20 + len(DATA))


def test_each_request_waits_ttfb(mem: tuple[Any, str]) -> None:
    target, root = mem
    fs = LatencyFileSystem(target, ttfb=0.05)
    assert elapsed(lambda: fs.cat_file(f"{root}/data", 0, 10)) >= 0.045
    assert elapsed(lambda: fs.info(f"{root}/data")) >= 0.045
    with pytest.raises(FileNotFoundError):  # a miss is a round trip too
        start = time.perf_counter()
        try:
            fs.cat_file(f"{root}/missing")
        finally:
            assert time.perf_counter() - start >= 0.045
    assert (fs.requests, fs.bytes_read) == (3, 10)


def test_bandwidth_adds_size_over_bandwidth(mem: tuple[Any, str]) -> None:
    target, root = mem
    fs = LatencyFileSystem(target, ttfb=0, bandwidth=100_000)  # 10,240 bytes: ~102 ms
    assert elapsed(lambda: fs.cat_file(f"{root}/data")) >= 0.095
    fs = LatencyFileSystem(target, ttfb=0.02, bandwidth=100_000)
    assert elapsed(lambda: fs.cat_file(f"{root}/data", 0, 5000)) >= 0.02 + 0.05 - 0.005


def test_parallel_requests_overlap(mem: tuple[Any, str]) -> None:
    target, root = mem
    fs = LatencyFileSystem(target, ttfb=0.05)
    took = in_threads(16, lambda: fs.cat_file(f"{root}/data", 0, 64))
    assert took < 16 * 0.05 / 2, "requests from several threads must overlap"
    assert fs.requests == 16 and fs.max_concurrent >= 8


def test_max_requests_queues_the_rest(mem: tuple[Any, str]) -> None:
    target, root = mem
    fs = LatencyFileSystem(target, ttfb=0.05, max_requests=2)
    took = in_threads(8, lambda: fs.cat_file(f"{root}/data", 0, 64))
    assert took >= 4 * 0.045  # 8 requests, 2 at a time
    assert fs.max_concurrent == 2 and fs.requests == 8


def test_cat_ranges_issues_ranges_in_parallel(mem: tuple[Any, str]) -> None:
    target, root = mem
    fs = LatencyFileSystem(target, ttfb=0.05)
    path = f"{root}/data"
    starts = [0, 100, 1000, 5000, -10, 7, 8, 9]
    ends = [10, 200, 1001, 6000, None, 8, 9, 10]
    start = time.perf_counter()
    out = fs.cat_ranges([path] * 8, starts, ends)
    assert time.perf_counter() - start < 8 * 0.05 / 2
    assert out == [DATA[s:e] for s, e in zip(starts, ends)]
    assert fs.requests == 8 and fs.max_concurrent >= 2

    got = fs.cat_ranges([path, f"{root}/missing"], 0, 4)
    assert got[0] == DATA[:4] and isinstance(got[1], FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges([path, f"{root}/missing"], 0, 4, on_error="raise")
    with pytest.raises(ValueError, match="one start and one end per path"):
        fs.cat_ranges([path, path], [0], [1, 2])


def test_reading_an_open_file_costs_requests(mem: tuple[Any, str]) -> None:
    target, root = mem
    fs = LatencyFileSystem(target, ttfb=0)
    with fs.open(f"latency://{root}/data", "rb") as f:
        f.seek(1000)
        assert f.read(24) == DATA[1000:1024]
    assert fs.requests >= 2  # the size lookup, then at least one ranged read


def test_counters_reset(mem: tuple[Any, str]) -> None:
    target, root = mem
    fs = LatencyFileSystem(target, ttfb=0)
    fs.cat_file(f"{root}/data", 0, 3)
    fs.exists(f"{root}/data")
    assert (fs.requests, fs.bytes_read, fs.max_concurrent) == (2, 3, 1)
    fs.reset_counters()
    assert (fs.requests, fs.bytes_read, fs.max_concurrent) == (0, 0, 0)


def test_instances_are_never_shared() -> None:
    # fsspec caches filesystem instances by constructor arguments; counters must not be shared.
    a, b = LatencyFileSystem(ttfb=0.01), LatencyFileSystem(ttfb=0.01)
    assert a is not b
    assert LatencyFileSystem(ttfb=0.02).ttfb == 0.02


def test_pickles_with_its_settings(mem: tuple[Any, str]) -> None:
    # DataLoader workers receive the store pickled.
    target, root = mem
    fs = pickle.loads(pickle.dumps(LatencyFileSystem(target, ttfb=0.001, max_requests=3)))
    assert (fs.ttfb, fs.bandwidth, fs.max_requests) == (0.001, None, 3)
    assert fs.cat_file(f"{root}/data", 0, 4) == DATA[:4] and fs.requests == 1


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"ttfb": -0.01}, "ttfb must be a finite number of seconds >= 0"),
        ({"ttfb": float("nan")}, "ttfb must be"),
        ({"ttfb": float("inf")}, "ttfb must be"),
        ({"ttfb": "50ms"}, "got '50ms'"),
        ({"bandwidth": 0}, "bandwidth must be a number of bytes per second > 0, or None"),
        ({"bandwidth": -1e6}, "bandwidth must be"),
        ({"bandwidth": float("nan")}, "bandwidth must be"),
        ({"max_requests": 0}, "max_requests must be an integer >= 1"),
        ({"max_requests": 2.5}, "max_requests must be"),
        ({"max_requests": True}, "max_requests must be"),
    ],
)
def test_settings_are_validated(settings: dict[str, Any], match: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=match):
        LatencyFileSystem(**settings)
    with pytest.raises(ValueError, match=match):
        simulated_store(tmp_path, **settings)


def test_target_must_be_a_filesystem() -> None:
    with pytest.raises(TypeError, match=r"fsspec filesystem .* got str"):
        LatencyFileSystem("memory")


def _roots(kind: str, tmp_path: Path) -> tuple[Any, str, Callable[[str], bool]]:
    """A root of each kind, its URL, and how to see a file from outside the simulation."""
    local = tmp_path / "snaps"
    if kind in ("path", "local_store"):
        root = local if kind == "path" else LocalStore(local)
        return root, str(local.absolute()), lambda p: (local / p).is_file()
    mem = fsspec.filesystem("memory")
    name = f"simulate-{uuid.uuid4().hex}"
    root = f"memory://{name}" if kind == "url" else FsspecStore(mem, f"/{name}")
    return root, f"memory://{name}", lambda p: bool(mem.isfile(f"/{name}/{p}"))


@pytest.mark.parametrize("kind", ["path", "local_store", "url", "fsspec_store"])
def test_simulated_store_behaves_like_the_store(kind: str, tmp_path: Path) -> None:
    root, url, visible = _roots(kind, tmp_path)
    store = simulated_store(root, ttfb=0.001, max_requests=4)
    assert isinstance(store.fs, LatencyFileSystem) and store.fs.ttfb == 0.001
    assert store.url == f"latency://{url}"
    store.write_bytes("a/b.bin", DATA)
    assert visible("a/b.bin")  # written through to the real storage
    assert store.read_bytes("a/b.bin") == DATA
    assert bytes(store.read_range("a/b.bin", 10, 20)) == DATA[10:30]
    assert store.list_dir("a") == ["b.bin"] and store.list_dir("nothing") == []
    assert store.size("a/b.bin") == len(DATA) and store.disk_usage("a") == len(DATA)
    assert store.exists("a/b.bin") and store.is_dir("a") and not store.exists("a/c")
    assert store.create_if_absent("a/COMMIT", b"one") is True
    assert store.create_if_absent("a/COMMIT", b"two") is False
    assert store.read_bytes("a/COMMIT") == b"one"
    with pytest.raises(FileNotFoundError):
        store.read_bytes("a/missing")
    store.remove_tree("a")
    assert not store.exists("a") and not visible("a/b.bin")
    assert store.fs.requests > 10 and store.fs.max_concurrent <= 4
    store.remove_tree("")


def test_simulated_store_names_the_simulation_in_its_url(tmp_path: Path) -> None:
    store = simulated_store(tmp_path, ttfb=0)
    assert store.url == f"latency://{tmp_path.absolute()}"
    with pytest.raises(SnapshotNotFoundError, match="latency://"):
        snapstore.open("ffffffff", root=store)


def test_simulated_store_rejects_other_stores() -> None:
    class Wrapper(Store):
        url = "wrapper://x"

    Wrapper.__abstractmethods__ = frozenset()
    with pytest.raises(TypeError, match="wraps a LocalStore or an FsspecStore, got a Wrapper"):
        simulated_store(Wrapper())


def test_snapshot_reads_back_through_the_simulation(tmp_path: Path) -> None:
    @snapstore.snapshot(root=str(tmp_path))
    def stage(n: int) -> Iterator[dict[str, Any]]:
        for i in range(n):
            yield {"x": i, "v": np.full(4, i, np.float32)}

    snap = stage(100).materialize()
    store = simulated_store(tmp_path, ttfb=0.01)
    with snapstore.open(snap.fingerprint[:8], root=store) as other:
        assert [s["x"] for s in other] == list(range(100))
        assert other[42]["v"].tolist() == [42.0] * 4
        assert sum(len(b["x"]) for b in other.batches(16, shuffle=True, epoch=0)) == 100
    assert store.fs.requests >= 4 and store.fs.bytes_read > 0  # commit, manifest, index, blocks


def test_snapshot_writes_through_the_simulation() -> None:
    store = simulated_store(f"memory://simulate-{uuid.uuid4().hex}", ttfb=0)

    def stage(n: int) -> Iterator[dict[str, int]]:
        yield from ({"x": i} for i in range(n))

    snap = snapstore.snapshot(stage, root=store)(50).materialize()
    assert snap.committed and store.fs.requests > 0
    assert [s["x"] for s in snapstore.open(snap.fingerprint, root=store)] == list(range(50))


def test_cold_start_round_trips_before_the_first_block(tmp_path: Path) -> None:
    """open() and the first batch from a bucket: the round trips made one after another before
    the first byte-range read of a block, and before the first batch (issue 14)."""

    def stage(n: int) -> Iterator[dict[str, Any]]:
        yield from ({"x": i} for i in range(n))

    fp = snapstore.snapshot(stage, root=str(tmp_path))(100).materialize().fingerprint
    store = simulated_store(tmp_path, ttfb=0.05, record=True)  # wide: parallel reads overlap
    with snapstore.open(fp, root=store) as snap:
        next(iter(snap.batches(16, shuffle=True)))
        first_batch = time.perf_counter()
        assert snap._guard is not None and snap._guard.wait(30)
    assert store.fs.trace is not None
    trace = sorted(store.fs.trace, key=lambda r: r.start)
    calls = [(r.name, r.path.rsplit("/", 1)[-1]) for r in trace]
    # open(): the commit record, then the manifest and the index together; then the blocks.
    # (It was 9 before issue 14, then 5 with the pin, marker and confirm-read in the way.)
    assert round_trips(trace, until=lambda r: r.ranged) == 2, calls
    assert calls[0] == ("cat_file", "COMMIT")
    assert sorted(calls[1:3]) == [("cat_file", "index.bin"), ("cat_file", "manifest.json")]
    assert calls[3] == ("cat_file", "shard-00000.snap"), calls
    # The first batch waited for three of them: the background ones (under pins/, and the
    # confirm-read of COMMIT) overlap its wait but are not what it waited for.
    needed = [r for r in trace if "/pins/" not in r.path and r.start < trace[3].start]
    needed += [r for r in trace if r.ranged and r.start < first_batch]
    assert round_trips(needed, until=lambda r: r.start >= first_batch) == 3, calls
    # The pin, the last-read marker and the confirm-read of the record go out after the first
    # block request, in the background; nothing is read twice before the first batch.
    later = calls[4:]
    assert [c for c in later if c[1] == "COMMIT"] == [("cat_file", "COMMIT")], calls
    assert any(name.startswith("pin-") for _, name in later), calls


def test_round_trips_count_overlapping_requests_once() -> None:
    def request(start: float, end: float, ranged: bool = False) -> Request:
        return Request("cat_file", "p", ranged, start, end)

    trace = [request(0, 1), request(1, 2), request(1.5, 3), request(2.5, 4), request(5, 6, True)]
    assert round_trips(trace) == 3
    assert round_trips(trace, until=lambda r: r.ranged) == 2
    assert round_trips([]) == 0


def test_an_index_fetched_ahead_is_checked_like_one_read_later(tmp_path: Path) -> None:
    def stage(n: int) -> Iterator[dict[str, Any]]:
        yield from ({"x": i} for i in range(n))

    fp = snapstore.snapshot(stage, root=str(tmp_path))(100).materialize().fingerprint
    (index,) = tmp_path.glob(f"{fp}/runs/*/index.bin")
    index.write_bytes(index.read_bytes()[:-1] + b"\xff")
    snap = snapstore.open(fp, root=simulated_store(tmp_path, ttfb=0))
    assert snap._metadata is not None and snap._metadata.index is not None  # fetched by open()
    with pytest.raises(FormatError, match=r"block index .* does not match its manifest entry"):
        len(snap)
    snap.close()
