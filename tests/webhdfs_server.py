"""A small WebHDFS REST server for the tests: a NameNode and a "DataNode" on one port.

It speaks the part of Apache Hadoop's WebHDFS REST API that snapstore and fsspec's ``webhdfs``
client use (``/webhdfs/v1/<path>?op=...&user.name=...``), over a directory on local disk:

- ``CREATE`` (PUT) and ``APPEND`` (POST) in two steps: the NameNode answers ``307 Temporary
  Redirect`` with a ``Location`` on a DataNode (here this server, with ``datanode=true`` added),
  where the client sends the bytes (``201 Created`` / ``200 OK``). ``noredirect=true`` answers
  ``200 {"Location": ...}`` instead. As on HDFS the NameNode step checks nothing about the file;
  the DataNode step creates it, and with ``overwrite=false`` on an existing path it answers 403
  ``FileAlreadyExistsException`` (set :attr:`WebHDFSServer.early_create_check` to have the
  NameNode step answer that too). A create is atomic: the bytes go to a staging file that is
  then linked into place without replacing (``overwrite=false``) or renamed over the old file,
  so one of N racing creators wins and a reader never sees a partial file. On HDFS a file being
  written is visible, growing, until closed: ``under_construction = <seconds>`` shows it so
  (empty for that long, then whole).
- ``OPEN`` (GET, redirected to the DataNode) with ``offset`` and ``length``; an offset past the
  end answers 403 ``EOFException`` as HDFS' seek does.
- ``GETFILESTATUS``, ``LISTSTATUS`` (a file lists itself, ``pathSuffix`` empty),
  ``GETCONTENTSUMMARY``, ``GETHOMEDIRECTORY``, ``MKDIRS``, ``DELETE`` (``recursive``; a missing
  path gives ``{"boolean": false}``) and ``RENAME`` with HDFS' old semantics: onto an existing
  directory moves the source into it; ``{"boolean": false}`` when the source is missing, the
  destination exists or its parent does not.
- Errors as ``{"RemoteException": {"exception", "javaClassName", "message"}}`` with Hadoop's
  statuses: 400 IllegalArgumentException, 403 AccessControlException and other IOExceptions,
  404 FileNotFoundException.

Switches for fault tests (attributes, changed while it runs): ``safe_mode`` (writes answer 403
``RetriableException`` wrapping ``SafeModeException``, as an HA NameNode does), ``standby``
(everything answers 403 ``StandbyException``), ``denied_prefixes`` (403
``AccessControlException`` for paths under them) and ``counts`` (requests per op; DataNode
steps counted as ``"<OP>@datanode"``).

Not implemented: permissions, owners and times beyond placeholders, quotas, snapshots, xattrs,
ACLs, checksums, symlinks, delegation tokens, Kerberos, ``CONCAT``, ``TRUNCATE``,
``LISTSTATUS_BATCH``, ``SETREPLICATION``/``SETPERMISSION``/``SETOWNER``/``SETTIMES``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

PREFIX = "/webhdfs/v1"
WRITE_OPS = {"CREATE", "APPEND", "MKDIRS", "RENAME", "DELETE"}
PACKAGES = {  # of the exceptions this server raises, for javaClassName
    "java.io": "FileNotFoundException EOFException",
    "java.lang": "IllegalArgumentException",
    "org.apache.hadoop.security": "AccessControlException",
    "org.apache.hadoop.fs": "FileAlreadyExistsException ParentNotDirectoryException "
    "PathIsNotEmptyDirectoryException",
    "org.apache.hadoop.ipc": "RetriableException StandbyException",
}
JAVA_CLASSES = {name: f"{pkg}.{name}" for pkg, names in PACKAGES.items() for name in names.split()}
# Hadoop's ExceptionHandler: FileNotFoundException 404, IllegalArgumentException 400, any other
# IOException (AccessControlException, FileAlreadyExistsException...) 403.
STATUS = {"FileNotFoundException": 404, "IllegalArgumentException": 400}


class RemoteError(Exception):
    """A Hadoop exception to answer with: its simple class name and message."""

    def __init__(self, exception: str, message: str) -> None:
        super().__init__(message)
        self.exception, self.message = exception, message

    def body(self) -> dict[str, Any]:
        java = JAVA_CLASSES.get(self.exception, f"java.io.{self.exception}")
        fields = {"exception": self.exception, "javaClassName": java, "message": self.message}
        return {"RemoteException": fields}


class WebHDFSServer(ThreadingHTTPServer):
    """The server: files live under :attr:`root` (HDFS' ``/``), staging files beside it."""

    daemon_threads = True
    request_queue_size = 128  # racing clients connect at once

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.root = root
        self.staging = Path(tempfile.mkdtemp(prefix="webhdfs-staging-"))
        self.host, self.port = host, int(self.server_address[1])
        self.url = f"webhdfs://{host}:{self.port}"
        self.lock = threading.Lock()  # the NameNode's namespace lock
        self.safe_mode = False
        self.standby = False
        self.early_create_check = False
        self.under_construction = 0.0  # seconds a created file stays empty before its bytes
        self.denied_prefixes: list[str] = []
        self.counts: Counter[str] = Counter()
        self.datanode_host = host  # where redirects point (a client may map it: data_proxy)

    user = "test"  # the user.name clients of the fixture send

    def fresh_root(self, prefix: str | None = None) -> tuple[str, dict[str, Any]]:
        """``(url, storage_options)`` of a fresh (or the given) directory, for ``open_store``."""
        prefix = prefix or f"t-{uuid.uuid4().hex[:12]}"
        return f"{self.url}/{prefix}", {"user": self.user}

    def reset(self) -> None:
        """Every switch off (the counts stay: ``counts.clear()``)."""
        self.safe_mode = self.standby = self.early_create_check = False
        self.under_construction = 0.0
        self.denied_prefixes = []
        self.datanode_host = self.host

    @contextlib.contextmanager
    def switched(self, **switches: Any) -> Iterator[WebHDFSServer]:
        """Set switches (``safe_mode=True``...) for a ``with`` block, then :meth:`reset`."""
        for name, value in switches.items():
            if not hasattr(self, name):
                raise AttributeError(f"WebHDFSServer has no switch {name!r}")
            setattr(self, name, value)
        try:
            yield self
        finally:
            self.reset()

    def local(self, hdfs_path: str) -> Path:
        parts = [p for p in hdfs_path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise RemoteError("IllegalArgumentException", f"Invalid path name {hdfs_path}")
        return self.root.joinpath(*parts)

    def server_close(self) -> None:
        super().server_close()
        shutil.rmtree(self.staging, ignore_errors=True)


def _status(path: Path, suffix: str) -> dict[str, Any]:
    st = path.stat()
    is_dir = path.is_dir()
    return {
        "accessTime": 0 if is_dir else int(st.st_atime * 1000),
        "blockSize": 0 if is_dir else 134217728,
        "childrenNum": len(os.listdir(path)) if is_dir else 0,
        "fileId": st.st_ino,
        "group": "supergroup",
        "length": 0 if is_dir else st.st_size,
        "modificationTime": int(st.st_mtime * 1000),
        "owner": "test",
        "pathSuffix": suffix,
        "permission": "755" if is_dir else "644",
        "replication": 0 if is_dir else 1,
        "storagePolicy": 0,
        "type": "DIRECTORY" if is_dir else "FILE",
    }


class _Handler(BaseHTTPRequestHandler):
    server: WebHDFSServer
    protocol_version = "HTTP/1.1"  # keep-alive, as Hadoop's Jetty
    disable_nagle_algorithm = True  # else each response waits ~40 ms for a delayed ACK

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle(self.command)

    do_PUT = do_POST = do_DELETE = do_GET

    # -- plumbing ------------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        body = self._read_body()
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        op = params.get("op", "").upper()
        datanode = params.get("datanode") == "true"
        self.server.counts[f"{op}@datanode" if datanode else op] += 1
        try:
            if not url.path.startswith(PREFIX):
                raise RemoteError("IllegalArgumentException", f"Not a WebHDFS URL: {url.path}")
            path = "/" + unquote(url.path[len(PREFIX) :]).strip("/")
            self._check_switches(op, path, params)
            handler = getattr(self, f"_{method.lower()}_{op.lower()}", None)
            if handler is None:
                raise RemoteError(
                    "IllegalArgumentException", f"Invalid value for webhdfs parameter op: {op}"
                )
            try:
                handler(path, params, body, datanode)
            except (FileNotFoundError, NotADirectoryError):  # removed while being answered
                raise RemoteError("FileNotFoundException", f"File does not exist: {path}") from None
            except OSError as exc:  # the disk under the server: as an HDFS IOException
                raise RemoteError("IOException", f"{path}: {exc}") from None
        except RemoteError as exc:
            status = STATUS.get(exc.exception, 403)
            self._send(status, json.dumps(exc.body()).encode())

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _check_switches(self, op: str, path: str, params: dict[str, str]) -> None:
        server = self.server
        if server.standby:
            category = "WRITE" if op in WRITE_OPS else "READ"
            raise RemoteError(
                "StandbyException",
                f"Operation category {category} is not "
                "supported in state standby. Visit https://s.apache.org/sbnn-error",
            )
        if server.safe_mode and op in WRITE_OPS:
            raise RemoteError(
                "RetriableException",
                "org.apache.hadoop.hdfs.server.namenode."
                f"SafeModeException: Cannot {op.lower()} {path}. Name node is in "
                "safe mode.",
            )
        for target in (path, params.get("destination")):
            if target and any(_under(target, p) for p in server.denied_prefixes):
                access = "WRITE" if op in WRITE_OPS else "READ"
                user = params.get("user.name", "dr.who")
                raise RemoteError(
                    "AccessControlException",
                    f"Permission denied: user={user}, "
                    f'access={access}, inode="{target}":hdfs:supergroup:drwx------',
                )

    def _send(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        headers.setdefault("Content-Type", "application/json")
        headers["Content-Length"] = str(len(body))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any) -> None:
        self._send(200, json.dumps(value).encode())

    def _redirect(self, path: str, params: dict[str, str]) -> None:
        """The NameNode's answer to a data op: go to the DataNode (or say where, noredirect)."""
        query = urlencode({**params, "datanode": "true"})
        location = (
            f"http://{self.server.datanode_host}:{self.server.port}{PREFIX}{quote(path)}?{query}"
        )
        if params.get("noredirect") == "true":
            self._json({"Location": location})
        else:
            self._send(HTTPStatus.TEMPORARY_REDIRECT, Location=location)

    def _existing(self, path: str) -> Path:
        local = self.server.local(path)
        if not local.exists():
            raise RemoteError("FileNotFoundException", f"File does not exist: {path}")
        return local

    def _make_parents(self, local: Path) -> None:
        root = self.server.root
        for parent in reversed(local.parents):
            if parent == root or not parent.is_relative_to(root):
                continue
            if parent.is_file():
                raise RemoteError(
                    "ParentNotDirectoryException",
                    f"Parent path is not a directory: /{parent.relative_to(root)}",
                )
            parent.mkdir(exist_ok=True)

    # -- operations ----------------------------------------------------------------------------

    def _put_create(self, path: str, params: dict[str, str], body: bytes, datanode: bool) -> None:
        local = self.server.local(path)
        overwrite = params.get("overwrite", "false").lower()
        if overwrite not in ("true", "false"):
            raise RemoteError(
                "IllegalArgumentException",
                f'Invalid value for webhdfs parameter "overwrite": {overwrite}',
            )
        if not datanode:
            if self.server.early_create_check and overwrite == "false" and local.exists():
                raise RemoteError("FileAlreadyExistsException", f"{path} already exists")
            return self._redirect(path, params)
        slow = self.server.under_construction
        fd, staged = tempfile.mkstemp(dir=self.server.staging)
        with os.fdopen(fd, "wb") as f:
            try:
                f.write(b"" if slow else body)
                f.flush()
                with self.server.lock:
                    self._place(path, local, staged, overwrite == "true")
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(staged)
            if slow:  # as on HDFS: the file is there, empty, until its writer closes it
                time.sleep(slow)
                f.write(body)
        hdfs_url = f"hdfs://{self.server.host}:{self.server.port}{quote(path)}"
        self._send(HTTPStatus.CREATED, Location=hdfs_url)

    def _place(self, path: str, local: Path, staged: str, overwrite: bool) -> None:
        """Put the staged file at ``local``: renamed over it, or linked where nothing is."""
        if local.is_dir():
            raise RemoteError("FileAlreadyExistsException", f"{path} already exists as a directory")
        self._make_parents(local)
        if overwrite:
            os.replace(staged, local)
            return
        try:
            os.link(staged, local)  # fails if the name exists: never replaces
        except FileExistsError:
            message = f"{path} for client 127.0.0.1 already exists"
            raise RemoteError("FileAlreadyExistsException", message) from None

    def _post_append(self, path: str, params: dict[str, str], body: bytes, datanode: bool) -> None:
        local = self._existing(path)
        if local.is_dir():
            raise RemoteError("FileNotFoundException", f"Path is not a file: {path}")
        if not datanode:
            return self._redirect(path, params)
        with self.server.lock, open(local, "ab") as f:
            f.write(body)
        self._send(200)

    def _get_open(self, path: str, params: dict[str, str], body: bytes, datanode: bool) -> None:
        local = self._existing(path)
        if local.is_dir():
            raise RemoteError("FileNotFoundException", f"Path is not a file: {path}")
        offset, length = _int(params, "offset", 0), _int(params, "length", -1)
        if not datanode:
            return self._redirect(path, params)
        with open(local, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset > size:
                raise RemoteError("EOFException", "Cannot seek after EOF")
            f.seek(offset)
            data = f.read() if length < 0 else f.read(length)
        self._send(200, data, Content_Type="application/octet-stream")

    def _get_getfilestatus(self, path: str, params: dict[str, str], *_: Any) -> None:
        with self.server.lock:
            self._json({"FileStatus": _status(self._existing(path), "")})

    def _get_liststatus(self, path: str, params: dict[str, str], *_: Any) -> None:
        with self.server.lock:  # a listing is one snapshot of the namespace, as on HDFS
            local = self._existing(path)
            if local.is_dir():
                statuses = [_status(local / name, name) for name in sorted(os.listdir(local))]
            else:
                statuses = [_status(local, "")]
        self._json({"FileStatuses": {"FileStatus": statuses}})

    def _get_getcontentsummary(self, path: str, params: dict[str, str], *_: Any) -> None:
        with self.server.lock:
            local = self._existing(path)
            items = [local, *local.rglob("*")]
            sizes = [item.stat().st_size for item in items if item.is_file()]
        summary = {"directoryCount": len(items) - len(sizes), "fileCount": len(sizes)}
        summary.update(length=sum(sizes), spaceConsumed=sum(sizes), quota=-1, spaceQuota=-1)
        self._json({"ContentSummary": summary})

    def _get_gethomedirectory(self, path: str, params: dict[str, str], *_: Any) -> None:
        self._json({"Path": f"/user/{params.get('user.name', 'dr.who')}"})

    def _put_mkdirs(self, path: str, params: dict[str, str], *_: Any) -> None:
        local = self.server.local(path)
        with self.server.lock:
            if local.is_file():
                raise RemoteError("FileAlreadyExistsException", f"Path is not a directory: {path}")
            self._make_parents(local / "x")
        self._json({"boolean": True})

    def _put_rename(self, path: str, params: dict[str, str], *_: Any) -> None:
        destination = params.get("destination", "")
        if not destination.startswith("/"):
            raise RemoteError(
                "IllegalArgumentException",
                f'Invalid parameter value: destination = "{destination}" is not an absolute path.',
            )
        src, dst = self.server.local(path), self.server.local(destination)
        with self.server.lock:
            if dst.is_dir() and dst != src:
                dst = dst / src.name  # HDFS' rename(src, dir) moves src into dir
            movable = src.exists() and src != self.server.root and not dst.is_relative_to(src)
            ok = movable and not dst.exists() and dst.parent.is_dir()
            if ok:
                os.rename(src, dst)
        self._json({"boolean": ok or (src == dst and src.exists())})

    def _delete_delete(self, path: str, params: dict[str, str], *_: Any) -> None:
        local = self.server.local(path)
        recursive = params.get("recursive", "false").lower() == "true"
        with self.server.lock:
            if not local.exists() or local == self.server.root:
                return self._json({"boolean": False})
            if local.is_dir():
                if not recursive and any(local.iterdir()):
                    raise RemoteError(
                        "PathIsNotEmptyDirectoryException",
                        f"`{path} is non empty': Directory is not empty",
                    )
                shutil.rmtree(local)
            else:
                local.unlink()
        self._json({"boolean": True})


def _under(path: str, prefix: str) -> bool:
    prefix = "/" + prefix.strip("/")
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _int(params: dict[str, str], name: str, default: int) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = -2
    if value < 0:
        raise RemoteError(
            "IllegalArgumentException", f'Invalid value for webhdfs parameter "{name}": {text}'
        )
    return value


@contextlib.contextmanager
def running_webhdfs(root: Path | None = None, port: int = 0) -> Iterator[WebHDFSServer]:
    """A WebHDFS server on 127.0.0.1 (a free port unless given) in a thread, over ``root`` (a
    temp directory, removed after, unless given); stopped on exit."""
    tmp = None if root is not None else tempfile.TemporaryDirectory(prefix="webhdfs-")
    server = WebHDFSServer(Path(tmp.name) if tmp else root, port=port)  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, name="webhdfs-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        if tmp is not None:
            tmp.cleanup()


def main(argv: list[str] | None = None) -> None:
    """Serve until interrupted, for examples and manual runs:
    ``python tests/webhdfs_server.py [--port 9870] [--root DIR]`` prints the URL to use."""
    parser = argparse.ArgumentParser(description="A WebHDFS REST server for tests.")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--root", type=Path, help="the directory holding HDFS' / (default: temp)")
    args = parser.parse_args(argv)
    with running_webhdfs(args.root, args.port) as server:
        print(f"{server.url} user={server.user} root={server.root}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
