"""The fsspec store: GCS, S3, memory, HDFS, and wrappers around them, through fsspec.

Create-if-absent is asked of the service (GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``)
or, for fsspec's memory filesystem, held under a process-wide lock;
:data:`ATOMIC_CREATE_PROTOCOLS` lists where it is atomic, and elsewhere (``hdfs://``) the store
warns once. Transient failures (timeouts, resets, HTTP 429 and 5xx) are retried under a
:class:`~snapstore.storage.retry.RetryPolicy`, within its deadline (see
:mod:`snapstore.storage.deadline`; a store that does not answer raises
:class:`~snapstore.errors.StoreTimeoutError`); anything else becomes
:class:`~snapstore.errors.StoreError` naming the URL.
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import logging
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import IO, Any, TypeVar, cast

from fsspec.asyn import AsyncFileSystem

from ..errors import StoreError, StoreTimeoutError
from ..format import layout as fmt
from ..oldpaths import historic_name
from .base import Store
from .deadline import (
    Deadline,
    Silence,
    TryAbandoned,
    await_with_deadline,
    call_with_deadline,
    endpoint_of,
)
from .local import OS_ERROR_HINTS, translated
from .retry import (
    KIND_ERRNOS,
    KIND_HINTS,
    STORE_TIMEOUT_ENV,
    RetryPolicy,
    classify_failure,
    http_status,
    is_throttled,
    is_timeout,
    no_such_bucket,
    retry_after,
    vanished_error,
)
from .trees import find_tree

__all__ = ["ATOMIC_CREATE_PROTOCOLS", "FsspecStore"]

log = logging.getLogger(historic_name(__name__))

T = TypeVar("T")

# Protocols whose create-if-absent is atomic for every writer that can see the store: GCS
# (ifGenerationMatch=0) and S3 (If-None-Match: *) refuse a second create on the service, a local
# filesystem creates with O_EXCL, and fsspec's memory filesystem (one process) creates under
# _CREATE_LOCK. HDFS over WebHDFS creates with overwrite=false, through snapstore's driver (its
# ``snapstore_atomic_create``; fsspec's own checks, then writes). A wrapper (DirFileSystem, the
# latency simulator) is judged by its ``fs``.
ATOMIC_CREATE_PROTOCOLS = frozenset({"memory", "gs", "gcs", "s3", "s3a", "file", "local"} | {
    "webhdfs", "swebhdfs"})  # fmt: skip
_WEBHDFS = frozenset({"webhdfs", "swebhdfs"})
_ADVICE = dict.fromkeys(("hdfs", "arrow_hdfs"), ", or use the WebHDFS URL of the same NameNode "
                        "(webhdfs://NAMENODE:9870/PATH), whose commits are atomic")  # fmt: skip
# No directories, so no makedirs (s3fs' would create a missing bucket, hiding a typo).
_OBJECT_STORES = frozenset({"gs", "gcs", "s3", "s3a"})
# Filesystems whose calls cannot hang on a network: no helper thread for their deadline.
_IN_PROCESS = frozenset({"memory", "file", "local"})
_CREATE_LOCK = threading.Lock()
_WARNED: set[str] = set()  # protocols already warned about (once per process)


def _innermost(fs: Any) -> Any:
    """The filesystem that holds the data, through wrappers that keep theirs in ``fs``."""
    for _ in range(8):
        inner = getattr(fs, "fs", None)
        if _protocol(fs) in ATOMIC_CREATE_PROTOCOLS or not hasattr(inner, "protocol"):
            break
        fs = inner
    return fs


def _protocol(fs: Any) -> str:
    return str(fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0])


def _may_hang(fs: Any) -> bool:
    """Whether a call of ``fs`` may wait on a network: not for a local or memory filesystem,
    nor wrappers over one that say theirs never do (``snapstore_in_process``)."""
    for _ in range(8):
        if _protocol(fs) in _IN_PROCESS:
            return False
        if not getattr(type(fs), "snapstore_in_process", False) or not hasattr(fs, "fs"):
            return True
        fs = fs.fs
    return True


def _past_end(exc: BaseException) -> bool:
    """Whether a range read failed for starting past the end (HTTP 416; s3fs: EINVAL)."""
    names = {f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__}
    s3_416 = isinstance(exc, OSError) and exc.errno == errno.EINVAL
    return http_status(exc, names) == 416 or (s3_416 and "range" in str(exc).lower())


class _DriverCall:
    """``fs.<name>(*args, **kwargs)``, a call of the driver that :meth:`FsspecStore._call` runs
    as the coroutine ``fs._<name>`` on the driver's event loop where it has one (gcsfs, s3fs),
    so that a deadline cancels it there; else on a helper thread. With ``empty_past_end``, a
    range past the end reads as empty, as a local slice does; ``before`` runs before each try
    (a spool rewound)."""

    def __init__(
        self, fs: Any, name: str, *args: Any, empty_past_end: bool = False,
        before: Callable[[], object] | None = None, **kw: Any,
    ) -> None:  # fmt: skip
        self.fs, self.name, self.args, self.kwargs = fs, name, args, kw
        self.empty_past_end, self.before = empty_past_end, before

    def __call__(self) -> Any:
        if self.before is not None:
            self.before()
        try:
            return getattr(self.fs, self.name)(*self.args, **self.kwargs)
        except Exception as exc:
            if self.empty_past_end and _past_end(exc):
                return b""
            raise

    async def coroutine(self) -> Any:
        if self.before is not None:
            self.before()
        try:
            return await getattr(self.fs, f"_{self.name}")(*self.args, **self.kwargs)
        except Exception as exc:
            if self.empty_past_end and _past_end(exc):
                return b""
            raise


def _what(path: str) -> str:
    """What a store path is, for messages: ``" (the commit record of FP)"``, or ``""``."""
    parts = path.strip("/").split("/")
    if not parts[0]:
        return " (the root)"
    if len(parts) == 2 and parts[1] == fmt.COMMIT_NAME:
        return f" (the commit record of {parts[0]})"
    if len(parts) == 4 and parts[1] == "runs":
        kind = {fmt.MANIFEST_NAME: "manifest", fmt.INDEX_NAME: "block index"}.get(parts[3])
        return f" (the {kind or 'shard ' + parts[3]} of {parts[0]})"
    return ""


class _SpooledUpload:
    """A file for :meth:`FsspecStore.open_write`: spooled in memory, past 8 MiB in a temporary
    file, and uploaded whole on close, so that a failed upload can be retried (a streamed one
    cannot be, once a part is sent; and gcsfs and s3fs hold 50 MiB parts in memory)."""

    spool_bytes = 8 << 20

    def __init__(self, store: FsspecStore, path: str) -> None:
        self._store, self._path = store, path
        self._spool: Any = io.BytesIO()
        self._url = f"{store.join(path)} (spooled in {tempfile.gettempdir()})"
        self.closed = False

    def write(self, data: Any) -> int:
        with translated("write", self._url):
            spool, size = self._spool, memoryview(data).nbytes
            if isinstance(spool, io.BytesIO) and spool.tell() + size > self.spool_bytes:
                # Unnamed: it goes with the process, even a killed one (no leak in /tmp).
                self._spool = tempfile.TemporaryFile(prefix="snapstore-upload-")  # noqa: SIM115
                self._spool.write(spool.getbuffer())
            return int(self._spool.write(data))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        spool = self._spool
        try:
            with translated("write", self._url):
                spool.flush()
            self._store._upload(
                self._path, spool.getvalue() if isinstance(spool, io.BytesIO) else spool
            )
        finally:
            spool.close()

    def __enter__(self) -> _SpooledUpload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FsspecStore(Store):
    """A store on any fsspec filesystem: GCS, S3, memory, HDFS, and wrappers around them.

    Operations retry transient failures under ``retry``, each operation within its ``timeout``
    (after which :class:`~snapstore.errors.StoreTimeoutError` names the URL, the endpoint and the
    seconds waited); other failures raise :class:`StoreError` naming the URL (a missing file
    stays ``FileNotFoundError``).
    :meth:`open_write` spools locally and uploads whole on close, so an upload can be retried.
    Listings are never served from fsspec's listings cache (other processes make it stale), and
    reads never ask it whether a file exists (``open_store`` turns it off for GCS and S3; s3fs'
    ``cat_file`` consults it otherwise).
    ``atomic_create`` says whether the protocol of the filesystem holding the data is in
    :data:`ATOMIC_CREATE_PROTOCOLS`.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The filesystem.
    root : str
        The root path inside ``fs`` (no protocol), e.g. ``"bucket/snaps"``.
    retry : RetryPolicy, optional
        How transient failures are retried, and how long one operation may take; default
        ``RetryPolicy()`` (60 s, or ``$SNAPSTORE_STORE_TIMEOUT``). The filesystem's own
        connect and read timeouts are set by :func:`~snapstore.storage.store.open_store`;
        given a filesystem made elsewhere, set them there.
    """

    def __init__(self, fs: Any, root: str, *, retry: RetryPolicy | None = None) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.retry = retry if retry is not None else RetryPolicy()
        self._throttles = 0
        self.budget = self.retry.new_budget()
        """The store's :class:`~snapstore.storage.retry.RetryBudget` (None: no budget)."""
        protocol = _protocol(fs)
        self.url = f"{protocol}://{self.root.lstrip('/')}" if protocol != "file" else self.root
        inner = _innermost(fs)
        self.protocol = _protocol(inner)
        self._create_on_service = self.protocol in _OBJECT_STORES or bool(
            getattr(inner, "snapstore_atomic_create", False)
        )
        self.atomic_create = self.protocol in ATOMIC_CREATE_PROTOCOLS and (
            self.protocol not in _WEBHDFS or self._create_on_service
        )
        self._watched = _may_hang(fs)
        self._silence = Silence()
        # gcsfs and s3fs used directly: calls of the driver run on its event loop.
        self._on_loop = isinstance(fs, AsyncFileSystem) and not fs.asynchronous

    @property
    def throttles(self) -> int:
        """429/503 answers seen (retried or not), those the driver retried itself included
        where it counts them (:mod:`snapstore.storage.gcs`): the prefetcher's signal to slow
        down."""
        return self._throttles + int(getattr(self.fs, "throttles", 0))

    @property
    def endpoint(self) -> str:
        """The service requests go to (``http://host:port``), for messages."""
        return endpoint_of(_innermost(self.fs), self.protocol)

    def _path(self, path: str) -> str:
        return f"{self.root}/{path}"

    def _call(
        self, op: str, path: str, fn: Callable[[], T], *, write: bool = False, nbytes: int = 0
    ) -> T:
        """``fn()``, with transient failures retried within the deadline (of ``nbytes`` moved)
        and the rest translated; at once a StoreTimeoutError while the store is silent."""
        deadline = Deadline(self.retry.timeout, nbytes)
        if self._silence.recent(self.retry.timeout) is not None:
            raise self._timeout_error(op, path, deadline, 0, None)
        for attempt in itertools.count(1):
            stop = partial(self._silence.since, time.monotonic())
            try:
                limit = deadline.remaining() if self._watched else None
                if self._on_loop and isinstance(fn, _DriverCall):
                    result = cast(T, await_with_deadline(self.fs.loop, fn.coroutine, limit, stop))
                else:
                    result = call_with_deadline(fn, limit, stop)
                self._silence.clear()
                if self.budget is not None:
                    self.budget.deposit()
                return result
            except TryAbandoned:
                raise self._timeout_error(op, path, deadline, attempt, None) from None
            except Exception as exc:
                kind = classify_failure(exc)
                why: str | None = f"RetryPolicy.attempts is {self.retry.attempts}"
                if kind == "transient" and is_throttled(exc):
                    self._throttles += 1  # the prefetcher adapts to it (not exact across threads)
                if kind == "transient" and attempt < self.retry.attempts:
                    wait = self.retry.delay(attempt, exc)
                    why = self._may_retry(wait, deadline, exc)
                    if why is None:
                        self._log_retry(op, path, attempt, exc, deadline)
                        time.sleep(wait)
                        continue
                if kind == "transient" and (is_timeout(exc) or not deadline.allows(0.0)):
                    raise self._timeout_error(op, path, deadline, attempt, exc) from exc
                if kind == "transient":
                    raise self._gave_up(op, path, exc, attempt, why or "") from exc
                if kind not in (None, "transient"):
                    self._silence.clear()  # an answer, if not the one hoped for
                if kind is None or kind == "exists":
                    raise
                if kind == "missing" and (write or no_such_bucket(exc)):
                    kind = "bucket" if self.protocol in _OBJECT_STORES else "location"
                elif kind == "missing":
                    if isinstance(exc, FileNotFoundError):
                        raise
                    raise FileNotFoundError(errno.ENOENT, str(exc), self.join(path)) from exc
                raise self._error(op, path, exc, kind, attempt) from exc
        raise AssertionError("unreachable: the loop returns or raises")

    def _may_retry(self, wait: float, deadline: Deadline, exc: BaseException) -> str | None:
        """Why a transient failure is not retried after ``wait`` seconds (None: it is)."""
        hint = retry_after(exc)
        if hint is not None and hint > self.retry.max_retry_after:
            return f"the store asked to wait {hint:g} s, over max_retry_after"
        if not deadline.allows(wait):
            return f"a wait of {wait:.2f} s would pass the deadline ({deadline.describe()})"
        if self.budget is not None and not self.budget.withdraw(is_timeout(exc)):
            return (
                f"the store's retry budget is spent: {self.budget.spent} retries taken, "
                f"{self.budget.refused} refused"
            )
        return None

    def _gave_up(self, op: str, path: str, exc: BaseException, tries: int, why: str) -> StoreError:
        """The error of an operation whose transient failures were not retried further."""
        err = self._error(op, path, exc, "transient", tries)
        answer = self._answer(exc)
        plural = "try" if tries == 1 else "tries"
        message = (
            f"cannot {op} {self.join(path)}{_what(path)}: gave up after {tries} {plural} "
            f"({why}); the last answer: {answer}; {str(err).rsplit('; ', 1)[-1]}, or "
            "allow more with RetryPolicy(attempts=..., budget=...)"
        )
        gave_up = StoreError(message)
        gave_up.errno = err.errno
        gave_up.throttled = is_throttled(exc)  # type: ignore[attr-defined]
        return gave_up

    def _answer(self, exc: BaseException) -> str:
        """The store's answer that ``exc`` stands for, in a few words: its HTTP status or its
        type, and its first line."""
        names = {f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__}
        status = http_status(exc, names)
        answer = f"HTTP {status}" if status is not None else type(exc).__name__
        said = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        text = said.strip().splitlines()
        return answer + (f" ({text[0]})" if text else "")

    def _error(self, op: str, path: str, exc: BaseException, kind: str, tries: int) -> StoreError:
        detail = (exc.strerror if isinstance(exc, OSError) else None) or str(exc).strip()
        detail = detail.splitlines()[0] if detail else type(exc).__name__
        detail = "not found" if kind in ("bucket", "location") else detail  # gcsfs: a bare URL
        hint = KIND_HINTS[kind]
        if kind == "permanent" and isinstance(exc, OSError):
            hint = OS_ERROR_HINTS.get(exc.errno or 0, hint)
        if kind == "transient":
            hint = f"gave up after {tries} tries; {hint}"
        err = StoreError(f"cannot {op} {self.join(path)}: {detail}; {hint}")
        err.errno = getattr(exc, "errno", None) or KIND_ERRNOS.get(kind)
        return err

    def _timeout_error(
        self, op: str, path: str, deadline: Deadline, tries: int, exc: BaseException | None
    ) -> StoreTimeoutError:
        """The error of an operation that got no answer, which makes the store silent; or,
        with ``tries`` 0, of one not tried because the store is silent."""
        waited, ago = deadline.elapsed(), self._silence.recent(self.retry.timeout)
        if tries == 0:  # the time the store's last operation waited, not this one's 0 s
            waited = self._silence.waited
            how = f"by another operation {ago or 0:.1f} s ago; this one was not sent"
        else:
            last = f"; the last try: {type(exc).__name__}" if exc is not None else ""
            plural = "try" if tries == 1 else "tries"
            how = f"{tries} {plural}, {deadline.describe()}{last}"
            self._silence.mark(waited)
        err = StoreTimeoutError(
            f"cannot {op} {self.join(path)}{_what(path)}: no answer from {self.endpoint} in "
            f"{waited:.1f} s ({how}); check the network and the endpoint's host and port (a "
            "firewall that drops packets, or a wrong port behind a proxy, looks like this), or "
            f"allow longer with {STORE_TIMEOUT_ENV}=SECONDS, RetryPolicy(timeout=SECONDS) or "
            "the CLI's --store-timeout",
            endpoint=self.endpoint,
            waited=waited,
        )
        err.errno = errno.ETIMEDOUT
        return err

    def _log_retry(
        self, op: str, path: str, attempt: int, exc: BaseException, deadline: Deadline
    ) -> None:
        # A store that stops answering is said while it is waited for, not only at the end.
        if not is_timeout(exc):
            log.debug("retry %d of %s %s after %r", attempt, op, self.join(path), exc)
            return
        log.warning(
            "snapstore: no answer from %s to %s %s after %.1f s (%s); trying again (%s)",
            self.endpoint, op, self.join(path), deadline.elapsed(), type(exc).__name__,
            deadline.describe(),
        )  # fmt: skip

    def _forget(self, target: str) -> None:
        self.fs.invalidate_cache(target)  # another process may have written since

    # -- reads ---------------------------------------------------------------------------------

    def read_bytes(self, path: str) -> bytes:
        target = self._path(path)
        self._forget(target)  # s3fs' cat_file asks its listings cache whether the file exists
        data = self._call("read", path, _DriverCall(self.fs, "cat_file", target))
        return bytes(data)

    def read_range(self, path: str, start: int, length: int) -> Any:
        if length <= 0:
            return b""  # no request (S3 refuses an empty range)
        # One request; keywords, since s3fs' third positional parameter is version_id.
        fetch = _DriverCall(self.fs, "cat_file", self._path(path), start=start,
                            end=start + length, empty_past_end=True)  # fmt: skip
        return self._call("read", path, fetch, nbytes=length)

    def exists(self, path: str) -> bool:
        return self._info(path) is not None

    def is_dir(self, path: str) -> bool:
        return (self._info(path) or {}).get("type") == "directory"

    def _info(self, path: str) -> dict[str, Any] | None:
        # Not fs.exists or fs.isdir: they turn every error (a timeout, a 403) into False.
        target = self._path(path)
        self._forget(target)
        with contextlib.suppress(FileNotFoundError):
            return dict(self._call("stat", path, _DriverCall(self.fs, "info", target)))
        return None

    def list_dir(self, path: str) -> list[str]:
        target = self._path(path)
        self._forget(target)
        try:
            entries = self._call("list", path, _DriverCall(self.fs, "ls", target, detail=False))
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})
        return [n for n in names if n]

    def size(self, path: str) -> int:
        target = self._path(path)
        return int(self._call("stat", path, _DriverCall(self.fs, "size", target)))

    def list_tree(self, path: str, prefix: str = "") -> dict[str, int]:
        target = self._path(path).rstrip("/")
        self._forget(target)
        return self._call("list", path, lambda: find_tree(self.fs, target, prefix))

    def disk_usage(self, path: str) -> int:
        # One recursive listing (a single paged request on object stores), not one per file.
        target = self._path(path)

        def usage() -> int:
            self.fs.invalidate_cache(target)
            try:
                return int(self.fs.du(target, total=True))
            except FileNotFoundError:
                return 0

        return int(self._call("list", path, usage))

    # -- writes --------------------------------------------------------------------------------

    def open_write(self, path: str) -> IO[bytes]:
        self._warn_if_unsafe()  # now, not when the first shard is closed
        return _SpooledUpload(self, path)  # type: ignore[return-value]

    def write_bytes(self, path: str, data: bytes) -> None:
        self._upload(path, bytes(data))

    def _upload(self, path: str, source: bytes | IO[bytes]) -> None:
        """One whole upload, retried: of ``source``, bytes or a spooled file."""
        target = self._path(path)
        self._warn_if_unsafe()
        self._makedirs(path)
        if isinstance(source, bytes):
            pipe = _DriverCall(self.fs, "pipe_file", target, source)
            self._call("write", path, pipe, write=True, nbytes=len(source))
            return
        # The driver opens the spool by name: /dev/fd/N reopens the unnamed file (POSIX); on
        # macOS it shares this file's offset, so it is rewound before each try.
        name = f"/dev/fd/{source.fileno()}" if os.path.isdir("/dev/fd") else source.name
        put = _DriverCall(self.fs, "put_file", name, target, before=lambda: source.seek(0))
        size = os.fstat(source.fileno()).st_size
        self._call("write", path, put, write=True, nbytes=size)

    def _makedirs(self, path: str) -> None:
        if self.protocol not in _OBJECT_STORES:
            parent = self._path(path).rsplit("/", 1)[0]
            self._call("create", path, lambda: self.fs.makedirs(parent, exist_ok=True), write=True)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        data = bytes(data)
        target = self._path(path)
        self._warn_if_unsafe()
        self._makedirs(path)
        exists: FileExistsError | None = None
        missing: FileNotFoundError | None = None
        for _ in range(self.retry.attempts):
            try:
                self._call("commit", path, self._creator(target, data), write=True)
                return True
            except FileExistsError as exc:
                exists = exc
            except StoreError as exc:
                # Given up on transient failures: the last create may have happened with its
                # answer lost. Read back what stands: our bytes are our commit, another's
                # record a race lost; none, the failure it was.
                outcome = self._after_lost_answer(path, data, exc)
                if outcome is None:
                    raise
                return outcome
            try:
                existing = self.read_bytes(path)
            except FileNotFoundError as exc:
                missing = exc
                continue  # removed since (snapstore rm): try again
            # A create whose response was lost and that was tried again (here or inside the
            # driver) finds its own file: it is ours if it holds our bytes. Records name their
            # writer (a run, a claim's owner), so no other writer's record is equal.
            return existing == data
        raise vanished_error(self.join(path), exists, missing)

    def _after_lost_answer(self, path: str, data: bytes, exc: StoreError) -> bool | None:
        """After a create that gave up on transient failures (``exc``): True if the record
        holds ``data`` (ours, its answer lost), False if it holds another writer's record,
        None if there is none, or it cannot be read, or ``exc`` was no transient failure."""
        transient = isinstance(exc, StoreTimeoutError) or (
            exc.__cause__ is not None and classify_failure(exc.__cause__) == "transient"
        )
        if not transient:
            return None
        try:
            existing = self.read_bytes(path)
        except (FileNotFoundError, StoreError):
            return None
        ours = existing == data
        if ours:
            log.info("snapstore: %s: a create whose answer was lost had committed", self.join(path))
        return ours

    def _creator(self, target: str, data: bytes) -> Callable[[], None]:
        if self._create_on_service:  # the service refuses a second one
            return _DriverCall(self.fs, "pipe_file", target, data, mode="create")
        return lambda: self._create(target, data)

    def _create(self, target: str, data: bytes) -> None:
        if self.protocol in ("file", "local"):
            # A temporary file beside the record, then a hard link onto its name, as LocalStore
            # does: the link fails if the name is taken, and a job killed at any point leaves
            # no partial record (open "xb", then a write, left an empty one to a kill -9: every
            # reader refused it and no rerun could replace it).
            head, name = os.path.split(target)
            tmp = os.path.join(head, f".{name}.{secrets.token_hex(6)}.tmp")
            try:
                self.fs.pipe_file(tmp, data)  # through fs: a wrapper (the simulator) sees it
                # FileExistsError if the name is taken; through fs where it links (a wrapper
                # that injects faults sees the commit itself)
                link = getattr(self.fs, "link", None)
                link(tmp, target) if link is not None else os.link(tmp, target)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        else:
            # memory: one process, where the lock makes its check-then-write atomic. Others
            # (hdfs://): atomic among this process's threads only; _warn_if_unsafe said so.
            with _CREATE_LOCK:
                self.fs.pipe_file(target, data, mode="create")

    def _warn_if_unsafe(self) -> None:
        if self.atomic_create or self.protocol in _WARNED:
            return
        _WARNED.add(self.protocol)  # two threads racing here may both warn: harmless
        log.warning(
            "snapstore: %s has no atomic create-if-absent, so concurrent writers of one "
            "fingerprint under %s are unsafe (more than one may believe it committed). Run "
            "one writer per fingerprint%s; see 'Backends' in the snapstore guide.",
            self.protocol, self.url, _ADVICE.get(self.protocol, ""),
        )  # fmt: skip

    def remove_empty_dir(self, path: str) -> bool:
        # Memory only (under the lock; its creates need no directory). A local filesystem via
        # fsspec makes a directory, then the file, without LocalStore's retry if it vanishes
        # between; object stores have no directories; HDFS' rmdir may remove a whole tree.
        target = self._path(path)
        if not path.strip("/") or self.protocol != "memory":
            return False
        try:
            with _CREATE_LOCK:  # transient failures retried, as every request's
                self._call("remove", path, lambda: self.fs.rmdir(target))
        except (OSError, StoreError):  # not empty, gone (FileNotFoundError), not a directory
            return False
        finally:
            self._forget(target)
        return True

    def remove_tree(self, path: str) -> None:
        target = self._path(path)
        self._forget(target)

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):  # gone (a retry of a removal that ended)
                self.fs.rm(target, recursive=True)

        self._call("remove", path, remove)
        self._forget(target)
