"""Claims and leases: one computation per sweep, takeover of expired claims, on_busy, gc."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.main import main
from snapstore.errors import BusyError
from snapstore.manage.gc import collect_garbage, find_garbage
from snapstore.storage import claims
from snapstore.storage.store import LocalStore, Store
from snapstore.write.jobs import partition_layout
from snapstore.write.partitions import partition_done

FP = "f" * 32


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


class FakeClock:
    """Wall and monotonic time that move only when told (sleep advances both)."""

    def __init__(self, wall: float = 1_000_000.0) -> None:
        self.wall = wall
        self.mono = 0.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def foreign(store: Store, clock: FakeClock, lease: float = 10.0, owner: str = "other"):
    """A claim held by a job on another host (so the dead-process rule does not apply)."""
    claim, _ = claims.acquire(store, FP, lease=lease, owner=owner, clock=clock)
    assert claim is not None
    body = json.loads(store.read_bytes(f"{FP}/claims/claim-{claim.generation:08d}"))
    body["host"] = "elsewhere"
    store.remove_tree(f"{FP}/claims/claim-{claim.generation:08d}")
    store.write_bytes(f"{FP}/claims/claim-{claim.generation:08d}", json.dumps(body).encode())
    return claim


def test_first_claim_wins_and_others_see_it_live(store: Store) -> None:
    clock = FakeClock()
    holder = foreign(store, clock)
    assert holder.generation == 0
    claim, state = claims.acquire(store, FP, lease=10.0, owner="me", clock=clock)
    assert claim is None and state.generation == 0 and state.holder["owner"] == "other"
    assert "job other" in state.describe()


def test_an_expired_claim_is_taken_over_once(store: Store) -> None:
    clock = FakeClock()
    foreign(store, clock)
    clock.advance(10.5)
    results = []

    def take(owner: str) -> None:
        results.append(claims.acquire(store, FP, lease=10.0, owner=owner, clock=clock)[0])

    threads = [threading.Thread(target=take, args=(f"job{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [c for c in results if c is not None]
    assert len(winners) == 1 and winners[0].generation == 1


def test_heartbeats_keep_a_claim_alive(store: Store) -> None:
    clock = FakeClock()
    holder = foreign(store, clock)
    for _ in range(10):
        clock.advance(6.0)  # more than the lease in total, less than it between beats
        holder.beat()
        claim, state = claims.acquire(store, FP, lease=10.0, owner="me", clock=clock)
        assert claim is None and state.beat >= 0
    beats = [n for n in store.list_dir(f"{FP}/claims") if n.startswith("beat-")]
    assert len(beats) == 1  # each beat deletes the previous one


def test_a_stale_listing_never_makes_a_live_claim_look_expired(store: Store) -> None:
    """gc and partitioned jobs judge claims from listings taken earlier: if the holder beat
    since, the beat the listing names is gone, and the holder is alive however old its claim
    (not expired since its creation, which would let gc remove its files or a job take it)."""
    clock = FakeClock()
    holder = foreign(store, clock)
    for _ in range(3):
        clock.advance(6.0)
        holder.beat()
    names = store.list_dir(f"{FP}/claims")  # the listing
    clock.advance(6.0)
    holder.beat()  # deletes the beat the listing shows
    clock.advance(60.0)  # the claim is far older than its lease of 10 s
    state = claims.inspect_claim(store, FP, names)
    assert not state.expired(clock.time())
    claim, _ = claims.acquire(store, FP, lease=10.0, owner="me", clock=clock, observed=state)
    assert claim is None


def test_a_watcher_expires_a_silent_holder_whatever_the_clocks_say(store: Store) -> None:
    clock = FakeClock()
    holder = foreign(store, clock)
    holder_clock_ahead = FakeClock(wall=clock.wall + 3600)  # the holder's clock is an hour ahead
    holder._clock = holder_clock_ahead
    holder.beat()  # its last beat claims to be from the future, so the wall rule says "live"
    watched: dict = {}
    for _ in range(4):
        assert claims.acquire(store, FP, lease=10.0, clock=clock, watched=watched)[0] is None
        clock.advance(3.0)
    clock.advance(3.0)  # 15 s of silence by the watcher's own monotonic clock
    claim, _ = claims.acquire(store, FP, lease=10.0, clock=clock, watched=watched)
    assert claim is not None and claim.generation == 1


def test_a_released_claim_is_free_at_once(store: Store) -> None:
    clock = FakeClock()
    holder = foreign(store, clock)
    holder.release()
    claim, state = claims.acquire(store, FP, lease=10.0, clock=clock)
    assert state.released and claim is not None and claim.generation == 1


def test_a_dead_holder_on_this_host_is_expired_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalStore(tmp_path)
    clock = FakeClock()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    claim, _ = claims.acquire(store, FP, lease=1000.0, clock=clock)
    assert claim is not None
    body = json.loads(store.read_bytes(f"{FP}/claims/claim-00000000"))
    body["pid"] = int(child.stdout)  # that process has exited
    store.remove_tree(f"{FP}/claims/claim-00000000")
    store.write_bytes(f"{FP}/claims/claim-00000000", json.dumps(body).encode())
    with caplog.at_level(logging.WARNING, logger="snapstore"):
        taken, state = claims.acquire(store, FP, lease=1000.0, clock=clock)
    assert state.holder_died() and taken is not None and taken.generation == 1
    # It says why it took over at once: not "silent for over 1000 s".
    (line,) = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert line.endswith("whose process is gone (it crashed or was killed)"), line


def test_taking_over_a_silent_holder_says_how_long(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    foreign(store, clock)
    clock.advance(11.0)
    with caplog.at_level(logging.WARNING, logger="snapstore"):
        taken, _ = claims.acquire(store, FP, lease=10.0, clock=clock)
    assert taken is not None
    assert any(r.getMessage().endswith("silent for over 10 s") for r in caplog.records)


def test_an_unreadable_claim_counts_as_alive(store: Store) -> None:
    store.write_bytes(f"{FP}/claims/claim-00000000", b"{not json")
    claim, state = claims.acquire(store, FP, lease=10.0, clock=FakeClock())
    assert claim is None and state.generation == 0


# --- abandoning a claim after a failure ------------------------------------------------------


def test_abandon_removes_a_first_claim(store: Store) -> None:
    clock = FakeClock()
    claim, _ = claims.acquire(store, FP, lease=10.0, owner="me", clock=clock)
    assert claim is not None and claim.generation == 0
    claim.beat()
    assert claim.abandon() is True
    assert store.list_dir(f"{FP}/claims") == [] and claim.released
    fresh, state = claims.acquire(store, FP, lease=10.0, owner="next", clock=clock)
    assert fresh is not None and state.generation == -1  # as if nobody had ever claimed it


def test_abandon_after_a_takeover_leaves_the_generations_to_gc(store: Store) -> None:
    """The holder taken over may only be slow, and write its released marker or beats later:
    if the numbering restarted at 0, they would land on a new job's live claim-00000000."""
    clock = FakeClock()
    slow = foreign(store, clock)  # generation 0, expired but perhaps still running
    slow.beat()
    clock.advance(11.0)
    claim, _ = claims.acquire(store, FP, lease=10.0, owner="me", clock=clock)
    assert claim is not None and claim.generation == 1
    claim.beat()
    assert claim.abandon() is False and claim.released
    assert "claim-00000000" in store.list_dir(f"{FP}/claims")
    fresh, _ = claims.acquire(store, FP, lease=10.0, owner="next", clock=clock)
    assert fresh is not None and fresh.generation == 2  # generations stay monotonic
    slow.release()  # the slow job finishes: its marker names generation 0, not the new claim
    again, state = claims.acquire(store, FP, lease=10.0, owner="third", clock=clock)
    assert again is None and state.holder["owner"] == "next"


def test_abandon_leaves_a_claim_taken_after_the_release(store: Store) -> None:
    clock = FakeClock()
    claim, _ = claims.acquire(store, FP, lease=10.0, owner="me", clock=clock)
    assert claim is not None
    claim.release()
    other, _ = claims.acquire(store, FP, lease=10.0, owner="other", clock=clock)
    assert other is not None and other.generation == 1
    assert claim.abandon() is False
    names = store.list_dir(f"{FP}/claims")
    assert names == ["claim-00000000", "claim-00000001", "released-00000000"]
    claim2, state = claims.acquire(store, FP, lease=10.0, owner="third", clock=clock)
    assert claim2 is None and state.holder["owner"] == "other"  # still live, still held


def test_abandon_never_removes_a_claim_made_while_it_cleans(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another job lists the claims just as this one starts removing them: it sees our released
    # generation and takes the next one over. Only names at or below ours are removed, and the
    # directory (now holding the other job's claim) stays.
    clock = FakeClock()
    claim, _ = claims.acquire(store, FP, lease=10.0, owner="me", clock=clock)
    assert claim is not None
    claim.beat()
    remove, taken = store.remove_tree, []

    def remove_after_another_job_claims(path: str) -> None:
        if not taken:
            taken.append(claims.acquire(store, FP, lease=10.0, owner="other", clock=clock)[0])
        remove(path)

    monkeypatch.setattr(store, "remove_tree", remove_after_another_job_claims)
    assert claim.abandon((FP,)) is True
    assert taken[0] is not None and taken[0].generation == 1
    assert store.list_dir(f"{FP}/claims") == ["claim-00000001"]
    blocked, state = claims.acquire(store, FP, lease=10.0, owner="third", clock=clock)
    assert blocked is None and state.holder["owner"] == "other"


def test_lease_must_be_positive(store: Store) -> None:
    with pytest.raises(ValueError, match="lease: expected a positive number of seconds"):
        claims.acquire(store, FP, lease=0)
    with pytest.raises(ValueError, match="lease: expected a positive number of seconds"):
        snapstore.snapshot(lambda: iter(()), lease=-1)
    with pytest.raises(ValueError, match=r"on_busy: expected one of \('wait', 'pass', 'error'\)"):
        snapstore.snapshot(lambda: iter(()), on_busy="maybe")


# --- on_busy through snapshot() -------------------------------------------------------------


def counted(log: Path):
    def stage(n: int):
        with open(log, "a") as f:
            f.write("ran\n")
        for i in range(n):
            yield {"x": i}

    return stage


def hold_claim(stage, *args) -> claims.Claim:
    snap = stage(*args)
    claim, _ = claims.acquire(snap.store, snap.fingerprint, lease=30.0, owner="holder")
    assert claim is not None
    return claim


def test_on_busy_error_raises_busy_error(tmp_path: Path) -> None:
    stage = snapstore.snapshot(counted(tmp_path / "log"), root=tmp_path / "root", on_busy="error")
    claim = hold_claim(stage, 5)
    with pytest.raises(BusyError, match=r"is being computed by job holder \(pid \d+ on "):
        stage(5).materialize()
    claim.release()
    assert not (tmp_path / "log").exists()


def test_on_busy_pass_computes_privately(tmp_path: Path) -> None:
    stage = snapstore.snapshot(counted(tmp_path / "log"), root=tmp_path / "root", on_busy="pass")
    claim = hold_claim(stage, 5)
    snap = stage(5)
    assert [s["x"] for s in snap] == list(range(5))
    assert "snapstore-pass-" in snap.store.url
    assert not stage(5).committed  # nothing stored under the shared root
    claim.release()
    snap.close()


def test_on_busy_wait_reads_the_holders_commit(tmp_path: Path) -> None:
    log = tmp_path / "log"
    stage = snapstore.snapshot(counted(log), root=tmp_path / "root", lease=2.0)
    claim = hold_claim(stage, 7)

    def holder() -> None:
        time.sleep(0.3)
        with claim:
            stage._compute(stage(7), None)

    thread = threading.Thread(target=holder)
    thread.start()
    assert [s["x"] for s in stage(7)] == list(range(7))  # waited, then read
    thread.join()
    assert log.read_text() == "ran\n"


def test_on_busy_wait_takes_over_from_a_silent_holder(tmp_path: Path) -> None:
    log = tmp_path / "log"
    stage = snapstore.snapshot(counted(log), root=tmp_path / "root", lease=10.0)
    clock = FakeClock(wall=time.time())
    stage.clock = clock
    snap = stage(3)
    claim, _ = claims.acquire(snap.store, snap.fingerprint, lease=10.0, owner="ghost", clock=clock)
    assert claim is not None  # never beats, never releases: a job that hung
    assert [s["x"] for s in snap] == [0, 1, 2]
    assert log.read_text() == "ran\n" and sum(clock.sleeps) >= 10.0


def test_a_job_that_waited_then_took_over_explains_the_miss_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "log"
    stage = snapstore.snapshot(counted(log), root=tmp_path / "root", lease=10.0)
    clock = FakeClock(wall=time.time())
    stage.clock = clock
    stage(2).materialize()  # an earlier snapshot of the stage: the miss is explained
    snap = stage(3)
    claim, _ = claims.acquire(snap.store, snap.fingerprint, lease=10.0, owner="ghost", clock=clock)
    assert claim is not None  # never beats, never releases: a job that hung
    with caplog.at_level(logging.WARNING, logger="snapstore"):
        snap.materialize()
    misses = [r.getMessage() for r in caplog.records if "no snapshot of" in r.getMessage()]
    assert len(misses) == 1 and "; waiting for job ghost" in misses[0]
    assert any("took over the claim" in r.getMessage() for r in caplog.records)
    assert log.read_text() == "ran\nran\n"


def test_a_waiting_job_logs_that_it_waits_and_for_whom(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "log"
    stage = snapstore.snapshot(counted(log), root=tmp_path / "root", lease=2.0)
    stage(3).materialize()  # an earlier snapshot of the stage: the miss is explained
    claim = hold_claim(stage, 7)

    def holder() -> None:
        time.sleep(0.3)
        with claim:
            stage._compute(stage(7), None)

    thread = threading.Thread(target=holder)
    thread.start()
    with caplog.at_level(logging.INFO, logger="snapstore"):
        waiter = stage(7).materialize()
    thread.join()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "computing it" not in text.replace("which is computing it", "")
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and f"; waiting for job holder (pid {os.getpid()}" in warning[0]
    assert "which is computing it. It differs from the most recent one" in warning[0]
    assert f"(7 samples, 93 bytes stored), committed by job holder (pid {os.getpid()}" in text
    assert waiter.miss_explanation is not None and log.read_text() == "ran\nran\n"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="snapstore"):
        stage(11).materialize()  # this job computes: it says so
    assert "; computing it. It differs" in caplog.text and "waiting for" not in caplog.text


# --- what a failed stage leaves behind -------------------------------------------------------


def failing(kind: str, after: int):
    def stage(items: list[int]):
        for i in items:
            if i == after:
                raise KeyboardInterrupt if kind == "interrupt" else ValueError("bad input")
            yield {"x": np.full(2048, i, np.int64)}  # 16 KiB each: blocks are flushed

    return stage


@pytest.mark.parametrize("kind", ["error", "interrupt"])  # a Ctrl-C too
def test_a_failed_stage_leaves_no_claim_behind(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "root"
    stage = snapstore.snapshot(failing(kind, after=300), root=root)
    with pytest.raises(KeyboardInterrupt if kind == "interrupt" else ValueError):
        stage(list(range(400))).materialize()
    assert list(root.iterdir()) == []  # no claims, no empty runs/ or fingerprint directory
    code, out = cli("--root", str(root), "ls")
    assert code == 0 and out.startswith("no snapshots under")
    code, out = cli("--root", str(root), "gc", "--dry-run", "--min-age", "0")
    assert "expired claim" not in out and "would free 0 B" in out


def test_a_failed_partitioned_stage_keeps_only_its_committed_partitions(tmp_path: Path) -> None:
    root = tmp_path / "root"
    stage = snapstore.snapshot(
        failing("error", after=2), root=root, partition_by="items",
        engine="thread", workers=1,
    )  # fmt: skip

    snap = stage(list(range(5)))
    with pytest.raises(ValueError, match="bad input"):
        snap.materialize()  # partitions 0 and 1 commit, 2 fails
    store = LocalStore(root)
    layout = partition_layout(stage.job(snap))  # parts/<stage key>/<partition fingerprint>
    # The committed partitions stay where any call of the stage finds them; nothing else does
    # (no snapshot directory, no failed partition's directory, no claims, no stage pin).
    assert [p.name for p in root.iterdir()] == ["parts"]
    assert sorted(store.list_dir(layout.base)) == sorted([layout.name(0), layout.name(1)])
    for p in (0, 1):
        assert partition_done(store, layout, p)
        assert not store.exists(f"{layout.dir(p)}/claims")  # removed with the failed one's
    assert find_garbage(store) == []  # a rerun within gc's minimum age finds them
    # Past it they are garbage (no snapshot references them), and nothing else is but the
    # stage's directory they leave empty.
    garbage = find_garbage(store, min_age=0)
    assert {(g.kind, g.path) for g in garbage} == {
        *(("partition", layout.dir(p)) for p in (0, 1)),
        ("directory", layout.base),
    }
    first = snapstore.snapshot(
        failing("error", after=0), root=tmp_path / "other", partition_by="items",
        engine="thread", workers=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="bad input"):
        first(list(range(5))).materialize()  # the first partition fails: nothing to keep
    assert list((tmp_path / "other").iterdir()) == []


SWEEP = """
import hashlib, json, sys, time
import snapstore

root, log, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
options = json.loads(sys.argv[4])
store = snapstore.open_store(root, **options)

@snapstore.snapshot(root=store, lease=5.0)
def stage(n):
    with open(log, "a") as f:
        f.write("ran\\n")
    for i in range(n):
        time.sleep(0.0005)
        yield {"x": i, "y": str(i)}

while time.time() < start:
    time.sleep(0.001)
snap = stage(400)
digest = hashlib.sha256(json.dumps([s for s in snap]).encode()).hexdigest()
print(json.dumps({"fingerprint": snap.fingerprint, "digest": digest, "n": len(snap)}))
snap.close()  # takes its reader pin down
"""


def run_sweep(tmp_path: Path, root: str, options: dict[str, Any], delay: float) -> None:
    """Six processes start :data:`SWEEP` under ``root`` together, ``delay`` seconds from now;
    the stage runs once in all, and every process reads the same 400 samples."""
    script = tmp_path / "sweep.py"
    script.write_text(textwrap.dedent(SWEEP))
    log = tmp_path / "log"
    args = [str(script), root, str(log), str(time.time() + delay), json.dumps(options)]
    procs = [
        subprocess.Popen([sys.executable, *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(6)
    ]  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert log.read_text() == "ran\n"  # the stage ran once in the whole sweep
    assert len({json.dumps(r, sort_keys=True) for r in results}) == 1
    assert results[0]["n"] == 400


@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_a_sweep_of_six_processes_computes_once(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "gcs":
        root, options = request.getfixturevalue("gcs_root")
    else:
        root, options = str(tmp_path / "root"), {}
    run_sweep(tmp_path, root, options, 3.0 if backend == "gcs" else 1.5)
    # No attempt was left behind. The winner removed its claims after committing; a waiter
    # that claimed in the instant before it saw the commit may leave a released claim.
    store = snapstore.open_store(root, **options)
    assert {g.kind for g in find_garbage(store, min_age=0)} <= {"claims"}


# --- garbage -----------------------------------------------------------------------------------


def test_gc_removes_crashed_attempts_and_stale_claims_only(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    stage = snapstore.snapshot(counted(tmp_path / "log"), root=store)
    good = stage(4).materialize()
    # A crashed attempt beside the committed run, and an uncommitted fingerprint with an
    # expired claim and a crashed run.
    crashed = f"{good.fingerprint}/runs/20200101T000000-host-1-deadbeef"
    store.write_bytes(f"{crashed}/shard-00000.snap", b"x" * 100)
    lost = "a" * 32
    store.write_bytes(f"{lost}/runs/20200101T000000-host-2-cafecafe/shard-00000.snap", b"y" * 50)
    clock = FakeClock(wall=time.time() - 7200)
    old, _ = claims.acquire(store, lost, lease=60.0, owner="gone", clock=clock)
    assert old is not None
    # A live claim on a third fingerprint, with its (young) run: untouched.
    busy = "b" * 32
    live, _ = claims.acquire(store, busy, lease=600.0, owner="alive")
    assert live is not None
    store.write_bytes(f"{busy}/runs/20200101T000000-host-3-0badf00d/shard-00000.snap", b"z")

    planned = find_garbage(store, min_age=3600)
    paths = {g.path: g for g in planned}
    assert set(paths) == {crashed, f"{lost}/runs/20200101T000000-host-2-cafecafe",
                          f"{lost}/claims", lost}  # fmt: skip
    assert not store.exists(f"{good.fingerprint}/claims")  # its writer removed them
    late, _ = claims.acquire(store, good.fingerprint, lease=60.0, owner="late")
    assert late is not None
    late.release()  # a waiter that claimed just before it saw the commit
    planned = find_garbage(store, min_age=3600)
    paths = {g.path: g for g in planned}
    assert paths[f"{good.fingerprint}/claims"].reason == "claims of a committed snapshot"
    assert paths[crashed].bytes == 100 and paths[crashed].kind == "run"
    assert collect_garbage(store, min_age=3600, dry_run=True) == planned
    assert store.exists(crashed)
    collect_garbage(store, min_age=3600)
    assert not store.exists(crashed) and not store.exists(lost)
    assert store.exists(f"{busy}/runs") and store.exists(f"{busy}/claims")
    reopened = snapstore.open(good.fingerprint, root=store)
    assert [s["x"] for s in reopened] == [0, 1, 2, 3]
    assert find_garbage(store, min_age=3600) == []
    live.release()
    good.close()
    reopened.close()


def test_gc_leaves_young_attempts_and_damaged_snapshots(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    young = "c" * 32
    run = dt_run(time.time() - 10)
    store.write_bytes(f"{young}/runs/{run}/shard-00000.snap", b"1")
    damaged = "d" * 32
    store.write_bytes(f"{damaged}/COMMIT", b"garbage")
    store.write_bytes(f"{damaged}/runs/20200101T000000-h-1-00000000/x", b"1")
    assert find_garbage(store, min_age=3600) == []
    assert [g.path for g in find_garbage(store, min_age=0)] == [f"{young}/runs/{run}", young]
    with pytest.raises(ValueError, match="min_age: expected seconds >= 0"):
        find_garbage(store, min_age=-1)


def dt_run(when: float) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(when))
    return f"{stamp}-host-{os.getpid()}-12345678"


def test_local_create_if_absent_tries_again_when_the_file_it_met_vanishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs start together; the winner's stage fails at once and its cleanup removes the
    claim between the loser's failed link and its read of the file: the loser claims."""
    from snapstore.storage.store import LocalStore

    store = LocalStore(tmp_path)
    store.write_bytes("fp/claims/claim-00000000", b"the winner's")
    read = Path.read_bytes
    calls = []

    def vanished(self: Path) -> bytes:
        if self.name == "claim-00000000" and not calls:
            calls.append(self)
            self.unlink()  # the winner's cleanup, just now
            raise FileNotFoundError(self)
        return read(self)

    monkeypatch.setattr(Path, "read_bytes", vanished)
    assert store.create_if_absent("fp/claims/claim-00000000", b"ours") is True
    assert read(tmp_path / "fp/claims/claim-00000000") == b"ours" and calls
