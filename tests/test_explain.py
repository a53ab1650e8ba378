"""Why was this recomputed? diff between snapshots, explanations on a miss, chaining, and the
settings that must not change a fingerprint."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.main import main
from snapstore.write.writer import WriteOptions


def tokens(n: int, max_len: int = 8):
    for i in range(n):
        yield {"tokens": np.arange(i % max_len, dtype=np.int32), "id": i}


def test_miss_is_explained_against_the_most_recent_snapshot_of_the_stage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stage = snapstore.snapshot(tokens, root=str(tmp_path))
    first = stage(10).materialize()
    assert first.miss_explanation is None  # nothing to compare with
    with caplog.at_level(logging.WARNING, logger="snapstore"):
        second = stage(10, max_len=16).materialize()
    assert second.miss_explanation is not None
    assert second.miss_explanation["previous"] == first.fingerprint
    assert any("max_len" in d for d in second.miss_explanation["differences"])
    assert "max_len" in caplog.text and first.fingerprint in caplog.text
    again = stage(10, max_len=16).materialize()  # a hit: nothing to explain
    assert again.miss_explanation is None


def test_cli_diff(tmp_path: Path) -> None:
    root = str(tmp_path)
    stage = snapstore.snapshot(tokens, root=root)
    a = stage(10).materialize()
    b = stage(12, max_len=16).materialize()
    result = CliRunner().invoke(
        main, ["--root", root, "diff", a.fingerprint[:8], b.fingerprint[:8]]
    )
    assert result.exit_code == 0, result.output
    assert "max_len" in result.output and "'n'" in result.output
    result = CliRunner().invoke(
        main, ["--root", root, "diff", a.fingerprint, b.fingerprint, "--json"]
    )
    data = json.loads(result.output)
    assert data["a"] == a.fingerprint and data["b"] == b.fingerprint
    assert data["parts"]["arguments"]["same"] is False and data["parts"]["code"]["same"] is True
    same = CliRunner().invoke(main, ["--root", root, "diff", a.fingerprint, a.fingerprint])
    assert "no fingerprint part differs" in same.output


def test_upstream_snapshot_chains_fingerprints(tmp_path: Path) -> None:
    root = str(tmp_path)
    up = snapstore.snapshot(tokens, root=root)

    def lengths(source):
        for sample in source:
            yield {"length": len(sample["tokens"])}

    down = snapstore.snapshot(lengths, root=root)
    a = down(up(10))
    assert a.fingerprint == down(up(10)).fingerprint
    b = down(up(10, max_len=4))
    assert a.fingerprint != b.fingerprint
    assert [s["length"] for s in b.materialize()] == [i % 4 for i in range(10)]


@pytest.mark.parametrize(
    "options",
    [
        WriteOptions(block_bytes=1 << 16),
        WriteOptions(shard_bytes=1 << 20),
        WriteOptions(compression_level=0),
        WriteOptions(compression_level=9),
        WriteOptions(threads=1),
    ],
)
def test_write_settings_do_not_change_the_fingerprint(
    tmp_path: Path, options: WriteOptions
) -> None:
    calls = []

    def stage(n: int):
        calls.append(n)
        yield from tokens(n)

    default = snapstore.snapshot(stage, root=str(tmp_path))(5).materialize()
    tuned = snapstore.snapshot(stage, root=str(tmp_path), options=options)(5)
    assert tuned.fingerprint == default.fingerprint
    tuned.materialize(progress=lambda samples, nbytes: None)
    assert calls == [5]  # reused, not recomputed


def test_root_location_does_not_change_the_fingerprint(tmp_path: Path) -> None:
    a = snapstore.snapshot(tokens, root=str(tmp_path / "a"))(3)
    b = snapstore.snapshot(tokens, root=str(tmp_path / "b"))(3)
    assert a.fingerprint == b.fingerprint
