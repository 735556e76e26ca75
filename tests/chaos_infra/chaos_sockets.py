"""Socket helpers for the chaos infrastructure tests: a TCP echo server and a round trip."""

from __future__ import annotations

import socket
import socketserver
import time


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        try:
            while data := sock.recv(65536):
                sock.sendall(data)
        except OSError:
            pass


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host}:{port}"


def connect(address: str, timeout_s: float = 5.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def round_trip(address: str, payload: bytes = b"ping", timeout_s: float = 5.0) -> float:
    """Connect, send ``payload``, read it back; return the seconds it took."""
    with connect(address, timeout_s) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        echoed = recv_exactly(sock, len(payload))
        elapsed = time.monotonic() - start
    assert echoed == payload
    return elapsed
