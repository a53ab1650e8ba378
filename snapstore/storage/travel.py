"""Stores that travel to other processes: :func:`portable` describes a store as a small recipe
that pickles (or survives a fork), and :func:`reopen` opens it again in the process that reads.

DataLoader, Grain, engine and Ray workers all receive stores this way (see
:mod:`snapstore.handle` for whole snapshots). It sits with the stores, below the writer and
the engines that ship partitions to workers.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from .cache import BlockCache, CachedStore
from .store import FsspecStore, LocalStore, Store

__all__ = ["portable", "reopen"]

_IN_MEMORY = ("memory", ("memory",))  # how fsspec's memory filesystem names its protocol


def portable(store: Store, destination: str, *, fresh_process: bool = False) -> tuple[Any, ...]:
    """What reopens ``store`` in another process (a DataLoader, Grain, engine or Ray worker): a
    Store holds memory maps, caches, locks and event loops that another process cannot use, so a
    dataset keeps this instead and calls :func:`reopen` where it reads.

    It works whether the recipe reaches the other process pickled (``spawn``, ``forkserver``,
    Ray, Dask) or copied with the parent's memory (``fork``): :func:`reopen` in a process other
    than this one builds a new filesystem object there from the old one's options, never using
    the parent's (an async filesystem such as gcsfs or s3fs runs its requests on an event-loop
    thread that a forked child does not have).

    Parameters
    ----------
    store : Store
        The store to describe.
    destination : str
        Where the recipe goes, for the error ("DataLoader workers").
    fresh_process : bool
        True when the recipe may be reopened in a process that does not start as a copy of this
        one (a pickle sent to a spawned process, a Ray task, another host). A ``memory://``
        store is then refused: its files live in this process (and in its forked children
        only), so a fresh process would find it empty.

    Raises
    ------
    TypeError
        For a store that is not a LocalStore, an FsspecStore or a CachedStore over one
        (``destination`` names where it was to go), or a ``memory://`` store with
        ``fresh_process``.
    """
    if fresh_process and getattr(getattr(store, "fs", None), "protocol", None) in _IN_MEMORY:
        raise TypeError(
            f"cannot send a memory:// store to {destination}: its files live in this process "
            "only, and another process would find it empty; use a local path or a bucket URL "
            "as the root"
        )
    if isinstance(store, LocalStore):
        return ("local", str(store.root), store.fsync)
    if isinstance(store, FsspecStore):
        # The class travels too: a WebHDFSStore's commit and errors are its own.
        where = (store.fs, store.root, store.retry, store.url, store.protocol, os.getpid())
        return ("fsspec", type(store), *where)
    if isinstance(store, CachedStore):
        cache = store.cache
        inner = portable(store.inner, destination, fresh_process=fresh_process)
        return ("cached", inner, str(cache.directory), cache.max_bytes)
    raise TypeError(
        f"cannot send a {type(store).__name__} to {destination}: expected a LocalStore, "
        "an FsspecStore or a CachedStore; open the snapshot under a local path or an fsspec URL"
    )


def reopen(where: tuple[Any, ...]) -> Store:
    """The store :func:`portable` described, opened in this process."""
    if where[0] == "local":
        return LocalStore(where[1], fsync=where[2])
    if where[0] == "cached":
        return CachedStore(reopen(where[1]), BlockCache(where[2], where[3]))
    _, cls, fs, root, retry, url, protocol, pid = where
    if pid != os.getpid():
        fs = _rebuilt(fs)
    store: FsspecStore = cls(fs, root, retry=retry)
    store.url = url  # e.g. latency://... for a simulated store
    store.protocol = protocol  # e.g. swebhdfs, which its filesystem reports as webhdfs
    return store


def _rebuilt(fs: Any) -> Any:
    """A filesystem like ``fs`` that belongs to this process.

    fsspec filesystems pickle as their class and options; unpickling in a process other than
    the one that made ``fs`` builds a new instance (fsspec's instance cache forgets the parent's
    instances after a fork), and a wrapper rebuilds the filesystem it wraps the same way.
    """
    return pickle.loads(pickle.dumps(fs))
