"""What is under a root: the snapshots, their summaries, and removing them.

These are the tools' views (the CLI's ``ls``, ``info`` and ``rm``); readers never list
directories, they start from a commit record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from ..errors import AmbiguousFingerprintError, BusyError, FormatError, SnapshotNotFoundError
from ..fingerprint.digest import Fingerprint
from ..fingerprint.explain import diff_parts
from ..format import layout as fmt
from ..oldpaths import historic_name
from ..read.reader import load_manifest
from ..storage.claims import inspect_claim
from ..storage.listing import ListedStore, fingerprint_trees, map_concurrently, root_missing
from ..storage.pins import PinInfo, last_read, list_pins, live_pins
from ..storage.store import Store, StoreLike, as_store
from ..write.partitions import PARTS_DIR, SHARED_DIR
from .release import PartitionRelease, partitions_of, release_partitions, remove_listed
from .sharing import (
    Sharing,
    diff_partitions,
    list_partitions,
    partition_refs,
    partition_sizes,
    read_references,
)

__all__ = [
    "describe",
    "diff_snapshots",
    "list_fingerprints",
    "list_snapshots",
    "list_snapshots_sharing",
    "previous_of_stage",
    "remove_snapshot",
    "resolve_fingerprint",
    "stored_fingerprint",
]

log = logging.getLogger(historic_name(__name__))


def describe(store: StoreLike, fingerprint: str) -> dict[str, Any]:
    """A JSON-able summary of one fingerprint's directory, committed or not.

    A committed snapshot assembled from shared partitions (format version 4) counts them in
    ``bytes`` and says how many another committed snapshot references too
    (``partitions_shared``, ``shared_bytes``, ``shared_with``): for that, the manifests of the
    root's other committed snapshots are read (concurrently) and its stage's partitions listed.

    ``state`` is ``committed``, ``writing`` (not committed, and a job holds a live claim on it
    or on one of its partitions: ``writer`` names it), ``incomplete`` (runs or partitions
    without a commit and no live claim: left by a crash) or ``corrupt`` (a commit record whose
    manifest does not validate; ``error`` says why).
    ``last_read`` is when a reader last opened it (to the hour, or None) and ``readers`` how
    many hold it open now (live pins). An uncommitted partitioned snapshot also has
    ``partitions_committed``: the partitions a rerun will not compute again.
    """
    store = as_store(store)
    info, refs = _describe(store, fingerprint)
    if refs:
        others = [fp for fp in list_fingerprints(store) if fp != fingerprint]
        sharing = Sharing(
            {**read_references(store, others), fingerprint: refs},
            partition_sizes(list_partitions(store, refs)),
        )
        _account(info, sharing)
    return info


def _account(info: dict[str, Any], sharing: Sharing) -> None:
    """Fill a committed snapshot's partition keys from ``sharing``; its partitions' bytes are
    added to ``bytes``."""
    summary = sharing.summary(info["fingerprint"])
    info["bytes"] += summary["partition_bytes"]
    info.update(summary)  # the keys are there already, in their place


def _describe(store: Store, fingerprint: str) -> tuple[dict[str, Any], list[str]]:
    """:func:`describe` without the accounting of shared partitions, and the partitions the
    snapshot references (empty unless committed and assembled from shared partitions)."""
    if not isinstance(store, ListedStore):  # one recursive listing answers every directory
        store = ListedStore(store, fingerprint, store.list_tree(fingerprint))
    runs = store.list_dir(f"{fingerprint}/runs")
    pinned = list_pins(store, fingerprint)
    info: dict[str, Any] = {
        "fingerprint": fingerprint,
        "runs": len(runs),
        "last_read": last_read(store, fingerprint, pinned),
        "readers": len(live_pins(store, fingerprint, names=pinned)),
    }
    if not store.exists(f"{fingerprint}/{fmt.COMMIT_NAME}"):
        now = time.time()
        claim = inspect_claim(store, fingerprint)
        writer = None if claim.expired(now) else claim.describe()
        if store.is_dir(f"{fingerprint}/{PARTS_DIR}"):
            done, part_writer = _partitions_written(store, fingerprint, now)
            info["partitions_committed"] = done
            writer = writer or part_writer
        state = "writing" if writer else "incomplete"
        info.update(state=state, bytes=store.disk_usage(fingerprint))
        if writer:
            info["writer"] = writer
        return info, []
    try:
        manifest = load_manifest(store, fingerprint)
        refs = partition_refs(manifest)
    except FormatError as exc:
        info.update(state="corrupt", error=str(exc), bytes=store.disk_usage(fingerprint))
        return info, []
    raw, stored = int(manifest["raw_bytes"]), int(manifest["stored_bytes"])
    info.update(
        state="committed",
        stage=manifest.get("stage"),
        created_at=manifest.get("created_at"),
        host=manifest.get("host"),
        run=manifest.get("run"),
        samples=int(manifest["num_samples"]),
        blocks=int(manifest["num_blocks"]),
        shards=len(manifest["shards"]),
        raw_bytes=raw,
        stored_bytes=stored,
        compression_ratio=round(raw / stored, 3) if stored else None,
        bytes=store.disk_usage(fingerprint),
        partitions=int(manifest.get("partitions") or 0),
        partitions_shared=0,
        partition_bytes=0,
        shared_bytes=0,
        shared_with=[],
        schema=manifest["schema"],
        fingerprint_parts=manifest.get("fingerprint_parts", {}),
        fingerprint_details=manifest.get("fingerprint_details", {}),
        version=manifest.get("version"),
        format_version=manifest.get("format_version"),
    )
    return info, refs


def _partitions_written(store: Store, fingerprint: str, now: float) -> tuple[int, str | None]:
    """How many partitions of an uncommitted partitioned snapshot are committed, and who holds
    a live claim on one still being computed (None if nobody)."""
    names = [n for n in store.list_dir(f"{fingerprint}/{PARTS_DIR}") if fmt.is_plain_name(n)]
    wheres = [f"{fingerprint}/{PARTS_DIR}/{name}" for name in names]
    open_ = [w for w in wheres if not store.exists(f"{w}/{fmt.COMMIT_NAME}")]
    # Each claim read concurrently; the first live one (in partition order) names the writer.
    states = map_concurrently(lambda where: inspect_claim(store, where), open_)
    writer = next((s.describe() for s in states if not s.expired(now)), None)
    return len(wheres) - len(open_), writer


def list_snapshots(store: StoreLike) -> list[dict[str, Any]]:
    """Summaries of every snapshot directory (committed or not) under the root, by fingerprint.

    The directories are listed once (:func:`snapstore.storage.listing.fingerprint_trees`), and the
    snapshots described concurrently from those listings: only their reads (commit records,
    manifests, pins, claims) are requests of their own.
    """
    return list_snapshots_sharing(store)[0]


def list_snapshots_sharing(store: StoreLike) -> tuple[list[dict[str, Any]], Sharing]:
    """:func:`list_snapshots`, and who references which shared partition with their bytes (the
    root's ``parts/`` directory is listed with the fingerprint directories, at once)."""
    store = as_store(store)
    trees = fingerprint_trees(store)
    names = [fp for fp, tree in trees.items() if _holds_snapshot(tree)]
    found = map_concurrently(lambda fp: _describe(ListedStore(store, fp, trees[fp]), fp), names)
    sharing = Sharing(
        {info["fingerprint"]: refs for info, refs in found if refs},
        partition_sizes(trees.get(SHARED_DIR, {})),
    )
    for info, refs in found:
        if refs:
            _account(info, sharing)
    return [info for info, _ in found], sharing


def _holds_snapshot(tree: dict[str, int]) -> bool:
    """A commit record, runs or partitions: what :func:`list_fingerprints` looks for."""
    return any(k == fmt.COMMIT_NAME or k.startswith(("runs/", f"{PARTS_DIR}/")) for k in tree)


def remove_snapshot(
    store: StoreLike,
    fingerprint: str,
    *,
    respect_pins: bool = True,
    report: Callable[[PartitionRelease], None] | None = None,
) -> int:
    """Remove a snapshot, and the shared partitions only it used; returns the bytes freed.

    The commit record goes first, so the snapshot stops being visible in one step and a crash
    half-way leaves only unreferenced garbage, never a committed snapshot with missing shards.
    With ``respect_pins`` (the default) a snapshot that a reader has open is kept: live pins are
    checked before, and again after, the commit record is deleted; a reader that pinned in
    between gets the record back (see :mod:`snapstore.storage.pins`).

    A job may find the snapshot gone and compute it again while it is being removed: only what
    a listing taken while the record still stood shows is removed (runs, claim files, pins),
    never a run, claim or record written since, and a commit record is deleted only if it is
    the one this remover read, or names a run it removed (a concurrent remover put it back: no
    record may outlive its files). Stores have no delete-if-unchanged, so that last check is a
    read, then a delete: a record a new writer commits in the moment between them, after
    another remover deleted the one read, would still go (the snapshot is then a miss, and
    computed again; nothing wrong is ever read).

    Then the shared partitions the snapshot referenced go too, unless something else holds
    one: another committed snapshot references it, a claim on it or a pin on its stage is live
    (:func:`snapstore.manage.release.release_partitions`), or, without ``respect_pins``, a
    reader holds this snapshot (it reads from them). The bytes freed include theirs;
    ``report`` is called with what happened to them.

    Raises
    ------
    BusyError
        If a reader holds a live pin on the snapshot.
    """
    store = as_store(store)
    freed = store.disk_usage(fingerprint)
    commit = f"{fingerprint}/{fmt.COMMIT_NAME}"
    if respect_pins:
        _refuse_if_pinned(store, fingerprint)
    refs = partitions_of(store, fingerprint)
    read = bool(refs) and not respect_pins and bool(live_pins(store, fingerprint))
    # Listed while the record stands, so no job has started computing the snapshot anew: what
    # a job writes once the record is gone has names this listing does not show, and stays.
    listed = store.list_tree(fingerprint)
    record = _read_if_present(store, commit)
    if record is not None:
        store.remove_tree(commit)
    # Looked at again whether or not this remover found the record (another may have deleted
    # it a moment ago, and a reader pinned since).
    if respect_pins and (pinned := live_pins(store, fingerprint)):
        if record is not None:
            store.create_if_absent(commit, record)  # a reader started meanwhile: keep it
        # Refused on what was just seen, not on a fresh look: a pin released since would let
        # removal go on past a record just put back, and readers would find it without files.
        _refuse(store, fingerprint, pinned)
    runs = remove_listed(store, fingerprint, listed)
    # A concurrent remover that saw a reader's pin may have put the record back while this one
    # removed what it listed: no record may outlive its files (its readers then stop with
    # SnapshotRemovedError instead of finding the snapshot damaged). A new writer's is kept.
    _remove_record_if_ours(store, fingerprint, record, runs)
    if read:
        released = PartitionRelease(kept=dict.fromkeys(refs, "a reader holds the snapshot"))
    else:
        released = release_partitions(store, refs, exclude=fingerprint)
    if report is not None:
        report(released)
    return freed + released.bytes


def _read_if_present(store: Store, path: str) -> bytes | None:
    try:
        return store.read_bytes(path) if store.exists(path) else None
    except FileNotFoundError:  # removed since exists() (a concurrent remover)
        return None


def _remove_record_if_ours(
    store: Store, fingerprint: str, record: bytes | None, runs: set[str]
) -> None:
    """Delete ``fingerprint``'s commit record if it is ``record`` (the one this remover read),
    or names a run in ``runs`` (removed: its files are gone); keep any other (a new writer's)."""
    commit = f"{fingerprint}/{fmt.COMMIT_NAME}"
    found = _read_if_present(store, commit)
    if found is None:
        return
    if found != record:
        try:
            run = fmt.CommitRecord.from_bytes(found, store.join(commit)).run
        except FormatError:
            run = None  # not a record a writer made: verify reports it
        if run is None or f"runs/{run}" not in runs:
            log.info(
                "snapstore: kept the commit record of %s: a job committed it anew", fingerprint
            )
            return
    store.remove_tree(commit)


def _refuse_if_pinned(store: Store, fingerprint: str) -> None:
    if pinned := live_pins(store, fingerprint):
        _refuse(store, fingerprint, pinned)


def _refuse(store: Store, fingerprint: str, pinned: list[PinInfo]) -> NoReturn:
    raise BusyError(
        f"snapshot {fingerprint} under {store.url} is in use by {pinned[0].describe()}"
        + (f" and {len(pinned) - 1} more" if len(pinned) > 1 else "")
        + "; it was not removed. Retry once they finish, or remove it with --force."
    )


def stored_fingerprint(store: Store, fingerprint: str) -> Fingerprint:
    """The fingerprint (digest, parts, details) recorded in a committed snapshot's manifest."""
    return _recorded_fingerprint(fingerprint, load_manifest(store, fingerprint))


def _recorded_fingerprint(fingerprint: str, manifest: dict[str, Any]) -> Fingerprint:
    return Fingerprint(
        fingerprint,
        dict(manifest.get("fingerprint_parts") or {}),
        dict(manifest.get("fingerprint_details") or {}),
    )


def diff_snapshots(store: StoreLike, a: str, b: str) -> dict[str, Any]:
    """Why snapshot ``b``'s fingerprint differs from ``a``'s, part by part.

    Returns
    -------
    dict
        ``{"a", "b", "differences": [sentences], "parts": {name: {"a", "b", "same"}},
        "partitions"}``; ``partitions`` is None unless one of them is assembled from shared
        partitions, else ``{"shared", "new", "dropped"}``: lists of partitions
        (``<stage key>/<partition fp>``) in both, only in ``b`` and only in ``a``.
    """
    store = as_store(store)
    ma, mb = map_concurrently(lambda fp: load_manifest(store, fp), [a, b])
    fa, fb = _recorded_fingerprint(a, ma), _recorded_fingerprint(b, mb)
    names = sorted(set(fa.parts) | set(fb.parts))
    parts = {
        n: {"a": fa.parts.get(n), "b": fb.parts.get(n), "same": fa.parts.get(n) == fb.parts.get(n)}
        for n in names
    }
    partitions = diff_partitions(partition_refs(ma), partition_refs(mb))
    differences = diff_parts(fa, fb)
    return {"a": a, "b": b, "differences": differences, "parts": parts, "partitions": partitions}


def previous_of_stage(store: Store, stage: str, exclude: str) -> str | None:
    """The most recently created committed snapshot of ``stage`` other than ``exclude``."""

    def stage_of(fp: str) -> tuple[Any, str] | None:  # not the manifest: it may be large
        try:
            manifest = load_manifest(store, fp)
        except FormatError:
            return None  # a damaged snapshot explains nothing; `snapstore verify` reports it
        except SnapshotNotFoundError:
            return None  # removed since the listing (rm, gc): nothing to compare with
        return manifest.get("stage"), str(manifest.get("created_at", ""))

    best: tuple[str, str] | None = None
    fps = [fp for fp in list_fingerprints(store) if fp != exclude]
    for fp, found in zip(fps, map_concurrently(stage_of, fps)):  # read concurrently
        if found is not None and found[0] == stage and (best is None or found[1] > best[0]):
            best = (found[1], fp)
    return best[1] if best else None


def list_fingerprints(store: Store, *, committed_only: bool = True) -> list[str]:
    """Snapshot directories under ``store`` (for tools; readers never list).

    With ``committed_only`` false, directories holding only runs or partitions (being written,
    or left by a crash) are included too.
    """
    names = [n for n in store.list_dir("") if fmt.is_plain_name(n)]

    def wanted(name: str) -> bool:  # the existence checks of all names run concurrently
        if store.exists(f"{name}/{fmt.COMMIT_NAME}"):
            return True
        others = () if committed_only else ("runs", PARTS_DIR)
        return any(store.exists(f"{name}/{other}") for other in others)

    return [n for n, keep in zip(names, map_concurrently(wanted, names)) if keep]


def resolve_fingerprint(store: StoreLike, prefix: str, *, committed_only: bool = True) -> str:
    """The full fingerprint of a snapshot from a unique prefix.

    Raises
    ------
    SnapshotNotFoundError
        If nothing matches (or ``prefix`` is not a plain name, such as ``../x``); the message
        says so when a local root does not exist.
    AmbiguousFingerprintError
        If several snapshots match.
    """
    store = as_store(store)
    if not fmt.is_plain_name(prefix):
        raise SnapshotNotFoundError(
            f"{prefix!r} is not a fingerprint: expected the hex digits `snapstore ls` shows"
        )
    if store.exists(f"{prefix}/{fmt.COMMIT_NAME}"):
        return prefix  # a full fingerprint: no listing needed
    matches = [
        fp
        for fp in list_fingerprints(store, committed_only=committed_only)
        if fp.startswith(prefix)
    ]
    if prefix in matches:
        return prefix
    if not matches:
        kind = "committed snapshot" if committed_only else "snapshot"
        if root_missing(store):
            raise SnapshotNotFoundError(
                f"no {kind} matches {prefix!r}: expected a root directory at {store.url}, "
                "found none (it does not exist); check the path (root=, --root or "
                "$SNAPSTORE_ROOT)"
            )
        raise SnapshotNotFoundError(
            f"no {kind} matches {prefix!r} under {store.url}; `snapstore ls` lists them"
        )
    if len(matches) > 1:
        shown = ", ".join(m[:12] for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise AmbiguousFingerprintError(
            f"{prefix!r} matches {len(matches)} snapshots under {store.url} ({shown}); "
            "give more characters"
        )
    return matches[0]
