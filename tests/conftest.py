from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import fsspec
import pytest
from faultproxy import FaultProxy, running_proxy

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
def pool(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A torch_pool SegmentPool made this process's, as allocate_pooled makes one in a
    DataLoader worker; this process then receives its own batches (through ForkingPickler, as
    a DataLoader queue does: tests/test_torch_pool.py's ``send``). Imports torch when used."""
    import os

    from snapstore import torch_pool

    made = torch_pool.SegmentPool(3)
    monkeypatch.setattr(torch_pool, "_POOL", (os.getpid(), made))
    return made


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


# -- the same emulators behind the HTTP fault proxy (tests/faultproxy.py) ----------------------


class FaultyRoot(NamedTuple):
    """A fresh prefix reached through a fault proxy: ``open_store(url, **storage_options)``;
    set ``proxy.faults`` to choose the faults, read ``proxy.injected`` for those met."""

    url: str
    storage_options: dict[str, Any]
    proxy: FaultProxy


@pytest.fixture
def gcs_faulty(request: pytest.FixtureRequest) -> Iterator[FaultyRoot]:
    """fake-gcs-server through a fault proxy (no faults until ``proxy.faults`` is set)."""
    server = _server(request, "gcs")
    with running_proxy(server.endpoint, dialect="gcs") as proxy:
        url, options = server.root()
        yield FaultyRoot(url, {**options, "endpoint_url": proxy.url}, proxy)


@pytest.fixture
def s3_faulty(request: pytest.FixtureRequest) -> Iterator[FaultyRoot]:
    """moto's S3 server through a fault proxy (no faults until ``proxy.faults`` is set)."""
    server = _server(request, "s3")
    with running_proxy(server.endpoint, dialect="s3") as proxy:
        url, options = server.root()
        yield FaultyRoot(url, {**options, "endpoint_url": proxy.url}, proxy)


@pytest.fixture
def webhdfs_faulty(request: pytest.FixtureRequest) -> Iterator[FaultyRoot]:
    """The WebHDFS test server through a fault proxy: the NameNode's redirects to its DataNode
    name the server, and the proxy rewrites them to name itself, so data goes through it too."""
    server: WebHDFSServer = request.getfixturevalue("webhdfs_server")
    with running_proxy(f"http://{server.host}:{server.port}") as proxy:
        url, options = server.fresh_root()
        yield FaultyRoot(url.replace(f":{server.port}/", f":{proxy.url.rsplit(':', 1)[1]}/"),
                         options, proxy)  # fmt: skip
