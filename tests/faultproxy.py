"""An HTTP/1.1 fault proxy for the tests: between a real client (gcsfs, s3fs, the WebHDFS
store's ``requests`` session) and an emulator on 127.0.0.1, it injects the faults a bucket
shows at scale (issue 29), per request, seeded:

- ``error_rate``: answers ``503 Service Unavailable`` without asking the server;
- ``throttle_rate``: answers ``429 Too Many Requests`` with ``Retry-After: <retry_after>``;
- ``reset_before``: resets the client's connection (RST) before the server saw the request;
- ``reset_after``: forwards the request, reads the server's whole answer, then resets the
  client's connection without sending it (the change is made, its answer lost);
- ``short_body``: sends the answer's status and headers (the full ``Content-Length``) and
  about half its body, then closes the connection;
- ``slow_tail``: before forwarding, waits ``tail_scale * (Pareto(tail_alpha) - 1)`` seconds
  (at most ``tail_cap``): mostly nothing, sometimes long.

Clients are pointed at :attr:`FaultProxy.url` as their endpoint, so the proxy is the endpoint
they were given: the ``Host`` header is passed on as sent. Only ``Location`` headers naming the
server (fake-gcs-server's resumable upload URLs, WebHDFS' redirects to its DataNode) are
rewritten to name the proxy, so that every later request comes back through it.

Framing. A request body is read whole (``Content-Length`` or chunked; ``Expect:
100-continue`` is answered by the proxy, botocore waits for it) and sent upstream with a
``Content-Length``; the answer is read whole through :mod:`http.client` and sent to the client
with a ``Content-Length`` (a HEAD's keeps the server's). Connections are kept alive on both
sides; a fault that resets or cuts closes the client's connection.

Reproducibility. Each request's fate is drawn from a generator seeded by ``(seed, method,
path, n)``, ``n`` counting requests with that method and path (query strings left out: upload
ids are random); the same requests in any thread order meet the same faults.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import random
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "expect", "te",
        "upgrade", "proxy-authorization", "proxy-authenticate", "trailer"}  # fmt: skip
_KINDS = ("error_rate", "throttle_rate", "reset_before", "reset_after", "short_body")
_LABEL = {"error_rate": "503", "throttle_rate": "429", "reset_before": "reset_before",
          "reset_after": "reset_after", "short_body": "short_body"}  # fmt: skip


@dataclass(frozen=True)
class ProxyFaults:
    """Per-request probabilities of each fault, and the delay's heavy tail."""

    seed: int = 0
    error_rate: float = 0.0
    throttle_rate: float = 0.0
    reset_before: float = 0.0
    reset_after: float = 0.0
    short_body: float = 0.0
    retry_after: float = 1.0  # seconds, in the 429's Retry-After (may be fractional)
    slow_tail: float = 0.0  # probability that a request is delayed at all
    tail_scale: float = 0.01
    tail_alpha: float = 1.5
    tail_cap: float = 2.0

    def __post_init__(self) -> None:
        rates = [getattr(self, k) for k in _KINDS] + [self.slow_tail]
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"each probability must be in [0, 1], got {rates}")
        if sum(getattr(self, k) for k in _KINDS) > 1.0:
            raise ValueError("the fault probabilities must add up to at most 1")


class FaultProxy(socketserver.ThreadingTCPServer):
    """A threaded proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``).

    ``faults`` may be replaced between requests; :attr:`injected` counts the faults met and
    :attr:`requests` the requests seen."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: str, faults: ProxyFaults | None = None, dialect: str = "plain"):
        super().__init__(("127.0.0.1", 0), _Handler)
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream_host, self.upstream_port = host, int(port or 80)
        self.upstream = f"http://{host}:{self.upstream_port}"
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.faults = faults or ProxyFaults()
        self.dialect = dialect  # the error body's shape: "gcs" (JSON), "s3" (XML) or "plain"
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self._seen: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._clients: set[socket.socket] = set()
        self._thread: threading.Thread | None = None

    # -- the fault draw ------------------------------------------------------------------------

    def draw(self, method: str, target: str) -> tuple[str | None, float]:
        """The fault (a key of :class:`ProxyFaults`, or None) and the delay for one request."""
        path = target.split("?", 1)[0]
        with self._lock:
            self.requests += 1
            n = self._seen[(method, path)]
            self._seen[(method, path)] += 1
        f = self.faults
        key = f"{f.seed}|{method}|{path}|{n}".encode()
        rng = random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big"))
        u, fault, edge = rng.random(), None, 0.0
        for kind in _KINDS:
            edge += getattr(f, kind)
            if u < edge:
                fault = kind
                break
        delay = 0.0
        if rng.random() < f.slow_tail:
            delay = min(f.tail_cap, f.tail_scale * (rng.paretovariate(f.tail_alpha) - 1.0))
        return fault, delay

    def count(self, label: str) -> None:
        with self._lock:
            self.injected[label] += 1

    # -- life ------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="faultproxy")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close every client connection (their threads then end)."""
        self.shutdown()
        self.server_close()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def track(self, sock: socket.socket, on: bool) -> None:
        with self._lock:
            (self._clients.add if on else self._clients.discard)(sock)

    def error_answer(self, status: int, reason: str) -> bytes:
        if self.dialect == "s3":
            code = "SlowDown" if status == 503 else "TooManyRequests"
            return (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                    f"<Message>{reason} (injected)</Message></Error>").encode()  # fmt: skip
        if self.dialect == "gcs":
            error = {"code": status, "message": f"{reason} (injected)",
                     "errors": [{"reason": "backendError", "message": reason}]}  # fmt: skip
            return json.dumps({"error": error}).encode()
        return f"{reason} (injected)".encode()


@contextlib.contextmanager
def running_proxy(
    upstream: str, faults: ProxyFaults | None = None, dialect: str = "plain"
) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` serving in a thread; closed on exit."""
    proxy = FaultProxy(upstream, faults, dialect).start()
    try:
        yield proxy
    finally:
        proxy.close()


class _Reset(Exception):
    """End this client connection (already reset or closed)."""


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a peer that vanished does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _read_body(rfile: BinaryIO, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int(rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(parts)
            parts.append(rfile.read(size))
            rfile.readline()
    length = int(headers.get("content-length", "0") or 0)
    return rfile.read(length) if length else b""


class _Handler(socketserver.BaseRequestHandler):
    server: FaultProxy

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(sock, True)
        rfile = sock.makefile("rb")
        upstream = http.client.HTTPConnection(
            self.server.upstream_host, self.server.upstream_port, timeout=120
        )
        try:
            while self._one(sock, rfile, upstream):
                pass
        except (_Reset, OSError, ValueError, http.client.HTTPException):
            pass
        finally:
            self.server.track(sock, False)
            upstream.close()
            with contextlib.suppress(OSError):
                rfile.close()
            with contextlib.suppress(OSError):
                sock.close()

    def _one(
        self, sock: socket.socket, rfile: BinaryIO, upstream: http.client.HTTPConnection
    ) -> bool:
        line = rfile.readline(65537)
        if not line.strip():
            return False
        method, target, version = line.decode("latin-1").split()
        raw: list[tuple[str, str]] = []
        while (h := rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
            name, _, value = h.decode("latin-1").partition(":")
            raw.append((name.strip(), value.strip()))
        headers = {k.lower(): v for k, v in raw}
        fault, delay = self.server.draw(method, target)
        if fault == "reset_before":
            self.server.count("reset_before")
            _reset(sock)
            raise _Reset
        if headers.get("expect", "").lower() == "100-continue":
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _read_body(rfile, headers)
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if fault in ("error_rate", "throttle_rate"):
            self.server.count(_LABEL[fault])
            status, reason = (503, "Service Unavailable") if fault == "error_rate" else (
                429, "Too Many Requests")  # fmt: skip
            payload = self.server.error_answer(status, reason)
            extra = f"Retry-After: {self.server.faults.retry_after:g}\r\n" if status == 429 else ""
            ctype = {"s3": "application/xml", "gcs": "application/json"}.get(
                self.server.dialect, "text/plain")  # fmt: skip
            sock.sendall(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n{extra}"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            return keep
        if delay > 0:
            self.server.count("delayed")
            time.sleep(delay)
        status, reason, out_headers, payload = self._forward(upstream, method, target, raw, body)
        if fault == "reset_after":
            self.server.count("reset_after")
            _reset(sock)
            raise _Reset
        cut = fault == "short_body" and len(payload) >= 2 and method != "HEAD"
        head = [f"HTTP/1.1 {status} {reason}"]
        for name, value in out_headers:
            if name.lower() in _HOP or (name.lower() == "content-length" and method != "HEAD"):
                continue
            if name.lower() == "location" and value.startswith(self.server.upstream):
                value = self.server.url + value[len(self.server.upstream) :]
            head.append(f"{name}: {value}")
        if method != "HEAD" and status not in (204, 304) and status >= 200:
            head.append(f"Content-Length: {len(payload)}")
        if not keep:
            head.append("Connection: close")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        if cut:
            self.server.count("short_body")
            sock.sendall(data + payload[: len(payload) // 2])
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            raise _Reset
        sock.sendall(data + (b"" if method == "HEAD" else payload))
        return keep

    def _forward(
        self, upstream: http.client.HTTPConnection, method: str, target: str,
        raw: list[tuple[str, str]], body: bytes,
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:  # fmt: skip
        """Send the request upstream (reconnecting once if the kept-alive connection went)."""
        for attempt in (0, 1):
            try:
                upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for name, value in raw:
                    if name.lower() not in _HOP and name.lower() != "content-length":
                        upstream.putheader(name, value)
                if body or method in ("PUT", "POST", "PATCH"):
                    upstream.putheader("Content-Length", str(len(body)))
                upstream.endheaders(body or None)
                response = upstream.getresponse()
                payload = response.read()
                if response.will_close:
                    upstream.close()
                return response.status, response.reason, response.getheaders(), payload
            except (ConnectionError, http.client.RemoteDisconnected, BrokenPipeError):
                upstream.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")


def request_any(
    url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection (for the unit tests): ``(status, headers, body)``."""
    host, _, rest = url.removeprefix("http://").partition("/")
    name, _, port = host.partition(":")
    conn = http.client.HTTPConnection(name, int(port), timeout=10)
    try:
        conn.request(method, "/" + rest, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


__all__: list[Any] = ["FaultProxy", "ProxyFaults", "request_any", "running_proxy"]
