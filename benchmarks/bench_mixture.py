"""Mixtures: snapstore.mix() against one snapshot alone, shares per consumer, remote latency.

Targets (issue 26), one run:

- two tok sources (200,000 and 50,000 samples, bench_format's shape) at 0.5/0.5, shuffled
  batches of 256: at least 0.9x the samples/s of reading the 200,000 one alone, peak anonymous
  RSS at most 1.2x its; the same with two img sources (50,000 and 12,500). Peak RSS is also
  measured with ``MALLOC_ARENA_MAX=2`` for both (see ``ARENAS``).
- eight sources, weights 0.01 to 0.5, 2 ranks x 2 workers: every consumer's share of every
  source within 2 points of its weight in every window of 1,000 samples it reads.
- two tok sources on ``simulated_store(ttfb=0.05)``: steady samples/s (after the first batch)
  at least 0.9x the same mixture at ttfb 0, with a 5 ms training step per batch and flat out.

Each read runs in a fresh interpreter (peak RSS is the process's) and reads ``--epochs``
epochs (default 3) with one reader, as training does: one epoch of tok takes about 0.3 s, so
its figure is mostly startup, which the mixture pays once per source; the first epoch's
figures are printed beside. Usage: ``python benchmarks/bench_mixture.py [--scale 1.0]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_format import BATCH, WORKLOADS, PeakAnon, _warm, mb, print_rows, run_script_child

STEP = 0.005


def child_write(workload: str, n: int, root: str, tag: int = 0) -> dict[str, Any]:
    import snapstore

    def stage(n: int, tag: int) -> Any:
        yield from WORKLOADS[workload](n)

    snap = snapstore.snapshot(stage, root=root)(n, tag).materialize()
    return {"fingerprint": snap.fingerprint}


def child_read(
    roots: list[str],
    fingerprints: list[str],
    weights: list[float] | None,
    ttfb: float = -1.0,
    epochs: int = 1,
    step: float = 0.0,
) -> dict[str, Any]:
    """Shuffled epochs of one snapshot (``weights`` None) or of the mixture of them, read as a
    training loop does: one reader, ``set_epoch`` between epochs."""
    import snapstore
    from snapstore.storage.simulate import simulated_store

    for root in roots:
        _warm(root)
    stores = [simulated_store(r, ttfb=ttfb) if ttfb >= 0 else r for r in roots]
    snaps = [snapstore.open(f, root=s) for f, s in zip(fingerprints, stores)]
    mem = PeakAnon()
    source: Any = snaps[0] if weights is None else snapstore.mix(snaps, weights)
    reader = source.batches(BATCH, shuffle=True)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    first, samples, one = None, 0, 0.0
    for epoch in range(epochs):
        reader.set_epoch(epoch)
        for batch in reader:
            first = first if first is not None else time.perf_counter() - t0
            samples += len(next(iter(batch.values())))
            if step:
                time.sleep(step)
        one = one or samples / (time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return {
        "cpu_us_per_sample": 1e6 * cpu / samples,
        "seconds": seconds,
        "samples": samples,
        "first": first,
        "sps": samples / seconds,
        "first_epoch_sps": one,
        "steady": (samples - BATCH) / (seconds - (first or 0)),
        "peak": mem.stop(),
    }


def child_shares(counts: list[int], weights: list[float]) -> dict[str, Any]:
    """The worst deviation of any consumer's per-source share over 1,000-sample windows, read
    through real snapshots of ``counts`` samples (a tiny field) with a ``source_field``."""
    import snapstore

    root = tempfile.mkdtemp(prefix="snapstore-bench-mix-")

    def tiny(n: int, k: int) -> Any:
        for i in range(n):
            yield {"id": k * 10**7 + i}

    snaps = [snapstore.snapshot(tiny, root=root)(n, k).materialize() for k, n in enumerate(counts)]
    mixture = snapstore.mix(snaps, weights, source_field="src")
    worst, sizes = 0.0, []
    for rank in range(2):
        for worker in range(2):
            reader = mixture.batches(
                BATCH, shuffle=True, rank=rank, world_size=2, worker=worker, num_workers=2
            )
            src = np.concatenate([b["src"] for b in reader])
            sizes.append(len(src))
            onehot = np.eye(len(weights))[src]
            run = np.cumsum(np.vstack([np.zeros(len(weights)), onehot]), axis=0)
            share = (run[1000:] - run[:-1000]) / 1000
            target = np.asarray(mixture.weights)
            worst = max(worst, float(np.abs(share - target).max()))
    return {"worst_points": 100 * worst, "per_consumer": sizes}


CHILDREN = {"write": child_write, "read": child_read, "shares": child_shares}


def run_child(name: str, child_env: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
    return run_script_child(__file__, name, child_env, **kwargs)


# glibc's malloc gives each thread that allocates under contention an arena of its own (up to
# 8 per core), and freed decoded blocks stay in them: most of the peak's excess over the
# decoded bytes held. Two arenas, for both readers alike, show the readers' own difference.
ARENAS = {"MALLOC_ARENA_MAX": "2"}


def pair(
    workload: str, sizes: tuple[int, int], tmp: Path, repeat: int, epochs: int
) -> dict[str, Any]:
    roots, fps = [], []
    for k, n in enumerate(sizes):
        root = tmp / f"{workload}-{k}"
        root.mkdir()
        roots.append(str(root))
        fps.append(run_child("write", workload=workload, n=n, root=str(root), tag=k)["fingerprint"])
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ("alone", "mixed", "alone2", "mixed2")}
    for _ in range(repeat):
        for env, suffix in ((None, ""), (ARENAS, "2")):
            runs["alone" + suffix].append(
                run_child(
                    "read", env, roots=roots[:1], fingerprints=fps[:1], weights=None, epochs=epochs
                )
            )
            runs["mixed" + suffix].append(
                run_child(
                    "read", env, roots=roots, fingerprints=fps, weights=[0.5, 0.5], epochs=epochs
                )
            )
    return {"roots": roots, "fps": fps, **runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the workload sizes")
    parser.add_argument("--repeat", type=int, default=2, help="reads of each, fastest kept")
    parser.add_argument(
        "--epochs", type=int, default=3, help="epochs per read (one reader, as in training)"
    )
    parser.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="?", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(CHILDREN[options.child](**json.loads(options.args))))
        return
    scale = options.scale
    rows = [("target", "measured", "goal", "")]

    def check(label: str, value: float, goal: float, fmt: str, low: bool = False) -> None:
        ok = value <= goal if low else value >= goal
        sign = "<=" if low else ">="
        rows.append((label, format(value, fmt), f"{sign} {goal:g}", "PASS" if ok else "MISS"))

    with tempfile.TemporaryDirectory(dir=options.tmp, prefix="snapstore-bench-mix-") as tmp:
        base = Path(tmp)
        for workload, sizes in (("tok", (200_000, 50_000)), ("img", (50_000, 12_500))):
            scaled = (max(BATCH, int(sizes[0] * scale)), max(BATCH, int(sizes[1] * scale)))
            got = pair(workload, scaled, base, options.repeat, options.epochs)
            alone = max(r["sps"] for r in got["alone"])
            mixed = max(r["sps"] for r in got["mixed"])
            first = [max(r["first_epoch_sps"] for r in got[k]) for k in ("alone", "mixed")]
            cpu = [min(r["cpu_us_per_sample"] for r in got[k]) for k in ("alone", "mixed")]
            peak_alone = min(r["peak"] for r in got["alone"])
            peak_mixed = min(r["peak"] for r in got["mixed"])
            print(
                f"{workload}: {options.epochs} epochs alone {alone:,.0f} samples/s, peak "
                f"{mb(peak_alone)} MB; mixed {mixed:,.0f} samples/s, peak {mb(peak_mixed)} MB; "
                f"first epoch only (startup included): alone {first[0]:,.0f}, mixed "
                f"{first[1]:,.0f} ({first[1] / first[0]:.2f}x); CPU per sample: alone "
                f"{cpu[0]:.2f} us, mixed {cpu[1]:.2f} us ({cpu[1] / cpu[0]:.2f}x: the load-proof "
                "figure on a busy machine)"
            )
            check(f"{workload} 0.5/0.5 samples/s vs alone", mixed / alone, 0.9, ".2f")
            check(
                f"{workload} 0.5/0.5 peak RSS vs alone", peak_mixed / peak_alone, 1.2, ".2f", True
            )
            peaks2 = [min(r["peak"] for r in got[k]) for k in ("alone2", "mixed2")]
            print(
                f"{workload} with MALLOC_ARENA_MAX=2: peak alone {mb(peaks2[0])} MB, mixed "
                f"{mb(peaks2[1])} MB"
            )
            check(
                f"{workload} peak RSS vs alone, MALLOC_ARENA_MAX=2",
                peaks2[1] / peaks2[0],
                1.2,
                ".2f",
                True,
            )
            if workload == "tok":
                # Steady state past the first batch, with a 5 ms training step per batch (the
                # reader must keep up with the step) and with none (flat out: the store's
                # latency must be hidden at full speed), 50 ms against 0 ms, paired.
                for step in (STEP, 0.0):
                    slow = {
                        t: max(
                            run_child(
                                "read",
                                None,
                                roots=got["roots"],
                                fingerprints=got["fps"],
                                weights=[0.5, 0.5],
                                ttfb=t,
                                epochs=options.epochs,
                                step=step,
                            )["steady"]
                            for _ in range(options.repeat)
                        )
                        for t in (0.05, 0.0)
                    }
                    label = f"{step * 1e3:.0f} ms step"
                    print(
                        f"tok mixture steady samples/s, {label} per batch: 50 ms "
                        f"{slow[0.05]:,.0f}, 0 ms {slow[0.0]:,.0f}"
                    )
                    check(f"tok mixture 50 ms vs 0 ms, {label}", slow[0.05] / slow[0.0], 0.9, ".2f")
        # Weights that do not repeat every 1,000 samples (three-decimal weights would, making
        # every 1,000-sample window exact by construction).
        raw = [0.5, 0.2137, 0.1171, 0.0713, 0.0431, 0.0297, 0.0193, 0.0101]
        weights = [w / sum(raw) for w in raw]
        counts = [max(1000, int(200_000 * w * scale)) for w in weights]
        shares = run_child("shares", counts=counts, weights=weights)
        print(f"8 sources, 2 ranks x 2 workers: samples per consumer {shares['per_consumer']}")
        check("8 sources worst share deviation (points)", shares["worst_points"], 2, ".2f", True)
    print()
    print_rows(rows)


if __name__ == "__main__":
    main()
