"""The samples of the golden snapshots under tests/golden/ (see tests/test_golden_snapshots.py).

Do not edit: the snapshots on disk were written from exactly these samples by the release named
in their directory, and the tests compare what a reader returns with them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

GOLDEN_V1 = "goldenformatv1"  # the fingerprint (a plain name) of tests/golden/format-v1
GOLDEN_V1_COUNT = 40


def golden_v1_samples(n: int = GOLDEN_V1_COUNT) -> list[dict[str, Any]]:
    """Every sample kind format version 1 stores, in blocks of both codecs (zstd and raw)."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        out.append(
            {
                "image": np.full((4, 4, 3), i, np.uint8),  # compressible: zstd blocks
                # incompressible noise, long in the second half: raw blocks there
                "noise": rng.integers(0, 256, (8 if i < n // 2 else 4096) + i % 2, dtype=np.uint8),
                "tokens": np.arange(i % 7, dtype=np.int32) * (i + 1),  # varying, empty at 0
                "patch": np.full((i % 3 + 1, 2), i / 4, np.float32),  # varying rank 2
                "z": np.array([i + 1j * i], np.complex64),
                "label": np.int64(i * 3),  # numpy scalar: int64[]
                "count": i - 20,  # Python int
                "weight": i / 8,
                "keep": i % 2 == 0,
                "text": f"sample {i} ✓",
                "raw": bytes([i, 255 - i]) * (i % 4),
            }
        )
    return out


GOLDEN_V2 = "goldenformatv2"  # the fingerprint of tests/golden/format-v2
GOLDEN_V2_COUNT = 40


def golden_v2_samples(n: int = GOLDEN_V2_COUNT) -> list[dict[str, Any]]:
    """The version 1 samples plus every kind version 2 added: lists of str and bytes, nested
    dicts (structs, one with a nullable field) and nullable str, bytes and array fields."""
    out = []
    for i, sample in enumerate(golden_v1_samples(n)):
        box = None if i % 3 == 0 else np.full(4, i / 2, np.float32)
        out.append(
            {
                **sample,
                "tags": [f"t{j}" for j in range(i % 4)],  # empty every fourth sample
                "blobs": [bytes([i, j]) for j in range(i % 3)],
                "caption": None if i % 5 == 0 else f"caption {i}",
                "payload": None if i % 4 == 1 else bytes([i]) * (i % 6),
                "box": box,
                "meta": {"w": i * 2, "h": None if i % 2 else i, "name": f"m{i}"},
            }
        )
    return out


GOLDEN_V3 = "goldenformatv3"  # the fingerprint of tests/golden/format-v3
GOLDEN_V3_COUNT = 40


def golden_v3_samples(n: int = GOLDEN_V3_COUNT) -> list[dict[str, Any]]:
    """The version 2 samples: version 3 changed the checksum (CRC-32C), no sample kind. Written
    by the release whose FORMAT_VERSION was 3, with ``WriteOptions(block_bytes=1024,
    block_min_rows=4, compression_level=1)`` through ``SnapshotWriter`` as fingerprint
    ``goldenformatv3``, as versions 1 and 2 were."""
    return golden_v2_samples(n)
