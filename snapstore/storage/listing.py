"""Recursive listings: one paged request per directory tree instead of one request per file.

:meth:`snapstore.storage.store.Store.list_tree` is the primitive; this module holds what its
implementations share (turning fsspec's ``find`` into a tree, walking a local directory) and
what callers build on it: :func:`list_prefixes` lists several prefixes of one directory at
once on a thread pool (an object store pages a listing 1,000 objects at a time, one page after
another, so a big tree is listed fastest as many small listings in parallel), and
:class:`ListedStore` answers a tool's listings and existence checks from a listing already
taken, so that only reads go to the store.

Trees are as :mod:`snapstore.storage.trees` describes them.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, TypeVar

from ..format import layout as fmt
from .store import LocalStore, Store

__all__ = [
    "ListedStore",
    "fingerprint_trees",
    "list_prefixes",
    "listing_workers",
    "map_concurrently",
    "root_missing",
]

T = TypeVar("T")
R = TypeVar("R")

# Listings (or reads) in flight at once: as many as fsspec's async backends gather per call
# (fsspec.asyn._DEFAULT_BATCH_SIZE), so 128 prefix listings take one round of pages. Threads
# mostly wait on the network; each holds one page (about 1,000 entries) at a time.
listing_workers = 128


def map_concurrently(fn: Callable[[T], R], items: Sequence[T], workers: int = 0) -> list[R]:
    """``[fn(x) for x in items]``, run on up to ``workers`` threads (default
    :data:`listing_workers`), in order; the first exception is raised once all have ended."""
    workers = min(len(items), workers or listing_workers)
    if workers <= 1:
        return [fn(x) for x in items]
    with cf.ThreadPoolExecutor(workers, thread_name_prefix="snapstore-list") as pool:
        return list(pool.map(fn, items))


def list_prefixes(store: Store, path: str, prefixes: Sequence[str]) -> dict[str, int]:
    """One tree of ``path`` made of the listings of ``prefixes`` (relative to ``path``), all in
    flight at once. Overlapping prefixes are fine; ``[""]`` is the whole tree."""
    found: dict[str, int] = {}
    for tree in map_concurrently(lambda p: store.list_tree(path, p), sorted(set(prefixes))):
        found.update(tree)
    return found


def fingerprint_trees(store: Store) -> dict[str, dict[str, int]]:
    """Every fingerprint directory under the root (plain names) with the tree of its files:
    one listing of the root, then one recursive listing per fingerprint, all in flight at
    once. A name that is a file, or an empty directory, has an empty tree."""
    names = [n for n in store.list_dir("") if fmt.is_plain_name(n)]
    return dict(zip(names, map_concurrently(store.list_tree, names)))


# -- answering from a listing ------------------------------------------------------------------


def root_missing(store: Store) -> bool:
    """Whether ``store`` is a local store whose directory does not exist (yet).

    Messages about an empty listing say so, since it usually means a mistyped root. Remote
    roots are not asked: a prefix with no objects does not exist either, and asking costs a
    request.
    """
    return isinstance(store, LocalStore) and not store.root.is_dir()


class ListedStore(Store):
    """A store whose listings under ``base`` come from ``tree`` (a listing of ``base`` taken
    once), and whose reads, writes and everything outside ``base`` go to ``inner``.

    For tools that look at many files (``ls``, ``gc``): they ask ``exists``, ``list_dir`` and
    ``disk_usage`` of every directory, which here cost no request. The answers are those of
    the moment ``tree`` was listed, as a walk of the store would have been over its duration;
    this store's own writes do not update them.
    """

    def __init__(self, inner: Store, base: str, tree: Mapping[str, int]) -> None:
        self.inner, self.base, self.tree = inner, base.strip("/"), dict(tree)
        self.url, self.local = inner.url, inner.local
        self.coalesce, self.atomic_create = inner.coalesce, inner.atomic_create
        self._dirs: dict[str, set[str]] = {"": set()}
        self._usage: dict[str, int] = {}
        for rel, size in self.tree.items():
            parts = rel.rstrip("/").split("/")
            for i, name in enumerate(parts):
                above = "/".join(parts[:i])
                self._dirs.setdefault(above, set()).add(name)
                self._usage[above] = self._usage.get(above, 0) + size
            if rel.endswith("/"):
                self._dirs.setdefault(rel.rstrip("/"), set())

    def _rel(self, path: str) -> str | None:
        """``path`` relative to ``base``, or None when outside it."""
        path = path.strip("/")
        if path == self.base:
            return ""
        if path.startswith(self.base + "/") or not self.base:
            return path[len(self.base) + 1 :] if self.base else path
        return None

    def join(self, path: str) -> str:
        return self.inner.join(path)

    def exists(self, path: str) -> bool:
        rel = self._rel(path)
        if rel is None:
            return self.inner.exists(path)
        return rel in self.tree or rel in self._dirs

    def is_dir(self, path: str) -> bool:
        rel = self._rel(path)
        return self.inner.is_dir(path) if rel is None else rel in self._dirs

    def list_dir(self, path: str) -> list[str]:
        rel = self._rel(path)
        return self.inner.list_dir(path) if rel is None else sorted(self._dirs.get(rel, ()))

    def size(self, path: str) -> int:
        rel = self._rel(path)
        if rel is None:
            return self.inner.size(path)
        if rel not in self.tree:
            raise FileNotFoundError(self.join(path))
        return self.tree[rel]

    def disk_usage(self, path: str) -> int:
        rel = self._rel(path)
        if rel is None:
            return self.inner.disk_usage(path)
        return self.tree.get(rel, 0) + self._usage.get(rel, 0)

    def list_tree(self, path: str, prefix: str = "") -> dict[str, int]:
        rel = self._rel(path)
        if rel is None:
            return self.inner.list_tree(path, prefix)
        start = f"{rel}/" if rel else ""
        return {k[len(start) :]: v for k, v in self.tree.items() if k.startswith(start + prefix)}

    def read_bytes(self, path: str) -> bytes:
        return self.inner.read_bytes(path)

    def read_range(self, path: str, start: int, length: int) -> Any:
        return self.inner.read_range(path, start, length)

    def open_write(self, path: str) -> IO[bytes]:
        return self.inner.open_write(path)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        return self.inner.create_if_absent(path, data)

    def remove_tree(self, path: str) -> None:
        self.inner.remove_tree(path)
