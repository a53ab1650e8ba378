"""Snapshots written by earlier releases still read: each directory under tests/golden/ holds one,
written by the release its name gives, from the samples in tests/golden_samples.py.

The directories are copied before reading: a reader writes its pins and last-read markers
into the root, and the checkout must not change.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from golden_samples import GOLDEN_V1, GOLDEN_V1_COUNT, golden_v1_samples

import snapstore
from snapstore.cli.main import main

GOLDEN = Path(__file__).with_name("golden")


@pytest.fixture
def v1_root(tmp_path: Path) -> Path:
    root = tmp_path / "format-v1"
    shutil.copytree(GOLDEN / "format-v1", root)
    return root


def assert_same(found: Any, expected: Any, where: str) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(found, np.ndarray), where
        assert found.dtype == expected.dtype and found.shape == expected.shape, where
        np.testing.assert_array_equal(found, expected, err_msg=where)
    else:
        assert type(found) is type(expected) and found == expected, where


def test_format_v1_reads_every_sample(v1_root: Path) -> None:
    snap = snapstore.open(GOLDEN_V1, root=str(v1_root))
    assert len(snap) == GOLDEN_V1_COUNT
    for i, expected in enumerate(golden_v1_samples()):
        sample = snap[i]
        assert sample.keys() == expected.keys()
        for name, value in expected.items():
            assert_same(sample[name], value, f"sample {i}, field {name}")
    snap.close()


def test_format_v1_reads_in_batches_and_verifies(v1_root: Path) -> None:
    snap = snapstore.open(GOLDEN_V1, root=str(v1_root))
    expected = golden_v1_samples()
    seen = []
    for batch in snap.batches(6, shuffle=True, seed=1):
        for row, label in enumerate(batch["label"].tolist()):
            i = label // 3
            seen.append(i)
            assert_same(batch["tokens"][row], expected[i]["tokens"], f"tokens of {i}")
            assert_same(batch["text"][row], expected[i]["text"], f"text of {i}")
    assert sorted(seen) == list(range(GOLDEN_V1_COUNT))
    snap.close()
    result = CliRunner().invoke(main, ["--root", str(v1_root), "verify", GOLDEN_V1])
    assert result.exit_code == 0, result.output
