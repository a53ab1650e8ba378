"""Endpoints that never answer, for the deadline tests (tests/test_deadlines.py).

- :class:`Blackhole`: a TCP server on 127.0.0.1 that accepts connections and then neither
  reads nor writes a byte. A client's request sits in the kernel's buffers; an upload larger
  than them stalls in ``send``. To a client this is a firewall that drops packets after the
  handshake, or a wrong port behind a proxy.
- :class:`DarkProxy`: a TCP proxy in front of a real server that forwards both ways until
  :meth:`DarkProxy.go_dark`; from then on nothing comes back on any connection, open or new
  (what clients send is read and dropped), as when a network path goes silent mid-job.

Both run on daemon threads and close every socket in :meth:`close` (or on leaving ``with``).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Any


class _Listener:
    """A listening socket on a free port of 127.0.0.1, whose connections go to ``serve``."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = int(self._server.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.closed = threading.Event()
        threading.Thread(target=self._accept, name="test-listener", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._keep(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def serve(self, conn: socket.socket) -> None:
        """Handle one accepted connection (the subclass's job)."""

    def close(self) -> None:
        self.closed.set()
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Blackhole(_Listener):
    """Accepts, then never answers (nor reads: uploads stall once the buffers are full)."""

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._sockets)


class DarkProxy(_Listener):
    """Forwards to ``upstream`` (``host, port``) until :meth:`go_dark`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.dark = threading.Event()
        super().__init__()

    def go_dark(self) -> None:
        self.dark.set()

    def __snapstore_key__(self) -> str:  # a stage that switches it off hashes the same
        return "DarkProxy"

    def serve(self, conn: socket.socket) -> None:
        peer = None
        if not self.dark.is_set():
            peer = socket.create_connection(self.upstream)
            self._keep(peer)
        for sock in (conn, peer):
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        watched = [s for s in (conn, peer) if s is not None]
        while watched and not self.closed.is_set():
            try:
                readable, _, _ = select.select(watched, [], [], 0.2)
                for sock in readable:
                    data = sock.recv(1 << 16)
                    if sock is peer and (not data or self.dark.is_set()):
                        watched.remove(peer)  # silent from now on, even if upstream closes
                        continue
                    if not data:
                        return  # the client left
                    if not self.dark.is_set() and peer is not None:
                        (peer if sock is conn else conn).sendall(data)
            except OSError:
                return
