"""Removals racing the jobs that start on the same fingerprint, interleaved on purpose.

A hook wraps the store so that a job's step (a new claim, a new commit) lands exactly between a
remover's decision and its removal: what the job made must survive.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import snapstore
from snapstore.format import layout as fmt
from snapstore.manage import gc
from snapstore.manage.catalog import remove_snapshot
from snapstore.manage.gc import collect_garbage, find_garbage
from snapstore.storage import claims
from snapstore.storage.store import Store

FP = "a" * 32
OLD_RUN = "20200101T000000-host-2-cafecafe"


class OldClock(claims.SystemClock):
    """Two hours ago: a claim taken with it has long expired."""

    def time(self) -> float:
        return time.time() - 7200


def hook(store: Store, methods: tuple[str, ...], when: Callable[[str], bool],
         then: Callable[[], None], *, after: bool = False) -> list[str]:  # fmt: skip
    """Run ``then`` once, before (or ``after``) the first call of one of ``store.<methods>``
    on a ``path`` for which ``when(path)``; returns the list of the path it ran at."""
    fired: list[str] = []
    for method in methods:
        _wrap(store, method, when, then, after, fired)
    return fired


def _wrap(store: Store, method: str, when: Callable[[str], bool], then: Callable[[], None],
          after: bool, fired: list[str]) -> None:  # fmt: skip
    original = getattr(store, method)

    def wrapped(path: str, *args: Any) -> Any:
        armed = not fired and when(path)
        if armed:
            fired.append(path)  # disarmed before ``then`` (which uses the store too)
            if not after:
                then()
        result = original(path, *args)
        if armed and after:
            then()
        return result

    setattr(store, method, wrapped)


# --- gc: a job claims the fingerprint between gc's decision and its removal ---------------------


def abandoned(store: Store) -> None:
    """An uncommitted fingerprint left by a crash: an old run and an expired claim."""
    store.write_bytes(f"{FP}/runs/{OLD_RUN}/shard-00000.snap", b"x" * 50)
    old, _ = claims.acquire(store, FP, lease=60.0, owner="gone", clock=OldClock())
    assert old is not None
    old.beat()


@pytest.mark.parametrize("moment", ["decided", "first-removal", "last-removal"])
def test_gc_never_takes_a_claim_made_after_its_decision(
    store: Store, moment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    abandoned(store)
    assert {g.path for g in find_garbage(store)} == {f"{FP}/runs/{OLD_RUN}", f"{FP}/claims", FP}
    taken: list[claims.Claim] = []

    def job_starts() -> None:
        claim, state = claims.acquire(store, FP, lease=600.0, owner="new-job")
        assert claim is not None, state
        taken.append(claim)

    if moment == "decided":  # right after gc judged everything, before any removal
        find = gc._find

        def decided(*args: Any) -> Any:
            found = find(*args)
            job_starts()
            return found

        monkeypatch.setattr(gc, "_find", decided)
        fired = ["decided"]
    else:  # just before gc's first removal under the fingerprint, or its last (the directory)
        when = (lambda p: p.startswith(FP)) if moment == "first-removal" else (lambda p: p == FP)
        fired = hook(store, ("remove_tree", "remove_empty_dir"), when, job_starts)
    collect_garbage(store)
    assert fired and len(taken) == 1, "the hook never ran"
    state = claims.inspect_claim(store, FP)
    assert state.holder.get("owner") == "new-job", "gc removed the new job's claim"
    assert not state.expired(time.time())
    # The job commits later: its claim and its work were left alone.
    taken[0].release()


def test_gc_still_removes_what_nothing_claimed(store: Store) -> None:
    abandoned(store)
    removed = collect_garbage(store)
    assert {g.path for g in removed} == {f"{FP}/runs/{OLD_RUN}", f"{FP}/claims", FP}
    assert not store.exists(FP) or store.list_tree(FP) == {}
    assert find_garbage(store, min_age=0) == []


# --- rm: a new writer commits while a removal ends ----------------------------------------------


def squares(n: int) -> Iterator[dict[str, int]]:
    for i in range(n):
        yield {"x": i * i}


def write(store: Store, n: int = 20) -> str:
    snap = snapstore.snapshot(squares, root=store)(n)
    snap.materialize()
    fingerprint = snap.fingerprint
    snap.close()
    return fingerprint


def record_run(store: Store, fp: str) -> str:
    where = store.join(f"{fp}/{fmt.COMMIT_NAME}")
    return fmt.CommitRecord.from_bytes(store.read_bytes(f"{fp}/{fmt.COMMIT_NAME}"), where).run


def test_rm_never_deletes_a_record_committed_after_it_read(store: Store) -> None:
    fp = write(store)
    old_run = record_run(store, fp)
    commit = f"{fp}/{fmt.COMMIT_NAME}"
    removed: list[bool] = []

    def watch_removal(path: str) -> bool:
        removed.append(path == commit)
        return False

    hook(store, ("remove_tree",), watch_removal, lambda: None)
    new_runs: list[str] = []

    def writer_commits() -> None:  # a job found the snapshot gone and computed it anew
        write(store)
        new_runs.append(record_run(store, fp))

    # The first look at the record after this remover took it away: the critical moment.
    after_removal = lambda p: p == commit and any(removed)  # noqa: E731
    fired = hook(store, ("exists", "read_bytes"), after_removal, writer_commits)
    remove_snapshot(store, fp)
    assert fired and new_runs and new_runs[0] != old_run, "the hook never ran"
    assert store.exists(commit), "the removal deleted the record a new writer committed"
    assert record_run(store, fp) == new_runs[0]
    with snapstore.open(fp, root=store) as snap:  # whole: its files were left alone too
        assert [int(s["x"]) for s in snap] == [i * i for i in range(20)]


def test_rm_deletes_the_record_a_concurrent_remover_put_back(store: Store) -> None:
    fp = write(store)
    commit = f"{fp}/{fmt.COMMIT_NAME}"
    record = store.read_bytes(commit)
    removed: list[bool] = []

    def watch_removal(path: str) -> bool:
        removed.append(path == commit)
        return False

    hook(store, ("remove_tree",), watch_removal, lambda: None)

    def put_back() -> None:  # another remover saw a reader's pin and restored the record
        store.create_if_absent(commit, record)

    after_removal = lambda p: p == commit and any(removed)  # noqa: E731
    fired = hook(store, ("exists", "read_bytes"), after_removal, put_back)
    remove_snapshot(store, fp)
    assert fired
    assert not store.exists(commit), "a record outlived its files"
