"""Fault injection through a wrapper filesystem: transient failures on every kind of operation
are retried and survived; permanent ones raise StoreError naming the URL and what to check, and
leave nothing visible; a commit whose response was lost still counts as this writer's."""

from __future__ import annotations

import errno
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pytest
from fsspec.utils import stringify_path

import snapstore
from snapstore.errors import SnapshotNotFoundError, StoreError
from snapstore.storage.fsspec_store import _SpooledUpload
from snapstore.storage.retry import classify_failure
from snapstore.storage.store import FsspecStore, RetryPolicy, open_store
from snapstore.write.writer import WriteOptions

FAST = RetryPolicy(attempts=4, base=0.001, cap=0.005)

TRANSIENT: dict[str, Callable[[], BaseException]] = {
    "ConnectionError": lambda: ConnectionError("connection lost"),
    "TimeoutError": lambda: TimeoutError("timed out"),
    "ECONNRESET": lambda: OSError(errno.ECONNRESET, "Connection reset by peer"),
}
PERMANENT: dict[str, tuple[Callable[[], BaseException], str]] = {
    "PermissionError": (lambda: PermissionError(errno.EACCES, "403 Forbidden"), "credentials"),
    "ENOSPC": (lambda: OSError(errno.ENOSPC, "No space left on device"), "free space"),
}
OPERATIONS = ["write", "create", "read", "list", "stat", "remove"]


@dataclass
class Fault:
    """Make the next ``times`` calls of ``op`` (on paths containing ``path``) raise ``error()``;
    ``times=-1``: every call. With ``after``, the call is made first and its response "lost"."""

    op: str
    error: Callable[[], BaseException]
    times: int = 1
    after: bool = False
    path: str = ""


class FaultyFileSystem(fsspec.AbstractFileSystem):  # type: ignore[misc]
    """Passes every call to ``fs``, failing the ones its faults choose (a test double)."""

    protocol = "faulty"
    cachable = False

    def __init__(self, fs: Any, *faults: Fault) -> None:
        super().__init__()
        self.fs = fs
        self.faults = list(faults)
        self.injected: Counter[str] = Counter()  # faults raised, by operation
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return str(stringify_path(path)).removeprefix("faulty://")

    def _do(self, op: str, path: str, call: Callable[[], Any]) -> Any:
        with self._lock:
            self.calls[op] += 1
            fault = next(
                (f for f in self.faults if f.op == op and f.times != 0 and f.path in str(path)),
                None,
            )
            if fault is not None:
                fault.times -= fault.times > 0
                self.injected[op] += 1
        if fault is None:
            return call()
        if fault.after:
            call()
        raise fault.error()

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any):
        return self._do("read", path, lambda: self.fs.cat_file(path, start=start, end=end, **kw))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> None:
        op = "create" if mode == "create" else "write"
        self._do(op, path, lambda: self.fs.pipe_file(path, value, mode=mode, **kw))

    def put_file(self, lpath: str, rpath: str, **kw: Any) -> None:
        self.calls["put_file"] += 1
        self._do("write", rpath, lambda: self.fs.put_file(lpath, rpath, **kw))

    def _open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        op = "create" if "x" in mode else "write" if "w" in mode else "read"
        return self._do(op, path, lambda: self.fs.open(path, mode, **kw))

    def info(self, path: str, **kw: Any) -> Any:
        return self._do("stat", path, lambda: self.fs.info(path, **kw))

    def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
        return self._do("list", path, lambda: self.fs.ls(path, detail=detail, **kw))

    def rm(self, path: str, recursive: bool = False, maxdepth: int | None = None) -> None:
        self._do("remove", path, lambda: self.fs.rm(path, recursive=recursive, maxdepth=maxdepth))

    def rm_file(self, path: str) -> None:
        self._do("remove", path, lambda: self.fs.rm_file(path))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.fs.makedirs(path, exist_ok=exist_ok)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.fs.invalidate_cache(path)


def faulty_store(*faults: Fault, inner: FsspecStore | None = None) -> FsspecStore:
    """An FsspecStore whose filesystem fails as told (over fsspec memory by default)."""
    if inner is None:
        inner = FsspecStore(fsspec.filesystem("memory"), f"/faults-{uuid.uuid4().hex}")
    return FsspecStore(FaultyFileSystem(inner.fs, *faults), inner.root, retry=FAST)


def injected(store: FsspecStore) -> Counter[str]:
    counts: Counter[str] = store.fs.injected
    return counts


def stage(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"x": i, "v": np.full(32, i, np.int64)}


OPTIONS = WriteOptions(block_min_rows=1, block_bytes=2048, shard_bytes=8192)


def write_and_check(store: FsspecStore, n: int = 200) -> str:
    """Commit a snapshot, touch every kind of operation, and read it all back exactly."""
    snap = snapstore.snapshot(stage, root=store, options=OPTIONS)(n).materialize()
    fp = snap.fingerprint
    assert len(store.list_dir(f"{fp}/runs")) == 1
    store.write_bytes("scratch/file", b"x")
    store.remove_tree("scratch")
    with snapstore.open(fp, root=store) as back:
        assert [int(s["x"]) for s in back] == list(range(n))
        got = [(int(x), v.tolist()) for b in back.batches(16, shuffle=True) for x, v in
               zip(b["x"], b["v"])]  # fmt: skip
    assert sorted(got) == [(i, [i] * 32) for i in range(n)]
    return fp


@pytest.mark.parametrize("error", sorted(TRANSIENT))
@pytest.mark.parametrize("op", OPERATIONS)
def test_transient_faults_are_survived(op: str, error: str) -> None:
    store = faulty_store(Fault(op, TRANSIENT[error], times=3))  # within one call's 4 tries
    write_and_check(store)
    assert injected(store)[op] == 3


@pytest.mark.parametrize("where", ["memory", "gcs", "s3"])
def test_uploads_spooled_to_disk_are_retried_whole(
    where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_SpooledUpload, "spool_bytes", 1000)  # every shard spills to disk
    inner = request.getfixturevalue(f"{where}_server").store() if where != "memory" else None
    store = faulty_store(
        Fault("write", TRANSIENT["ECONNRESET"], times=3, path="shard"), inner=inner
    )
    write_and_check(store, n=60)
    assert injected(store)["write"] == 3 and store.fs.calls["put_file"] > 3


def test_transient_faults_on_every_operation_at_once() -> None:
    # Each operation's first call fails three times, once with each error, then succeeds.
    faults = [Fault(op, TRANSIENT[e]) for op in OPERATIONS for e in sorted(TRANSIENT)]
    store = faulty_store(*faults)
    write_and_check(store)
    assert all(injected(store)[op] == 3 for op in OPERATIONS), injected(store)


def test_transient_faults_that_persist_give_up_with_a_store_error() -> None:
    store = faulty_store(Fault("read", TRANSIENT["ECONNRESET"], times=-1))
    store.fs.fs.pipe_file(f"{store.root}/blob", b"data")
    with pytest.raises(StoreError, match=r"cannot read faulty://faults-\w+/blob: .* after 4 tries"):
        store.read_bytes("blob")
    assert injected(store)["read"] == 4


@pytest.mark.parametrize("error", sorted(PERMANENT))
@pytest.mark.parametrize("op", ["write", "create"])
def test_permanent_faults_fail_fast_and_leave_nothing(op: str, error: str) -> None:
    make, hint = PERMANENT[error]
    store = faulty_store(Fault(op, make, times=-1, path="/runs/" if op == "write" else ""))
    snap = snapstore.snapshot(stage, root=store, options=OPTIONS)(200)
    with pytest.raises(StoreError, match=rf"cannot \w+ faulty://faults-\w+/.*; .*{hint}") as info:
        snap.materialize()
    assert injected(store)[op] == 1  # not retried
    assert info.value.errno in (errno.EACCES, errno.ENOSPC)
    assert store.list_dir(f"{snap.fingerprint}/runs") == []  # the aborted run is gone
    with pytest.raises(SnapshotNotFoundError):
        snapstore.open(snap.fingerprint, root=store)
    store.fs.faults.clear()
    assert write_and_check(store) == snap.fingerprint  # a rerun commits


@pytest.mark.parametrize("where", ["memory", "gcs", "s3"])
def test_a_commit_whose_response_was_lost_is_ours(
    where: str, request: pytest.FixtureRequest
) -> None:
    inner = None
    if where != "memory":
        inner = request.getfixturevalue(f"{where}_server").store()
    lost = Fault("create", lambda: ConnectionResetError(errno.ECONNRESET, "reset"), after=True)
    store = faulty_store(lost, inner=inner)
    assert store.create_if_absent("fp/COMMIT", b"mine") is True
    assert injected(store)["create"] == 1 and store.read_bytes("fp/COMMIT") == b"mine"
    # Another writer's record is not ours, however the create failed on the way.
    store.fs.faults.append(Fault("create", TRANSIENT["TimeoutError"]))
    assert store.create_if_absent("fp/COMMIT", b"theirs") is False
    # Through a whole snapshot: the commit record's create is answered with an error.
    store.fs.faults.append(
        Fault("create", lambda: TimeoutError("response lost"), after=True, path="COMMIT")
    )
    write_and_check(store, n=40)
    assert injected(store)["create"] == 3


def test_the_prefetcher_does_not_retry_a_permanent_failure() -> None:
    store = faulty_store()
    fp = write_and_check(store, n=50)
    store.fs.faults.append(Fault("read", PERMANENT["PermissionError"][0], times=-1, path="shard"))
    with pytest.raises(StoreError, match="credentials"), snapstore.open(fp, root=store) as back:
        list(back.batches(10))
    assert 1 <= injected(store)["read"] <= 4  # once per request in flight, never again


def test_other_exceptions_pass_through_unretried() -> None:
    store = faulty_store(Fault("read", lambda: ValueError("a bug"), times=-1))
    store.fs.fs.pipe_file(f"{store.root}/blob", b"data")
    with pytest.raises(ValueError, match="a bug"):
        store.read_bytes("blob")
    assert injected(store)["read"] == 1


def test_every_foreign_error_is_mapped() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    botocore = pytest.importorskip("botocore.exceptions")
    gcsfs_retry = pytest.importorskip("gcsfs.retry")
    google_auth = pytest.importorskip("google.auth.exceptions")
    requests = pytest.importorskip("requests.exceptions")
    fsspec_exc = pytest.importorskip("fsspec.exceptions")

    def response_error(status: int) -> BaseException:
        return aiohttp.ClientResponseError(None, (), status=status)  # type: ignore[no-any-return]

    def client_error(status: int, code: str) -> BaseException:
        body = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return botocore.ClientError(body, "GetObject")  # type: ignore[no-any-return]

    cases: list[tuple[BaseException, str | None]] = [
        (ConnectionResetError(), "transient"),
        (TimeoutError(), "transient"),
        (fsspec_exc.FSTimeoutError(), "transient"),
        (OSError(errno.ECONNRESET, "reset"), "transient"),
        (OSError(errno.EBUSY, "SlowDown"), "transient"),  # s3fs' 503
        (aiohttp.ServerDisconnectedError(), "transient"),
        (aiohttp.ClientPayloadError("cut"), "transient"),
        (response_error(503), "transient"),
        (response_error(429), "transient"),
        (response_error(403), "permission"),
        (gcsfs_retry.HttpError({"code": 500, "message": "boom"}), "transient"),
        (gcsfs_retry.HttpError({"code": 401, "message": "no"}), "credentials"),
        (gcsfs_retry.ChecksumError(), "transient"),
        (OSError("Forbidden: https://storage.googleapis.com/b/x"), "permission"),  # gcsfs 403
        (botocore.ReadTimeoutError(endpoint_url="http://x"), "transient"),
        (botocore.EndpointConnectionError(endpoint_url="http://x"), "transient"),
        (botocore.NoCredentialsError(), "credentials"),
        (client_error(503, "SlowDown"), "transient"),
        (client_error(403, "AccessDenied"), "permission"),
        (google_auth.DefaultCredentialsError("none"), "credentials"),
        (requests.ConnectionError(), "transient"),
        (PermissionError(errno.EACCES, "denied"), "permission"),
        (OSError(errno.ENOSPC, "full"), "permanent"),
        (FileNotFoundError(), "missing"),
        (NotADirectoryError(), "missing"),
        (FileExistsError(), "exists"),
        (ValueError("a bug"), None),
        (StoreError("translated already"), None),
    ]
    for exc, kind in cases:
        assert classify_failure(exc) == kind, (exc, kind)


def test_retry_policy() -> None:
    policy = RetryPolicy(attempts=5, base=0.1, cap=0.3)
    for retry, bound in [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.3)]:
        waits = [policy.backoff(retry) for _ in range(200)]
        assert min(waits) >= 0 and max(waits) <= bound and max(waits) > bound / 2  # full jitter
    for bad in ({"attempts": 0}, {"attempts": 2.5}, {"base": -1}, {"cap": float("inf")}):
        with pytest.raises(ValueError, match="must be"):
            RetryPolicy(**bad)
    store = open_store("memory://retry-policy", retry=RetryPolicy(attempts=1))
    assert isinstance(store, FsspecStore) and store.retry.attempts == 1
