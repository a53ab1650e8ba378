"""The ragged forms of batches() and Grain's read_batch: list, packed and pad hold the same rows."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import snapstore
from snapstore.write.writer import WriteOptions

N = 203


def expected(i: int) -> dict[str, np.ndarray]:
    return {
        "tok": np.arange(i % 6, dtype=np.int32) * i,
        "grid": np.full((i % 3, 2 + i % 2), i, np.float64),
        "wave": (np.arange(i % 4) + 1j * i).astype(np.complex64),
    }


def stage(n: int) -> Any:
    for i in range(n):
        yield {"id": i, **expected(i)}


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("ragged") / "root"
    # small blocks and windows, so that batches of 24 straddle chunks and mix blocks
    options = WriteOptions(block_bytes=300, block_min_rows=3)
    s = snapstore.snapshot(stage, root=root, options=options)(N).materialize()
    yield s
    s.close()


def rows_of(batch: dict[str, Any], name: str) -> list[np.ndarray]:
    offsets = batch[f"{name}_offsets"]
    assert offsets.dtype == np.int64 and offsets[0] == 0 and offsets[-1] == len(batch[name])
    shapes = batch.get(f"{name}_shapes")
    flat = [batch[name][a:b] for a, b in itertools.pairwise(offsets)]
    return flat if shapes is None else [f.reshape(s) for f, s in zip(flat, shapes)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_packed_holds_the_rows_of_the_list_form(snap: Any, shuffle: bool) -> None:
    kw = {"shuffle": shuffle, "seed": 2, "window_blocks": 3}
    listed = list(snap.batches(24, **kw))
    packed = list(snap.batches(24, ragged="packed", **kw))
    assert len(listed) == len(packed) == -(-N // 24)
    for a, b in zip(listed, packed):
        np.testing.assert_array_equal(a["id"], b["id"])
        assert "tok_shapes" not in b and "wave_shapes" not in b and b["grid_shapes"].shape[1] == 2
        assert b["wave"].dtype == np.complex64 and b["grid"].ndim == 1
        for name in ("tok", "grid", "wave"):
            got = rows_of(b, name)
            assert len(got) == len(a[name])
            for i, x, y in zip(b["id"].tolist(), a[name], got):
                want = expected(i)[name]
                assert x.shape == y.shape == want.shape and y.dtype == want.dtype
                np.testing.assert_array_equal(y, want)


def test_unshuffled_packed_batch_of_one_block_is_a_view(tmp_path: Path) -> None:
    snap = snapstore.snapshot(stage, root=tmp_path)(50)  # one block
    batch = next(iter(snap.batches(10, ragged="packed")))
    assert not batch["tok"].flags.writeable  # a view into the decoded block, not a copy
    np.testing.assert_array_equal(batch["tok_offsets"], np.cumsum([0] + [i % 6 for i in range(10)]))
    snap.close()


def test_pad_and_packed_refuse_a_name_they_would_add(tmp_path: Path) -> None:
    def clash(n: int) -> Any:
        for i in range(n):
            yield {"tok": np.arange(i, dtype=np.int8), "tok_offsets": i}

    snap = snapstore.snapshot(clash, root=tmp_path)(5)
    with pytest.raises(ValueError, match="would add field 'tok_offsets'"):
        snap.batches(2, ragged="packed")
    snap.batches(2, ragged="pad").close()
    snap.close()


def test_grain_read_batch_forms(snap: Any, caplog: pytest.LogCaptureFixture) -> None:
    grain = pytest.importorskip("snapstore.grain")
    source = grain.SnapshotSource(snap)
    indices = [5, 100, 0, 202, 7]
    listed = source.read_batch(indices)
    packed = source.read_batch(indices, ragged="packed")
    padded = source.read_batch(indices, ragged="pad")
    assert padded["tok"].shape == (5, 5) and padded["tok_lengths"].tolist() == [5, 4, 0, 4, 1]
    for name in ("tok", "grid", "wave"):
        for i, x, y in zip(indices, listed[name], rows_of(packed, name)):
            np.testing.assert_array_equal(x, expected(i)[name])
            np.testing.assert_array_equal(y, expected(i)[name])
    with pytest.raises(ValueError, match="ragged: expected one of"):
        source.read_batch(indices, ragged="nested")


def test_grain_list_in_a_worker_warns_once(
    snap: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    grain = pytest.importorskip("snapstore.grain")
    monkeypatch.setattr(grain, "_in_grain_worker", lambda: True)
    monkeypatch.setattr(grain, "_warned", False)
    source = grain.SnapshotSource(snap)
    with caplog.at_level(logging.WARNING, logger="snapstore.grain"):
        source.read_batch([1, 2], ragged="packed")
        assert not caplog.records
        source.read_batch([1, 2])
        source.read_batch([3, 4])
    assert len(caplog.records) == 1 and "ragged='packed'" in caplog.records[0].getMessage()
