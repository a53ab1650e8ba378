"""HDFS over WebHDFS (snapstore/storage/webhdfs.py), against the WebHDFS server the tests start
(tests/webhdfs_server.py): the atomic commit raced by processes, errors translated, snapshots
written, swept and read back. The store conformance suite runs on it too
(tests/test_store_conformance.py).

Against a real NameNode (never done here: no cluster was available)::

    SNAPSTORE_TEST_WEBHDFS=webhdfs://namenode:9870/tmp/snapstore-test \\
    SNAPSTORE_TEST_WEBHDFS_USER=hdfs \\
    python -m pytest tests/test_webhdfs.py -k RealNameNode

runs the conformance suite (races across processes included) in a fresh directory under that
URL, removed afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import requests
from fsspec.implementations.memory import MemoryFileSystem
from test_claims import run_sweep
from test_commit import run_writer, visible
from test_store_conformance import Backend, StoreConformance, race_processes
from webhdfs_server import WebHDFSServer

import snapstore
from snapstore.errors import StoreError
from snapstore.manage.gc import find_garbage
from snapstore.storage.retry import RetryPolicy, classify_failure
from snapstore.storage.simulate import simulated_store
from snapstore.storage.store import FsspecStore, open_store
from snapstore.storage.webhdfs import WebHDFSStore, _remote_error

OPTIONS = snapstore.WriteOptions(block_min_rows=1, block_bytes=1024, shard_bytes=16 << 10)


def webhdfs_store(server: WebHDFSServer, **kwargs: Any) -> WebHDFSStore:
    url, options = server.fresh_root()
    store = open_store(url, **options, **kwargs)
    assert isinstance(store, WebHDFSStore)
    return store


def test_open_store_gives_the_atomic_store() -> None:
    store = open_store("webhdfs://namenode.invalid:9870/snaps")  # connects on first use only
    assert isinstance(store, WebHDFSStore) and store.atomic_create
    assert store.url == "webhdfs://namenode.invalid:9870/snaps"  # the host stays in messages
    secure = open_store("swebhdfs://alice@namenode.invalid:9871/snaps")
    assert secure.fs.url == "https://namenode.invalid:9871/webhdfs/v1"  # type: ignore[attr-defined]
    assert secure.fs.pars["user.name"] == "alice"  # type: ignore[attr-defined]
    assert secure.atomic_create and secure.protocol == "swebhdfs"  # type: ignore[attr-defined]


def test_a_webhdfs_store_stays_one_in_worker_processes() -> None:
    """Sent to a worker (DataLoader, Grain, engine, Ray), the store keeps its class: its
    atomic commit, its error hints and its protocol (swebhdfs, which fsspec reports as
    webhdfs)."""
    import pickle

    from snapstore.storage.travel import portable, reopen

    secure = open_store("swebhdfs://alice@namenode.invalid:9871/snaps")
    where = pickle.loads(pickle.dumps(portable(secure, "a test")))
    where = (*where[:-1], -1)  # as unpickled in another process
    again = reopen(where)
    assert type(again) is WebHDFSStore and again.atomic_create
    assert again.protocol == "swebhdfs" and again.url == secure.url


def test_conflicting_options_name_the_url() -> None:
    with pytest.raises(StoreError, match=r"webhdfs://alice@nn:9870/x.*check the URL"):
        open_store("webhdfs://alice@nn:9870/x", token="delegation-token")  # user and token


def test_fsspecs_own_webhdfs_is_not_taken_for_atomic() -> None:
    # It creates with overwrite=true (after a check): only snapstore's driver is atomic.
    fs = fsspec.filesystem("webhdfs", host="namenode.invalid", port=9870, skip_instance_cache=True)
    assert not FsspecStore(fs, "/snaps").atomic_create


class _HdfsLike(MemoryFileSystem):  # type: ignore[misc]
    """Stands in for pyarrow's libhdfs client (hdfs://), which needs a JVM."""

    protocol = "hdfs"
    cachable = False


def test_writes_through_hdfs_urls_point_to_webhdfs(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("snapstore.storage.fsspec_store._WARNED", set())
    store = FsspecStore(_HdfsLike(), f"/hdfs-{uuid.uuid4().hex}")
    assert not store.atomic_create
    with caplog.at_level(logging.WARNING, logger="snapstore.store"):
        store.write_bytes("x", b"1")
        store.write_bytes("y", b"2")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "webhdfs://NAMENODE:9870/PATH" in warnings[0], warnings
    assert bytes(store.read_bytes("x")) == b"1"  # reads work as before


def test_four_processes_racing_for_100_names_each_get_one_winner(
    webhdfs_server: WebHDFSServer,
) -> None:
    url, options = webhdfs_server.fresh_root()
    results = race_processes(url, options, processes=4, names=100)
    for k, wins in enumerate(zip(*results)):
        assert sum(wins) == 1, (k, [r[k] for r in results])
    store = open_store(url, **options)
    for k in range(100):
        winner = next(me for me in range(4) if results[me][k])
        assert bytes(store.read_bytes(f"race/{k}")) == f"process {winner}".encode()


def test_the_commit_is_one_create_and_one_rename(webhdfs_server: WebHDFSServer) -> None:
    store = webhdfs_store(webhdfs_server)
    webhdfs_server.counts.clear()
    assert store.create_if_absent("fp/COMMIT", b"mine") is True  # its parents made with it
    assert webhdfs_server.counts["CREATE"] == 1 and webhdfs_server.counts["CREATE@datanode"] == 1
    assert webhdfs_server.counts["RENAME"] == 1
    assert sum(webhdfs_server.counts.values()) == 3
    assert store.create_if_absent("fp/COMMIT", b"theirs") is False
    assert bytes(store.read_bytes("fp/COMMIT")) == b"mine"
    assert list(store.list_tree("fp")) == ["COMMIT"]  # the loser's temporary file is gone


def test_a_record_is_never_seen_before_it_is_whole(webhdfs_server: WebHDFSServer) -> None:
    # HDFS shows a file its writer has not closed (empty, here for 0.5 s): a reader of a commit
    # record being created saw an empty record (a sweep's reader failed on it, 1 run in 7).
    store = webhdfs_store(webhdfs_server)
    webhdfs_server.under_construction = 0.5
    done = threading.Event()
    seen: list[bytes] = []

    def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.append(bytes(store.read_bytes("fp/COMMIT")))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert store.create_if_absent("fp/COMMIT", b"whole") is True
        time.sleep(0.1)
    finally:
        done.set()
        watcher.join()
    assert seen and set(seen) == {b"whole"}


def test_a_record_still_being_written_by_another_creator_is_theirs(
    webhdfs_server: WebHDFSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On HDFS a create of a file another client is still writing fails with
    # AlreadyBeingCreatedException, and a read shows what is written so far.
    store = webhdfs_store(webhdfs_server)
    store.write_bytes("fp/COMMIT", b'{"run": "thei')
    busy = _remote_error(_remote("AlreadyBeingCreatedException", "Failed to CREATE_FILE"))
    assert isinstance(busy, FileExistsError)

    def still_being_written(*args: Any, **kwargs: Any) -> None:
        raise busy

    monkeypatch.setattr(store.fs, "pipe_file", still_being_written)
    assert store.create_if_absent("fp/COMMIT", b'{"run": "mine"}') is False


def test_a_lost_response_finds_its_own_record_while_it_is_still_written(
    webhdfs_server: WebHDFSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first create's connection drops once the NameNode has the file, while the DataNode
    # still writes it; the retry finds it empty, and waits for the rest: the record is ours.
    store = webhdfs_store(webhdfs_server, retry=RetryPolicy(attempts=3, base=0))
    real, local = store.fs.pipe_file, webhdfs_server.local(store._path("fp/COMMIT"))
    workers: list[threading.Thread] = []

    def lose_the_response(path: str, value: bytes, mode: str = "overwrite") -> None:
        if workers:
            return real(path, value, mode=mode)  # type: ignore[no-any-return]
        workers.append(threading.Thread(target=real, args=(path, value), kwargs={"mode": mode}))
        workers[0].start()
        while not local.exists():
            time.sleep(0.005)
        raise requests.exceptions.ConnectionError("Connection reset by peer")

    monkeypatch.setattr(store.fs, "pipe_file", lose_the_response)
    with webhdfs_server.switched(under_construction=0.3):
        assert store.create_if_absent("fp/COMMIT", b'{"run": "mine"}') is True
        workers[0].join()
    assert bytes(store.read_bytes("fp/COMMIT")) == b'{"run": "mine"}'


def test_range_reads_are_one_open_each(webhdfs_server: WebHDFSServer) -> None:
    store = webhdfs_store(webhdfs_server)
    data = bytes(range(256)) * 64
    store.write_bytes("d.bin", data)
    webhdfs_server.counts.clear()
    assert bytes(store.read_range("d.bin", 1000, 300)) == data[1000:1300]
    assert bytes(store.read_range("d.bin", len(data) + 5, 10)) == b""
    assert bytes(store.fs.cat_file(store._path("d.bin"), start=-10)) == data[-10:]
    assert webhdfs_server.counts["OPEN"] == 3 and webhdfs_server.counts["GETFILESTATUS"] == 1


def test_datanode_addresses_are_mapped_through_data_proxy(webhdfs_server: WebHDFSServer) -> None:
    # A cluster behind a proxy or in containers: the NameNode redirects to names the client
    # cannot resolve; fsspec's data_proxy maps them, for snapstore's own calls too.
    store = webhdfs_store(webhdfs_server, data_proxy={"datanode.invalid": "127.0.0.1"})
    with webhdfs_server.switched(datanode_host="datanode.invalid"):
        store.write_bytes("d.bin", b"0123456789")
        assert store.create_if_absent("fp/COMMIT", b"mine") is True
        assert bytes(store.read_range("d.bin", 2, 3)) == b"234"
        assert bytes(store.read_bytes("fp/COMMIT")) == b"mine"


def test_many_threads_share_the_session(
    webhdfs_server: WebHDFSServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The prefetcher's fetch threads share one requests session: its pool keeps a connection
    # per thread (urllib3 would drop and reopen them past 10, and say so).
    store = webhdfs_store(webhdfs_server)
    data = np.random.default_rng(0).integers(0, 256, 8192, np.uint8).tobytes()
    store.write_bytes("blob", data)
    ranges = [(int(s), int(n)) for s, n in np.random.default_rng(1).integers(0, 4096, (300, 2))]

    def read(r: tuple[int, int]) -> bool:
        return bytes(store.read_range("blob", r[0], r[1])) == data[r[0] : r[0] + r[1]]

    with caplog.at_level(logging.WARNING), ThreadPoolExecutor(32) as pool:
        assert all(pool.map(read, ranges))
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


# -- errors --------------------------------------------------------------------------------------


def test_safe_mode_is_retried_until_the_namenode_leaves_it(webhdfs_server: WebHDFSServer) -> None:
    class LeaveSafeMode(RetryPolicy):
        def backoff(self, retry: int) -> float:
            webhdfs_server.safe_mode = False  # the NameNode finished starting up meanwhile
            return 0.0

    store = webhdfs_store(webhdfs_server, retry=LeaveSafeMode(attempts=3))
    with webhdfs_server.switched(safe_mode=True):
        assert store.create_if_absent("fp/COMMIT", b"x") is True
    assert bytes(store.read_bytes("fp/COMMIT")) == b"x"


def test_safe_mode_that_lasts_fails_clearly(webhdfs_server: WebHDFSServer) -> None:
    store = webhdfs_store(webhdfs_server, retry=RetryPolicy(attempts=2, base=0))
    with webhdfs_server.switched(safe_mode=True), pytest.raises(StoreError) as info:
        store.write_bytes("fp/data", b"x")
    message = str(info.value)
    assert store.url in message and "gave up after 2 tries" in message
    assert "safe mode" in message and "hdfs dfsadmin -safemode get" in message


def test_a_standby_namenode_says_to_use_the_active_one(webhdfs_server: WebHDFSServer) -> None:
    store = webhdfs_store(webhdfs_server, retry=RetryPolicy(attempts=2, base=0))
    with webhdfs_server.switched(standby=True), pytest.raises(StoreError, match="active NameNode"):
        store.read_bytes("anything")


def test_permission_denied_is_not_retried_and_names_the_user(
    webhdfs_server: WebHDFSServer,
) -> None:
    store = webhdfs_store(webhdfs_server)
    store.write_bytes("secret", b"x")
    webhdfs_server.counts.clear()
    with webhdfs_server.switched(denied_prefixes=["/"]), pytest.raises(StoreError) as info:
        store.read_bytes("secret")
    assert info.value.errno == errno.EACCES and webhdfs_server.counts["OPEN"] == 1
    message = str(info.value)
    assert f"{store.url}/secret" in message and "user=test" in message
    assert "HDFS permissions" in message


def test_a_missing_file_stays_file_not_found(webhdfs_server: WebHDFSServer) -> None:
    store = webhdfs_store(webhdfs_server)
    with pytest.raises(FileNotFoundError):
        store.read_bytes("nope")
    assert not store.exists("nope") and store.list_dir("nope") == []


def test_no_namenode_names_the_url_and_what_to_check() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, and nothing listens once closed
    store = open_store(f"webhdfs://127.0.0.1:{port}/snaps", retry=RetryPolicy(attempts=2, base=0))
    with pytest.raises(StoreError) as info:
        store.read_bytes("x")
    message = str(info.value)
    assert f"webhdfs://127.0.0.1:{port}/snaps/x" in message and "connection refused" in message
    assert "dfs.webhdfs.enabled" in message and "gave up after 2 tries" in message


class _Response:
    """An error answer from a NameNode, as ``requests`` gives it."""

    def __init__(self, status: int, body: Any) -> None:
        self.status_code, self._body = status, body

    def json(self) -> Any:
        if self._body is None:
            raise ValueError("no JSON")
        return self._body


def _remote(name: str, message: str) -> _Response:
    return _Response(403, {"RemoteException": {"exception": name, "message": message}})


def test_an_exhausted_quota_says_what_to_check(
    webhdfs_server: WebHDFSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = webhdfs_store(webhdfs_server)  # the test server has no quotas: the answer is faked
    answer = _remote("DSQuotaExceededException", "The DiskSpace quota of /snaps is exceeded: "
                     "quota = 1024 B = 1 KB but diskspace consumed = 2 KB")  # fmt: skip
    quota = _remote_error(answer)
    assert quota is not None

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise quota

    monkeypatch.setattr(store.fs, "_call", refuse)
    with pytest.raises(StoreError) as info:
        store.write_bytes("big", b"x" * 2048)
    message = str(info.value)
    assert store.url in message and "quota" in message and "hdfs dfs -count -q" in message
    assert info.value.errno == errno.EDQUOT


def test_every_remote_exception_is_classified() -> None:
    kinds = {
        "SafeModeException": "transient", "RetriableException": "transient",
        "StandbyException": "transient", "AccessControlException": "permission",
        "FileNotFoundException": "missing", "FileAlreadyExistsException": "exists",
        "NSQuotaExceededException": "quota", "DSQuotaExceededException": "quota",
        "AlreadyBeingCreatedException": "exists", "RecoveryInProgressException": "exists",
        "IOException": "permanent",
    }  # fmt: skip
    for name, kind in kinds.items():
        err = _remote_error(_remote(name, "m"))
        assert err is not None and classify_failure(err) == kind, name
    assert _remote_error(_Response(500, None)) is None  # no JSON: requests' HTTPError instead
    answer = requests.Response()
    answer.status_code = 503
    assert classify_failure(requests.HTTPError(response=answer)) == "transient"


# -- snapshots -----------------------------------------------------------------------------------


def tokens(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"x": i, "v": np.full(16, i, np.int32), "name": f"s{i}"}


def test_a_snapshot_is_written_and_read_back_through_the_prefetcher(
    webhdfs_server: WebHDFSServer,
) -> None:
    root = f"{webhdfs_server.url}/snaps-{uuid.uuid4().hex[:8]}"
    snap = snapstore.snapshot(tokens, root=root, options=OPTIONS)(600).materialize()
    assert snap.committed
    with snapstore.open(snap.fingerprint, root=root) as again:
        assert len(again) == 600 and again[599]["name"] == "s599"
        seen = []
        with again.batches(32, shuffle=True, seed=3, window_blocks=8) as reader:
            for batch in reader:
                for x, v in zip(batch["x"], batch["v"]):
                    assert v.tolist() == [int(x)] * 16
                    seen.append(int(x))
    assert sorted(seen) == list(range(600)) and seen != list(range(600))
    snap.close()


def test_the_latency_simulator_reads_over_webhdfs(webhdfs_server: WebHDFSServer) -> None:
    url, options = webhdfs_server.fresh_root()
    fp = snapstore.snapshot(tokens, root=open_store(url, **options), options=OPTIONS)(200)
    fingerprint = fp.materialize().fingerprint
    store = simulated_store(open_store(url, **options), ttfb=0.01)
    assert store.atomic_create  # judged by the WebHDFS driver it wraps
    with snapstore.open(fingerprint, root=store) as snap:
        assert [int(s["x"]) for s in snap] == list(range(200))
    assert store.fs.requests > 0  # type: ignore[attr-defined]


# 0.3: every created file (claims, beats, pins, commit records) is visible and empty for
# 0.3 s before its bytes appear, as on HDFS while its writer has not closed it.
@pytest.mark.parametrize("under_construction", [0.0, 0.3])
def test_a_sweep_of_six_processes_computes_once(
    webhdfs_server: WebHDFSServer, tmp_path: Path, under_construction: float
) -> None:
    root, options = webhdfs_server.fresh_root()
    with webhdfs_server.switched(under_construction=under_construction):
        run_sweep(tmp_path, root, options, 3.0)
    store = open_store(root, **options)
    assert {g.kind for g in find_garbage(store, min_age=0)} <= {"claims"}


def test_a_writer_killed_mid_write_leaves_nothing_visible_and_a_rerun_commits(
    webhdfs_server: WebHDFSServer, tmp_path: Path
) -> None:
    root = f"{webhdfs_server.url}/killed-{uuid.uuid4().hex[:8]}"
    proc = run_writer(tmp_path, root, "finite")
    assert proc.stdout is not None
    fp = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "WRITING"
    store = open_store(root)
    deadline = time.monotonic() + 30
    while not store.list_tree(f"{fp}/runs") and time.monotonic() < deadline:
        time.sleep(0.01)  # until its first shards are uploaded: a kill mid-write
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not visible(store, fp)
    assert len(store.list_dir(f"{fp}/runs")) == 1  # its run: garbage, but invisible
    rerun = run_writer(tmp_path, root, "finite")
    out, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, out
    assert out.split()[0] == fp and "DONE 2000" in out
    with snapstore.open(fp, root=root) as snap:
        assert len(snap) == 2000 and int(snap[1999]["x"][0]) == 1999


def test_the_hdfs_example_runs_against_the_test_server() -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "hdfs.py"
    cmd = [sys.executable, str(example), "--jobs", "3", "--samples", "1000"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "atomic create-if-absent: True" in run.stdout, run.stdout
    assert "3 jobs started the stage at once; it ran 1 time(s)" in run.stdout, run.stdout
    assert "1000 samples read shuffled" in run.stdout and "UNEXPECTED" not in run.stdout


def test_the_webhdfs_benchmark_runs() -> None:  # figures are not checked: see benchmarks/
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_webhdfs.py"
    cmd = [sys.executable, str(bench), "--samples", "2000", "--repeat", "1", "--ttfb", "0.01"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "steady state 10 ms / 0 ms:" in run.stdout, run.stdout


# -- a real NameNode, when one is given ------------------------------------------------------


class TestRealNameNode(StoreConformance):
    """The conformance suite against ``$SNAPSTORE_TEST_WEBHDFS`` (see the module docstring)."""

    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        base = os.environ.get("SNAPSTORE_TEST_WEBHDFS")
        if not base:
            pytest.skip("set SNAPSTORE_TEST_WEBHDFS=webhdfs://namenode:9870/some/dir to run")
        user = os.environ.get("SNAPSTORE_TEST_WEBHDFS_USER")
        options = {"user": user} if user else {}
        url = f"{base.rstrip('/')}/snapstore-conformance-{uuid.uuid4().hex[:12]}"
        store = open_store(url, **options)
        yield Backend(store, url, options)
        store.remove_tree("")
        store.close()
