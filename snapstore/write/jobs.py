"""One job materializing one stage call: claim it and compute, or wait, pass through or raise.

A :class:`StageJob` is what :meth:`snapstore.Snapshot.materialize` hands down when the snapshot
is not committed: the function and its arguments, the stage's settings, and the snapshot as a
:class:`Target` (its store, fingerprint and ``committed`` check). :func:`run_job` claims the
fingerprint (:mod:`snapstore.storage.claims`) and computes, or, while another live job holds the
claim, acts on ``on_busy``: waits for that job's commit (taking the claim over if it stops
renewing it), computes into a private temporary store (``"pass"``), or raises
:class:`~snapstore.errors.BusyError`. A partitioned stage claims partition by partition
(:mod:`snapstore.write.parallel`) and commits the whole when every partition is in.

Why the snapshot was not found is the API's to explain (it reads the catalog, a layer above):
the job calls ``explain(doing)`` once it knows what it does about the miss.
"""

from __future__ import annotations

import inspect
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Protocol

from .. import tracing
from ..errors import BusyError, SnapshotNotFoundError, SnapstoreError, StageError
from ..fingerprint.digest import hash_value
from ..fingerprint.inputs import Inputs
from ..fingerprint.partition import members, partition_fingerprint, stage_key
from ..oldpaths import historic_name
from ..read.reader import load_manifest
from ..storage import claims
from ..storage.store import LocalStore, Store
from .boundaries import content_boundaries
from .engines import PartitionTask, make_engine
from .parallel import PartitionJob, compute_partitions
from .partitions import (
    PartitionLayout,
    commit_partitions,
    holding_stage,
    remove_partition_claims,
)
from .progress import ProgressArg, Reporter, holder_text, open_reporter, tee
from .stageoptions import StageOptions
from .times import WriteTimes, report_times
from .writer import ProgressCallback, SnapshotWriter

__all__ = [
    "StageJob",
    "Target",
    "compute",
    "log_found",
    "partition_calls",
    "partition_layout",
    "remove_owned",
    "run_job",
]

log = logging.getLogger(historic_name(__name__))

Calls = list[tuple[tuple[Any, ...], dict[str, Any]]]


class Target(Protocol):
    """What a job needs of the snapshot it materializes (a :class:`snapstore.Snapshot`).

    ``store`` is replaced by a private temporary store when the job passes through.
    """

    store: Store
    fingerprint: str
    miss_explanation: dict[str, Any] | None

    @property
    def committed(self) -> bool:
        """Whether the snapshot's commit record exists."""
        ...


@dataclass
class StageJob:
    """One call of a stage to materialize into ``target``.

    Parameters
    ----------
    target : Target
        The snapshot: where it goes, under which fingerprint.
    fn : callable
        The stage's function; ``fn(*args, **kwargs)`` yields the samples.
    name : str
        The stage's name, for messages and the manifest.
    args, kwargs
        The call's arguments.
    settings : StageOptions
        The stage's settings (schema, write options, ``on_busy``, lease, partitions, engine).
    clock : Clock
        Time for leases and polls (a fake one in tests).
    manifest : mapping
        What the manifest records of the stage besides the samples (name, fingerprint parts,
        version).
    explain : callable
        ``explain(doing)``: why the snapshot was not found, logged with ``doing`` (what this
        job does about it); stored as the target's ``miss_explanation``.
    times : WriteTimes, optional
        Where the job's time goes (a new one by default).
    """

    target: Target
    fn: Callable[..., Iterable[Mapping[str, Any]]]
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    settings: StageOptions
    clock: claims.Clock
    manifest: Mapping[str, Any]
    explain: Callable[[str], dict[str, Any] | None]
    times: WriteTimes = field(default_factory=WriteTimes)
    """Where the job's time went: what it computed adds to it (see :func:`run_job`)."""

    def explain_miss(self, doing: str = "computing it") -> None:
        try:
            self.target.miss_explanation = self.explain(doing)
        except SnapshotNotFoundError:  # the snapshot compared with was removed meanwhile
            log.debug("snapstore: no miss explanation for %s", self.name, exc_info=True)


def run_job(job: StageJob, progress: ProgressArg | Reporter = None) -> WriteTimes:
    """Materialize ``job.target``: claim it and compute, or wait for the job that holds the
    claim (or pass through, or raise, per ``on_busy``); on any error nothing is visible.
    ``progress`` as for :meth:`snapstore.Snapshot.materialize`; its display is closed on every
    path. Returns where the time went; when this job ran the stage, it is also logged at INFO
    (and printed by a display: see :mod:`snapstore.write.times`)."""
    began = perf_counter()
    reporter = open_reporter(progress, job.name, job.clock)
    times = job.times
    ok = False
    try:
        if job.settings.partition_by is not None:
            _write_partitioned(job, job.settings.partition_by, reporter)
        else:
            _write_claimed(job, reporter)
        times.wall = perf_counter() - began
        if times.computed:
            report_times(times, job.name, reporter)
        ok = True
    finally:
        reporter.close(ok)
    return times


def _claim(job: StageJob, reporter: Reporter) -> tuple[claims.Claim | None, bool]:
    """The claim on the target's fingerprint, once no live job holds it (None when the target
    was committed meanwhile or passed through), and whether this job waited and said so. The
    wait goes to ``job.times.claim``, and is a ``claim`` span."""
    waited = _Wait()
    try:
        return _claim_loop(job, reporter, waited)
    finally:
        job.times.claim += waited.end()


class _Wait:
    """A wait for other jobs, from :meth:`start` (the first call counts) to :meth:`end`."""

    def __init__(self) -> None:
        self.began: tuple[float, float] | None = None  # perf_counter, trace microseconds

    def start(self) -> None:
        if self.began is None:
            self.began = (perf_counter(), tracing.now())

    def end(self) -> float:
        """Seconds waited (0 if never started); traced as a ``claim`` span."""
        if self.began is None:
            return 0.0
        tracing.complete("claim", "write", self.began[1], tracing.now())
        return perf_counter() - self.began[0]


def _claim_loop(
    job: StageJob, reporter: Reporter, waited: _Wait
) -> tuple[claims.Claim | None, bool]:
    snap, lease = job.target, job.settings.lease
    watched: dict[str, Any] = {"lease": lease}
    announced = False
    while True:
        claim, state = claims.acquire(
            snap.store, snap.fingerprint, lease=lease, clock=job.clock, watched=watched
        )
        if claim is not None:
            return claim, announced
        if snap.committed:
            log_found(snap.store, snap.fingerprint, ", committed meanwhile by another job")
            reporter.finish("committed meanwhile by another job")
            return None, announced
        if job.settings.on_busy == "pass":
            job.explain_miss(f"computing it without storing it, since {state.describe()} holds it")
        if on_busy(job, reporter, f"snapshot {snap.fingerprint} of {job.name}", state):
            return None, announced
        if not announced:
            job.explain_miss(f"waiting for {state.describe()}, which is computing it")
            log.info(
                "snapstore: waiting for %s, which is computing %s of %s (lease %.0f s)",
                state.describe(), snap.fingerprint, job.name, lease,
            )  # fmt: skip
            announced = True
        reporter.waiting(f"waiting for {holder_text(state)}")
        waited.start()
        job.clock.sleep(min(lease / 4, 2.0))
        if snap.committed:
            how = f"committed by {state.describe()}, which this job waited for"
            log_found(snap.store, snap.fingerprint, f", {how}")
            reporter.finish(how)
            return None, announced


def _write_claimed(job: StageJob, reporter: Reporter) -> None:
    snap = job.target
    claim, announced = _claim(job, reporter)
    if claim is None:
        return
    reporter.waiting(None)
    report = tee(claim.report, reporter)  # the heartbeats carry it to jobs that wait
    try:
        with claim:
            if not snap.committed:  # else committed between our check and our claim
                if not announced:  # a job that waited explained the miss then (and the
                    # takeover of the claim it waited for is logged by claims.acquire)
                    job.explain_miss()
                compute(job, report)
    except BaseException:
        # The attempt failed (a Ctrl-C too): its claim files would show in ls and gc as a
        # leftover. Claim.abandon keeps them if another job has claimed since.
        claim.abandon((f"{snap.fingerprint}/runs", snap.fingerprint))
        raise
    claims.remove_claims(snap.store, snap.fingerprint)  # committed: nobody needs them


def partition_calls(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    partition_by: str,
    partition_size: int,
) -> Calls:
    """The call ``fn(*args, **kwargs)`` split on its argument ``partition_by`` into calls of
    about ``partition_size`` inputs each, at boundaries the inputs choose
    (:mod:`snapstore.write.boundaries`): ``(args, kwargs)`` per partition.

    Raises
    ------
    TypeError
        If the argument is neither ``snapstore.files(...)`` nor a sequence (a list, tuple or
        range; a string is refused).
    """
    return [(a, k) for a, k, _ in _split(fn, args, kwargs, partition_by, partition_size)[1]]


Split = tuple[dict[str, Any], list[tuple[tuple[Any, ...], dict[str, Any], list[tuple[str, str]]]]]


def _split(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    partition_by: str,
    partition_size: int,
) -> Split:
    """The call's bound arguments, and per partition its call and its members (name and
    identity of each input, see :func:`snapstore.fingerprint.partition.members`)."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    values = bound.arguments[partition_by]
    declared = isinstance(values, Inputs)
    if not declared and (not isinstance(values, Sequence) or isinstance(values, (str, bytes))):
        raise TypeError(
            f"partition_by={partition_by!r}: expected snapstore.files(...) or a sequence (list, "
            f"tuple, range) of inputs, found {type(values).__name__}"
        )
    found = members(values)
    calls = []
    for span in content_boundaries([name for name, _ in found], partition_size):
        part = bound.arguments.copy()
        part[partition_by] = values.take(span) if declared else values[span.start : span.stop]
        piece = inspect.BoundArguments(bound.signature, part)
        calls.append((piece.args, piece.kwargs, found[span.start : span.stop]))
    return dict(bound.arguments), calls


def _shared_layout(job: StageJob, partition_by: str, split: Split) -> PartitionLayout:
    """Where the partitions of ``job`` live: by their own fingerprints, under the stage's key."""
    values, calls = split
    parts = dict(job.manifest.get("fingerprint_parts") or {})
    details = dict(job.manifest.get("fingerprint_details") or {})
    key_fn = job.settings.key
    declared = job.settings.schema
    schema = None if declared is None else declared.to_json()
    stage = stage_key(parts, details, partition_by, values, schema=schema)
    names = []
    for args, kwargs, inputs in calls:
        keyed = None
        if key_fn is not None:  # the partition's own call, as key= sees a whole call
            keyed = hash_value(key_fn(*args, **kwargs), f"key(...) of {job.name}")
        names.append(partition_fingerprint(stage, inputs, arguments=keyed))
    return PartitionLayout.shared(stage, names)


def partition_layout(job: StageJob) -> PartitionLayout:
    """Where the partitions of ``job`` (a call of a partitioned stage) live, committed or not:
    ``parts/<stage key>/<partition fingerprint>``, partition ``p`` at ``layout.dir(p)``.

    Raises
    ------
    ValueError
        If the stage has no ``partition_by``.
    """
    by = job.settings.partition_by
    if by is None:
        raise ValueError(f"{job.name} has no partition_by: it has no partitions")
    split = _split(job.fn, job.args, job.kwargs, by, job.settings.partition_size)
    return _shared_layout(job, by, split)


def _write_partitioned(job: StageJob, partition_by: str, progress: Reporter) -> None:
    """Compute the partitions no other live job holds on the engine and no earlier call of the
    stage has committed, wait for the others (taking over expired claims), then assemble and
    commit. Finished partitions are never recomputed, whichever call of the stage made them."""
    store, settings = job.target.store, job.settings
    split = _split(job.fn, job.args, job.kwargs, partition_by, settings.partition_size)
    layout = _shared_layout(job, partition_by, split)
    # Pinned before the first look at a partition, until the snapshot references them: gc and
    # rm leave the stage's partitions alone meanwhile (snapstore.manage.release).
    with holding_stage(store, layout):
        _compute_and_assemble(job, split, layout, progress)


def _compute_and_assemble(
    job: StageJob, split: Split, layout: PartitionLayout, progress: Reporter
) -> None:
    snap, settings = job.target, job.settings
    store, fp = snap.store, snap.fingerprint
    tasks = [
        PartitionTask(
            job.fn, job.name, args, kwargs, store, fp, p, settings.schema, settings.options,
            layout=PartitionLayout.shared(layout.base.rsplit("/", 1)[-1], [layout.name(p)]),
        )
        for p, (args, kwargs, _) in enumerate(split[1])
    ]  # fmt: skip

    def busy(partition: int, state: claims.ClaimState) -> bool:
        return on_busy(job, progress, f"partition {partition} of {job.name} ({fp})", state)

    parts = PartitionJob(
        store, fp, job.name, tasks, settings.lease, job.clock, busy,
        committed=lambda: snap.committed, progress=progress, layout=layout, times=job.times,
    )  # fmt: skip
    # Which partitions this job computes is decided one by one, as it claims them.
    job.explain_miss("computing the partitions no job holds")
    if not compute_partitions(parts, make_engine(settings.engine, settings.workers), job.fn):
        return
    # No check that another job committed the snapshot meanwhile: compute_partitions did after
    # waiting or computing, and the commit is create-if-absent anyway (a job that loses removes
    # its run). When every partition was there, the check was a round trip before assembling.
    n = len(tasks)
    began = perf_counter()
    with tracing.span("commit", "write", partitions=n):
        commit_partitions(store, fp, n, dict(job.manifest), schema=settings.schema, layout=layout)
    job.times.commit += perf_counter() - began
    remove_partition_claims(store, layout, range(n))


def on_busy(
    job: StageJob, progress: ProgressCallback | None, what: str, state: claims.ClaimState
) -> bool:
    """Another job holds ``what``: raise (``on_busy="error"``), or compute privately and
    return True (``"pass"``), or return False: the caller waits (``"wait"``).

    Raises
    ------
    BusyError
        With ``on_busy="error"``.
    """
    if job.settings.on_busy == "error":
        raise BusyError(
            f"{what} is being computed by {state.describe()} under {job.target.store.url}; wait "
            "for it or share the work (on_busy='wait'), compute without storing "
            "(on_busy='pass'), or try again later"
        )
    if job.settings.on_busy == "pass":
        log.info("snapstore: %s is busy; computing without storing", job.target.fingerprint)
        _pass_through(job, progress)
        return True
    return False


def remove_owned(directory: str, owner: int) -> None:
    """Remove ``directory`` if this process is ``owner`` (the one that made it)."""
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)


def _pass_through(job: StageJob, progress: ProgressCallback | None) -> None:
    """Compute into a private temporary store that the target then reads (removed with it)."""
    directory = tempfile.mkdtemp(prefix="snapstore-pass-")
    # Removed by this process only: a forked DataLoader worker collects its copy of the
    # Snapshot when it opens its own, and must not remove what the parent reads.
    weakref.finalize(job.target, remove_owned, directory, os.getpid())
    job.target.store = LocalStore(directory, fsync=False)
    compute(job, progress)


def compute(job: StageJob, progress: ProgressCallback | None) -> None:
    """Run the stage for the job's arguments and commit, without a claim; on any error nothing
    is visible. Where the time went is added to ``job.times``.

    Raises
    ------
    StageError
        If the function returned something other than an iterable.
    Exception
        Whatever the stage raised, with a note that nothing was committed.
    """
    snap = job.target
    writer = SnapshotWriter(
        snap.store,
        snap.fingerprint,
        job.manifest,
        schema=job.settings.schema,
        options=job.settings.options,
        progress=progress,
    )

    def samples() -> Iterable[Mapping[str, Any]]:
        out = job.fn(*job.args, **job.kwargs)
        if not isinstance(out, Iterable):
            raise StageError(
                f"stage {job.name} returned {type(out).__name__}; expected an iterable of "
                "sample dicts (write it as a generator that yields dicts)."
            )
        return out

    try:
        writer.add_all(samples)
    except BaseException as exc:
        writer.abort()
        exc.add_note(
            f"snapstore: stage {job.name} failed after {writer.samples_written} "
            f"samples; nothing was committed for {snap.fingerprint}."
        )
        raise
    writer.commit()
    job.times.add(writer.times)


def log_found(
    store: Store, fingerprint: str, how: str = "", manifest: Mapping[str, Any] | None = None
) -> None:
    """One INFO line for a cache hit, ``how`` appended (the manifest is read, unless given,
    only when INFO is logged)."""
    if not log.isEnabledFor(logging.INFO):
        return
    try:
        manifest = manifest or load_manifest(store, fingerprint)
    except (SnapstoreError, OSError):  # reading it says what is wrong; a log line need not
        log.debug("snapstore: cannot read the manifest of %s", fingerprint, exc_info=True)
        return
    log.info(
        "snapstore: found snapshot %s of %s under %s (%d samples, %s bytes stored)%s",
        fingerprint, manifest.get("stage") or "?", store.url,
        int(manifest["num_samples"]), f"{int(manifest['stored_bytes']):,}", how,
    )  # fmt: skip
