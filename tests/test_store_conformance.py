"""The Store contract, run against every backend: a local directory, fsspec memory, GCS
(fake-gcs-server), S3 (moto) and WebHDFS (tests/webhdfs_server.py), the servers started by the
tests (tests/servers.py).

:class:`StoreConformance` is reusable: a new backend subclasses it and provides a ``backend``
fixture returning a :class:`Backend`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from servers import child_env

import snapstore
from snapstore.errors import StoreError
from snapstore.storage.listing import ListedStore
from snapstore.storage.simulate import simulated_store
from snapstore.storage.store import (
    ATOMIC_CREATE_PROTOCOLS,
    FsspecStore,
    LocalStore,
    RetryPolicy,
    Store,
    open_store,
)

DATA = bytes(range(256)) * 4  # 1 KiB: small, since moto copies the whole object per range read


@dataclass
class Backend:
    """A store under test, and how another process opens the same root (None: it cannot)."""

    store: Store
    url: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


class StoreConformance:
    """What every Store must do. Subclasses provide the ``backend`` fixture."""

    def test_write_then_read(self, backend: Backend) -> None:
        store = backend.store
        store.write_bytes("a/b/data.bin", DATA)
        assert bytes(store.read_bytes("a/b/data.bin")) == DATA
        assert store.size("a/b/data.bin") == len(DATA)
        assert store.exists("a/b/data.bin") and not store.is_dir("a/b/data.bin")
        assert store.exists("a/b") and store.is_dir("a/b") and store.is_dir("a")
        assert store.disk_usage("a") == len(DATA)

    def test_read_range(self, backend: Backend) -> None:
        store = backend.store
        store.write_bytes("r.bin", DATA)
        n = len(DATA)
        cases = [(0, 10), (100, 300), (n - 7, 7), (n - 2, 10), (0, n), (n, 5), (5, 0), (n, 0)]
        for start, length in cases:
            got = bytes(store.read_range("r.bin", start, length))
            assert got == DATA[start : start + length], (start, length)

    def test_open_write_streams_buffers_of_any_kind(self, backend: Backend) -> None:
        store = backend.store
        parts = [b"magic", memoryview(DATA), np.arange(50, dtype=np.int32), bytearray(3)]
        with store.open_write("w/shard-00000.snap") as f:
            for part in parts:
                f.write(part)
        want = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
        assert store.size("w/shard-00000.snap") == len(want)
        assert bytes(store.read_bytes("w/shard-00000.snap")) == want
        assert bytes(store.read_range("w/shard-00000.snap", 5, 10)) == DATA[:10]

    def test_list_dir(self, backend: Backend) -> None:
        store = backend.store
        for name in ("d/x", "d/y/z", "d/a"):
            store.write_bytes(name, b"1")
        assert store.list_dir("d") == ["a", "x", "y"]
        assert store.list_dir("d/y") == ["z"]
        assert store.list_dir("nothing") == [] and store.list_dir("d/nothing") == []

    def test_list_tree(self, backend: Backend) -> None:
        store = backend.store
        files = {"t/a.bin": DATA, "t/sub/b": DATA[:10], "t/sub/deep/c": b"", "t2/x": b"x"}
        for name, data in files.items():
            store.write_bytes(name, data)
        whole = {"a.bin": len(DATA), "sub/b": 10, "sub/deep/c": 0}
        assert store.list_tree("t") == whole
        assert store.list_tree("t", "sub/") == {"sub/b": 10, "sub/deep/c": 0}
        assert store.list_tree("t", "su") == store.list_tree("t", "sub/")
        assert store.list_tree("t", "sub/deep/c") == {"sub/deep/c": 0}
        assert store.list_tree("t", "a") == {"a.bin": len(DATA)}  # not t2/x: under t only
        assert store.list_tree("t", "zz") == {} and store.list_tree("missing") == {}
        root = store.list_tree("")
        assert {k: v for k, v in root.items() if k.startswith("t")} == {
            **{f"t/{k}": v for k, v in whole.items()},
            "t2/x": 1,
        }

    def test_list_tree_shows_empty_directories_where_the_store_has_them(
        self, backend: Backend
    ) -> None:
        store = backend.store
        store.write_bytes("e/sub/f", b"x")
        store.remove_tree("e/sub/f")
        tree = store.list_tree("e")
        assert tree in ({}, {"sub/": 0})  # object stores have no directories
        assert ("sub/" in tree) == store.exists("e/sub")

    def test_a_listed_store_answers_as_the_store(self, backend: Backend) -> None:
        store = backend.store
        for name in ("fp/COMMIT", "fp/runs/r1/shard", "fp/parts/000001/COMMIT", "other/x"):
            store.write_bytes(name, name.encode())
        listed = ListedStore(store, "fp", store.list_tree("fp"))
        for path in ("fp", "fp/runs", "fp/runs/r1", "fp/parts/000001", "fp/COMMIT", "fp/no"):
            assert listed.exists(path) == store.exists(path), path
            assert listed.is_dir(path) == store.is_dir(path), path
        for path in ("fp", "fp/runs", "fp/runs/r1", "fp/parts", "fp/no"):  # directories
            assert listed.list_dir(path) == store.list_dir(path), path
            assert listed.disk_usage(path) == store.disk_usage(path), path
        assert listed.size("fp/runs/r1/shard") == store.size("fp/runs/r1/shard")
        assert listed.list_tree("fp", "runs/") == store.list_tree("fp", "runs/")
        assert listed.list_dir("other") == ["x"]  # outside the listing: asks the store
        assert bytes(listed.read_bytes("fp/COMMIT")) == b"fp/COMMIT"

    def test_missing_paths(self, backend: Backend) -> None:
        store = backend.store
        assert not store.exists("missing") and not store.is_dir("missing")
        with pytest.raises(FileNotFoundError):
            store.read_bytes("missing/file")
        with pytest.raises(FileNotFoundError):
            store.read_range("missing/file", 0, 10)
        with pytest.raises(FileNotFoundError):
            store.size("missing/file")
        store.remove_tree("missing")  # not an error

    def test_remove_tree(self, backend: Backend) -> None:
        store = backend.store
        for name in ("t/one", "t/sub/two", "keep/three"):
            store.write_bytes(name, b"x")
        store.read_range("t/one", 0, 1)  # a local store holds a map of it: removal drops it
        store.remove_tree("t")
        assert not store.exists("t") and store.list_dir("t") == []
        assert not store.exists("t/sub/two") and store.exists("keep/three")
        store.remove_tree("keep/three")  # a single file
        assert not store.exists("keep/three")

    def test_remove_empty_dir(self, backend: Backend) -> None:
        # Only an empty directory goes; a store without directories has none left to remove.
        store = backend.store
        store.write_bytes("d/sub/file", b"x")
        assert store.remove_empty_dir("d/sub") is False and store.exists("d/sub/file")
        store.remove_tree("d/sub/file")
        store.remove_empty_dir("d/sub")
        store.remove_empty_dir("d")
        assert "d" not in store.list_dir("")
        assert store.remove_empty_dir("") is False  # never the root

    def test_create_if_absent(self, backend: Backend) -> None:
        store = backend.store
        assert store.create_if_absent("fp/COMMIT", b"first") is True
        assert store.create_if_absent("fp/COMMIT", b"second") is False
        assert bytes(store.read_bytes("fp/COMMIT")) == b"first"
        # Equal bytes count as this writer's own record: a create whose response was lost,
        # then retried, finds it (records name their writer, so no other one is equal).
        assert store.create_if_absent("fp/COMMIT", b"first") is True

    def test_threads_racing_create_exactly_one_wins(self, backend: Backend) -> None:
        store, threads, names = backend.store, 8, 5
        barrier = threading.Barrier(threads)

        def race(me: int) -> list[bool]:
            barrier.wait()
            return [store.create_if_absent(f"race/{k}", b"thread %d" % me) for k in range(names)]

        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(race, range(threads)))
        for k in range(names):
            winners = [me for me in range(threads) if results[me][k]]
            assert len(winners) == 1, (k, winners)
            assert bytes(store.read_bytes(f"race/{k}")) == b"thread %d" % winners[0]

    def test_processes_racing_create_exactly_one_wins(self, backend: Backend) -> None:
        if backend.url is None:
            pytest.skip("this store lives in one process")
        results = race_processes(backend.url, backend.options, processes=3, names=4)
        for k, wins in enumerate(zip(*results)):
            assert sum(wins) == 1, (k, results)
        store = backend.store
        winners = {bytes(store.read_bytes(f"race/{k}")) for k in range(4)}
        assert winners <= {b"process 0", b"process 1", b"process 2"}


RACER = textwrap.dedent(
    """
    import json, sys
    import snapstore

    url, options, me, names = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    store = snapstore.open_store(url, **options)
    store.exists("warm-up")  # connect before the start signal
    print("READY", flush=True)
    sys.stdin.readline()
    won = [store.create_if_absent(f"race/{k}", f"process {me}".encode()) for k in range(names)]
    print(json.dumps(won), flush=True)
    """
)


def race_processes(
    url: str, options: dict[str, Any], *, processes: int, names: int
) -> list[list[bool]]:
    """Each process creates ``race/0`` .. ``race/<names - 1>``, all starting together."""
    return start_together(
        [RACER, url, json.dumps(options), str(me), str(names)] for me in range(processes)
    )


def start_together(scripts: Iterable[list[str]]) -> list[Any]:
    """Run ``python -c script args...`` for each list, release them together once every one
    has printed READY, and return what each printed next (JSON)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", *script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for script in scripts
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            assert proc.stdout is not None
            results.append(json.loads(proc.stdout.readline()))
            assert proc.wait(timeout=60) == 0
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(params=["local", "memory", "gcs", "s3", "webhdfs"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    if kind == "local":
        root = str(tmp_path / "root")
        spec = Backend(LocalStore(root), root)
    elif kind == "memory":
        spec = Backend(open_store(f"memory://conformance-{uuid.uuid4().hex}"))
    elif kind == "webhdfs":
        if importlib.util.find_spec("snapstore.storage.webhdfs") is None:
            pytest.skip(
                "no WebHDFS store yet (snapstore/storage/webhdfs.py): fsspec's is not atomic"
            )
        url, options = request.getfixturevalue("webhdfs_server").fresh_root()
        spec = Backend(open_store(url, **options), url, options)
        if not spec.store.atomic_create:
            pytest.skip(f"open_store({url!r}) is not the atomic WebHDFS store yet")
    else:
        url, options = request.getfixturevalue(f"{kind}_server").root()
        spec = Backend(open_store(url, **options), url, options)
    yield spec
    spec.store.close()


class TestStores(StoreConformance):
    """Every built-in backend."""


# -- what is specific to the fsspec store ------------------------------------------------------


def test_open_store_routes_urls(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    memory = open_store("memory://routes", retry=RetryPolicy(attempts=2))
    assert isinstance(memory, FsspecStore) and memory.retry.attempts == 2
    assert memory.url == "memory://routes" and memory.atomic_create
    assert open_store(memory) is memory


def test_open_store_names_what_is_wrong() -> None:
    with pytest.raises(StoreError, match=r"nosuchproto://x.*check the URL"):
        open_store("nosuchproto://x")


def test_a_file_another_client_wrote_after_a_listing_is_found(
    remote_root: tuple[str, dict[str, Any]],
) -> None:
    """s3fs' cat_file and info ask its listings cache first: a directory listed before another
    client wrote a file there made the file "missing" to read_bytes, and a create that the
    service refused as existing then found nothing to read, every try (a job's claim failed
    with "it vanished each time it was found to exist")."""
    url, options = remote_root
    store = open_store(url, **options)
    assert isinstance(store, FsspecStore)
    store.write_bytes("d/a", b"a")
    assert store.list_dir("d") == ["a"]
    fs = type(store.fs)(skip_instance_cache=True, **store.fs.storage_options)
    FsspecStore(fs, store.root).write_bytes("d/b", b"theirs")
    assert store.create_if_absent("d/b", b"ours") is False
    assert store.read_bytes("d/b") == b"theirs"


def test_gcs_with_an_endpoint_gets_the_core_filesystem(gcs_root: tuple[str, dict[str, Any]]):
    from snapstore.storage.gcs import GCSFileSystem

    url, options = gcs_root
    store = open_store(url, **options)
    assert isinstance(store, FsspecStore) and type(store.fs) is GCSFileSystem
    assert store.url == url and store.atomic_create


def test_wrappers_are_judged_by_what_they_wrap(tmp_path: Path) -> None:
    assert {"gs", "s3", "memory", "file"} <= ATOMIC_CREATE_PROTOCOLS
    assert simulated_store(tmp_path, ttfb=0).atomic_create
    dir_fs = fsspec.filesystem("dir", path="/dirfs", fs=fsspec.filesystem("memory"))
    assert FsspecStore(dir_fs, "x").atomic_create


def test_webhdfs_has_atomic_create() -> None:
    store = open_store("webhdfs://namenode.invalid:9870/snaps")  # connects on first use only
    assert isinstance(store, FsspecStore) and store.atomic_create  # tests/test_webhdfs.py
    assert store.url == "webhdfs://namenode.invalid:9870/snaps"  # the host stays in messages


class _PlainFileSystem(MemoryFileSystem):  # type: ignore[misc]
    """Stands in for HDFS: a protocol with no atomic create-if-absent."""

    protocol = "plainfs"
    cachable = False


def test_a_protocol_without_atomic_create_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    fs = _PlainFileSystem()
    store = FsspecStore(fs, f"/plain-{uuid.uuid4().hex}")
    other = FsspecStore(fs, f"/plain-{uuid.uuid4().hex}")
    assert not store.atomic_create
    with caplog.at_level(logging.WARNING, logger="snapstore.store"):
        assert store.create_if_absent("fp/COMMIT", b"one") is True
        assert store.create_if_absent("fp/COMMIT", b"two") is False
        other.write_bytes("x", b"1")
        assert other.create_if_absent("fp/COMMIT", b"one") is True
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "plainfs has no atomic create-if-absent" in warnings[0]
    assert "one writer per fingerprint" in warnings[0]


def test_a_directory_removed_before_a_file_is_created_in_it_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failed job removes the directories it left empty (remove_empty_dir); another job that
    # has just made one of them, and not yet created its file there, makes it again.
    store = LocalStore(tmp_path / "root")
    real_mkdir, removed = Path.mkdir, []

    def mkdir_then_lose_it(self: Path, *args: Any, **kwargs: Any) -> None:
        real_mkdir(self, *args, **kwargs)
        if self.name == "claims" and not removed:
            removed.append(self)
            self.rmdir()  # what the failed job's cleanup does in between

    monkeypatch.setattr(Path, "mkdir", mkdir_then_lose_it)
    assert store.create_if_absent("fp/claims/claim-00000000", b"{}") is True
    with store.open_write("fp/claims/beat") as f:
        f.write(b"1")
    assert removed and store.read_bytes("fp/claims/claim-00000000") == b"{}"


def test_open_write_spills_large_files_to_disk(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not isinstance(backend.store, FsspecStore):
        pytest.skip("a local store writes in place")
    from snapstore.storage.fsspec_store import _SpooledUpload

    monkeypatch.setattr(_SpooledUpload, "spool_bytes", 100)  # keep objects small for moto
    with backend.store.open_write("big/file") as f:
        for _ in range(4):
            f.write(DATA)
    assert bytes(backend.store.read_bytes("big/file")) == DATA * 4


def test_snapshot_round_trip_on_every_backend(backend: Backend) -> None:
    def stage(n: int) -> Iterator[dict[str, Any]]:
        for i in range(n):
            yield {"x": i, "v": np.full(8, i, np.int16)}

    options = snapstore.WriteOptions(block_min_rows=1, block_bytes=256, shard_bytes=2048)
    snap = snapstore.snapshot(stage, root=backend.store, options=options)(60).materialize()
    reopened = snapstore.open(snap.fingerprint, root=backend.store)
    assert [s["x"] for s in reopened] == list(range(60))
    seen = [int(x) for b in reopened.batches(7, shuffle=True, seed=1, epoch=0) for x in b["x"]]
    assert sorted(seen) == list(range(60)) and seen != list(range(60))
