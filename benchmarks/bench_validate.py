"""Per-sample validation, one line per sample kind: what ``SnapshotWriter.add`` costs a stage
before any encoding, for each kind a field can hold.

    python benchmarks/bench_validate.py              # 20,000 samples per kind, best of 5
    python benchmarks/bench_validate.py --samples 2000 --repeat 2

The schema is inferred from the first 256 samples (as the writer does from its first block);
the check (``snapstore.format.checks.sample_checker``) then runs over pre-built samples, so the
figure is the check alone, not the generator's work. Target: <= 3 us per sample for every kind.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Sample = Callable[[int], dict[str, Any]]

_RNG = np.random.default_rng(0)
_IMAGE = np.zeros((64, 64, 3), np.uint8)
_TOKENS = [np.zeros(n, np.int32) for n in _RNG.integers(64, 1025, 64)]
_POOL = _RNG.integers(0, 30_000, 64).tolist()
_X = np.arange(16, dtype=np.float32)
_TEXT = "word " * 24

KINDS: dict[str, Sample] = {
    "img, np.int64 label": lambda i: {"image": _IMAGE, "label": np.int64(i)},
    "tok, np.int64 id": lambda i: {"tokens": _TOKENS[i % 64], "id": np.int64(i)},
    "str + bytes + np.int64": lambda i: {"text": _TEXT, "raw": b"x" * 200, "id": np.int64(i)},
    "int, Python and np.int32": lambda i: {"label": i if i % 2 else np.int32(i)},
    "float, Python and np.float32": lambda i: {"score": i / 2 if i % 2 else np.float32(i)},
    "bool, Python and np.bool_": lambda i: {"flag": bool(i % 2) if i % 3 else np.True_},
    "list of 5..50 ints + float": lambda i: {"ids": _POOL[: 5 + i % 46], "score": i / 7},
    "list of 8 ints": lambda i: {"ids": _POOL[:8]},
    "list of 8 floats": lambda i: {"v": [0.5] * 8},
    "list of 3 str": lambda i: {"tags": ["cat", "animal", "pet"]},
    "empty lists": lambda i: {"ids": [] if i % 4 else [1, 2]},
    "nullable int (1 in 10 None)": lambda i: {"x": _X, "label": None if i % 10 == 3 else i},
    "nullable array": lambda i: {"box": None if i % 10 == 3 else _X},
    "nullable str": lambda i: {"caption": None if i % 10 == 3 else _TEXT},
    "nested dict": lambda i: {"x": _X, "meta": {"w": 64 + i % 7, "h": 48, "name": "img"}},
    "nested, nullable": lambda i: {"meta": None if i % 10 == 3 else {"w": i, "tags": ["a"]}},
}


def measure(make: Sample, n: int, repeat: int) -> float:
    """Microseconds per sample of the check, best of ``repeat`` passes."""
    from snapstore.format.checks import sample_checker
    from snapstore.format.inference import infer_schema

    samples = [make(i) for i in range(n)]
    check = sample_checker(infer_schema(samples[:256]))
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for i, sample in enumerate(samples):
            check(sample, i)
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'kind':<32} {'us/sample':>9}")
    for name, make in KINDS.items():
        print(f"{name:<32} {measure(make, args.samples, args.repeat):>9.2f}")


if __name__ == "__main__":
    main()
