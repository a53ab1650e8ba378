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

The race with removal. A reader reads the commit record and starts reading blocks at once; its
pin goes out in the background (:class:`ReadGuard`), and once the pin is written the reader reads
the commit record again (the *confirm-read*). Removal deletes the commit record, then looks for
live pins and restores the record if one appeared (see
:func:`snapstore.manage.catalog.remove_snapshot`). So if the pin was written before removal looked,
removal keeps the snapshot; if after, the confirm-read (which comes after the pin) finds the record
gone or replaced and the reader stops with :class:`~snapstore.errors.SnapshotRemovedError`. A reader
whose confirm-read succeeded keeps its snapshot; blocks read before it are checksummed, so none is
ever wrong, only possibly gone.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import logging
import os
import re
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from ..errors import StoreError
from ..format import layout as fmt
from ..oldpaths import historic_name
from .claims import Renewal, new_owner, process_gone
from .store import Store

__all__ = ["Pin", "PinInfo", "ReadGuard", "last_read", "list_pins", "live_pins", "pin"]

log = logging.getLogger(historic_name(__name__))

PINS_DIR = "pins"
DEFAULT_LEASE = 600.0
PIN_NAME = re.compile(r"pin-(.+)-(\d{8})")
_READ = re.compile(r"read-(\d{8}T\d{2})")
# Seconds between confirm-reads that find no record: a removal that saw the pin puts it back.
CONFIRM_DELAYS = (0.0, 0.5, 1.0, 2.0)
_warned = False
_active: weakref.WeakSet[Pin] = weakref.WeakSet()
_guards: weakref.WeakSet[ReadGuard] = weakref.WeakSet()
# Seconds an exiting process spends taking its pins down (those still on their way included);
# past that, against a store that does not answer, it exits and the pins expire.
_EXIT_WAIT = 5.0
# The thread that takes pins down at exit, started (idle) with the first pin of a process:
# an exit handler may not start a thread (Python 3.12 forbids it), and it must not wait
# without bound on a store that stopped answering. (pid, thread): a forked child has none.
_exit_helper: tuple[int, threading.Thread] | None = None
_exit_lock = threading.Lock()
_exit_requested = threading.Event()
_exit_done = threading.Event()


def _release_now() -> None:
    """Take down this process's pins (not those a forked child inherited from its parent)."""
    pid = os.getpid()
    for guard in list(_guards):
        if guard.pid == pid:
            guard.release(timeout=_EXIT_WAIT)
    for handle in list(_active):
        if handle.pid == pid:
            handle.release()


def _exit_helper_run() -> None:
    _exit_requested.wait()
    try:
        _release_now()
    finally:
        _exit_done.set()


@atexit.register
def _release_all() -> None:
    """A process that exits without closing its snapshots still takes its pins down, those
    still being written in the background included, within :data:`_EXIT_WAIT` seconds.
    A forked child whose parent pinned does nothing: those pins are the parent's."""
    helper = _exit_helper
    if helper is None or helper[0] != os.getpid() or not helper[1].is_alive():
        return  # this process started no pin
    _exit_requested.set()
    _exit_done.wait(_EXIT_WAIT)


def _release_at_exit_first() -> None:
    """Start the exit helper of this process (once), and move :func:`_release_all` to the
    front of the exit handlers (they run last registered first): a filesystem imported after
    this module (gcsfs, s3fs) closes its sessions at exit, and pins must come down, and stop
    renewing, while their store still works."""
    global _exit_helper
    with _exit_lock:
        helper = _exit_helper
        if helper is None or helper[0] != os.getpid() or not helper[1].is_alive():
            _exit_requested.clear()
            _exit_done.clear()
            thread = threading.Thread(target=_exit_helper_run, name="snapstore-pin-exit")
            thread.daemon = True
            thread.start()
            _exit_helper = (os.getpid(), thread)
    atexit.unregister(_release_all)
    atexit.register(_release_all)


@dataclass(frozen=True)
class PinInfo:
    """One reader's newest pin: who, where, and when it was last renewed (wall time)."""

    owner: str
    host: str
    pid: int
    time: float
    lease: float

    def live(self, now: float) -> bool:
        if process_gone(self.host, self.pid):
            return False
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
        self.pid = os.getpid()  # a forked child's copy is its parent's pin, not its own
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
        _release_at_exit_first()

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
        store.create_if_absent(read_marker(fingerprint), b"")
    except (OSError, StoreError) as exc:
        handle.release()  # written before the marker failed: leave no pin behind
        if not _warned:
            log.warning(
                "snapstore: cannot pin %s under %s (%s); reading it unpinned, so `snapstore gc` "
                "could remove it while it is read",
                fingerprint, store.url, exc,
            )  # fmt: skip
            _warned = True
        return None
    try:
        handle.start()
    except RuntimeError:  # the interpreter is exiting (3.12+ starts no thread then): no reads
        handle.release()  # are left to protect, and a pin written now would outlive us
        return None
    return handle


def read_marker(fingerprint: str) -> str:
    """The path of this hour's last-read marker of ``fingerprint``."""
    hour = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H")
    return f"{fingerprint}/{PINS_DIR}/read-{hour}"


class ReadGuard:
    """A reader's pin, written on a background thread so that no request waits for it, then
    the confirm-read of the commit record (see the module docstring for why that is safe).

    Parameters
    ----------
    store : Store
        Where the snapshot lives.
    fingerprint : str
        The snapshot.
    record : bytes
        The commit record the reader opened.
    lease : float
        The pin's lease (see :class:`Pin`).
    start : bool
        Start now; False waits for :meth:`start` (called once a reader's first requests are
        out, so that the pin never delays them).

    Attributes
    ----------
    lost : str or None
        Set when the confirm-read found the record gone or replaced: why, for the error the
        reader raises at its next batch.
    pin : Pin or None
        The pin once written (None before, and for good if the store refuses writes).
    """

    def __init__(
        self,
        store: Store,
        fingerprint: str,
        record: bytes,
        lease: float = DEFAULT_LEASE,
        *,
        start: bool = True,
    ) -> None:
        self.store, self.fingerprint, self.record, self.lease = store, fingerprint, record, lease
        self.pid = os.getpid()
        self.lost: str | None = None
        self.pin: Pin | None = None
        self._released = threading.Event()
        self._started = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="snapstore-pin", daemon=True)
        _guards.add(self)
        if start:
            self.start()

    def start(self) -> None:
        """Write the pin and confirm it on a background thread (once; not after release)."""
        if self._started.is_set():
            return  # started: the common case, on every read of an open snapshot
        with self._lock:
            if not self._released.is_set() and not self._started.is_set():
                _release_at_exit_first()
                self._thread.start()
                self._started.set()

    def _run(self) -> None:
        try:
            handle = pin(self.store, self.fingerprint, self.lease)
        except Exception:  # a failure the store did not classify: read unpinned, and say so
            log.warning("snapstore: could not pin %s", self.fingerprint, exc_info=True)
            return
        with self._lock:
            if self._released.is_set():
                if handle is not None:
                    handle.release()
                return
            self.pin = handle
        if handle is None:
            return
        self.lost = self._confirm()
        if self.lost is not None:  # nothing to protect: take the pin down now
            with self._lock:
                handle, self.pin = self.pin, None
            if handle is not None:
                handle.release()
            self._tidy()

    def _tidy(self) -> None:
        """After a removal that this reader's pin came too late for: remove the last-read
        marker and the directories the pin made again, if no snapshot is there."""
        try:
            if self.store.exists(f"{self.fingerprint}/{fmt.COMMIT_NAME}"):
                return
            self.store.remove_tree(read_marker(self.fingerprint))
            if self.store.remove_empty_dir(f"{self.fingerprint}/{PINS_DIR}"):
                self.store.remove_empty_dir(self.fingerprint)
        except Exception:  # best effort: gc removes a fingerprint directory without a record
            log.debug("could not tidy %s after its removal", self.fingerprint, exc_info=True)

    def _confirm(self) -> str | None:
        """Why the snapshot is not the one opened (None when it is, or cannot be told)."""
        path = f"{self.fingerprint}/{fmt.COMMIT_NAME}"
        for delay in CONFIRM_DELAYS:
            if self._released.wait(delay):
                return None
            try:
                now = self.store.read_bytes(path)
            except FileNotFoundError:
                continue  # a removal that saw our pin puts the record back: look again
            except (OSError, StoreError):
                log.debug("could not confirm the pin on %s", self.fingerprint, exc_info=True)
                return None  # as safe as an unpinned read; the next read will say more
            if now == self.record:
                return None
            return "was committed again (another run replaced the one this reader opened)"
        return "was removed (by `snapstore rm` or `gc`) as this reader opened it"

    @property
    def started(self) -> bool:
        """Whether the pin has been started (it may still be on its way)."""
        return self._started.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the pin is started (a reader starts it once its first requests are out,
        which may be after its first batch), written and confirmed (or refused); False on
        timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._started.wait(timeout):
            return False
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def release(self, timeout: float | None = None) -> None:
        """Stop confirming and take the pin down (a pin still being written is taken down by
        its thread once written, if ``timeout`` ran out first). Safe to call twice."""
        with self._lock:
            self._released.set()
            started = self._started.is_set()
        if started and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._lock:
            handle, self.pin = self.pin, None
        if handle is not None:
            handle.release()


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
