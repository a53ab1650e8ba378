from __future__ import annotations

import uuid
from collections.abc import Iterator

import fsspec
import pytest

# Session-scoped servers (fake-gcs-server, moto, WebHDFS) started by the tests: tests/servers.py.
from servers import Server, gcs_server, s3_server, webhdfs_server  # noqa: F401 - fixtures
from webhdfs_server import WebHDFSServer

from snapstore.storage.store import FsspecStore, LocalStore, Store


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:
    """Every backend available without network: a local directory and fsspec memory."""
    if request.param == "local":
        s: Store = LocalStore(tmp_path / "snaps")
    else:
        s = FsspecStore(fsspec.filesystem("memory"), f"/snaps-{uuid.uuid4().hex}")
    yield s
    s.close()


@pytest.fixture
def local_root(tmp_path, monkeypatch) -> str:
    """A local root, also exported as SNAPSTORE_ROOT so nothing touches the user's cache."""
    root = str(tmp_path / "root")
    monkeypatch.setenv("SNAPSTORE_ROOT", root)
    return root


def _server(request: pytest.FixtureRequest, kind: str) -> Server:
    server: Server = request.getfixturevalue(f"{kind}_server")
    return server


@pytest.fixture
def gcs_root(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    """``(url, storage_options)`` of a fresh prefix on the GCS emulator, for
    ``snapstore.open_store(url, **storage_options)`` here or in a subprocess (pass both to it,
    e.g. JSON-encoded; see tests/servers.py)."""
    return _server(request, "gcs").root()


@pytest.fixture
def s3_root(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    """``(url, storage_options)`` of a fresh prefix on the S3 server (moto)."""
    return _server(request, "s3").root()


@pytest.fixture
def webhdfs_root(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    """``(url, storage_options)`` of a fresh directory on the WebHDFS test server
    (tests/webhdfs_server.py), for ``snapstore.open_store(url, **storage_options)``."""
    server: WebHDFSServer = request.getfixturevalue("webhdfs_server")
    return server.fresh_root()


@pytest.fixture(params=["gcs", "s3"])
def remote_root(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    """``(url, storage_options)`` of a fresh prefix on each object store emulator."""
    return _server(request, request.param).root()


@pytest.fixture(params=["gcs", "s3"])
def remote_store(request: pytest.FixtureRequest) -> Iterator[FsspecStore]:
    """An FsspecStore on a fresh prefix of each object store emulator (GCS, S3)."""
    s = _server(request, request.param).store()
    yield s
    s.close()
