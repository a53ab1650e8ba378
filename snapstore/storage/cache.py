"""A local cache of remote blocks: read a bucket's blocks once per host, not once per epoch.

:class:`CachedStore` wraps a remote store. Its :meth:`~CachedStore.read_range` serves a block from
a :class:`BlockCache` on local disk and fills the cache on a miss; every other method goes to the
remote store, which stays the source of truth (the cache only ever holds copies, so evicting an
entry, or deleting the whole directory, never loses anything)::

    store = cached_store("gs://bucket/snaps", "/mnt/nvme/snapstore-blocks", 50 << 30)
    snap = snapstore.open(fingerprint, root=store)

Why this is safe without locks:

- **Entries never go stale.** A key is the SHA-256 of (store URL, path, offset, length), and
  shards are immutable and uniquely named per write attempt, so the bytes behind a key never
  change. The cached store turns off range coalescing (``coalesce = False``): every read is one
  block, so keys are the same every epoch whatever the shuffle.
- **Nothing partial is ever visible.** An entry is written to a temp file in its own directory,
  then published with ``os.replace`` (atomic). Concurrent writers of one key write the same
  bytes; the last rename wins and readers see one whole file or the other.
- **Every entry is verified.** A 64-byte header holds a magic, the payload's length and its
  CRC-32C (format version 3's fast checksum, whatever the snapshot's own algorithm); a short,
  foreign or corrupt entry counts as a miss, is removed, and the block is read from the store
  again (the reader checks each block against the block index, with the snapshot's algorithm).
- **Eviction never breaks a reader.** Entries are evicted least recently used first, by an access
  time the cache keeps itself (it sets the entry's mtime on every hit, since atime is often
  disabled). A reader has the entry open before it reads; on POSIX an open file survives
  ``unlink``, so another process evicting it meanwhile costs nothing. (Windows refuses to
  delete or replace an open file: eviction skips it, and a put over it is dropped.)
- **No coordination files.** No lock files, refcounts or shared-memory barriers, so nothing a
  crash can leave held. A writer killed mid-put leaves a temp file that no reader looks at; a
  later scan removes it once it is old. Processes sharing the directory each track its size
  approximately and rescan it often enough to converge (see :class:`BlockCache`).

Layout under the cache directory: ``v2/<first two hex digits of the key>/<key>`` (``v1/``
held entries checksummed with CRC-32, before version 3 of the format; snapstore no longer reads
it, and it can be deleted).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import math
import os
import re
import secrets
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from ..errors import StoreError
from ..format.checksums import CRC32C
from ..oldpaths import historic_name
from .store import LocalStore, Store, open_store

__all__ = [
    "BlockCache",
    "CacheScan",
    "CachedStore",
    "user_cache_base",
    "block_key",
    "cached_store",
    "default_cache_dir",
]

log = logging.getLogger(historic_name(__name__))

_LAYOUT = "v2"  # a new entry format gets a new directory, so old entries are never misread
_MAGIC = b"SNAPBLK2"
_HEADER = struct.Struct("<8sQI")  # magic, payload length, CRC-32C of the payload
# The header is padded so the payload starts 64-byte aligned in the file, as blocks do in shards.
_HEADER_BYTES = 64
_KEY = re.compile(r"[0-9a-f]{64}")
# Eviction frees down to 90% of the limit, so a full cache scans once per 10% of it written
# rather than on every put.
_EVICT_TO = 0.9
# A process rescans after writing 1/16 of the limit or after this long, so the size it tracks
# includes what other processes wrote: together they exceed the limit by at most about what
# they write between two scans, and each trims on close.
_RESCAN_PARTS = 16
_RESCAN_SECONDS = 30.0
# A temp file this old belongs to a dead writer (a put takes milliseconds).
_STALE_TEMP_SECONDS = 600.0


def block_key(url: str, path: str, offset: int, length: int) -> str:
    """The cache key of a byte range of a file in a store: a SHA-256 hex digest."""
    text = f"{url}\0{path}\0{int(offset)}\0{int(length)}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def user_cache_base() -> Path:
    # The same base directory as snapstore.storage.store.default_root without $SNAPSTORE_ROOT.
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def default_cache_dir() -> str:
    """``$SNAPSTORE_CACHE_DIR``, else ``snapstore-blocks`` in the per-user cache directory
    (``~/.cache/snapstore-blocks`` on Linux, next to the default root ``~/.cache/snapstore``)."""
    env = os.environ.get("SNAPSTORE_CACHE_DIR")
    if env:
        return env
    return str(user_cache_base() / "snapstore-blocks")


@dataclass(frozen=True)
class CacheScan:
    """What one scan of a cache directory found and did.

    Attributes
    ----------
    entries, bytes : int
        Entries left, and the bytes of all files left (entries and live temp files).
    evicted, evicted_bytes : int
        Entries removed to bring the total under the limit, and their bytes.
    stale_temps : int
        Temp files of dead writers removed.
    """

    entries: int
    bytes: int
    evicted: int
    evicted_bytes: int
    stale_temps: int


class BlockCache:
    """A directory of verified copies of remote byte ranges, kept under a size limit.

    Safe for many threads and processes on one host at once (see the module docstring); the
    directory may be shared by any number of jobs and deleted at any time.

    Parameters
    ----------
    directory : str or PathLike
        Where entries live; created if missing. A local disk: a network filesystem works only
        if its rename is atomic and an open file survives unlink (NFS "silly rename" does).
    max_bytes : int
        Size limit of the entries, headers included. Several processes sharing the directory
        can exceed it briefly, by about what they write between two scans (each rescans after
        writing 1/16 of it or every 30 s); any scan, and closing, trims back under it. A block
        larger than the limit is not cached (a warning is logged once).

    Raises
    ------
    ValueError
        If ``max_bytes`` is not an int >= 0.
    StoreError
        If the directory cannot be created.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise ValueError(
                f"max_bytes must be an int >= 0 (the cache's size limit in bytes), got "
                f"{max_bytes!r}; e.g. max_bytes=50 << 30 for 50 GiB"
            )
        self.directory = Path(directory).expanduser().absolute()
        self.max_bytes = max_bytes
        self._root = self.directory / _LAYOUT
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the block cache directory {self._root}: {exc.strerror or exc}; "
                "check its permissions or choose another cache_dir"
            ) from exc
        self._lock = threading.Lock()  # guards the size estimate and the warnings
        self._scan_lock = threading.Lock()  # one scan per process at a time
        self._total: int | None = None  # bytes in the directory, as of the last scan + own puts
        self._since_scan = 0
        self._scanned_at = -math.inf
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"BlockCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Locks do not pickle; a copy in another process starts with no size estimate.
        return (BlockCache, (self.directory, self.max_bytes))

    def _path(self, key: str) -> Path:
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"a cache key is 64 lowercase hex digits (block_key()), got {key!r}")
        return self._root / key[:2] / key

    # -- reading -----------------------------------------------------------------------------

    def get(self, key: str) -> memoryview | None:
        """The cached bytes of ``key`` (64-byte aligned, read-only), or None on a miss.

        A truncated or corrupt entry is a miss, and is removed. A hit makes the entry the most
        recently used.
        """
        path = self._path(key)
        try:
            # Opened before reading: if another process evicts the entry meanwhile, the open
            # file survives the unlink (POSIX) and is read whole.
            with open(path, "rb", buffering=0) as f:
                data, why = _read_entry(f)
                if data is not None:
                    _touch(f.fileno(), path)
                    return data
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn_once(
                "read", "cannot read cache entry %s (%s); reading from the store", path, exc
            )
            return None
        log.debug("cache entry %s is corrupt (%s); removed", path, why)
        self._warn_once("corrupt", "cache entry %s was corrupt (%s); removed it", path, why)
        with contextlib.suppress(OSError):
            path.unlink()
        return None

    # -- writing -----------------------------------------------------------------------------

    def put(self, key: str, data: Any) -> bool:
        """Cache ``data`` (any bytes-like object) under ``key``; True if it was stored.

        False when the entry is larger than the limit, or writing failed (a full disk): the
        cache is an optimization, so neither raises; each logs a warning once.
        """
        path = self._path(key)
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        size = _HEADER_BYTES + view.nbytes
        if size > self.max_bytes:
            self._warn_once(
                "bypass",
                "a block of %d bytes does not fit in the block cache's limit of %d bytes (%s); "
                "such blocks are read from the store without caching. Raise max_bytes above "
                "the block size, ideally above the data read per epoch.",
                view.nbytes,
                self.max_bytes,
                self.directory,
            )
            return False
        self._make_room(size)
        header = _HEADER.pack(_MAGIC, view.nbytes, CRC32C(view)).ljust(_HEADER_BYTES, b"\0")
        tmp = path.with_name(f".{key}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # the directory may have been deleted
            with open(tmp, "xb") as f:
                f.write(header)
                f.write(view)
                f.flush()
                _touch(f.fileno(), tmp)
            # No fsync: after a power loss a garbled entry fails its CRC and is a miss.
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if not isinstance(exc, OSError):
                raise
            self._warn_once(
                "write", "cannot write to the block cache %s (%s); not caching", path.parent, exc
            )
            return False
        with self._lock:
            if self._total is not None:
                self._total += size
            self._since_scan += size
        return True

    def _make_room(self, incoming: int) -> None:
        with self._lock:
            due = (
                self._total is None
                or self._total + incoming > self.max_bytes
                or self._since_scan * _RESCAN_PARTS >= self.max_bytes
                or time.monotonic() - self._scanned_at >= _RESCAN_SECONDS
            )
        if due and self._scan_lock.acquire(blocking=False):  # a scan already running will do
            try:
                self._scan(incoming)
            except OSError as exc:  # a read must not fail over the cache's housekeeping
                self._warn_once("scan", "cannot scan the block cache %s (%s)", self._root, exc)
            finally:
                self._scan_lock.release()

    # -- scanning and eviction ---------------------------------------------------------------

    def scan(self) -> CacheScan:
        """Measure the directory, remove dead writers' temp files and, if the entries exceed
        the limit, evict the least recently used ones down to 90% of it."""
        with self._scan_lock:
            return self._scan(0)

    def trim(self) -> CacheScan | None:
        """:meth:`scan`, if this process wrote entries since its last scan; None otherwise.

        Each process trims when it closes: the last one to do so sees every entry, so a
        directory that everybody has stopped writing ends under the limit.
        """
        with self._lock:
            dirty = self._since_scan > 0
        return self.scan() if dirty else None

    def _scan(self, incoming: int) -> CacheScan:
        """Scan, making room for ``incoming`` more bytes (``_scan_lock`` held)."""
        with self._lock:
            seen = self._since_scan
        entries, total, stale = self._list()
        evicted = evicted_bytes = 0
        if total + incoming > self.max_bytes:
            target = int(self.max_bytes * _EVICT_TO)
            entries.sort()  # oldest access first
            for _, _, size, path in entries:
                if total + incoming <= target:
                    break
                if not _unlink(path):  # readers holding it open keep reading (POSIX)
                    continue
                evicted += 1
                evicted_bytes += size
                total -= size
            log.debug("evicted %d entries (%d bytes) from %s", evicted, evicted_bytes, self)
        with self._lock:
            # Puts that finished during the listing may be counted twice: an overestimate.
            self._since_scan -= seen
            self._total = total + self._since_scan
            self._scanned_at = time.monotonic()
        return CacheScan(len(entries) - evicted, total, evicted, evicted_bytes, stale)

    def _list(self) -> tuple[list[tuple[int, str, int, Path]], int, int]:
        """Entries as (mtime_ns, key, size, path), the bytes of all files, stale temps removed."""
        entries: list[tuple[int, str, int, Path]] = []
        total = stale = 0
        now = time.time_ns()
        with contextlib.suppress(FileNotFoundError), os.scandir(self._root) as fanout:
            for sub in fanout:
                if len(sub.name) != 2 or not sub.is_dir(follow_symlinks=False):
                    continue
                with contextlib.suppress(FileNotFoundError), os.scandir(sub.path) as files:
                    for entry in files:
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue  # evicted or published meanwhile
                        if _KEY.fullmatch(entry.name):
                            entries.append((st.st_mtime_ns, entry.name, st.st_size, Path(entry)))
                        elif entry.name.startswith(".") and entry.name.endswith(".tmp"):
                            old = now - st.st_mtime_ns > _STALE_TEMP_SECONDS * 1e9
                            if old and _unlink(entry.path):
                                stale += 1
                                continue
                        else:
                            continue  # not ours
                        total += st.st_size
        return entries, total, stale

    def verify(self) -> list[str]:
        """Check every entry's header and CRC; remove the bad ones and return their keys."""
        bad = []
        for _, key, _, path in self._list()[0]:
            try:
                with open(path, "rb", buffering=0) as f:
                    data, _ = _read_entry(f)
            except FileNotFoundError:
                continue
            if data is None:
                bad.append(key)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return bad

    def clear(self) -> None:
        """Remove every entry (and dead writers' temp files)."""
        for _, _, _, path in self._list()[0]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        with self._lock:
            self._total = None

    def _warn_once(self, kind: str, message: str, *args: Any) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        log.warning(message, *args)


def _read_entry(f: io.FileIO) -> tuple[memoryview | None, str]:
    """An entry's payload, or None and why it is not valid."""
    header = f.read(_HEADER_BYTES)
    if len(header) != _HEADER_BYTES:
        return None, f"{len(header)} bytes, shorter than its header"
    magic, length, crc = _HEADER.unpack_from(header)
    if magic != _MAGIC:
        return None, "not a cache entry (bad magic)"
    size = os.fstat(f.fileno()).st_size
    if size != _HEADER_BYTES + length:
        return None, f"{size} bytes, expected {_HEADER_BYTES + length}"
    view = memoryview(pa.allocate_buffer(length))  # 64-byte aligned, like blocks in shards
    got = 0
    while got < length:
        n = f.readinto(view[got:])
        if not n:
            return None, f"ends after {_HEADER_BYTES + got} bytes"
        got += n
    if CRC32C(view) != crc:
        return None, "checksum mismatch"
    return view.toreadonly(), ""


def _unlink(path: str | Path) -> bool:
    """Remove a file; True if it is gone (an entry open on Windows cannot be removed)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # removed by another process: gone all the same
    except OSError:
        return False
    return True


def _touch(fd: int, path: Path) -> None:
    """Mark an entry used now (nanoseconds, so the LRU order is exact)."""
    now = time.time_ns()
    target: int | Path = fd if os.utime in os.supports_fd else path
    try:
        os.utime(target, ns=(now, now))
    except PermissionError:  # another user's entry: setting "now" needs only write access
        with contextlib.suppress(OSError):
            os.utime(target)
    except OSError:
        pass  # the order is a hint; a read must not fail over it


class CachedStore(Store):
    """A remote store whose range reads go through a :class:`BlockCache` on local disk.

    Every method but :meth:`read_range` goes to the remote store unchanged: commit records,
    manifests and indexes are always read from it, so what is visible is decided there.

    Parameters
    ----------
    inner : Store
        The remote store (not a local one, nor another CachedStore).
    cache : BlockCache
        The cache; one may serve several stores (keys include the store's URL).

    Attributes
    ----------
    hits, misses : int
        Range reads served from the cache, and from the store.
    bytes_from_cache, bytes_from_remote : int
        Their bytes.

    Raises
    ------
    ValueError
        If ``inner`` is local or already cached.
    """

    local = False
    # One request per block: cache keys must not depend on which neighbours a read was
    # coalesced with, which changes with the shuffle.
    coalesce = False

    def __init__(self, inner: Store, cache: BlockCache) -> None:
        if isinstance(inner, CachedStore):
            raise ValueError(f"{inner.url} is already a CachedStore; wrap the remote store once")
        if isinstance(inner, LocalStore) or inner.local:
            raise ValueError(
                f"{inner.url} is a local store: its range reads are memory-map slices already, "
                "and caching them would only copy local files to local disk. Cache a remote "
                "store (gs://..., s3://..., or snapstore.storage.simulate.simulated_store(...))."
            )
        self.inner = inner
        self.cache = cache
        self.url = inner.url
        self.atomic_create = inner.atomic_create  # commits go to the inner store
        self._counter_lock = threading.Lock()
        self.reset_counters()

    def __repr__(self) -> str:
        return f"CachedStore({self.inner!r}, {self.cache!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (CachedStore, (self.inner, self.cache))

    def reset_counters(self) -> None:
        """Set ``hits``, ``misses``, ``bytes_from_cache`` and ``bytes_from_remote`` to zero."""
        with self._counter_lock:
            self.hits = self.misses = 0
            self.bytes_from_cache = self.bytes_from_remote = 0

    def read_range(self, path: str, start: int, length: int) -> Any:
        """``length`` bytes from ``start``: from the cache, else from the store (then cached)."""
        key = block_key(self.url, path, start, length)
        cached = self.cache.get(key)
        if cached is not None:
            with self._counter_lock:
                self.hits += 1
                self.bytes_from_cache += cached.nbytes
            return cached
        data = self.inner.read_range(path, start, length)
        size = memoryview(data).nbytes
        with self._counter_lock:
            self.misses += 1
            self.bytes_from_remote += size
        if size == length:  # a short read is continued by the reader under another key
            self.cache.put(key, data)
        return data

    def join(self, path: str) -> str:
        return self.inner.join(path)

    def read_bytes(self, path: str) -> bytes:
        return self.inner.read_bytes(path)

    def open_write(self, path: str) -> IO[bytes]:
        return self.inner.open_write(path)

    def write_bytes(self, path: str, data: bytes) -> None:
        self.inner.write_bytes(path, data)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        return self.inner.create_if_absent(path, data)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def list_dir(self, path: str) -> list[str]:
        return self.inner.list_dir(path)

    def list_tree(self, path: str, prefix: str = "") -> dict[str, int]:
        return self.inner.list_tree(path, prefix)

    def size(self, path: str) -> int:
        return self.inner.size(path)

    def disk_usage(self, path: str) -> int:
        return self.inner.disk_usage(path)

    def is_dir(self, path: str) -> bool:
        return self.inner.is_dir(path)

    def sync_dir(self, path: str) -> None:
        self.inner.sync_dir(path)

    def remove_tree(self, path: str) -> None:
        # Cached blocks of removed files are never read again (run names are unique); they
        # age out of the cache.
        self.inner.remove_tree(path)

    def remove_empty_dir(self, path: str) -> bool:
        return self.inner.remove_empty_dir(path)

    def close(self) -> None:
        """Trim the cache under its limit if this process wrote to it; close the store."""
        self.cache.trim()
        self.inner.close()


def cached_store(
    store_or_root: str | os.PathLike[str] | Store | None,
    cache_dir: str | os.PathLike[str] | None,
    max_bytes: int,
    **storage_options: Any,
) -> CachedStore:
    """A remote store whose blocks are cached on local disk, for reading a snapshot many times.

    Parameters
    ----------
    store_or_root : str, PathLike or Store
        The remote store, or its URL (opened with :func:`snapstore.storage.store.open_store`).
    cache_dir : str, PathLike or None
        The cache directory; None means :func:`default_cache_dir`.
    max_bytes : int
        The cache's size limit in bytes; see :class:`BlockCache`.
    **storage_options
        Passed to the fsspec filesystem when ``store_or_root`` is a URL.

    Returns
    -------
    CachedStore

    Raises
    ------
    ValueError
        If the store is local (a local path or ``LocalStore``), or already cached.

    Examples
    --------
    >>> store = cached_store("gs://bucket/snaps", None, 50 << 30)      # doctest: +SKIP
    >>> snap = snapstore.open(fingerprint, root=store)                  # doctest: +SKIP
    >>> store.hits, store.misses                                        # doctest: +SKIP
    """
    inner = open_store(store_or_root, **storage_options)
    directory = default_cache_dir() if cache_dir is None else cache_dir
    return CachedStore(inner, BlockCache(directory, max_bytes))
