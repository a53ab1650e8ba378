"""A committed snapshot that opens itself again in each process that reads it.

Datasets and sources handed to worker processes (PyTorch DataLoader workers, Grain workers)
hold a :class:`SnapshotHandle`. It reaches a worker pickled (``spawn``, ``forkserver``) or as a
copy of the parent's memory (``fork``, Linux's default); either way, the first read in a
process other than the one that opened the snapshot opens it anew there, through
:func:`reopen`, which rebuilds the store's filesystem for that process. The parent's open
snapshot (memory maps, decode caches, the event loop of an async filesystem) is never used by
a child. What the parent read and verified (commit record, manifest, a block index of up to
16 MiB) travels with the handle, so a worker makes no metadata request: it relies on the
parent's pin (see :mod:`snapstore.storage.pins`). The handle carries its store with
:func:`portable` and :func:`reopen`, which live with the stores in
:mod:`snapstore.storage.travel` (engine and Ray workers use them too) and are importable from
here as well. A :class:`~snapstore.snapshot.Snapshot` pickles the same way (see
``Snapshot.__reduce__``), and a handle opens its snapshot through it.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from .read.reader import SnapshotMetadata
from .storage.travel import portable, reopen

if TYPE_CHECKING:
    from .snapshot import Snapshot

__all__ = ["SnapshotHandle", "portable", "reopen"]


class SnapshotHandle:
    """A committed snapshot for readers in any process: the store's recipe and the fingerprint.

    Parameters
    ----------
    snapshot : Snapshot
        A committed snapshot, used as it is by this process.
    destination : str
        Where it goes, for the error when its store cannot travel ("DataLoader workers").

    Raises
    ------
    TypeError
        If the snapshot's store cannot be reopened in another process.
    """

    def __init__(self, snapshot: Snapshot, destination: str) -> None:
        self.fingerprint = snapshot.fingerprint
        self.root = portable(snapshot.store, destination)
        self._opened: Snapshot | None = snapshot
        self._pid = os.getpid()
        self._metadata: SnapshotMetadata | None = None  # what the sending process read
        self._sender = (socket.gethostname(), os.getpid())
        snapshot._open()  # read, and pinned, here: for as long as this process's workers read

    @classmethod
    def of(
        cls, snapshot_or_fingerprint: Snapshot | str, root: Any, destination: str
    ) -> SnapshotHandle:
        """A handle on a snapshot (materialized here if needed) or on a fingerprint (or unique
        prefix) opened under ``root`` (as for :func:`snapstore.open`).

        Raises
        ------
        TypeError
            If given something else, or the snapshot's store cannot be reopened elsewhere.
        SnapshotNotFoundError
            If no committed snapshot matches the fingerprint.
        """
        from .snapshot import Snapshot, open

        if isinstance(snapshot_or_fingerprint, Snapshot):
            snap = snapshot_or_fingerprint.materialize()
        elif isinstance(snapshot_or_fingerprint, str):
            snap = open(snapshot_or_fingerprint, root)
        else:
            raise TypeError(
                f"{destination} need a Snapshot or a fingerprint string, found "
                f"{type(snapshot_or_fingerprint).__name__}"
            )
        return cls(snap, destination)

    def open(self) -> Snapshot:
        """The snapshot, opened in this process (again, after a fork or in a new process).

        A snapshot opened in another process starts from the metadata the sending process had
        read and verified (commit record, manifest, index), and, while that process runs on
        this host, relies on its pin: it makes no request before its first block. Elsewhere
        (another host, a later job) it pins for itself, in the background.
        """
        if self._opened is None or self._pid != os.getpid():
            from .snapshot import Snapshot

            # A forked child drops the parent's copy without closing it: its threads and
            # locks belong to the parent (its metadata is plain data, and ours to reuse).
            metadata = self._metadata if self._opened is None else self._sent()
            snap = Snapshot._arrive(self.root, self.fingerprint, metadata, self._sender)
            self._opened, self._pid, self._metadata = snap, os.getpid(), None
        return self._opened

    def _sent(self) -> SnapshotMetadata | None:
        """What the sending process read, if it read the snapshot (and pinned it)."""
        opened = self._opened
        if opened is None:
            return self._metadata
        if self._pid == os.getpid():
            opened._open()  # read, and pinned, by this process for as long as its workers read
        return opened._pinned_metadata()  # None if not pinned there: each process pins itself

    def __getstate__(self) -> dict[str, Any]:
        metadata = self._sent()
        sender = (socket.gethostname(), os.getpid()) if self._opened else self._sender
        return {**self.__dict__, "_opened": None, "_metadata": metadata, "_sender": sender}
