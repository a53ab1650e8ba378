"""Snapshots written by earlier releases still read: each format-v* directory under tests/golden/
holds one, written by the release its name gives, from the samples in tests/golden_samples.py.

The directories are copied before reading: a reader writes its pins and last-read markers
into the root, and the checkout must not change.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from golden_samples import (
    GOLDEN_V1,
    GOLDEN_V1_COUNT,
    GOLDEN_V2,
    GOLDEN_V2_COUNT,
    GOLDEN_V3,
    GOLDEN_V3_COUNT,
    golden_v1_samples,
    golden_v2_samples,
    golden_v3_samples,
)

import snapstore
from snapstore.cli.main import main

GOLDEN = Path(__file__).with_name("golden")

# directory, fingerprint, count, samples, format version
GOLDENS: list[tuple[str, str, int, Callable[[], list[dict[str, Any]]], int]] = [
    ("format-v1", GOLDEN_V1, GOLDEN_V1_COUNT, golden_v1_samples, 1),
    ("format-v2", GOLDEN_V2, GOLDEN_V2_COUNT, golden_v2_samples, 2),
    ("format-v3", GOLDEN_V3, GOLDEN_V3_COUNT, golden_v3_samples, 3),
]
IDS = [golden[0] for golden in GOLDENS]


@pytest.fixture(params=GOLDENS, ids=IDS)
def golden(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[Path, str, int, Callable[[], list[dict[str, Any]]], int]:
    name, fingerprint, count, samples, version = request.param
    root = tmp_path / name
    shutil.copytree(GOLDEN / name, root)
    return root, fingerprint, count, samples, version


def assert_same(found: Any, expected: Any, where: str) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(found, np.ndarray), where
        assert found.dtype == expected.dtype and found.shape == expected.shape, where
        np.testing.assert_array_equal(found, expected, err_msg=where)
    elif isinstance(expected, dict):
        assert isinstance(found, dict) and found.keys() == expected.keys(), where
        for key, value in expected.items():
            assert_same(found[key], value, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(found, list) and len(found) == len(expected), where
        for item, value in zip(found, expected):
            assert_same(item, value, where)
    else:
        assert type(found) is type(expected) and found == expected, where


def assert_every_sample(root: Path, fingerprint: str, samples: list[dict[str, Any]]) -> None:
    snap = snapstore.open(fingerprint, root=str(root))
    assert len(snap) == len(samples)
    for i, expected in enumerate(samples):
        sample = snap[i]
        assert sample.keys() == expected.keys()
        for name, value in expected.items():
            assert_same(sample[name], value, f"sample {i}, field {name}")
    snap.close()


def test_golden_is_of_its_version(golden: Any) -> None:
    root, fingerprint, _, _, version = golden
    record = json.loads((root / fingerprint / "COMMIT").read_bytes())
    assert record["format_version"] == version
    (manifest,) = (root / fingerprint / "runs").glob("*/manifest.json")
    assert json.loads(manifest.read_bytes())["format_version"] == version


def test_golden_reads_every_sample(golden: Any) -> None:
    root, fingerprint, _, samples, _ = golden
    assert_every_sample(root, fingerprint, samples())


def test_golden_reads_in_batches_and_verifies(golden: Any) -> None:
    root, fingerprint, count, samples, _ = golden
    snap = snapstore.open(fingerprint, root=str(root))
    expected = samples()
    seen = []
    for batch in snap.batches(6, shuffle=True, seed=1):
        for row, label in enumerate(batch["label"].tolist()):
            i = label // 3
            seen.append(i)
            assert_same(batch["tokens"][row], expected[i]["tokens"], f"tokens of {i}")
            assert_same(batch["text"][row], expected[i]["text"], f"text of {i}")
    assert sorted(seen) == list(range(count))
    snap.close()
    result = CliRunner().invoke(main, ["--root", str(root), "verify", fingerprint])
    assert result.exit_code == 0, result.output


def test_golden_copies_unchanged(golden: Any, tmp_path: Path) -> None:
    """`snapstore cp` keeps the snapshot's format version and checksums: the copy's files hold
    the same bytes (the run name aside), and the copy reads and verifies."""
    root, fingerprint, _, samples, version = golden
    dest = tmp_path / "copy"
    result = CliRunner().invoke(main, ["--root", str(root), "cp", fingerprint, str(dest)])
    assert result.exit_code == 0, result.output
    (source_run,) = (root / fingerprint / "runs").iterdir()
    (copy_run,) = (dest / fingerprint / "runs").iterdir()
    for name in ("index.bin", "shard-00000.snap"):
        assert (copy_run / name).read_bytes() == (source_run / name).read_bytes(), name
    assert json.loads((dest / fingerprint / "COMMIT").read_bytes())["format_version"] == version
    assert_every_sample(dest, fingerprint, samples())
    result = CliRunner().invoke(main, ["--root", str(dest), "verify", fingerprint])
    assert result.exit_code == 0, result.output
