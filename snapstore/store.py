"""Storage backends: one small interface over local disk and fsspec filesystems.

A store is rooted at a directory or URL; every path it takes is relative to that root and uses
``/``. The one primitive the commit protocol needs is :meth:`Store.create_if_absent`: it writes a
small file only if no file of that name exists, atomically, and says whether it did.

- :class:`LocalStore` does it with a temp file in the target directory and ``os.link``, which
  fails if the name exists (POSIX ``link`` is atomic), then fsyncs the directory.
- :class:`FsspecStore` uses ``pipe_file(mode="create")``; fsspec's memory filesystem honours it.
  Backends whose fsspec driver only emulates it (exists, then write) are unsafe for concurrent
  writers; see docs/guide.md.

Errors from the backend are translated here: a missing file stays ``FileNotFoundError``, any
other failure becomes :class:`StoreError` naming the URL and what to check.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import secrets
import shutil
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .errors import StoreError

__all__ = ["FsspecStore", "LocalStore", "Store", "default_root", "open_store"]

_HINTS = {
    errno.EACCES: "check the permissions of the directory, or choose another root",
    errno.EPERM: "check the permissions of the directory, or choose another root",
    errno.ENOSPC: "free space on the device, or choose another root",
    errno.EROFS: "the filesystem is read-only; choose another root",
    errno.EDQUOT: "the disk quota is exhausted; free space or choose another root",
}


def _translate(exc: OSError, op: str, url: str) -> Exception:
    if isinstance(exc, FileNotFoundError):
        return exc
    hint = _HINTS.get(exc.errno or 0, "check that the store is reachable and writable")
    err = StoreError(f"cannot {op} {url}: {exc.strerror or exc}; {hint}")
    err.errno = exc.errno
    return err


@contextlib.contextmanager
def _translated(op: str, url: str) -> Iterator[None]:
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        raised = _translate(exc, op, url)
        if raised is exc:
            raise
        raise raised from exc


class Store(ABC):
    """A directory of files on some storage, addressed by relative ``/``-separated paths."""

    url: str
    # Range reads are memory-map slices: no latency to hide, nothing to coalesce.
    local: bool = False
    # Readers may merge adjacent blocks into one range read. A store that keys something on
    # the exact ranges it is asked for (a block cache) turns this off.
    coalesce: bool = True

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
        """Total bytes of the files under ``path``."""
        total = 0
        for name in self.list_dir(path):
            child = f"{path}/{name}"
            total += self.disk_usage(child) if self.is_dir(child) else self.size(child)
        return total

    @abstractmethod
    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory."""

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
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "xb")  # noqa: SIM115 - closed in close()

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
    """

    local = True

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)
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
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        with _translated("commit", self.join(path)):
            target.parent.mkdir(parents=True, exist_ok=True)
            with _SyncedFile(tmp, self.join(path), self.fsync) as f:
                f.write(data)
            try:
                os.link(tmp, target)  # fails with EEXIST if the name is taken: atomic
            except FileExistsError:
                # On NFS a retransmitted link() can report EEXIST although it succeeded: the
                # record is ours if it holds our bytes (records name a unique run, so no other
                # writer's record can be equal).
                return target.read_bytes() == data
            finally:
                tmp.unlink()
            self._fsync_dir(target.parent)
            return True

    def exists(self, path: str) -> bool:
        return self._path(path).exists()

    def is_dir(self, path: str) -> bool:
        return self._path(path).is_dir()

    def list_dir(self, path: str) -> list[str]:
        with _translated("list", self.join(path)):
            try:
                return sorted(os.listdir(self._path(path)))
            except (FileNotFoundError, NotADirectoryError):
                return []

    def size(self, path: str) -> int:
        with _translated("stat", self.join(path)):
            return self._path(path).stat().st_size

    def remove_tree(self, path: str) -> None:
        target = self._path(path)
        with self._lock:
            for key in [k for k in self._maps if k == path or k.startswith(path + "/")]:
                del self._maps[key]  # unmapped when the last view of it is released
        with _translated("remove", self.join(path)):
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=False)
            else:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()

    def close(self) -> None:
        with self._lock:
            self._maps.clear()  # each mapping is released with the last block that views it


_CREATE_LOCK = threading.Lock()


class FsspecStore(Store):
    """A store on any fsspec filesystem (memory, and the object stores of later releases).

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The filesystem.
    root : str
        The root path inside ``fs`` (no protocol).
    """

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.url = f"{protocol}://{self.root.lstrip('/')}" if protocol != "file" else self.root

    def _path(self, path: str) -> str:
        return f"{self.root}/{path}"

    def read_bytes(self, path: str) -> bytes:
        with _translated("read", self.join(path)):
            data: bytes = self.fs.cat_file(self._path(path))
            return data

    def read_range(self, path: str, start: int, length: int) -> Any:
        with _translated("read", self.join(path)):
            return self.fs.cat_file(self._path(path), start=start, end=start + length)

    def open_write(self, path: str) -> IO[bytes]:
        with _translated("create", self.join(path)):
            parent = self._path(path).rsplit("/", 1)[0]
            self.fs.makedirs(parent, exist_ok=True)
            handle: IO[bytes] = self.fs.open(self._path(path), "wb")
            return handle

    def create_if_absent(self, path: str, data: bytes) -> bool:
        # fsspec's generic mode="create" is exists() then write; the lock makes it atomic among
        # this process's threads (enough for the memory filesystem). Across processes it is only
        # as atomic as the backend's create (see docs/guide.md, "Backends").
        with _translated("commit", self.join(path)), _CREATE_LOCK:
            parent = self._path(path).rsplit("/", 1)[0]
            self.fs.makedirs(parent, exist_ok=True)
            try:
                self.fs.pipe_file(self._path(path), data, mode="create")
            except FileExistsError:
                return False
            return True

    def exists(self, path: str) -> bool:
        with _translated("stat", self.join(path)):
            return bool(self.fs.exists(self._path(path)))

    def is_dir(self, path: str) -> bool:
        with _translated("stat", self.join(path)):
            return bool(self.fs.isdir(self._path(path)))

    def list_dir(self, path: str) -> list[str]:
        with _translated("list", self.join(path)):
            try:
                entries = self.fs.ls(self._path(path), detail=False)
            except (FileNotFoundError, NotADirectoryError):
                return []
        names = sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})
        return [n for n in names if n]

    def size(self, path: str) -> int:
        with _translated("stat", self.join(path)):
            return int(self.fs.size(self._path(path)))

    def remove_tree(self, path: str) -> None:
        with _translated("remove", self.join(path)):
            if self.fs.exists(self._path(path)):
                self.fs.rm(self._path(path), recursive=True)


def default_root() -> str:
    """``$SNAPSTORE_ROOT``, else the per-user cache directory (``~/.cache/snapstore`` on Linux)."""
    env = os.environ.get("SNAPSTORE_ROOT")
    if env:
        return env
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return str(base / "snapstore")


def open_store(root: str | os.PathLike[str] | Store | None = None, **storage_options: Any) -> Store:
    """The store for a root: a Store passes through, a local path or ``file://`` URL gives a
    LocalStore, any other URL an FsspecStore; None means :func:`default_root`."""
    if isinstance(root, Store):
        return root
    text = os.fspath(root) if root is not None else default_root()
    if "://" not in text or text.startswith("file://"):
        return LocalStore(text.removeprefix("file://"), **storage_options)
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(text, **storage_options)
    except (ImportError, ValueError, OSError) as exc:
        raise StoreError(
            f"cannot open store {text!r}: {exc}. Install the extra for its protocol, e.g. "
            "pip install 'snapstore[gcs]' or 'snapstore[s3]'."
        ) from exc
    return FsspecStore(fs, path)
