"""The WebHDFS test server (tests/webhdfs_server.py) answers as Apache Hadoop's WebHDFS REST API
documents: checked over plain HTTP with ``requests``, and through fsspec's ``webhdfs`` client."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import pytest
import requests
from servers import child_env
from test_store_conformance import start_together
from webhdfs_server import WebHDFSServer


@pytest.fixture
def hdfs(webhdfs_server: WebHDFSServer) -> Iterator[Client]:
    """A client on a fresh directory of the session's server; switches off again after."""
    client = Client(webhdfs_server, f"/t-{uuid.uuid4().hex[:12]}")
    yield client
    webhdfs_server.reset()
    client.session.close()


class Client:
    """Raw WebHDFS calls, redirects not followed, so each step can be checked."""

    def __init__(self, server: WebHDFSServer, base: str) -> None:
        self.server, self.base = server, base
        self.session = requests.Session()
        self.session.trust_env = False  # the server is on 127.0.0.1: no proxies

    def call(self, method: str, path: str, op: str, **params: Any) -> requests.Response:
        data = params.pop("data", None)
        url = f"http://{self.server.host}:{self.server.port}/webhdfs/v1{self.base}/{path}"
        params = {"op": op, "user.name": "test", **params}
        return self.session.request(method, url, params=params, data=data, allow_redirects=False)

    def create(self, path: str, data: bytes, overwrite: str = "false") -> requests.Response:
        first = self.call("PUT", path, "CREATE", overwrite=overwrite)
        assert first.status_code == 307, first.text
        return self.session.put(first.headers["Location"], data=data)

    def read(self, path: str, **params: Any) -> bytes:
        first = self.call("GET", path, "OPEN", **params)
        assert first.status_code == 307, first.text
        second = self.session.get(first.headers["Location"])
        assert second.status_code == 200, second.text
        return second.content


def remote_exception(response: requests.Response, status: int, exception: str) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()["RemoteException"]
    assert body["exception"] == exception and body["javaClassName"].endswith(exception)
    return str(body["message"])


def test_create_is_two_steps_and_overwrite_false_conflicts(hdfs: Client) -> None:
    first = hdfs.call("PUT", "d/f", "CREATE", overwrite="false")
    assert first.status_code == 307 and first.content == b""
    assert "datanode=true" in first.headers["Location"]
    assert not (hdfs.server.root / hdfs.base[1:] / "d/f").exists()  # nothing until the data
    second = hdfs.session.put(first.headers["Location"], data=b"one")
    assert second.status_code == 201 and second.headers["Location"].startswith("hdfs://")
    assert hdfs.read("d/f") == b"one"

    # HDFS' NameNode step picks a DataNode and checks nothing; the DataNode step refuses.
    again = hdfs.create("d/f", b"two")
    assert "already exists" in remote_exception(again, 403, "FileAlreadyExistsException")
    assert hdfs.read("d/f") == b"one"
    assert hdfs.create("d/f", b"three", overwrite="true").status_code == 201
    assert hdfs.read("d/f") == b"three"
    with hdfs.server.switched(early_create_check=True):
        early = hdfs.call("PUT", "d/f", "CREATE", overwrite="false")
        remote_exception(early, 403, "FileAlreadyExistsException")
    where = hdfs.call("PUT", "d/g", "CREATE", noredirect="true")
    assert where.status_code == 200 and "datanode=true" in where.json()["Location"]


def test_a_file_under_construction_is_visible_and_empty(hdfs: Client) -> None:
    writer = Client(hdfs.server, hdfs.base)  # a session of its own, in its own thread
    with hdfs.server.switched(under_construction=2.0), ThreadPoolExecutor(1) as pool:
        created = pool.submit(writer.create, "slow", b"record")
        deadline = time.monotonic() + 5
        while hdfs.call("GET", "slow", "GETFILESTATUS").status_code == 404:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert hdfs.read("slow") == b"" and not created.done()  # a reader sees it empty
        second = hdfs.create("slow", b"other")  # and a second creator loses already
        remote_exception(second, 403, "FileAlreadyExistsException")
        assert created.result().status_code == 201
    assert hdfs.read("slow") == b"record"
    writer.session.close()


def test_append_is_two_steps(hdfs: Client) -> None:
    hdfs.create("a", b"head")
    first = hdfs.call("POST", "a", "APPEND")
    assert first.status_code == 307
    assert hdfs.session.post(first.headers["Location"], data=b"+tail").status_code == 200
    assert hdfs.read("a") == b"head+tail"
    remote_exception(hdfs.call("POST", "missing", "APPEND"), 404, "FileNotFoundException")


def test_open_offset_and_length(hdfs: Client) -> None:
    data = bytes(range(256))
    hdfs.create("r", data)
    assert hdfs.read("r") == data
    assert hdfs.read("r", offset=10, length=5) == data[10:15]
    assert hdfs.read("r", offset=250, length=100) == data[250:]
    assert hdfs.read("r", offset=256) == b"" and hdfs.read("r", length=0) == b""
    past = hdfs.call("GET", "r", "OPEN", offset=257)
    past = hdfs.session.get(past.headers["Location"])
    assert "EOF" in remote_exception(past, 403, "EOFException")
    remote_exception(hdfs.call("GET", "r", "OPEN", offset=-1), 400, "IllegalArgumentException")
    remote_exception(hdfs.call("GET", "nope", "OPEN"), 404, "FileNotFoundException")


def test_statuses_and_listing(hdfs: Client) -> None:
    hdfs.create("dir/f1", b"12345")
    assert hdfs.call("PUT", "dir/sub", "MKDIRS").json() == {"boolean": True}
    status = hdfs.call("GET", "dir/f1", "GETFILESTATUS").json()["FileStatus"]
    assert status["type"] == "FILE" and status["length"] == 5 and status["pathSuffix"] == ""
    assert status["modificationTime"] > 0
    listing = hdfs.call("GET", "dir", "LISTSTATUS").json()["FileStatuses"]["FileStatus"]
    assert [(s["pathSuffix"], s["type"], s["length"]) for s in listing] == [
        ("f1", "FILE", 5),
        ("sub", "DIRECTORY", 0),
    ]
    itself = hdfs.call("GET", "dir/f1", "LISTSTATUS").json()["FileStatuses"]["FileStatus"]
    assert [s["pathSuffix"] for s in itself] == [""]
    summary = hdfs.call("GET", "dir", "GETCONTENTSUMMARY").json()["ContentSummary"]
    assert (summary["fileCount"], summary["directoryCount"], summary["length"]) == (1, 2, 5)
    assert hdfs.call("GET", "", "GETHOMEDIRECTORY").json() == {"Path": "/user/test"}
    missing = hdfs.call("GET", "dir/nope", "LISTSTATUS")
    assert "does not exist" in remote_exception(missing, 404, "FileNotFoundException")
    remote_exception(hdfs.call("GET", "nope", "GETFILESTATUS"), 404, "FileNotFoundException")
    remote_exception(hdfs.call("PUT", "dir/f1/x", "MKDIRS"), 403, "ParentNotDirectoryException")
    remote_exception(hdfs.call("GET", "", "NOSUCHOP"), 400, "IllegalArgumentException")


def test_rename_answers_false_rather_than_replace(hdfs: Client) -> None:
    hdfs.create("src", b"new")
    hdfs.create("dst", b"old")

    def rename(src: str, dst: str) -> Any:
        return hdfs.call("PUT", src, "RENAME", destination=f"{hdfs.base}/{dst}").json()

    assert rename("src", "dst") == {"boolean": False}
    assert hdfs.read("dst") == b"old" and hdfs.read("src") == b"new"
    assert rename("missing", "x") == {"boolean": False}
    assert rename("src", "no/parent") == {"boolean": False}
    assert rename("src", "moved") == {"boolean": True}
    assert hdfs.read("moved") == b"new"
    remote_exception(hdfs.call("GET", "src", "GETFILESTATUS"), 404, "FileNotFoundException")
    hdfs.call("PUT", "into", "MKDIRS")
    assert rename("moved", "into") == {"boolean": True}  # onto a directory: moves into it
    assert hdfs.read("into/moved") == b"new"
    relative = hdfs.call("PUT", "into", "RENAME", destination="relative")
    remote_exception(relative, 400, "IllegalArgumentException")


def test_delete(hdfs: Client) -> None:
    hdfs.create("t/a/b", b"x")
    assert hdfs.call("DELETE", "nope", "DELETE").json() == {"boolean": False}
    refused = hdfs.call("DELETE", "t", "DELETE", recursive="false")
    remote_exception(refused, 403, "PathIsNotEmptyDirectoryException")
    assert hdfs.call("DELETE", "t/a/b", "DELETE").json() == {"boolean": True}
    assert hdfs.call("DELETE", "t", "DELETE", recursive="true").json() == {"boolean": True}
    remote_exception(hdfs.call("GET", "t", "GETFILESTATUS"), 404, "FileNotFoundException")


def test_a_failing_disk_answers_an_ioexception(hdfs: Client) -> None:
    # A name longer than the disk allows (HDFS: PathComponentTooLongException, an IOException).
    too_long = hdfs.create("x" * 300, b"data")
    assert "x" * 300 in remote_exception(too_long, 403, "IOException")


def test_switches(hdfs: Client) -> None:
    hdfs.create("f", b"x")
    with hdfs.server.switched(safe_mode=True):
        message = remote_exception(hdfs.call("PUT", "g", "MKDIRS"), 403, "RetriableException")
        assert "SafeModeException" in message and "safe mode" in message
        assert hdfs.read("f") == b"x"  # reads go on
    with hdfs.server.switched(standby=True):
        remote_exception(hdfs.call("GET", "f", "GETFILESTATUS"), 403, "StandbyException")
    with hdfs.server.switched(denied_prefixes=[f"{hdfs.base}/f"]):
        denied = hdfs.call("GET", "f", "OPEN")
        assert "user=test" in remote_exception(denied, 403, "AccessControlException")
    hdfs.server.counts.clear()
    hdfs.read("f")
    assert hdfs.server.counts == {"OPEN": 1, "OPEN@datanode": 1}
    with pytest.raises(AttributeError, match="no switch"), hdfs.server.switched(nonsense=True):
        pass


RACER = textwrap.dedent(
    """
    import json, sys
    import requests

    base, me, names = sys.argv[1], sys.argv[2], int(sys.argv[3])
    session = requests.Session()
    session.trust_env = False
    print("READY", flush=True)
    sys.stdin.readline()
    won = []
    for k in range(names):
        first = session.put(f"{base}/race/{k}?op=CREATE&overwrite=false&user.name=t",
                            allow_redirects=False)
        second = session.put(first.headers["Location"], data=f"process {me}".encode())
        assert second.status_code in (201, 403), second.text
        won.append(second.status_code == 201)
    print(json.dumps(won), flush=True)
    """
)


def test_processes_racing_create_exactly_one_wins(hdfs: Client) -> None:
    processes, names = 4, 100
    base = f"http://{hdfs.server.host}:{hdfs.server.port}/webhdfs/v1{hdfs.base}"
    results = start_together([RACER, base, str(me), str(names)] for me in range(processes))
    for k in range(names):
        winners = [me for me in range(processes) if results[me][k]]
        assert len(winners) == 1, (k, winners)
        assert hdfs.read(f"race/{k}") == f"process {winners[0]}".encode()


def test_fsspec_webhdfs_client(webhdfs_server: WebHDFSServer) -> None:
    fs = fsspec.filesystem(
        "webhdfs",
        host=webhdfs_server.host,
        port=webhdfs_server.port,
        user="test",
        skip_instance_cache=True,
    )
    base = f"/fsspec-{uuid.uuid4().hex[:8]}"
    data = bytes(range(256)) * 4
    fs.pipe_file(f"{base}/a/b.bin", data)
    assert fs.cat_file(f"{base}/a/b.bin", start=10, end=30) == data[10:30]
    assert fs.cat_file(f"{base}/a/b.bin") == data
    info = fs.info(f"{base}/a/b.bin")
    assert info["type"] == "file" and info["size"] == len(data)
    with fs.open(f"{base}/w", "wb") as f:  # CREATE, then APPEND
        f.write(b"written")
    fs.mkdir(f"{base}/empty")
    assert fs.ls(base) == [f"{base}/a", f"{base}/empty", f"{base}/w"]
    assert fs.find(base) == [f"{base}/a/b.bin", f"{base}/w"]
    fs.mv(f"{base}/w", f"{base}/a/w")
    assert fs.cat_file(f"{base}/a/w") == b"written"
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{base}/missing")
    fs.rm(f"{base}/a", recursive=True)
    assert not fs.exists(f"{base}/a") and fs.ls(base) == [f"{base}/empty"]


def test_datanode_addresses_mapped_by_the_client(webhdfs_server: WebHDFSServer) -> None:
    # A cluster's redirects name DataNodes the client may not resolve: fsspec's data_proxy maps.
    proxy = {"datanode.invalid": webhdfs_server.host}
    fs = fsspec.filesystem(
        "webhdfs", host=webhdfs_server.host, port=webhdfs_server.port, user="test",
        data_proxy=proxy, skip_instance_cache=True,
    )  # fmt: skip
    path = f"/proxied-{uuid.uuid4().hex[:8]}"
    with webhdfs_server.switched(datanode_host="datanode.invalid"):
        fs.pipe_file(path, b"through the proxy")
        assert fs.cat_file(path, start=4, end=11) == b"through the proxy"[4:11]


def test_runs_as_a_script(tmp_path: Path) -> None:
    script = Path(__file__).with_name("webhdfs_server.py")
    proc = subprocess.Popen(
        [sys.executable, str(script), "--root", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[0]
        host, port = url.removeprefix("webhdfs://").split(":")
        fs = fsspec.filesystem("webhdfs", host=host, port=int(port), skip_instance_cache=True)
        fs.pipe_file("/dir/file", b"on disk")
        assert (tmp_path / "dir" / "file").read_bytes() == b"on disk"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
