"""BatchReader takes its settings as one ReaderOptions (issue 17), and the keywords it took
before, beside a PlanOptions, still make the reader they made; the Prefetcher's limits are one
PrefetchLimits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import snapstore
from snapstore.format.plan import ORDER_VERSION, PlanOptions
from snapstore.read.prefetch import PrefetchLimits
from snapstore.read.reader import SnapshotReader
from snapstore.storage.store import Store
from snapstore.write.writer import WriteOptions


def stage(n: int):
    for i in range(n):
        yield {"id": i, "tok": np.arange(i % 5, dtype=np.int16)}


@pytest.fixture
def snap(store: Store):
    s = snapstore.snapshot(
        stage, root=store, options=WriteOptions(block_min_rows=1, block_bytes=400)
    )(301)
    s.materialize()
    yield s
    s.close()


def opened(snap: snapstore.Snapshot) -> SnapshotReader:
    return snap.batches(1).reader


def read(batches: snapstore.BatchReader) -> list[dict[str, Any]]:
    with batches:
        return list(batches)


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x["id"], y["id"])
        for u, v in zip(x["tok"], y["tok"], strict=True):
            np.testing.assert_array_equal(u, v)


def former_call(reader: SnapshotReader, options: snapstore.ReaderOptions, **place: Any) -> Any:
    """The reader ``Snapshot.batches()`` made before issue 17: the order as a PlanOptions, the
    window and read-ahead sized by the caller, the rest as keywords (and the order version,
    which a PlanOptions made without one sets to 1, the order before versions)."""
    blocks = options.window_blocks or reader.window_blocks(options.window_bytes)
    window = int(reader.manifest["raw_bytes"]) / max(1, reader.num_blocks) * blocks
    ahead = 2 if reader.store.local else 4
    budget = options.prefetch_bytes or max(ahead * 32 << 20, int(ahead * window))
    version = options.order_version or ORDER_VERSION
    plan = PlanOptions(bool(options.shuffle), options.seed, blocks, options.drop_last, version)
    return snapstore.BatchReader(
        reader,
        16,
        options=plan,
        prefetch_bytes=budget,
        max_requests=options.max_requests,
        decode_threads=options.decode_threads,
        ragged=options.ragged,
        **place,
    )


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"shuffle": True, "seed": 3, "window_bytes": 900},
        {"shuffle": True, "window_blocks": 2, "drop_last": True, "ragged": "packed"},
        {"shuffle": True, "window_blocks": 20, "order_version": 1},
        {"decode_threads": 1, "max_requests": 2, "prefetch_bytes": 1 << 16, "ragged": "pad"},
    ],
)
def test_options_keywords_and_the_former_call_make_the_same_reader(snap, settings) -> None:
    reader = opened(snap)
    options = snapstore.ReaderOptions(**settings)
    place = {"epoch": 2, "rank": 1, "world_size": 2}
    by_options = snapstore.BatchReader(reader, 16, options, **place)
    by_keywords = snapstore.BatchReader(reader, 16, **place, **settings)
    former = former_call(reader, options, **place)
    for other in (by_keywords, former, snap.batches(16, options, **place)):
        assert other.get_state() == by_options.get_state()
        assert other.options == by_options.options
        assert (other.prefetch_bytes, other.max_requests, other.decode_threads, other.ragged) == (
            by_options.prefetch_bytes,
            by_options.max_requests,
            by_options.decode_threads,
            by_options.ragged,
        )
    batches = read(by_options)
    same(batches, read(by_keywords))
    same(batches, read(former))


def test_settings_are_the_options_given(snap) -> None:
    options = snapstore.ReaderOptions(shuffle=True, seed=1)
    batches = snapstore.BatchReader(opened(snap), 8, options, seed=2, ragged="pad")
    assert batches.settings == options.replace(seed=2, ragged="pad")
    assert batches.options.seed == 2 and batches.options.shuffle is True
    assert batches.options.window_blocks == opened(snap).window_blocks(options.window_bytes)


def test_a_plan_keeps_the_former_defaults(snap) -> None:
    plan = PlanOptions(shuffle=True, seed=5, window_blocks=3)
    batches = snapstore.BatchReader(opened(snap), 8, options=plan)
    assert batches.options is plan
    assert batches.prefetch_bytes == 64 << 20
    assert (batches.max_requests, batches.decode_threads, batches.ragged) == (None, None, "list")
    assert batches.settings.window_blocks == 3 and batches.settings.seed == 5


def test_a_plan_refuses_order_keywords(snap) -> None:
    with pytest.raises(TypeError, match=r"\['seed'\] beside a PlanOptions"):
        snapstore.BatchReader(opened(snap), 8, options=PlanOptions(), seed=1)


def test_bad_settings_are_refused_as_the_options_refuse_them(snap) -> None:
    reader = opened(snap)
    with pytest.raises(ValueError, match="prefetch_bytes: expected a positive int, found 0"):
        snapstore.BatchReader(reader, 8, options=PlanOptions(), prefetch_bytes=0)
    with pytest.raises(ValueError, match=r"ragged: expected one of .*, found 'x'"):
        snapstore.BatchReader(reader, 8, ragged="x")
    with pytest.raises(TypeError, match=r"options: expected a snapstore\.ReaderOptions"):
        snapstore.BatchReader(reader, 8, {"shuffle": True})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"decode_threads": 0, "max_requests": 0}, "decode_threads: expected an int >= 1"),
        ({"max_requests": 0}, "max_requests: expected an int >= 1, found 0"),
        ({"budget_bytes": 0}, "prefetch budget: expected a positive number of bytes, found 0"),
    ],
)
def test_prefetch_limits_are_checked(limits: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrefetchLimits(**({"budget_bytes": 1} | limits))
