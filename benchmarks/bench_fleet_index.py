"""A fleet-size block index: first batch and private memory per reader, one and eight at once.

    python benchmarks/bench_fleet_index.py                     # 16M blocks (~3 min, ~2 GB RAM)
    python benchmarks/bench_fleet_index.py --blocks 100000 --processes 2    # a smoke run

Issue 14's fleet case: a snapshot of 16M blocks of 256 KiB (4 TB, 1 billion samples) read by
one rank of eight. Writing 4 TB is not needed to measure what the block index costs, so the
snapshot is crafted: a real one-block snapshot is written with the public API, and a second
snapshot is made from its files with an index of ``--blocks`` rows that all point at that one
block (the manifest, index and commit record written as the writer would). Every block is read
and verified like any other.

Each reader runs in a fresh child process that first reads a batch of the one-block snapshot
(imports, thread pools), then measures, from opening the fleet snapshot to its first batch
(``snap.batches(256, shuffle=True, rank=0, world_size=8)``: 32 MiB windows of 128 blocks):

  first batch      seconds from open to the first batch
  anon growth      RssAnon after the first batch minus before the open, and the peak growth
                   (RssAnon sampled every 5 ms): the reader's private memory

Rows: the old in-memory index (``hostindex.MIN_BLOCKS`` raised past the snapshot, one process;
the index decoded into each process, offsets summed per process) as the baseline; the first
reader on the host (decodes ``index.bin`` into the per-host copy); a later reader (maps the
copy); and ``--processes`` readers started together that map the copy. The page cache holds one
copy of the index file whatever the number of readers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_format import PeakAnon, mb, print_rows, run_script_child

ROWS = 64  # samples per block: 16M blocks hold 1 billion samples
ROW_BYTES = 4 << 10  # a 64-row block of 4 KiB samples is 256 KiB, raw (as decoded images are)
BATCH = 256
WORLD = 8


# -- crafting --------------------------------------------------------------------------------


def source_rows(n: int) -> Any:
    """The one-block snapshot's samples: ``n`` rows of an id and 4 KiB of bytes."""
    for i in range(n):
        yield {"id": i, "pixels": np.full(ROW_BYTES, i % 251, np.uint8)}


def write_source(root: str, rows: int = ROWS) -> str:
    """Write the one-block snapshot under ``root``; its fingerprint."""
    import snapstore
    from snapstore.write.writer import WriteOptions

    options = WriteOptions(block_bytes=4 << 20, block_min_rows=rows, compression_level=0)
    snap = snapstore.snapshot(source_rows, root=root, options=options)(rows)
    snap.materialize()
    fingerprint = snap.fingerprint
    snap.close()
    return fingerprint


def craft_snapshot(root: str, source: str, blocks: int, fingerprint: str = "f" * 32) -> str:
    """Commit ``fingerprint`` under ``root``: ``blocks`` blocks, every one the single block of
    snapshot ``source`` (its shard copied). Returns ``fingerprint``."""
    from snapstore.format import layout as fmt
    from snapstore.read.reader import SnapshotReader
    from snapstore.storage.store import LocalStore

    reader = SnapshotReader(LocalStore(root), source)
    manifest, entry = dict(reader.manifest), reader.index[:1]
    run = "20260101T000000-fleet-0-00000000"
    run_dir = Path(root, fingerprint, "runs", run)
    run_dir.mkdir(parents=True)
    shard = manifest["shards"][0]
    shutil.copyfile(Path(root, reader.shard_paths[0]), run_dir / shard["path"])
    index = fmt.write_index(np.repeat(entry, blocks))
    (run_dir / fmt.INDEX_NAME).write_bytes(index)
    manifest |= {
        "fingerprint": fingerprint,
        "run": run,
        "num_blocks": blocks,
        "num_samples": blocks * int(entry["rows"][0]),
        "raw_bytes": blocks * int(entry["raw_length"][0]),
        "stored_bytes": blocks * int(entry["length"][0]),
        "shards": [{**shard, "blocks": blocks}],
        "index": {"path": fmt.INDEX_NAME, "size": len(index), "checksum": reader.checksum(index)},
    }
    data = fmt.dump_json(manifest)
    (run_dir / fmt.MANIFEST_NAME).write_bytes(data)
    record = fmt.CommitRecord(
        fingerprint, run, len(data), fmt.CommitRecord.checksum(data), "2026-01-01"
    )
    Path(root, fingerprint, fmt.COMMIT_NAME).write_bytes(record.to_bytes())
    return fingerprint


# -- child measurement -----------------------------------------------------------------------


def first_batch(
    root: str,
    fingerprint: str,
    warm: str,
    shared: bool = True,
    window_blocks: int | None = None,
    start_at: float = 0.0,
) -> dict[str, Any]:
    """Open ``fingerprint`` and read rank 0 of 8's first shuffled batch, after a warm-up read
    of snapshot ``warm``; seconds and anonymous memory growth. ``start_at``: wall-clock time to
    start at (readers started together)."""
    import snapstore
    from snapstore.storage import hostindex

    # The copy from any size on (a smoke run's snapshot is below the default threshold), or never.
    hostindex.MIN_BLOCKS = 0 if shared else 1 << 62
    with snapstore.open(warm, root=root) as snap:
        next(iter(snap.batches(8, shuffle=True)))
    while time.time() < start_at:
        time.sleep(0.001)
    before = PeakAnon.now()
    peak = PeakAnon()
    t = time.perf_counter()
    with snapstore.open(fingerprint, root=root) as snap:
        batches = snap.batches(
            BATCH, shuffle=True, rank=0, world_size=WORLD, window_blocks=window_blocks
        )
        batch = next(iter(batches))
        seconds = time.perf_counter() - t
        after = PeakAnon.now()
        samples = len(batch["id"])
        batches.close()
    return {
        "seconds": seconds,
        "growth": after - before,
        "peak_growth": peak.stop() - before,
        "samples": samples,
    }


CHILDREN = {"first_batch": first_batch}


# -- orchestration ---------------------------------------------------------------------------


def together(count: int, **kwargs: Any) -> list[dict[str, Any]]:
    """``count`` first_batch children started together (each waits for the same instant)."""
    env = {**os.environ, "PYTHONPATH": f"{Path(__file__).parent.parent}"}
    kwargs = {**kwargs, "start_at": time.time() + 3.0 + 0.5 * count}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", "first_batch", json.dumps(kwargs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(count)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"child failed:\n{err}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def measure(blocks: int, processes: int, tmp: Path) -> list[tuple[str, ...]]:
    root = str(tmp / "root")
    os.environ["SNAPSTORE_INDEX_DIR"] = str(tmp / "index")
    warm = write_source(root)
    fleet = craft_snapshot(root, warm, blocks)
    common = {"root": root, "fingerprint": fleet, "warm": warm}
    script = str(Path(__file__).resolve())
    cases = [
        (
            "index in memory (no per-host copy)",
            run_script_child(script, "first_batch", **common, shared=False),
        )
    ]
    cases.append(("per-host copy, first reader", run_script_child(script, "first_batch", **common)))
    cases.append(("per-host copy, later reader", run_script_child(script, "first_batch", **common)))
    group = together(processes, **common)
    copy_bytes = sum(f.stat().st_size for f in (tmp / "index").glob(f"{fleet}-*"))
    rows = [("", "first batch (s)", "anon growth (MB)", "peak anon growth (MB)")]
    for label, r in cases:
        rows.append((label, f"{r['seconds']:.2f}", mb(r["growth"]), mb(r["peak_growth"])))
    worst = max(group, key=lambda r: r["seconds"])
    label = f"{processes} readers together, slowest"
    rows.append((label, f"{worst['seconds']:.2f}", mb(worst["growth"]), mb(worst["peak_growth"])))
    total = sum(r["growth"] for r in group)
    one = cases[2][1]["growth"]
    rows.append((f"{processes} readers together, sum", "", mb(total), ""))
    rows.append(("index copy in page cache (MB, once per host)", "", mb(copy_bytes), ""))
    # Issue 14's target: the readers' private memory plus the page cache's one copy within 2x
    # one reader's private memory plus that copy.
    ratio = (total + copy_bytes) / (2 * one + copy_bytes)
    rows.append((f"({processes} x anon + copy) / (2 x one + copy)", "", f"{ratio:.2f}", ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=16 << 20, help="blocks in the snapshot")
    parser.add_argument("--processes", type=int, default=8, help="readers started together")
    parser.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="?", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(CHILDREN[options.child](**json.loads(options.args))))
        return
    with tempfile.TemporaryDirectory(dir=options.tmp, prefix="snapstore-bench-") as tmp:
        rows = measure(options.blocks, options.processes, Path(tmp))
    print(
        f"# fleet block index: {options.blocks:,} blocks of {ROWS} x {ROW_BYTES} B, rank 0 of "
        f"{WORLD}, batch {BATCH}, shuffled, 32 MiB windows; one child process per reader\n"
    )
    print_rows(rows)


if __name__ == "__main__":
    main()
