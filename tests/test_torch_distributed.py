"""SnapshotIterableDataset with ranks as separate processes in a real torch.distributed group.

Each rank is a fresh Python process that joins a gloo group on 127.0.0.1 and builds its dataset
without rank arguments, so its place comes from torch.distributed. The ranks gather what they read
with ``all_gather_object`` and write it to a file for the test to check against the epoch plan
(consumer ``rank * num_workers + worker`` reads ``G[(c * per + i) mod N]``) and against datasets
given the same rank explicitly in the test process.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
if not torch.distributed.is_available():  # pragma: no cover - depends on the build
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import snapstore  # noqa: E402
from snapstore.torch import SnapshotIterableDataset  # noqa: E402

DataLoader = torch.utils.data.DataLoader
N = 50
BATCH = 4
SEED = 7
EPOCHS = 2
GROUP_TIMEOUT_S = 180  # a hung group fails the test instead of waiting for faulthandler

# One rank. argv[1] is a JSON config; the rank writes what every rank read (gathered) to
# out/rank<r>.json. A failure exits non-zero with its traceback on stderr.
RANK = textwrap.dedent(
    """
    import datetime, json, sys
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader
    from snapstore.torch import SnapshotIterableDataset

    cfg = json.loads(sys.argv[1])
    rank, world = cfg["rank"], cfg["world_size"]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{cfg['port']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=cfg["timeout"]),
    )

    def dataset():
        return SnapshotIterableDataset(
            cfg["fingerprint"], cfg["root"], batch_size=cfg["batch"], seed=cfg["seed"]
        )

    def ids(batches):
        out = []
        for b in batches:
            assert torch.equal(b["x"][:, 0, 0].long(), b["id"]), b
            out.append(b["id"].tolist())
        return out

    ds = dataset()
    record = {"place": [ds.rank, ds.world_size, dist.get_rank(), dist.get_world_size()]}
    SnapshotIterableDataset(  # explicit arguments that agree with the group are accepted
        cfg["fingerprint"], cfg["root"], batch_size=cfg["batch"], rank=rank, world_size=world
    )
    try:
        SnapshotIterableDataset(
            cfg["fingerprint"], cfg["root"], batch_size=cfg["batch"],
            rank=(rank + 1) % world, world_size=world,
        )
        record["disagreeing_rank_rejected"] = False
    except ValueError:
        record["disagreeing_rank_rejected"] = True

    record["loaders"] = []
    for spec in cfg.get("loaders", []):
        options = {"num_workers": spec["num_workers"]}
        if spec.get("spawn"):
            options["multiprocessing_context"] = "spawn"
        if spec.get("persistent"):
            options["persistent_workers"] = True
        ds = dataset()
        loader = DataLoader(ds, batch_size=None, **options)
        epochs = []
        for epoch in range(cfg["epochs"]):
            ds.set_epoch(epoch)
            epochs.append(ids(loader))
        record["loaders"].append(epochs)
        del loader

    resume = cfg.get("resume")
    if resume is not None and resume["mode"] == "save":
        def stateful_loader():
            ds = dataset()
            ds.set_epoch(resume["epoch"])
            return StatefulDataLoader(ds, batch_size=None, num_workers=resume["num_workers"])

        record["full"] = ids(stateful_loader())
        interrupted = stateful_loader()
        it = iter(interrupted)
        record["taken"] = ids(next(it) for _ in range(resume["k"]))
        torch.save(interrupted.state_dict(), f"{cfg['out']}/state{rank}.pt")
        del it, interrupted
    elif resume is not None:
        loader = StatefulDataLoader(
            dataset(), batch_size=None, num_workers=resume["num_workers"]
        )
        state = torch.load(f"{resume['state_dir']}/state{rank}.pt", weights_only=False)
        loader.load_state_dict(state)
        record["rest"] = ids(loader)

    gathered = [None] * world
    dist.all_gather_object(gathered, record)
    with open(f"{cfg['out']}/rank{rank}.json", "w") as f:
        json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def samples(n: int) -> Any:
    for i in range(n):
        yield {"id": i, "x": np.full((2, 3), i, np.float32), "name": f"s{i}"}


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    root = tmp_path_factory.mktemp("torch_dist") / "root"
    # Blocks of 4 samples, so that 50 samples make 13 blocks and shuffling mixes them.
    options = snapstore.WriteOptions(block_bytes=64, block_min_rows=4)
    return snapstore.snapshot(samples, root=root, options=options)(N).materialize()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_group(
    snap: snapstore.Snapshot, out: Path, world_size: int, **cfg: Any
) -> list[dict[str, Any]]:
    """Start ``world_size`` rank processes, wait for them, return what each rank read."""
    out.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    base = {
        "fingerprint": snap.fingerprint,
        "root": str(snap.store.url),
        "port": free_port(),
        "world_size": world_size,
        "batch": BATCH,
        "seed": SEED,
        "epochs": EPOCHS,
        "timeout": GROUP_TIMEOUT_S // 2,
        "out": str(out),
        **cfg,
    }
    procs, logs = [], []
    for rank in range(world_size):
        log = open(out / f"rank{rank}.log", "w+")  # noqa: SIM115 - closed below
        logs.append(log)
        argv = [sys.executable, "-c", RANK, json.dumps({**base, "rank": rank})]
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env))
    # Wait for every rank, but stop the group as soon as one fails (the others would wait in a
    # collective until the gloo timeout) or the deadline passes (a hang).
    deadline = time.monotonic() + GROUP_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.05)
    finally:
        killed = [p.poll() is None for p in procs]
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        text = []
        for rank, log in enumerate(logs):
            log.seek(0)
            text.append(f"--- rank {rank} (exit {procs[rank].returncode}) ---\n{log.read()}")
            log.close()
    if any(killed) or any(p.returncode != 0 for p in procs):
        why = "timed out" if time.monotonic() >= deadline else "failed"
        pytest.fail(f"rank processes {why} (killed: {killed}):\n" + "\n".join(text), pytrace=False)
    results = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world_size)]
    assert all(r == results[0] for r in results)  # every rank gathered the same
    gathered: list[dict[str, Any]] = results[0]
    for rank, record in enumerate(gathered):
        assert record["place"] == [rank, world_size, rank, world_size]
        assert record["disagreeing_rank_rejected"]
    return gathered


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


def global_order(per_rank: list[list[list[int]]], num_workers: int) -> list[int]:
    """The epoch's order G, checked against the plan's partition rule.

    ``per_rank[r]`` is rank r's batches as its DataLoader yields them (round-robin over its
    workers). Consumer ``c = r * nw + w`` must read ``G[(c * per + i) mod N]`` for ``i < per``.
    """
    nw = max(num_workers, 1)
    consumers = len(per_rank) * nw
    per = -(-N // consumers)
    by_consumer = []
    for batches in per_rank:
        assert len(batches) % nw == 0  # every worker yields the same number of batches
        assert sum(len(b) for b in batches) == nw * per  # equal counts per rank
        for worker in range(nw):
            mine = batches[worker::nw]
            assert all(len(b) == BATCH for b in mine[:-1])  # only a worker's last batch is short
            by_consumer.append(flat(mine))
    assert [len(c) for c in by_consumer] == [per] * consumers
    extended = [i for c in by_consumer for i in c]
    order = extended[:N]
    assert sorted(order) == list(range(N))  # every sample exactly once...
    assert extended[N:] == order[: consumers * per - N]  # ...plus the padding from G's start
    counts = collections.Counter(extended)
    assert sum(n - 1 for n in counts.values()) == consumers * per - N
    return order


def explicit(
    snap: snapstore.Snapshot, rank: int, world_size: int, num_workers: int, epoch: int
) -> list[list[int]]:
    ds = SnapshotIterableDataset(
        snap, batch_size=BATCH, seed=SEED, rank=rank, world_size=world_size
    )
    ds.set_epoch(epoch)
    return [b["id"].tolist() for b in DataLoader(ds, batch_size=None, num_workers=num_workers)]


def consumers_order(snap: snapstore.Snapshot, consumers: int, epoch: int) -> list[int]:
    """G for ``consumers`` single-worker ranks, read in this process."""
    per_rank = [explicit(snap, rank, consumers, 0, epoch) for rank in range(consumers)]
    return global_order(per_rank, 0)


def check_loader(
    snap: snapstore.Snapshot, gathered: list[dict[str, Any]], index: int, num_workers: int
) -> list[list[int]]:
    """Check one loader's epochs across the ranks; return G of each epoch."""
    world_size = len(gathered)
    orders = []
    for epoch in range(EPOCHS):
        per_rank = [record["loaders"][index][epoch] for record in gathered]
        orders.append(global_order(per_rank, num_workers))
        for rank in range(world_size):
            assert per_rank[rank] == explicit(snap, rank, world_size, num_workers, epoch)
    assert orders[1] != orders[0]  # set_epoch reshuffles
    return orders


def test_world_size_4_no_workers(snap: snapstore.Snapshot, tmp_path: Path) -> None:
    gathered = run_group(snap, tmp_path / "group", 4, loaders=[{"num_workers": 0}])
    orders = check_loader(snap, gathered, 0, num_workers=0)
    # G depends on the seed, the epoch and the number of consumers C, not on how C is split:
    # 4 ranks in separate processes read what 2 ranks of 2 DataLoader workers read.
    for epoch, order in enumerate(orders):
        split = [explicit(snap, rank, 2, 2, epoch) for rank in range(2)]
        assert global_order(split, 2) == order


def test_world_size_2_workers_and_resume(snap: snapstore.Snapshot, tmp_path: Path) -> None:
    loaders = [
        # A spawned worker gets the dataset (and its rank) by pickle; a persistent one moves to
        # the next epoch by itself at every pass after its first.
        {"num_workers": 1, "spawn": True, "persistent": True},
        {"num_workers": 2},
    ]
    k = 2
    resume = {"mode": "save", "epoch": 1, "num_workers": 2, "k": k}
    saved = tmp_path / "saved"
    gathered = run_group(snap, saved, 2, loaders=loaders, resume=resume)
    one = check_loader(snap, gathered, 0, num_workers=1)
    two = check_loader(snap, gathered, 1, num_workers=2)
    # G depends on the number of consumers C (each consumer's first window is a ramp window),
    # not on its split: 2 ranks x 1 worker read what 1 rank x 2 workers read, and 2 ranks x 2
    # workers what 4 ranks x 1 worker read.
    assert one == [global_order([explicit(snap, 0, 1, 2, e)], 2) for e in range(EPOCHS)]
    assert two == [consumers_order(snap, 4, e) for e in range(EPOCHS)]

    # StatefulDataLoader: each rank saved its state after k batches of epoch 1; fresh rank
    # processes in a new group restore it and yield exactly the batches that were left.
    for record in gathered:
        assert record["full"] == record["loaders"][1][1]  # the same as DataLoader's epoch 1
        assert record["taken"] == record["full"][:k]
    restore = {"mode": "load", "num_workers": 2, "state_dir": str(saved)}
    resumed = run_group(snap, tmp_path / "resumed", 2, resume=restore)
    for rank, record in enumerate(resumed):
        assert record["rest"] == gathered[rank]["full"][k:]
        assert record["rest"]  # something was left to read
