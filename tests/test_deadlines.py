"""Nothing waits for a store without end: every operation has a deadline (RetryPolicy.timeout,
$SNAPSTORE_STORE_TIMEOUT, the CLI's --store-timeout), kept by the clients' own timeouts and by
snapstore's helper threads, and a store that does not answer raises StoreTimeoutError naming
the URL, the endpoint, the operation and the seconds waited: from materialize, open, reading
and every CLI command, on GCS, S3 and WebHDFS (a blackhole TCP server as the endpoint, with a
short deadline). No timing thresholds: the deadlines are short so the tests are quick, and a
test that did hang would be stopped by faulthandler_timeout."""

from __future__ import annotations

import asyncio
import errno
import multiprocessing
import pickle
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import fsspec
import numpy as np
import pytest
from blackhole import Blackhole, DarkProxy
from fsspec.utils import stringify_path
from servers import Server
from webhdfs_server import WebHDFSServer

import snapstore
from snapstore.cli.main import main as cli_main
from snapstore.errors import StoreError, StoreTimeoutError
from snapstore.format import layout as fmt
from snapstore.manage import list_snapshots
from snapstore.storage.deadline import (
    Deadline,
    TryAbandoned,
    call_with_deadline,
    client_options,
    endpoint_of,
)
from snapstore.storage.retry import (
    DEFAULT_STORE_TIMEOUT,
    STORE_TIMEOUT_ENV,
    RetryPolicy,
    is_timeout,
)
from snapstore.storage.simulate import simulated_store
from snapstore.storage.store import FsspecStore, open_store
from snapstore.storage.travel import portable, reopen
from snapstore.write.writer import WriteOptions

SHORT = 1.5  # seconds: the deadline of the blackhole tests
# The deadline of a store that must first work through a busy 2-core machine: a reader
# opening a snapshot on moto (its requests answered, however slowly) before it goes silent.
WORKING = 4.0
OPTIONS = WriteOptions(block_min_rows=1, block_bytes=4096, shard_bytes=16384)


def stage(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"x": i, "v": np.random.default_rng(i).integers(0, 255, 512, dtype=np.uint8)}


# -- the policy, the environment variable, the pieces ---------------------------------------


def test_the_deadline_is_a_minute_by_default_and_set_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(STORE_TIMEOUT_ENV, raising=False)
    assert RetryPolicy().timeout == DEFAULT_STORE_TIMEOUT == 60.0
    monkeypatch.setenv(STORE_TIMEOUT_ENV, "12.5")
    assert RetryPolicy().timeout == 12.5
    assert RetryPolicy(timeout=3).timeout == 3  # given wins
    monkeypatch.setenv(STORE_TIMEOUT_ENV, "none")
    assert RetryPolicy().timeout is None
    for bad in ("0", "-3", "soon", "inf", "nan"):
        monkeypatch.setenv(STORE_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=rf"{STORE_TIMEOUT_ENV}=.*seconds.*'none'"):
            RetryPolicy()
    monkeypatch.delenv(STORE_TIMEOUT_ENV)
    for value in (0, -1, float("inf"), float("nan"), True, "60"):
        with pytest.raises(ValueError, match="timeout must be a finite number of seconds > 0"):
            RetryPolicy(timeout=value)  # type: ignore[arg-type]


def test_a_transfer_gets_the_time_to_move_its_bytes_at_1_mib_per_second() -> None:
    assert Deadline(60, nbytes=8 << 20).limit == 60  # small: the deadline
    big = Deadline(60, nbytes=256 << 20)
    assert big.limit == 256 and "256 s to move 256 MiB at 1 MiB/s" in big.describe()
    assert Deadline(None, nbytes=1 << 30).remaining() is None
    assert Deadline(None).describe() == "no deadline"


def test_call_with_deadline_returns_raises_and_abandons() -> None:
    assert call_with_deadline(lambda: 7, 5.0) == 7
    assert call_with_deadline(lambda: 8, None) == 8  # on the calling thread
    with pytest.raises(KeyError, match="boom"):
        call_with_deadline(lambda: {}["boom"], 5.0)
    release = threading.Event()
    try:
        with pytest.raises(TryAbandoned):
            call_with_deadline(lambda: release.wait(600), 0.2)
        stop = threading.Event()
        threading.Timer(0.1, stop.set).start()
        with pytest.raises(TryAbandoned):  # cut short: another operation found the store silent
            call_with_deadline(lambda: release.wait(600), 600.0, stop.is_set)
    finally:
        release.set()


def test_clients_get_connect_and_read_timeouts_unless_given() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    gcs = client_options("gs", {"token": "anon"}, 60)
    assert gcs["requests_timeout"] == aiohttp.ClientTimeout(sock_connect=10, sock_read=30)
    assert gcs["requests_timeout"].total is None  # a total would cut long uploads
    mine = aiohttp.ClientTimeout(total=500)
    assert client_options("gcs", {"requests_timeout": mine}, 60)["requests_timeout"] is mine
    s3 = client_options(
        "s3", {"config_kwargs": {"read_timeout": 99, "max_pool_connections": 4}}, 60
    )
    assert s3["config_kwargs"] == {"read_timeout": 99, "max_pool_connections": 4,
                                   "connect_timeout": 10}  # fmt: skip
    assert client_options("webhdfs", {}, 12)["timeout"] == (2, 6)
    assert client_options("swebhdfs", {"timeout": 5}, 12)["timeout"] == 5
    assert client_options("memory", {"x": 1}, 60) == {"x": 1}
    assert client_options("gs", {"token": "anon"}, None) == {"token": "anon"}


def test_timeouts_are_told_from_other_transient_failures() -> None:
    botocore = pytest.importorskip("botocore.exceptions")
    requests = pytest.importorskip("requests.exceptions")
    aiohttp = pytest.importorskip("aiohttp")
    fsspec_exc = pytest.importorskip("fsspec.exceptions")
    timeouts = [
        TimeoutError(),
        OSError(errno.ETIMEDOUT, "timed out"),
        fsspec_exc.FSTimeoutError(),
        aiohttp.ServerTimeoutError("read"),
        botocore.ReadTimeoutError(endpoint_url="http://x"),
        botocore.ConnectTimeoutError(endpoint_url="http://x"),
        requests.ReadTimeout(),
        requests.ConnectTimeout(),
        StoreTimeoutError("x"),
    ]
    others = [ConnectionRefusedError(), OSError(errno.ECONNRESET, "reset"), ValueError()]
    assert all(is_timeout(e) for e in timeouts), [e for e in timeouts if not is_timeout(e)]
    assert not any(is_timeout(e) for e in others)


def test_store_timeout_error_is_a_store_error_and_a_timeout_error() -> None:
    err = StoreTimeoutError("cannot read x", endpoint="http://h:1", waited=2.5)
    assert isinstance(err, StoreError) and isinstance(err, TimeoutError)
    assert isinstance(err, snapstore.SnapstoreError) and isinstance(err, OSError)
    back = pickle.loads(pickle.dumps(err))  # errors travel from worker processes
    assert str(back) == "cannot read x" and back.endpoint == "http://h:1" and back.waited == 2.5


# -- a filesystem that hangs, as fsspec's event loop can ----------------------------------------


class HangingFileSystem(fsspec.AbstractFileSystem):  # type: ignore[misc]
    """Passes every call to ``fs``; the operations in ``hang`` (on paths containing ``where``)
    block until :attr:`release` is set (then run: a create that lands late), or raise
    ``TimeoutError`` after ``slow`` seconds when ``slow`` is set. A test double for a store
    that does not answer."""

    protocol = "hanging"
    cachable = False

    def __init__(self, fs: Any, *hang: str, where: str = "", slow: float | None = None) -> None:
        super().__init__()
        self.fs, self.hang, self.where, self.slow = fs, set(hang), where, slow
        self.release = threading.Event()
        self.calls: Counter[str] = Counter()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return str(stringify_path(path)).removeprefix("hanging://")

    def _do(self, op: str, call: Callable[[], Any], path: str = "") -> Any:
        self.calls[op] += 1
        if op in self.hang and self.where in path:
            if self.slow is not None:
                self.release.wait(self.slow)
                raise TimeoutError(f"{op}: no answer in {self.slow} s")
            self.release.wait()
        return call()

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any):
        return self._do("read", lambda: self.fs.cat_file(path, start=start, end=end, **kw), path)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> None:
        op = "create" if mode == "create" else "write"
        self._do(op, lambda: self.fs.pipe_file(path, value, mode=mode, **kw), path)

    def put_file(self, lpath: str, rpath: str, **kw: Any) -> None:
        self._do("write", lambda: self.fs.put_file(lpath, rpath, **kw))

    def info(self, path: str, **kw: Any) -> Any:
        return self._do("stat", lambda: self.fs.info(path, **kw))

    def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
        return self._do("list", lambda: self.fs.ls(path, detail=detail, **kw))

    def rm(self, path: str, recursive: bool = False, maxdepth: int | None = None) -> None:
        self._do("remove", lambda: self.fs.rm(path, recursive=recursive, maxdepth=maxdepth))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.fs.makedirs(path, exist_ok=exist_ok)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.fs.invalidate_cache(path)


@pytest.fixture
def hanging() -> Iterator[Callable[..., FsspecStore]]:
    """Makes FsspecStores over a HangingFileSystem over fsspec memory; releases them all after."""
    made: list[HangingFileSystem] = []

    def make(
        *hang: str, timeout: float = 0.6, slow: float | None = None, where: str = "",
        attempts: int = 4,
    ) -> FsspecStore:  # fmt: skip
        fs = HangingFileSystem(fsspec.filesystem("memory"), *hang, where=where, slow=slow)
        made.append(fs)
        policy = RetryPolicy(attempts=attempts, base=0.001, cap=0.005, timeout=timeout)
        return FsspecStore(fs, f"/deadlines-{uuid.uuid4().hex}", retry=policy)

    yield make
    for fs in made:
        fs.release.set()


def test_a_call_that_hangs_ends_with_a_clear_error(hanging: Callable[..., FsspecStore]) -> None:
    store = hanging("read")
    store.fs.fs.pipe_file(f"{store.root}/fp/COMMIT", b"{}")
    with pytest.raises(StoreTimeoutError) as info:
        store.read_bytes("fp/COMMIT")
    message = str(info.value)
    assert message.startswith(f"cannot read {store.join('fp/COMMIT')} (the commit record of fp)")
    assert f"no answer from {store.endpoint} in 0.6 s (1 try, the deadline is 0.6 s)" in message
    assert f"{STORE_TIMEOUT_ENV}=SECONDS" in message and "--store-timeout" in message
    assert info.value.errno == errno.ETIMEDOUT and info.value.waited >= 0.6


def test_retries_stop_when_the_deadline_is_spent(hanging: Callable[..., FsspecStore]) -> None:
    store = hanging("list", timeout=0.5, slow=0.1, attempts=1000)
    with pytest.raises(StoreTimeoutError, match=r"cannot list .*tries, the deadline is 0.5 s"):
        store.list_dir("")
    assert 1 < store.fs.calls["list"] < 1000


def test_a_silent_store_fails_the_next_operations_at_once(
    hanging: Callable[..., FsspecStore],
) -> None:
    store = hanging("read", "stat", timeout=0.6)
    with pytest.raises(StoreTimeoutError):
        store.read_bytes("a")
    # Within a sixth of the deadline of that, the next operation is not sent at all.
    with pytest.raises(StoreTimeoutError, match=r"by another operation .* not sent") as info:
        store.exists("b")
    assert store.fs.calls["stat"] == 0 and info.value.waited >= 0.6
    # Once the store answers (the window past), operations run again.
    store.fs.hang.clear()
    threading.Event().wait(0.15)
    assert store.exists("b") is False and store.fs.calls["stat"] == 1


def test_operations_in_flight_stop_waiting_when_the_store_is_found_silent(
    hanging: Callable[..., FsspecStore],
) -> None:
    store = hanging("read", "stat", timeout=0.6)
    errors: list[BaseException] = []

    def big_read() -> None:  # 1 GiB: 1024 s of its own; it ends with the other one
        try:
            store.read_range("shard", 0, 1 << 30)
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=big_read)
    reader.start()
    with pytest.raises(StoreTimeoutError):
        store.exists("x")
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], StoreTimeoutError)
    assert "1024 s to move 1024 MiB" in str(errors[0])


def test_a_commit_that_gets_no_answer_leaves_its_run_whole(
    hanging: Callable[..., FsspecStore],
) -> None:
    # The record's create may land after the writer gave up on it: it must find a whole run.
    store = hanging("create", timeout=0.8, where=fmt.COMMIT_NAME)
    snap = snapstore.snapshot(stage, root=store, options=OPTIONS)(300)
    with pytest.raises(StoreTimeoutError, match=r"cannot commit .*/COMMIT \(the commit record"):
        snap.materialize()
    assert not store.fs.fs.exists(f"{store.root}/{snap.fingerprint}/{fmt.COMMIT_NAME}")
    store.fs.release.set()  # the create lands now, on the thread that was left behind
    store.fs.hang.clear()
    for _ in range(200):
        if store.fs.fs.exists(f"{store.root}/{snap.fingerprint}/{fmt.COMMIT_NAME}"):
            break
        threading.Event().wait(0.05)
    reader = FsspecStore(store.fs.fs, store.root)  # another job, which reads the snapshot
    with snapstore.open(snap.fingerprint, root=reader) as back:
        assert sorted(int(s["x"]) for s in back) == list(range(300))


def test_in_process_filesystems_get_no_helper_thread() -> None:
    store = open_store(f"memory://deadlines-{uuid.uuid4().hex}")
    assert isinstance(store, FsspecStore) and not store._watched
    store.write_bytes("a", b"x")
    assert store.read_bytes("a") == b"x"
    # The latency simulator over memory only sleeps; an unknown wrapper may hang.
    assert not simulated_store(f"memory://deadlines-{uuid.uuid4().hex}", ttfb=0.001)._watched
    assert FsspecStore(HangingFileSystem(fsspec.filesystem("memory")), "/x")._watched


# -- real clients against a blackhole --------------------------------------------------------


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    with Blackhole() as hole:
        yield hole


def blackhole_root(kind: str, hole: Blackhole) -> tuple[str, dict[str, Any]]:
    """A root on ``kind``'s client whose endpoint is the blackhole."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    if kind == "gcs":
        pytest.importorskip("gcsfs")
        return f"gs://bucket/{prefix}", {"endpoint_url": hole.endpoint, "token": "anon"}
    if kind == "s3":
        pytest.importorskip("s3fs")
        return f"s3://bucket/{prefix}", {"endpoint_url": hole.endpoint, "key": "k",
                                          "secret": "s"}  # fmt: skip
    return f"webhdfs://127.0.0.1:{hole.port}/{prefix}", {}


KINDS = ["gcs", "s3", "webhdfs"]


@pytest.mark.parametrize("kind", KINDS)
def test_materialize_against_a_blackhole(kind: str, blackhole: Blackhole) -> None:
    url, options = blackhole_root(kind, blackhole)
    store = open_store(url, retry=RetryPolicy(timeout=SHORT), **options)
    snap = snapstore.snapshot(stage, root=store)(10)
    with pytest.raises(StoreTimeoutError) as info:
        snap.materialize()
    message = str(info.value)
    assert f"no answer from {blackhole.endpoint} in " in message
    assert f"(the commit record of {snap.fingerprint})" in message
    assert f"the deadline is {SHORT:g} s" in message
    assert info.value.endpoint == blackhole.endpoint and blackhole.connections >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_declaring_input_files_on_a_blackhole(
    kind: str, blackhole: Blackhole, monkeypatch: pytest.MonkeyPatch
) -> None:
    # snapstore.files() lists the stage's input bucket through fsspec itself: it waited
    # without end on an endpoint that never answers.
    monkeypatch.setenv(STORE_TIMEOUT_ENV, str(SHORT))
    url, options = blackhole_root(kind, blackhole)
    with pytest.raises(StoreTimeoutError) as info:
        snapstore.files(f"{url}/raw/*.jpg", storage_options=options)
    assert "files(): listing" in str(info.value) and f"from {blackhole.endpoint} in " in str(
        info.value
    )
    assert info.value.endpoint == blackhole.endpoint and blackhole.connections >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_open_against_a_blackhole(
    kind: str, blackhole: Blackhole, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STORE_TIMEOUT_ENV, str(SHORT))  # the environment's deadline
    url, options = blackhole_root(kind, blackhole)
    store = open_store(url, **options)
    with pytest.raises(StoreTimeoutError) as info:
        snapstore.open("abc123", root=store)
    assert str(info.value).startswith(f"cannot read {url}/abc123/COMMIT (the commit record")
    assert f"no answer from {blackhole.endpoint} in " in str(info.value)
    with pytest.raises(StoreTimeoutError, match=f"the deadline is {SHORT:g} s"):
        list_snapshots(open_store(url, **options))


@pytest.mark.parametrize("kind", ["gcs", "s3"])
def test_an_upload_to_a_blackhole_ends(kind: str, blackhole: Blackhole) -> None:
    # The blackhole reads nothing: an upload larger than the sockets' buffers stalls in send(),
    # which aiohttp never times out; the helper thread's deadline ends it all the same.
    url, options = blackhole_root(kind, blackhole)
    store = open_store(url, retry=RetryPolicy(timeout=SHORT), **options)
    with pytest.raises(StoreTimeoutError, match=r"cannot write .*/blob: no answer from"):
        store.write_bytes("blob", bytes(2 << 20))


@pytest.mark.parametrize("kind", ["gcs", "s3"])
def test_a_read_given_up_is_cancelled_on_the_drivers_loop(kind: str, blackhole: Blackhole) -> None:
    # gcsfs and s3fs reads run as coroutines on fsspec's loop: given up, nothing stays running.
    url, options = blackhole_root(kind, blackhole)
    store = open_store(url, retry=RetryPolicy(timeout=SHORT), **options)
    assert isinstance(store, FsspecStore) and store._on_loop
    with pytest.raises(StoreTimeoutError, match="cannot read"):
        store.read_range("shard", 0, 4096)

    async def reads_running() -> list[str]:
        await asyncio.sleep(0.1)  # let the cancellation run
        return [
            repr(t.get_coro())
            for t in asyncio.all_tasks()
            if "_DriverCall.coroutine" in repr(t.get_coro())
        ]

    loop = store.fs.loop
    assert asyncio.run_coroutine_threadsafe(reads_running(), loop).result(timeout=30) == []


def test_the_deadline_travels_to_worker_processes(blackhole: Blackhole) -> None:
    url, options = blackhole_root("gcs", blackhole)
    store = open_store(url, retry=RetryPolicy(timeout=SHORT), **options)
    recipe = pickle.loads(pickle.dumps(portable(store, "a test")))
    again = reopen(recipe)
    assert isinstance(again, FsspecStore) and again.retry.timeout == SHORT
    assert again.fs.requests_timeout == store.fs.requests_timeout  # the client's own timeouts
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        message = pool.apply(_list_in_a_child, (recipe,))
    assert f"no answer from {blackhole.endpoint}" in message
    assert f"the deadline is {SHORT:g} s" in message


def _list_in_a_child(recipe: tuple[Any, ...]) -> str:
    try:
        reopen(recipe).list_dir("")
    except StoreTimeoutError as exc:
        return str(exc)
    return "no error"


# -- a store that goes silent while it is read ------------------------------------------------


def _proxied_root(
    kind: str, request: pytest.FixtureRequest
) -> tuple[str, dict[str, Any], DarkProxy]:
    if kind == "webhdfs":
        server: WebHDFSServer = request.getfixturevalue("webhdfs_server")
        url, options = server.fresh_root()
        proxy = DarkProxy(("127.0.0.1", server.port))
        # The NameNode redirects reads to its own address: those go through the proxy too.
        options["data_proxy"] = {f"127.0.0.1:{server.port}": f"127.0.0.1:{proxy.port}"}
        return url.replace(f":{server.port}", f":{proxy.port}"), options, proxy
    bucket: Server = request.getfixturevalue(f"{kind}_server")
    url, options = bucket.root()
    proxy = DarkProxy(("127.0.0.1", int(bucket.endpoint.rsplit(":", 1)[1])))
    options["endpoint_url"] = proxy.endpoint
    return url, options, proxy


@pytest.mark.parametrize("kind", KINDS)
def test_reading_from_a_store_that_goes_silent(kind: str, request: pytest.FixtureRequest) -> None:
    url, options, proxy = _proxied_root(kind, request)
    with proxy:
        snap = snapstore.snapshot(stage, root=open_store(url, **options), options=OPTIONS)
        fingerprint = snap(400).materialize().fingerprint
        store = open_store(url, retry=RetryPolicy(timeout=WORKING), **options)
        with snapstore.open(fingerprint, root=store) as back:
            batches = back.batches(16, prefetch_bytes=32 << 10)
            proxy.go_dark()
            with pytest.raises(StoreTimeoutError, match=rf"no answer from {proxy.endpoint}"):
                for _ in batches:
                    pass


@pytest.mark.parametrize("kind", ["gcs", "s3"])
def test_materialize_into_a_store_that_goes_silent_commits_nothing(
    kind: str, request: pytest.FixtureRequest
) -> None:
    url, options, proxy = _proxied_root(kind, request)

    def going_dark(n: int) -> Iterator[dict[str, Any]]:
        for i, sample in enumerate(stage(n)):
            if i == n // 2:
                proxy.go_dark()
            yield sample

    with proxy:
        store = open_store(url, retry=RetryPolicy(timeout=SHORT), **options)
        snap = snapstore.snapshot(going_dark, root=store, options=OPTIONS)
        with pytest.raises(StoreTimeoutError, match=rf"no answer from {proxy.endpoint}"):
            snap(400).materialize()
    fingerprint = snap(400).fingerprint
    direct = open_store(url, **{**options, "endpoint_url": request.getfixturevalue(
        f"{kind}_server").endpoint})  # fmt: skip
    assert not direct.exists(f"{fingerprint}/{fmt.COMMIT_NAME}")


# -- the CLI ------------------------------------------------------------------------------------

CLI_COMMANDS = [
    ["ls"],
    ["info", "abc123"],
    ["diff", "abc123", "def456"],
    ["rm", "abc123"],
    ["gc", "--keep-last", "1"],
    ["cp", "abc123", "DEST"],
    ["head", "abc123"],
    ["bench", "abc123"],
    ["du"],
    ["verify", "abc123"],
]


@pytest.mark.parametrize("command", CLI_COMMANDS, ids=lambda c: c[0])
def test_every_cli_command_says_the_store_did_not_answer(
    command: list[str], blackhole: Blackhole, tmp_path: Any
) -> None:
    from click.testing import CliRunner

    url, options = blackhole_root("gcs", blackhole)
    args = ["--root", url, "--store-timeout", str(SHORT)]
    args += [f"-o{k}={v}" for k, v in options.items()]
    args += [str(tmp_path / "dest") if a == "DEST" else a for a in command]
    result = CliRunner().invoke(cli_main, args)
    assert result.exit_code == 1, result.output
    assert "error: cannot " in result.output, result.output
    assert f"no answer from {blackhole.endpoint} in " in result.output
    assert f"the deadline is {SHORT:g} s" in result.output
    assert "Traceback" not in result.output


def test_the_cli_reads_the_deadline_from_the_environment(blackhole: Blackhole) -> None:
    from click.testing import CliRunner

    url, options = blackhole_root("s3", blackhole)
    args = ["--root", url, *[f"-o{k}={v}" for k, v in options.items()], "ls"]
    result = CliRunner().invoke(cli_main, args, env={STORE_TIMEOUT_ENV: "1.25"})
    assert result.exit_code == 1 and "the deadline is 1.25 s" in result.output, result.output
    bad = CliRunner().invoke(cli_main, ["--store-timeout", "0", "ls"])
    assert bad.exit_code == 2 and "--store-timeout" in bad.output


def test_endpoint_names(blackhole: Blackhole) -> None:
    for kind in KINDS:
        url, options = blackhole_root(kind, blackhole)
        store = open_store(url, **options)
        assert isinstance(store, FsspecStore) and store.endpoint == blackhole.endpoint
    assert endpoint_of(object(), "s3").startswith("https://s3.amazonaws.com")
    assert endpoint_of(object(), "gs") == "https://storage.googleapis.com"
