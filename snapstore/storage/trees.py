"""How stores list a directory tree (see :meth:`snapstore.storage.store.Store.list_tree`): walking a
local directory or any store, and turning fsspec's ``find`` into a tree. No I/O of its own
beyond the calls it is given; :mod:`snapstore.storage.listing` builds on the primitive.

A tree is a ``dict`` of paths relative to the listed directory, ``/``-separated, to sizes in
bytes. A directory that holds no file appears as ``"name/"`` with size 0: only on stores with
directories (local disk, fsspec's memory filesystem); object stores have none.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

__all__ = ["Listable", "find_tree", "takes_prefix", "walk_local", "walk_store"]


class Listable(Protocol):
    """What :func:`walk_store` calls: the listing primitives of a
    :class:`~snapstore.storage.store.Store` (a protocol, so this module needs no store)."""

    def list_dir(self, path: str) -> list[str]: ...

    def is_dir(self, path: str) -> bool: ...

    def size(self, path: str) -> int: ...


def _wanted(rel: str, prefix: str) -> bool:
    """Whether a directory ``rel`` may hold paths starting with ``prefix``."""
    return rel.startswith(prefix) or prefix.startswith(rel + "/")


def walk_store(store: Listable, path: str, prefix: str = "") -> dict[str, int]:
    """``list_tree`` from ``list_dir``, ``is_dir`` and ``size``: for stores without a
    recursive listing (one request per entry)."""
    found: dict[str, int] = {}

    def walk(rel: str) -> None:
        names = store.list_dir(_join(path, rel))
        if not names and rel and rel.startswith(prefix):
            found[rel + "/"] = 0
        for name in names:
            child = _join(rel, name)
            full = _join(path, child)
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                if store.is_dir(full):
                    if _wanted(child, prefix):
                        walk(child)
                elif child.startswith(prefix):
                    found[child] = store.size(full)

    walk("")
    return found


def walk_local(root: str, prefix: str = "") -> dict[str, int]:
    """``list_tree`` of a local directory (``os.scandir``: no stat beyond the directory's)."""
    found: dict[str, int] = {}

    def walk(directory: str, rel: str) -> None:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        if not entries and rel and rel.startswith(prefix):
            found[rel + "/"] = 0
        for entry in entries:
            child = _join(rel, entry.name)
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    if _wanted(child, prefix):
                        walk(entry.path, child)
                elif child.startswith(prefix):
                    found[child] = entry.stat().st_size

    walk(root, "")
    return found


def takes_prefix(fs: Any) -> bool:
    """Whether ``fs.find`` lists by key prefix on the service (gcsfs, s3fs, the simulator)."""
    find = getattr(fs, "_find", None) or fs.find
    with contextlib.suppress(TypeError, ValueError):
        return "prefix" in inspect.signature(find).parameters
    return False


def find_tree(fs: Any, target: str, prefix: str = "") -> dict[str, int]:
    """``list_tree`` through fsspec: one ``find`` (a listing without delimiter, paged, on
    object stores) of ``target``, by key prefix where ``fs`` can, else of the directory the
    prefix is in, filtered."""
    target = target.rstrip("/")
    base, kwargs = target, {}
    if prefix and takes_prefix(fs):
        kwargs = {"prefix": prefix}
    elif "/" in prefix:
        base = f"{target}/{prefix.rsplit('/', 1)[0]}"
    # Listed by key prefix: an object store, with no directories to report (and some s3fs
    # releases refuse withdirs together with a prefix).
    withdirs = not kwargs
    try:
        entries = fs.find(base, withdirs=withdirs, detail=True, **kwargs)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return tree_from_entries(target, entries, prefix)


def tree_from_entries(target: str, entries: Mapping[str, Any], prefix: str) -> dict[str, int]:
    """A tree from ``find(detail=True)``'s entries under ``target``."""
    files: dict[str, int] = {}
    dirs: set[str] = set()
    for name, info in entries.items():
        full = str(info.get("name", name)).rstrip("/")
        if not full.startswith(target + "/"):
            continue  # the target itself, or a sibling matched by key prefix
        rel = full[len(target) + 1 :]
        if not rel.startswith(prefix):
            continue
        if info.get("type") == "directory" or str(name).endswith("/"):
            dirs.add(rel)
        else:
            files[rel] = int(info.get("size") or 0)
    holding = {parent for rel in files for parent in _parents(rel)}
    holding |= {parent for rel in dirs for parent in _parents(rel)}
    files.update({f"{d}/": 0 for d in dirs - holding})
    return files


def _parents(rel: str) -> Iterator[str]:
    parts = rel.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


def _join(a: str, b: str) -> str:
    return f"{a}/{b}" if a and b else a or b
