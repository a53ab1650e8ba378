"""Read one shuffled epoch through a simulated bucket: latency hiding, stalls and memory.

    python benchmarks/bench_reader.py           # 1x sizes, 50 ms, RSS at 1x and 4x (~2.5 min)
    python benchmarks/bench_reader.py --scale 0.01 --rss-scale 0 --ttfb 0.01 --repeat 1  # smoke
    python benchmarks/bench_reader.py --ttfb 0.1 --repeat 5

The workloads are bench_format's (img: 50,000 uint8[64,64,3] images; tok: 200,000 token
arrays), each written once per size with the public API (``snapstore.snapshot(fn, root=dir)(n)
.materialize()``) and read back with ``snapstore.open(fingerprint, root=store)`` and
``snap.batches(256, shuffle=True)``, where ``store`` is ``simulated_store(dir, ttfb=...)``: every
range request sleeps ``ttfb`` (unlimited bandwidth), as a bucket's would. Measured in one run:

  latency hiding   an epoch at --ttfb against the same reader and code path at ttfb=0 (the
                   ratio is the target: >= 90%), and against one request at a time
                   (``max_requests=1``: what readers that download shards serially get)
  stall            a consumer that sleeps 5 ms per batch (a training step) at --ttfb: the
                   seconds it waited for data after the first chunk, over the pass (< 2%)
  memory           peak anonymous RSS of the --ttfb read at 1x and --rss-scale x the data,
                   against the prefetch budget (``prefetch_bytes``, printed): the growth
                   while reading should be the budget plus a constant ("budget + c": threads,
                   the window being consumed), the same at both sizes

The epochs at ttfb=0 and at --ttfb are interleaved --repeat times and the fastest of each kept;
the other reads run once. Every read runs in a fresh child process that first reads the
snapshot's files once (a warm page cache, so only the simulated latency differs between the
rows) and samples its anonymous RSS every 5 ms (bench_format.PeakAnon). This machine is shared
and noisy: compare the ratios, which are measured side by side, not the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_format import (
    BATCH,
    SIZES,
    WORKLOADS,
    PeakAnon,
    _warm,
    mb,
    print_rows,
    run_script_child,
)

HERE = Path(__file__).resolve().parent
STEP = 0.005  # the training-step stand-in: seconds the consumer sleeps per batch


# -- child measurements ----------------------------------------------------------------------


def child_write(workload: str, n: int, root: str) -> dict[str, Any]:
    """Materialize ``workload(n)`` under ``root`` with the public API; its fingerprint."""
    import snapstore

    t = time.perf_counter()
    snap = snapstore.snapshot(WORKLOADS[workload], root=root)(n).materialize()
    seconds = time.perf_counter() - t
    disk = sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())
    return {"fingerprint": snap.fingerprint, "seconds": seconds, "disk_bytes": disk}


def child_read(
    n: int,
    root: str,
    fingerprint: str,
    ttfb: float,
    max_requests: int | None = None,
    step: float = 0.0,
) -> dict[str, Any]:
    """One shuffled epoch through ``simulated_store(root, ttfb=ttfb)``; ``step`` seconds of
    sleep per batch stand in for a training step."""
    import snapstore
    from snapstore.storage.simulate import simulated_store

    _warm(root)
    store = simulated_store(root, ttfb=ttfb)
    snap = snapstore.open(fingerprint, root=store)
    mem = PeakAnon()
    reader = snap.batches(BATCH, shuffle=True, max_requests=max_requests)  # loads the index
    base = PeakAnon.now()
    t0 = time.perf_counter()
    first = None
    samples = 0
    for batch in reader:
        first = first if first is not None else time.perf_counter() - t0
        samples += len(next(iter(batch.values())))
        if step:
            time.sleep(step)
    seconds = time.perf_counter() - t0
    peak = mem.stop()
    if samples != n:
        raise RuntimeError(f"read {samples} samples of {n}: the epoch is incomplete")
    return {
        "seconds": seconds,
        "samples": samples,
        "first_batch": first,
        "stats": reader.stats().as_dict(),
        "budget": reader.prefetch_bytes,
        "window_blocks": reader.options.window_blocks,
        "blocks": reader.reader.num_blocks,
        "base_anon": base,
        "peak_anon": peak,
    }


CHILDREN = {"write": child_write, "read": child_read}


def run_child(name: str, **kwargs: Any) -> dict[str, Any]:
    return run_script_child(__file__, name, **kwargs)


# -- orchestration ---------------------------------------------------------------------------


def write(workload: str, n: int, tmp: Path) -> dict[str, Any]:
    root = tmp / f"{workload}-{n}"
    root.mkdir()
    return {"root": str(root), "n": n, **run_child("write", workload=workload, n=n, root=str(root))}


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return min(runs, key=lambda r: r["seconds"])


def measure(workload: str, n: int, tmp: Path, ttfb: float, repeat: int) -> dict[str, Any]:
    """Every read of one workload at one size; the simulated and the zero-latency epochs are
    interleaved ``repeat`` times and the fastest of each kept."""
    snap = write(workload, n, tmp)
    common = {"n": n, "root": snap["root"], "fingerprint": snap["fingerprint"]}
    zero, slow = [], []
    for _ in range(repeat):
        zero.append(run_child("read", ttfb=0.0, **common))
        slow.append(run_child("read", ttfb=ttfb, **common))
    result = {
        "workload": workload,
        "write": snap,
        "zero": best(zero),
        "slow": best(slow),
        "serial": run_child("read", ttfb=ttfb, max_requests=1, **common),
        "step": run_child("read", ttfb=ttfb, step=STEP, **common),
    }
    shutil.rmtree(snap["root"], ignore_errors=True)
    return result


def measure_rss(workload: str, n: int, tmp: Path, ttfb: float) -> dict[str, Any]:
    snap = write(workload, n, tmp)
    read = run_child("read", n=n, root=snap["root"], fingerprint=snap["fingerprint"], ttfb=ttfb)
    shutil.rmtree(snap["root"], ignore_errors=True)
    return read


# -- report ----------------------------------------------------------------------------------


def sps(read: dict[str, Any]) -> float:
    return float(read["samples"] / read["seconds"])


def steady(read: dict[str, Any]) -> float:
    """Samples per second after the first batch (the start-up cost left out)."""
    return float((read["samples"] - BATCH) / (read["seconds"] - read["first_batch"]))


def ms(x: float) -> str:
    return f"{1000 * x:,.1f}"


def print_table(results: list[dict[str, Any]], ttfb: float) -> None:
    rows = [("", "img", "tok", "target")]
    t = f"{1000 * ttfb:g} ms"

    def row(label: str, fn: Any, target: str = "") -> None:
        rows.append((label, *[fn(r) for r in results], target))

    s = lambda r, k="slow": r[k]["stats"]  # noqa: E731
    row("samples", lambda r: f"{r['write']['n']:,}")
    row("stored (MB)", lambda r: mb(r["write"]["disk_bytes"]))
    row(
        "shuffle window (blocks of all)",
        lambda r: (
            f"{min(r['slow']['window_blocks'], r['slow']['blocks'])} of {r['slow']['blocks']}"
        ),
    )
    row("epoch at ttfb 0 (samples/s)", lambda r: f"{sps(r['zero']):,.0f}")
    row(f"epoch at ttfb {t} (samples/s)", lambda r: f"{sps(r['slow']):,.0f}")
    row(f"  {t} / ttfb 0", lambda r: f"{sps(r['slow']) / sps(r['zero']):.0%}", ">= 90%")
    row(f"epoch at {t}, max_requests=1 (samples/s)", lambda r: f"{sps(r['serial']):,.0f}")
    row("  max_requests=1 / ttfb 0", lambda r: f"{sps(r['serial']) / sps(r['zero']):.0%}")
    row("after the first batch: ttfb 0 (samples/s)", lambda r: f"{steady(r['zero']):,.0f}")
    row(f"after the first batch: {t} (samples/s)", lambda r: f"{steady(r['slow']):,.0f}")
    row(f"  {t} / ttfb 0", lambda r: f"{steady(r['slow']) / steady(r['zero']):.0%}")
    row("first batch at ttfb 0 (ms)", lambda r: ms(r["zero"]["first_batch"]))
    row(f"first batch at {t} (ms)", lambda r: ms(r["slow"]["first_batch"]))
    row(f"stats() at {t}: startup (ms)", lambda r: ms(s(r)["startup"]))
    row("  stall after startup (ms)", lambda r: ms(s(r)["stall"]))
    row("  requests", lambda r: f"{s(r)['requests']:,}")
    row("  fetched / stored bytes", lambda r: f"{s(r)['bytes'] / r['write']['disk_bytes']:.2f}x")
    row(
        "  latency mean / p95 (ms)",
        lambda r: f"{ms(s(r)['latency_mean'])} / {ms(s(r)['latency_p95'])}",
    )
    row("  concurrency: mean in flight", lambda r: f"{s(r)['concurrency']:.1f}")
    row(
        "  concurrency: max in flight / final limit",
        lambda r: f"{s(r)['max_in_flight']} / {s(r)['limit']}",
    )
    row("  max_requests=1: stall (s)", lambda r: f"{s(r, 'serial')['stall']:.2f}")
    row(f"5 ms/batch consumer at {t}: batches", lambda r: f"{s(r, 'step')['batches']:,}")
    row("  batches x 5 ms (s)", lambda r: f"{s(r, 'step')['batches'] * STEP:.2f}")
    row("  epoch time (s)", lambda r: f"{r['step']['seconds']:.2f}")
    row("  startup (ms)", lambda r: ms(s(r, "step")["startup"]))
    row("  stall after startup (ms)", lambda r: ms(s(r, "step")["stall"]))
    row("  stall / (wall - startup)", lambda r: f"{stall_share(s(r, 'step')):.1%}", "< 2%")
    row("prefetch budget (MB)", lambda r: mb(r["slow"]["budget"]))
    row("anon RSS before reading (MB)", lambda r: mb(r["slow"]["base_anon"]))
    row(f"peak anon RSS at {t}, 1x (MB)", lambda r: mb(r["slow"]["peak_anon"]))
    row("  growth while reading, 1x (MB)", lambda r: mb(growth(r["slow"])), "budget + c")
    if "big" in results[0]:
        x = f"{results[0]['big']['factor']:g}x"
        row(f"peak anon RSS at {t}, {x} (MB)", lambda r: mb(r["big"]["peak_anon"]))
        row(f"  growth while reading, {x} (MB)", lambda r: mb(growth(r["big"])), "budget + c")
        row(f"  growth {x} / 1x", lambda r: f"{growth(r['big']) / growth(r['slow']):.2f}", "1.00")
    print_rows(rows)


def stall_share(stats: dict[str, Any]) -> float:
    return float(stats["stall"] / max(stats["wall"] - stats["startup"], 1e-9))


def growth(read: dict[str, Any]) -> int:
    return int(read["peak_anon"] - read["base_anon"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the workload sizes")
    parser.add_argument("--ttfb", type=float, default=0.05, help="seconds per request")
    parser.add_argument(
        "--rss-scale", type=float, default=4.0, help="second size for the RSS rows (0: skip)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="epochs at ttfb 0 and --ttfb, fastest kept"
    )
    parser.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="?", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(CHILDREN[options.child](**json.loads(options.args))))
        return
    with tempfile.TemporaryDirectory(dir=options.tmp, prefix="snapstore-bench-reader-") as tmp:
        sizes = {w: max(BATCH, int(n * options.scale)) for w, n in SIZES.items()}
        results = [
            measure(w, sizes[w], Path(tmp), options.ttfb, options.repeat) for w in ("img", "tok")
        ]
        if options.rss_scale:
            for r in results:
                n = max(BATCH, int(sizes[r["workload"]] * options.rss_scale))
                big = measure_rss(r["workload"], n, Path(tmp), options.ttfb)
                r["big"] = {"factor": options.rss_scale, **big}
        print(
            f"# snapstore reader benchmark: batch {BATCH}, shuffled, default batches() settings, "
            f"simulated_store(ttfb={options.ttfb:g}), scale {options.scale:g}\n"
        )
        print_table(results, options.ttfb)


if __name__ == "__main__":
    main()
