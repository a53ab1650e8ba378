"""Claims: one job computes a fingerprint while the others of a sweep wait, with expiring leases.

A claim is an optimization on top of the commit protocol, never a condition of correctness: the
commit record is created only if absent, so two jobs that both compute (a claim taken over from
a live but slow holder, clocks that disagree) still produce one snapshot, and a crash at any
moment leaves nothing visible. What claims add is that a sweep of N jobs computes once.

Layout, under ``<fp>/claims/`` (every file created once, never overwritten, so any store with a
create-if-absent works, object stores included):

- ``claim-<g>``: generation ``g`` (8 digits) of the claim, created only if absent; JSON with the
  owner id, host, pid, lease seconds and creation time. The highest generation is the claim.
- ``beat-<g>-<k>``: the owner's ``k``-th heartbeat for generation ``g`` (JSON with the wall time,
  and the samples and stored bytes written so far once the owner has reported some), written
  every ``lease / 4`` seconds; the previous one is then deleted.
- ``released-<g>``: the owner gave generation ``g`` up (it committed, or its stage failed);
  JSON with the owner id and the wall time.

A job whose stage failed releases its claim and then removes the claim's files
(:meth:`Claim.abandon`), unless another job has claimed the fingerprint since; a job that
crashes leaves them, and ``snapstore gc`` removes them once they have expired.

A claim is **live** unless it was released or it has **expired**: its newest heartbeat (or the
claim itself, before the first beat) is older than the lease by the observer's wall clock, or
an observer that watches it has seen no new heartbeat for a whole lease by its own monotonic
clock. The second rule needs no agreement between clocks; the first assumes clocks agree to
well within a lease (60 s by default). Clocks that disagree by more cost at most a duplicate
computation, never a wrong snapshot. A holder on the same host whose process is gone (killed,
crashed) has expired at once. Taking over an expired generation ``g`` is creating
``claim-<g+1>`` if absent: exactly one job wins.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..oldpaths import historic_name
from .store import Store

__all__ = [
    "Claim",
    "ClaimState",
    "Clock",
    "SystemClock",
    "acquire",
    "inspect_claim",
    "process_gone",
    "remove_claims",
]

log = logging.getLogger(historic_name(__name__))

CLAIMS_DIR = "claims"
_CLAIM = re.compile(r"claim-(\d{8})")
_BEAT = re.compile(r"beat-(\d{8})-(\d{8})")
_RELEASED = re.compile(r"released-(\d{8})")


class Clock(Protocol):
    """Time as claims see it (tests pass a fake one)."""

    def time(self) -> float: ...
    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clocks."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass
class ClaimState:
    """What an observer knows about a fingerprint's claim.

    Attributes
    ----------
    generation : int
        The newest generation, -1 when there is no claim.
    holder : dict
        The newest claim's JSON (owner, host, pid, lease, created_at), empty when none.
    last_beat : float
        Wall time of the newest heartbeat (or of the claim itself); infinite when the newest
        heartbeat a listing showed was gone when read (the holder beat since: it is alive).
    beat : int
        Number of the newest heartbeat (-1 before the first).
    released : bool
        The holder gave the claim up.
    samples, stored_bytes : int or None
        How far the holder had got at its newest heartbeat; None when the heartbeat does not
        say (none yet, or written by a version of snapstore that did not report progress).
    """

    generation: int = -1
    holder: dict[str, Any] = field(default_factory=dict)
    last_beat: float = 0.0
    beat: int = -1
    released: bool = False
    samples: int | None = None
    stored_bytes: int | None = None

    def expired(self, now: float) -> bool:
        """No claim, released, or no heartbeat for longer than the lease (by wall clock)."""
        if self.generation < 0 or self.released or self.holder_died():
            return True
        lease = self.holder.get("lease")
        if not isinstance(lease, (int, float)):
            return False  # unreadable claim: assume it is alive (the watcher's rule still applies)
        return now - self.last_beat > float(lease)

    def holder_died(self) -> bool:
        """The holder ran on this host and its process is gone (a crash or a kill)."""
        return process_gone(self.holder.get("host"), self.holder.get("pid"))

    def describe(self) -> str:
        h = self.holder
        return f"job {h.get('owner', '?')} (pid {h.get('pid', '?')} on {h.get('host', '?')})"


def process_gone(host: object, pid: object) -> bool:
    """Whether ``pid`` ran on this host (``host``) and no such process exists any more: a
    crashed or killed claim holder, reader or sender. False when it cannot be told (another
    host, no pid) or the process exists, whoever owns it."""
    if host != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # it exists, owned by someone else
    return False


def _path(fingerprint: str, name: str = "") -> str:
    return f"{fingerprint}/{CLAIMS_DIR}" + (f"/{name}" if name else "")


def inspect_claim(store: Store, fingerprint: str, names: list[str] | None = None) -> ClaimState:
    """The state of ``fingerprint``'s claim, from one listing and one or two small reads;
    ``names`` is a listing of its claims directory already taken (then no listing)."""
    names = store.list_dir(_path(fingerprint)) if names is None else names
    generations = [int(m.group(1)) for n in names if (m := _CLAIM.fullmatch(n))]
    if not generations:
        return ClaimState()
    g = max(generations)
    state = ClaimState(generation=g)
    try:
        state.holder = json.loads(store.read_bytes(_path(fingerprint, f"claim-{g:08d}")))
    except (FileNotFoundError, ValueError):
        state.holder = {}  # removed (gc) or half-visible: treat it as just created
    state.last_beat = float(state.holder.get("created_at", 0.0))
    state.released = any(
        (m := _RELEASED.fullmatch(n)) is not None and int(m.group(1)) == g for n in names
    )
    beats = [int(m.group(2)) for n in names if (m := _BEAT.fullmatch(n)) and int(m.group(1)) == g]
    if beats:
        state.beat = max(beats)
        try:
            data = json.loads(
                store.read_bytes(_path(fingerprint, f"beat-{g:08d}-{state.beat:08d}"))
            )
            state.last_beat = max(state.last_beat, float(data["time"]))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            # Deleted by the next beat since the listing: the holder is alive, however old the
            # claim (a listing taken long ago must never make a live claim look expired).
            state.last_beat = math.inf
            return state
        samples, stored = data.get("samples"), data.get("stored_bytes")
        if _count(samples) and _count(stored):
            state.samples, state.stored_bytes = samples, stored
    return state


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Renewal:
    """A file renewed on a daemon thread: each renewal writes ``name(k)`` (a new file, so any
    store works) and then deletes ``name(k - 1)``. Claims' heartbeats and readers' pins are this.

    Parameters
    ----------
    store : Store
        Where the files go.
    name : callable
        ``name(k)``: the path of the ``k``-th renewal.
    body : callable
        The bytes of a renewal, computed when it is written.
    period : float
        Seconds between renewals on the thread.
    what : str
        What is renewed, for the thread name and the warning when a renewal fails.
    """

    def __init__(
        self,
        store: Store,
        name: Callable[[int], str],
        body: Callable[[], bytes],
        period: float,
        what: str,
    ) -> None:
        self.store, self.name, self.body, self.period, self.what = store, name, body, period, what
        self.latest = -1  # number of the newest renewal written, -1 before the first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def renew(self) -> None:
        """Write the next renewal, then delete the previous one."""
        k = self.latest + 1
        self.store.write_bytes(self.name(k), self.body())
        if self.latest >= 0:
            self.store.remove_tree(self.name(self.latest))
        self.latest = k

    def start(self, thread_name: str) -> None:
        """Renew every ``period`` seconds until :meth:`stop`; a failed renewal is retried next
        period (it only risks the lease running out)."""

        def run() -> None:
            while not self._stop.wait(self.period):
                try:
                    self.renew()
                except Exception:
                    log.warning("could not renew the %s", self.what, exc_info=True)

        thread = threading.Thread(target=run, name=thread_name, daemon=True)
        thread.start()  # RuntimeError while the interpreter exits (3.12+): nothing to stop then
        self._thread = thread

    def stop(self) -> None:
        """Stop the thread (and wait for it, unless called from it). Safe to call twice."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None


class Claim:
    """A claim this process holds; renews itself on a heartbeat thread until released.

    Use :func:`acquire` to get one.
    """

    def __init__(
        self,
        store: Store,
        fingerprint: str,
        generation: int,
        owner: str,
        lease: float,
        clock: Clock,
    ) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.generation = generation
        self.owner = owner
        self.lease = lease
        self.released = False
        self._clock = clock
        self._progress: tuple[int, int] | None = None
        self._heartbeat = Renewal(
            store,
            lambda k: _path(fingerprint, f"beat-{generation:08d}-{k:08d}"),
            self._beat_body,
            lease / 4,
            f"claim on {fingerprint}",
        )

    def _beat_body(self) -> bytes:
        body: dict[str, Any] = {"owner": self.owner, "time": self._clock.time()}
        if self._progress is not None:
            body["samples"], body["stored_bytes"] = self._progress
        return json.dumps(body).encode()

    def report(self, samples: int, stored_bytes: int) -> None:
        """How far the computation has got: the next heartbeats carry it, so that jobs
        waiting for this claim can show it (a ``ProgressCallback``)."""
        self._progress = (samples, stored_bytes)

    def beat(self) -> None:
        """Write the next heartbeat and delete the previous one."""
        self._heartbeat.renew()

    def start_heartbeat(self) -> None:
        """Beat every ``lease / 4`` seconds on a daemon thread until :meth:`release`."""
        self._heartbeat.start("snapstore-heartbeat")

    def release(self) -> None:
        """Stop the heartbeat and mark the claim released (others stop waiting for it). Safe
        to call twice."""
        self._heartbeat.stop()
        if self.released:
            return
        self.released = True
        try:
            self.store.create_if_absent(
                _path(self.fingerprint, f"released-{self.generation:08d}"),
                json.dumps({"owner": self.owner, "time": self._clock.time()}).encode(),
            )
        except Exception:  # the lease expires anyway
            log.warning("could not release the claim on %s", self.fingerprint, exc_info=True)

    def abandon(self, empty_dirs: Sequence[str] = ()) -> bool:
        """After a failure: release the claim, then remove its files and those of older
        generations, unless another job has claimed the fingerprint since.

        Parameters
        ----------
        empty_dirs : sequence of str
            Directories the failed attempt may have left empty (its ``runs``, the fingerprint
            directory), removed after the claims in this order if they are empty.

        Returns
        -------
        bool
            Whether the files were removed (best effort: a store error is logged, not raised,
            and the files are left to ``snapstore gc``).
        """
        self.release()
        try:
            if not _remove_through(self.store, self.fingerprint, self.generation):
                return False
            for path in empty_dirs:
                self.store.remove_empty_dir(path)
            return True
        except Exception:
            log.debug("could not remove the claim on %s", self.fingerprint, exc_info=True)
            return False

    def __enter__(self) -> Claim:
        self.start_heartbeat()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def new_owner() -> str:
    """An id for this job's claims: host, pid and random bits."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32]
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


def acquire(
    store: Store,
    fingerprint: str,
    *,
    lease: float,
    owner: str | None = None,
    clock: Clock | None = None,
    watched: dict[str, Any] | None = None,
    observed: ClaimState | None = None,
) -> tuple[Claim | None, ClaimState]:
    """Try to claim ``fingerprint``: create generation 0, or the next one over an expired claim.

    Parameters
    ----------
    store, fingerprint
        What to claim.
    lease : float
        Seconds without a heartbeat after which others may take the claim over.
    owner : str, optional
        This job's id (default: host, pid and random bits).
    clock : Clock, optional
        Wall and monotonic time (tests pass a fake one).
    watched : dict, optional
        State kept between calls by a job that polls: it lets the monotonic rule expire a
        holder whose heartbeats stopped, whatever the clocks say.
    observed : ClaimState, optional
        The claim's state as just inspected (e.g. from a listing of many partitions), instead
        of inspecting it here. A stale one costs at most a failed create: taking a claim is
        creating the next generation only if absent.

    Returns
    -------
    (Claim or None, ClaimState)
        The claim if this call took it (not yet beating: use it as a context manager), and the
        state observed; None with a live holder's state otherwise.
    """
    if lease <= 0:
        raise ValueError(f"lease: expected a positive number of seconds, found {lease!r}")
    clock = clock or SystemClock()
    owner = owner or new_owner()
    state = observed if observed is not None else inspect_claim(store, fingerprint)
    if not state.expired(clock.time()) and not _stalled(state, clock, watched):
        return None, state
    generation = state.generation + 1
    body = {
        "owner": owner,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "lease": lease,
        "created_at": clock.time(),
        "generation": generation,
    }
    name = _path(fingerprint, f"claim-{generation:08d}")
    if not store.create_if_absent(name, json.dumps(body).encode()):
        return None, inspect_claim(store, fingerprint)  # another job took it first
    if state.generation >= 0 and not state.released:
        why = (
            "whose process is gone (it crashed or was killed)"
            if state.holder_died()
            else f"silent for over {lease:.0f} s"
        )
        log.warning("snapstore: took over the claim on %s from %s, %s", fingerprint,
                    state.describe(), why)  # fmt: skip
    return Claim(store, fingerprint, generation, owner, lease, clock), state


def _stalled(state: ClaimState, clock: Clock, watched: dict[str, Any] | None) -> bool:
    """Whether this observer has seen no new heartbeat for a whole lease (monotonic clock)."""
    if watched is None:
        return False
    mark = (state.generation, state.beat)
    now = clock.monotonic()
    if watched.get("mark") != mark:
        watched["mark"], watched["since"] = mark, now
        return False
    lease = state.holder.get("lease")
    limit = float(lease) if isinstance(lease, (int, float)) else float(watched.get("lease", 60.0))
    return now - float(watched["since"]) > limit


def _generation(name: str) -> int | None:
    m = _CLAIM.fullmatch(name) or _RELEASED.fullmatch(name) or _BEAT.fullmatch(name)
    return int(m.group(1)) if m else None


def _remove_through(store: Store, fingerprint: str, generation: int) -> bool:
    """Remove the claim files of ``generation`` (released by its holder, this job) and the
    claims directory if that leaves it empty, when it is the first and only generation;
    nothing otherwise (a newer generation: another job claimed since; an older one: see below).

    Why this never removes a claim that another job holds or is about to hold: a job claims by
    creating ``claim-<max + 1>`` only if absent, where ``max`` is the newest generation it
    lists. (1) Until ``claim-<generation>`` is gone, every job lists it as the newest (or sees
    a newer one), so it can only create a generation above ours: if that happened before our
    listing, we remove nothing; if after, we remove only names at or below ours, never its
    files. (2) ``claim-<generation>`` is removed last, so older generations are gone before a
    job can list this directory as holding none; its new ``claim-00000000`` comes after our
    last removal. (3) Only generation 0 is removed, and only when no other generation exists:
    a holder that was taken over may still be running and write its files later, so the
    numbering must not restart while one exists (its files are left to gc). (4) ``released``
    goes just before the claim file: the other way round, a job could create a new claim of
    that name while our released marker still stood, and others would take its live claim
    for a released one. In between, a job that lists the directory sees our claim
    unreleased and waits one more poll, or takes it over if its lease has run out, which (1)
    covers. (5) The directory
    goes only if it is empty, in one step that fails when another job has put a file in it
    (:meth:`Store.remove_empty_dir`); a job that makes the directory just as we remove it
    retries (see ``store._create_in_dir``). At worst another job waits a poll longer; claims
    are an optimization, and the commit record decides what is committed in any case.
    """
    names = store.list_dir(_path(fingerprint))
    generations = {n: g for n in names if (g := _generation(n)) is not None}
    if generation != 0 or any(g != 0 for g in generations.values()):
        # A later generation took over an earlier holder, which may still be running (slow,
        # or its clock behind) and write its released marker or beats afterwards: were the
        # numbering to restart at 0, those would land on a new job's live claim. Only the
        # first generation, whose files are all ours, is removed; the rest is left to gc.
        return False
    ours = list(generations)
    last = (f"released-{generation:08d}", f"claim-{generation:08d}")
    for name in sorted(ours, key=lambda n: (last.index(n) if n in last else -1, n)):
        store.remove_tree(_path(fingerprint, name))
    store.remove_empty_dir(_path(fingerprint))
    return True


def remove_claims(store: Store, fingerprint: str) -> None:
    """Best effort: delete the claims of a committed fingerprint (left over, gc removes them)."""
    try:
        store.remove_tree(_path(fingerprint))
    except Exception:
        log.debug("could not remove the claims of %s", fingerprint, exc_info=True)
