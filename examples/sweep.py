"""Sweep: N training jobs started together share one expensive, partitioned preprocessing stage.

Run:  python examples/sweep.py [--jobs 4] [--samples 4000] [--root DIR]

The parent launches ``--jobs`` copies of this script at once, each with its own learning rate.
Every job calls the same ``features`` stage, partitioned over a list of input shards
(``partition_by="shards"``): each job claims the partitions nobody holds, computes and commits
them, waits for the ones the others are computing, and then all read the one snapshot. Each
call of the stage appends a line to ``stage-calls.log`` under the root, so the parent can show
that every partition was computed exactly once, by whichever job got to it first. Then each job
fits a small linear model on the features with plain numpy SGD and reports its loss.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

import snapstore

SHARDS = 12
# Features are standardized to norm ~4, so SGD is stable below lr ~ 1/16.
LEARNING_RATES = (0.03, 0.01, 0.003, 0.001, 0.05, 0.02, 0.0003, 0.0001)
SIGNAL = 2048
BINS = 16
LOG_NAME = "stage-calls.log"


def spectrum_features(seed: int) -> np.ndarray:
    """Stand-in for decoding and featurizing one recording: a pooled log power spectrum."""
    rng = np.random.default_rng(seed)
    t = np.arange(SIGNAL, dtype=np.float64)
    tones = rng.uniform(0.01, 0.45, 3)
    signal = sum(np.sin(2 * np.pi * f * t) for f in tones) + rng.normal(0, 1.0, SIGNAL)
    for _ in range(2):  # a few smoothing passes: cost like a real filter bank
        signal = np.convolve(signal, np.hanning(31), mode="same")
    power = np.log1p(np.abs(np.fft.rfft(signal)) ** 2)
    pooled = power[: (len(power) // BINS) * BINS].reshape(BINS, -1).mean(axis=1)
    return (pooled - pooled.mean()) / (pooled.std() + 1e-9)


def target(features: np.ndarray) -> float:
    """The quantity the jobs learn to predict: a fixed linear function of the features."""
    weights = np.linspace(-1.0, 1.0, BINS)
    return float(features @ weights + 0.5)


@snapstore.snapshot(partition_by="shards", lease=20.0, ignore=("log",))
def features(shards: list[tuple[int, int]], log: str = ""):
    """The expensive stage: one sample per seed in each ``(start, stop)`` shard.

    ``log`` (left out of the fingerprint) names a file that gets one line per call.
    """
    started = time.perf_counter()
    for start, stop in shards:
        for seed in range(start, stop):
            x = spectrum_features(seed)
            yield {"x": x.astype(np.float32), "y": np.float32(target(x))}
    if log:
        # The job that asked for this partition (the stage itself may run in one of the job's
        # worker processes: partitions run on all cores by default).
        job = os.environ.get("SWEEP_JOB_PID", str(os.getpid()))
        line = f"{shards[0][0]} {job} {time.perf_counter() - started:.3f}\n"
        with open(log, "a") as f:  # one short append per call: atomic on local filesystems
            f.write(line)


def shard_list(samples: int) -> list[tuple[int, int]]:
    bounds = np.linspace(0, samples, SHARDS + 1).astype(int).tolist()
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def train(snap: snapstore.Snapshot, lr: float, seed: int, epochs: int = 4) -> float:
    """Minibatch SGD on squared error; returns the mean loss of the last epoch."""
    w, b = np.zeros(BINS), 0.0
    loss = float("nan")
    for epoch in range(epochs):
        total, count = 0.0, 0
        for batch in snap.batches(64, shuffle=True, seed=seed, epoch=epoch):
            x, y = batch["x"].astype(np.float64), batch["y"].astype(np.float64)
            err = x @ w + b - y
            total, count = total + float(err @ err), count + len(y)
            w -= lr * 2 * x.T @ err / len(y)
            b -= lr * 2 * float(err.mean())
        loss = total / count
    return loss


def run_job(job: int, samples: int, log: str) -> None:
    """One job of the sweep: materialize the shared stage, then train with its learning rate."""
    lr = LEARNING_RATES[job % len(LEARNING_RATES)]
    pid = str(os.getpid())
    os.environ["SWEEP_JOB_PID"] = pid  # inherited by the worker processes this job starts
    t0 = time.perf_counter()
    snap = features(shard_list(samples), log=log)
    snap.materialize()
    ready = time.perf_counter() - t0
    lines = Path(log).read_text().splitlines() if os.path.exists(log) else []
    mine = [line.split() for line in lines if line.split()[1] == pid]
    computing = sum(float(seconds) for _, _, seconds in mine)
    t0 = time.perf_counter()
    loss = train(snap, lr, seed=job)
    training = time.perf_counter() - t0
    result = {
        "job": job, "lr": lr, "computed": len(mine), "waiting": max(ready - computing, 0.0),
        "computing": computing, "training": training, "loss": loss,
        "fingerprint": snap.fingerprint, "samples": len(snap),
    }  # fmt: skip
    snap.close()
    print(json.dumps(result))


def run_sweep(jobs: int, samples: int, root: str) -> int:
    """Launch the jobs together, wait for them, and print what each did."""
    log = os.path.join(root, LOG_NAME)
    Path(root).mkdir(parents=True, exist_ok=True)
    Path(log).unlink(missing_ok=True)
    env = dict(os.environ, SNAPSTORE_ROOT=root)  # read by each job when it calls the stage
    cmd = [sys.executable, __file__, "--samples", str(samples), "--log", log]
    print(f"{jobs} jobs, {len(shard_list(samples))} partitions of {samples} samples, root {root}")
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen([*cmd, "--job", str(j)], env=env, stdout=subprocess.PIPE, text=True)
        for j in range(jobs)
    ]
    outputs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0
    failed = [j for j, p in enumerate(procs) if p.returncode != 0]
    if failed:
        print(f"jobs {failed} failed (see their errors above)", file=sys.stderr)
        return 1
    results = [json.loads(out.strip().splitlines()[-1]) for out in outputs]

    print(f"\n{'job':>3} {'lr':>8} {'computed':>9} {'waiting':>8} {'computing':>10} "
          f"{'training':>9} {'loss':>10}")  # fmt: skip
    for r in results:
        print(
            f"{r['job']:>3} {r['lr']:>8g} {r['computed']:>9} {r['waiting']:>7.2f}s "
            f"{r['computing']:>9.2f}s {r['training']:>8.2f}s {r['loss']:>10.4g}"
        )
    best = min(results, key=lambda r: r["loss"])
    print(f"\nbest: job {best['job']}, lr {best['lr']:g}, loss {best['loss']:.4g}; "
          f"sweep wall time {wall:.2f} s")  # fmt: skip
    report_sharing(results, log, len(shard_list(samples)))
    return 0


def report_sharing(results: list[dict], log: str, partitions: int) -> None:
    """The proof: each partition was computed once, and every job read the same snapshot."""
    lines = Path(log).read_text().splitlines() if os.path.exists(log) else []
    calls = Counter(line.split()[0] for line in lines)
    if not calls:
        print("stage calls: 0 (the snapshot was already committed under this root)")
    elif len(calls) == partitions and set(calls.values()) == {1}:
        total = sum(float(line.split()[2]) for line in lines)
        print(f"stage ran once per partition: {len(lines)} calls for {partitions} partitions "
              f"({total:.2f} s of compute in all, shared by {len(results)} jobs)")  # fmt: skip
    else:
        print(f"UNEXPECTED: {len(lines)} stage calls for {partitions} partitions: {dict(calls)}")
    fingerprints = {r["fingerprint"] for r in results}
    sizes = {r["samples"] for r in results}
    if len(fingerprints) == 1:
        print(f"all {len(results)} jobs read fingerprint {fingerprints.pop()} "
              f"({sizes.pop()} samples)")  # fmt: skip
    else:
        print(f"UNEXPECTED: jobs read different fingerprints: {sorted(fingerprints)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4, help="jobs launched at once")
    parser.add_argument("--samples", type=int, default=4000, help="samples in the stage")
    parser.add_argument("--root", default=None, help="snapshot root (default: a temp dir)")
    parser.add_argument("--job", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--log", default="", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.job is not None:
        run_job(options.job, options.samples, options.log)
        return 0
    if options.root:
        return run_sweep(options.jobs, options.samples, options.root)
    with tempfile.TemporaryDirectory(prefix="snapstore-sweep-") as root:
        return run_sweep(options.jobs, options.samples, root)


if __name__ == "__main__":
    sys.exit(main())
