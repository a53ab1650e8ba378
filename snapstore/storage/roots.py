"""Roots before they become stores: the default root, and checks for mistakes that would
otherwise pass silently.

:func:`check_root` is the one check of what a root may be, run where a root is accepted (the
stage's options, :func:`~snapstore.storage.store.open_store` and so ``snapstore.open``, the
datasets and the manage functions through it, the CLI's ``--root``): a str or ``os.PathLike``
path or URL, a :class:`~snapstore.storage.base.Store`, or None for :func:`default_root`. An empty
string would write into the working directory; a number or bytes would fail later, far from the
``root=`` that caused it, with a message that does not name it.

A local root that is a file would list as empty ("no snapshots under ./afile") and fail on the
first write; one that starts like a URL with a mistyped separator (``s3:/bucket/snaps``) would
become a directory named ``s3:`` under the working directory, where nobody looks for training
data. Both are refused with a message that says what to write instead.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path

from ..errors import StoreError
from .base import Store

__all__ = ["check_root", "default_root", "refuse_file_root", "refuse_mistyped_url"]

_EXPECTED = (
    "expected a local path (str or os.PathLike), a URL such as 'gs://bucket/snaps', a "
    "snapstore Store, or None for the default root"
)


def check_root(root: object, name: str = "root") -> None:
    """Raise if ``root`` cannot be a root; the message names ``name`` (``root``, ``--root``).

    Raises
    ------
    TypeError
        If ``root`` is not None, a str, an ``os.PathLike`` of str or a Store (a number, bytes,
        a path of bytes...).
    ValueError
        If ``root`` is an empty (or blank) string or path.

    Examples
    --------
    >>> check_root("gs://bucket/snaps")
    >>> check_root(123)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    TypeError: root: expected a local path (str or os.PathLike), ...; found int 123
    """
    if root is None or isinstance(root, Store):
        return
    if isinstance(root, (bytes, bytearray)) or (
        isinstance(root, os.PathLike) and isinstance(os.fspath(root), bytes)
    ):
        text = os.fsdecode(os.fspath(root) if isinstance(root, os.PathLike) else bytes(root))
        raise TypeError(
            f"{name}: {_EXPECTED}; found {type(root).__name__} {root!r}: pass the path as a "
            f"str ({text!r})"
        )
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"{name}: {_EXPECTED}; found {type(root).__name__} {root!r}")
    if not os.fspath(root).strip():
        raise ValueError(
            f"{name}: {_EXPECTED}; found {root!r}, an empty path, which would put snapshots in "
            "the working directory: pass '.' for the working directory, or leave the root out "
            "for the default ($SNAPSTORE_ROOT, else the per-user cache directory)"
        )


def default_root() -> str:
    """``$SNAPSTORE_ROOT``, else the per-user cache directory (``~/.cache/snapstore`` on Linux)."""
    env = os.environ.get("SNAPSTORE_ROOT")
    if env:
        return env
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return str(base / "snapstore")


def refuse_file_root(given: str, root: Path) -> None:
    """Raise StoreError if ``root`` or a directory above it is not a directory (a file)."""
    for path in (root, *root.parents):
        try:
            is_dir = path.is_dir()
        except OSError:  # unreadable: the first real operation says why
            return
        if is_dir:
            return
        if path.exists() or path.is_symlink():
            what = "is" if path == root else f"is under {path}, which is"
            err = StoreError(
                f"cannot use {given} as a snapstore root: expected a directory (or a path "
                f"that does not exist yet, to be created), but {root} {what} a "
                f"{'file' if path.is_file() else 'broken link or special file'}; pass a "
                "directory as the root (root=, --root or $SNAPSTORE_ROOT)"
            )
            err.errno = errno.ENOTDIR
            raise err


# A first path component ``word:`` (two characters or more: ``C:`` is a Windows drive).
_SCHEME_LIKE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(.*)", re.DOTALL)


def refuse_mistyped_url(text: str) -> None:
    """Raise StoreError for a local root that starts like a URL (``s3:/bucket``): it would
    silently become a directory named ``s3:`` under the working directory."""
    match = _SCHEME_LIKE.fullmatch(text)
    if match is None:
        return
    scheme, rest = match.groups()
    rest = rest.replace("\\", "/").lstrip("/")
    meant = f"file:///{rest}" if scheme.lower() == "file" else f"{scheme}://{rest}"
    raise StoreError(
        f"cannot open store {text!r}: expected a URL (scheme://...) or a local path, found "
        f"a path that starts with {scheme + ':'!r}, a URL scheme missing its '//'; did you "
        f"mean {meant!r}? For a local directory of that name, write {'./' + text!r}"
    )
