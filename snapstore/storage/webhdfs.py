"""HDFS over its REST API (WebHDFS, HttpFS): a store whose commit is atomic on the NameNode.

Everything but the calls below goes through fsspec's ``WebHDFS``; these are made by
:class:`_WebHDFS`, its subclass here, and serve any store over it (the latency simulator's too):

- **create-if-absent**: the bytes are written under a temporary name beside the target with
  ``CREATE`` (the API's two steps: a ``PUT`` to the NameNode, which answers ``307`` with a
  DataNode's address, then the ``PUT`` of the data there), then renamed (``RENAME``) onto the
  target. The NameNode renames under its namespace lock and refuses an existing destination
  (``{"boolean": false}``), so of two creators of one name exactly one succeeds; and since
  HDFS shows a file while it is written (empty, then growing, until its writer closes it), the
  rename is what keeps a reader from ever seeing a record that is not whole. fsspec's ``mv``
  says nothing when the destination exists, so it cannot be used.
- **range reads**: one ``OPEN`` with ``offset`` and ``length`` (fsspec's ``cat_file`` first asks
  ``GETFILESTATUS`` for the size, then reads ahead up to 5 MiB past the range).
- **whole reads**: one ``OPEN``, and whole writes one ``CREATE`` (fsspec: ``CREATE`` empty,
  then ``APPEND``).
- **removing an empty directory** (:meth:`WebHDFSStore.remove_empty_dir`): ``DELETE`` with
  ``recursive=false``, which the NameNode refuses for a non-empty one in the same step.

Errors: the NameNode's and the DataNode's error JSON names a Java exception
(``{"RemoteException": {"exception": "SafeModeException", ...}}``); it is raised as an
``OSError`` whose ``remote_exception`` is that name (a ``FileNotFoundError``,
``FileExistsError`` or ``PermissionError`` where the meaning is that), which
:mod:`snapstore.storage.retry` sorts: safe mode, a standby NameNode and ``RetriableException`` are
retried, quotas and permissions reported with what to check. The ``requests`` session is
shared by the prefetcher's threads; its connection pool holds 64 connections per host (the
prefetcher's most requests in flight) so that none is opened and dropped per request. Every
request it sends, fsspec's own included, has the ``timeout=(connect, read)`` of the storage
options (set by :func:`open_webhdfs` from the retry policy's deadline; ``requests`` waits
forever without one).
"""

from __future__ import annotations

import contextlib
import errno
import time
import uuid
from typing import Any
from urllib.parse import quote

import requests.adapters
from fsspec.implementations.webhdfs import WebHDFS

from ..errors import StoreError
from .deadline import client_options
from .retry import RetryPolicy, vanished_error
from .store import FsspecStore

__all__ = ["WebHDFSStore", "open_webhdfs"]

_POOL = 64  # connections kept per host: the prefetcher's most requests in flight
_PROTOCOLS = ("webhdfs", "swebhdfs")
_BUILTIN: dict[str, tuple[type[OSError], int]] = {
    "FileNotFoundException": (FileNotFoundError, errno.ENOENT),
    "FileAlreadyExistsException": (FileExistsError, errno.EEXIST),
    # A create of a file another client is still writing (HDFS checks the lease before it
    # says "exists"); after its writer died, lease recovery starts: the name is taken either way.
    "AlreadyBeingCreatedException": (FileExistsError, errno.EEXIST),
    "RecoveryInProgressException": (FileExistsError, errno.EEXIST),
    "AccessControlException": (PermissionError, errno.EACCES),
    "SecurityException": (PermissionError, errno.EACCES),
    "AuthorizationException": (PermissionError, errno.EACCES),
}
# What to check, by the NameNode's exception, once the retries (if any) are spent.
_REMOTE_HINTS = {
    "SafeModeException": "the NameNode is in safe mode (starting up, or low on space); wait "
    "until it leaves (hdfs dfsadmin -safemode get) or ask the cluster's administrators",
    "RetriableException": "the NameNode asked to try again later (often safe mode at start "
    "up); wait, or check hdfs dfsadmin -safemode get",
    "AccessControlException": "check the HDFS permissions of the path and the directories "
    "above it for this user (the user= storage option, or webhdfs://USER@namenode:port/...)",
    "StandbyException": "this NameNode is the standby one; use the address of the active "
    "NameNode (hdfs haadmin -getAllServiceState): WebHDFS does not fail over",
}
# How long a record found to hold a beginning of this writer's bytes is watched for the rest:
# HDFS shows a file while it is written (a record of a few hundred bytes: milliseconds).
_SETTLE_SECONDS = 2.0
_NO_NAMENODE = (
    "check host:port (the NameNode's HTTP port: 9870 on Hadoop 3, 50070 on Hadoop 2) and that "
    "WebHDFS is enabled (dfs.webhdfs.enabled)"
)


def _remote_error(response: Any) -> OSError | None:
    """The RemoteException in an error response, as an OSError; None if it has none."""
    try:
        remote = response.json()["RemoteException"]
        name, message = str(remote["exception"]), str(remote.get("message", ""))
    except (ValueError, KeyError, TypeError):
        return None
    builtin, code = _BUILTIN.get(name, (OSError, errno.EIO))
    if "QuotaExceeded" in name:
        code = errno.EDQUOT
    err = builtin(code, f"{name}: {message}")
    err.remote_exception = name  # type: ignore[attr-defined]
    return err


def _check(response: Any) -> Any:
    """``response``, or its RemoteException (else its HTTP error) raised."""
    if response.status_code >= 400:
        err = _remote_error(response)
        if err is not None:
            raise err
        response.raise_for_status()
    return response


class _TimeoutAdapter(requests.adapters.HTTPAdapter):
    """A ``requests`` adapter that sends with ``timeout`` (seconds, or ``(connect, read)``)
    every request that names none: fsspec's WebHDFS names none."""

    def __init__(self, timeout: Any, **kwargs: Any) -> None:
        self.timeout = timeout
        super().__init__(**kwargs)

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.timeout
        return super().send(request, *args, **kwargs)


class _WebHDFS(WebHDFS):  # type: ignore[misc]
    """fsspec's WebHDFS with the NameNode's exception names kept in its errors (fsspec turns
    most into a bare ``RuntimeError(message)``), a connection pool for many threads, and a
    ``timeout`` option (seconds, or ``(connect, read)``) for every request it sends."""

    protocol = _PROTOCOLS

    def __init__(self, *args: Any, timeout: Any = None, **kwargs: Any) -> None:
        self.request_timeout = tuple(timeout) if isinstance(timeout, list) else timeout
        super().__init__(*args, **kwargs)

    def _connect(self) -> None:
        super()._connect()
        # A pool per host (the NameNode and every DataNode reads are redirected to), each of
        # _POOL connections: with fewer host pools than DataNodes, pools are evicted and closed.
        adapter = _TimeoutAdapter(self.request_timeout, pool_connections=_POOL, pool_maxsize=_POOL)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def _call(
        self,
        op: str,
        method: str = "get",
        path: str | None = None,
        data: Any = None,
        redirect: bool = True,
        **kwargs: Any,
    ) -> Any:
        path = self._strip_protocol(path) if path is not None else ""
        url = self._apply_proxy(self.url + quote(path, safe="/="))
        params = {**kwargs, **self.pars, "op": op.upper()}
        response = self.session.request(
            method.upper(), url, params=params, data=data, allow_redirects=redirect
        )
        return _check(response)

    # snapstore.storage.store: pipe_file(mode="create") is atomic here, so commits may use it.
    snapstore_atomic_create = True

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Write a whole file in one ``CREATE`` (two steps). ``mode="create"`` writes it under a
        temporary name beside ``path``, then renames (``RENAME``) it there: the NameNode refuses a
        rename onto an existing name (``{"boolean": false}``: FileExistsError), and a reader
        never sees the file before it is whole (HDFS shows a file being written, empty or in
        part, until its writer closes it)."""
        if mode != "create":
            self._create(path, value, overwrite="true", **kwargs)
            return
        parent, _, name = self._strip_protocol(path).rpartition("/")
        temporary = f"{parent}/.{name}.{uuid.uuid4().hex[:16]}.tmp"
        self._create(temporary, value, overwrite="false", **kwargs)
        try:
            moved = self._call("RENAME", "put", temporary, destination=self._strip_protocol(path))
            if moved.json().get("boolean") is True:
                return
        except BaseException:
            with contextlib.suppress(Exception):
                self._call("DELETE", "delete", temporary, recursive="false")
            raise
        with contextlib.suppress(Exception):
            self._call("DELETE", "delete", temporary, recursive="false")
        raise FileExistsError(errno.EEXIST, f"{path} exists (RENAME onto it refused)", path)

    def _create(self, path: str, value: bytes, **params: Any) -> None:
        first = self._call("CREATE", "put", path, redirect=False, **params)
        location = first.headers.get("Location")
        if location is None:  # a NameNode always redirects CREATE to a DataNode
            raise OSError(errno.EIO, f"CREATE answered {first.status_code} with no Location")
        response = self.session.put(
            self._apply_proxy(location),
            data=bytes(value),
            headers={"content-type": "application/octet-stream"},
        )
        _check(response)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """The bytes ``[start:end)`` in one ``OPEN`` (``offset``, ``length``); a range past the
        end is empty. Negative bounds (from the end) cost a ``GETFILESTATUS`` first."""
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = int(self.info(path)["size"])
            start = size + start if start is not None and start < 0 else start
            end = size + end if end is not None and end < 0 else end
        params: dict[str, Any] = {}
        if start:
            params["offset"] = start
        if end is not None:
            if end <= (start or 0):
                return b""
            params["length"] = end - (start or 0)
        try:
            answer = self._call("OPEN", "get", path, redirect=False, **params)
            location = answer.headers.get("Location")
            if location is not None:  # to the DataNode, through data_proxy as fsspec does
                answer = _check(self.session.get(self._apply_proxy(location)))
            return bytes(answer.content)
        except OSError as exc:  # an offset past the end: HDFS' seek says EOFException
            eof = getattr(exc, "remote_exception", None) == "EOFException"
            if params.get("offset") and (eof or "out of the range" in str(exc)):
                return b""
            raise


class WebHDFSStore(FsspecStore):
    """A store on HDFS through WebHDFS or HttpFS (``webhdfs://namenode:9870/path``,
    ``swebhdfs://`` for HTTPS) whose create-if-absent is atomic (see the module docstring).

    Build it with :func:`snapstore.open_store` (or :func:`open_webhdfs`).
    """

    def create_if_absent(self, path: str, data: bytes) -> bool:
        # FsspecStore's, but a record found holding a beginning of our bytes (empty included)
        # may be ours still being written, after a create whose response was lost: HDFS shows
        # a file before its writer closes it. It is watched until it holds more.
        data = bytes(data)
        target = self._path(path)
        for _ in range(self.retry.attempts):
            with contextlib.suppress(FileExistsError):
                create = lambda: self.fs.pipe_file(target, data, mode="create")  # noqa: E731
                self._call("commit", path, create, write=True)
                return True
            deadline = time.monotonic() + _SETTLE_SECONDS
            try:
                while True:
                    existing = bytes(self._call("read", path, lambda: self.fs.cat_file(target)))
                    if not data.startswith(existing) or existing == data:
                        return existing == data
                    if time.monotonic() > deadline:
                        return False  # a record cut short, its writer gone: not a commit
                    time.sleep(0.02)
            except FileNotFoundError:
                continue  # removed since (snapstore rm): try again
        raise vanished_error(self.join(path))

    def _makedirs(self, path: str) -> None:
        """Nothing: ``CREATE`` makes the missing parents in its own NameNode step (a request
        less per commit, and no moment in which remove_empty_dir could take them away)."""

    def remove_empty_dir(self, path: str) -> bool:
        # DELETE recursive=false: the NameNode refuses a non-empty directory in the same step
        # (PathIsNotEmptyDirectoryException). It would remove a file too: check it is none.
        target = self._path(path)
        if not path.strip("/") or not self.is_dir(path):
            return False
        try:
            answer = self.fs._call("DELETE", "delete", target, recursive="false").json()
        except OSError:  # not empty, or gone
            return False
        return bool(answer.get("boolean"))

    def _answer(self, exc: BaseException) -> str:
        names = {f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__}
        if "requests.exceptions.ConnectionError" in names:  # its text is a long repr
            return "connection refused" if "refused" in str(exc) else "cannot connect"
        return super()._answer(exc)

    def _error(self, op: str, path: str, exc: BaseException, kind: str, tries: int) -> StoreError:
        err = super()._error(op, path, exc, kind, tries)
        remote = getattr(exc, "remote_exception", None)
        names = {f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__}
        if remote is not None:
            # RetriableException wraps SafeModeException on an HA NameNode: say safe mode.
            hint = _REMOTE_HINTS.get("SafeModeException" if "SafeMode" in str(exc) else remote)
            if hint is None:
                return err
            detail = str(exc).splitlines()[0]
        elif "requests.exceptions.ConnectionError" in names and kind == "transient":
            where = self.fs.url.split("/webhdfs/", 1)[0]
            hint = f"no NameNode answered at {where}: {_NO_NAMENODE}"
            detail = "connection refused" if "refused" in str(exc) else "cannot connect"
        else:
            return err
        retried = f"gave up after {tries} tries; " if kind == "transient" else ""
        translated = StoreError(f"cannot {op} {self.join(path)}: {detail}; {retried}{hint}")
        translated.errno = err.errno
        return translated


def open_webhdfs(url: str, *, retry: RetryPolicy | None = None, **options: Any) -> WebHDFSStore:
    """The :class:`WebHDFSStore` for a ``webhdfs://`` or ``swebhdfs://`` URL.

    Parameters
    ----------
    url : str
        ``webhdfs://namenode:9870/path`` (``swebhdfs://``: HTTPS). A user in the URL
        (``webhdfs://alice@namenode:9870/path``) is the ``user.name`` sent to the NameNode.
    retry : RetryPolicy, optional
        How transient failures (safe mode, a standby NameNode, resets) are retried, and how
        long one operation may take (``timeout``).
    **options
        fsspec ``WebHDFS`` options (``user=``, ``kerberos=``, ``token=``, ``data_proxy=``...),
        and ``timeout=`` (seconds, or ``(connect, read)``) for each HTTP request: by default a
        sixth and a half of ``retry.timeout`` (10 s and 30 s).

    Returns
    -------
    WebHDFSStore

    Raises
    ------
    StoreError
        If the URL or the options are invalid.
    """
    protocol = url.split("://", 1)[0].lower()
    policy = retry if retry is not None else RetryPolicy()
    try:
        kwargs = {**_WebHDFS._get_kwargs_from_urls(url), **options}
        kwargs = client_options(protocol, kwargs, policy.timeout)
        kwargs.setdefault("use_https", protocol == "swebhdfs")
        fs = _WebHDFS(**kwargs)
    except (ValueError, TypeError, KeyError) as exc:
        raise StoreError(
            f"cannot open store {url!r}: {exc}; check the URL (webhdfs://namenode:9870/path) "
            "and the storage options"
        ) from exc
    store = WebHDFSStore(fs, _WebHDFS._strip_protocol(url), retry=policy)
    store.url = url.rstrip("/")
    store.protocol = protocol
    return store
