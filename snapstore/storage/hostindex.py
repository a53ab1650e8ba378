"""The per-host copy of a large block index: decoded once, memory-mapped by every reader.

A snapshot's block index (``index.bin``) is zstd-compressed rows of ``INDEX_DTYPE``, 48 bytes
per block once decoded. Every reader needs it, plus the per-block sample offsets (the cumulative
sum of rows, 8 bytes per block); for a 16M-block snapshot that is 900 MB, and 32 reader processes
on a node would each fetch, decode and keep their own. From :data:`MIN_BLOCKS` blocks on, the
first reader on a host writes both to one local file and every reader maps it read-only, so the
processes share one copy through the page cache and none fetches the index again.

The file lives in :func:`index_dir` (``$SNAPSTORE_INDEX_DIR``, else ``snapstore-index`` in the
per-user cache directory) and is named by fingerprint, run and the checksum of ``index.bin`` from
the manifest (CRC-32 or CRC-32C: the snapshot's algorithm), so a new commit never meets a copy of
an older one. Layout (little-endian)::

    header   64 bytes: magic, blocks, source size, source checksum, body CRC-32C, zero padding
    rows     blocks x 48 bytes: the decoded index
    offsets  (blocks + 1) x 8 bytes: int64 cumulative rows, starting at 0

It is written to a temporary file in the same directory, flushed to disk and renamed into
place, so processes racing to create it each write a complete file and the last rename wins
(their contents are equal). Opening checks the header against the manifest and the file size
(one small read, no scan of the body); :func:`verify` also checks the body's CRC-32C. A copy
that fails a check (one made before the body checksum became CRC-32C among them: magic
``SNAPHIX1``) is removed and the index read again from the store.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from ..errors import FormatError
from ..format import layout as fmt
from ..format.checksums import CRC32C, file_checksum
from ..oldpaths import historic_name
from .cache import user_cache_base

__all__ = [
    "INDEX_DIR_ENV",
    "MIN_BLOCKS",
    "HostIndex",
    "cached",
    "create",
    "exists",
    "index_dir",
    "load",
    "verify",
]

log = logging.getLogger(historic_name(__name__))

INDEX_DIR_ENV = "SNAPSTORE_INDEX_DIR"
# Below this a decoded index is at most 3.5 MB per process: a file per snapshot is not worth it.
MIN_BLOCKS = 1 << 16
MAGIC = b"SNAPHIX2"  # 2: the body checksum is CRC-32C (1: CRC-32)
_HEADER = struct.Struct("<8sQQII")  # magic, blocks, source size, source checksum, body CRC-32C
HEADER_BYTES = 64  # the rows start 64-byte aligned
_ROW = fmt.INDEX_DTYPE.itemsize
# Rows decoded, checked and written per step while creating a copy (3 MB of rows).
_CHUNK_ROWS = 1 << 16
_warned: set[str] = set()  # directories whose failure was logged (once per process)


@dataclass(frozen=True)
class HostIndex:
    """A block index and its sample offsets, mapped read-only from a per-host copy.

    Attributes
    ----------
    path : pathlib.Path
        The file mapped.
    index : numpy.ndarray
        The block index, ``INDEX_DTYPE`` rows (read-only, file-backed).
    offsets : numpy.ndarray
        ``blocks + 1`` int64 sample offsets, ``offsets[b]`` the first sample of block ``b``.
    """

    path: Path
    index: np.ndarray[Any, Any]
    offsets: np.ndarray[Any, Any]


def index_dir() -> Path:
    """``$SNAPSTORE_INDEX_DIR``, else ``snapstore-index`` in the per-user cache directory
    (``~/.cache/snapstore-index`` on Linux, beside the block cache ``snapstore-blocks``)."""
    env = os.environ.get(INDEX_DIR_ENV)
    return Path(env) if env else user_cache_base() / "snapstore-index"


def copy_path(fingerprint: str, run: str, entry: Mapping[str, Any]) -> Path:
    """Where the copy of ``fingerprint``'s index of ``run`` (manifest entry ``entry``) lives."""
    fmt.check_name(fingerprint, "fingerprint")
    fmt.check_name(run, "run")
    return index_dir() / f"{fingerprint}-{run}-{int(file_checksum(entry)):08x}.idx"


def exists(fingerprint: str, run: str) -> bool:
    """Whether this host holds a copy of an index of ``run`` (unchecked: one listing, no read).

    For a caller that has the commit record but not yet the manifest: when true, the index
    need not be fetched ahead; :func:`cached` then says whether the copy is the right one.
    """
    prefix = f"{fingerprint}-{run}-"
    with contextlib.suppress(OSError):
        return any(e.name.startswith(prefix) for e in os.scandir(index_dir()))
    return False


def cached(fingerprint: str, run: str, entry: Mapping[str, Any]) -> Path | None:
    """The path of a valid copy of the index ``entry`` (the manifest's ``index``) names, or None.

    Valid: the header matches ``entry``'s size and checksum and the file its own size. A copy
    that is not is removed (and None returned). Costs one open and one 64-byte read.
    """
    found = load(fingerprint, run, entry)
    return None if found is None else found.path


def load(fingerprint: str, run: str, entry: Mapping[str, Any]) -> HostIndex | None:
    """Map the copy of the index ``entry`` names, if this host has a valid one; else None.

    A copy with a wrong header, size or source checksum is logged, removed and None returned.
    """
    path = copy_path(fingerprint, run, entry)
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        _warn_once(path.parent, f"cannot open {path} ({exc}); reading the index from the store")
        return None
    try:
        why = _check_header(fd, entry)
        if why is not None:
            log.warning("snapstore: per-host index %s %s; removing it and reading again", path, why)
            _remove_if_same(path, fd)
            return None
        blocks = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))[1]
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    return _view(path, mapped, blocks)


def _view(path: Path, buffer: Any, blocks: int) -> HostIndex:
    index = np.frombuffer(buffer, fmt.INDEX_DTYPE, blocks, HEADER_BYTES)
    offsets = np.frombuffer(buffer, np.int64, blocks + 1, HEADER_BYTES + blocks * _ROW)
    return HostIndex(path, index, offsets)


def _check_header(fd: int, entry: Mapping[str, Any]) -> str | None:
    """Why the open copy ``fd`` does not hold the index ``entry`` names, or None if it does."""
    head = os.pread(fd, HEADER_BYTES, 0)
    if len(head) < HEADER_BYTES:
        return f"is truncated ({len(head)} bytes)"
    magic, blocks, size, crc, _ = _HEADER.unpack_from(head)
    if magic != MAGIC:
        return f"has magic {magic!r}, expected {MAGIC!r}"
    if (size, crc) != (entry.get("size"), file_checksum(entry)):
        return f"was made from index.bin of {size} bytes, checksum {crc:#010x}, not {entry!r}"
    expected = _file_size(blocks)
    found = os.fstat(fd).st_size
    if found != expected:
        return f"holds {found} bytes, expected {expected} for {blocks} blocks"
    return None


def _file_size(blocks: int) -> int:
    return HEADER_BYTES + blocks * _ROW + (blocks + 1) * 8


def _remove_if_same(path: Path, fd: int) -> None:
    """Remove ``path`` if it still is the file ``fd`` has open (not a racer's fresh copy)."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.remove(path)


def _warn_once(directory: Path, message: str) -> None:
    level = logging.DEBUG if str(directory) in _warned else logging.WARNING
    _warned.add(str(directory))
    log.log(level, "snapstore: %s", message)


def create(
    fingerprint: str,
    run: str,
    entry: Mapping[str, Any],
    data: bytes,
    check: Callable[[np.ndarray[Any, Any]], None],
) -> HostIndex | None:
    """Write this host's copy of the index ``data`` (``index.bin``'s bytes) and map it.

    ``data`` must already match ``entry`` (the reader checks size and checksum); ``check(rows)``
    sees every chunk of decoded rows and raises on corrupt ones. The rows are decoded a chunk
    at a time, so creating a copy takes O(chunk) memory besides ``data``. Returns None, after
    one WARNING per directory, if the directory cannot be written (the caller keeps the index
    in memory).

    Raises
    ------
    FormatError
        If ``data`` is not a block index, or ``check`` raises it.
    """
    path = copy_path(fingerprint, run, entry)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        _warn_once(
            path.parent,
            f"cannot write the per-host index in {path.parent} ({exc}); "
            f"keeping it in memory (set ${INDEX_DIR_ENV} to a writable directory)",
        )
        return None
    try:
        with os.fdopen(fd, "r+b") as file:
            blocks = _write(file.fileno(), data, check, entry, str(path))
            # On disk before it is named: opening checks the header and size, not the body, so
            # a power loss must not leave a whole-looking copy with pages never written.
            os.fsync(file.fileno())
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        os.replace(temp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(temp)
        _warn_once(
            path.parent, f"cannot write the per-host index {path} ({exc}); keeping it in memory"
        )
        return None
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    _remove_older(path, fingerprint)
    log.debug("snapstore: wrote the per-host index %s (%d blocks)", path, blocks)
    return _view(path, mapped, blocks)


def _write(
    fd: int,
    data: bytes,
    check: Callable[[np.ndarray[Any, Any]], None],
    entry: Mapping[str, Any],
    where: str,
) -> int:
    """Decode ``data`` into the open file ``fd`` chunk by chunk; the number of blocks."""
    if data[:8] != fmt.INDEX_MAGIC or len(data) < 16:
        raise FormatError(f"{where}: the source is not a snapstore block index (bad magic)")
    (blocks,) = struct.unpack("<Q", data[8:16])
    os.ftruncate(fd, _file_size(blocks))  # zeros: offsets[0] is already 0
    offsets_at = HEADER_BYTES + blocks * _ROW
    body, done, total = 0, 0, 0
    for rows in _decoded_chunks(data, blocks, where):
        check(rows)
        raw = rows.view(np.uint8).data
        _write_at(fd, raw, HEADER_BYTES + done * _ROW)
        body = CRC32C.update(raw, body)
        sums = np.cumsum(rows["rows"].astype(np.int64))
        sums += total
        _write_at(fd, sums.data, offsets_at + 8 * (done + 1))
        done, total = done + len(rows), int(sums[-1])
    body = _crc_range(fd, offsets_at, (blocks + 1) * 8, body)
    head = _HEADER.pack(MAGIC, blocks, int(entry["size"]), int(file_checksum(entry)), body)
    _write_at(fd, head.ljust(HEADER_BYTES, b"\0"), 0)
    return int(blocks)


def _write_at(fd: int, data: Any, offset: int) -> None:
    """All of ``data`` at ``offset``: ``os.pwrite`` may write less (a nearly full disk), and a
    copy with a hole would pass the header and size checks readers make."""
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(f"could not write {len(view)} bytes of an index copy")
        view, offset = view[written:], offset + written


def _decoded_chunks(data: bytes, blocks: int, where: str) -> Iterator[np.ndarray[Any, Any]]:
    """The rows of the index ``data``, at most :data:`_CHUNK_ROWS` at a time."""
    try:
        with zstandard.ZstdDecompressor().stream_reader(memoryview(data)[16:]) as stream:
            left = blocks
            while left:
                buffer = bytearray(min(left, _CHUNK_ROWS) * _ROW)
                view, got = memoryview(buffer), 0
                while got < len(buffer):
                    n = stream.readinto(view[got:])
                    if not n:
                        raise FormatError(f"{where} announces {blocks} blocks but holds fewer")
                    got += n
                left -= len(buffer) // _ROW
                yield np.frombuffer(buffer, fmt.INDEX_DTYPE)
            if stream.read(1):
                raise FormatError(f"{where} holds more than the {blocks} blocks it announces")
    except zstandard.ZstdError as exc:
        raise FormatError(f"{where} is corrupt: {exc}") from exc


def _crc_range(fd: int, start: int, length: int, crc: int = 0) -> int:
    """CRC-32C of ``length`` bytes of ``fd`` from ``start``, continuing ``crc``."""
    end = start + length
    while start < end:
        piece = os.pread(fd, min(end - start, 8 << 20), start)
        if not piece:
            raise OSError(f"short read at {start} of a per-host index")
        crc = CRC32C.update(piece, crc)
        start += len(piece)
    return crc


def _remove_older(path: Path, fingerprint: str) -> None:
    """Remove copies of other runs or index versions of the same fingerprint (a newer commit
    replaced them; processes that still map one keep their mapping)."""
    prefix = f"{fingerprint}-"
    with contextlib.suppress(OSError):
        for other in os.scandir(path.parent):
            if (
                other.name.startswith(prefix)
                and other.name.endswith(".idx")
                and other.name != path.name
            ):
                with contextlib.suppress(OSError):
                    os.remove(other.path)


def verify(path: Path | str) -> bool:
    """Whether the copy at ``path`` is whole: its header, size and body CRC-32C agree (reads it
    all, which :func:`load` does not)."""
    try:
        with open(path, "rb") as file:
            head = file.read(HEADER_BYTES)
            if len(head) < HEADER_BYTES:
                return False
            magic, blocks, _, _, body = _HEADER.unpack_from(head)
            size = os.fstat(file.fileno()).st_size
            if magic != MAGIC or size != _file_size(blocks):
                return False
            return bool(_crc_range(file.fileno(), HEADER_BYTES, size - HEADER_BYTES) == body)
    except OSError:
        return False
