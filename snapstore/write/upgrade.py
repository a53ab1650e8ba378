"""Snapshots an earlier release wrote for a stage call: finding one, and rewriting it on request.

When a call's fingerprint is not committed, :meth:`snapstore.Snapshot.materialize` asks, before
computing anything, whether a release with an earlier format version (or a fingerprint scheme
that only named things differently) committed the same call under the fingerprint it gave it
(:mod:`snapstore.fingerprint.earlier` computes those, without I/O). :func:`first_committed`
checks them all at once, one existence request each, only on such a miss. The snapshot found is
read as it is (readers read every earlier version) and :func:`log_earlier` says so; nothing is
computed. With the stage's ``upgrade=True`` it is first rewritten under the current fingerprint
in the current format (:func:`rewrite`: its samples read and written again, not computed), by
the one job that claims the current fingerprint; jobs that find the claim held read the
earlier snapshot meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import SnapstoreError
from ..fingerprint.earlier import Naming
from ..format import layout as fmt
from ..read.reader import SnapshotReader
from ..storage import claims, pins
from ..storage.listing import map_concurrently
from ..storage.store import Store
from .jobs import StageJob, log_found
from .progress import ProgressArg, open_reporter, tee
from .writer import ProgressCallback, SnapshotWriter

__all__ = ["first_committed", "log_earlier", "rewrite"]


def first_committed(store: Store, fingerprints: Sequence[str]) -> int | None:
    """The position in ``fingerprints`` of the first one with a commit record, or None; every
    record is looked for at once (one existence request each)."""
    found = map_concurrently(lambda fp: store.exists(f"{fp}/{fmt.COMMIT_NAME}"), fingerprints)
    return next((i for i, committed in enumerate(found) if committed), None)


def log_earlier(store: Store, found: str, naming: Naming, call: str, upgraded: bool) -> None:
    """The INFO line (through :func:`~snapstore.write.jobs.log_found`) for a call whose snapshot
    ``found`` a release of ``naming`` wrote, ``call`` being its fingerprint now; ``upgraded``:
    it was just rewritten under ``call``."""
    if upgraded:
        how = (
            f", rewritten in format version {fmt.FORMAT_VERSION} (nothing computed) from "
            f"snapshot {found}, which {naming} wrote for this call; that one stays until "
            "removed (`snapstore rm`, `snapstore gc`)"
        )
        log_found(store, call, how)
        return
    how = (
        f", written by {naming} for this call, whose fingerprint is now {call}; reading "
        f"it, nothing is computed. To rewrite it in format version {fmt.FORMAT_VERSION}, "
        "materialize the stage once with upgrade=True"
    )
    log_found(store, found, how)


def rewrite(job: StageJob, source: str, naming: Naming, progress: ProgressArg = None) -> bool:
    """Write the samples of snapshot ``source`` (the snapshot a release of ``naming`` wrote for
    the same call) again as ``job``'s snapshot, in the current format, under a claim on its
    fingerprint. ``progress`` as for :meth:`snapstore.Snapshot.materialize`.

    Returns
    -------
    bool
        True if the job's snapshot is committed now (by this call, or meanwhile by another
        job); False if another live job holds its claim (it computes or rewrites it), and
        nothing was done.

    Raises
    ------
    SnapstoreError
        If ``source`` cannot be read (removed meanwhile, damaged); nothing was committed.
    """
    snap, lease = job.target, job.settings.lease
    claim, _ = claims.acquire(
        snap.store, snap.fingerprint, lease=lease, clock=job.clock, watched={"lease": lease}
    )
    if claim is None:
        return snap.committed
    reporter = open_reporter(progress, job.name, job.clock)
    ok = False
    try:
        with claim:
            if not snap.committed:
                _copy_samples(job, source, naming, tee(claim.report, reporter))
        ok = True
    except BaseException:
        claim.abandon((f"{snap.fingerprint}/runs", snap.fingerprint))
        raise
    finally:
        reporter.close(ok)
    claims.remove_claims(snap.store, snap.fingerprint)
    return True


def _copy_samples(
    job: StageJob, source: str, naming: Naming, progress: ProgressCallback | None
) -> None:
    """Read ``source`` (pinned, so that cleaning leaves it while it is read) into a writer of
    the job's snapshot, with the source's schema; commit, or on any error leave nothing."""
    store = job.target.store
    reader = SnapshotReader(store, source)
    guard = pins.ReadGuard(store, source, reader.record)
    reader.guard = guard
    manifest = {
        **job.manifest,
        "rewritten_from": {
            "fingerprint": source,
            "format_version": naming.format_version,
            "scheme": naming.scheme,
        },
    }
    writer = SnapshotWriter(
        store,
        job.target.fingerprint,
        manifest,
        schema=reader.schema,
        options=job.settings.options,
        progress=progress,
    )
    try:
        for sample in reader:
            writer.add(sample)
    except BaseException as exc:
        writer.abort()
        if isinstance(exc, SnapstoreError):
            exc.add_note(f"snapstore: rewriting {source} failed; nothing was committed.")
        raise
    finally:
        guard.release()
    writer.commit()
