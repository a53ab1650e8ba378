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

The rules for runs and claims also apply inside each partition that is kept (a partition is a
small snapshot of its own with runs, claims and a commit record).

Never garbage: a commit record, the run it names, a partition the committed manifest uses, a
partition ``0 .. 10**6 - 1`` of an uncommitted fingerprint (a partitioned stage's: a rerun
resumes from it, however old), anything under a fingerprint whose commit record or manifest
cannot be read (``snapstore verify`` reports those; ``snapstore rm`` removes them), and anything
of a fingerprint with a live claim other than its committed snapshot's claims.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import FormatError
from ..format import layout as fmt
from ..read.reader import load_manifest
from ..storage.claims import CLAIMS_DIR, inspect_claim
from ..storage.listing import ListedStore, fingerprint_trees, map_concurrently
from ..storage.pins import PIN_NAME, PINS_DIR, list_pins, live_pins
from ..storage.store import Store, StoreLike, as_store
from ..write.partitions import PARTS_DIR, partition_dir

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
    store = as_store(store)
    if min_age < 0:
        raise ValueError(f"min_age: expected seconds >= 0, found {min_age!r}")
    now = time.time() if now is None else now
    clock: float = now
    # One listing per fingerprint, all at once; then each judged from its listing, with only
    # its reads (commit records, manifests, claims, pins) as requests, fingerprints in parallel.
    trees = [(fp, tree) for fp, tree in fingerprint_trees(store).items() if tree]

    def scan(item: tuple[str, dict[str, int]]) -> list[Garbage]:
        fp, tree = item
        listed = ListedStore(store, fp, tree)
        parts, parts_left = _parts_garbage(listed, fp, min_age, clock)
        return parts + _fingerprint_garbage(listed, fp, min_age, clock, parts_left)

    return [g for found in map_concurrently(scan, trees, _SCAN_WORKERS) for g in found]


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


def _fingerprint_garbage(
    store: Store, fp: str, min_age: float, now: float, parts_left: bool = False
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
        if run == committed_run or (live and committed_run is None):
            continue
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
    found = find_garbage(store, min_age=min_age, now=now)
    if not dry_run:
        for item in found:
            store.remove_tree(item.path)
    return found


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
