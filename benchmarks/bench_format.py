"""Write and read two synthetic workloads with snapstore and with baselines, in one run.

    python benchmarks/bench_format.py                 # full sizes, and 1x/4x memory
    python benchmarks/bench_format.py --scale 0.02    # a quick smoke run
    python benchmarks/bench_format.py --block-sizes 262144,1048576,4194304   # block-size sweep

Workloads (from the foundation issue):
  img: uint8[64,64,3] images with smooth structure plus an int64 label (the sample's index).
  tok: int32 token arrays of skewed length 64-1024 (Zipf-distributed ids) plus an int64 id.

Baselines measured in the same run: the raw generator (what recomputing costs, here nearly
free, so write times are reported net of it) and a numpy memmap of the same data, written
sample by sample and read batch by batch in exactly the snapshot's epoch order (the order of
``snap.batches(256, shuffle=True)``, checked). Both readers feed the same consumer,
:func:`touch`, which copies every byte of every sample into a reused buffer, as a training
step's copy to the device does.

Every measurement runs in a fresh child process so peak memory is its own. Memory is reported
as peak anonymous RSS (sampled every 5 ms): memory-mapped shard pages are page cache, shared
and reclaimable, and would otherwise count as the whole file once touched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
BATCH = 256
SIZES = {"img": 50_000, "tok": 200_000}


# -- workloads -------------------------------------------------------------------------------


def img_samples(n: int) -> Iterator[dict[str, Any]]:
    """Smooth images: low-frequency sinusoids plus mild noise, from a pool of 512 bases."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:64, 0:64].astype(np.float32)
    pool = []
    for _ in range(512):
        fx, fy, phase = rng.uniform(0.02, 0.15, 3)
        base = 90 * np.sin(x * fx + phase) + 70 * np.cos(y * fy - phase) + 128
        img = np.stack([base, 0.8 * base + 25, 0.6 * base + 40], axis=-1)
        img += rng.normal(0, 2.0, img.shape)
        pool.append(np.clip(img, 0, 255).astype(np.uint8))
    for i in range(n):
        yield {"image": np.roll(pool[i % 512], i // 512, axis=1), "label": i}


def tok_lengths(n: int) -> np.ndarray:
    """Skewed lengths in [64, 1024]: log-normal, mean about 300."""
    rng = np.random.default_rng(1)
    return np.clip(rng.lognormal(5.45, 0.65, n), 64, 1024).astype(np.int64)


def tok_samples(n: int) -> Iterator[dict[str, Any]]:
    lengths = tok_lengths(n)
    rng = np.random.default_rng(2)
    # 4M Zipf token ids, drawn in chunks so the generator itself stays small in memory
    pool = np.concatenate(
        [np.minimum(rng.zipf(1.2, 1 << 20), 50_000).astype(np.int32) for _ in range(4)]
    )
    starts = rng.integers(0, len(pool) - 1024, n)
    for i in range(n):
        yield {"tokens": pool[starts[i] : starts[i] + lengths[i]], "id": i}


WORKLOADS = {"img": img_samples, "tok": tok_samples}


# -- memory ----------------------------------------------------------------------------------


class PeakAnon:
    """Samples RssAnon from /proc/self/status; ``peak`` in bytes."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.005)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.now())


# -- child measurements ----------------------------------------------------------------------


def child_generate(workload: str, n: int, **_: Any) -> dict[str, Any]:
    t = time.perf_counter()
    nbytes = 0
    for s in WORKLOADS[workload](n):
        nbytes += sum(v.nbytes if isinstance(v, np.ndarray) else 8 for v in s.values())
    return {"seconds": time.perf_counter() - t, "raw_bytes": nbytes}


def child_snap_write(
    workload: str, n: int, directory: str, block_bytes: int, min_rows: int = 64, **_: Any
) -> dict[str, Any]:
    from snapstore.storage.store import LocalStore
    from snapstore.write.writer import SnapshotWriter, WriteOptions

    mem = PeakAnon()
    t = time.perf_counter()
    writer = SnapshotWriter(
        LocalStore(directory),
        "bench",
        options=WriteOptions(block_bytes=block_bytes, block_min_rows=min_rows),
    )
    for s in WORKLOADS[workload](n):
        writer.add(s)
    writer.commit()
    seconds = time.perf_counter() - t
    disk = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
    return {"seconds": seconds, "disk_bytes": disk, "peak_anon": mem.stop()}


def child_memmap_write(workload: str, n: int, directory: str, **_: Any) -> dict[str, Any]:
    mem = PeakAnon()
    t = time.perf_counter()
    if workload == "img":
        mm = np.lib.format.open_memmap(f"{directory}/data.npy", "w+", np.uint8, (n, 64, 64, 3))
        labels = np.empty(n, np.int64)
        for i, s in enumerate(img_samples(n)):
            mm[i] = s["image"]
            labels[i] = s["label"]
        mm.flush()
        np.save(f"{directory}/labels.npy", labels)
    else:
        lengths = tok_lengths(n)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        mm = np.lib.format.open_memmap(f"{directory}/data.npy", "w+", np.int32, (int(offsets[-1]),))
        for i, s in enumerate(tok_samples(n)):
            mm[offsets[i] : offsets[i + 1]] = s["tokens"]
        mm.flush()
        np.save(f"{directory}/offsets.npy", offsets)
    del mm
    seconds = time.perf_counter() - t
    disk = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
    return {"seconds": seconds, "disk_bytes": disk, "peak_anon": mem.stop()}


def _warm(directory: str) -> None:
    """Read every file once so both readers start from a warm page cache."""
    for p in Path(directory).rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def touch(batch: dict[str, Any], scratch: dict[str, np.ndarray]) -> int:
    """The consumer both readers feed: every sample of every field copied into a buffer reused
    from batch to batch, so every byte is read once (as a step's copy to the device reads it).

    A stacked field (an array) is one ``np.copyto``; a ragged field (a list of arrays, one per
    sample) is packed sample after sample into one flat buffer by ``np.concatenate(out=)``, so
    neither side pays a Python-level loop here. Returns the bytes touched.
    """
    touched = 0
    for name, value in batch.items():
        if isinstance(value, np.ndarray):
            buffer = scratch.get(name)
            if buffer is None or buffer.shape[1:] != value.shape[1:] or len(buffer) < len(value):
                buffer = scratch[name] = np.empty(
                    (max(len(value), BATCH), *value.shape[1:]), value.dtype
                )
            np.copyto(buffer[: len(value)], value)
            touched += value.nbytes
        else:
            size = sum(a.size for a in value)
            buffer = scratch.get(name)
            if buffer is None or buffer.dtype != value[0].dtype or len(buffer) < size:
                buffer = scratch[name] = np.empty(2 * size, value[0].dtype)
            np.concatenate(value, out=buffer[:size])
            touched += buffer[:size].nbytes
    return touched


def _order_of(directory: str) -> np.ndarray:
    """The order ``snap.batches(BATCH, shuffle=True)`` (seed 0, epoch 0, one consumer) reads."""
    import snapstore

    snap = snapstore.open("bench", root=directory)
    order = snap.batches(BATCH, shuffle=True).plan.order()
    snap.close()
    return order


def _digest(order: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.asarray(order, np.int64).tobytes()).hexdigest()


def child_snap_read(workload: str, n: int, directory: str, **_: Any) -> dict[str, Any]:
    """One shuffled epoch through the public API, every batch through :func:`touch`."""
    import snapstore
    from snapstore.format.plan import shuffle_quality

    _warm(directory)
    snapstore.open("bench", root=directory).close()  # imports and code paths, not the timing
    mem = PeakAnon()
    key = "label" if workload == "img" else "id"
    scratch: dict[str, np.ndarray] = {}
    t0 = time.perf_counter()
    snap = snapstore.open("bench", root=directory)
    batches = iter(snap.batches(BATCH, shuffle=True))
    first = next(batches)
    ttfb = time.perf_counter() - t0
    order = [first[key]]
    nbytes = touch(first, scratch)
    for batch in batches:
        order.append(batch[key])
        nbytes += touch(batch, scratch)
    seconds = time.perf_counter() - t0
    peak = mem.stop()  # before the O(N) quality bookkeeping below, which is not the reader's
    snap.close()
    read_order = np.concatenate(order)
    quality = shuffle_quality(read_order)
    return {
        "seconds": seconds,
        "samples": len(read_order),
        "bytes": nbytes,
        "ttfb": ttfb,
        "peak_anon": peak,
        "spearman": quality["spearman"],
        "distance_ratio": quality["distance_ratio"],
        "exact": sorted(read_order.tolist()) == list(range(n)),
        "order": _digest(read_order),
        "plan_order": _digest(_order_of(directory)),
    }


def child_memmap_read(
    workload: str, n: int, directory: str, order_dir: str, previous: bool = False, **_: Any
) -> dict[str, Any]:
    """The snapshot's epoch order, read batch by batch from the memmap, through :func:`touch`.

    img: one fancy index per field per batch (a stacked copy, as snapstore's batch is). tok:
    one view per sample from an offsets array (a list of arrays over the page cache, as
    snapstore's ``ragged="list"`` views its decoded blocks), copied by the consumer.
    ``previous``: the baseline as it was before issue 15 (tok: each sample copied out of an
    ``np.memmap`` slice with ``np.array``, one more copy and a memmap object per sample).
    """
    order = _order_of(order_dir)
    _warm(directory)
    mem = PeakAnon()
    key = "label" if workload == "img" else "id"
    scratch: dict[str, np.ndarray] = {}
    t0 = time.perf_counter()
    ttfb = 0.0
    nbytes = 0
    read = []
    # a plain ndarray over the map: slicing an np.memmap makes a memmap object per slice
    data = np.load(f"{directory}/data.npy", mmap_mode="r")
    data = data if previous else data.view(np.ndarray)
    index = np.load(f"{directory}/{'labels' if workload == 'img' else 'offsets'}.npy")
    for start in range(0, n, BATCH):
        idx = order[start : start + BATCH]
        if workload == "img":
            batch = {"image": data[idx], "label": index[idx]}
        else:
            ends = index[idx + 1].tolist()
            slices = [data[a:b] for a, b in zip(index[idx].tolist(), ends)]
            batch = {
                "tokens": [np.array(a) for a in slices] if previous else slices,
                "id": idx.astype(np.int64),
            }
        if not start:
            ttfb = time.perf_counter() - t0
        read.append(batch[key])
        nbytes += touch(batch, scratch)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "samples": n,
        "bytes": nbytes,
        "ttfb": ttfb,
        "peak_anon": mem.stop(),
        "order": _digest(np.concatenate(read)),
    }


CHILDREN = {
    f.__name__.removeprefix("child_"): f
    for f in (
        child_generate,
        child_snap_write,
        child_memmap_write,
        child_snap_read,
        child_memmap_read,
    )
}


def run_child(name: str, **kwargs: Any) -> dict[str, Any]:
    return run_script_child(__file__, name, **kwargs)


def run_script_child(
    script: str, name: str, child_env: dict[str, str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Run ``script --child name kwargs`` in a fresh interpreter (``child_env`` added to its
    environment); its last stdout line (JSON)."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{HERE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        **(child_env or {}),
    }
    out = subprocess.run(
        [sys.executable, script, "--child", name, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {name} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- orchestration ---------------------------------------------------------------------------


def measure(
    workload: str,
    n: int,
    tmp: Path,
    block_bytes: int,
    with_baseline: bool = True,
    min_rows: int = 64,
) -> dict[str, Any]:
    snap_dir, mm_dir = tmp / f"{workload}-{n}-{block_bytes}-snap", tmp / f"{workload}-{n}-mm"
    snap_dir.mkdir()
    common = {"workload": workload, "n": n, "block_bytes": block_bytes, "min_rows": min_rows}
    result: dict[str, Any] = {"workload": workload, "n": n, "block_bytes": block_bytes}
    result["gen"] = run_child("generate", directory="", **common)
    result["snap_write"] = run_child("snap_write", directory=str(snap_dir), **common)
    result["snap_read"] = run_child("snap_read", directory=str(snap_dir), **common)
    if with_baseline:
        mm_dir.mkdir(exist_ok=True)
        result["mm_write"] = run_child("memmap_write", directory=str(mm_dir), **common)
        paths = {"directory": str(mm_dir), "order_dir": str(snap_dir)}
        result["mm_read"] = run_child("memmap_read", **paths, **common)
        result["mm_previous"] = run_child("memmap_read", **paths, previous=True, **common)
        _remove(mm_dir)
    _remove(snap_dir)
    return result


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def mb(x: float) -> str:
    return f"{x / 1e6:,.0f}"


def print_main_table(results: list[dict[str, Any]]) -> None:
    rows = [("", "img", "tok")]

    def row(label: str, fn: Any) -> None:
        rows.append((label, *[fn(r) for r in results]))

    row("samples", lambda r: f"{r['n']:,}")
    row("raw data (MB)", lambda r: mb(r["gen"]["raw_bytes"]))
    row("generator alone (s)", lambda r: f"{r['gen']['seconds']:.2f}")
    net = lambda r, k: max(r[k]["seconds"] - r["gen"]["seconds"], 1e-9)  # noqa: E731
    row("write, net of generator: snapstore (s)", lambda r: f"{net(r, 'snap_write'):.2f}")
    row("write, net of generator: memmap (s)", lambda r: f"{net(r, 'mm_write'):.2f}")
    row("  snapstore / memmap", lambda r: f"{net(r, 'snap_write') / net(r, 'mm_write'):.2f}x")
    row("bytes on disk: snapstore (MB)", lambda r: mb(r["snap_write"]["disk_bytes"]))
    row("bytes on disk: memmap (MB)", lambda r: mb(r["mm_write"]["disk_bytes"]))
    row(
        "  compression ratio vs raw",
        lambda r: f"{r['gen']['raw_bytes'] / r['snap_write']['disk_bytes']:.2f}x",
    )
    sps = lambda r, k: r[k]["samples"] / r[k]["seconds"]  # noqa: E731
    row("shuffled read: snapstore (samples/s)", lambda r: f"{sps(r, 'snap_read'):,.0f}")
    row("shuffled read: memmap (samples/s)", lambda r: f"{sps(r, 'mm_read'):,.0f}")
    row("  snapstore / memmap", lambda r: f"{sps(r, 'snap_read') / sps(r, 'mm_read'):.2f}x")
    row(
        "shuffled read: memmap as before issue 15 (samples/s)",
        lambda r: f"{sps(r, 'mm_previous'):,.0f}",
    )
    row(
        "  snapstore / memmap as before issue 15",
        lambda r: f"{sps(r, 'snap_read') / sps(r, 'mm_previous'):.2f}x",
    )
    row(
        "shuffled read: snapstore (MB/s)",
        lambda r: mb(r["snap_read"]["bytes"] / r["snap_read"]["seconds"]),
    )
    row(
        "shuffled read: memmap (MB/s)",
        lambda r: mb(r["mm_read"]["bytes"] / r["mm_read"]["seconds"]),
    )
    row("first batch, from open: snapstore (ms)", lambda r: f"{1000 * r['snap_read']['ttfb']:.1f}")
    row("first batch, from open: memmap (ms)", lambda r: f"{1000 * r['mm_read']['ttfb']:.1f}")
    row("peak anon RSS: snapstore write (MB)", lambda r: mb(r["snap_write"]["peak_anon"]))
    row("peak anon RSS: snapstore read (MB)", lambda r: mb(r["snap_read"]["peak_anon"]))
    row("peak anon RSS: memmap read (MB)", lambda r: mb(r["mm_read"]["peak_anon"]))
    row("shuffle |Spearman| (target <= 0.05)", lambda r: f"{abs(r['snap_read']['spearman']):.4f}")
    row("shuffle distance / uniform (>= 0.9)", lambda r: f"{r['snap_read']['distance_ratio']:.3f}")
    row("every sample read exactly once", lambda r: str(r["snap_read"]["exact"]))
    row(
        "memmap read the same order",
        lambda r: str(
            r["snap_read"]["order"] == r["snap_read"]["plan_order"] == r["mm_read"]["order"]
        ),
    )
    print_rows(rows)


def print_rows(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join([r[0].ljust(widths[0]), *[c.rjust(w) for c, w in zip(r[1:], widths[1:])]]))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the workload sizes")
    parser.add_argument(
        "--rss-scale", type=float, default=4.0, help="second size for the RSS check (0: skip)"
    )
    parser.add_argument("--block-bytes", type=int, default=256 << 10)
    parser.add_argument(
        "--block-sizes", default="", help="comma list: run a block-size sweep instead"
    )
    parser.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="?", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(CHILDREN[options.child](**json.loads(options.args))))
        return
    with tempfile.TemporaryDirectory(dir=options.tmp, prefix="snapstore-bench-") as tmp:
        sizes = {w: max(BATCH, int(n * options.scale)) for w, n in SIZES.items()}
        if options.block_sizes:
            sweep(sizes, Path(tmp), [int(b) for b in options.block_sizes.split(",")])
            return
        results = [measure(w, sizes[w], Path(tmp), options.block_bytes) for w in ("img", "tok")]
        print(
            f"# snapstore format benchmark: batch {BATCH}, one process, "
            f"block {options.block_bytes} B; reads: one shuffled epoch from open, every batch "
            "copied by the consumer (touch)\n"
        )
        print_main_table(results)
        if options.rss_scale:
            rss_table(sizes, Path(tmp), options.block_bytes, options.rss_scale, results)


def rss_table(
    sizes: dict[str, int], tmp: Path, block_bytes: int, factor: float, base: list[dict[str, Any]]
) -> None:
    rows = [("peak anon RSS (MB)", "img 1x", f"img {factor:g}x", "tok 1x", f"tok {factor:g}x")]
    big = [
        measure(w, int(sizes[w] * factor), tmp, block_bytes, with_baseline=False)
        for w in ("img", "tok")
    ]
    pairs = [(base[0], big[0]), (base[1], big[1])]
    for label, key in (("snapstore write", "snap_write"), ("snapstore read", "snap_read")):
        rows.append((label, *[mb(r[key]["peak_anon"]) for pair in pairs for r in pair]))
    print(f"# memory does not grow with data size (1x and {factor:g}x of each workload)\n")
    print_rows(rows)


def sweep(sizes: dict[str, int], tmp: Path, block_sizes: list[int]) -> None:
    rows = [
        (
            "block bytes",
            "workload",
            "write net (s)",
            "ratio",
            "read samples/s",
            "ttfb (ms)",
            "read RSS (MB)",
            "|Spearman|",
            "distance",
        )
    ]
    for w in ("img", "tok"):
        for b in block_sizes:
            r = measure(w, sizes[w], tmp, b, with_baseline=False, min_rows=1)
            net = r["snap_write"]["seconds"] - r["gen"]["seconds"]
            rows.append(
                (
                    f"{b:,}",
                    w,
                    f"{net:.2f}",
                    f"{r['gen']['raw_bytes'] / r['snap_write']['disk_bytes']:.2f}",
                    f"{r['snap_read']['samples'] / r['snap_read']['seconds']:,.0f}",
                    f"{1000 * r['snap_read']['ttfb']:.1f}",
                    mb(r["snap_read"]["peak_anon"]),
                    f"{abs(r['snap_read']['spearman']):.3f}",
                    f"{r['snap_read']['distance_ratio']:.3f}",
                )
            )
    print("# block-size sweep (block_min_rows=1, so block_bytes alone sets the size)\n")
    print_rows(rows)


if __name__ == "__main__":
    main()
