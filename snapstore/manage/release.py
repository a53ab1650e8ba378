"""Removing shared partitions without racing the jobs that assemble snapshots from them.

A partitioned stage keeps its partitions once, at ``parts/<stage key>/<partition fp>/``, and the
snapshots assembled from them name them in their manifests (``shared_partitions``). A partition
is **held**, and never removed, while

- a committed snapshot references it (its manifest names it, or a shard points into it);
- a claim on it is live (a job is computing it);
- its stage is pinned (``parts/<stage key>/pins/``): a job of the stage pins it before it looks
  at any partition and until its snapshot is committed (see
  :func:`snapstore.write.partitions.holding_stage`), so a partition it found committed is not
  taken from under it before its snapshot references it;
- a reader holds a snapshot that references it: the snapshot is committed, or (while ``rm``
  checks the reader's pin) its references are unknown, and then nothing is removed.

``gc`` (:mod:`snapstore.manage.gc`) also keeps, for its minimum age, partitions committed or
computed recently; ``rm`` removes what nothing holds.

**The race.** A job may look at a partition between the remover's look and its removal. So the
remover (1) claims the partition (:mod:`snapstore.storage.claims`: one remover at a time, and a
job that wants to compute it waits), (2) takes its commit record away, (3) looks again: the
stage's pins, then snapshots committed since its first look (a job takes its pin down only
after its snapshot is committed, so one of the two shows it), (4) puts the record back if
anything holds the partition now, else removes the runs it listed first (a job computing the
partition anew writes a run of another name) and the claims. A job whose pin was written
before (3) is seen; one whose pin came later looks at the partition after (2) and finds it not
committed, so computes it again rather than use it. A job that reads the partition's record
while it is away looks again a few times (the record is put back within moments). A remover
that dies between (2) and (4) leaves a partition without its record: its snapshot still reads
(shards are found through the snapshot's manifest), a job computes the partition again, and
``gc`` keeps every run a committed snapshot points into.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import FormatError, SnapshotNotFoundError
from ..format import layout as fmt
from ..oldpaths import historic_name
from ..read.reader import load_manifest
from ..storage import claims
from ..storage.claims import CLAIMS_DIR
from ..storage.listing import map_concurrently
from ..storage.pins import live_pins
from ..storage.store import Store
from ..write.partitions import SHARED_DIR, remove_listed_claims
from .sharing import partition_refs

__all__ = [
    "REMOVER_LEASE",
    "PartitionRelease",
    "References",
    "Removal",
    "partitions_of",
    "read_references",
    "release_partitions",
    "remove_listed",
    "remove_partitions",
]

log = logging.getLogger(historic_name(__name__))

REMOVER_LEASE = 300.0
"""Seconds a remover's claim on a partition lives (a removal takes a few requests; a remover
that dies holds a job of the stage back at most this long, or not at all on its own host)."""


@dataclass
class References:
    """What the committed snapshots under a root reference, as read at one moment.

    Attributes
    ----------
    read : set of str
        The snapshots whose manifests were read: they need not be read again.
    refs : set of str
        Partitions they name, ``<stage key>/<partition fp>``.
    runs : set of str
        Runs of partitions their shards point into, ``<stage key>/<partition fp>/runs/<run>``.
    unknown : list of str
        Snapshots whose references cannot be told (a manifest that does not load, or a
        snapshot without its commit record that a reader holds): while there is one, no
        partition is removed.
    """

    read: set[str] = field(default_factory=set)
    refs: set[str] = field(default_factory=set)
    runs: set[str] = field(default_factory=set)
    unknown: list[str] = field(default_factory=list)

    def holds(self, ref: str) -> str | None:
        """Why partition ``ref`` is held by a snapshot, or None."""
        if ref in self.refs:
            return "a committed snapshot references it"
        if self.unknown:
            return f"snapshot {self.unknown[0]} cannot be read, so what it references is unknown"
        return None

    def add(self, fingerprint: str, manifest: dict[str, Any]) -> None:
        """Record what ``manifest`` (of ``fingerprint``) references; a malformed list makes
        its references unknown."""
        try:
            found = partition_refs(manifest)
        except FormatError:
            self.unknown.append(fingerprint)
            return
        self.read.add(fingerprint)
        self.refs.update(found)
        for entry in manifest.get("shards") or []:
            where = entry.get("shared") if isinstance(entry, dict) else None
            if isinstance(where, str):
                self.runs.add(where)


def read_references(
    store: Store, committed: Iterable[str], maybe: Iterable[str] = ()
) -> References:
    """The references of the snapshots ``committed`` (listed with a commit record) and of those
    of ``maybe`` that have one now (``maybe``: directories listed without a record, or new),
    manifests read concurrently.

    A snapshot whose record is gone counts as removed, unless a reader holds a live pin on it
    (a removal that may put the record back): then its references are unknown.
    """
    found = References()
    names = [(fp, True) for fp in committed] + [(fp, False) for fp in maybe]

    def look(item: tuple[str, bool]) -> tuple[str, dict[str, Any] | None, bool]:
        fp, listed = item
        if not listed and not store.exists(f"{fp}/{fmt.COMMIT_NAME}"):
            return fp, None, bool(live_pins(store, fp))
        try:
            return fp, load_manifest(store, fp), False
        except SnapshotNotFoundError:  # removed meanwhile, or its record is being checked
            return fp, None, bool(live_pins(store, fp))
        except FormatError:
            return fp, None, True

    for fp, manifest, unknown in map_concurrently(look, names):
        if manifest is not None:
            found.add(fp, manifest)
        elif unknown:
            found.unknown.append(fp)
    return found


def partitions_of(store: Store, fingerprint: str) -> list[str]:
    """The shared partitions a committed snapshot references, in order (none if it is not
    committed, or is damaged: ``gc`` judges their partitions then)."""
    try:
        return partition_refs(load_manifest(store, fingerprint))
    except (FormatError, FileNotFoundError):  # malformed references: verify reports them
        return []


def snapshot_names(store: Store) -> list[str]:
    """The root's names that may be snapshot directories (one listing)."""
    return [n for n in store.list_dir("") if fmt.is_plain_name(n) and n != SHARED_DIR]


@dataclass(frozen=True)
class Removal:
    """One partition a remover judged removable: ``path`` (``parts/<stage>/<fp>``), and the
    files it listed there then (relative to ``path``), the only ones it removes."""

    path: str
    files: tuple[str, ...]

    @property
    def ref(self) -> str:
        return self.path.removeprefix(f"{SHARED_DIR}/")

    @property
    def stage(self) -> str:
        return self.ref.split("/", 1)[0]


def remove_partitions(
    store: Store, removals: Sequence[Removal], known: References, *, now: float | None = None
) -> dict[str, str]:
    """Remove ``removals`` unless something holds them by then (see the module docstring).

    Parameters
    ----------
    known : References
        The references read when they were judged; snapshots not among ``known.read`` are
        looked at again.

    Returns
    -------
    dict
        The partitions kept after all, by path, with the reason.
    """
    if not removals:
        return {}
    taken = map_concurrently(lambda r: _take(store, r), list(removals))
    kept = {r.path: why for r, (_, _, why) in zip(removals, taken) if why}
    mine = [(r, claim, record) for r, (claim, record, why) in zip(removals, taken) if not why]
    if not mine:
        return kept
    now = time.time() if now is None else now
    # Pins first: a job takes its pin down only once its snapshot is committed, which the
    # snapshots read next then show.
    stages = sorted({r.stage for r, _, _ in mine})
    pinned = map_concurrently(lambda s: bool(live_pins(store, f"{SHARED_DIR}/{s}", now)), stages)
    busy = {s for s, p in zip(stages, pinned) if p}
    fresh = read_references(store, (), [n for n in snapshot_names(store) if n not in known.read])

    def finish(item: tuple[Removal, claims.Claim, bytes | None]) -> str | None:
        removal, claim, record = item
        why = "a job of its stage started meanwhile" if removal.stage in busy else None
        why = why or fresh.holds(removal.ref)
        if why:
            if record is not None:
                store.create_if_absent(f"{removal.path}/{fmt.COMMIT_NAME}", record)
            claim.abandon()
            return why
        _remove_listed(store, removal, claim)
        return None

    for (removal, _, _), why in zip(mine, map_concurrently(finish, mine)):
        if why:
            kept[removal.path] = why
    return kept


def _take(store: Store, removal: Removal) -> tuple[Any, bytes | None, str | None]:
    """Claim the partition and take its commit record away: (claim, record or None, None), or
    (None, None, why) when a job holds it."""
    claim, state = claims.acquire(store, removal.path, lease=REMOVER_LEASE)
    if claim is None:
        return None, None, f"{state.describe()} holds a claim on it"
    commit = f"{removal.path}/{fmt.COMMIT_NAME}"
    try:
        record: bytes | None = store.read_bytes(commit)
    except FileNotFoundError:
        record = None
    if record is not None:
        store.remove_tree(commit)
    return claim, record, None


def remove_listed(
    store: Store, base: str, listed: dict[str, int], *, record: bool = False
) -> set[str]:
    """Remove what ``listed`` (a :meth:`Store.list_tree` of ``base``) shows under ``base``,
    never anything written since: each run directory whole (an attempt never writes into
    another's), claim files one by one, heartbeats first and the claims last (see
    :func:`snapstore.write.partitions.remove_listed_claims`), every other file by name, then
    each listed directory if it is left empty. ``base``'s own commit record is the caller's,
    unless ``record``: then it goes first. Returns the runs removed, relative to ``base``."""
    if record and fmt.COMMIT_NAME in listed:
        store.remove_tree(f"{base}/{fmt.COMMIT_NAME}")
    runs: set[str] = set()
    claimed: dict[str, list[str]] = {}
    dirs: set[str] = set()
    for name in listed:
        parts = name.rstrip("/").split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + (name.endswith("/"))))
        if "runs" in parts[:-1]:
            at = parts.index("runs")
            runs.add("/".join(parts[: at + 2]))
        elif len(parts) >= 2 and parts[-2] == CLAIMS_DIR and not name.endswith("/"):
            claimed.setdefault("/".join(parts[:-2]), []).append(parts[-1])
        elif name != fmt.COMMIT_NAME and not name.endswith("/"):
            store.remove_tree(f"{base}/{name}")
    for run in sorted(runs):
        store.remove_tree(f"{base}/{run}")
    for where, names in sorted(claimed.items()):
        remove_listed_claims(store, f"{base}/{where}" if where else base, names)
    for path in sorted(dirs, key=lambda d: (-d.count("/"), d)):
        store.remove_empty_dir(f"{base}/{path}")
    store.remove_empty_dir(base)
    return runs


def _remove_listed(store: Store, removal: Removal, claim: claims.Claim) -> None:
    """Remove what was listed in the partition (never a run written since), then the claim
    files listed and this remover's own, last (a job that lists the claims meanwhile waits for
    it, then claims anew), then the directories left empty, each only if empty."""
    runs = {f.split("/", 2)[1] for f in removal.files if f.startswith("runs/")}
    for run in sorted(runs):
        store.remove_tree(f"{removal.path}/runs/{run}")
    for name in removal.files:
        if not name.startswith(("runs/", f"{CLAIMS_DIR}/")) and name != fmt.COMMIT_NAME:
            store.remove_tree(f"{removal.path}/{name}")
    held = [n[len(CLAIMS_DIR) + 1 :] for n in removal.files if n.startswith(f"{CLAIMS_DIR}/")]
    remove_listed_claims(store, removal.path, [*held, f"claim-{claim.generation:08d}"])
    for path in (f"{removal.path}/runs", removal.path):
        store.remove_empty_dir(path)


@dataclass(frozen=True)
class PartitionRelease:
    """What removing a snapshot did to the shared partitions it referenced.

    Attributes
    ----------
    removed : dict
        Partitions removed (``<stage key>/<partition fp>``) and their bytes.
    kept : dict
        Partitions kept, with why (another snapshot references it, a job holds it, ...).
    """

    removed: dict[str, int] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.removed.values())


def release_partitions(
    store: Store, refs: Sequence[str], *, exclude: str = "", dry_run: bool = False
) -> PartitionRelease:
    """Remove the shared partitions ``refs`` (those of a snapshot just removed) that nothing
    else holds: no other committed snapshot references them, no claim on them and no pin on
    their stage is live. No minimum age: the caller asked for the removal.

    Parameters
    ----------
    refs : sequence of str
        ``<stage key>/<partition fp>``, as a manifest's ``shared_partitions``.
    exclude : str
        The removed snapshot's fingerprint, not read again.
    dry_run : bool
        Judge, remove nothing.
    """
    wanted = [r for r in dict.fromkeys(refs) if _plain_ref(r)]
    if not wanted:
        return PartitionRelease()
    names = [n for n in snapshot_names(store) if n != exclude]
    listed = map_concurrently(lambda n: store.exists(f"{n}/{fmt.COMMIT_NAME}"), names)
    known = read_references(store, [n for n, c in zip(names, listed) if c])
    kept = {r: why for r in wanted if (why := known.holds(r))}
    stages = sorted({r.split("/", 1)[0] for r in wanted if r not in kept})
    pinned = map_concurrently(lambda s: bool(live_pins(store, f"{SHARED_DIR}/{s}")), stages)
    busy = {s for s, p in zip(stages, pinned) if p}
    candidates = [r for r in wanted if r not in kept]
    trees = map_concurrently(lambda r: store.list_tree(f"{SHARED_DIR}/{r}"), candidates)
    removals, sizes = [], {}
    now = time.time()
    for ref, tree in zip(candidates, trees):
        path = f"{SHARED_DIR}/{ref}"
        if not tree:
            continue  # gone already
        if ref.split("/", 1)[0] in busy:
            kept[ref] = "a job of its stage is running"
            continue
        held = [n.split("/", 1)[1] for n in tree if n.startswith(f"{CLAIMS_DIR}/")]
        state = claims.inspect_claim(store, path, held) if held else None
        if state is not None and not state.expired(now):
            kept[ref] = f"{state.describe()} holds a claim on it"
            continue
        removals.append(Removal(path, tuple(tree)))
        sizes[ref] = sum(tree.values())
    if not dry_run:
        for path, why in remove_partitions(store, removals, known, now=now).items():
            ref = path.removeprefix(f"{SHARED_DIR}/")
            kept[ref] = why
            sizes.pop(ref, None)
    for ref, why in kept.items():
        log.info("snapstore: kept shared partition %s: %s", ref, why)
    return PartitionRelease(sizes, kept)


def _plain_ref(ref: str) -> bool:
    parts = ref.split("/")
    return len(parts) == 2 and all(fmt.is_plain_name(p) for p in parts)
