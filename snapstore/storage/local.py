"""The local store: a directory on a local (or locally mounted) filesystem.

:meth:`LocalStore.create_if_absent` writes a temp file and ``os.link``s it into place (atomic on
POSIX); files are flushed and fsynced, with their directories, before a commit. OSErrors become
:class:`~snapstore.errors.StoreError` naming the path and what to do (a missing file stays
``FileNotFoundError``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import mmap
import os
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from ..errors import StoreError
from ..oldpaths import historic_name
from .base import VANISHED_RETRIES, Store
from .retry import (
    vanished_error,
)
from .roots import refuse_file_root
from .trees import walk_local

__all__ = ["OS_ERROR_HINTS", "LocalStore", "translated"]

log = logging.getLogger(historic_name(__name__))

T = TypeVar("T")

OS_ERROR_HINTS = {
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

    def gone_is_fine(func: object, path: str, exc: Any) -> None:
        error = exc[1] if isinstance(exc, tuple) else exc  # onerror's exc_info, onexc's error
        if not isinstance(error, FileNotFoundError):
            raise error

    # Python 3.12 deprecates onerror for onexc, which passes the exception itself.
    handler: dict[str, Any] = {"onexc" if sys.version_info >= (3, 12) else "onerror": gone_is_fine}
    for attempt in range(8):
        try:
            shutil.rmtree(target, **handler)
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY or attempt == 7:
                raise
        if not target.exists():
            return
        time.sleep(0.005 * 2**attempt)  # let the writer finish (0.6 s in all at most)


@contextlib.contextmanager
def translated(op: str, url: str) -> Iterator[None]:
    """Local OSErrors as StoreError naming ``url`` (a missing file stays FileNotFoundError)."""
    try:
        yield
    except (StoreError, FileNotFoundError):
        raise
    except OSError as exc:
        hint = OS_ERROR_HINTS.get(exc.errno or 0, "check that the store is reachable and writable")
        err = StoreError(f"cannot {op} {url}: {exc.strerror or exc}; {hint}")
        err.errno = exc.errno
        raise err from exc


class _SyncedFile:
    """A local file that is flushed and fsynced on a clean close."""

    def __init__(self, path: Path, url: str, fsync: bool) -> None:
        self._url = url
        self._fsync = fsync
        with translated("create", url):
            self._file = _create_in_dir(path, lambda: open(path, "xb"))  # noqa: SIM115

    def write(self, data: Any) -> int:
        with translated("write", self._url):
            return self._file.write(data)

    def close(self) -> None:
        if self._file.closed:
            return
        with translated("write", self._url):
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
        with translated("read", self.join(path)):
            return self._path(path).read_bytes()

    def read_range(self, path: str, start: int, length: int) -> Any:
        # A memory map reads through the page cache with no copy; the returned memoryview keeps
        # the mapping alive for as long as any decoded block references it. (Python's mmap, not
        # pyarrow.memory_map: the latter's read_at slows ten-fold once many regions are held.)
        with self._lock:
            view = self._maps.get(path)
            if view is None:
                with translated("read", self.join(path)), open(self._path(path), "rb") as f:
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
        with translated("sync", self.join(path)):
            self._fsync_dir(self._path(path))

    def create_if_absent(self, path: str, data: bytes) -> bool:
        target = self._path(path)
        with translated("commit", self.join(path)):
            for _ in range(VANISHED_RETRIES):
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
        with translated("list", self.join(path)):
            try:
                return sorted(os.listdir(self._path(path)))
            except (FileNotFoundError, NotADirectoryError):
                return []

    def size(self, path: str) -> int:
        with translated("stat", self.join(path)):
            return self._path(path).stat().st_size

    def list_tree(self, path: str, prefix: str = "") -> dict[str, int]:
        with translated("list", self.join(path)):
            return walk_local(str(self._path(path)), prefix)

    def remove_tree(self, path: str) -> None:
        target = self._path(path)
        with self._lock:
            for key in [k for k in self._maps if k == path or k.startswith(path + "/")]:
                del self._maps[key]  # unmapped when the last view of it is released
        with translated("remove", self.join(path)):
            if target.is_dir() and not target.is_symlink():
                _remove_dir_tree(target)
            else:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()

    def close(self) -> None:
        with self._lock:
            self._maps.clear()  # each mapping is released with the last block that views it


# -- fsspec stores ---------------------------------------------------------------------------
