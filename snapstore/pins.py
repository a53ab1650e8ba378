"""Reader pins: an open snapshot says "in use" so that cleaning never removes it under a reader.

Layout, under ``<fp>/pins/`` (files created once, never overwritten):

- ``pin-<owner>-<k>``: the ``k``-th renewal of one reader's pin, JSON with owner, host, pid,
  lease and wall time. A reader writes one when it opens a snapshot and renews it every
  ``lease / 4`` seconds on a daemon thread (each renewal deletes the previous file); closing the
  snapshot deletes it.
- ``read-<YYYYmmddTHH>``: created (if absent) when a reader opens the snapshot: when it was last
  read, to the hour, for least-recently-read cleaning.

A pin is **live** while its newest renewal is younger than its lease by the observer's wall
clock, unless its process is known to be gone (same host, no such pid). Pins cost one small
write per open and one per renewal; a reader without write access reads unpinned (logged once).

The race with removal: a reader pins *before* it reads the commit record; removal deletes the
commit record, then looks for live pins again and restores the record if one appeared (see
:func:`snapstore.catalog.remove_snapshot`). So a reader that got the commit record keeps its
snapshot, and one that comes later finds no snapshot, which is a cache miss, not an error.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import logging
import os
import re
import socket
import time
import weakref
from dataclasses import dataclass
from typing import Any

from .claims import Renewal, new_owner
from .errors import StoreError
from .store import Store

__all__ = ["Pin", "PinInfo", "last_read", "list_pins", "live_pins", "pin"]

log = logging.getLogger(__name__)

PINS_DIR = "pins"
DEFAULT_LEASE = 600.0
PIN_NAME = re.compile(r"pin-(.+)-(\d{8})")
_READ = re.compile(r"read-(\d{8}T\d{2})")
_warned = False
_active: weakref.WeakSet[Pin] = weakref.WeakSet()


@atexit.register
def _release_all() -> None:
    """A process that exits without closing its snapshots still takes its pins down."""
    for handle in list(_active):
        handle.release()


@dataclass(frozen=True)
class PinInfo:
    """One reader's newest pin: who, where, and when it was last renewed (wall time)."""

    owner: str
    host: str
    pid: int
    time: float
    lease: float

    def live(self, now: float) -> bool:
        if self.host == socket.gethostname() and self.pid != os.getpid():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except OSError:
                pass
        return now - self.time <= self.lease

    def describe(self) -> str:
        return f"reader {self.owner} (pid {self.pid} on {self.host})"


class Pin:
    """This process's pin on one snapshot; renews itself until :meth:`release`."""

    def __init__(self, store: Store, fingerprint: str, lease: float = DEFAULT_LEASE) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.lease = lease
        self.owner = new_owner()
        self._renewal = Renewal(
            store,
            lambda k: f"{fingerprint}/{PINS_DIR}/pin-{self.owner}-{k:08d}",
            self._body,
            lease / 4,
            f"pin on {fingerprint}",
        )

    def _body(self) -> bytes:
        body = {
            "owner": self.owner,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "lease": self.lease,
            "time": time.time(),
        }
        return json.dumps(body).encode()

    def renew(self) -> None:
        """Write the next renewal, then delete the previous one."""
        self._renewal.renew()

    def start(self) -> None:
        """Renew every ``lease / 4`` seconds until :meth:`release`."""
        self._renewal.start("snapstore-pin")
        _active.add(self)

    def release(self) -> None:
        """Stop renewing and delete the pin. Safe to call twice."""
        self._renewal.stop()
        if self._renewal.latest >= 0:
            try:
                self.store.remove_tree(self._renewal.name(self._renewal.latest))
            except Exception:  # best effort (at exit a driver may be shut down): pins expire
                log.debug("could not remove the pin on %s", self.fingerprint, exc_info=True)
            self._renewal.latest = -1


def pin(store: Store, fingerprint: str, lease: float = DEFAULT_LEASE) -> Pin | None:
    """Pin ``fingerprint`` for this reader and record the read; None if the store refuses
    writes (reading goes on unpinned, and cleaning may remove the snapshot)."""
    global _warned
    handle = Pin(store, fingerprint, lease)
    try:
        handle.renew()
        hour = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H")
        store.create_if_absent(f"{fingerprint}/{PINS_DIR}/read-{hour}", b"")
    except (OSError, StoreError) as exc:
        if not _warned:
            log.warning(
                "snapstore: cannot pin %s under %s (%s); reading it unpinned, so `snapstore gc` "
                "could remove it while it is read",
                fingerprint, store.url, exc,
            )  # fmt: skip
            _warned = True
        return None
    handle.start()
    return handle


def list_pins(store: Store, fingerprint: str) -> list[str]:
    """The names in ``fingerprint``'s pins directory (one listing, for the functions below)."""
    return store.list_dir(f"{fingerprint}/{PINS_DIR}")


def live_pins(
    store: Store, fingerprint: str, now: float | None = None, names: list[str] | None = None
) -> list[PinInfo]:
    """The live pins on ``fingerprint`` (an unreadable pin counts as live); ``names`` is a
    listing from :func:`list_pins` to reuse (default: list now)."""
    now = time.time() if now is None else now
    newest: dict[str, int] = {}
    for name in list_pins(store, fingerprint) if names is None else names:
        if m := PIN_NAME.fullmatch(name):
            newest[m.group(1)] = max(newest.get(m.group(1), -1), int(m.group(2)))
    found = []
    for owner, k in newest.items():
        path = f"{fingerprint}/{PINS_DIR}/pin-{owner}-{k:08d}"
        try:
            data: dict[str, Any] = json.loads(store.read_bytes(path))
            info = PinInfo(owner, str(data["host"]), int(data["pid"]), float(data["time"]),
                           float(data["lease"]))  # fmt: skip
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            # Renewed or released since the listing, or unreadable: assume live, so a renewal
            # in flight never lets a snapshot be removed under its reader.
            info = PinInfo(owner, "?", -1, now, DEFAULT_LEASE)
        if info.live(now):
            found.append(info)
    return found


def last_read(store: Store, fingerprint: str, names: list[str] | None = None) -> str | None:
    """When the snapshot was last opened for reading, to the hour (ISO 8601, UTC), if ever;
    ``names`` as for :func:`live_pins`."""
    names = list_pins(store, fingerprint) if names is None else names
    hours = sorted(m.group(1) for n in names if (m := _READ.fullmatch(n)))
    if not hours:
        return None
    stamp = dt.datetime.strptime(hours[-1], "%Y%m%dT%H").replace(tzinfo=dt.UTC)
    return stamp.isoformat(timespec="seconds")
