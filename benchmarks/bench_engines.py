"""Materializing partitioned stages on the engines: a Python-bound stage on 1 and 2 workers, and
two numeric stages (numpy, torch) against a plain loop doing the same work without snapstore.

The Python-bound stage stands in for tokenization or feature extraction written in Python: per
sample a few thousand interpreter-bound steps (a rolling hash over synthetic text, bucketed into a
histogram) and a 1 KiB array written out. The target is 2 process workers >= 1.7x one on this
2-core machine.

The numeric stages do a little linear algebra per sample, where the size of the workers' BLAS and
OpenMP thread pools decides the speed: numpy, ``x = x @ w`` 20 times per sample (x 64x256,
w 256x256, float32), 2,000 samples; torch, ``x = torch.tanh(x @ w)`` 20 times per sample (same
shapes), 500 samples; both ``partition_by="ids", partition_size=50``. The target is the default
engine in at most 0.75x the plain loop's time on this 2-core machine.

Each configuration writes its snapshot into a fresh root; times include starting the workers
(spawned processes import numpy and snapstore, and torch for the torch stage) and the commit.

    python benchmarks/bench_engines.py                    # every case, best of 2
    python benchmarks/bench_engines.py --cases numpy,torch --repeat 3
    python benchmarks/bench_engines.py --partitions 8 --samples 100 --repeat 1
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

import snapstore
from snapstore.write.engines import (
    THREAD_VARIABLES,
    Engine,
    ProcessEngine,
    ThreadEngine,
    usable_cores,
)

WORDS = [f"w{i:03d}" for i in range(1000)]


class Run(NamedTuple):
    """One timed run: seconds, and what it wrote (no fingerprint: nothing written)."""

    seconds: float
    fingerprint: str
    samples: int


ROWS, FEATURES, REPEATS = 64, 256, 20  # the numeric stages' shapes: x ROWS x FEATURES, w square


def featurize(shards: list[int], samples: int = 400) -> Iterator[dict[str, Any]]:
    """The expensive stage: Python-level work per sample, like a tokenizer."""
    for shard in shards:
        for i in range(samples):
            text = " ".join(WORDS[(shard * 7919 + i * 31 + k * 17) % 1000] for k in range(300))
            histogram = [0] * 256
            h = 0
            for ch in text:
                h = (h * 31 + ord(ch)) & 0xFFFFFFFF
                histogram[h & 0xFF] += 1
            yield {"shard": shard, "i": i, "hist": np.asarray(histogram, np.int32)}


@functools.cache
def weights() -> np.ndarray:
    """w, scaled so that 20 products keep x's entries near 1 (no overflow, no denormals)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((FEATURES, FEATURES), dtype=np.float32)
    return (w / np.sqrt(FEATURES)).astype(np.float32)


def inputs(sample: int) -> np.ndarray:
    return np.random.default_rng(sample).standard_normal((ROWS, FEATURES), dtype=np.float32)


def numpy_products(ids: list[int]) -> Iterator[dict[str, Any]]:
    """A numeric stage: ``x @ w`` 20 times per sample, on numpy's BLAS."""
    w = weights()
    for sample in ids:
        x = inputs(sample)
        for _ in range(REPEATS):
            x = x @ w
        yield {"id": sample, "y": x.mean(axis=0)}


def torch_products(ids: list[int]) -> Iterator[dict[str, Any]]:
    """The same with torch: ``torch.tanh(x @ w)`` 20 times per sample."""
    import torch

    w = torch.from_numpy(weights())
    for sample in ids:
        x = torch.from_numpy(inputs(sample))
        for _ in range(REPEATS):
            x = torch.tanh(x @ w)
        yield {"id": sample, "y": x.mean(dim=0).numpy()}


def run(
    stage: Callable[..., Any], engine: Engine | None, settings: dict[str, Any], *args: Any
) -> Run:
    """Materialize ``stage(*args)`` into a fresh root; ``engine=None`` is the default engine."""
    with tempfile.TemporaryDirectory() as root:
        wrapped = snapstore.snapshot(stage, root=root, engine=engine, **settings)
        began = time.perf_counter()
        snap = wrapped(*args).materialize()
        result = Run(time.perf_counter() - began, snap.fingerprint, len(snap))
        snap.close()
    return result


def best(configs: dict[str, Callable[[], Run]], repeat: int) -> dict[str, Run]:
    """The fastest of ``repeat`` runs of each configuration, interleaved: the machine is shared
    and the first run of anything pays for cold caches. Every engine must write one snapshot."""
    results: dict[str, Run] = {}
    for _ in range(repeat):
        for name, timed in configs.items():
            got = timed()
            results[name] = min(results.get(name, got), got)
    written = {r.fingerprint for r in results.values() if r.fingerprint}
    if len(written) != 1 or len({r.samples for r in results.values()}) != 1:
        raise SystemExit(f"the engines wrote different snapshots: {results}")
    return results


def plain_loop(stage: Callable[..., Iterator[Any]], ids: list[int]) -> Run:
    """The same samples computed in this process and dropped: no snapstore at all."""
    began = time.perf_counter()
    samples = sum(1 for _ in stage(ids))
    return Run(time.perf_counter() - began, "", samples)


@contextlib.contextmanager
def unsized_pools() -> Iterator[None]:
    """Every pool variable set to the core count, as if set by the user: the workers' pools
    as they were before the process engine sized them."""
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    os.environ.update({name: str(usable_cores()) for name in THREAD_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def python_case(args: argparse.Namespace) -> None:
    configs: dict[str, Engine] = {
        "process, 1 worker": ProcessEngine(1),
        "process, 2 workers": ProcessEngine(2),
        "thread, 1 worker": ThreadEngine(1),
        "thread, 2 workers": ThreadEngine(2),
    }
    settings = {"partition_by": "shards"}
    shards = list(range(args.partitions))
    results = best(
        {
            name: functools.partial(run, featurize, engine, settings, shards, args.samples)
            for name, engine in configs.items()
        },
        args.repeat,
    )
    total = args.partitions * args.samples
    print(f"# Python-bound stage, {args.partitions} partitions x {args.samples} samples, "
          f"best of {args.repeat}, {usable_cores()} cores\n")  # fmt: skip
    print(f"{'engine':22} {'seconds':>8} {'samples/s':>10}")
    for name, (seconds, _, _) in results.items():
        print(f"{name:22} {seconds:>8.2f} {total / seconds:>10,.0f}")
    one, two = results["process, 1 worker"].seconds, results["process, 2 workers"].seconds
    threads = results["thread, 1 worker"].seconds / results["thread, 2 workers"].seconds
    print(f"\nprocess: 2 workers / 1 worker speed-up  {one / two:5.2f}x   (target >= 1.7x)")
    print(f"thread:  2 workers / 1 worker speed-up  {threads:5.2f}x   (the GIL: Python-bound work)")
    spawn = results["thread, 1 worker"].seconds / one
    print(f"process 1 worker / thread 1 worker      {spawn:5.2f}x"
          "   (cost of spawning and sending tasks)\n")  # fmt: skip


def numeric_case(
    label: str, stage: Callable[..., Iterator[Any]], samples: int, args: argparse.Namespace
) -> None:
    cores = usable_cores()
    ids = list(range(samples))
    settings = {"partition_by": "ids", "partition_size": args.partition_size}
    default = f"default engine ({cores} processes)"
    configs: dict[str, Callable[[], Run]] = {
        "plain loop, no snapstore": functools.partial(plain_loop, stage, ids),
        default: functools.partial(run, stage, None, settings, ids),
        f"thread, {cores} workers": functools.partial(
            run, stage, ThreadEngine(cores), settings, ids
        ),
    }
    if args.unsized:

        def unsized() -> Run:
            with unsized_pools():
                return run(stage, None, settings, ids)

        configs["default engine, pools not sized"] = unsized
    results = best(configs, args.repeat)
    plain = results["plain loop, no snapstore"].seconds
    print(f"# {label}, {samples} samples in partitions of {args.partition_size}, "
          f"best of {args.repeat}, {cores} cores\n")  # fmt: skip
    print(f"{'how it runs':34} {'seconds':>8} {'/ plain':>8}")
    for name, (seconds, _, _) in results.items():
        print(f"{name:34} {seconds:>8.2f} {seconds / plain:>7.2f}x")
    ratio = results[default].seconds / plain
    print(f"\n{label}: default engine / plain loop  {ratio:5.2f}x   (target <= 0.75x)\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="python,numpy,torch", help="which cases to run")
    parser.add_argument("--partitions", type=int, default=16, help="Python-bound stage")
    parser.add_argument("--samples", type=int, default=1200, help="per partition, Python-bound")
    parser.add_argument("--numpy-samples", type=int, default=2000)
    parser.add_argument("--torch-samples", type=int, default=500)
    parser.add_argument("--partition-size", type=int, default=50, help="numeric stages' ids")
    parser.add_argument("--repeat", type=int, default=2, help="runs per engine; the best counts")
    parser.add_argument(
        "--unsized",
        action="store_true",
        help="also run the numeric stages with the pool variables set to the core count (slow)",
    )
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    if unknown := cases - {"python", "numpy", "torch"}:
        parser.error(f"--cases: unknown {sorted(unknown)}; expected python, numpy, torch")
    if "python" in cases:
        python_case(args)
    if "numpy" in cases:
        numeric_case("numpy stage", numpy_products, args.numpy_samples, args)
    if "torch" in cases:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("# torch stage: skipped, torch is not installed (pip install 'snapstore[torch]')")
        else:
            numeric_case("torch stage", torch_products, args.torch_samples, args)


if __name__ == "__main__":
    sys.exit(main())
