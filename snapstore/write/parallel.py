"""Computing a partitioned stage's missing partitions on an engine, under claims.

The job that calls the stage keeps everything that makes the snapshot whole: it claims each
partition before sending it to the engine (and keeps the claim's heartbeat while the task runs,
so other jobs of a sweep wait for it instead of computing it twice), waits for partitions other
jobs hold, reports progress, and leaves the commit to its caller. Workers only compute and
commit single partitions (:func:`snapstore.write.engines.run_partition`).

On the first failed partition no new partition starts; the ones running finish (and are kept,
so a rerun skips them), then the failure is raised with the partition it came from. Nothing of
the snapshot is visible until every partition is committed and the caller commits the whole.
The claims this job took are then removed, with the directories a failed partition left empty.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from .. import tracing
from ..oldpaths import historic_name
from ..storage import claims
from ..storage.listing import map_concurrently
from ..storage.store import Store
from .engines import CannotTravelError, Engine, PartitionTask, ThreadEngine, run_partition
from .partitions import (
    PARTS_DIR,
    PartitionLayout,
    PartitionStatus,
    partition_done,
    partition_status,
)
from .progress import Reporter
from .times import WriteTimes
from .writer import ProgressCallback

__all__ = ["PartitionJob", "compute_partitions"]

log = logging.getLogger(historic_name(__name__))

Busy = Callable[[int, claims.ClaimState], bool]
"""Called for a partition another live job holds: raise, return True to stop (the caller
computed the snapshot some other way), or False to wait for it."""


@dataclass
class PartitionJob:
    """One job's view of a partitioned stage being computed."""

    store: Store
    fingerprint: str
    name: str
    tasks: list[PartitionTask]
    lease: float
    clock: claims.Clock
    busy: Busy
    committed: Callable[[], bool]
    progress: ProgressCallback | None = None
    samples: int = 0
    stored_bytes: int = 0
    finished: int = 0
    watched: dict[int, dict[str, Any]] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)  # running when a worker process died
    held: list[tuple[int, claims.Claim]] = field(default_factory=list)  # every claim taken
    waits: dict[int, claims.ClaimState] = field(default_factory=dict)  # held by other jobs
    announced: set[str] = field(default_factory=set)  # holders whose wait was logged
    status: PartitionStatus = field(default_factory=PartitionStatus)  # the newest listing
    fresh: bool = False  # whether ``status`` was listed since the last launch
    layout: PartitionLayout | None = None  # where the partitions are (None: <fp>/parts/<p>)
    times: WriteTimes = field(default_factory=WriteTimes)  # the partitions' times, added up

    @property
    def where(self) -> PartitionLayout:
        """Where the partitions live (see :class:`PartitionLayout`)."""
        return self.layout or PartitionLayout.numbered(self.fingerprint)

    def __post_init__(self) -> None:
        progress = self.progress
        self.reporter = (
            progress
            if isinstance(progress, Reporter)
            else Reporter(self.name, progress, self.clock)
        )

    def done(self, partition: int) -> bool:
        return partition_done(self.store, self.where, partition)

    def refresh(self, tasks: list[PartitionTask]) -> list[PartitionTask]:
        """List the partitions of ``tasks`` (one batch of listings, see
        :func:`partition_status`); the tasks not committed."""
        self.status = partition_status(self.store, self.where, [t.partition for t in tasks])
        self.fresh = True
        return [t for t in tasks if t.partition not in self.status.committed]

    def claim_states(self, tasks: list[PartitionTask]) -> dict[int, claims.ClaimState]:
        """The claims the newest listing shows on ``tasks``, each read (its claim and newest
        heartbeat) concurrently."""
        held = [t.partition for t in tasks if t.partition in self.status.claims]

        def inspect(p: int) -> claims.ClaimState:
            where = self.where.dir(p)
            return claims.inspect_claim(self.store, where, self.status.claims[p])

        return dict(zip(held, map_concurrently(inspect, held)))

    def done_elsewhere(self, count: int) -> None:
        """``count`` pending partitions were committed by other jobs."""
        if count:
            self.finished += count
            self.reporter.partitions(self.finished, len(self.tasks))


def compute_partitions(job: PartitionJob, engine: Engine, stage: Callable[..., Any]) -> bool:
    """Compute every partition of ``job`` that is not committed yet, on ``engine``.

    Returns
    -------
    bool
        True when every partition is committed (the caller assembles and commits the snapshot);
        False when ``job.busy`` stopped the job or the snapshot was committed by another job.

    Raises
    ------
    Exception
        The first partition's failure, with a note naming the partition.
    """
    pending = job.refresh(job.tasks)
    job.finished = len(job.tasks) - len(pending)
    job.reporter.partitions(job.finished, len(job.tasks))
    if not pending:
        return True
    pending, engine = _prepare(pending, engine, stage)
    job.times.workers = max(job.times.workers, engine.workers)
    log.info(
        "snapstore: %s: %d of %d partitions to compute on engine %r with %d workers",
        job.name, len(pending), len(job.tasks), engine.name, engine.workers,
    )  # fmt: skip
    pool = engine.executor()
    running: dict[cf.Future[Any], tuple[int, claims.Claim]] = {}
    clean = False
    try:
        stopped = _run(job, engine, pool, pending, running)
        clean = True
    finally:
        for _, claim in running.values():
            claim.release()
        pool.shutdown(wait=clean, cancel_futures=True)
        if not clean:
            _abandon(job)
    # The loop ends with every partition committed unless it was stopped, failed (raised) or
    # the snapshot was committed meanwhile: no need to ask the store about each partition again
    # (commit_partitions checks them all once more anyway).
    return not stopped and not job.committed()


def _abandon(job: PartitionJob) -> None:
    """After a failure (or a Ctrl-C): remove the claims this job took, committed partitions'
    included (a rerun never claims those again), unless another job claimed one since (see
    :meth:`claims.Claim.abandon`), and the directories of failed partitions left empty."""
    fp, layout = job.fingerprint, job.where
    for partition, claim in job.held:
        where = layout.dir(partition)
        # Empty directories left by a failed partition go; a shared partition's stage
        # directory (parts/<stage key>) only if it is empty too.
        above = (layout.base,) if layout.is_shared else (f"{fp}/{PARTS_DIR}", fp)
        claim.abandon((f"{where}/runs", where, *above))


def _prepare(
    pending: list[PartitionTask], engine: Engine, stage: Callable[..., Any]
) -> tuple[list[PartitionTask], Engine]:
    try:
        return [engine.prepare(t, stage) for t in pending], engine
    except CannotTravelError as exc:
        if not engine.fallback:
            raise
        log.warning("snapstore: %s Running the partitions on threads instead.", exc)
        threads = ThreadEngine(engine.workers)
        return [threads.prepare(t, stage) for t in pending], threads


def _run(
    job: PartitionJob,
    engine: Engine,
    pool: Any,
    pending: list[PartitionTask],
    running: dict[cf.Future[Any], tuple[int, claims.Claim]],
) -> bool:
    """The scheduling loop; True if ``job.busy`` stopped it."""
    failure: tuple[int, BaseException] | None = None
    stopped = False
    while pending or running:
        waiting = False
        if failure is None and not stopped and not job.committed():
            waiting, stopped = _launch(job, engine, pool, pending, running)
            _report_waits(job)
        else:
            pending.clear()
        if not running:
            if pending:  # every remaining partition is held by another job
                _wait_for_others(job)
                pending[:] = _left(job, pending)
            continue
        timeout = min(job.lease / 4, 2.0) if waiting else None
        finished, _ = cf.wait(running, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        for future in finished:
            partition, claim = running.pop(future)
            claim.release()
            try:
                _report(job, future.result())
            except BaseException as exc:
                if isinstance(exc, BrokenProcessPool):
                    job.lost.append(partition)  # all running ones fail: which one died is unknown
                if failure is None:
                    failure = (partition, exc)  # raised once the running ones finish
                elif not isinstance(exc, BrokenProcessPool):
                    log.warning(
                        "snapstore: %s: partition %d failed too: %r", job.name, partition, exc
                    )
    if failure is not None:
        _raise(job, *failure)
    return stopped


def _wait_for_others(job: PartitionJob) -> None:
    """Sleep while other jobs hold every partition left and none of this job's runs: the time
    goes to ``job.times.claim``, and is a ``claim`` span."""
    began, traced = perf_counter(), tracing.now()
    job.clock.sleep(min(job.lease / 4, 2.0))
    tracing.complete("claim", "write", traced, tracing.now())
    job.times.claim += perf_counter() - began


def _launch(
    job: PartitionJob,
    engine: Engine,
    pool: Any,
    pending: list[PartitionTask],
    running: dict[cf.Future[Any], tuple[int, claims.Claim]],
) -> tuple[bool, bool]:
    """Send pending partitions this job can claim, up to ``engine.workers`` in flight.

    Returns (whether some partition waits for another job, whether ``job.busy`` stopped us).
    """
    if len(running) >= engine.workers:
        job.waits.clear()
        return False, False
    held = job.status.claims.keys() | job.waits.keys()
    if not job.fresh and any(t.partition in held for t in pending):
        pending[:] = _left(job, pending)  # other jobs held some: list again, all at once
    listed, job.fresh = job.fresh, False
    states = job.claim_states(pending) if listed else {}
    waiting = False
    job.waits.clear()
    for task in list(pending):
        if len(running) >= engine.workers:
            break
        p = task.partition
        # Listed just now, a partition needs no request of its own to know its status; from
        # an older listing, ask whether it was committed since.
        if p in job.status.committed or (not listed and job.done(p)):
            pending.remove(task)
            job.done_elsewhere(1)
            continue
        # As just listed; from an older listing, inspected afresh (a claim released since,
        # e.g. this job's own after a failed submit, must be seen to be taken over).
        observed = states.get(p, claims.ClaimState()) if listed else None
        claim, state = claims.acquire(
            job.store,
            job.where.dir(p),
            lease=job.lease,
            clock=job.clock,
            watched=job.watched.setdefault(p, {"lease": job.lease}),
            observed=observed,
        )
        if claim is None:
            if job.busy(p, state):
                pending.clear()
                return False, True
            job.waits[p] = state
            waiting = True
            continue
        job.held.append((p, claim))
        claim.start_heartbeat()
        try:
            future = pool.submit(run_partition, task)
        except BrokenProcessPool as exc:
            claim.release()
            if running:  # a worker died; the running partitions' futures will say so
                return waiting, False
            exc.add_note(
                f"snapstore: the worker processes of stage {job.name} died before partition "
                f"{p} could start; {job.fingerprint} is not committed. The {job.finished} "
                "finished partitions are kept; a rerun computes only the missing ones."
            )
            raise
        except BaseException:
            claim.release()
            raise
        running[future] = (p, claim)
        pending.remove(task)
    return waiting, False


def _left(job: PartitionJob, pending: list[PartitionTask]) -> list[PartitionTask]:
    """``pending`` less the partitions committed since, from a new listing."""
    left = job.refresh(pending)
    job.done_elsewhere(len(pending) - len(left))
    return left


def _report_waits(job: PartitionJob) -> None:
    """Tell the reporter which partitions wait for which jobs; log each new holder once."""
    if not job.waits:
        job.reporter.waiting(None)
        return
    by_holder: dict[str, list[int]] = {}
    for p, state in sorted(job.waits.items()):
        by_holder.setdefault(state.describe(), []).append(p)
    held = []
    for who, parts in by_holder.items():
        shown = ", ".join(map(str, parts[:5])) + (", ..." if len(parts) > 5 else "")
        what = f"partition{'s' if len(parts) > 1 else ''} {shown}"
        held.append(f"{what} held by {who}")
        if who not in job.announced:
            job.announced.add(who)
            log.info(
                "snapstore: %s: waiting for %s, which is computing %s (lease %.0f s)",
                job.name, who, what, job.lease,
            )  # fmt: skip
    job.reporter.waiting("waiting for " + "; ".join(held))


def _report(job: PartitionJob, result: Any) -> None:
    job.finished += 1
    job.samples += result.samples
    job.stored_bytes += result.stored_bytes
    times = getattr(result, "times", None)  # None from an engine that times nothing
    if times is not None:
        job.times.add(times)
    log.info(
        "snapstore: %s: partition %d done (%d samples in %.1f s on %s pid %d); %d of %d",
        job.name, result.partition, result.samples, result.seconds, result.host, result.pid,
        job.finished, len(job.tasks),
    )  # fmt: skip
    job.reporter(job.samples, job.stored_bytes)
    job.reporter.partitions(job.finished, len(job.tasks))


def _raise(job: PartitionJob, partition: int, exc: BaseException) -> None:
    if isinstance(exc, BrokenProcessPool):
        lost = ", ".join(map(str, sorted(job.lost)))
        what = (
            f"partitions {lost} of stage {job.name} failed: a worker process died (killed, out "
            "of memory, or crashed in native code) while they ran, and the pool with it"
            if len(job.lost) > 1
            else f"partition {partition} of stage {job.name} failed: its worker process died "
            "(killed, out of memory, or crashed in native code)"
        )
    else:
        what = f"partition {partition} of stage {job.name} failed: it raised"
    them = "them" if len(job.lost) > 1 else "it"
    exc.add_note(
        f"snapstore: {what}. Nothing was committed for {them} and {job.fingerprint} is not "
        f"committed. The {job.finished} finished partitions are kept; a rerun computes only the "
        "missing ones."
    )
    raise exc
