"""snapstore.tensorflow over a mixture: the mixture's order, per-source counts, epochs, ranks,
ragged forms, the source field in the element spec, and resume with state_after."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip(
    "tensorflow",
    reason="snapstore.tensorflow needs TensorFlow: pip install 'snapstore[tensorflow]'",
)

import snapstore  # noqa: E402
from snapstore.errors import ResumeError  # noqa: E402
from snapstore.tensorflow import TFReader, to_dataset  # noqa: E402

# Small blocks (about 4 samples each) so that shuffling and sharding cross blocks.
OPTIONS = snapstore.WriteOptions(block_bytes=64, block_min_rows=4)
B = 1000  # ids of source "b" start here


def rows(n: int, tag: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {
            "id": tag + i,
            "x": np.full((2,), tag + i, np.float32),
            "tok": np.arange(i % 4, dtype=np.int32),
        }


@pytest.fixture(scope="module")
def snaps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, snapstore.Snapshot]:
    root = tmp_path_factory.mktemp("mixtf") / "root"
    make = snapstore.snapshot(rows, root=root, options=OPTIONS)
    return {"a": make(30, 0).materialize(), "b": make(12, B).materialize()}


@pytest.fixture(scope="module")
def mixture(snaps: dict[str, snapstore.Snapshot]) -> snapstore.Mixture:
    """Half and half: "a" (30 samples) subsampled to 21 per epoch, "b" (12) repeated to 21."""
    return snapstore.mix(snaps, [0.5, 0.5], source_field="src")


def ids(ds: Any) -> list[int]:
    out: list[int] = []
    for element in ds:
        got = np.atleast_1d(element["id"].numpy())
        np.testing.assert_array_equal(np.atleast_1d(element["src"].numpy()), got >= B)
        out.extend(got.tolist())
    return out


@pytest.mark.parametrize("batch_size", [4, None])
def test_an_epoch_is_the_mixtures_order_with_its_counts(
    mixture: snapstore.Mixture, batch_size: int | None
) -> None:
    got = ids(to_dataset(mixture, batch_size=batch_size, seed=3, epoch=0))
    expected = [i for b in mixture.batches(4, shuffle=True, seed=3) for i in b["id"]]
    assert got == expected
    assert len(got) == len(mixture) == 42
    assert [sum(i < B for i in got), sum(i >= B for i in got)] == mixture.counts == [21, 21]
    a, b = (
        collections.Counter(i for i in got if i < B),
        collections.Counter(i for i in got if i >= B),
    )
    assert max(a.values()) == 1  # subsampled: 21 different samples of 30
    assert set(b) == set(range(B, B + 12)) and max(b.values()) == 2  # one pass and most of a second


def test_epochs_differ(mixture: snapstore.Mixture) -> None:
    reader = TFReader(mixture, batch_size=4, seed=0)
    first, second = ids(reader.dataset(epoch=0)), ids(reader.dataset(epoch=1))
    assert first != second and len(first) == len(second)
    assert ids(reader.dataset(epoch=0)) == first


@pytest.mark.parametrize(
    ("batch_size", "drop_last", "steps"),
    [(4, False, 3), (4, True, 5), (None, False, 7), (None, True, 17), (5, False, 0)],
)
def test_state_after_resumes_with_exactly_the_rest(
    mixture: snapstore.Mixture, batch_size: int | None, drop_last: bool, steps: int
) -> None:
    reader = TFReader(mixture, batch_size=batch_size, seed=1, drop_last=drop_last)
    full = list(reader.dataset(epoch=2))
    state = json.loads(json.dumps(reader.state_after(steps, epoch=2)))
    again = TFReader(mixture, batch_size=batch_size, seed=1, drop_last=drop_last)
    rest = again.dataset(state=state)
    assert len(rest) == len(full) - steps
    assert ids(rest) == ids(full[steps:])
    # From the resumed dataset on: steps count from where it started.
    later = again.state_after(1, state=state)
    assert ids(again.dataset(state=later)) == ids(full[steps + 1 :])


@pytest.mark.parametrize(
    ("world_size", "drop_last", "batch_size"), [(2, False, 4), (3, True, None), (4, False, 4)]
)
def test_ranks_read_disjoint_equal_shares(
    snaps: dict[str, snapstore.Snapshot], world_size: int, drop_last: bool, batch_size: int | None
) -> None:
    mixture = snapstore.mix(snaps, source_field="src")  # by size: every sample once an epoch
    shares = [
        ids(
            to_dataset(
                mixture,
                batch_size=batch_size,
                seed=2,
                rank=r,
                world_size=world_size,
                drop_last=drop_last,
            )
        )
        for r in range(world_size)
    ]
    assert len({len(s) for s in shares}) == 1
    flat = [i for s in shares for i in s]
    everything = {*range(30), *range(B, B + 12)}
    if drop_last:  # per sample, a share keeps its short last read batch
        assert len(flat) == len(set(flat)) == 42 // world_size * world_size
        assert set(flat) <= everything
    else:  # the last shares are padded from the start of the epoch
        assert set(flat) == everything and len(flat) == -(-42 // world_size) * world_size


def test_source_field_is_in_the_element_spec(
    mixture: snapstore.Mixture, snaps: dict[str, snapstore.Snapshot]
) -> None:
    batched = to_dataset(mixture, batch_size=4, drop_last=True)
    assert batched.element_spec["src"] == tf.TensorSpec((4,), tf.int64)
    assert batched.element_spec["tok"] == tf.RaggedTensorSpec((4, None), tf.int32, 1, tf.int64)
    single = to_dataset(mixture)
    assert single.element_spec["src"] == tf.TensorSpec((), tf.int64)
    assert "src" not in to_dataset(snapstore.mix(snaps), batch_size=4).element_spec


@pytest.mark.parametrize("ragged", ["ragged", "pad"])
def test_varying_fields_match_the_mixture_reader(mixture: snapstore.Mixture, ragged: str) -> None:
    ds = to_dataset(mixture, batch_size=4, seed=5, ragged=ragged)
    form = "pad" if ragged == "pad" else "list"
    expected = list(mixture.batches(4, shuffle=True, seed=5, ragged=form))
    got = list(ds)
    assert len(got) == len(expected)
    for batch, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(batch["x"].numpy(), want["x"])
        np.testing.assert_array_equal(batch["src"].numpy(), want["src"])
        if ragged == "pad":
            np.testing.assert_array_equal(batch["tok"].numpy(), want["tok"])
            np.testing.assert_array_equal(batch["tok_lengths"].numpy(), want["tok_lengths"])
        else:
            assert batch["tok"].to_list() == [t.tolist() for t in want["tok"]]


def test_bad_inputs_fail_clearly(
    mixture: snapstore.Mixture, snaps: dict[str, snapstore.Snapshot]
) -> None:
    with pytest.raises(TypeError, match="expected a snapstore"):
        TFReader([snaps["a"], snaps["b"]], batch_size=4)
    homogeneous = snapstore.mix(snaps, homogeneous=True)
    with pytest.raises(ValueError, match="homogeneous"):
        TFReader(homogeneous)
    assert len(ids_of_batches(TFReader(homogeneous, batch_size=4).dataset())) == 40
    foreign = TFReader(snaps["a"], batch_size=4, seed=1).state_after(1)
    with pytest.raises(ResumeError):
        TFReader(mixture, batch_size=4, seed=1).dataset(state=foreign)
    other_seed = TFReader(mixture, batch_size=4, seed=2).state_after(1)
    with pytest.raises(ResumeError, match="seed"):
        TFReader(mixture, batch_size=4, seed=1).dataset(state=other_seed)


def ids_of_batches(ds: Any) -> list[int]:
    """Ids of a mixture without a source field, each batch drawn whole from one source."""
    out: list[int] = []
    for batch in ds:
        got = batch["id"].numpy().tolist()
        assert len({i >= B for i in got}) == 1
        out.extend(got)
    return out
