"""A Snapshot pickles as its handle (its store's recipe and fingerprint) and is opened again,
on first use, by the process that receives it: a spawned process, a torch.multiprocessing
worker (``ddp_spawn``), a Ray task. A snapshot not yet materialized carries its stage call, and
the receiver materializes it. ``copy.copy`` and ``copy.deepcopy`` give an independent handle."""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from golden_stages import GOLDEN_ROWS, golden_rows

import snapstore
from snapstore.errors import SnapshotNotFoundError
from snapstore.manage.catalog import remove_snapshot
from snapstore.storage.listing import ListedStore
from snapstore.storage.simulate import simulated_store
from snapstore.storage.store import LocalStore, open_store

N = 40


def samples(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"id": i, "x": np.full(3, i, np.int32), "s": f"row {i}"}


@snapstore.snapshot
def counted(n: int, calls: str) -> Iterator[dict[str, Any]]:
    """Leaves a file in ``calls`` each time it runs, in whatever process runs it."""
    (Path(calls) / f"{os.getpid()}-{uuid.uuid4().hex}").touch()
    yield from samples(n)


def expected(n: int = N) -> list[tuple[int, list[int], str]]:
    return [(i, [i] * 3, f"row {i}") for i in range(n)]


def plain(snap: snapstore.Snapshot) -> list[tuple[int, list[int], str]]:
    """Every sample, in order, as plain values (what a child sends back)."""
    return [(int(s["id"]), s["x"].tolist(), str(s["s"])) for s in snap]


def _read_in_child(snap: snapstore.Snapshot, queue: Any) -> None:
    queue.put((plain(snap), snap._pinned_elsewhere, snap._guard is None))


def _unpickle_and_read(payload: bytes, queue: Any) -> None:
    snap = pickle.loads(payload)
    untouched = snap._reader is None and snap._metadata is None  # opened on first use only
    queue.put((plain(snap), untouched))


def in_spawned_process(target: Any, *args: Any) -> Any:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=target, args=(*args, queue))
    child.start()
    try:
        result = queue.get(timeout=120)
    finally:
        child.join(120)
    assert child.exitcode == 0
    return result


@pytest.fixture
def committed(tmp_path: Path) -> snapstore.Snapshot:
    return snapstore.snapshot(samples, root=str(tmp_path / "snaps"))(N).materialize()


def test_round_trip_in_process_opens_afresh_on_first_use(committed: snapstore.Snapshot) -> None:
    assert plain(committed) == expected()  # read, and pinned, here
    back = pickle.loads(pickle.dumps(committed))
    assert isinstance(back, snapstore.Snapshot) and back is not committed
    assert back.fingerprint == committed.fingerprint
    assert back.fingerprint_parts == committed.fingerprint_parts
    # Its own store, no reader and no pin of the sender's: the sender's metadata and pin only.
    assert back.store is not committed.store and back._reader is None and back._guard is None
    assert back._metadata is not None and back._pinned_elsewhere
    assert plain(back) == expected() and back[7]["id"] == 7 and len(back) == N
    assert back._stage is None  # committed here: it travels without code
    back.close()
    assert plain(committed) == expected()  # the sender's reader is its own


def test_unpickling_makes_no_request(tmp_path: Path) -> None:
    snapstore.snapshot(samples, root=str(tmp_path))(N).materialize()
    store = simulated_store(tmp_path, ttfb=0.0, record=True)
    fingerprint = snapstore.snapshot(samples, root=store).fingerprint(N).digest
    payload = pickle.dumps(snapstore.open(fingerprint, root=store))
    back = pickle.loads(payload)
    fs = back.store.fs
    assert fs is not store.fs and fs.trace == []
    assert plain(back) == expected()
    assert fs.trace  # the first use read it
    back.close()


def test_a_spawned_process_reads_a_committed_snapshot(committed: snapstore.Snapshot) -> None:
    """Sent as a Process argument (pickled by multiprocessing), after the sender has read it:
    the child reads no metadata and relies on the sender's pin."""
    assert len(committed) == N
    rows, pinned_elsewhere, no_guard = in_spawned_process(_read_in_child, committed)
    assert rows == expected()
    assert pinned_elsewhere and no_guard


def test_a_snapshot_never_read_here_is_opened_and_pinned_there(tmp_path: Path) -> None:
    unread = snapstore.snapshot(samples, root=str(tmp_path))(N).materialize()
    rows, pinned_elsewhere, no_guard = in_spawned_process(_read_in_child, unread)
    assert rows == expected()
    assert not pinned_elsewhere and not no_guard  # it read and pinned for itself


def test_an_unmaterialized_snapshot_is_materialized_once_by_its_receivers(
    tmp_path: Path, local_root: str
) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()
    snap = counted(N, str(calls))
    payload = pickle.dumps(snap)
    assert not snap.committed and not list(calls.iterdir())  # pickling ran nothing
    rows, untouched = in_spawned_process(_unpickle_and_read, payload)
    assert rows == expected() and untouched
    assert len(list(calls.iterdir())) == 1  # the stage ran in the child
    assert snap.committed
    rows, untouched = in_spawned_process(_unpickle_and_read, payload)
    assert rows == expected() and untouched
    assert len(list(calls.iterdir())) == 1  # the second receiver found it committed
    assert plain(snap) == expected() and len(list(calls.iterdir())) == 1


def test_a_local_stage_must_be_materialized_before_pickling(tmp_path: Path) -> None:
    def local_stage(n: int) -> Iterator[dict[str, Any]]:
        yield from samples(n)

    snap = snapstore.snapshot(local_stage, root=str(tmp_path))(N)
    with pytest.raises(TypeError, match=r"cannot pickle snapshot \w{12} under .*stage") as info:
        pickle.dumps(snap)
    assert "local_stage does not pickle" in str(info.value)
    assert "materialize() before pickling" in str(info.value)
    snap.materialize()  # committed: it travels as its store and fingerprint alone
    assert plain(pickle.loads(pickle.dumps(snap))) == expected()


class Unpicklable:
    def __snapstore_key__(self) -> str:
        return "unpicklable"

    def __reduce__(self) -> Any:
        raise TypeError("not this one")


def uses(n: int, thing: Any) -> Iterator[dict[str, Any]]:
    yield from samples(n)


def test_arguments_that_do_not_pickle_are_named(tmp_path: Path) -> None:
    snap = snapstore.snapshot(uses, root=str(tmp_path))(N, Unpicklable())
    with pytest.raises(TypeError, match="arguments of its stage call do not pickle"):
        pickle.dumps(snap)


def test_stores_that_cannot_travel_are_refused_by_name(tmp_path: Path) -> None:
    in_memory = snapstore.snapshot(samples, root=open_store(f"memory://{uuid.uuid4().hex}"))(N)
    with pytest.raises(TypeError, match=r"cannot pickle snapshot \w{12} under memory://.*local"):
        pickle.dumps(in_memory)
    listed = snapstore.Snapshot(ListedStore(LocalStore(tmp_path), "", {}), "0" * 32)
    with pytest.raises(TypeError, match=r"cannot pickle snapshot 000000000000 .*ListedStore"):
        pickle.dumps(listed)
    # Copies stay in this process: a memory store's snapshot copies.
    in_memory.materialize(progress=False)
    assert plain(copy.deepcopy(in_memory)) == expected()


def test_copies_are_independent_handles(committed: snapstore.Snapshot) -> None:
    assert len(committed) == N
    for twin in (copy.copy(committed), copy.deepcopy({"snap": committed})["snap"]):
        assert twin is not committed and twin._reader is None and twin._guard is None
        assert twin.fingerprint_parts == committed.fingerprint_parts
        assert plain(twin) == expected()
        assert twin._reader is not committed._reader and twin._guard is not committed._guard
        twin.close()
        assert committed[5]["id"] == 5  # closing a copy leaves the original reading


def test_a_stage_pickles_by_name_or_with_its_settings(tmp_path: Path) -> None:
    assert pickle.loads(pickle.dumps(counted)) is counted  # decorated: found by name
    assert copy.copy(counted) is counted and copy.deepcopy(counted) is counted
    store = LocalStore(tmp_path / "snaps")
    wrapped = snapstore.snapshot(samples, root=store, version="2", lease=30.0)
    back = pickle.loads(pickle.dumps(wrapped))
    assert back is not wrapped and back.fn is samples and back.name == wrapped.name
    assert back.config.version == "2" and back.lease == 30.0
    assert isinstance(back.config.root, LocalStore) and back.config.root is not store
    assert back.config.root.root == store.root
    assert back.fingerprint(N) == wrapped.fingerprint(N)
    assert plain(back(N)) == expected()
    assert wrapped(N).committed  # the same root


def test_removed_after_pickling_is_not_found_there(tmp_path: Path) -> None:
    """A committed snapshot carries no code: removed meanwhile, it is not computed again."""
    snap = snapstore.snapshot(samples, root=str(tmp_path))(N).materialize()
    payload = pickle.dumps(snap)
    remove_snapshot(LocalStore(tmp_path), snap.fingerprint)
    with pytest.raises(SnapshotNotFoundError):
        len(pickle.loads(payload))


def test_a_snapshot_an_earlier_release_wrote_keeps_the_call_fingerprint(tmp_path: Path) -> None:
    """Materializing found the snapshot a release with format version 2 wrote for the call
    (tests/test_upgrade.py): the receiver reads that one, and a downstream stage there hashes
    the call's fingerprint, as here."""
    shutil.copytree(
        Path(__file__).with_name("golden") / "stages" / "scheme3-format2", tmp_path / "r"
    )
    snap = snapstore.snapshot(golden_rows, root=tmp_path / "r")(GOLDEN_ROWS, "scheme 3 format 2")
    snap.materialize()
    assert snap.fingerprint != snap.call_fingerprint  # the earlier one is read
    for back in (pickle.loads(pickle.dumps(snap)), copy.copy(snap)):
        assert back.fingerprint == snap.fingerprint
        assert back.call_fingerprint == snap.call_fingerprint
        assert list(back) == list(snap)
        back.close()


def _torch_worker(rank: int, snap: snapstore.Snapshot, out: str) -> None:
    ids = [int(i) for b in snap.batches(8, rank=rank, world_size=2) for i in b["id"]]
    Path(out, f"rank{rank}").write_text(" ".join(map(str, ids)))


def test_torch_multiprocessing_spawn(committed: snapstore.Snapshot, tmp_path: Path) -> None:
    """As ``ddp_spawn`` sends a LightningModule that holds a snapshot: two spawned ranks."""
    torch = pytest.importorskip("torch")
    torch.multiprocessing.spawn(_torch_worker, args=(committed, str(tmp_path)), nprocs=2)
    shares = [Path(tmp_path, f"rank{r}").read_text().split() for r in range(2)]
    assert all(shares) and not set(shares[0]) & set(shares[1])
    assert sorted(int(i) for share in shares for i in share) == list(range(N))


@pytest.fixture
def local_ray() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    old = os.environ.get("RAY_USAGE_STATS_ENABLED")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=1,
            object_store_memory=100 * 2**20,
            include_dashboard=False,
            log_to_driver=False,
        )
    yield ray
    if started:
        ray.shutdown()
    if old is None:
        os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
    else:
        os.environ["RAY_USAGE_STATS_ENABLED"] = old


def test_a_ray_task_receives_a_snapshot(committed: snapstore.Snapshot, local_ray: Any) -> None:
    def read(snap: snapstore.Snapshot) -> list[tuple[int, list[int], str]]:
        return [(int(s["id"]), s["x"].tolist(), str(s["s"])) for s in snap]

    assert len(committed) == N
    assert local_ray.get(local_ray.remote(read).remote(committed), timeout=120) == expected()
