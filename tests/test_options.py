"""ReaderOptions: validated, frozen, and the same reader as the keyword arguments."""

from __future__ import annotations

import dataclasses
import typing

import numpy as np
import pytest

import snapstore
from snapstore import ReaderOptions
from snapstore.read.options import ReaderSettings
from snapstore.write.writer import WriteOptions


def stage(n: int):
    for i in range(n):
        yield {"id": i, "tok": np.arange(i % 5, dtype=np.int16)}


@pytest.fixture
def snap(tmp_path):
    s = snapstore.snapshot(
        stage, root=str(tmp_path), options=WriteOptions(block_min_rows=1, block_bytes=300)
    )(301)
    s.materialize()
    yield s
    s.close()


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"shuffle": "yes"}, TypeError, "shuffle: expected True or False, found 'yes'"),
        ({"drop_last": None}, TypeError, "drop_last: expected True or False, found None"),
        ({"seed": 1.5}, TypeError, "seed: expected an int, found float"),
        ({"window_bytes": 0}, ValueError, "window_bytes must be a positive number of bytes"),
        ({"window_blocks": 0}, ValueError, "window_blocks: expected an int >= 1, found 0"),
        ({"prefetch_bytes": 0}, ValueError, "prefetch_bytes: expected a positive int, found 0"),
        ({"max_requests": 0}, ValueError, "max_requests: expected an int >= 1, found 0"),
        ({"decode_threads": 0}, ValueError, "decode_threads: expected an int >= 1, found 0"),
        ({"decode_threads": 2.0}, ValueError, "decode_threads: expected an int >= 1, found 2.0"),
        ({"ragged": "x"}, ValueError, r"ragged: expected one of \('list', 'pad', 'packed'\)"),
    ],
)
def test_bad_settings_say_what_was_expected(changes, error, message) -> None:
    with pytest.raises(error, match=message):
        ReaderOptions(**changes)
    with pytest.raises(error, match=message):
        ReaderOptions().replace(**changes)


def test_frozen_repr_and_replace() -> None:
    options = ReaderOptions(shuffle=True, seed=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 4  # type: ignore[misc]
    assert repr(options).startswith("ReaderOptions(shuffle=True, seed=3, drop_last=False,")
    assert options.replace(seed=4) == ReaderOptions(shuffle=True, seed=4)
    assert options.seed == 3
    with pytest.raises(TypeError, match=r"unknown reader setting\(s\) \['epoch'\]"):
        options.replace(epoch=1)


def test_settings_typeddict_lists_every_field() -> None:
    fields = {f.name for f in dataclasses.fields(ReaderOptions)}
    assert set(typing.get_type_hints(ReaderSettings)) == fields


def test_exported() -> None:
    assert "ReaderOptions" in snapstore.__all__ and snapstore.ReaderOptions is ReaderOptions


def _read(reader) -> list[dict]:
    return [dict(b) for b in reader]


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], list):  # ragged="list": one array per sample
                assert len(x[key]) == len(y[key])
                for u, v in zip(x[key], y[key], strict=True):
                    np.testing.assert_array_equal(u, v)
            else:
                np.testing.assert_array_equal(x[key], y[key])


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"shuffle": True, "seed": 7},
        {"shuffle": True, "window_blocks": 3, "drop_last": True, "ragged": "packed"},
        {"shuffle": True, "window_bytes": 2000, "decode_threads": 1, "max_requests": 2},
        {"prefetch_bytes": 1 << 16, "ragged": "pad"},
    ],
)
def test_options_and_keywords_give_the_same_batches(snap, settings) -> None:
    by_keywords = _read(snap.batches(32, epoch=2, rank=1, world_size=2, **settings))
    options = ReaderOptions(**settings)
    by_options = _read(snap.batches(32, options, epoch=2, rank=1, world_size=2))
    _same(by_keywords, by_options)
    reader = snap.batches(32, options=options, epoch=2, rank=1, world_size=2)
    assert (
        reader.get_state()
        == snap.batches(32, epoch=2, rank=1, world_size=2, **settings).get_state()
    )


def test_keywords_override_options(snap) -> None:
    options = ReaderOptions(shuffle=True, seed=1)
    overridden = _read(snap.batches(32, options, seed=2))
    _same(overridden, _read(snap.batches(32, shuffle=True, seed=2)))
    assert snap.batches(32, options, shuffle=False).get_state()["shuffle"] == 0


def test_batches_refuses_a_bad_options_argument(snap) -> None:
    with pytest.raises(
        TypeError, match=r"options: expected a snapstore\.ReaderOptions, found dict"
    ):
        snap.batches(32, {"shuffle": True})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"unknown reader setting\(s\) \['shufle'\]"):
        snap.batches(32, shufle=True)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="window_bytes must be a positive number of bytes"):
        snap.batches(32, ReaderOptions(), window_bytes=0)


def test_torch_dataset_takes_options(snap) -> None:
    torch_mod = pytest.importorskip("snapstore.torch")
    options = ReaderOptions(seed=5, window_blocks=2, ragged="pad")
    by_options = torch_mod.SnapshotIterableDataset(snap, batch_size=32, options=options)
    by_keywords = torch_mod.SnapshotIterableDataset(
        snap, batch_size=32, seed=5, window_blocks=2, ragged="pad"
    )
    assert by_options.ragged == "pad" and by_options._options.shuffle is True  # its default
    for a, b in zip(by_options, by_keywords, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert bool((a[key] == b[key]).all())
    overridden = torch_mod.SnapshotIterableDataset(snap, batch_size=32, options=options, seed=6)
    assert overridden._options == options.replace(seed=6, shuffle=True)
    with pytest.raises(ValueError, match="decode_threads: expected an int >= 1, found 0"):
        torch_mod.SnapshotIterableDataset(snap, batch_size=32, options=options, decode_threads=0)


def test_tf_reader_takes_options(snap) -> None:
    tf_mod = pytest.importorskip("snapstore.tensorflow")
    options = ReaderOptions(seed=5, window_blocks=2, ragged="pad")
    by_options = tf_mod.TFReader(snap, batch_size=32, options=options)
    by_keywords = tf_mod.TFReader(snap, batch_size=32, seed=5, window_blocks=2, ragged="pad")
    assert by_options.element_spec == by_keywords.element_spec
    for a, b in zip(by_options.dataset(epoch=1), by_keywords.dataset(epoch=1), strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
    assert tf_mod.TFReader(snap, options=ReaderOptions())._options.shuffle is True
    with pytest.raises(ValueError, match=r"found options\.ragged='packed'"):
        tf_mod.TFReader(snap, batch_size=32, options=ReaderOptions(ragged="packed"))


def test_grain_source_takes_the_ragged_option(snap) -> None:
    grain_mod = pytest.importorskip("snapstore.grain")
    source = grain_mod.SnapshotSource(snap, options=ReaderOptions(ragged="packed"))
    assert "tok_offsets" in source.read_batch([0, 3, 4])
    assert "tok_offsets" not in source.read_batch([0, 3, 4], ragged="list")
    with pytest.raises(ValueError, match=r"only ragged applies.*found shuffle=True, seed=2"):
        grain_mod.SnapshotSource(snap, options=ReaderOptions(shuffle=True, seed=2))


def test_bench_passes_reader_settings(snap, monkeypatch) -> None:
    import json

    from click.testing import CliRunner

    from snapstore.cli.main import main

    seen: list[ReaderOptions | None] = []
    batches = snapstore.Snapshot.batches

    def spy(self, batch_size, options=None, **kw):
        seen.append(options)
        return batches(self, batch_size, options, **kw)

    monkeypatch.setattr(snapstore.Snapshot, "batches", spy)
    args = ["--root", snap.store.url, "bench", snap.fingerprint, "--json", "--seed", "3"]
    args += ["--window-bytes", "1KiB", "--prefetch-bytes", "1MB", "--decode-threads", "1"]
    result = CliRunner().invoke(main, [*args, "--max-requests", "2"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert seen == [
        ReaderOptions(
            shuffle=True,
            seed=3,
            window_bytes=1024,
            prefetch_bytes=10**6,
            max_requests=2,
            decode_threads=1,
        )
    ]
    settings = json.loads(result.output)["settings"]
    assert settings["window_bytes"] == 1024 and settings["max_requests"] == 2
    bad = CliRunner().invoke(main, [*args[:4], "--window-bytes", "0"])
    assert bad.exit_code == 2 and "expected a size >= 1 byte" in bad.output


def test_flags_given_as_0_or_1_are_taken_as_before() -> None:
    """Configs and argparse give ints: 0 and 1 worked before the options object, and still do."""
    options = ReaderOptions(shuffle=1, drop_last=0, seed=True)
    assert options.shuffle is True and options.drop_last is False and options.seed == 1
