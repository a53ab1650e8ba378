"""Opening a store for a root: a local path, a ``file://`` URL or any fsspec URL.

:func:`open_store` picks the backend: :class:`~snapstore.storage.local.LocalStore` for a local
root, :class:`~snapstore.storage.webhdfs.WebHDFSStore` for ``webhdfs://`` (through
:data:`KNOWN_OPENERS`, imported on first use), and
:class:`~snapstore.storage.fsspec_store.FsspecStore` for any other URL. The contract every store
keeps is :class:`~snapstore.storage.base.Store`; its one commit primitive,
:meth:`~snapstore.storage.base.Store.create_if_absent`, is atomic on a local filesystem (a temp
file and ``os.link``), on GCS (``ifGenerationMatch=0``), on S3 (``If-None-Match: *``), in
fsspec's memory filesystem (a process-wide lock) and over WebHDFS (``overwrite=false``); see
:data:`ATOMIC_CREATE_PROTOCOLS`. Elsewhere (``hdfs://``) the store warns once.

Errors are translated at the boundary, in each backend: a missing file stays
``FileNotFoundError`` (the reader and the commit protocol rely on it); an fsspec store retries
transient failures (timeouts, resets, HTTP 429 and 5xx) under a :class:`RetryPolicy`; anything
else becomes :class:`~snapstore.errors.StoreError` naming the URL and what to check. This module
also exports the stores and :class:`RetryPolicy`, where code has imported them from.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ..errors import StoreError
from .base import Store
from .deadline import client_options
from .fsspec_store import ATOMIC_CREATE_PROTOCOLS, FsspecStore
from .local import LocalStore
from .retry import RetryPolicy
from .roots import check_root, default_root, refuse_mistyped_url

__all__ = [
    "ATOMIC_CREATE_PROTOCOLS",
    "FsspecStore",
    "KNOWN_OPENERS",
    "LocalStore",
    "RetryPolicy",
    "Store",
    "StoreLike",
    "as_store",
    "default_root",
    "open_store",
]

_LISTING_CACHES = ("gs", "gcs", "s3", "s3a")  # drivers that keep fsspec's listings cache
# Stores of modules beside this one that build on it, by protocol, as "module:function" imported
# on first use (as fsspec's known_implementations), so that this module does not import them.
KNOWN_OPENERS = dict.fromkeys(("webhdfs", "swebhdfs"), "snapstore.storage.webhdfs:open_webhdfs")


StoreLike = Store | str | os.PathLike[str]
"""What functions that work on a store take: the Store, or a root to open (see
:func:`as_store`)."""

_EXTRAS = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "s3a": "s3"}


def _gcs_endpoint(storage_options: dict[str, Any]) -> bool:
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    return "endpoint_url" in storage_options or emulator not in ("", "default")


def open_store(
    root: str | os.PathLike[str] | Store | None = None,
    *,
    retry: RetryPolicy | None = None,
    **storage_options: Any,
) -> Store:
    """The store for a root.

    Parameters
    ----------
    root : str, PathLike, Store or None
        A Store passes through. A local path or ``file://`` URL gives a :class:`LocalStore`;
        any other fsspec URL (``gs://bucket/prefix``, ``s3://...``, ``memory://...``) an
        :class:`FsspecStore`, ``webhdfs://`` and ``swebhdfs://`` a
        :class:`~snapstore.storage.webhdfs.WebHDFSStore`. None means :func:`default_root`.
    retry : RetryPolicy, optional
        How an FsspecStore retries transient failures and how long one operation may take
        (``timeout``: 60 s, or ``$SNAPSTORE_STORE_TIMEOUT``); ignored for local roots, which
        do not retry.
    **storage_options
        Passed to the fsspec filesystem (``endpoint_url=``, ``token=``, ``key=``...), or to
        :class:`LocalStore` for a local root (``fsync=``). For GCS, S3 and WebHDFS the
        client's connect and read timeouts are added from ``retry.timeout`` unless given here
        (gcsfs ``requests_timeout``, s3fs ``config_kwargs`` ``connect_timeout`` and
        ``read_timeout``, WebHDFS ``timeout``); see :mod:`snapstore.storage.deadline`.

    Raises
    ------
    TypeError
        If ``root`` is not a str, PathLike, Store or None (a number, bytes).
    ValueError
        If ``root`` is an empty string.
    StoreError
        If the protocol's fsspec driver is not installed, or the URL or options are invalid;
        if a local root is a file (or lies under one); if a local root starts like a URL with
        a mistyped separator (``s3:/bucket``, ``gs:bucket``: any ``word:`` of two letters or
        more as its first component, so not a drive letter such as ``C:``).

    Notes
    -----
    ``gs://`` with an ``endpoint_url`` (or ``$STORAGE_EMULATOR_HOST``) gets
    ``gcsfs.core.GCSFileSystem``, not gcsfs' default extended class: that class first asks the
    endpoint over gRPC for the bucket's layout, which an emulator or a plain HTTP endpoint never
    answers (every operation waited about 60 s). Without an endpoint the extended class (zonal
    and hierarchical buckets) is kept. No environment variable is ever set.
    """
    check_root(root)
    if isinstance(root, Store):
        return root
    text = os.fspath(root) if root is not None else default_root()
    if "://" not in text or text.startswith("file://"):
        if "://" not in text:
            refuse_mistyped_url(text)
        return LocalStore(text.removeprefix("file://"), **storage_options)
    protocol = text.split("://", 1)[0]
    if protocol.lower() in KNOWN_OPENERS:
        module, _, opener = KNOWN_OPENERS[protocol.lower()].partition(":")
        return getattr(importlib.import_module(module), opener)(  # type: ignore[no-any-return]
            text, retry=retry, **storage_options
        )
    policy = retry if retry is not None else RetryPolicy()
    try:
        fs, path = _filesystem(text, protocol, storage_options, policy)
    except ImportError as exc:
        extra = _EXTRAS.get(protocol)
        install = (
            f"pip install 'snapstore[{extra}]'"
            if extra
            else f"install the fsspec driver for {protocol}://"
        )
        raise StoreError(f"cannot open store {text!r}: {exc}; {install}") from exc
    except (ValueError, TypeError, OSError) as exc:
        raise StoreError(
            f"cannot open store {text!r}: {exc}; check the URL and the storage options"
        ) from exc
    store = FsspecStore(fs, path, retry=policy)
    store.url = text.rstrip("/")  # as given, host included (webhdfs://namenode:9870/snaps)
    return store


def _filesystem(
    text: str, protocol: str, storage_options: dict[str, Any], policy: RetryPolicy
) -> tuple[Any, str]:
    """The fsspec filesystem for URL ``text`` and the path in it, its client's timeouts set
    from ``policy``; GCS's with snapstore's request retries (:mod:`snapstore.storage.gcs`)."""
    options = client_options(protocol, storage_options, policy.timeout)
    if protocol.lower() in _LISTING_CACHES:
        # A listing cached by the driver makes s3fs answer "no such file" for a file another
        # process wrote since (its cat_file and info look there first): never cache one.
        options.setdefault("use_listings_cache", False)
    if protocol in ("gs", "gcs"):
        from .gcs import gcs_filesystem  # imports gcsfs

        fs = gcs_filesystem(options, policy, extended=not _gcs_endpoint(storage_options))
        return fs, fs._strip_protocol(text)
    import fsspec

    found: tuple[Any, str] = fsspec.core.url_to_fs(text, **options)
    return found


def as_store(root: StoreLike, name: str = "store") -> Store:
    """``root`` as a Store: a Store passes through, a path or URL is opened with
    :func:`open_store` (no storage options). For functions that take a store, so that they
    take a root too, checked as every root is (the message names ``name``).

    Raises
    ------
    TypeError, ValueError
        If ``root`` is None or not a root (see :func:`~snapstore.storage.roots.check_root`).
    StoreError
        As for :func:`open_store`.
    """
    if isinstance(root, Store):
        return root
    if root is None:
        raise TypeError(f"{name}: expected a Store, a local path or a URL, found None")
    check_root(root, name)
    return open_store(root)
