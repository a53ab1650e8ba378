"""Declared inputs of a stage: files or objects, identified cheaply by their store's metadata.

``files("data/*.jpg")`` lists the matching files once, in bulk, and gives each a **stable name**
and an **identity string**. The fingerprint hashes the ``{name: identity}`` mapping (through
:meth:`Inputs.__snapstore_inputs__`) into its ``inputs`` part and keeps per-name digests, so a
miss can be explained as "3 changed, 1 added".

Names
    Paths relative to the *declared base*, with ``/`` separators, so they are the same on every
    machine and in every directory: for a glob, its directory before the first wildcard
    (``data/*.jpg`` names the file ``data/a.jpg`` ``a.jpg``); for a directory, the directory
    itself (all files under it, recursively, hidden ones included); for a file, its parent;
    for a list, the common parent of the bases of all its entries (``["data/train/*.jpg",
    "data/val"]`` gives ``train/a.jpg`` and ``val/b.jpg``). Bases depend only on what was declared,
    never on what matched. Two different files therefore never share a name; a file reached by
    two entries (an overlapping glob and path) is one input. Globs follow fsspec's rules (``**``
    crosses directories, ``*`` matches hidden names) and select files only. All entries of one
    declaration must be on one filesystem: pass one ``files()`` per store.

Identity per store (scheme 1; any change here changes fingerprints)
    - local disk: ``size=<bytes>;mtime_ns=<ns>``. No inode: it changes on every copy. Copying a
      tree elsewhere keeps the identity only if modification times are kept (``shutil.copy2``,
      ``cp -p``, ``rsync -t``); otherwise, or to ignore touches, use ``content_hash=True``.
    - GCS: ``size=..;generation=..;crc32c=..`` (every overwrite gets a new generation).
    - S3: ``size=..;etag=..`` (the ETag without quotes; multipart uploads have ``-N`` ETags).
    - fsspec memory: ``size=..;created_us=..``, the microsecond the file object was created (a
      rewrite creates a new one). Mutating a memory file in place keeps its identity.
    - any other store: ``size`` plus every one of ETag, checksum, md5, crc32c, generation,
      version id, mtime or last-modified fields its listing gives; if it gives none of them,
      :class:`~snapstore.errors.FingerprintError` asks for ``content_hash=True``.
    - ``content_hash=True``: ``sha256=<hex>`` of the bytes, on any store. It reads every byte
      (local: about the disk's or sha256's speed, one thread; remote: a full download, 16 files
      in flight), once per process: the result is cached on the object.

Costs: one listing per glob or directory (remote ones are never served from fsspec's listing
cache). A local explicit list costs one ``os.stat`` per file; a remote one, one listing per parent
directory holding at least 8 listed files and one metadata request per other file (16 in flight).

Local walks keep regular files only and follow symbolic links to directories, skipping a link
to a directory that encloses it (a loop).

Errors: a glob or directory with no files, a path that does not exist, an empty list, a broken
symbolic link, or a file gone before it could be hashed is an :class:`InputError` (also a
``FileNotFoundError``) naming every such entry; a listing or read the store refuses (permission,
network, missing bucket) is a :class:`~snapstore.errors.StoreError` raised from the store's
exception; entries on two filesystems are a ``ValueError``, entries that are not paths a
``TypeError``.
"""

from __future__ import annotations

import datetime
import hashlib
import operator
import os
import posixpath
import re
import reprlib
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, overload

import fsspec.core
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import glob_translate

from ..errors import FingerprintError, SnapstoreError, StoreError, StoreTimeoutError
from ..storage.deadline import TryAbandoned, call_with_deadline, client_options, endpoint_of
from ..storage.retry import STORE_TIMEOUT_ENV, RetryPolicy

__all__ = ["InputError", "Inputs", "files"]

T = TypeVar("T")
PathSpec = str | os.PathLike[str]
Info = Mapping[str, Any]

_MAGIC = re.compile(r"[*?[]")
_CHUNK = 1 << 20
_THREADS = 16
_LIST_PARENT_AT = 8
_SHOWN = 5
_GENERIC_KEYS = (
    "ETag", "etag", "checksum", "md5", "md5Hash", "crc32c", "generation", "VersionId",
    "version_id", "mtime", "LastModified", "last_modified", "modified", "updated",
)  # fmt: skip
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class InputError(SnapstoreError, FileNotFoundError):
    """A declared input does not exist, or a glob or directory holds no files."""


class Inputs:
    """Files or objects a stage reads, identified cheaply by their store's metadata.

    Parameters
    ----------
    paths_or_pattern : str, os.PathLike or sequence of them
        A glob (``data/*.jpg``, ``gs://bucket/prefix/**/*.parquet``), a file, a directory (every
        file under it), or a list of any of these on one filesystem.
    content_hash : bool, default False
        Identify each file by the sha256 of its bytes instead of its metadata (reads them all).
    storage_options : mapping, optional
        Passed to fsspec to open the filesystem (credentials, endpoint). Not part of the identity.

    Raises
    ------
    InputError
        A path does not exist, or a glob or directory holds no files.
    StoreError
        The store refused a listing (permission, network, missing bucket).
    FingerprintError
        The store gives no version metadata and ``content_hash`` is False.

    Notes
    -----
    Files are listed when the object is made. Iterating gives full paths (local) or URLs, sorted
    by name, ready to open. The object pickles without handles or cached hashes.
    """

    def __init__(
        self,
        paths_or_pattern: PathSpec | Sequence[PathSpec],
        *,
        content_hash: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._declared: str | list[str] = _declared(paths_or_pattern)
        entries = [self._declared] if isinstance(self._declared, str) else self._declared
        if not entries:
            raise InputError("files() got an empty list: declare at least one path, glob or URL")
        self._content_hash = bool(content_hash)
        self._options = dict(storage_options or {})
        fs, stripped = self._open_fs(entries)
        self._fs: Any = fs
        self._local = isinstance(fs, LocalFileSystem)
        pairs = list(zip(entries, stripped, strict=True))
        if self._local:
            found, bases = _resolve_local(fs, pairs)
        else:
            found, bases = _within_deadline(fs, entries, lambda: _resolve_remote(fs, pairs))
        base = _common_base(bases)
        named = sorted((_relative(path, base), path) for path in found)
        self._names = [name for name, _ in named]
        self._stripped = [path for _, path in named]
        self._paths = self._stripped if self._local else [fs.unstrip_protocol(p) for _, p in named]
        self._meta = None if self._content_hash else [self._describe(p, found[p]) for _, p in named]
        self._identity: dict[str, str] | None = None

    # -- sequence of paths ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Inputs: ...

    def __getitem__(self, i: int | slice) -> str | Inputs:
        """A file's path or URL; a slice gives the files it selects as an ``Inputs`` (a prefix
        of a corpus, ``files("data/*")[:500]``), with their names and identities as here."""
        if isinstance(i, slice):
            return self.take(range(len(self))[i])
        return self._paths[i]

    @property
    def names(self) -> list[str]:
        """The files' stable names (see the module documentation), in order."""
        return list(self._names)

    def take(self, positions: Iterable[int]) -> Inputs:
        """The files at ``positions`` (in that order) as an ``Inputs`` of their own: what a
        partition of a stage partitioned on this argument receives. Nothing is listed again.

        Raises
        ------
        IndexError
            If a position is out of range.
        """
        chosen = [operator.index(p) for p in positions]
        for p in chosen:
            if not -len(self) <= p < len(self):
                raise IndexError(f"Inputs.take: position {p} out of range for {len(self)} files")
        part = Inputs.__new__(Inputs)
        part.__dict__.update(self.__dict__)
        part._names = [self._names[p] for p in chosen]
        part._stripped = [self._stripped[p] for p in chosen]
        part._paths = [self._paths[p] for p in chosen]
        part._meta = None if self._meta is None else [self._meta[p] for p in chosen]
        known = self._identity
        part._identity = None if known is None else {n: known[n] for n in part._names}
        return part

    def __repr__(self) -> str:
        mode = "sha256" if self._content_hash else "metadata"
        return f"Inputs({reprlib.repr(self._declared)}, files={len(self)}, identity={mode})"

    # -- identity -------------------------------------------------------------------------------

    def identity(self) -> dict[str, str]:
        """Return ``{stable name: identity string}`` for every input (computed once, cached).

        Returns
        -------
        dict of str to str
            Sorted by name; see the module documentation for the rules.
        """
        if self._identity is None:
            values = self._meta if self._meta is not None else self._hash_all()
            self._identity = dict(zip(self._names, values, strict=True))
        return dict(self._identity)

    def __snapstore_inputs__(self) -> dict[str, str]:
        """Return :meth:`identity`: the hook the fingerprint hashes into its ``inputs`` part."""
        return self.identity()

    def __snapstore_key__(self) -> object:
        """Return the sorted identity items, for an ``Inputs`` nested inside another value."""
        return tuple(sorted(self.identity().items()))

    # -- pickling -------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None  # re-opened from the declaration and options when needed
        state["_identity"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- internals ------------------------------------------------------------------------------

    def _open_fs(self, entries: list[str]) -> tuple[Any, list[str]]:
        fs: Any = None
        stripped = []
        local: Any = None  # plain local paths skip url_to_fs: 10,000 calls would take 0.3 s
        for entry in entries:
            if local is not None and "://" not in entry and "::" not in entry:
                this, path = local, local._strip_protocol(entry)
            else:
                this, path = fsspec.core.url_to_fs(entry, **_with_timeouts(entry, self._options))
                if isinstance(this, LocalFileSystem) and "://" not in entry and "::" not in entry:
                    local = this
            if fs is not None and this != fs:
                raise ValueError(
                    f"files() entries must share one filesystem, but {entries[0]!r} and "
                    f"{entry!r} do not; declare one files() per store and pass each to the stage"
                )
            fs = this
            stripped.append(posixpath.normpath(path) if isinstance(fs, LocalFileSystem) else path)
        return fs, stripped

    def _filesystem(self) -> Any:
        if self._fs is None:
            first = self._declared if isinstance(self._declared, str) else self._declared[0]
            self._fs = fsspec.core.url_to_fs(first, **_with_timeouts(first, self._options))[0]
        return self._fs

    def _describe(self, path: str, info: Info) -> str:
        """The metadata identity string of one file."""
        if self._local:
            return f"size={info['size']};mtime_ns={info['mtime_ns']}"
        protocols = set(_protocols(self._fs))
        parts = [f"size={info.get('size')}"]
        if "memory" in protocols and info.get("created") is not None:
            created = info["created"]
            if isinstance(created, datetime.datetime):
                micros = (created - _EPOCH) // datetime.timedelta(microseconds=1)
            else:  # ls() gives a float timestamp where info() gives a datetime
                micros = round(float(created) * 1_000_000)
            return f"{parts[0]};created_us={micros}"
        if protocols & {"gs", "gcs"} and (info.get("generation") or info.get("crc32c")):
            keys: Iterable[str] = ("generation", "crc32c")
        elif protocols & {"s3", "s3a"} and (info.get("ETag") or info.get("etag")):
            etag = str(info.get("ETag") or info.get("etag")).strip('"')
            return f"{parts[0]};etag={etag}"
        else:
            keys = _GENERIC_KEYS
        parts += [f"{k}={_text(info[k])}" for k in keys if info.get(k) not in (None, "")]
        if len(parts) == 1:
            raise FingerprintError(
                f"cannot identify input {self._fs.unstrip_protocol(path)}: its store "
                f"({'/'.join(_protocols(self._fs))}) lists no version metadata (looked for "
                f"{', '.join(_GENERIC_KEYS)}; found {', '.join(sorted(info))}), so a rewrite of "
                "the same size would go unseen. Pass content_hash=True to files() to identify "
                "inputs by the sha256 of their bytes."
            )
        return ";".join(parts)

    def _hash_all(self) -> list[str]:
        fs = None if self._local else self._filesystem()
        if fs is None or "memory" in _protocols(fs):
            return [self._sha256(fs, p) for p in self._stripped]
        with ThreadPoolExecutor(_THREADS) as pool:
            return list(pool.map(lambda p: self._sha256(fs, p), self._stripped))

    def _sha256(self, fs: Any, path: str) -> str:
        url = path if fs is None else fs.unstrip_protocol(path)
        try:
            if fs is None:
                with open(path, "rb") as f:
                    return "sha256=" + hashlib.file_digest(f, "sha256").hexdigest()
            if "memory" in _protocols(fs):  # open() would share the file's position
                return "sha256=" + hashlib.sha256(fs.cat_file(path)).hexdigest()
            h = hashlib.sha256()
            with fs.open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
            return "sha256=" + h.hexdigest()
        except FileNotFoundError as exc:
            raise InputError(
                f"input {url} was listed but is gone now: it was removed while the inputs were "
                "being hashed; declare the inputs again once the data is stable"
            ) from exc
        except Exception as exc:
            raise StoreError(f"cannot read input {url} to hash it: {_why(exc)}") from exc


def files(
    paths_or_pattern: PathSpec | Sequence[PathSpec],
    *,
    content_hash: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> Inputs:
    """Declare the files or objects a stage reads, so their identity is part of its fingerprint.

    Parameters
    ----------
    paths_or_pattern : str, os.PathLike or sequence of them
        A glob, a file, a directory, or a list of these (local paths or fsspec URLs).
    content_hash : bool, default False
        Identify files by the sha256 of their bytes instead of size and version metadata.
    storage_options : mapping, optional
        fsspec options for the filesystem (credentials, endpoint).

    Returns
    -------
    Inputs
        The listed files; pass it to the stage as an argument and iterate it there.

    Examples
    --------
    >>> images = files("data/train/**/*.jpg")  # doctest: +SKIP
    >>> snapshot(decode)(images, size=224)  # doctest: +SKIP
    """
    return Inputs(paths_or_pattern, content_hash=content_hash, storage_options=storage_options)


# -- listing ------------------------------------------------------------------------------------

Found = dict[str, Info]


def _declared(spec: object) -> str | list[str]:
    if isinstance(spec, str | os.PathLike):
        return _one(spec)
    if isinstance(spec, bytes | bytearray) or not isinstance(spec, Iterable):
        raise TypeError(
            f"files() expects a path, glob or URL (str or os.PathLike) or a list of them, "
            f"not {type(spec).__name__}"
        )
    return [_one(item) for item in spec]


def _one(item: object) -> str:
    if isinstance(item, str | os.PathLike):
        text = os.fspath(item)
        if isinstance(text, str):
            return text
    raise TypeError(f"files() entries must be str or os.PathLike[str], not {item!r}")


def _resolve_local(_fs: Any, entries: list[tuple[str, str]]) -> tuple[Found, list[str]]:
    found: Found = {}
    bases: list[str] = []
    missing: list[str] = []
    empty: list[str] = []
    for entry, path in entries:
        if _MAGIC.search(path):
            root, depth = _glob_root(path)
            hits = _walk(root, re.compile(glob_translate(path)), depth)
            bases.append(root)
        else:
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                missing.append(entry)
                continue
            except OSError as exc:
                raise StoreError(f"cannot read input {path}: {_why(exc)}") from exc
            if stat.S_ISDIR(st.st_mode):
                hits = _walk(path, None, None)
                bases.append(path)
            else:
                hits = {path: _stat_info(st)}
                bases.append(_parent(path))
        if not hits:
            empty.append(entry)
        found.update(hits)
    _check(missing, empty)
    return found, bases


def _walk(root: str, pattern: re.Pattern[str] | None, maxdepth: int | None) -> Found:
    """Regular files under a local directory (symlinks followed, loops skipped), one scandir
    per directory and one stat per file."""
    out: Found = {}
    try:
        top = os.stat(root)
    except (FileNotFoundError, NotADirectoryError):
        return out
    stack: list[tuple[str, int, frozenset[tuple[int, int]]]] = [
        (root, 1, frozenset({(top.st_dev, top.st_ino)}))
    ]
    while stack:
        folder, depth, seen = stack.pop()
        prefix = folder if folder.endswith("/") else folder + "/"
        try:
            with os.scandir(folder) as it:
                items = list(it)
        except OSError as exc:
            raise StoreError(f"cannot list local directory {folder}: {_why(exc)}") from exc
        for item in items:
            path = prefix + item.name
            try:
                if item.is_dir():
                    if maxdepth is None or depth < maxdepth:
                        st = item.stat()
                        key = (st.st_dev, st.st_ino)
                        if key not in seen:  # a symlink to an enclosing directory is a loop
                            stack.append((path, depth + 1, seen | {key}))
                    continue
                if pattern is not None and pattern.match(path) is None:
                    continue
                st = item.stat()
            except FileNotFoundError as exc:
                raise InputError(
                    f"input {path} cannot be read: it is a broken symbolic link or was removed "
                    "while listing; fix or remove it, or narrow the glob"
                ) from exc
            if stat.S_ISREG(st.st_mode):
                out[path] = _stat_info(st)
    return out


def _stat_info(st: os.stat_result) -> Info:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _with_timeouts(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the client's own connect and read timeouts set from the stores'
    deadline (:class:`~snapstore.storage.retry.RetryPolicy`), unless they set them."""
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    return client_options(protocol, options, RetryPolicy().timeout)


def _within_deadline(fs: Any, entries: list[str], fn: Callable[[], T]) -> T:
    """``fn()`` (the listing of remote entries), or :class:`StoreTimeoutError` once the
    stores' deadline has passed without an answer (the client's own retries included)."""
    seconds = RetryPolicy().timeout
    start = time.monotonic()
    try:
        return call_with_deadline(fn, seconds)
    except TryAbandoned:
        protocol = _protocols(fs)[0]
        waited = time.monotonic() - start
        raise StoreTimeoutError(
            f"files(): listing {reprlib.repr(entries)} got no answer from "
            f"{endpoint_of(fs, protocol)} in {waited:.0f} s. Check the endpoint and the "
            f"network, or wait longer with ${STORE_TIMEOUT_ENV}=<seconds>",
            endpoint=endpoint_of(fs, protocol),
            waited=waited,
        ) from None


def _resolve_remote(fs: Any, entries: list[tuple[str, str]]) -> tuple[Found, list[str]]:
    fs.invalidate_cache()  # a stale listing cache would hide changed inputs
    found: Found = {}
    bases: list[str] = []
    missing: list[str] = []
    empty: list[str] = []
    plain = []
    for entry, path in entries:
        if _MAGIC.search(path):
            bases.append(_glob_root(path)[0])
            hits = _only_files(_listing(fs, fs.glob, path, entry))
            if not hits:
                empty.append(entry)
            found.update(hits)
        else:
            plain.append((entry, path))
    infos = _infos(fs, [path for _, path in plain])
    for entry, path in plain:
        info = infos.get(path)
        if info is None:
            missing.append(entry)
        elif info.get("type") == "directory":
            bases.append(path)
            hits = _only_files(_listing(fs, fs.find, path, entry))
            if not hits:
                empty.append(entry)
            found.update(hits)
        else:
            bases.append(_parent(path))
            found[path] = info
    _check(missing, empty)
    return found, bases


def _listing(fs: Any, method: Callable[..., Any], path: str, entry: str) -> Any:
    try:
        return method(path, detail=True)
    except FileNotFoundError:
        return {}
    except Exception as exc:
        raise StoreError(f"cannot list inputs {entry!r}: {_why(exc)}") from exc


def _only_files(listing: Any) -> Found:
    items = listing.values() if isinstance(listing, Mapping) else listing
    return {info["name"]: info for info in items if info.get("type") == "file"}


def _infos(fs: Any, paths: list[str]) -> dict[str, Info | None]:
    """Metadata of explicitly listed remote paths: one listing per parent holding many of them,
    one request per other path; None for a path that does not exist."""
    groups: dict[str, list[str]] = {}
    for path in dict.fromkeys(paths):
        groups.setdefault(_parent(path), []).append(path)
    out: dict[str, Info | None] = {}
    single: list[str] = []
    for parent, members in groups.items():
        if len(members) < _LIST_PARENT_AT:
            single += members
            continue
        listed = {str(i["name"]).rstrip("/"): i for i in _listing(fs, fs.ls, parent, parent) or ()}
        for path in members:
            if listed.get(path, {}).get("type") == "file":
                out[path] = listed[path]
            else:  # a directory, or not in the listing: ask for it directly
                single.append(path)

    def info(path: str) -> Info | None:
        try:
            result: Info = fs.info(path)
            return result
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise StoreError(f"cannot read input {fs.unstrip_protocol(path)}: {_why(exc)}") from exc

    if "memory" in _protocols(fs) or len(single) < 2:
        out.update((path, info(path)) for path in single)
    else:
        with ThreadPoolExecutor(_THREADS) as pool:
            out.update(zip(single, pool.map(info, single), strict=True))
    return out


def _check(missing: list[str], empty: list[str]) -> None:
    problems = []
    if missing:
        problems.append(f"{len(missing)} path(s) do not exist: {_some(missing)}")
    if empty:
        problems.append(f"{len(empty)} glob(s) or directory(ies) hold no files: {_some(empty)}")
    if problems:
        raise InputError(
            "expected every declared input to exist and every glob or directory to hold at least "
            f"one file, but {'; '.join(problems)}. Check the paths (relative ones are resolved "
            "against the working directory) or remove the entries"
        )


# -- paths --------------------------------------------------------------------------------------


def _glob_root(path: str) -> tuple[str, int | None]:
    """The non-magic directory of a glob, and how deep below it matches can lie (fsspec's rule)."""
    match = _MAGIC.search(path)
    first = match.start() if match else len(path)
    slash = path.rfind("/", 0, first)
    root = path[:slash] if slash > 0 else ("/" if slash == 0 else "")
    depth = None if "**" in path else path[slash + 1 :].count("/") + 1
    return root, depth


def _parent(path: str) -> str:
    head = path.rstrip("/").rpartition("/")[0]
    return head or ("/" if path.startswith("/") else "")


def _common_base(bases: list[str]) -> str:
    split = [b.rstrip("/").split("/") if b != "/" else [""] for b in sorted(set(bases))]
    common = split[0]
    for parts in split[1:]:
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return "/" if common == [""] else "/".join(common)


def _relative(path: str, base: str) -> str:
    if not base:
        return path
    prefix = base if base.endswith("/") else base + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _text(value: Any) -> str:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, float):
        return repr(value)
    return str(value).strip('"')


def _some(items: list[str]) -> str:
    shown = ", ".join(repr(i) for i in items[:_SHOWN])
    return shown + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _why(exc: BaseException) -> str:
    return (
        f"{type(exc).__name__}: {exc}. Check the path or URL, the credentials in "
        "storage_options, and the network; nothing was fingerprinted"
    )
