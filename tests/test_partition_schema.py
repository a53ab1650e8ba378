"""Schemas of a partitioned stage's shared partitions: each partition infers its own, so a 1-D
field whose samples all had one length in a partition (a partition of one input) is stored
fixed there and varying elsewhere; the error says what to declare, and a declared schema keeps
partitions apart from those written without it (they store other types)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import snapstore
from snapstore.errors import SchemaError
from snapstore.fingerprint.partition import stage_key
from snapstore.write.boundaries import content_boundaries

NAMES = [f"doc{i:02d}" for i in range(30)]


def docs(names: list[str]) -> Any:
    for name in names:
        yield {"tokens": np.arange(int(name[3:]) % 5 + 1, dtype=np.int32), "name": name}


def test_a_partition_of_one_sample_is_stored_fixed_and_the_error_says_what_to_declare(
    tmp_path: Path,
) -> None:
    groups = content_boundaries(
        [snapstore.fingerprint.hash_value(n) for n in NAMES], 4
    )  # the groups the stage will make
    assert any(len(g) == 1 for g in groups) and any(len(g) > 1 for g in groups)
    stage = snapstore.snapshot(
        docs, root=tmp_path, partition_by="names", partition_size=4, engine="thread"
    )
    with pytest.raises(SchemaError) as info:
        stage(NAMES).materialize()
    assert "schema={'tokens': ('int32', (None,))" in str(info.value)
    declared = snapstore.snapshot(
        docs, root=tmp_path, partition_by="names", partition_size=4, engine="thread",
        schema={"tokens": ("int32", (None,)), "name": str},
    )  # fmt: skip
    snap = declared(NAMES).materialize()  # its partitions are its own: nothing fixed reused
    assert [s["name"] for s in snap] == NAMES
    assert [len(s["tokens"]) for s in snap] == [int(n[3:]) % 5 + 1 for n in NAMES]


def test_the_declared_schema_is_part_of_the_stage_key() -> None:
    parts = {name: "0" * 64 for name in ("scheme", "code", "upstream", "format", "version")}
    details: dict[str, Any] = {"arguments": {"x": "1" * 64}}
    plain = stage_key(parts, details, "names", {"names": []})
    one = stage_key(parts, details, "names", {"names": []}, schema=[{"name": "a"}])
    other = stage_key(parts, details, "names", {"names": []}, schema=[{"name": "b"}])
    assert len({plain, one, other}) == 3
