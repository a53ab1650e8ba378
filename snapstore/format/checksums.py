"""The checksum algorithms of stored blocks and files (docs/format.md, sections 1 and 14.1).

Format versions 1 and 2 checksum blocks and files with CRC-32 (zlib's polynomial); version 3
records its algorithm in the manifest (``"checksum"``) and snapstore writes CRC-32C
(Castagnoli), through the ``crc32c`` package: hardware instructions on x86-64 (SSE 4.2) and
arm64, 6.5x zlib's CRC-32 per core here on cached buffers and 4x from memory, the GIL released
for buffers from 32 KiB, any buffer accepted, and the value a GCS object's ``crc32c`` reports.
Both fit the 32-bit slots the index rows and files have always had.
``benchmarks/bench_checksum.py`` measures the candidates.

Where the CPU has no CRC-32C instruction, ``crc32c`` falls back to a table-driven C version
about as fast as zlib's CRC-32: snapstore then logs a warning once (never silently slow), and
snapshots still read and write correctly.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import FormatError
from ..oldpaths import historic_name

try:
    import crc32c as _crc32c
except ImportError as exc:  # pragma: no cover - a hard dependency
    raise ImportError(
        "snapstore needs the crc32c package for its block checksums: pip install crc32c"
    ) from exc

__all__ = [
    "CHECKSUMS",
    "CRC32",
    "CRC32C",
    "WRITTEN",
    "Checksum",
    "file_checksum",
    "snapshot_checksum",
]

log = logging.getLogger(historic_name(__name__))


@dataclass(frozen=True)
class Checksum:
    """A block and file checksum algorithm: its manifest name and a 32-bit function.

    ``update(data, value)`` continues a running checksum over more bytes (``value`` 0 to
    start); calling the object checksums ``data`` whole. ``data`` is any contiguous buffer.
    """

    name: str
    update: Callable[[Any, int], int]

    def __call__(self, data: Any) -> int:
        return self.update(data, 0)


def _zlib_crc32(data: Any, value: int) -> int:
    return zlib.crc32(data, value) & 0xFFFFFFFF


def _crc32c_update(data: Any, value: int) -> int:
    return int(_crc32c.crc32c(data, value))


CRC32 = Checksum("crc32", _zlib_crc32)
"""CRC-32 of zlib: format versions 1 and 2, and the commit record's ``manifest_crc32``."""
CRC32C = Checksum("crc32c", _crc32c_update)
"""CRC-32C (Castagnoli): what format version 3 writes."""
CHECKSUMS = {c.name: c for c in (CRC32, CRC32C)}
WRITTEN = CRC32C
"""The algorithm this snapstore writes."""

if not _crc32c.hardware_based:  # pragma: no cover - depends on the CPU
    log.warning(
        "snapstore: this CPU has no CRC-32C instruction, so block checksums run in software "
        "(about zlib's CRC-32 speed, several times slower than with the instruction); reading "
        "and writing are correct but slower"
    )


def snapshot_checksum(manifest: Mapping[str, Any], where: str) -> Checksum:
    """The algorithm of a snapshot's blocks and index, from its (version-checked) manifest.

    Raises
    ------
    FormatError
        If a version 3 manifest names no algorithm, or one this snapstore does not implement.
    """
    version = manifest.get("format_version")
    if isinstance(version, int) and version < 3:
        return CRC32  # versions 1 and 2 record none: always CRC-32
    name = manifest.get("checksum")
    found = CHECKSUMS.get(name) if isinstance(name, str) else None
    if found is None:
        known = ", ".join(repr(n) for n in CHECKSUMS)
        raise FormatError(
            f"{where} names checksum algorithm {name!r}; this snapstore reads {known}. "
            "Upgrade snapstore to read it, or rebuild the snapshot with this version."
        )
    return found


def file_checksum(entry: Mapping[str, Any]) -> Any:
    """The checksum a manifest records for a file (``index``): ``checksum`` since version 3,
    ``crc32`` before; None if absent (which no computed checksum equals)."""
    return entry["checksum"] if "checksum" in entry else entry.get("crc32")
