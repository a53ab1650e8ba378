from __future__ import annotations

import uuid
from collections.abc import Iterator

import fsspec
import pytest

from snapstore.store import FsspecStore, LocalStore, Store


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
