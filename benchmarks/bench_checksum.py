"""Checksum throughput: the candidates for the block and file checksum of format version 3.

    python benchmarks/bench_checksum.py                  # 1 MiB and 256 KiB, ~30 s
    python benchmarks/bench_checksum.py --seconds 0.01 --repeat 1 --decode-mb 1   # smoke

For each implementation that is importable, and each buffer size, it prints:

  1 thread (GB/s)    one thread checksumming one buffer over and over (best of --repeat runs
                     of --seconds each): the per-core cost a decode thread pays per byte
  2 threads / 1      two threads at once, each on its own buffer, against one thread: ~2 when
                     the implementation releases the GIL (decode threads run it), ~1 when not
                     (on a machine whose cores are busy with other work it is lower for all)

Then it decodes the blocks of an img-like snapshot (``--decode-mb`` of uint8[64,64,3] images in
raw blocks of 64 rows, as bench_format writes them) with ``format.decode_block`` under each
algorithm snapstore reads: the per-block path of every read (checksum, then an Arrow view).

Candidates: CRC-32 through ``zlib`` (formats 1 and 2), CRC-32C through ``google_crc32c``
(its ``implementation`` is printed: "python" is its silent pure-Python fallback) and through
``crc32c`` (ICRAR), and XXH3-64 / XXH3-128 through ``xxhash``. Missing packages are
reported, not installed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa

Hash = Callable[[Any], Any]


def candidates() -> dict[str, Hash | str]:
    """Name -> checksum function, or a string saying why it is not measured."""
    found: dict[str, Hash | str] = {"crc32 (zlib)": zlib.crc32}
    try:
        g = importlib.import_module("google_crc32c")
        impl = getattr(g, "implementation", "?")
        if impl == "c":
            found["crc32c (google-crc32c, c)"] = g.value
        else:
            found[f"crc32c (google-crc32c, {impl})"] = "pure-Python fallback: not measured"
    except ImportError:
        found["crc32c (google-crc32c)"] = "not installed"
    try:
        c = importlib.import_module("crc32c")
        found["crc32c (crc32c/ICRAR)"] = c.crc32c
    except ImportError:
        found["crc32c (crc32c/ICRAR)"] = "not installed"
    try:
        x = importlib.import_module("xxhash")
        found["xxh3-64 (xxhash)"] = x.xxh3_64_intdigest
        found["xxh3-128 (xxhash)"] = x.xxh3_128_intdigest
    except ImportError:
        found["xxh3 (xxhash)"] = "not installed"
    return found


def _rate(fn: Hash, buf: bytes, seconds: float) -> float:
    """Bytes per second of ``fn`` on ``buf`` over at least ``seconds``."""
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(8):
            fn(buf)
        n += 8
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n * len(buf) / elapsed


def _rate_threads(fn: Hash, size: int, seconds: float, threads: int) -> float:
    """Bytes per second of ``threads`` threads at once, each on its own buffer."""
    rates = [0.0] * threads
    barrier = threading.Barrier(threads)

    def work(i: int) -> None:
        buf = os.urandom(size)
        barrier.wait()
        rates[i] = _rate(fn, buf, seconds)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(rates)


def measure(fn: Hash, size: int, seconds: float, repeat: int) -> tuple[float, float]:
    """(best single-thread GB/s, best 2-thread rate / best 1-thread rate)."""
    buf = os.urandom(size)
    one = max(_rate(fn, buf, seconds) for _ in range(repeat))
    two = max(_rate_threads(fn, size, seconds, 2) for _ in range(repeat))
    return one / 1e9, two / one


def _img_blocks(megabytes: float) -> tuple[list[Any], Any]:
    """Raw blocks of 64 uint8[64,64,3] images, ``megabytes`` in all, and their schema."""
    import numpy as np

    from snapstore import format as fmt
    from snapstore.schema import Schema

    schema = Schema.from_json(
        [{"kind": "array", "name": "image", "dtype": "uint8", "shape": [64, 64, 3]}]
    )
    arrow = schema.arrow_schema()
    rows = 64
    count = max(1, int(megabytes * 1e6 / (rows * 64 * 64 * 3)))
    rng = np.random.default_rng(0)
    blocks = []
    for _ in range(count):
        images = rng.integers(0, 256, (rows, 64 * 64 * 3), dtype=np.uint8)
        column = pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1)), 64 * 64 * 3)
        batch = pa.RecordBatch.from_arrays([column], schema=arrow)
        blocks.append(fmt.encode_block(batch, level=0, min_ratio=1.25).data.tobytes())
    return blocks, arrow


def decode_rates(megabytes: float, repeat: int) -> dict[str, float]:
    """GB/s of ``decode_block`` over every block, per algorithm (best of ``repeat``)."""
    import numpy as np

    from snapstore import format as fmt
    from snapstore.checksums import CHECKSUMS

    blocks, arrow = _img_blocks(megabytes)
    total = sum(len(b) for b in blocks)
    rates = {}
    for name, checksum in CHECKSUMS.items():
        entries = np.zeros(len(blocks), fmt.INDEX_DTYPE)
        for entry, block in zip(entries, blocks):
            entry["length"] = entry["raw_length"] = len(block)
            entry["rows"], entry["checksum"] = 64, checksum(block)
        best = 0.0
        for _ in range(repeat):
            start = time.perf_counter()
            for entry, block in zip(entries, blocks):
                fmt.decode_block(block, entry, arrow, "s", checksum=checksum)
            best = max(best, total / (time.perf_counter() - start))
        rates[name] = best / 1e9
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best kept)")
    parser.add_argument("--sizes", default="1048576,262144", help="buffer sizes in bytes")
    parser.add_argument("--decode-mb", type=float, default=200.0, help="img blocks to decode")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"cpus: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}")
    head = "".join(f"  {f'{s >> 10} KiB: GB/s, 2 thr/1':>24}" for s in sizes)
    print(f"{'implementation':<28}{head}")
    for name, fn in candidates().items():
        if isinstance(fn, str):
            print(f"{name:<28}  {fn}")
            continue
        cells = []
        for size in sizes:
            gbs, scale = measure(fn, size, args.seconds, args.repeat)
            cells.append(f"  {gbs:>15.2f}  {scale:>6.2f}")
        print(f"{name:<28}{''.join(cells)}")
    print(f"\ndecode_block, {args.decode_mb:g} MB of raw img blocks (GB/s)")
    for name, rate in decode_rates(args.decode_mb, args.repeat).items():
        print(f"{'decode, ' + name:<28}  {rate:>15.2f}")


if __name__ == "__main__":
    main()
