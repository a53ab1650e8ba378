"""Resuming mid-epoch: get_state()/set_state() continue with exactly the samples not yet yielded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapstore
from snapstore.errors import ResumeError
from snapstore.write.writer import WriteOptions


def stage(n: int):
    for i in range(n):
        yield {"id": i, "tok": np.arange(i % 5, dtype=np.int32)}


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    s = snapstore.snapshot(
        stage, root=str(root), options=WriteOptions(block_min_rows=1, block_bytes=400)
    )(997)
    s.materialize()
    yield s
    s.close()


def ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


settings_kw = {
    "max_examples": 40,
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture],
}


@settings(**settings_kw)
@given(
    batch_size=st.integers(1, 97),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    seed=st.integers(0, 2**40),
    window_blocks=st.integers(1, 9),
    cut=st.floats(0, 1),
)
def test_resume_at_any_batch_equals_the_uninterrupted_tail(
    snap, batch_size, shuffle, drop_last, world, workers, seed, window_blocks, cut
) -> None:
    kw = dict(
        shuffle=shuffle,
        drop_last=drop_last,
        seed=seed,
        epoch=3,
        world_size=world,
        rank=world - 1,
        num_workers=workers,
        worker=workers - 1,
        window_blocks=window_blocks,
    )
    full = list(snap.batches(batch_size, **kw))
    stop = int(cut * len(full))
    reader = snap.batches(batch_size, **kw)
    it = iter(reader)
    head = [next(it) for _ in range(stop)]
    state = reader.get_state()
    reader.close()
    assert state["position"] == sum(len(b["id"]) for b in head)
    assert all(type(v) is int and abs(v) < 2**63 for v in state.values())  # small ints only

    resumed = snap.batches(batch_size, **kw)
    resumed.set_state(json.loads(json.dumps(state)))
    tail = list(resumed)
    assert ids(head) + ids(tail) == ids(full)
    for got, want in zip(tail, full[stop:]):
        np.testing.assert_array_equal(got["id"], want["id"])
        assert [t.tolist() for t in got["tok"]] == [t.tolist() for t in want["tok"]]


def test_resume_does_not_read_the_skipped_blocks(snap) -> None:
    reader = snap.batches(50, shuffle=True, window_blocks=4)
    total_blocks = len(snap._open().index)
    state = reader.get_state() | {"position": 900}
    reader.set_state(state)
    tail = ids(reader)
    assert len(tail) == 97
    assert reader.stats().blocks < total_blocks / 4


def test_state_after_a_full_epoch_resumes_to_nothing(snap) -> None:
    reader = snap.batches(100)
    assert len(ids(reader)) == 997
    state = reader.get_state()
    assert state["position"] == 997
    again = snap.batches(100)
    again.set_state(state)
    assert ids(again) == []
    assert len(ids(again)) == 997  # a later pass repeats the epoch from its start


def test_set_epoch_starts_the_next_epoch(snap) -> None:
    reader = snap.batches(64, shuffle=True, seed=1)
    first = ids(reader)
    reader.set_epoch(1)
    second = ids(reader)
    assert sorted(first) == sorted(second) == list(range(997)) and first != second
    assert reader.get_state()["epoch"] == 1
    assert second == ids(snap.batches(64, shuffle=True, seed=1, epoch=1))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"snapshot": 1}, r"belongs to another snapshot"),
        ({"epoch": 4}, r"epoch=4 \(reader has 3\)"),
        ({"seed": 8}, r"seed=8 \(reader has 7\)"),
        ({"world_size": 4, "rank": 3}, r"consumer 3 of 4 \(reader is consumer 1 of 2;"),
        ({"num_workers": 2}, r"consumer 2 of 4 \(reader is consumer 1 of 2;"),
        ({"window_blocks": 5}, r"window_blocks=5 \(reader has 4\)"),
        ({"shuffle": 0}, r"shuffle=0 \(reader has 1\)"),
        ({"position": 10_000}, r"position must be in \[0, 499\], found 10000"),
        ({"position": -1}, r"position must be in \[0, 499\], found -1"),
        ({"version": 9}, r"has version 9, this snapstore reads version 1"),
    ],
)
def test_a_state_for_another_reader_is_rejected(snap, change, match) -> None:
    kw = dict(shuffle=True, seed=7, epoch=3, rank=1, world_size=2, window_blocks=4)
    state = snap.batches(10, **kw).get_state() | change
    with pytest.raises(ResumeError, match=match):
        snap.batches(10, **kw).set_state(state)


def test_malformed_states_are_rejected(snap) -> None:
    reader = snap.batches(10)
    with pytest.raises(ResumeError, match=r"missing \['position'\]"):
        reader.set_state({k: v for k, v in reader.get_state().items() if k != "position"})
    with pytest.raises(ResumeError, match="expected a state dict"):
        reader.set_state([1, 2])  # type: ignore[arg-type]


def test_set_state_while_iterating_is_refused(snap) -> None:
    reader = snap.batches(10)
    it = iter(reader)
    next(it)
    with pytest.raises(ResumeError, match="call it before iterating"):
        reader.set_state(reader.get_state())
    reader.close()


def test_a_state_from_another_snapshot_is_rejected(tmp_path: Path, snap) -> None:
    other = snapstore.snapshot(stage, root=str(tmp_path))(50)
    state = other.batches(10).get_state()
    with pytest.raises(ResumeError, match=f"another snapshot, not {snap.fingerprint}"):
        snap.batches(10).set_state(state)
    other.close()


RESUME_SCRIPT = """
import json, sys
import snapstore
fingerprint, root, state = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
snap = snapstore.open(fingerprint, root=root)
reader = snap.batches(32, shuffle=True, seed=11, epoch=2, world_size=2, rank=1)
reader.set_state(state)
print(json.dumps([int(i) for b in reader for i in b["id"]]))
"""


def test_resume_in_a_fresh_process(snap) -> None:
    kw = dict(shuffle=True, seed=11, epoch=2, world_size=2, rank=1)
    full = ids(snap.batches(32, **kw))
    reader = snap.batches(32, **kw)
    it = iter(reader)
    head = ids(next(it) for _ in range(5))
    state = reader.get_state()
    reader.close()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(RESUME_SCRIPT),
            snap.fingerprint,
            str(snap.store.url),
            json.dumps(state),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert head + json.loads(out.stdout) == full


def test_a_state_moves_between_splits_of_the_same_consumers(snap) -> None:
    """Consumer 2 of 4 is rank 2 of 4 ranks, or rank 1's worker 0 of 2 ranks x 2 workers."""
    kw = dict(shuffle=True, seed=4, window_blocks=3)
    flat = snap.batches(16, rank=2, world_size=4, **kw)
    it = iter(flat)
    head = ids(next(it) for _ in range(3))
    state = flat.get_state()
    flat.close()
    split = snap.batches(16, rank=1, world_size=2, worker=0, num_workers=2, **kw)
    split.set_state(state)
    assert head + ids(split) == ids(snap.batches(16, rank=2, world_size=4, **kw))
