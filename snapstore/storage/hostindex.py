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
(their contents are equal). Opening checks the header against the manifest, the file size and
the body against the header's CRC-32C (a scan of the file, through the page cache, once per
process and copy: about 0.1 s for a 16M-block snapshot's 900 MB). A copy that fails a check
(one made before the body checksum became CRC-32C among them: magic ``SNAPHIX1``) is removed
and the index read again from the store.

**Trust.** A copy is trusted only from a directory private to the user: owned by the user and
writable by nobody else (no group or other write bit), as snapstore creates it (mode 0700);
its files must be the user's too, and are opened without following links. Anyone who can write
the directory could plant a copy whose header is valid, so a directory that is not private is
refused with one WARNING per process saying what was found and what to do, and the reader
keeps the index in memory (reads go on; only the sharing between processes is lost). The
directory is opened once and the copy opened relative to it, so a directory swapped after the
check is not followed.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import stat
import struct
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
# Copies whose body this process checked: (device, inode, size, mtime); a copy is only ever
# replaced by a rename, which changes the inode.
_checked: set[tuple[int, int, int, int]] = set()


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
    dir_fd = _open_private(index_dir(), create=False)
    if dir_fd is None:
        return False
    try:
        return any(e.name.startswith(prefix) for e in os.scandir(dir_fd))
    except OSError:
        return False
    finally:
        os.close(dir_fd)


def cached(fingerprint: str, run: str, entry: Mapping[str, Any]) -> Path | None:
    """The path of a valid copy of the index ``entry`` (the manifest's ``index``) names, or None.

    Valid: in a private directory, the header matches ``entry``'s size and checksum, the file
    its own size and the body its CRC-32C. A copy that is not is removed (and None returned).
    Costs an open and a 64-byte read, and a scan of the copy the first time in a process.
    """
    found = load(fingerprint, run, entry)
    return None if found is None else found.path


def load(fingerprint: str, run: str, entry: Mapping[str, Any]) -> HostIndex | None:
    """Map the copy of the index ``entry`` names, if this host has a valid one; else None.

    Only a copy in a private directory is looked at (see the module docstring). A copy with a
    wrong header, size, source checksum or body is logged, removed and None returned.
    """
    path = copy_path(fingerprint, run, entry)
    dir_fd = _open_private(path.parent, create=False)
    if dir_fd is None:
        return None
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a link (ELOOP) among them
        _warn_once(path.parent, f"cannot open {path} ({exc}); reading the index from the store")
        return None
    finally:
        os.close(dir_fd)
    try:
        why = _check_file(fd) or _check_header(fd, entry)
        if why is not None:
            log.warning("snapstore: per-host index %s %s; removing it and reading again", path, why)
            _remove_if_same(path, fd)
            return None
        _, blocks, _, _, body = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        if not _body_matches(fd, mapped, body):
            mapped.close()
            log.warning(
                "snapstore: per-host index %s has a body that does not match the CRC-32C in its "
                "header; removing it and reading again", path,
            )  # fmt: skip
            _remove_if_same(path, fd)
            return None
    finally:
        os.close(fd)
    return _view(path, mapped, blocks)


def _check_file(fd: int) -> str | None:
    """Why the open ``fd`` is not a copy this user made, or None."""
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):
        return "is not a regular file"
    if found.st_uid != os.geteuid():
        return f"is owned by uid {found.st_uid}, not by this user (uid {os.geteuid()})"
    return None


def _body_matches(fd: int, mapped: mmap.mmap, body: int) -> bool:
    """Whether the copy's rows and offsets hash to ``body`` (the header's CRC-32C): checked
    once per process and copy."""
    found = os.fstat(fd)
    key = (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)
    if key in _checked:
        return True
    view = memoryview(mapped)
    try:
        ok = CRC32C.update(view[HEADER_BYTES:], 0) == body
    finally:
        view.release()
    if ok:
        _checked.add(key)
    return bool(ok)


def _open_private(directory: Path, *, create: bool) -> int | None:
    """A descriptor of ``directory`` if it is private to this user (made with mode 0700 when
    ``create`` and missing), for the caller to close; else None. Missing and not ``create``:
    None. Any other reason (not private, not writable) is logged once per directory."""
    try:
        if create:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # parents: the umask's
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError) as exc:
        if create:
            _warn_unwritable(directory, exc)
        return None
    except OSError as exc:
        _warn_unwritable(directory, exc)
        return None
    why = _not_private(os.fstat(dir_fd))
    if why is None:
        return dir_fd
    os.close(dir_fd)
    _warn_once(
        directory,
        f"not using the per-host index directory {directory}: it {why}, and anyone who can "
        "write it could plant an index copy that sends reads astray. Expected a directory "
        "owned by you that only you can write (mode 0700, as snapstore creates it); the "
        f"block index is kept in memory by each reader meanwhile. Run `chmod 700 {directory}` "
        f"if it is yours, or set ${INDEX_DIR_ENV} to a directory of your own.",
    )
    return None


def _warn_unwritable(directory: Path, exc: OSError) -> None:
    _warn_once(
        directory,
        f"cannot write the per-host index in {directory} ({exc}); keeping it in memory "
        f"(set ${INDEX_DIR_ENV} to a writable directory)",
    )


def _not_private(found: os.stat_result) -> str | None:
    """Why a directory of status ``found`` is not private to this user, or None."""
    if found.st_uid != os.geteuid():
        return f"is owned by uid {found.st_uid}, not by you (uid {os.geteuid()})"
    mode = stat.S_IMODE(found.st_mode)
    if mode & 0o022:
        who = " and ".join(w for b, w in ((0o020, "its group"), (0o002, "other users")) if mode & b)
        return f"has mode {mode:#o}: {who} can write it"
    return None


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
    dir_fd = _open_private(path.parent, create=True)
    if dir_fd is None:
        return None
    try:
        return _create_in(dir_fd, path, fingerprint, entry, data, check)
    finally:
        os.close(dir_fd)


def _create_in(
    dir_fd: int,
    path: Path,
    fingerprint: str,
    entry: Mapping[str, Any],
    data: bytes,
    check: Callable[[np.ndarray[Any, Any]], None],
) -> HostIndex | None:
    """:func:`create` in the private directory open as ``dir_fd`` (named relative to it, so a
    directory swapped since its check is not written)."""
    temp = f".{path.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        _warn_unwritable(path.parent, exc)
        return None
    try:
        with os.fdopen(fd, "r+b") as file:
            blocks = _write(file.fileno(), data, check, entry, str(path))
            # On disk before it is named: a power loss must not leave a whole-looking copy
            # with pages never written (opening would find it and make it again, at a cost).
            os.fsync(file.fileno())
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        os.replace(temp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(temp, dir_fd=dir_fd)
        _warn_once(
            path.parent, f"cannot write the per-host index {path} ({exc}); keeping it in memory"
        )
        return None
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp, dir_fd=dir_fd)
        raise
    _remove_older(dir_fd, path.name, fingerprint)
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


def _remove_older(dir_fd: int, name: str, fingerprint: str) -> None:
    """Remove copies of other runs or index versions of the same fingerprint (a newer commit
    replaced them; processes that still map one keep their mapping)."""
    prefix = f"{fingerprint}-"
    with contextlib.suppress(OSError):
        for other in os.scandir(dir_fd):
            if other.name.startswith(prefix) and other.name.endswith(".idx") and other.name != name:
                with contextlib.suppress(OSError):
                    os.remove(other.name, dir_fd=dir_fd)


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
