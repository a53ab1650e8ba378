"""snapstore.ray against a real local Ray (2 CPUs), started once for the module."""

from __future__ import annotations

import inspect
import itertools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import snapstore  # noqa: E402
from snapstore.errors import SnapshotNotFoundError  # noqa: E402
from snapstore.fingerprint.digest import fingerprint_key  # noqa: E402
from snapstore.manage.gc import collect_garbage, find_garbage  # noqa: E402
from snapstore.ray import (  # noqa: E402
    RayExecutor,
    SnapshotDatasink,
    SnapshotExistsError,
    read_snapshot,
    write_snapshot,
)
from snapstore.storage.claims import inspect_claim  # noqa: E402
from snapstore.storage.store import LocalStore  # noqa: E402
from snapstore.write.partitions import PARTS_DIR, partition_done, write_partition  # noqa: E402
from snapstore.write.writer import SnapshotWriter  # noqa: E402

N = 60
BLOCKS = 4


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    import ray.cloudpickle

    old = os.environ.get("RAY_USAGE_STATS_ENABLED")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray workers cannot import this test module by name: send its functions and classes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        num_cpus=2,
        object_store_memory=200 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
    )
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    if old is None:
        os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
    else:
        os.environ["RAY_USAGE_STATS_ENABLED"] = old


def make_rows(n: int = N) -> list[dict[str, Any]]:
    return [
        {
            "i": i,
            "x": i / 3,
            "h": np.float32(i),
            "ok": i % 2 == 0,
            "s": f"row {i}",
            "b": bytes([i % 256]) * 3,
            "v": np.full((2, 3), i, np.int16),
            "r": np.arange(i % 5, dtype=np.int64),
        }
        for i in range(n)
    ]


def dataset(rows: list[dict[str, Any]]) -> Any:
    return ray.data.from_items(rows, override_num_blocks=BLOCKS)


def assert_same_samples(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], np.ndarray):
                assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k
            else:
                assert type(x[k]) is type(y[k]) and x[k] == y[k], k


def write_locally(root: Path, fingerprint: str, rows: list[dict[str, Any]]) -> None:
    writer = SnapshotWriter(LocalStore(root), fingerprint)
    for row in rows:
        writer.add(row)
    assert writer.commit()


def test_datasink_writes_what_a_local_writer_writes(tmp_path: Path) -> None:
    rows = make_rows()
    sink = SnapshotDatasink(tmp_path / "ray", name="rows", key={"n": N})
    dataset(rows).write_datasink(sink)
    assert sink.won is True
    assert sink.fingerprint == fingerprint_key("rows", {"n": N}).digest
    write_locally(tmp_path / "local", sink.fingerprint, rows)
    with (
        snapstore.open(sink.fingerprint, tmp_path / "ray") as via_ray,
        snapstore.open(sink.fingerprint, tmp_path / "local") as local,
    ):
        assert via_ray.schema == local.schema
        assert_same_samples(list(via_ray), list(local))
        assert via_ray.manifest["stage"] == "rows"
        assert via_ray.manifest["partitions"] == BLOCKS

    with pytest.raises(SnapshotExistsError, match="already committed"):
        dataset(rows).write_datasink(SnapshotDatasink(tmp_path / "ray", name="rows", key={"n": N}))
    snap = write_snapshot(dataset(rows[:1]), tmp_path / "ray", name="rows", key={"n": N})
    assert len(snap) == N  # committed already: the (different) dataset was not run


class FlakySink(SnapshotDatasink):
    """Task 1 fails on its first attempt: after writing part of its partition (``raise``), or
    after committing it (``exit``: the worker dies before returning)."""

    def __init__(self, *args: Any, marker: Path, how: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marker = marker
        self.how = how

    def write(self, blocks: Any, ctx: Any) -> Any:
        if ctx.task_idx != 1 or self.marker.exists():
            return super().write(blocks, ctx)
        self.marker.touch()
        if self.how == "exit":  # Ray core reruns a task whose worker died
            super().write(blocks, ctx)
            os._exit(1)

        def failing() -> Iterator[Any]:
            yield from itertools.islice(blocks, 1)
            raise RuntimeError("injected failure on the first attempt")

        return super().write(failing(), ctx)


@pytest.mark.parametrize("how", ["raise", "raise-in-process", "exit"])
def test_retried_write_task_writes_no_duplicates(tmp_path: Path, how: str) -> None:
    """Ray retries a task two ways: Ray core reruns it (``ray_remote_args`` max_retries and
    retry_exceptions; a dead worker always), or Ray Data reruns the UDF in the same task
    (DataContext ``retried_map_errors``/``max_map_retries``). Either way each attempt writes a
    run of its own and the partition is committed once."""
    rows = make_rows()
    marker = tmp_path / "failed-once"
    sink = FlakySink(tmp_path / "snaps", name="flaky", key=how, marker=marker, how=how)
    ctx = ray.data.DataContext.get_current()
    saved = ctx.retried_map_errors, ctx.max_map_retries
    if how == "raise-in-process":
        ctx.retried_map_errors, ctx.max_map_retries = True, 1
        remote_args: dict[str, Any] = {}
    else:
        remote_args = {"max_retries": 2, "retry_exceptions": True}
    try:
        dataset(rows).write_datasink(sink, ray_remote_args=remote_args)
    finally:
        ctx.retried_map_errors, ctx.max_map_retries = saved
    assert marker.exists()
    with snapstore.open(sink.fingerprint, tmp_path / "snaps") as snap:
        assert [s["i"] for s in snap] == list(range(N))
    store = LocalStore(tmp_path / "snaps")
    parts = store.list_dir(f"{sink.fingerprint}/{PARTS_DIR}")
    assert len(parts) == BLOCKS
    for part in parts:  # the failed attempt removed its run, or lost the commit and did
        assert len(store.list_dir(f"{sink.fingerprint}/{PARTS_DIR}/{part}/runs")) == 1


class FailingSink(SnapshotDatasink):
    """Task 0 commits its partition; every other task waits for that, then raises."""

    def write(self, blocks: Any, ctx: Any) -> Any:
        if ctx.task_idx == 0:
            return super().write(blocks, ctx)
        deadline = time.monotonic() + 30
        while not partition_done(self.store, self.fingerprint, self._partition(0)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        raise RuntimeError("injected failure")


def test_failed_job_leaves_nothing_visible(tmp_path: Path) -> None:
    sink = FailingSink(tmp_path / "snaps", name="failing", key=1)
    with pytest.raises(Exception, match="injected failure"):
        dataset(make_rows()).write_datasink(sink)
    assert not sink.committed and sink.won is None
    with pytest.raises(SnapshotNotFoundError):
        snapstore.open(sink.fingerprint, tmp_path / "snaps")
    store = LocalStore(tmp_path / "snaps")
    assert store.list_dir(f"{sink.fingerprint}/{PARTS_DIR}") == []  # task 0's was removed
    assert inspect_claim(store, sink.fingerprint).released
    collect_garbage(store, min_age=0)
    assert list((tmp_path / "snaps").iterdir()) == []  # the released claim, the empty parts, <fp>


class ClaimCheckingSink(SnapshotDatasink):
    """Each write task checks that the driver holds a live claim on the fingerprint."""

    def write(self, blocks: Any, ctx: Any) -> Any:
        state = inspect_claim(self.store, self.fingerprint)
        if state.expired(time.time()) or state.holder.get("pid") == os.getpid():
            raise RuntimeError(f"expected the driver's live claim, found {state}")
        return super().write(blocks, ctx)


def test_a_running_datasink_holds_a_claim_and_removes_it_after_commit(tmp_path: Path) -> None:
    sink = ClaimCheckingSink(tmp_path / "snaps", name="claimed", key=1)
    dataset(make_rows()).write_datasink(sink)
    assert sink.won is True and sink._claim is None
    store = LocalStore(tmp_path / "snaps")
    assert store.list_dir(f"{sink.fingerprint}/claims") == []  # committed: claims removed
    with snapstore.open(sink.fingerprint, tmp_path / "snaps") as snap:
        assert [s["i"] for s in snap] == list(range(N))


def test_the_claim_protects_the_job_from_gc_and_is_released_on_failure(tmp_path: Path) -> None:
    import ray.cloudpickle

    sink = SnapshotDatasink(tmp_path / "snaps", name="slow", key=1)
    sink.on_write_start()
    store, fp = sink.store, sink.fingerprint
    holder = inspect_claim(store, fp)
    assert not holder.expired(time.time()) and holder.holder["pid"] == os.getpid()
    task_copy = ray.cloudpickle.loads(ray.cloudpickle.dumps(sink))
    assert task_copy._claim is None and task_copy._job == sink._job  # the claim stays here
    partition = sink._partition(0)
    assert write_partition(store, fp, partition, lambda: iter([{"i": 1}]))
    assert [g for g in find_garbage(store, min_age=0) if "/parts/" in g.path] == []

    other = SnapshotDatasink(tmp_path / "snaps", name="slow", key=1)
    other.on_write_start()  # another live job holds the claim: this one writes anyway
    assert other._claim is None
    other.on_write_failed(RuntimeError("injected"))
    assert not inspect_claim(store, fp).expired(time.time())  # the first job's claim is intact

    # A job that started without the claim takes it before assembling, once the holder is gone.
    late = SnapshotDatasink(tmp_path / "late", name="slow", key=1)
    rival = SnapshotDatasink(tmp_path / "late", name="slow", key=1)
    late.on_write_start()
    rival.on_write_start()
    assert rival._claim is None
    late.on_write_failed(RuntimeError("the holder stopped"))
    seen: list[bool] = []
    real = snapstore.ray.commit_partitions

    def checking(store: Any, fingerprint: str, *args: Any, **kwargs: Any) -> bool:
        seen.append(inspect_claim(store, fingerprint).holder["owner"] == rival._claim.owner)
        return real(store, fingerprint, *args, **kwargs)

    written = write_partition(rival.store, fp, rival._partition(0), lambda: iter([{"i": 2}]))
    assert written
    result = type("Result", (), {"write_returns": [
        snapstore.ray.PartitionWritten(0, rival._partition(0), 1, 0, "", True)
    ]})()  # fmt: skip
    snapstore.ray.commit_partitions = checking
    try:
        rival.on_write_complete(result)
    finally:
        snapstore.ray.commit_partitions = real
    assert seen == [True] and rival.won is True and rival._claim is None

    sink.on_write_failed(RuntimeError("injected"))
    assert sink._claim is None and inspect_claim(store, fp).released
    assert store.list_dir(f"{fp}/{PARTS_DIR}") == []
    assert {g.kind for g in find_garbage(store, min_age=0)} == {"claims", "directory"}


def test_gc_knows_the_datasink_partition_ids() -> None:
    """gc tells a datasink job's partitions (never reused) from a partitioned stage's by id."""
    from snapstore import ray as snap_ray
    from snapstore.manage import gc

    first_job_partition = snap_ray._JOB_RANGE[0] * snap_ray._TASKS_PER_JOB
    assert first_job_partition >= gc._FIRST_JOB_PARTITION


def test_datasink_interface_is_the_one_implemented() -> None:
    """Ray marks Datasink and Datasource DeveloperAPI (may change in a minor release): fail
    loudly, naming the version and the method, when what snapstore.ray implements changes."""
    from ray.data import Datasink, Datasource, ReadTask
    from ray.data._internal.execution.interfaces import TaskContext

    implemented = {
        (Datasink, "on_write_start"): ("self", "schema"),
        (Datasink, "write"): ("self", "blocks", "ctx"),
        (Datasink, "on_write_complete"): ("self", "write_result"),
        (Datasink, "on_write_failed"): ("self", "error"),
        (Datasink, "get_name"): ("self",),
        (Datasource, "get_read_tasks"): (
            "self",
            "parallelism",
            "per_task_row_limit",
            "data_context",
        ),
        (Datasource, "estimate_inmemory_data_size"): ("self",),
        (ReadTask, "__init__"): ("self", "read_fn", "metadata", "schema", "per_task_row_limit"),
    }
    for (cls, method), names in implemented.items():
        found = tuple(inspect.signature(getattr(cls, method)).parameters)
        assert found == names, (
            f"ray {ray.__version__} changed {cls.__name__}.{method}{found}; snapstore.ray "
            f"implements {cls.__name__}.{method}{names}: update snapstore/ray.py (and the ray "
            "extra's version range)"
        )
    for prop in ("supports_distributed_writes", "min_rows_per_write"):
        assert isinstance(inspect.getattr_static(Datasink, prop), property), (
            f"ray {ray.__version__}: Datasink.{prop} is no longer a property"
        )
    assert "task_idx" in TaskContext.__dataclass_fields__, (
        f"ray {ray.__version__}: TaskContext has no task_idx; SnapshotDatasink numbers its "
        "partitions by it"
    )


def fails_once(marker: str) -> str:
    if not os.path.exists(marker):
        Path(marker).touch()
        raise OSError("transient")
    return "second try"


def boom(n: int) -> None:
    raise ValueError(f"boom {n}")


def test_ray_executor_runs_calls_and_propagates_errors(tmp_path: Path) -> None:
    with RayExecutor() as pool:
        assert list(pool.map(pow, [2, 2, 2], [0, 1, 5])) == [1, 2, 32]
        future = pool.submit(boom, 7)
        with pytest.raises(ValueError, match="boom 7") as info:
            future.result(timeout=60)
        assert "in boom" in str(info.value)  # the remote traceback is in the message
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(pow, 2, 2)

    retrying = RayExecutor(retry_exceptions=[OSError], max_retries=1)
    assert retrying.submit(fails_once, str(tmp_path / "m")).result(timeout=60) == "second try"
    retrying.shutdown()


def test_read_snapshot_round_trip(tmp_path: Path) -> None:
    rows = make_rows()
    fp = fingerprint_key("local", 1).digest
    write_locally(tmp_path, fp, rows)
    with snapstore.open(fp, tmp_path) as snap:
        expected = list(snap)
        ds = read_snapshot(snap, override_num_blocks=3)
        assert ds.count() == N
        taken = ds.take_all()  # Ray's rows: numpy scalars come back as Python numbers
        assert [r["i"] for r in taken] == list(range(N))
        for row, sample in zip(taken, expected):
            assert all(np.array_equal(row[k], sample[k]) for k in sample)
        again = write_snapshot(ds, tmp_path, name="copy", key=1)
    with again:
        assert again.fingerprint != fp
        assert_same_samples(list(again), expected)
    assert read_snapshot(fp[:10], tmp_path).count() == N
    with pytest.raises(SnapshotNotFoundError):
        read_snapshot("0" * 32, tmp_path)


def squares(items: list[int], marker: str = ""):
    """A partitioned stage; item 3 fails the first time it runs when ``marker`` is given."""
    for item in items:
        if item == 3 and marker and not os.path.exists(marker):
            Path(marker).touch()
            raise OSError("transient failure of item 3")
        for i in range(4):
            yield {"item": item, "i": i, "v": np.full(8, item * i, np.int64)}


def test_ray_engine_writes_what_one_process_writes(tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    on_ray = snapstore.snapshot(
        squares, root=tmp_path / "a", partition_by="items", engine="ray", ignore=("marker",)
    )(list(range(6)), marker=str(marker))
    plain = snapstore.snapshot(squares, root=tmp_path / "b", ignore=("marker",))(list(range(6)))
    with on_ray, plain:
        assert on_ray.fingerprint == plain.fingerprint  # the engine is not part of the identity
        assert_same_samples(list(on_ray), list(plain))  # item 3's retry wrote it once
        assert on_ray.manifest["partitions"] == 6
    assert marker.exists()
