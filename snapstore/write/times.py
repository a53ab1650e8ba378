"""Where a materialization's time went: the stage's own code against snapstore's work.

Every :class:`~snapstore.write.writer.SnapshotWriter` fills a :class:`WriteTimes` as it writes,
from ``time.perf_counter`` readings per block (validation is timed on one sample in
:data:`~snapstore.write.writer.TIMED_EVERY` and scaled up, so the stage's loop pays a counter
test per sample, not two clock readings). An engine's workers send theirs back with each
partition's result and the job adds them up (:meth:`WriteTimes.add`). At the end the job logs
one INFO line, which a progress display also prints (:func:`report_times`), and
:attr:`snapstore.Snapshot.write_times` keeps the figures.

Two views, because snapstore encodes and uploads on threads of its own while the stage runs:

- **The stage's thread** (the caller's, or each engine worker's per partition), second by
  second: ``stage`` (inside the stage's code: calling it, and each ``next()`` of what it
  returned), ``validate`` (checking, converting and buffering samples), ``blocked`` (waiting for
  snapstore's encoding and upload threads to catch up: at most ``2 * threads + 1`` blocks are in
  flight, and the last ones are waited for before the commit) and ``commit`` (index, manifest,
  commit record; assembling the partitions). These add up to the materialization's wall time,
  less its set-up and ``claim``; with several engine workers they are summed over the workers.
  :attr:`WriteTimes.stage_share` is the stage's share of them: the share of the time to
  materialize that a faster stage function would save.
- **snapstore's work**, in thread-seconds (seconds of each thread that did it, summed):
  ``validate``, ``encode`` (building the Arrow record batch and serializing it), ``compress``
  (zstd, and the block's checksum), ``upload`` (writing shards to the store) and ``commit``.
  They may add up to more than the wall time: encoding and uploading run beside the stage.

``claim`` is the time spent waiting for other jobs that held the claim on the snapshot (or on a
partition, while this job had nothing of its own to compute): neither side's work.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from ..verdict import WRITE_HINTS
from .progress import sizeof

__all__ = ["WriteTimes", "conclusion", "report_times", "summary"]

log = logging.getLogger(__name__)

STEPS = ("validate", "encode", "compress", "upload", "commit")
"""snapstore's steps, in the order a block goes through them."""

DOCS = "docs/guide 'Where the time goes'"

MIN_SECONDS = 0.5
"""Below this many seconds of the stage's threads (and waits), :func:`conclusion` names no
side: fixed costs (a commit's few writes, threads starting) are most of so short a write, and
no side is worth speeding up."""


@dataclass
class WriteTimes:
    """Where the seconds of a materialization went (see the module docstring for the views).

    Attributes
    ----------
    wall : float
        Seconds from the start of the materialization to its end (0 for one writer's or one
        partition's figures, which have no wall time of their own).
    stage : float
        Seconds the stage's threads spent in the stage's code (summed over engine workers).
    validate, blocked, commit : float
        The rest of the stage's threads' time: validating samples, waiting for snapstore's
        encoding and upload threads, committing (summed over engine workers; ``commit``
        includes the assembly of the partitions).
    encode, compress, upload : float
        Thread-seconds of snapstore's encoding threads (Arrow serialization; zstd and the
        checksum) and of its upload threads (shard writes).
    claim : float
        Seconds spent waiting for other jobs' claims.
    samples, stored_bytes : int
        Samples and stored bytes this job wrote.
    threads : int
        Encoding threads per writer.
    workers : int
        Engine workers that computed partitions (0: the stage ran on the caller's thread).
    partitions : int
        Partitions this job computed.
    computed : bool
        Whether this job ran the stage (False when it only waited for another job, or found
        every partition committed).
    """

    wall: float = 0.0
    stage: float = 0.0
    validate: float = 0.0
    blocked: float = 0.0
    commit: float = 0.0
    encode: float = 0.0
    compress: float = 0.0
    upload: float = 0.0
    claim: float = 0.0
    samples: int = 0
    stored_bytes: int = 0
    threads: int = 0
    workers: int = 0
    partitions: int = 0
    computed: bool = False

    @property
    def snapstore(self) -> float:
        """Seconds of the stage's threads not in the stage: validate + blocked + commit."""
        return self.validate + self.blocked + self.commit

    @property
    def stage_threads(self) -> float:
        """Seconds of the stage's threads: stage + validate + blocked + commit."""
        return self.stage + self.snapstore

    @property
    def stage_share(self) -> float:
        """The stage's share of its threads' time (0 to 1; 0 before anything ran)."""
        total = self.stage_threads
        return self.stage / total if total > 0 else 0.0

    @property
    def work(self) -> dict[str, float]:
        """snapstore's work by step, in thread-seconds: validate, encode, compress, upload,
        commit."""
        return {step: getattr(self, step) for step in STEPS}

    @property
    def bottleneck(self) -> str:
        """``"stage"``, ``"claim"`` (waiting for other jobs), or snapstore's step that did
        the most work (one of :data:`STEPS`)."""
        if self.claim > 0.5 * max(self.wall, self.stage_threads + self.claim):
            return "claim"
        if self.stage_share >= 0.5 or self.stage_threads == 0:
            return "stage"
        work = self.work
        return max(work, key=work.__getitem__)

    def add(self, other: WriteTimes) -> None:
        """Add ``other``'s seconds and counts to these (a partition's into its job's); the
        wall time stays this one's, ``threads`` and ``workers`` the larger."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name == "wall":
                continue
            if f.name in ("threads", "workers"):
                setattr(self, f.name, max(mine, theirs))
            elif f.name == "computed":
                setattr(self, f.name, mine or theirs)
            else:
                setattr(self, f.name, mine + theirs)

    def as_dict(self) -> dict[str, Any]:
        """The figures as a plain dict, with ``stage_share`` and ``bottleneck``."""
        return {**asdict(self), "stage_share": self.stage_share, "bottleneck": self.bottleneck}

    def __str__(self) -> str:
        return summary(self)


def _s(seconds: float) -> str:
    return f"{seconds:.2f}" if seconds < 9.995 else f"{seconds:.1f}"


def conclusion(times: WriteTimes) -> str:
    """Which side to speed up, and how (one sentence or two)."""
    if times.stage_threads + times.claim < MIN_SECONDS:
        return f"It took under {MIN_SECONDS} s: too little to say which side limits it."
    found = times.bottleneck
    if found == "claim":
        return (
            "Most of the time went to waiting for other jobs computing the same snapshot; "
            "there is nothing of this job's to speed up."
        )
    if found == "stage":
        more = "or give it more workers" if times.workers else "or partition it (partition_by)"
        return (
            f"Your stage function takes most of the time: speed it up, {more} to compute it in "
            "parallel."
        )
    return (
        f"snapstore's work dominates, {found} most ({_s(getattr(times, found))} s): try "
        f"{WRITE_HINTS[found]}; see {DOCS}."
    )


def summary(times: WriteTimes, label: str = "") -> str:
    """The line :func:`report_times` logs: counts, the two views, and the conclusion.

    Examples
    --------
    >>> summary(WriteTimes(wall=12.3, stage=9.8, validate=0.3, blocked=2.1, commit=0.1,
    ...                    encode=0.6, compress=1.2, upload=0.3, samples=200_000,
    ...                    stored_bytes=512_000_000, threads=4, computed=True))  # doctest: +SKIP
    'materialized 200,000 samples (512MB stored) in 12.30 s: your stage 9.80 s (80%), ...'
    """
    what = f" of {label}" if label else ""
    where = ""
    if times.workers:
        workers = f"{times.workers} worker{'s' if times.workers > 1 else ''}"
        where = (
            f" in {times.partitions} partition{'s' if times.partitions != 1 else ''} on {workers}"
        )
    head = (
        f"materialized {times.samples:,} samples ({sizeof(times.stored_bytes, 'B')} stored)"
        f"{what}{where} in {_s(times.wall)} s"
    )
    share = times.stage_share
    over = ", summed over the workers" if times.workers > 1 else ""
    split = (
        f"your stage {_s(times.stage)} s ({share:.0%}), snapstore {_s(times.snapstore)} s "
        f"({1 - share:.0%}){over}"
        if times.stage_threads > 0
        else "nothing computed"
    )
    work = ", ".join(f"{step} {_s(seconds)}" for step, seconds in times.work.items())
    each = " each" if times.workers > 1 or times.partitions > 1 else ""
    threads = f" ({times.threads} encoding threads{each})" if times.threads > 1 else ""
    return (
        f"{head}: {split}; waited {_s(times.claim)} s for other jobs. snapstore's work in "
        f"thread-seconds{threads}: {work}. {conclusion(times)}"
    )


class _Summarized(Protocol):
    def summary(self, text: str, logger: logging.Logger) -> None: ...


def report_times(times: WriteTimes, label: str, reporter: _Summarized) -> None:
    """Log the materialization's :func:`summary` at INFO and hand it to ``reporter`` (a
    progress display prints it when it closes, unless the log already shows it there)."""
    text = f"snapstore: {summary(times, label)}"
    reporter.summary(text, log)
    log.info("%s", text)
