"""A committed snapshot that opens itself again in each process that reads it.

Datasets and sources handed to worker processes (PyTorch DataLoader workers, Grain workers)
hold a :class:`SnapshotHandle`. It reaches a worker pickled (``spawn``, ``forkserver``) or as a
copy of the parent's memory (``fork``, Linux's default); either way, the first read in a
process other than the one that opened the snapshot opens it anew there, through
:func:`snapstore.store.reopen`, which rebuilds the store's filesystem for that process. The
parent's open snapshot (memory maps, decode caches, the event loop of an async filesystem)
is never used by a child.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .store import portable, reopen

if TYPE_CHECKING:
    from .snapshot import Snapshot

__all__ = ["SnapshotHandle"]


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
        self.url = snapshot.store.url
        self.root = portable(snapshot.store, destination)
        self._opened: Snapshot | None = snapshot
        self._pid = os.getpid()

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
        """The snapshot, opened in this process (again, after a fork or in a new process)."""
        if self._opened is None or self._pid != os.getpid():
            from .snapshot import Snapshot

            # A forked child drops the parent's copy without closing it: its threads and
            # locks belong to the parent.
            self._opened = Snapshot(reopen(self.root), self.fingerprint)
            self._pid = os.getpid()
        return self._opened

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_opened": None}
