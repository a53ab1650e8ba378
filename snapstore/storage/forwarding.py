"""A filesystem that passes every call to another one, one hook per request: the base of the
simulated bucket's wrappers.

:class:`ForwardingFileSystem` holds, once, the fsspec methods that
:class:`~snapstore.storage.simulate.LatencyFileSystem` (latency) and
:class:`~snapstore.storage.faults.FaultFileSystem` (faults) pass to their target ``fs``. A
subclass says what a request costs or how it fails in two hooks: ``_send`` (every request but
a read) and ``_read`` (a whole-file or ranged read). The docstrings say how many requests each
call is, as a remote bucket serves it: what both wrappers count. Making directories and
clearing a cache are no request: they go straight to the target.

Instances are never cached (``cachable = False``): each holds its own counters. Pickling is
fsspec's own (``__reduce__`` builds a new instance from the arguments it was made with), so a
wrapper reaches DataLoader workers and engines with fresh counters.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

import fsspec
from fsspec.spec import AbstractBufferedFile
from fsspec.utils import stringify_path

__all__ = ["ForwardingFileSystem"]

T = TypeVar("T")


class _ForwardingFile(AbstractBufferedFile):  # type: ignore[misc]
    """A file opened for reading: each cache miss is one ranged request, as with gcsfs or s3fs
    (it goes through the wrapper's ``cat_file``)."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        data: bytes = self.fs.cat_file(self.path, start=start, end=end)
        return data


class ForwardingFileSystem(fsspec.AbstractFileSystem):  # type: ignore[misc]
    """An fsspec filesystem that passes every call to another one, each request through
    :meth:`_send` or :meth:`_read`.

    Paths are the target's paths; a leading one of ``url_prefixes`` (the subclass's
    ``protocol://``) is stripped.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The target filesystem, checked by the subclass.
    **storage_options
        Passed to ``fsspec.AbstractFileSystem``.

    Notes
    -----
    A subclass defines ``protocol``, ``url_prefixes``, :meth:`_send` and :meth:`_read`, and
    may define :meth:`_open_writer` (how a file opened for writing is requested),
    :meth:`_check_ranges` and :meth:`_gather` (what ``cat_ranges`` refuses, and whether its
    requests run in parallel: by default one after another).
    """

    # Each instance holds its own counters (and settings): never hand out a cached one.
    cachable = False
    url_prefixes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, fs: Any, **storage_options: Any) -> None:
        super().__init__(**storage_options)
        self.fs: Any = fs

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(stringify_path(path))
        for prefix in cls.url_prefixes:
            if text.startswith(prefix):
                return text[len(prefix) :]
        return text  # the target normalizes its own paths

    # -- the hooks ---------------------------------------------------------------------------

    def _send(self, name: str, path: str, call: Callable[[], T], *, sent: int = 0) -> T:
        """One request ``name`` on the target's ``path``, made by ``call``, uploading ``sent``
        bytes."""
        raise NotImplementedError(f"{type(self).__name__} does not say how a request is sent")

    def _read(
        self, path: str, start: int | None, end: int | None, call: Callable[[], bytes]
    ) -> bytes:
        """One read request of the target's ``path``, ``[start:end)``, made by ``call``."""
        raise NotImplementedError(f"{type(self).__name__} does not say how a read is sent")

    def _open_writer(self, path: str, mode: str, options: dict[str, Any]) -> Any:
        """One request: the target's file ``path`` opened with ``mode`` (not ``"rb"``)."""
        return self._forward("open", path, mode, **options)

    def _forward(self, method: str, path: Any, *args: Any, sent: int = 0, **kwargs: Any) -> Any:
        """One request: the target's ``method`` on the target's path."""
        target = self._strip_protocol(path)
        return self._send(
            method, target, lambda: getattr(self.fs, method)(target, *args, **kwargs), sent=sent
        )

    # -- reads -------------------------------------------------------------------------------

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """One request for the bytes ``[start:end)`` (negative: from the end), as slices."""
        target = self._strip_protocol(path)
        return self._read(
            target, start, end, lambda: self.fs.cat_file(target, start=start, end=end, **kwargs)
        )

    def cat_ranges(
        self,
        paths: list[str],
        starts: list[int | None] | int | None,
        ends: list[int | None] | int | None,
        max_gap: int | None = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> list[bytes | Exception]:
        """One request per range, through :meth:`cat_file`, as :meth:`_gather` issues them;
        no ranges are merged (``max_gap`` is for :meth:`_check_ranges` to refuse)."""
        self._check_ranges(paths, starts, ends, max_gap)
        starts = starts if isinstance(starts, list) else [starts] * len(paths)
        ends = ends if isinstance(ends, list) else [ends] * len(paths)

        def one(path: str, start: int | None, end: int | None) -> bytes | Exception:
            try:
                return self.cat_file(path, start, end, **kwargs)
            except Exception as exc:
                if on_error == "return":
                    return exc
                raise

        ranges = zip(paths, starts, ends, strict=True)
        return self._gather(functools.partial(one, *args) for args in ranges)

    def _check_ranges(self, paths: Any, starts: Any, ends: Any, max_gap: int | None) -> None:
        """Refuse what :meth:`cat_ranges` should not be asked; by default, nothing."""

    def _gather(self, reads: Iterable[Callable[[], bytes | Exception]]) -> list[bytes | Exception]:
        """The result of each of ``reads``, one after another."""
        return [read() for read in reads]

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        if mode == "rb":
            return _ForwardingFile(
                self, path, mode, block_size, autocommit, cache_options=cache_options, **kwargs
            )
        return self._open_writer(
            path, mode, dict(kwargs, block_size=block_size, autocommit=autocommit)
        )

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """One request: the target's ``info``."""
        return dict(self._forward("info", path, **kwargs))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """One request: the target's listing."""
        return list(self._forward("ls", path, detail=detail, **kwargs))

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        """One request (a recursive listing)."""
        return self._forward(
            "find", path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs
        )

    def exists(self, path: str, **kwargs: Any) -> bool:
        """One request."""
        return bool(self._forward("exists", path, **kwargs))

    def isdir(self, path: str) -> bool:
        """One request."""
        return bool(self._forward("isdir", path))

    def isfile(self, path: str) -> bool:
        """One request."""
        return bool(self._forward("isfile", path))

    def modified(self, path: str) -> Any:
        """One request."""
        return self._forward("modified", path)

    # -- writes: passed through; each costs a request ----------------------------------------

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """One upload of ``len(value)`` bytes; ``mode="create"`` raises FileExistsError if the
        file exists."""
        self._forward("pipe_file", path, value, mode=mode, sent=len(value), **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Free: object stores have no directories, so making one sends no request."""
        self.fs.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Free, as :meth:`makedirs`."""
        self.fs.mkdir(self._strip_protocol(path), create_parents=create_parents, **kwargs)

    def rm(self, path: str, recursive: bool = False, maxdepth: int | None = None) -> None:
        """One request (a batch delete)."""
        self._forward("rm", path, recursive=recursive, maxdepth=maxdepth)

    def rm_file(self, path: str) -> None:
        """One request."""
        self._forward("rm_file", path)

    def rmdir(self, path: str) -> None:
        """One request."""
        self._forward("rmdir", path)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """One request (a server-side copy)."""
        self._forward("cp_file", path1, self._strip_protocol(path2), **kwargs)

    def invalidate_cache(self, path: str | None = None) -> None:
        """Clear the target's listings cache; no request."""
        self.fs.invalidate_cache(path)
