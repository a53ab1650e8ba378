"""Materialize on Ray: a partitioned stage as Ray tasks, and a Ray Dataset through the datasink.

Starts a local Ray instance (2 CPUs, a small object store) unless you pass ``--address`` of a
cluster, then:

1. runs a partitioned stage with ``engine="ray"``: each partition is a Ray task, the driver
   claims, tracks and commits; the result has the same fingerprint as a local write, which the
   script checks by writing the same stage with ``engine="thread"`` under a second root;
2. writes a Ray Dataset (``ray.data.range(...).map_batches(...)``) as a snapshot with
   :func:`snapstore.ray.write_snapshot`, reads it back with snapstore and as a Ray Dataset;
3. runs both again: nothing is recomputed.

    python examples/ray_materialize.py                 # a local root under a temp directory
    python examples/ray_materialize.py --root gs://bucket/snaps --address auto
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import snapstore


def spectra(seeds: list[int], bins: int = 64):
    """The expensive stage: a noisy spectrum per seed (stands in for feature extraction)."""
    for seed in seeds:
        rng = np.random.default_rng(seed)
        signal = np.sin(np.linspace(0, rng.uniform(5, 50), 4096)) + rng.normal(0, 0.3, 4096)
        power = np.abs(np.fft.rfft(signal))[: bins * 32].reshape(bins, 32).mean(axis=1)
        yield {"seed": seed, "spectrum": power.astype(np.float32)}


def tokenize(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A Ray Data transform: fixed-length token ids derived from each row id."""
    ids = batch["id"]
    return {"id": ids, "tokens": (ids[:, None] * 7 + np.arange(16)) % 5000}


def partitioned_stage(root: str, local_root: str, seeds: int) -> None:
    stage = snapstore.snapshot(spectra, root=root, partition_by="seeds", partition_size=25,
                               engine="ray")  # fmt: skip
    began = time.perf_counter()
    snap = stage(list(range(seeds))).materialize()
    took = time.perf_counter() - began
    print(f"engine='ray': {len(snap)} samples in {snap.manifest['partitions']} partitions, "
          f"{took:.1f} s, fingerprint {snap.fingerprint}")  # fmt: skip
    local = snapstore.snapshot(spectra, root=local_root, partition_by="seeds", partition_size=25,
                               engine="thread")(list(range(seeds)))  # fmt: skip
    same = local.fingerprint == snap.fingerprint and all(
        a["seed"] == b["seed"] and np.array_equal(a["spectrum"], b["spectrum"])
        for a, b in zip(snap, local, strict=True)
    )
    print(f"same fingerprint and samples as a local write: {same}")
    began = time.perf_counter()
    again = stage(list(range(seeds))).materialize()
    print(f"second call: committed already, {time.perf_counter() - began:.2f} s "
          f"({again.fingerprint == snap.fingerprint})")  # fmt: skip
    for s in (snap, local, again):
        s.close()


def datasink(root: str, rows: int) -> None:
    import ray

    from snapstore.ray import read_snapshot, write_snapshot

    ds = ray.data.range(rows, override_num_blocks=4).map_batches(tokenize)
    began = time.perf_counter()
    snap = write_snapshot(ds, root, name="tokens", key={"rows": rows, "vocab": 5000})
    took = time.perf_counter() - began
    print(f"\nRay Dataset -> snapshot {snap.fingerprint}: {len(snap)} rows in "
          f"{snap.manifest['partitions']} partitions, {took:.1f} s")  # fmt: skip
    batch = next(iter(snap.batches(8, shuffle=True, seed=0)))
    print(f"a shuffled batch read by snapstore: ids {batch['id'].tolist()}")
    back = read_snapshot(snap)
    print(f"read back as a Ray Dataset: {back.count()} rows, columns {back.columns()}")
    began = time.perf_counter()
    write_snapshot(ds, root, name="tokens", key={"rows": rows, "vocab": 5000})
    print(f"second write_snapshot: committed already, {time.perf_counter() - began:.2f} s")
    snap.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="snapshot root (default: a temporary directory)")
    parser.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    init: dict[str, Any] = {"address": args.address} if args.address else {
        "num_cpus": 2, "object_store_memory": 100 * 2**20, "include_dashboard": False,
    }  # fmt: skip
    ray.init(log_to_driver=False, logging_level=logging.WARNING, **init)
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # its per-dataset execution reports
    with tempfile.TemporaryDirectory(prefix="snapstore-ray-") as tmp:
        root = args.root or str(Path(tmp) / "root")
        partitioned_stage(root, str(Path(tmp) / "local"), args.seeds)
        datasink(root, args.rows)
    ray.shutdown()


if __name__ == "__main__":
    main()
