"""The guarantees under a bucket that fails (issue 29), through ``faulty_store``: the store
conformance suite, a sweep of racing jobs, reads of every epoch, and random interleavings of
write, read, rm and gc, at 5% transient failures (503, 429, resets before the request), 1%
acted-then-reset and 1% bodies cut short. Longer variants run under ``-m slow``.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from test_store_conformance import Backend, StoreConformance

import snapstore
from snapstore.errors import SnapshotNotFoundError, StoreError
from snapstore.manage.catalog import remove_snapshot
from snapstore.manage.gc import collect_garbage
from snapstore.storage.retry import (
    RetryBudget,
    RetryPolicy,
    classify_failure,
    is_throttled,
    retry_after,
)
from snapstore.storage.simulate import (
    FaultFileSystem,
    Faults,
    InjectedHTTPError,
    ShortBodyError,
    faulty_store,
)
from snapstore.storage.store import FsspecStore, open_store
from snapstore.write.writer import WriteOptions

# The rates: 5% transient (3% 503, 1% 429, 1% reset before), 1% acted-then-reset,
# 1% bodies cut short. Retry-After is shortened so that a 429 costs milliseconds here.
RATES: dict[str, Any] = dict(error_rate=0.03, throttle_rate=0.01, reset_before=0.01,
                             reset_after=0.01, short_body=0.01, retry_after=0.005)  # fmt: skip
# Quick waits, and attempts enough that a request failing 7% of the time almost never fails
# them all (0.07 ** 8: one in 10^9).
POLICY = RetryPolicy(attempts=8, base=0.001, cap=0.01, timeout=60)
OPTIONS = WriteOptions(block_min_rows=1, block_bytes=2048, shard_bytes=8192)


def stage(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"x": i, "v": np.full(32, i, np.int64)}


def faulty(root: Any, seed: int = 0, **rates: Any) -> FsspecStore:
    return faulty_store(root, seed=seed, retry=POLICY, **(rates or RATES))


# -- the wrapper ------------------------------------------------------------------------------


def test_each_fault_is_what_the_retry_layer_sees_from_a_real_client() -> None:
    fs = FaultFileSystem(_memory())
    fs.fs.pipe_file("/f/a", b"0123456789")
    cases = {
        "error_rate": (InjectedHTTPError, "503"),
        "throttle_rate": (InjectedHTTPError, "429"),
        "reset_before": (ConnectionResetError, "reset_before"),
        "reset_after": (ConnectionResetError, "reset_after"),
        "short_body": (ShortBodyError, "short_body"),
    }
    for name, (kind, label) in cases.items():
        fs.faults = Faults(**{name: 1.0, "retry_after": 0.5})
        with pytest.raises(kind) as info:
            fs.cat_file("/f/a", start=2, end=6)
        assert classify_failure(info.value) == "transient", name
        assert fs.injected[label] >= 1
        if name == "throttle_rate":
            assert is_throttled(info.value) and retry_after(info.value) == 0.5
        if name == "error_rate":
            assert is_throttled(info.value) and retry_after(info.value) is None
    fs.faults = Faults(slow_tail=1.0, tail_scale=0.001, tail_cap=0.002)
    assert fs.cat_file("/f/a", start=2, end=6) == b"2345"


def _memory() -> Any:
    import fsspec

    return fsspec.filesystem("memory")


def test_a_reset_after_the_server_acted_leaves_the_change_made() -> None:
    fs = FaultFileSystem(_memory(), Faults(reset_after=1.0))
    path = f"/acted-{uuid.uuid4().hex}/x"
    with pytest.raises(ConnectionResetError, match="after pipe_file"):
        fs.pipe_file(path, b"data")
    assert fs.fs.cat_file(path) == b"data"
    with pytest.raises(ConnectionResetError):  # a stat has nothing to lose: reset before
        fs.info(path)


def test_faults_are_reproducible_whatever_the_thread_order() -> None:
    def run(seed: int, threads: int) -> dict[str, int]:
        fs = FaultFileSystem(_memory(), Faults(seed=seed, error_rate=0.2, reset_before=0.1))
        fs.fs.pipe_file("/r/a", bytes(1000))
        outcome: dict[str, int] = {}

        def read(i: int) -> None:
            try:
                fs.cat_file("/r/a", start=i, end=i + 1)
                outcome[str(i)] = 1
            except OSError:
                outcome[str(i)] = 0

        pool = [threading.Thread(target=read, args=(i,)) for i in range(200)]
        for k in range(0, 200, threads):
            for t in pool[k : k + threads]:
                t.start()
            for t in pool[k : k + threads]:
                t.join()
        return outcome

    first = run(3, 1)
    assert run(3, 8) == first and run(4, 1) != first
    assert 0.2 < 1 - sum(first.values()) / 200 < 0.45  # about 30% failed


def test_settings_are_checked() -> None:
    for bad in ({"error_rate": 1.5}, {"error_rate": -0.1}, {"error_rate": 0.6, "short_body": 0.6},
                {"seed": 1.5}, {"tail_alpha": 0}, {"retry_after": float("nan")}):  # fmt: skip
        with pytest.raises(ValueError, match=r"must|add up|probability"):
            Faults(**bad)
    with pytest.raises(TypeError, match="wraps a LocalStore or an FsspecStore"):
        faulty_store(_NotAStore())  # type: ignore[arg-type]


class _NotAStore(snapstore.storage.Store):
    url = "x://"
    read_bytes = read_range = open_write = create_if_absent = exists = None  # type: ignore[assignment]
    list_dir = size = remove_tree = is_dir = None  # type: ignore[assignment]


# -- retries ----------------------------------------------------------------------------------


def test_retry_after_is_obeyed_and_jittered() -> None:
    policy = RetryPolicy(base=0.01, cap=0.02)
    hinted = InjectedHTTPError(429, "slow down", retry_after=0.3)
    waits = [policy.delay(1, hinted) for _ in range(100)]
    assert min(waits) >= 0.3 and max(waits) <= 0.31 and len(set(waits)) > 1
    assert max(policy.delay(1, ConnectionResetError()) for _ in range(100)) <= 0.01

    class Answer(Exception):
        def __init__(self) -> None:
            self.headers = {"Retry-After": "2"}

    assert retry_after(Answer()) == 2.0
    botocore_like = Exception()
    botocore_like.response = {"ResponseMetadata": {"HTTPHeaders": {"retry-after": "3"}}}  # type: ignore[attr-defined]
    assert retry_after(botocore_like) == 3.0
    wrapped = StoreError("x")
    wrapped.__cause__ = hinted
    assert retry_after(wrapped) == 0.3


def test_a_hint_past_max_retry_after_gives_up_naming_it() -> None:
    store = faulty_store(f"memory://hint-{uuid.uuid4().hex}", throttle_rate=1.0, retry_after=60,
                         retry=RetryPolicy(attempts=4, max_retry_after=30))  # fmt: skip
    with pytest.raises(StoreError, match=r"gave up after 1 try \(the store asked to wait 60 s"):
        store.read_bytes("x")


def test_the_retry_budget_is_spent_and_earned_back() -> None:
    budget = RetryBudget(3, refill=0.5)
    assert [budget.withdraw() for _ in range(4)] == [True, True, True, False]
    budget.deposit()
    budget.deposit()
    assert budget.withdraw() and not budget.withdraw()
    assert not budget.withdraw(timeout=True) and budget.refused == 3
    store = faulty_store(f"memory://budget-{uuid.uuid4().hex}", error_rate=1.0,
                         retry=RetryPolicy(attempts=8, base=0.001, budget=2))  # fmt: skip
    with pytest.raises(StoreError) as info:
        store.read_bytes("x")
    text = str(info.value)
    assert "cannot read faults://memory://" in text and "gave up after 3 tries" in text
    assert "retry budget is spent: 2 retries taken, 1 refused" in text
    assert "the last answer: HTTP 503 (503 Service Unavailable (injected) on cat_file" in text
    assert getattr(info.value, "throttled", False) and info.value.errno == errno.EBUSY
    with pytest.raises(StoreError, match=r"gave up after 1 try \(the store's retry budget"):
        store.read_bytes("x")  # nothing earned back meanwhile
    assert RetryPolicy(budget=None).new_budget() is None
    with pytest.raises(ValueError, match="budget must be"):
        RetryPolicy(budget=-1)


class _FailCreates(FaultFileSystem):
    """Every create is made and its answer lost; other requests pass."""

    def _choose(self, method: str, key: str) -> str | None:
        commit = key.split("|", 1)[0].endswith("/COMMIT")
        return "reset_after" if method in ("pipe_file", "link") and commit else None


@pytest.mark.parametrize("where", ["memory", "local"])
def test_a_create_whose_every_answer_was_lost_reads_back_its_commit(
    where: str, tmp_path: Path
) -> None:
    root = str(tmp_path) if where == "local" else f"memory://lost-{uuid.uuid4().hex}"
    store = faulty(root)
    store.fs.__class__ = _FailCreates
    assert store.create_if_absent("fp/COMMIT", b"mine") is True  # all 8 tries "failed"
    assert store.create_if_absent("fp/COMMIT", b"theirs") is False
    assert bytes(store.read_bytes("fp/COMMIT")) == b"mine"
    if where == "local":
        assert sorted(p.name for p in (tmp_path / "fp").iterdir()) == ["COMMIT"]  # no temp left


# -- the conformance suite under faults ---------------------------------------------------------


@pytest.fixture(params=["local", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        root: str = str(tmp_path / "root")
    else:
        root = f"memory://conformance-faults-{uuid.uuid4().hex}"
    store = faulty(root, seed=hash(request.node.name) & 0xFFFF)
    yield Backend(store)
    store.close()


class TestStoresUnderFaults(StoreConformance):
    """Every test of the contract, on local and memory roots through ``faulty_store``."""

    def test_remove_empty_dir(self, backend: Backend) -> None:
        if backend.store.protocol == "file":
            pytest.skip("an fsspec store over a local directory never removes directories")
        super().test_remove_empty_dir(backend)


# -- a sweep, reads, and random interleavings --------------------------------------------------


COMPUTED: list[int] = []  # one entry per run of sweep_stage
_COUNT_LOCK = threading.Lock()
COUNTING = ["COMPUTED", "_COUNT_LOCK"]  # the count is no part of the data


def sweep_stage(n: int) -> Iterator[dict[str, Any]]:
    with _COUNT_LOCK:
        COMPUTED.append(n)
    yield from stage(n)


def run_sweep(root: Path, jobs: int, n: int, seed: int) -> None:
    """``jobs`` threads race to materialize one stage, each through its own faulty store."""
    COMPUTED.clear()
    fps: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(jobs)

    def job(k: int) -> None:
        store = faulty(str(root), seed=seed * 100 + k)
        try:
            start.wait()
            snap = snapstore.snapshot(
                sweep_stage, root=store, options=OPTIONS, ignore_globals=COUNTING
            )(n)
            snap.materialize()
            with snapstore.open(snap.fingerprint, root=store) as back:
                assert [int(s["x"]) for s in back] == list(range(n))
            fps.append(snap.fingerprint)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(k,)) for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(COMPUTED) == 1, "the stage ran more than once"
    (fp,) = set(fps)
    clean = open_store(str(root))
    assert len(clean.list_dir(f"{fp}/runs")) == 1  # committed once, no partial run visible


def _clean_files(root: Path, fp: str) -> dict[str, Any]:
    """The committed run's files, the manifest parsed without the run's own name."""
    run = next((root / fp / "runs").iterdir())
    files: dict[str, Any] = {p.name: p.read_bytes() for p in sorted(run.iterdir())}
    files["manifest.json"] = json.loads(files["manifest.json"])
    for volatile in ("run", "created_at"):  # the writer attempt and its second: by design
        files["manifest.json"].pop(volatile)
    return files


@pytest.mark.parametrize(
    "sweeps", [pytest.param(3, id="3"), pytest.param(40, marks=pytest.mark.slow, id="40")]
)
def test_sweeps_commit_once_with_the_bytes_of_a_fault_free_run(tmp_path: Path, sweeps: int) -> None:
    snapstore.snapshot(
        sweep_stage, root=tmp_path / "clean", options=OPTIONS, ignore_globals=COUNTING
    )(300).materialize()
    (fp_clean,) = [p.name for p in (tmp_path / "clean").iterdir() if p.is_dir()]
    expected = _clean_files(tmp_path / "clean", fp_clean)
    for i in range(sweeps):
        root = tmp_path / f"sweep-{i}"
        run_sweep(root, jobs=4, n=300, seed=i)
        assert _clean_files(root, fp_clean) == expected


@pytest.mark.parametrize(
    "epochs", [pytest.param(3, id="3"), pytest.param(30, marks=pytest.mark.slow, id="30")]
)
def test_every_epoch_is_exact_under_faults(tmp_path: Path, epochs: int) -> None:
    n = 2000
    snap = snapstore.snapshot(stage, root=tmp_path, options=OPTIONS)(n).materialize()
    store = faulty(str(tmp_path), seed=11)
    with snapstore.open(snap.fingerprint, root=store) as back:
        for epoch in range(epochs):
            got = [(int(x), int(v[0])) for b in back.batches(64, shuffle=True, seed=epoch)
                   for x, v in zip(b["x"], b["v"])]  # fmt: skip
            assert sorted(got) == [(i, i) for i in range(n)], epoch
    assert store.fs.injected["503"] > 0  # faults were met (and survived)
    if epochs >= 30:
        assert store.fs.injected["short_body"] > 0 and store.fs.injected["reset_after"] > 0


class StoreLifecycle(RuleBasedStateMachine):
    """Write, read, rm and gc in any order on a memory store through faulty_store: a snapshot
    written and not removed stays readable, and every read is exact."""

    def __init__(self) -> None:
        super().__init__()
        self.root = f"memory://lifecycle-{uuid.uuid4().hex}"
        self.seed = 0
        self.live: dict[int, str] = {}  # n -> fingerprint

    def store(self) -> FsspecStore:
        self.seed += 1
        return faulty(self.root, seed=self.seed)

    @rule(n=st.integers(1, 6).map(lambda k: 20 * k))
    def write(self, n: int) -> None:
        snap = snapstore.snapshot(stage, root=self.store(), options=OPTIONS)(n).materialize()
        self.live[n] = snap.fingerprint

    @rule(n=st.integers(1, 6).map(lambda k: 20 * k))
    def read(self, n: int) -> None:
        fp = self.live.get(n)
        if fp is None:
            return
        with snapstore.open(fp, root=self.store()) as back:
            got = [(int(x), int(v[-1])) for b in back.batches(16, shuffle=True)
                   for x, v in zip(b["x"], b["v"])]  # fmt: skip
        assert sorted(got) == [(i, i) for i in range(n)]

    @rule(n=st.integers(1, 6).map(lambda k: 20 * k))
    def rm(self, n: int) -> None:
        fp = self.live.pop(n, None)
        if fp is not None:
            remove_snapshot(self.store(), fp)
            with pytest.raises(SnapshotNotFoundError):
                snapstore.open(fp, root=self.store())

    @rule()
    def gc(self) -> None:
        collect_garbage(self.store(), min_age=0)

    @invariant()
    def live_snapshots_stay(self) -> None:
        clean = open_store(self.root)
        for fp in self.live.values():
            assert clean.exists(f"{fp}/COMMIT")

    def teardown(self) -> None:
        # Free the root: the memory filesystem is one per process and its listings scan every
        # path in it, so the roots of thousands of examples left behind slow each one down.
        fs = fsspec.filesystem("memory")
        if fs.exists(self.root):
            fs.rm(self.root, recursive=True)


class _LongLifecycle(StoreLifecycle):
    """The same machine, for the slow run."""


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=8, deadline=None,
                    suppress_health_check=list(HealthCheck))  # fmt: skip


# The target: 10,000 random interleavings (examples) under -m slow, about 6 minutes on
# 2 cores; SNAPSTORE_LIFECYCLE_EXAMPLES sets another count.
SLOW_EXAMPLES = int(os.environ.get("SNAPSTORE_LIFECYCLE_EXAMPLES", "10000"))
StoreLifecycle.TestCase.settings = _settings(15)
_LongLifecycle.TestCase.settings = _settings(SLOW_EXAMPLES)
TestLifecycleUnderFaults = StoreLifecycle.TestCase
TestLifecycleUnderFaultsLong = pytest.mark.slow(_LongLifecycle.TestCase)
