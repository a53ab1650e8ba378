"""The guarantees under faults met on the wire (issue 29): tests/faultproxy.py between the real
clients (gcsfs, s3fs, the WebHDFS store's ``requests``) and the emulators. First each fault
against a tiny local HTTP server, then sweeps of 4 racing jobs and shuffled epochs through the
proxy at 5% of requests failing (3% 503, 1% 429, 1% reset before), 1% acted-then-reset and 1%
bodies cut short. ``-m slow`` runs many sweeps per store (``SNAPSTORE_PROXY_SWEEPS``, 200).
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from conftest import FaultyRoot
from faultproxy import FaultProxy, ProxyFaults, request_any, running_proxy
from test_faulty_store import COMPUTED, COUNTING, OPTIONS, stage, sweep_stage

import snapstore
from snapstore.storage.retry import RetryPolicy
from snapstore.storage.store import FsspecStore

# The rates; Retry-After shortened so that a 429 costs milliseconds here.
RATES: dict[str, Any] = dict(error_rate=0.03, throttle_rate=0.01, reset_before=0.01,
                             reset_after=0.01, short_body=0.01, retry_after=0.01)  # fmt: skip
# Attempts high enough that a request failing 7% of the time (after the client's own retries)
# almost never fails them all; quick waits.
POLICY = RetryPolicy(attempts=10, base=0.001, cap=0.02, timeout=120)


# -- the proxy, against a tiny server ------------------------------------------------------------


class _Tiny(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    received: ClassVar[list[tuple[str, bytes]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.received.append(("GET", b""))
        body = bytes(range(256)) * 4
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/next")
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append(("PUT", body))
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def tiny() -> Iterator[tuple[ThreadingHTTPServer, FaultProxy]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Tiny)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Tiny.received = []
    try:
        with running_proxy(f"http://127.0.0.1:{server.server_address[1]}") as proxy:
            yield server, proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_clean_proxy_passes_requests_and_points_locations_back_at_itself(tiny: Any) -> None:
    _server, proxy = tiny
    status, headers, body = request_any(proxy.url + "/a")
    assert status == 200 and body == bytes(range(256)) * 4
    assert headers["Location"] == proxy.url + "/next"
    # chunked and Expect: 100-continue (botocore) both arrive as the bytes sent
    conn = http.client.HTTPConnection("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]), timeout=10)
    conn.putrequest("PUT", "/up")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.putheader("Expect", "100-continue")
    conn.endheaders()
    conn.send(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    response = conn.getresponse()
    assert response.status == 201 and response.read() == b""
    # the connection is kept alive
    conn.request("GET", "/again")
    assert conn.getresponse().read() == bytes(range(256)) * 4
    conn.close()
    assert _Tiny.received == [("GET", b""), ("PUT", b"hello world"), ("GET", b"")]
    assert proxy.injected == Counter()


def test_each_fault_is_injected(tiny: Any) -> None:
    _server, proxy = tiny
    proxy.faults = ProxyFaults(error_rate=1.0)
    assert request_any(proxy.url + "/a")[0] == 503
    proxy.faults = ProxyFaults(throttle_rate=1.0, retry_after=2.5)
    status, headers, _ = request_any(proxy.url + "/a")
    assert status == 429 and headers["Retry-After"] == "2.5"
    assert _Tiny.received == []  # neither reached the server

    proxy.faults = ProxyFaults(reset_before=1.0)
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        request_any(proxy.url + "/up", "PUT", b"never")
    assert _Tiny.received == []  # the server never saw it

    proxy.faults = ProxyFaults(reset_after=1.0)
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        request_any(proxy.url + "/up", "PUT", b"acted")
    assert _Tiny.received == [("PUT", b"acted")]  # made, its answer lost

    proxy.faults = ProxyFaults(short_body=1.0)
    with pytest.raises(http.client.IncompleteRead) as info:
        request_any(proxy.url + "/a")
    assert len(info.value.partial) == 512 and info.value.expected == 512

    proxy.faults = ProxyFaults(slow_tail=1.0, tail_scale=0.001, tail_cap=0.002)
    assert request_any(proxy.url + "/a")[2] == bytes(range(256)) * 4
    assert proxy.injected == Counter(
        {"503": 1, "429": 1, "reset_before": 1, "reset_after": 1, "short_body": 1, "delayed": 1}
    )


def test_the_faults_are_seeded_and_reproducible(tiny: Any) -> None:
    _server, proxy = tiny

    def outcomes(seed: int) -> list[int]:
        proxy.faults = ProxyFaults(seed=seed, error_rate=0.2, throttle_rate=0.2)
        proxy._seen.clear()
        return [request_any(f"{proxy.url}/p{i % 7}")[0] for i in range(60)]

    first = outcomes(1)
    assert outcomes(1) == first and outcomes(2) != first
    assert {200, 429, 503} == set(first)
    with pytest.raises(ValueError, match="add up"):
        ProxyFaults(error_rate=0.6, reset_after=0.6)


# -- sweeps and reads through the proxy on fake-gcs-server, moto and WebHDFS ----------------------


def _committed_files(store: FsspecStore, fp: str) -> dict[str, Any]:
    """The committed run's files, the manifest parsed without the run's name and second."""
    (run,) = store.list_dir(f"{fp}/runs")  # exactly one run: nothing partial visible
    names = sorted(n.rsplit("/", 1)[-1] for n in store.list_dir(f"{fp}/runs/{run}"))
    files: dict[str, Any] = {n: bytes(store.read_bytes(f"{fp}/runs/{run}/{n}")) for n in names}
    files["manifest.json"] = json.loads(files["manifest.json"])
    for volatile in ("run", "created_at"):
        files["manifest.json"].pop(volatile)
    return files


def _sweep(faulty: FaultyRoot, prefix: str, n: int) -> tuple[str, list[float]]:
    """4 threads, each with its own store through the proxy, race to materialize one stage;
    the fingerprint and each job's seconds."""
    COMPUTED.clear()
    url = f"{faulty.url}/{prefix}"
    fps: list[str] = []
    times: list[float] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def job() -> None:
        store = snapstore.open_store(url, **faulty.storage_options, retry=POLICY)
        try:
            start.wait()
            t0 = time.perf_counter()
            snap = snapstore.snapshot(
                sweep_stage, root=store, options=OPTIONS, ignore_globals=COUNTING
            )(n)
            snap.materialize()
            with snapstore.open(snap.fingerprint, root=store) as back:
                assert [int(s["x"]) for s in back] == list(range(n))
            times.append(time.perf_counter() - t0)
            fps.append(snap.fingerprint)
        except BaseException as exc:
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(COMPUTED) == 1, "the stage ran more than once"
    (fp,) = set(fps)
    return fp, times


def _clean(faulty: FaultyRoot) -> FsspecStore:
    store = snapstore.open_store(faulty.url, **faulty.storage_options)
    assert isinstance(store, FsspecStore)
    return store


def _run_sweeps(faulty: FaultyRoot, sweeps: int, n: int = 300) -> dict[str, Any]:
    proxy = faulty.proxy
    proxy.faults = ProxyFaults()
    fp, clean_times = _sweep(faulty, "clean", n)
    clean = _clean(faulty)
    expected = _committed_files(clean, f"clean/{fp}")
    ratios: list[float] = []
    proxy.injected.clear()
    requests_before = proxy.requests
    t0 = time.perf_counter()
    for i in range(sweeps):
        proxy.faults = ProxyFaults(seed=i, **RATES)
        fp_i, times = _sweep(faulty, f"sweep-{i}", n)
        proxy.faults = ProxyFaults()
        assert fp_i == fp
        assert _committed_files(clean, f"sweep-{i}/{fp}") == expected, i
        ratios += [t / statistics.median(clean_times) for t in times]
    clean.close()
    figures = {
        "sweeps": sweeps,
        "seconds": round(time.perf_counter() - t0, 1),
        "requests": proxy.requests - requests_before,
        "injected": dict(proxy.injected),
        "clean_job_s": round(statistics.median(clean_times), 3),
        "job_ratio_median": round(statistics.median(ratios), 2),
        "job_ratio_max": round(max(ratios), 2),
        "jobs_over_3x": sum(r > 3 for r in ratios),
    }
    print(f"\n{faulty.url.split(':', 1)[0]} through the fault proxy: {figures}")
    return figures


SLOW_SWEEPS = int(os.environ.get("SNAPSTORE_PROXY_SWEEPS", "200"))
SWEEPS = [pytest.param(1, id="1"), pytest.param(SLOW_SWEEPS, marks=pytest.mark.slow, id="many")]


@pytest.mark.parametrize("sweeps", SWEEPS)
def test_gcs_sweeps_through_the_proxy(
    gcs_faulty: FaultyRoot, sweeps: int, record_property: Any
) -> None:
    figures = _run_sweeps(gcs_faulty, sweeps)
    record_property("figures", figures)
    assert sum(figures["injected"].values()) > 0


@pytest.mark.parametrize("sweeps", SWEEPS)
def test_s3_sweeps_through_the_proxy(
    s3_faulty: FaultyRoot, sweeps: int, record_property: Any
) -> None:
    figures = _run_sweeps(s3_faulty, sweeps)
    record_property("figures", figures)
    assert sum(figures["injected"].values()) > 0


@pytest.mark.parametrize("sweeps", SWEEPS)
def test_webhdfs_sweeps_through_the_proxy(
    webhdfs_faulty: FaultyRoot, sweeps: int, record_property: Any
) -> None:
    figures = _run_sweeps(webhdfs_faulty, sweeps)
    record_property("figures", figures)
    assert sum(figures["injected"].values()) > 0


@pytest.mark.parametrize("where", ["gcs", "s3"])
def test_every_epoch_is_exact_through_the_proxy(where: str, request: pytest.FixtureRequest) -> None:
    faulty: FaultyRoot = request.getfixturevalue(f"{where}_faulty")
    n = 1000
    clean = _clean(faulty)
    snap = snapstore.snapshot(stage, root=clean, options=OPTIONS)(n).materialize()
    clean.close()
    faulty.proxy.faults = ProxyFaults(seed=5, **RATES)
    store = snapstore.open_store(faulty.url, **faulty.storage_options, retry=POLICY)
    with snapstore.open(snap.fingerprint, root=store) as back:
        for epoch in range(2):
            got = [(int(x), int(v[0])) for b in back.batches(64, shuffle=True, seed=epoch)
                   for x, v in zip(b["x"], b["v"])]  # fmt: skip
            assert sorted(got) == [(i, i) for i in range(n)], epoch
    store.close()
    print(f"\n{where} epochs through the proxy: {dict(faulty.proxy.injected)}")
    assert sum(faulty.proxy.injected.values()) > 0
