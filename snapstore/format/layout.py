"""On-disk format v3 (reading v1 and v2 too): blocks, shards, the block index, the manifest and
the commit record.

The normative description is docs/format.md; this module is its reference implementation.
Version 2 added nullable fields, nested dicts (Arrow structs) and lists of str or bytes to the
schema (docs/format.md, section 6); version 3 records the checksum algorithm of blocks and
the index in the manifest and writes CRC-32C where versions 1 and 2 have CRC-32
(:mod:`snapstore.format.checksums`). Files, blocks and the commit protocol are otherwise as in
version 1, so older snapshots read as they always did.
Layout of a snapshot under a root::

    <root>/<fingerprint>/COMMIT                    commit record, created only if absent
    <root>/<fingerprint>/runs/<run>/manifest.json  written before the commit record
    <root>/<fingerprint>/runs/<run>/index.bin      block index
    <root>/<fingerprint>/runs/<run>/shard-00000.snap ...

Readers start from ``COMMIT`` and never list directories.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import zstandard

from ..errors import CorruptBlockError, FormatError
from .checksums import CRC32, WRITTEN, Checksum

__all__ = [
    "CODEC_RAW",
    "CODEC_ZSTD",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "INDEX_DTYPE",
    "CommitRecord",
    "EncodedBlock",
    "decode_block",
    "encode_block",
    "pack_block",
    "read_index",
    "write_index",
]

FORMAT_VERSION = 4
# Versions this reader reads: version 1 is version 2 without the new field kinds, version 2 is
# version 3 with CRC-32 for every checksum, version 3 is version 4 without shared partitions
# (shard entries with "shared", the manifest's "shared_partitions").
READABLE_VERSIONS = (1, 2, 3, 4)
SHARD_MAGIC = b"SNAPSHD1"
# Blocks start at multiples of this offset in a shard (zero padding between), so a raw block's
# buffers, viewed in place through a memory map, are aligned for every dtype.
BLOCK_ALIGNMENT = 64
SHARD_FOOTER_MAGIC = b"SNAPSFT1"
INDEX_MAGIC = b"SNAPIDX1"
COMMIT_NAME = "COMMIT"
# The root's directory of partitions shared by the snapshots of partitioned stages (format
# version 4): parts/<stage key>/<partition fingerprint>/, each a small snapshot of its own.
SHARED_PARTS_DIR = "parts"
MANIFEST_NAME = "manifest.json"
INDEX_NAME = "index.bin"
CODEC_RAW = 0
CODEC_ZSTD = 1
CODEC_NAMES = {CODEC_RAW: "raw", CODEC_ZSTD: "zstd"}

# One row per block, little-endian, 48 bytes. Offsets are into the shard file.
INDEX_DTYPE = np.dtype(
    [
        ("shard", "<u4"),
        ("codec", "<u4"),
        ("offset", "<u8"),
        ("length", "<u8"),
        ("raw_length", "<u8"),
        ("rows", "<u8"),
        ("checksum", "<u4"),
        ("reserved", "<u4"),
    ]
)

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


def is_plain_name(name: Any) -> bool:
    """True for one safe path component: letters, digits, '.', '_', '-', and no '..'."""
    return isinstance(name, str) and bool(_SAFE_NAME.fullmatch(name)) and ".." not in name


def check_name(name: Any, what: str) -> str:
    """Validate a file name read from a manifest: one path component, no traversal."""
    if not is_plain_name(name):
        raise FormatError(
            f"{what} {name!r} is not a plain file name inside the snapshot; expected letters, "
            "digits, '.', '_' or '-'. The manifest is corrupt or was not written by snapstore."
        )
    return str(name)


@dataclass(frozen=True)
class EncodedBlock:
    """A block ready to append to a shard (``data`` is a byte view, not copied)."""

    data: memoryview
    codec: int
    raw_length: int
    rows: int
    checksum: int


# Bytes zstd tries first on a large block: if even this sample does not compress, the block is
# stored raw without compressing the rest (saves ~85% of the compression time on image data).
_PROBE_BYTES = 128 << 10


def encode_block(batch: pa.RecordBatch, *, level: int, min_ratio: float) -> EncodedBlock:
    """Serialize a record batch as an Arrow IPC message and compress it if that pays.

    The block is stored raw when zstd does not shrink it by at least ``min_ratio``: decoding a
    raw block is a checksum and a view, decompressing costs far more than the bytes saved. Its
    checksum is this version's (:data:`snapstore.format.checksums.WRITTEN`).
    """
    return pack_block(
        memoryview(batch.serialize()), batch.num_rows, level=level, min_ratio=min_ratio
    )


def pack_block(raw: memoryview, rows: int, *, level: int, min_ratio: float) -> EncodedBlock:
    """The second half of :func:`encode_block`: a serialized batch (``rows`` rows) compressed
    if that pays, and checksummed (the writer times the two halves apart)."""
    raw_length = raw.nbytes
    data, codec = raw, CODEC_RAW
    if level > 0 and raw_length:
        compressor = zstandard.ZstdCompressor(level=level)
        if raw_length > 4 * _PROBE_BYTES:
            middle = raw_length // 2
            probe = raw[middle - _PROBE_BYTES // 2 : middle + _PROBE_BYTES // 2]
            if len(compressor.compress(probe)) * min_ratio > 1.1 * _PROBE_BYTES:
                return EncodedBlock(raw, CODEC_RAW, raw_length, rows, WRITTEN(raw))
        packed = compressor.compress(raw)
        if len(packed) * min_ratio <= raw_length:
            data, codec = memoryview(packed), CODEC_ZSTD
    return EncodedBlock(data, codec, raw_length, rows, WRITTEN(data))


def decode_block(
    data: Any, entry: np.void, schema: pa.Schema, shard: str, *, checksum: Checksum
) -> pa.RecordBatch:
    """Verify and decode one stored block (``data`` is any buffer: bytes, memoryview, pa.Buffer)
    against its index row ``entry``, with the snapshot's ``checksum`` algorithm.

    Raises
    ------
    CorruptBlockError
        If the length or checksum differ from the index, or the bytes do not decode.
    """
    offset = int(entry["offset"])
    length = int(entry["length"])

    def corrupt(why: str) -> CorruptBlockError:
        return CorruptBlockError(
            f"block at offset {offset} of shard {shard!r} is corrupt: {why}. Run "
            "`snapstore verify` on the snapshot; remove it with `snapstore rm` and rebuild it.",
            shard=shard,
            offset=offset,
        )

    size = data.size if isinstance(data, pa.Buffer) else memoryview(data).nbytes
    if size != length:
        raise corrupt(f"expected {length} bytes, read {size}")
    if checksum(data) != int(entry["checksum"]):
        expected = int(entry["checksum"])
        raise corrupt(f"{checksum.name} checksum mismatch (expected {expected:#010x})")
    codec = int(entry["codec"])
    try:
        raw_length = int(entry["raw_length"])
        if codec == CODEC_ZSTD:
            data = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_length)
            if len(data) != raw_length:
                raise corrupt(f"decompressed to {len(data)} bytes, expected {raw_length}")
        elif codec != CODEC_RAW:
            raise corrupt(f"unknown codec {codec}")
        elif raw_length != length:
            raise corrupt(f"raw block of {length} bytes claims {raw_length} decoded bytes")
        buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
        batch = pa.ipc.read_record_batch(buffer, schema)
    except (zstandard.ZstdError, pa.ArrowException) as exc:
        raise corrupt(f"cannot decode ({exc})") from exc
    if batch.num_rows != int(entry["rows"]):
        raise corrupt(f"expected {int(entry['rows'])} rows, decoded {batch.num_rows}")
    return batch


def shard_footer(entries: np.ndarray[Any, Any]) -> bytes:
    """The footer that makes a shard self-describing: its index rows, count, magic."""
    return (
        entries.astype(INDEX_DTYPE).tobytes() + struct.pack("<Q", len(entries)) + SHARD_FOOTER_MAGIC
    )


def write_index(entries: np.ndarray[Any, Any]) -> bytes:
    """Serialize the block index: magic, count, zstd-compressed rows."""
    body = zstandard.ZstdCompressor(level=3).compress(entries.astype(INDEX_DTYPE).tobytes())
    return INDEX_MAGIC + struct.pack("<Q", len(entries)) + body


def read_index(data: bytes, where: str) -> np.ndarray[Any, Any]:
    """Parse a block index written by :func:`write_index`."""
    if data[:8] != INDEX_MAGIC or len(data) < 16:
        raise FormatError(f"{where} is not a snapstore block index (bad magic)")
    (count,) = struct.unpack("<Q", data[8:16])
    expected = count * INDEX_DTYPE.itemsize
    try:
        raw = zstandard.ZstdDecompressor().decompress(data[16:], max_output_size=expected)
    except zstandard.ZstdError as exc:
        raise FormatError(f"{where} is corrupt: {exc}") from exc
    if len(raw) != expected:
        raise FormatError(f"{where} announces {count} blocks but holds {len(raw)} bytes")
    return np.frombuffer(raw, dtype=INDEX_DTYPE)


def dump_json(data: Mapping[str, Any]) -> bytes:
    """Stable JSON bytes (sorted keys) for manifests and records."""
    return json.dumps(data, sort_keys=True, indent=1).encode()


def load_json(data: bytes, where: str) -> dict[str, Any]:
    """Parse a JSON object, with a FormatError naming the file on failure."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{where} is not valid JSON ({exc}); it is corrupt or foreign") from exc
    if not isinstance(value, dict):
        raise FormatError(f"{where} should hold a JSON object, found {type(value).__name__}")
    return value


def check_version(data: Mapping[str, Any], where: str) -> None:
    """Reject files of another format or of a format version this reader does not read."""
    if data.get("format") != "snapstore":
        raise FormatError(f"{where} was not written by snapstore (format={data.get('format')!r})")
    version = data.get("format_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        readable = " and ".join(map(str, READABLE_VERSIONS))
        raise FormatError(
            f"{where} has format version {version!r}; this snapstore reads versions "
            f"{readable}. Upgrade snapstore, or rebuild the snapshot."
        )


@dataclass(frozen=True)
class CommitRecord:
    """The small record whose creation makes a snapshot visible.

    ``manifest_checksum`` is the CRC-32 of the manifest in every format version (it is checked
    before the manifest, which names the snapshot's algorithm, is read); ``format_version`` is
    the snapshot's (a copy keeps its source's).
    """

    fingerprint: str
    run: str
    manifest_size: int
    manifest_checksum: int
    committed_at: str
    format_version: int = FORMAT_VERSION

    @staticmethod
    def checksum(manifest: bytes) -> int:
        """The ``manifest_crc32`` of manifest bytes: CRC-32 in every version."""
        return CRC32(manifest)

    def to_bytes(self) -> bytes:
        """Serialize to JSON bytes."""
        return dump_json(
            {
                "format": "snapstore",
                "format_version": self.format_version,
                "fingerprint": self.fingerprint,
                "run": self.run,
                "manifest_size": self.manifest_size,
                "manifest_crc32": self.manifest_checksum,
                "committed_at": self.committed_at,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> CommitRecord:
        """Parse and validate a commit record."""
        value = load_json(data, where)
        check_version(value, where)
        try:
            return cls(
                fingerprint=str(value["fingerprint"]),
                run=check_name(value["run"], f"run named in {where}"),
                manifest_size=int(value["manifest_size"]),
                manifest_checksum=int(value["manifest_crc32"]),
                committed_at=str(value["committed_at"]),
                format_version=int(value["format_version"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{where} is missing or has a bad field: {exc}") from exc
