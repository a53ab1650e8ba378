"""A mixture of a local snapshot and one on fake-gcs-server in DataLoader workers and a
StatefulDataLoader resume."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

import snapstore  # noqa: E402
from snapstore.torch import SnapshotIterableDataset  # noqa: E402

DataLoader = torch.utils.data.DataLoader
StatefulDataLoader = stateful.StatefulDataLoader
OPTIONS = snapstore.WriteOptions(block_min_rows=1, block_bytes=1024, shard_bytes=16 << 10)


def rows(n: int, tag: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"id": tag + i, "v": np.full(4, i, np.float32)}


@pytest.fixture(scope="module")
def mixture(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> snapstore.Mixture:
    url, options = request.getfixturevalue("gcs_server").root()
    remote = snapstore.open_store(url, **options)
    local = tmp_path_factory.mktemp("mixlocal")
    a = snapstore.snapshot(rows, root=local, options=OPTIONS)(120, 0).materialize()
    b = snapstore.snapshot(rows, root=remote, options=OPTIONS)(40, 1000).materialize()
    return snapstore.mix({"local": a, "gcs": b}, [0.6, 0.4], source_field="src")


def ids(loader: Any) -> list[list[int]]:
    return [batch["id"].tolist() for batch in loader]


def test_dataloader_workers_read_the_mixture(mixture: snapstore.Mixture) -> None:
    ds = SnapshotIterableDataset(mixture, batch_size=8, seed=4)
    first = ids(DataLoader(ds, batch_size=None, num_workers=2))
    flat = [i for b in first for i in b]
    assert len(flat) == len(mixture) == 160
    assert sum(i >= 1000 for i in flat) == mixture.counts[1] == 64
    ds.set_epoch(1)
    second = ids(DataLoader(ds, batch_size=None, num_workers=2))
    assert second != first and len(second) == len(first)


def test_stateful_resume_over_a_mixture(mixture: snapstore.Mixture) -> None:
    def loader() -> Any:
        ds = SnapshotIterableDataset(mixture, batch_size=8, seed=5, rank=1, world_size=2)
        return StatefulDataLoader(ds, batch_size=None, num_workers=2)

    full = ids(loader())
    interrupted = loader()
    taken = [b["id"].tolist() for _, b in zip(range(3), interrupted)]
    assert taken == full[:3]
    state = interrupted.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert ids(resumed) == full[3:]
