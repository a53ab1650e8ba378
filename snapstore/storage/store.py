"""Storage backends: one small interface over local disk and fsspec filesystems.

A store is rooted at a directory or URL; every path it takes is relative to that root and uses
``/``. The one primitive the commit protocol needs is :meth:`Store.create_if_absent`: it writes a
small file only if no file of that name exists, atomically, and says whether it did.
:class:`LocalStore` does it with a temp file and ``os.link`` (atomic on POSIX); an
:class:`FsspecStore` asks the service (GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``)
or, for fsspec's memory filesystem, holds a process-wide lock. :data:`ATOMIC_CREATE_PROTOCOLS`
lists the protocols where it is atomic (HDFS: over WebHDFS, :mod:`snapstore.storage.webhdfs`);
elsewhere (``hdfs://``) the store warns once.

Errors are translated here, at the boundary. A missing file stays ``FileNotFoundError`` (the
reader and the commit protocol rely on it). An :class:`FsspecStore` retries transient failures
(timeouts, resets, HTTP 429 and 5xx) under a :class:`RetryPolicy`; anything else, and a
transient failure that outlasts the retries, becomes :class:`StoreError` naming the URL and
what to check.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import itertools
import logging
import mmap
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from ..errors import StoreError
from .retry import (
    KIND_ERRNOS,
    KIND_HINTS,
    RetryPolicy,
    classify_failure,
    http_status,
    no_such_bucket,
    vanished_error,
)
from .roots import default_root, refuse_file_root, refuse_mistyped_url
from .trees import find_tree, walk_local, walk_store

__all__ = [
    "ATOMIC_CREATE_PROTOCOLS",
    "FsspecStore",
    "KNOWN_OPENERS",
    "LocalStore",
    "RetryPolicy",
    "Store",
    "default_root",
    "open_store",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_HINTS = {
    errno.EACCES: "check the permissions of the directory, or choose another root",
    errno.EPERM: "check the permissions of the directory, or choose another root",
    errno.ENOSPC: "free space on the device, or choose another root",
    errno.EROFS: "the filesystem is read-only; choose another root",
    errno.EDQUOT: "the disk quota is exhausted; free space or choose another root",
}


def _create_in_dir(path: Path, create: Callable[[], T]) -> T:
    """``create()`` a new file at ``path`` after making its parent directories; tried again
    if a directory vanished in between: a job whose stage failed removes its own empty
    directories (:meth:`Store.remove_empty_dir`), and may do so right after our ``mkdir``."""
    for attempt in itertools.count(1):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return create()
        except FileNotFoundError:
            if attempt >= 3:  # not a race but a directory removed again and again: say so
                raise
    raise AssertionError("unreachable: the loop returns or raises")


def _remove_dir_tree(target: Path) -> None:
    """``shutil.rmtree`` that lets files go while it runs and runs again when files came
    meanwhile (a reader's pin written, renamed or renewed as its snapshot is removed)."""

    def gone_is_fine(func: object, path: str, exc_info: tuple[type, BaseException, object]) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    for attempt in range(8):
        try:
            shutil.rmtree(target, onerror=gone_is_fine)
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY or attempt == 7:
                raise
        if not target.exists():
            return
        time.sleep(0.005 * 2**attempt)  # let the writer finish (0.6 s in all at most)


@contextlib.contextmanager
def _translated(op: str, url: str) -> Iterator[None]:
    """Local OSErrors as StoreError naming ``url`` (a missing file stays FileNotFoundError)."""
    try:
        yield
    except (StoreError, FileNotFoundError):
        raise
    except OSError as exc:
        hint = _HINTS.get(exc.errno or 0, "check that the store is reachable and writable")
        err = StoreError(f"cannot {op} {url}: {exc.strerror or exc}; {hint}")
        err.errno = exc.errno
        raise err from exc


class Store(ABC):
    """A directory of files on some storage, addressed by relative ``/``-separated paths."""

    url: str
    # Range reads are memory-map slices: no latency to hide, nothing to coalesce.
    local: bool = False
    # Readers may merge adjacent blocks into one range read. A store that keys something on
    # the exact ranges it is asked for (a block cache) turns this off.
    coalesce: bool = True
    # Whether create_if_absent is atomic among all writers, in every process and host that
    # can see the store (see ATOMIC_CREATE_PROTOCOLS). Wrappers should report their target's.
    atomic_create: bool = True

    def join(self, path: str) -> str:
        """The full URL of a relative path, for messages."""
        return f"{self.url.rstrip('/')}/{path}"

    @abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """The whole file. Raises FileNotFoundError if it does not exist."""

    @abstractmethod
    def read_range(self, path: str, start: int, length: int) -> Any:
        """``length`` bytes from ``start``, as a buffer (bytes, memoryview or pyarrow.Buffer)."""

    @abstractmethod
    def open_write(self, path: str) -> IO[bytes]:
        """A new file for streaming writes; parents are created. Closing it makes it durable."""

    @abstractmethod
    def create_if_absent(self, path: str, data: bytes) -> bool:
        """Atomically create a small file unless one exists; True if this call created it."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file or directory exists."""

    @abstractmethod
    def list_dir(self, path: str) -> list[str]:
        """Names directly under a directory ([] if it does not exist)."""

    @abstractmethod
    def size(self, path: str) -> int:
        """Size of a file in bytes."""

    @abstractmethod
    def remove_tree(self, path: str) -> None:
        """Remove a file or directory tree; a missing path is not an error."""

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole new file (data files are never overwritten)."""
        with self.open_write(path) as f:
            f.write(data)

    def disk_usage(self, path: str) -> int:
        """Total bytes of the files under ``path`` (files removed meanwhile count 0)."""
        total = 0
        for name in self.list_dir(path):
            child = f"{path}/{name}"
            try:
                total += self.disk_usage(child) if self.is_dir(child) else self.size(child)
            except FileNotFoundError:
                continue  # a pin renewed, a run cleaned up: sizes are a snapshot in time
        return total

    @abstractmethod
    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory."""

    def list_tree(self, path: str, prefix: str = "") -> dict[str, int]:
        """Every file under directory ``path`` whose path relative to it starts with
        ``prefix``: ``{relative path: size}``, from one recursive listing where the store has
        one (object stores: a listing without delimiter, 1,000 objects a page; see
        :mod:`snapstore.storage.trees`). A directory holding no file appears as ``"name/"`` with
        size 0; a missing ``path`` lists as ``{}``. Files added or removed meanwhile may or may not
        appear, as in any listing."""
        return walk_store(self, path, prefix)

    def remove_empty_dir(self, path: str) -> bool:
        """Remove a directory only if it is empty, in one step that fails once another job has
        put a file in it; True if it did. Stores without directories (object stores), or that
        cannot refuse a non-empty one atomically, remove nothing."""
        return False

    def sync_dir(self, path: str) -> None:  # noqa: B027 - only local filesystems need it
        """Make a directory's entries durable before something refers to them."""

    def close(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing
        """Release open handles (memory maps, connections)."""


class _SyncedFile:
    """A local file that is flushed and fsynced on a clean close."""

    def __init__(self, path: Path, url: str, fsync: bool) -> None:
        self._url = url
        self._fsync = fsync
        with _translated("create", url):
            self._file = _create_in_dir(path, lambda: open(path, "xb"))  # noqa: SIM115

    def write(self, data: Any) -> int:
        with _translated("write", self._url):
            return self._file.write(data)

    def close(self) -> None:
        if self._file.closed:
            return
        with _translated("write", self._url):
            try:
                self._file.flush()
                if self._fsync:
                    os.fsync(self._file.fileno())
            finally:
                self._file.close()

    def __enter__(self) -> _SyncedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalStore(Store):
    """A store on a local (or locally mounted) filesystem.

    Parameters
    ----------
    root : str or Path
        The directory; created on first write.
    fsync : bool
        Flush files and directories to stable storage before a commit (crash safety against
        power loss, not just process kills). Turn off only for scratch data.

    Raises
    ------
    StoreError
        If ``root``, or a directory above it, is a file.
    """

    local = True

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)
        refuse_file_root(os.fspath(root), self.root)
        self.fsync = fsync
        self._maps: dict[str, memoryview] = {}
        self._lock = threading.Lock()

    def _path(self, path: str) -> Path:
        return self.root / path

    def read_bytes(self, path: str) -> bytes:
        with _translated("read", self.join(path)):
            return self._path(path).read_bytes()

    def read_range(self, path: str, start: int, length: int) -> Any:
        # A memory map reads through the page cache with no copy; the returned memoryview keeps
        # the mapping alive for as long as any decoded block references it. (Python's mmap, not
        # pyarrow.memory_map: the latter's read_at slows ten-fold once many regions are held.)
        with self._lock:
            view = self._maps.get(path)
            if view is None:
                with _translated("read", self.join(path)), open(self._path(path), "rb") as f:
                    if os.fstat(f.fileno()).st_size == 0:
                        return b""
                    view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
                self._maps[path] = view
        return view[start : start + length]

    def open_write(self, path: str) -> IO[bytes]:
        return _SyncedFile(self._path(path), self.join(path), self.fsync)  # type: ignore[return-value]

    def _fsync_dir(self, directory: Path) -> None:
        if self.fsync and sys.platform != "win32":
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def sync_dir(self, path: str) -> None:
        with _translated("sync", self.join(path)):
            self._fsync_dir(self._path(path))

    def create_if_absent(self, path: str, data: bytes) -> bool:
        target = self._path(path)
        with _translated("commit", self.join(path)):
            for _ in range(_VANISHED_RETRIES):
                tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
                with _SyncedFile(tmp, self.join(path), self.fsync) as f:  # makes the parents
                    f.write(data)
                try:
                    os.link(tmp, target)  # fails with EEXIST if the name is taken: atomic
                except FileExistsError:
                    # On NFS a retransmitted link() can report EEXIST although it succeeded:
                    # the record is ours if it holds our bytes (records name a unique run, so
                    # no other writer's record can be equal).
                    try:
                        return target.read_bytes() == data
                    except FileNotFoundError:
                        continue  # removed since (a failed job's claim cleanup, rm): again
                finally:
                    tmp.unlink()
                self._fsync_dir(target.parent)
                return True
        raise vanished_error(self.join(path))

    def exists(self, path: str) -> bool:
        return self._path(path).exists()

    def is_dir(self, path: str) -> bool:
        return self._path(path).is_dir()

    def remove_empty_dir(self, path: str) -> bool:
        if not path.strip("/"):
            return False  # never the root itself
        try:
            os.rmdir(self._path(path))  # refuses a non-empty directory, atomically
        except OSError:  # not empty, already gone, or not a directory
            return False
        return True

    def list_dir(self, path: str) -> list[str]:
        with _translated("list", self.join(path)):
            try:
                return sorted(os.listdir(self._path(path)))
            except (FileNotFoundError, NotADirectoryError):
                return []

    def size(self, path: str) -> int:
        with _translated("stat", self.join(path)):
            return self._path(path).stat().st_size

    def list_tree(self, path: str, prefix: str = "") -> dict[str, int]:
        with _translated("list", self.join(path)):
            return walk_local(str(self._path(path)), prefix)

    def remove_tree(self, path: str) -> None:
        target = self._path(path)
        with self._lock:
            for key in [k for k in self._maps if k == path or k.startswith(path + "/")]:
                del self._maps[key]  # unmapped when the last view of it is released
        with _translated("remove", self.join(path)):
            if target.is_dir() and not target.is_symlink():
                _remove_dir_tree(target)
            else:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()

    def close(self) -> None:
        with self._lock:
            self._maps.clear()  # each mapping is released with the last block that views it


# -- fsspec stores ---------------------------------------------------------------------------

# Protocols whose create-if-absent is atomic for every writer that can see the store: GCS
# (ifGenerationMatch=0) and S3 (If-None-Match: *) refuse a second create on the service, a local
# filesystem creates with O_EXCL, and fsspec's memory filesystem (one process) creates under
# _CREATE_LOCK. HDFS over WebHDFS creates with overwrite=false, through snapstore's driver (its
# ``snapstore_atomic_create``; fsspec's own checks, then writes). A wrapper (DirFileSystem, the
# latency simulator) is judged by its ``fs``.
ATOMIC_CREATE_PROTOCOLS = frozenset({"memory", "gs", "gcs", "s3", "s3a", "file", "local"} | {
    "webhdfs", "swebhdfs"})  # fmt: skip
_WEBHDFS = frozenset({"webhdfs", "swebhdfs"})
# Stores of modules beside this one that build on it, by protocol, as "module:function" imported
# on first use (as fsspec's known_implementations), so that this module does not import them.
KNOWN_OPENERS = dict.fromkeys(_WEBHDFS, "snapstore.storage.webhdfs:open_webhdfs")
_ADVICE = dict.fromkeys(("hdfs", "arrow_hdfs"), ", or use the WebHDFS URL of the same NameNode "
                        "(webhdfs://NAMENODE:9870/PATH), whose commits are atomic")  # fmt: skip
# No directories, so no makedirs (s3fs' would create a missing bucket, hiding a typo).
_OBJECT_STORES = frozenset({"gs", "gcs", "s3", "s3a"})
_CREATE_LOCK = threading.Lock()
_VANISHED_RETRIES = 5  # a file found to exist, then gone when read: create it again
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
        with _translated("write", self._url):
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
            with _translated("write", self._url):
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

    Operations retry transient failures under ``retry``; other failures raise
    :class:`StoreError` naming the URL (a missing file stays ``FileNotFoundError``).
    :meth:`open_write` spools locally and uploads whole on close, so an upload can be retried.
    Listings are never served from fsspec's listings cache (other processes make it stale).
    ``atomic_create`` says whether the protocol of the filesystem holding the data is in
    :data:`ATOMIC_CREATE_PROTOCOLS`.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The filesystem.
    root : str
        The root path inside ``fs`` (no protocol), e.g. ``"bucket/snaps"``.
    retry : RetryPolicy, optional
        How transient failures are retried; default ``RetryPolicy()``.
    """

    def __init__(self, fs: Any, root: str, *, retry: RetryPolicy | None = None) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.retry = retry if retry is not None else RetryPolicy()
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

    def _path(self, path: str) -> str:
        return f"{self.root}/{path}"

    def _call(self, op: str, path: str, fn: Callable[[], T], *, write: bool = False) -> T:
        """``fn()``, with transient failures retried and the rest translated."""
        for attempt in itertools.count(1):
            try:
                return fn()
            except Exception as exc:
                kind = classify_failure(exc)
                if kind == "transient" and attempt < self.retry.attempts:
                    log.debug("retry %d of %s %s after %r", attempt, op, self.join(path), exc)
                    time.sleep(self.retry.backoff(attempt))
                    continue
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

    def _error(self, op: str, path: str, exc: BaseException, kind: str, tries: int) -> StoreError:
        detail = (exc.strerror if isinstance(exc, OSError) else None) or str(exc).strip()
        detail = detail.splitlines()[0] if detail else type(exc).__name__
        detail = "not found" if kind in ("bucket", "location") else detail  # gcsfs: a bare URL
        hint = KIND_HINTS[kind]
        if kind == "permanent" and isinstance(exc, OSError):
            hint = _HINTS.get(exc.errno or 0, hint)
        if kind == "transient":
            hint = f"gave up after {tries} tries; {hint}"
        err = StoreError(f"cannot {op} {self.join(path)}: {detail}; {hint}")
        err.errno = getattr(exc, "errno", None) or KIND_ERRNOS.get(kind)
        return err

    def _forget(self, target: str) -> None:
        self.fs.invalidate_cache(target)  # another process may have written since

    # -- reads ---------------------------------------------------------------------------------

    def read_bytes(self, path: str) -> bytes:
        target = self._path(path)
        data = self._call("read", path, lambda: self.fs.cat_file(target))
        return bytes(data)

    def read_range(self, path: str, start: int, length: int) -> Any:
        if length <= 0:
            return b""  # no request (S3 refuses an empty range)
        target = self._path(path)

        def fetch() -> Any:
            try:  # one request; keywords, since s3fs' third positional parameter is version_id
                return self.fs.cat_file(target, start=start, end=start + length)
            except Exception as exc:  # a range past the end is empty, as a local slice is
                names = {f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__}
                s3_416 = isinstance(exc, OSError) and exc.errno == errno.EINVAL
                if http_status(exc, names) == 416 or (s3_416 and "range" in str(exc).lower()):
                    return b""
                raise

        return self._call("read", path, fetch)

    def exists(self, path: str) -> bool:
        return self._info(path) is not None

    def is_dir(self, path: str) -> bool:
        return (self._info(path) or {}).get("type") == "directory"

    def _info(self, path: str) -> dict[str, Any] | None:
        # Not fs.exists or fs.isdir: they turn every error (a timeout, a 403) into False.
        target = self._path(path)
        self._forget(target)
        with contextlib.suppress(FileNotFoundError):
            return dict(self._call("stat", path, lambda: self.fs.info(target)))
        return None

    def list_dir(self, path: str) -> list[str]:
        target = self._path(path)
        self._forget(target)
        try:
            entries = self._call("list", path, lambda: self.fs.ls(target, detail=False))
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})
        return [n for n in names if n]

    def size(self, path: str) -> int:
        target = self._path(path)
        return int(self._call("stat", path, lambda: self.fs.size(target)))

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
            self._call("write", path, lambda: self.fs.pipe_file(target, source), write=True)
            return
        # The driver opens the spool by name: /dev/fd/N reopens the unnamed file (POSIX).
        name = f"/dev/fd/{source.fileno()}" if os.path.isdir("/dev/fd") else source.name

        def put() -> None:
            source.seek(0)  # on macOS, /dev/fd/N shares this file's offset
            self.fs.put_file(name, target)

        self._call("write", path, put, write=True)

    def _makedirs(self, path: str) -> None:
        if self.protocol not in _OBJECT_STORES:
            parent = self._path(path).rsplit("/", 1)[0]
            self._call("create", path, lambda: self.fs.makedirs(parent, exist_ok=True), write=True)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        data = bytes(data)
        target = self._path(path)
        self._warn_if_unsafe()
        self._makedirs(path)
        for _ in range(self.retry.attempts):
            with contextlib.suppress(FileExistsError):
                self._call("commit", path, lambda: self._create(target, data), write=True)
                return True
            try:
                existing = self._call("read", path, lambda: self.fs.cat_file(target))
            except FileNotFoundError:
                continue  # removed since (snapstore rm): try again
            # A create whose response was lost and that was tried again (here or inside the
            # driver) finds its own file: it is ours if it holds our bytes. Records name their
            # writer (a run, a claim's owner), so no other writer's record is equal.
            return bytes(existing) == data
        raise vanished_error(self.join(path))

    def _create(self, target: str, data: bytes) -> None:
        if self.protocol in ("file", "local"):
            # fsspec's local pipe_file checks, then writes; "xb" is open(O_CREAT | O_EXCL).
            file = self.fs.open(target, "xb")
            try:
                with file:
                    file.write(data)
            except BaseException:
                with contextlib.suppress(OSError):
                    self.fs.rm_file(target)  # no partial record
                raise
        elif self._create_on_service:
            self.fs.pipe_file(target, data, mode="create")  # the service refuses a second one
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
            with _CREATE_LOCK:
                self.fs.rmdir(target)
        except OSError:  # not empty, gone (FileNotFoundError), not a directory
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


_EXTRAS = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "s3a": "s3"}


def _gcs_endpoint(storage_options: dict[str, Any]) -> bool:
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    return "endpoint_url" in storage_options or emulator not in ("", "default")


def open_store(
    root: str | os.PathLike[str] | Store | None = None,
    *,
    retry: RetryPolicy | None = None,
    **storage_options: Any,
) -> Store:
    """The store for a root.

    Parameters
    ----------
    root : str, PathLike, Store or None
        A Store passes through. A local path or ``file://`` URL gives a :class:`LocalStore`;
        any other fsspec URL (``gs://bucket/prefix``, ``s3://...``, ``memory://...``) an
        :class:`FsspecStore`, ``webhdfs://`` and ``swebhdfs://`` a
        :class:`~snapstore.storage.webhdfs.WebHDFSStore`. None means :func:`default_root`.
    retry : RetryPolicy, optional
        How an FsspecStore retries transient failures; ignored for local roots, which do not
        retry.
    **storage_options
        Passed to the fsspec filesystem (``endpoint_url=``, ``token=``, ``key=``...), or to
        :class:`LocalStore` for a local root (``fsync=``).

    Raises
    ------
    StoreError
        If the protocol's fsspec driver is not installed, or the URL or options are invalid;
        if a local root is a file (or lies under one); if a local root starts like a URL with
        a mistyped separator (``s3:/bucket``, ``gs:bucket``: any ``word:`` of two letters or
        more as its first component, so not a drive letter such as ``C:``).

    Notes
    -----
    ``gs://`` with an ``endpoint_url`` (or ``$STORAGE_EMULATOR_HOST``) gets
    ``gcsfs.core.GCSFileSystem``, not gcsfs' default extended class: that class first asks the
    endpoint over gRPC for the bucket's layout, which an emulator or a plain HTTP endpoint never
    answers (every operation waited about 60 s). Without an endpoint the extended class (zonal
    and hierarchical buckets) is kept. No environment variable is ever set.
    """
    if isinstance(root, Store):
        return root
    text = os.fspath(root) if root is not None else default_root()
    if "://" not in text or text.startswith("file://"):
        if "://" not in text:
            refuse_mistyped_url(text)
        return LocalStore(text.removeprefix("file://"), **storage_options)
    protocol = text.split("://", 1)[0]
    if protocol.lower() in KNOWN_OPENERS:
        module, _, opener = KNOWN_OPENERS[protocol.lower()].partition(":")
        return getattr(importlib.import_module(module), opener)(  # type: ignore[no-any-return]
            text, retry=retry, **storage_options
        )
    try:
        if protocol in ("gs", "gcs") and _gcs_endpoint(storage_options):
            import gcsfs.core  # type: ignore[import-untyped]

            fs: Any = gcsfs.core.GCSFileSystem(**storage_options)
            path = fs._strip_protocol(text)
        else:
            import fsspec

            fs, path = fsspec.core.url_to_fs(text, **storage_options)
    except ImportError as exc:
        extra = _EXTRAS.get(protocol)
        install = (
            f"pip install 'snapstore[{extra}]'"
            if extra
            else f"install the fsspec driver for {protocol}://"
        )
        raise StoreError(f"cannot open store {text!r}: {exc}; {install}") from exc
    except (ValueError, TypeError, OSError) as exc:
        raise StoreError(
            f"cannot open store {text!r}: {exc}; check the URL and the storage options"
        ) from exc
    store = FsspecStore(fs, path, retry=retry)
    store.url = text.rstrip("/")  # as given, host included (webhdfs://namenode:9870/snaps)
    return store
