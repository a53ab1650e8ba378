"""Snapshots in buckets: written and read back through gcsfs against fake-gcs-server and s3fs
against moto (both started by the tests), through the prefetcher's parallel range reads, and
from fresh processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from servers import Server, child_env

import snapstore
from snapstore.errors import SnapshotNotFoundError, StoreError
from snapstore.storage.store import FsspecStore, open_store

N = 600
# Many small blocks in several small shards: many range reads, small objects (moto copies the
# whole object for every range read).
OPTIONS = snapstore.WriteOptions(block_min_rows=1, block_bytes=1024, shard_bytes=16 << 10)


def tokens(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"x": i, "v": np.full(16, i, np.int32), "name": f"s{i}"}


def write_snapshot(url: str, options: dict[str, Any], n: int = N) -> str:
    store = open_store(url, **options)
    snap = snapstore.snapshot(tokens, root=store, options=OPTIONS)(n).materialize()
    assert snap.committed
    return snap.fingerprint


def test_round_trip_through_the_prefetcher(remote_root: tuple[str, dict[str, Any]]) -> None:
    url, options = remote_root
    fp = write_snapshot(url, options)
    store = open_store(url, **options)  # a new store: nothing cached from the write
    assert isinstance(store, FsspecStore) and store.list_dir(f"{fp}/runs")
    with snapstore.open(fp, root=store) as snap:
        assert len(snap) == N
        assert snap[N - 1]["name"] == f"s{N - 1}"
        assert [int(s["x"]) for s in snap] == list(range(N))
        seen: list[int] = []
        with snap.batches(32, shuffle=True, seed=3, epoch=1, window_blocks=8) as reader:
            for batch in reader:
                for x, v in zip(batch["x"], batch["v"]):
                    assert v.tolist() == [int(x)] * 16
                    seen.append(int(x))
        stats = reader.stats()
    assert sorted(seen) == list(range(N)) and seen != list(range(N))
    # The blocks came through parallel range reads on the fetch threads, all sharing the
    # driver's one event loop.
    assert stats.requests > 10 and stats.max_in_flight > 1


def test_many_threads_read_ranges_at_once(remote_store: FsspecStore) -> None:
    data = np.random.default_rng(0).integers(0, 256, 8192, np.uint8).tobytes()
    remote_store.write_bytes("blob", data)
    ranges = [(int(s), int(n)) for s, n in np.random.default_rng(1).integers(0, 4096, (200, 2))]

    def read(r: tuple[int, int]) -> bool:
        return bytes(remote_store.read_range("blob", r[0], r[1])) == data[r[0] : r[0] + r[1]]

    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(read, ranges))


CHILD = textwrap.dedent(
    """
    import json, sys, time
    start = time.perf_counter()
    import snapstore

    url, options, fp = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    store = snapstore.open_store(url, **options)
    with snapstore.open(fp, root=store) as snap:
        total = sum(int(b["x"].sum()) for b in snap.batches(64, shuffle=True))
    kind = f"{type(store.fs).__module__}.{type(store.fs).__name__}"
    print(json.dumps({"total": total, "fs": kind, "seconds": time.perf_counter() - start}))
    """
)


@pytest.mark.parametrize("how", ["endpoint_url", "STORAGE_EMULATOR_HOST"])
def test_a_fresh_process_reads_from_the_gcs_emulator_at_once(gcs_server: Server, how: str) -> None:
    url, options = gcs_server.root()
    fp = write_snapshot(url, options, n=100)
    env = child_env()
    if how == "STORAGE_EMULATOR_HOST":  # in the child's environment only
        env["STORAGE_EMULATOR_HOST"] = options.pop("endpoint_url")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url, json.dumps(options), fp],
        capture_output=True, text=True, timeout=50, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["total"] == sum(range(100))
    assert result["fs"] == "snapstore.storage.gcs.GCSFileSystem"
    assert result["seconds"] < 20  # gcsfs' extended class would wait ~60 s on its gRPC probe


@pytest.mark.parametrize("kind", ["gcs", "s3"])
def test_a_missing_bucket_fails_fast_naming_it(request: pytest.FixtureRequest, kind: str) -> None:
    server: Server = request.getfixturevalue(f"{kind}_server")
    url = f"{server.scheme}://no-such-bucket-{uuid.uuid4().hex[:8]}/snaps"
    store = open_store(url, **server.storage_options)
    with pytest.raises(StoreError, match=rf"{url}/a/b.*bucket does not exist") as info:
        store.write_bytes("a/b", b"x")
    assert info.value.errno is not None
    began = time.perf_counter()
    with pytest.raises(StoreError, match="bucket does not exist"):
        snapstore.snapshot(tokens, root=store, options=OPTIONS)(10).materialize()
    assert time.perf_counter() - began < 10
    # Reading finds nothing: s3fs says the bucket is missing, gcsfs cannot tell it from an
    # empty prefix.
    with pytest.raises((StoreError, SnapshotNotFoundError)):
        snapstore.open("0" * 32, root=store)
