"""Checksum throughput: the candidates for the block and file checksum of format version 3.

    python benchmarks/bench_checksum.py          # ~1 min
    python benchmarks/bench_checksum.py --seconds 0.01 --repeat 1 --sizes 65536 --gil-mb 1 \
        --decode-mb 1                            # smoke

For each implementation that is importable it prints:

  GB/s         one thread checksumming a memoryview of random bytes over and over (best of
               --repeat runs of --seconds each), per buffer size: 256 KiB and 1 MiB stay in
               the CPU's caches, 256 MiB streams from memory as a read from the page cache does
  GIL share    how far a pure-Python thread gets during one call on --gil-mb MiB, against as
               long without the call: ~0 if the call holds the GIL, well above 0 if it releases
               it (decode threads run the checksum beside the consumer's thread)

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


def _rate(fn: Hash, buf: Any, seconds: float) -> float:
    """Bytes per second of ``fn`` on ``buf`` over at least ``seconds`` (one call at least)."""
    n, start = 0, time.perf_counter()
    while True:
        fn(buf)
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n * len(buf) / elapsed


def rate(fn: Hash, size: int, seconds: float, repeat: int) -> float:
    """Best single-thread GB/s of ``fn`` on a ``memoryview`` of ``size`` random bytes (what
    the reader passes), or on ``bytes`` where ``fn`` refuses a memoryview."""
    buf: Any = memoryview(os.urandom(size))
    try:
        fn(buf[:1])
    except TypeError:
        buf = bytes(buf)
    return max(_rate(fn, buf, seconds) for _ in range(repeat)) / 1e9


def gil_share(fn: Hash, size: int) -> float:
    """How far a pure-Python thread gets during one call of ``fn`` on ``size`` bytes, against
    as long without the call: ~0 when the call holds the GIL, well above 0 when it releases
    it (about 0.5 on 2 busy cores)."""
    buf = os.urandom(size)
    count, stop = [0], [False]

    def spin() -> None:
        while not stop[0]:
            count[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    time.sleep(0.05)
    before, start = count[0], time.perf_counter()
    fn(buf)
    during = (count[0] - before) / (time.perf_counter() - start)
    before = count[0]
    time.sleep(0.05)
    alone = (count[0] - before) / 0.05
    stop[0] = True
    thread.join()
    return during / alone


def _img_blocks(megabytes: float) -> tuple[list[Any], Any]:
    """Raw blocks of 64 uint8[64,64,3] images, ``megabytes`` in all, and their schema."""
    import numpy as np

    from snapstore.format import layout as fmt
    from snapstore.format.schema import Schema

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

    from snapstore.format import layout as fmt
    from snapstore.format.checksums import CHECKSUMS

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
    parser.add_argument("--seconds", type=float, default=0.5, help="per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best kept)")
    parser.add_argument("--sizes", default="262144,1048576,268435456", help="buffer sizes in bytes")
    parser.add_argument("--gil-mb", type=int, default=256, help="buffer of the GIL test")
    parser.add_argument("--decode-mb", type=float, default=200.0, help="img blocks to decode")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"cpus: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}")
    head = "".join(f"  {_size(s) + ' GB/s':>13}" for s in sizes)
    print(f"{'implementation':<28}{head}  {'GIL share':>9}")
    for name, fn in candidates().items():
        if isinstance(fn, str):
            print(f"{name:<28}  {fn}")
            continue
        cells = [f"  {rate(fn, size, args.seconds, args.repeat):>13.2f}" for size in sizes]
        share = gil_share(fn, args.gil_mb << 20)
        print(f"{name:<28}{''.join(cells)}  {share:>9.2f}")
    print(f"\ndecode_block, {args.decode_mb:g} MB of raw img blocks (GB/s)")
    for name, value in decode_rates(args.decode_mb, args.repeat).items():
        print(f"{'decode, ' + name:<28}  {value:>13.2f}")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


if __name__ == "__main__":
    main()
