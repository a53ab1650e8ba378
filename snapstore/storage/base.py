"""The store contract: a directory of files addressed by relative ``/``-separated paths.

Every backend (:mod:`~snapstore.storage.local`, :mod:`~snapstore.storage.fsspec_store`,
:mod:`~snapstore.storage.webhdfs`) implements :class:`Store`; the commit protocol needs one
primitive beyond reads and writes, :meth:`Store.create_if_absent` (see
:mod:`snapstore.storage.store` for how each backend makes it atomic, and ``docs/format.md`` for the
protocol).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import IO, Any

from .trees import walk_store

__all__ = ["VANISHED_RETRIES", "Store"]

VANISHED_RETRIES = 5  # a file found to exist, then gone when read: create it again


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
