"""A listener on loopback that holds none of regent's secrets, the way another user's
program could sit on a port a journal names. It speaks just enough ZMTP (the greeting,
echoing whatever security mechanism the client asks for) that a client goes on to send
its handshake, and records every byte it is sent."""

from __future__ import annotations

import socket
import threading
import time

_SIGNATURE = b"\xff" + bytes(8) + b"\x7f"
_GREETING_BYTES = 64


class ListenerWithoutSecret:
    def __init__(self, port: int = 0):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(16)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.received = bytearray()
        self.mechanisms: list[bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            t = threading.Thread(target=self._talk, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _talk(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        seen = bytearray()
        try:
            conn.sendall(_SIGNATURE + b"\x03")
            answered = False
            while not self._stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                seen += chunk
                with self._lock:
                    self.received += chunk
                if not answered and len(seen) >= _GREETING_BYTES:
                    mechanism = bytes(seen[12:32])
                    with self._lock:
                        self.mechanisms.append(mechanism.rstrip(b"\0"))
                    # The rest of a server's greeting, with the client's own mechanism: the
                    # client's next bytes are its handshake (PLAIN: username and password).
                    conn.sendall(b"\x00" + mechanism + b"\x01" + bytes(31))
                    answered = True
        except OSError:
            return
        finally:
            conn.close()

    def wait_for_handshake(self, timeout: float = 5.0) -> bool:
        """True once a client has sent more than its greeting."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.mechanisms and len(self.received) > _GREETING_BYTES:
                    return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._accept.join(timeout=2)
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> ListenerWithoutSecret:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
