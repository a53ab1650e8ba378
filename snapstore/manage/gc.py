"""Garbage from failures: uncommitted attempts and expired claims, found and removed safely.

What is garbage, per fingerprint directory:

- a **run** that the commit record does not name (a crashed writer's, or a loser's that crashed
  before removing itself), once it is older than ``min_age`` (its name starts with its UTC start
  time) and no live claim is held on the fingerprint (a live claim's holder may be writing it);
- the **claims** of a committed fingerprint, or of an uncommitted one whose claim has expired or
  was released (see :mod:`snapstore.storage.claims`);
- the **pins** of readers that are gone (see :mod:`snapstore.storage.pins`);
- a **partition** (``<fp>/parts/<p>``) that no shard of the committed manifest points into (a
  Ray Data job's that lost the commit race and crashed before removing its partitions), once
  its newest run is older than ``min_age``;
- under an uncommitted fingerprint, a **partition** of a Ray Data write job (id ``>= 10**6``:
  :class:`snapstore.ray.SnapshotDatasink` numbers them ``job * 10**6 + task``, and no other job
  ever reuses them) once its newest run is older than ``min_age`` and no live claim is held on
  the fingerprint (a running datasink job holds one);
- an empty ``parts`` directory, and the fingerprint directory itself once nothing else is left
  in it.

Under the root's shared partitions (``parts/<stage key>/<partition fp>``, format version 4;
listed with the fingerprints, one more prefix listing), unless a job of the stage holds a live
pin on it (``parts/<stage key>/pins/``: the job is between finding partitions and committing
its snapshot) or a claim on the partition is live:

- a committed **partition** that no committed snapshot's manifest references
  (``shared_partitions``), once its newest run is older than ``min_age`` (the grace for a rerun
  of the stage, and for a job of an older snapstore that does not pin);
- an uncommitted **partition** (its job crashed) once its newest run is older than ``min_age``;
- the **pins** of jobs that are gone, and the stage's directory once nothing is left in it.

A partition judged garbage is removed only if nothing holds it once its commit record has been
taken away (see :mod:`snapstore.manage.release`). While a committed manifest cannot be read,
no committed shared partition is garbage (what it references is unknown); a run a committed
snapshot's shards point into is never garbage.

The rules for runs and claims also apply inside each partition that is kept (a partition is a
small snapshot of its own with runs, claims and a commit record).

**Removal looks again.** Between gc's listing and its removal a job may start on a
fingerprint. So each thing judged garbage is removed only if, by a fresh read of its
directory's commit record and claim just before, the rules still make it garbage (nothing of
an uncommitted fingerprint that a job now claims, never the run a record now names, no
partition a manifest now uses), and only what a fresh listing shows: claim files one by one
(heartbeats first, the claim last), a partition file by file, and a directory never whole:
each of its directories only if it is empty (one step that fails once a job has put a file in
it, on stores with directories; object stores have none to remove). A claim created after the
fresh read is not in its listing, so it stays; one created earlier makes the read see a live
claim. Nothing is left to a decision taken from the first listing.

Never garbage: a commit record, the run it names, a partition the committed manifest uses, a
partition ``0 .. 10**6 - 1`` of an uncommitted fingerprint (a partitioned stage's: a rerun
resumes from it, however old), anything under a fingerprint whose commit record or manifest
cannot be read (``snapstore verify`` reports those; ``snapstore rm`` removes them), and anything
of a fingerprint with a live claim other than its committed snapshot's claims.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import FormatError
from ..format import layout as fmt
from ..read.reader import load_manifest
from ..storage.claims import CLAIMS_DIR, inspect_claim
from ..storage.listing import ListedStore, fingerprint_trees, map_concurrently
from ..storage.pins import PIN_NAME, PINS_DIR, list_pins, live_pins
from ..storage.store import Store, StoreLike, as_store
from ..write.partitions import PARTS_DIR, SHARED_DIR, partition_dir, remove_listed_claims
from .release import References, Removal, read_references, remove_listed, remove_partitions

__all__ = [
    "Garbage",
    "Policy",
    "collect_garbage",
    "find_garbage",
    "last_used",
    "select_snapshots",
]


@dataclass(frozen=True)
class Garbage:
    """One removable thing: ``path`` relative to the store root, its ``kind`` (``run``,
    ``claims``, ``pin``, ``partition`` or ``directory``), why it is garbage, and its size in
    bytes."""

    path: str
    kind: str
    reason: str
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _run_started(run: str) -> float | None:
    """The UTC start time a run's name begins with (``YYYYmmddTHHMMSS-...``), or None."""
    try:
        stamp = dt.datetime.strptime(run[:15], "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return stamp.timestamp()


def find_garbage(
    store: StoreLike, *, min_age: float = 3600.0, now: float | None = None
) -> list[Garbage]:
    """What :func:`collect_garbage` would remove, without removing anything.

    Parameters
    ----------
    store : Store, str or PathLike
        The root to scan: a Store, or a path or URL opened with :func:`snapstore.open_store`.
    min_age : float
        Seconds an uncommitted run must have existed before it counts as abandoned (a slow
        writer without a claim, e.g. an older snapstore, is left alone meanwhile).
    now : float, optional
        Wall time to judge ages and leases by (default: now).
    """
    return _find(as_store(store), min_age, time.time() if now is None else now)[0]


@dataclass
class _Shared:
    """What removing shared partitions needs besides the garbage: the references read, and
    each partition judged garbage with the files listed in it."""

    known: References
    removals: list[Removal]


def _find(store: Store, min_age: float, now: float) -> tuple[list[Garbage], _Shared]:
    if min_age < 0:
        raise ValueError(f"min_age: expected seconds >= 0, found {min_age!r}")
    clock: float = now
    # One listing per fingerprint (and one of the shared partitions), all at once; then each
    # judged from its listing, with only its reads (commit records, manifests, claims, pins)
    # as requests, fingerprints in parallel.
    listed = fingerprint_trees(store)
    shared_tree = listed.pop(SHARED_DIR, {})
    trees = [(fp, tree) for fp, tree in listed.items() if tree]

    def scan(item: tuple[str, dict[str, int]]) -> list[Garbage]:
        fp, tree = item
        listed = ListedStore(store, fp, tree)
        parts, parts_left = _parts_garbage(listed, fp, min_age, clock)
        return parts + _fingerprint_garbage(listed, fp, min_age, clock, parts_left)

    shared = _Shared(References(), [])
    if not shared_tree:
        return [g for found in map_concurrently(scan, trees, _SCAN_WORKERS) for g in found], shared
    # What committed snapshots reference, read while the fingerprints are judged; a directory
    # without a record that a reader holds may be a snapshot being removed whose record
    # comes back.
    committed = [fp for fp, tree in trees if fmt.COMMIT_NAME in tree]
    pinned = [fp for fp, tree in trees if fmt.COMMIT_NAME not in tree and _has_pins(tree)]
    with cf.ThreadPoolExecutor(1, thread_name_prefix="snapstore-gc") as pool:
        references = pool.submit(read_references, store, committed, pinned)
        found = [g for found in map_concurrently(scan, trees, _SCAN_WORKERS) for g in found]
        shared.known = references.result()
    found += _shared_garbage(store, shared_tree, shared, min_age, now)
    return found, shared


def _has_pins(tree: dict[str, int]) -> bool:
    return any(name.startswith(f"{PINS_DIR}/pin-") for name in tree)


# Fingerprints judged at once; each judges up to listing_workers partitions at once.
_SCAN_WORKERS = 16


_OURS = {fmt.COMMIT_NAME, "runs", CLAIMS_DIR, PARTS_DIR, PINS_DIR}

# Partition ids from here on are Ray Data write jobs' (snapstore.ray: job * 10**6 + task index,
# job >= 1): private to the job that wrote them. Ids below are a partitioned stage's 0 .. P-1.
_FIRST_JOB_PARTITION = 10**6


def _parts_garbage(store: Store, fp: str, min_age: float, now: float) -> tuple[list[Garbage], bool]:
    """Garbage under ``<fp>/parts``, and whether anything is left there afterwards."""
    names = store.list_dir(f"{fp}/{PARTS_DIR}")
    if not names:
        return [], False
    used: set[str] | None = None
    if store.exists(f"{fp}/{fmt.COMMIT_NAME}"):
        try:
            manifest = load_manifest(store, fp)
        except (FormatError, FileNotFoundError):
            return [], True  # damaged: for verify and rm, never for gc
        used = _used_partitions(manifest)
    live = used is None and not inspect_claim(store, fp).expired(now)

    def judge(name: str) -> tuple[list[Garbage], bool]:
        """The garbage in partition ``name``, and whether anything of it is left."""
        path = f"{fp}/{PARTS_DIR}/{name}"
        if not fmt.is_plain_name(name):
            return [], True
        why = _partition_reason(store, path, name, used, live, min_age, now)
        if why is not None:
            return [Garbage(path, "partition", why, store.disk_usage(path))], False
        if live and _job_partition(name):
            return [], True  # a running Ray Data job's: its claim covers everything in it
        inner = _fingerprint_garbage(store, path, min_age, now)
        return inner, all(g.path != path for g in inner)

    judged = map_concurrently(judge, names)  # partitions' reads concurrently, kept in order
    return [g for found, _ in judged for g in found], any(left for _, left in judged)


def _used_partitions(manifest: dict[str, Any]) -> set[str]:
    """The partitions a committed manifest uses: those its shards point into, and those it
    names (an empty partition has no shard but is still part of the snapshot)."""
    dirs = [str(s.get("dir", "")).split("/") for s in manifest.get("shards", [])]
    used = {d[1] for d in dirs if len(d) > 1 and d[0] == PARTS_DIR}
    ids = manifest.get("partition_ids", range(int(manifest.get("partitions", 0))))
    used.update(partition_dir("", int(p)).rsplit("/", 1)[-1] for p in ids)
    return used


def _job_partition(name: str) -> bool:
    return name.isdigit() and int(name) >= _FIRST_JOB_PARTITION


def _partition_reason(
    store: Store, path: str, name: str, used: set[str] | None, live: bool, min_age: float,
    now: float,
) -> str | None:  # fmt: skip
    """Why the whole partition at ``path`` is garbage, or None if it is not."""
    if used is not None:
        if name in used:
            return None
        why = "a partition the committed snapshot does not use (a job that lost the commit race)"
    elif live or not _job_partition(name):
        return None  # a partitioned stage's (a rerun resumes from it), or a running job's
    else:
        why = "a partition of a Ray Data write job that is gone (uncommitted, claim expired)"
    started = _partition_started(store, path)
    if started is None or now - started < min_age:
        return None
    return why


def _partition_started(store: Store, path: str) -> float | None:
    """When the newest run of a partition started (its committed run's included), or None if
    no run name tells or its commit record is unreadable."""
    if store.exists(f"{path}/{fmt.COMMIT_NAME}"):
        try:
            data = store.read_bytes(f"{path}/{fmt.COMMIT_NAME}")
            fmt.CommitRecord.from_bytes(data, store.join(path))
        except (FormatError, FileNotFoundError):
            return None  # damaged: for verify and rm, never for gc
    times = [t for run in store.list_dir(f"{path}/runs") if (t := _run_started(run)) is not None]
    return max(times, default=None)


def _shared_garbage(
    store: Store, tree: dict[str, int], shared: _Shared, min_age: float, now: float
) -> list[Garbage]:
    """Garbage under the root's shared partitions (``tree``: their listing), stage by stage;
    the partitions judged garbage are added to ``shared.removals``."""
    listed = ListedStore(store, SHARED_DIR, tree)
    stages = [s for s in listed.list_dir(SHARED_DIR) if fmt.is_plain_name(s)]
    judged = map_concurrently(
        lambda s: _stage_garbage(listed, s, shared.known, min_age, now), stages, _SCAN_WORKERS
    )
    found: list[Garbage] = []
    for garbage, removals in judged:
        found += garbage
        shared.removals += removals
    return found


def _stage_garbage(
    store: ListedStore, stage: str, known: References, min_age: float, now: float
) -> tuple[list[Garbage], list[Removal]]:
    """The garbage of one stage's shared partitions, and the partitions to remove whole."""
    base = f"{SHARED_DIR}/{stage}"
    pinned = list_pins(store, base)
    jobs = {p.owner for p in live_pins(store, base, now, names=pinned)} if pinned else set()
    found: list[Garbage] = []
    for name in pinned:
        match = PIN_NAME.fullmatch(name)
        if match and match.group(1) not in jobs:
            found.append(
                Garbage(f"{base}/{PINS_DIR}/{name}", "pin", "the pin of a job that is gone", 0)
            )
    removals: list[Removal] = []
    left = False
    for name in store.list_dir(base):
        path = f"{base}/{name}"
        if name == PINS_DIR or not fmt.is_plain_name(name):
            left = left or name != PINS_DIR
            continue
        files = store.list_tree(path)
        held = [n[len(CLAIMS_DIR) + 1 :] for n in files if n.startswith(f"{CLAIMS_DIR}/")]
        claim_live = bool(held) and not inspect_claim(store, path, held).expired(now)
        why = None
        if not jobs and not claim_live:  # a running job of the stage may use any of them
            why = _shared_reason(store, path, f"{stage}/{name}", known, min_age, now)
        if why is not None:
            found.append(Garbage(path, "partition", why, store.disk_usage(path)))
            removals.append(Removal(path, tuple(files)))
            continue
        left = True
        keep = frozenset(
            r.rsplit("/", 1)[-1] for r in known.runs if r.startswith(f"{stage}/{name}/runs/")
        )
        inner = _fingerprint_garbage(store, path, min_age, now, keep_runs=keep)
        # Never the directory (a job may be about to compute it), nor a live claim.
        found += [
            g for g in inner if g.kind != "directory" and not (claim_live and g.kind == "claims")
        ]
    if not left and not jobs:
        found.append(Garbage(base, "directory", "no partitions left", 0))
    return found, removals


def _shared_reason(
    store: Store, path: str, ref: str, known: References, min_age: float, now: float
) -> str | None:
    """Why the shared partition at ``path`` (not claimed, its stage not pinned) is garbage, or
    None if it is not: referenced (or references unknown), damaged, or younger than
    ``min_age`` by the start of its newest run."""
    if known.holds(ref) is not None:
        return None
    runs = store.list_dir(f"{path}/runs")
    times = [t for run in runs if (t := _run_started(run)) is not None]
    if store.exists(f"{path}/{fmt.COMMIT_NAME}"):
        started = _partition_started(store, path)
        if started is None or now - started < min_age:
            return None
        return (
            f"a shared partition no committed snapshot references, computed {_ago(now - started)}"
        )
    if times and now - max(times) < min_age:
        return None
    return "a shared partition left uncommitted by a job that is gone (crashed or killed)"


def _ago(seconds: float) -> str:
    for unit, size, upto in (("s", 1, 120), ("min", 60, 7200), ("h", 3600, 172800)):
        if seconds < upto:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds / 86400:.1f} days ago"


def _fingerprint_garbage(
    store: Store,
    fp: str,
    min_age: float,
    now: float,
    parts_left: bool = False,
    keep_runs: frozenset[str] = frozenset(),
) -> list[Garbage]:
    if not _OURS & set(store.list_dir(fp)):
        return []  # not a snapshot directory (someone's notes/): not ours to judge
    committed_run: str | None = None
    if store.exists(f"{fp}/{fmt.COMMIT_NAME}"):
        try:
            data = store.read_bytes(f"{fp}/{fmt.COMMIT_NAME}")
            committed_run = fmt.CommitRecord.from_bytes(data, store.join(fp)).run
        except (FormatError, FileNotFoundError):
            return []  # damaged: for verify and rm, never for gc
    claim = inspect_claim(store, fp)
    live = not claim.expired(now)
    found: list[Garbage] = []
    runs = store.list_dir(f"{fp}/runs")
    for run in runs:
        if run == committed_run or run in keep_runs or (live and committed_run is None):
            continue  # (keep_runs: runs a committed snapshot's shards point into)
        started = _run_started(run)
        if started is None or now - started < min_age:
            continue
        why = (
            "an attempt that lost the commit race or crashed"
            if committed_run
            else ("an uncommitted attempt whose writer is gone (crashed or killed)")
        )
        path = f"{fp}/runs/{run}"
        found.append(Garbage(path, "run", why, store.disk_usage(path)))
    pinned = list_pins(store, fp)
    readers = {p.owner for p in live_pins(store, fp, now, names=pinned)} if pinned else set()
    for name in pinned:
        match = PIN_NAME.fullmatch(name)
        if match and match.group(1) not in readers:
            path = f"{fp}/{PINS_DIR}/{name}"
            found.append(Garbage(path, "pin", "the pin of a reader that is gone", 0))
    claims = store.list_dir(f"{fp}/{CLAIMS_DIR}")
    if claims and not (live and committed_run is None):
        why = "claims of a committed snapshot" if committed_run else "an expired claim"
        path = f"{fp}/{CLAIMS_DIR}"
        found.append(Garbage(path, "claims", why, store.disk_usage(path)))
    removed = {g.path for g in found}
    names = store.list_dir(fp)
    left = [n for n in names if n not in ("runs", CLAIMS_DIR, PINS_DIR, PARTS_DIR)]
    left += [PINS_DIR] if pinned else []
    left += [PARTS_DIR] if parts_left else []
    left += [f"runs/{r}" for r in runs if f"{fp}/runs/{r}" not in removed]
    left += [CLAIMS_DIR] if claims and f"{fp}/{CLAIMS_DIR}" not in removed else []
    if not left and committed_run is None:
        found.append(Garbage(fp, "directory", "nothing left in it", 0))
    elif PARTS_DIR in names and not parts_left:
        found.append(Garbage(f"{fp}/{PARTS_DIR}", "directory", "nothing left in it", 0))
    return found


def collect_garbage(
    store: StoreLike, *, min_age: float = 3600.0, dry_run: bool = False, now: float | None = None
) -> list[Garbage]:
    """Remove uncommitted attempts and expired claims (see the module docstring for the rules).

    Returns
    -------
    list of Garbage
        What was removed (or, with ``dry_run``, what would be).
    """
    store = as_store(store)
    now = time.time() if now is None else now
    found, shared = _find(store, min_age, now)
    if dry_run:
        return found
    whole = {r.path for r in shared.removals}
    stages = [g.path for g in found if g.kind == "directory" and g.path.startswith(SHARED_DIR)]
    recheck = _Recheck(store, now)
    skipped = {
        item.path
        for item in found
        if item.path not in whole and item.path not in stages and not recheck.remove(item)
    }
    # Shared partitions go only if nothing holds them once their records are away (a job may
    # have started on them since the listing); their stage's directory only if left empty.
    kept = remove_partitions(store, shared.removals, shared.known, now=now)
    for path in kept:
        stages = [s for s in stages if not path.startswith(f"{s}/")]
    for stage in stages:
        store.remove_empty_dir(f"{stage}/{PINS_DIR}")
        store.remove_empty_dir(stage)
    if stages:
        store.remove_empty_dir(SHARED_DIR)
    return [g for g in found if g.path not in kept and g.path not in skipped]


@dataclass
class _State:
    """A snapshot's (or a partition's) commit record and claim, read again at removal time."""

    damaged: bool = False
    committed_run: str | None = None
    claim_names: list[str] = field(default_factory=list)
    claim_live: bool = False

    @property
    def writing(self) -> bool:
        """Not committed, and a job holds a live claim: it may be writing anything in it."""
        return self.committed_run is None and self.claim_live


class _Recheck:
    """Removal that looks again first. What was judged garbage from a listing is removed only
    if the rules still say so by a fresh read of its directory's commit record and claim (a
    job may have claimed the fingerprint since), and only what a fresh listing shows: claim
    files one by one, never a directory whole (a file written since the listing stays, and so
    does the directory holding it)."""

    def __init__(self, store: Store, now: float) -> None:
        self.store, self.now = store, now
        self._states: dict[str, _State] = {}

    def state(self, where: str) -> _State:
        """``where``'s state, read the first time one of its items is removed (its items are
        removed one after another, claims and the directory last)."""
        if where not in self._states:
            self._states[where] = self._read(where)
        return self._states[where]

    def _read(self, where: str) -> _State:
        state = _State()
        commit = f"{where}/{fmt.COMMIT_NAME}"
        try:
            data = self.store.read_bytes(commit) if self.store.exists(commit) else None
            if data is not None:
                state.committed_run = fmt.CommitRecord.from_bytes(data, self.store.join(where)).run
        except FileNotFoundError:
            pass  # removed since exists() (rm): uncommitted now
        except FormatError:
            state.damaged = True
            return state
        state.claim_names = self.store.list_dir(f"{where}/{CLAIMS_DIR}")
        claim = inspect_claim(self.store, where, state.claim_names)
        state.claim_live = not claim.expired(self.now) if state.claim_names else False
        return state

    def remove(self, item: Garbage) -> bool:
        """Remove ``item`` if it is still garbage; whether it was removed."""
        store = self.store
        if item.kind == "pin":  # a gone reader's or job's renewal file: never written again
            store.remove_tree(item.path)
            return True
        if item.kind == "directory":
            return self._remove_directory(item.path)
        if item.kind == "run":
            where, _, run = item.path.rsplit("/", 2)
            state = self.state(where)
            if state.damaged or state.writing or run == state.committed_run:
                return False
            store.remove_tree(item.path)  # an attempt's own directory: no other writes in it
            return True
        if item.kind == "claims":
            where = item.path.rsplit("/", 1)[0]
            state = self.state(where)
            if state.damaged or state.writing:
                return False
            remove_listed_claims(store, where, state.claim_names)
            return True
        if item.kind == "partition":
            return self._remove_partition(item.path)
        raise ValueError(f"garbage of kind {item.kind!r}: expected run, claims, pin, ...")

    def _remove_partition(self, path: str) -> bool:
        """A partition of ``<fp>/parts``: still unused by the committed manifest, or still a
        Ray Data job's under an uncommitted fingerprint that no job claims."""
        fp, _, name = path.rsplit("/", 2)
        state = self.state(fp)
        if state.damaged or state.writing:
            return False
        if state.committed_run is not None:
            try:
                if name in _used_partitions(load_manifest(self.store, fp)):
                    return False
            except (FormatError, FileNotFoundError):
                return False
        elif not _job_partition(name):
            return False  # a partitioned stage's, under a snapshot removed since: a rerun's
        remove_listed(self.store, path, self.store.list_tree(path), record=True)
        return True

    def _remove_directory(self, path: str) -> bool:
        """``path`` only if a fresh listing shows no file in it; its directories one by one,
        each only if empty (a job's file written meanwhile keeps them)."""
        listed = self.store.list_tree(path)
        if any(not name.endswith("/") for name in listed):
            return False
        remove_listed(self.store, path, listed)
        return True


@dataclass(frozen=True)
class Policy:
    """Which committed snapshots to remove, besides garbage.

    Attributes
    ----------
    older_than : float, optional
        Remove snapshots not used (read, or created if never read) for this many seconds.
    keep_last : int, optional
        Keep only the ``keep_last`` most recently used snapshots of each stage (see
        :func:`last_used`): a snapshot that jobs read again (a rollback) is kept before newer
        ones that nobody reads.
    max_size : int, optional
        Then remove least recently used snapshots until committed snapshots total at most this
        many bytes.
    """

    older_than: float | None = None
    keep_last: int | None = None
    max_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("older_than", "keep_last", "max_size"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name}: expected a value >= 0, found {value!r}")


def _stamp(text: str | None) -> float:
    if not text:
        return 0.0
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


def last_used(info: dict[str, Any]) -> float:
    """When a snapshot was last used, in seconds since the epoch: the later of its last read
    and its creation (0.0 when neither is known), from a
    :func:`snapstore.manage.catalog.describe` summary.

    Reads are recorded to the hour (``last_read``), so a read counts from the start of its
    hour: of a snapshot read, and another created, within the same hour, the one created after
    the hour began counts as used later. ``gc`` removes by this order and ``ls --sort
    last-used`` lists by it.
    """
    return max(_stamp(info.get("last_read")), _stamp(info.get("created_at")))


def select_snapshots(
    infos: list[dict[str, Any]], policy: Policy, *, now: float | None = None
) -> list[tuple[dict[str, Any], str]]:
    """The committed snapshots ``policy`` removes, least recently used first, with the reason.

    ``infos`` are :func:`snapstore.manage.catalog.describe` summaries. A snapshot that a reader
    holds open (``readers`` > 0) is never selected. Pure: decides, removes nothing.
    """
    now = time.time() if now is None else now
    committed = [i for i in infos if i.get("state") == "committed" and not i.get("readers")]
    used = last_used

    chosen: dict[str, str] = {}
    if policy.older_than is not None:
        for info in committed:
            if now - used(info) > policy.older_than:
                days = (now - used(info)) / 86400
                chosen[info["fingerprint"]] = f"not used for {days:.1f} days"
    if policy.keep_last is not None:
        by_stage: dict[str, list[dict[str, Any]]] = {}
        for info in committed:
            by_stage.setdefault(str(info.get("stage")), []).append(info)
        for stage, group in by_stage.items():
            # Ties (reads in the same hour) go to the more recently created.
            group.sort(key=lambda i: (used(i), _stamp(i.get("created_at"))), reverse=True)
            for info in group[policy.keep_last :]:
                why = f"not among the {policy.keep_last} most recently used of stage {stage}"
                chosen.setdefault(info["fingerprint"], why)
    if policy.max_size is not None:
        kept = sorted(
            (i for i in committed if i["fingerprint"] not in chosen), key=used, reverse=True
        )
        total = sum(int(i["bytes"]) for i in kept)
        while kept and total > policy.max_size:
            info = kept.pop()  # least recently used
            total -= int(info["bytes"])
            chosen[info["fingerprint"]] = "least recently used, over the size limit"
    order = sorted((i for i in committed if i["fingerprint"] in chosen), key=used)
    return [(info, chosen[info["fingerprint"]]) for info in order]
