"""TCP RDMA transport: a small server thread in the owner, one-sided reads/writes from anywhere.

The server starts lazily, the first time a handle leaves the process. Every
request carries the buffer's 128-bit token. Data moves between the socket and
the registered memory with ``sendall``/``recv_into`` on memoryviews: no Python
copies per chunk. Bad input from the network is logged with its peer and the
connection dropped; it never takes the owner down.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import socket
import struct
import threading
from typing import Any

import numpy as np
import structlog

from regent.hipcore import _copy, _shm
from regent.hipcore._rdma_registry import RDMAHandle, Region, Registry, registry
from regent.hipcore._rdma_shm import dropped, owner_gone
from regent.hipcore.errors import RDMAError, RDMASizeError, RDMATimeoutError

log = structlog.get_logger("hipcore.rdma.tcp")

ADDR_ENV = "REGENT_HIPCORE_RDMA_ADDR"
TIMEOUT_ENV = "REGENT_HIPCORE_RDMA_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
SOCKET_BUFFER = 4 << 20
_STAGING = 8 << 20

_MAGIC = b"RGRD"
_REQ = struct.Struct("!4sB3x16s16sQQ")  # magic, op, buffer id, token, offset, nbytes
_RESP = struct.Struct("!BxxxI")  # status, message length (message follows)
OP_READ, OP_WRITE, OP_DROP = 1, 2, 3
ST_OK, ST_DROPPED, ST_DENIED, ST_SIZE, ST_READONLY, ST_FAILED = range(6)


def default_timeout() -> float:
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes, or None on a clean EOF before the first byte."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError(f"peer closed the connection after {got} of {n} header bytes")
        got += k
    return bytes(buf)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    n = len(view)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 26))
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k


def _send_status(sock: socket.socket, status: int, message: str = "") -> None:
    body = message.encode()
    sock.sendall(_RESP.pack(status, len(body)) + body)


class _Server:
    """Accept loop plus one thread per connection; stopped by ``stop()``."""

    def __init__(self, reg: Registry) -> None:
        self._registry = reg
        configured = os.environ.get(ADDR_ENV)
        bind = configured or "0.0.0.0"
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
        self._listener.bind((bind, 0))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self.bound_any = configured is None
        self.advertise = configured or _advertised_address()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, name="hipcore-rdma-accept", daemon=True)
        self._thread.start()
        log.debug("rdma tcp server listening", address=self.advertise, port=self.port)

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(
                target=self._serve, args=(conn, peer), name="hipcore-rdma-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        staging: dict[str, Any] = {}
        try:
            _tune(conn)
            while True:
                header = _recv_exact(conn, _REQ.size)
                if header is None:
                    return
                magic, op, buffer_id, token, offset, n = _REQ.unpack(header)
                if magic != _MAGIC or op not in (OP_READ, OP_WRITE, OP_DROP):
                    log.warning("dropping connection: not an rdma request", peer=peer)
                    return
                self._handle(conn, op, buffer_id, token, offset, n, staging)
        except (OSError, ConnectionError) as exc:
            log.debug("rdma connection ended", peer=peer, error=repr(exc))
        except Exception:  # noqa: BLE001 - bad input must never take the owner down
            log.exception("rdma request failed; dropping connection", peer=peer)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handle(
        self, conn: socket.socket, op: int, buffer_id: bytes, token: bytes,
        offset: int, n: int, staging: dict[str, Any],
    ) -> None:
        entry = self._registry.lookup(buffer_id)
        if entry is None:
            _send_status(conn, ST_DROPPED, "buffer was dropped")
            return
        if not hmac.compare_digest(entry.handle.token, token):
            log.warning("rdma request with a wrong token")
            _send_status(conn, ST_DENIED, "wrong token for this buffer")
            return
        region = entry.region
        if op == OP_DROP:
            self._registry.drop(buffer_id)
            _send_status(conn, ST_OK)
            return
        if offset + n > region.nbytes:
            _send_status(
                conn, ST_SIZE, f"range {offset}..{offset + n} exceeds the buffer's {region.nbytes} bytes"
            )
            return
        if op == OP_WRITE and not region.writable:
            _send_status(conn, ST_READONLY, "buffer was registered from read-only memory")
            return
        _send_status(conn, ST_OK)
        if op == OP_READ:
            _send_region(conn, region, offset, n, staging)
        else:
            _recv_region(conn, region, offset, n, staging)
            _send_status(conn, ST_OK)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            conns = list(self._conns)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)


def _staging_buffer(staging: dict[str, Any], region: Region) -> Any:
    buf = staging.get("pinned")
    if buf is None:
        import torch

        buf = staging["pinned"] = torch.empty(_STAGING, dtype=torch.uint8, pin_memory=True)
    return buf


def _send_region(conn: socket.socket, region: Region, offset: int, n: int, staging: dict[str, Any]) -> None:
    if region.host is not None:
        conn.sendall(memoryview(region.host[offset : offset + n]))
        return
    pinned = _staging_buffer(staging, region)
    pinned_np = pinned.numpy()
    for start in range(offset, offset + n, _STAGING):
        k = min(_STAGING, offset + n - start)
        pinned[:k].copy_(region.tensor[start : start + k])
        conn.sendall(memoryview(pinned_np[:k]))


def _recv_region(conn: socket.socket, region: Region, offset: int, n: int, staging: dict[str, Any]) -> None:
    if region.host is not None:
        _recv_into(conn, memoryview(region.host[offset : offset + n]))
        return
    pinned = _staging_buffer(staging, region)
    pinned_np = pinned.numpy()
    for start in range(offset, offset + n, _STAGING):
        k = min(_STAGING, offset + n - start)
        _recv_into(conn, memoryview(pinned_np[:k]))
        region.tensor[start : start + k].copy_(pinned[:k])


def _advertised_address() -> str:
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
    return addr


_server: _Server | None = None
_server_pid = 0
_server_lock = threading.Lock()


def server() -> _Server:
    global _server, _server_pid
    with _server_lock:
        if _server is None or _server_pid != os.getpid():
            _server, _server_pid = _Server(registry()), os.getpid()
        return _server


def stop_server() -> None:
    global _server
    with _server_lock:
        if _server is not None and _server_pid == os.getpid():
            _server.stop()
        _server = None


class _Pool:
    """Idle client connections per owner address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}

    def take(self, addr: tuple[str, int], timeout: float) -> socket.socket:
        with self._lock:
            idle = self._idle.get(addr)
            if idle:
                return idle.pop()
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            _tune(sock)
            sock.settimeout(timeout)
            sock.connect(addr)
        except BaseException:
            sock.close()
            raise
        return sock

    def give(self, addr: tuple[str, int], sock: socket.socket) -> None:
        with self._lock:
            self._idle.setdefault(addr, []).append(sock)

    def clear(self) -> None:
        with self._lock:
            socks = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for s in socks:
            s.close()


_pool = _Pool()


class TcpTransport:
    """Reaches any buffer whose owner's server is routable from here."""

    name = "tcp"

    def endpoint(self, region: Region) -> Any | None:
        srv = server()
        return (srv.advertise, srv.port, srv.bound_any)

    def reachable(self, handle: RDMAHandle, info: Any) -> bool:
        return True

    def _address(self, handle: RDMAHandle, info: Any) -> tuple[str, int]:
        host, port, bound_any = info
        if bound_any and handle.host == _shm.host_id():
            return ("127.0.0.1", port)
        return (host, port)

    def _request(
        self, handle: RDMAHandle, info: Any, op: int, user: Any, offset: int, timeout: float | None
    ) -> None:
        addr = self._address(handle, info)
        timeout = default_timeout() if timeout is None else timeout
        n = _copy.nbytes_of(user) if user is not None else 0
        moved = 0
        try:
            sock = _pool.take(addr, timeout)
        except ConnectionRefusedError:
            raise owner_gone(handle, f" (its RDMA server at {addr[0]}:{addr[1]} refused the connection)") from None
        except TimeoutError:
            raise RDMATimeoutError(
                f"connecting to the RDMA owner at {addr[0]}:{addr[1]} timed out after {timeout}s"
            ) from None
        except OSError as exc:
            raise RDMAError(f"cannot reach the RDMA owner at {addr[0]}:{addr[1]}: {exc}") from exc
        try:
            sock.settimeout(timeout)
            sock.sendall(_REQ.pack(_MAGIC, op, handle.buffer_id, handle.token, offset, n))
            self._check_status(sock, handle)
            if op == OP_READ:
                moved = self._read_payload(sock, user, n)
            elif op == OP_WRITE:
                moved = self._write_payload(sock, user, n)
                self._check_status(sock, handle)
        except TimeoutError:
            sock.close()
            raise RDMATimeoutError(
                f"RDMA {'read' if op == OP_READ else 'write'} of {n} bytes from pid "
                f"{handle.owner_pid} at {addr[0]}:{addr[1]} stalled for {timeout}s after "
                f"{moved} bytes (owner stopped or network down?)"
            ) from None
        except (ConnectionError, OSError) as exc:
            sock.close()
            raise owner_gone(
                handle, f" or closed the connection mid-transfer ({exc}; {moved} of {n} bytes moved)"
            ) from None
        except BaseException:
            sock.close()
            raise
        _pool.give(addr, sock)

    def _check_status(self, sock: socket.socket, handle: RDMAHandle) -> None:
        raw = _recv_exact(sock, _RESP.size)
        if raw is None:
            raise ConnectionError("owner closed the connection before answering")
        status, length = _RESP.unpack(raw)
        message = (_recv_exact(sock, length) or b"").decode(errors="replace") if length else ""
        if status == ST_OK:
            return
        if status == ST_DROPPED:
            raise dropped(handle)
        if status == ST_SIZE:
            raise RDMASizeError(f"owner rejected the request: {message}")
        raise RDMAError(f"owner pid {handle.owner_pid} rejected the request: {message}")

    def _read_payload(self, sock: socket.socket, dst: Any, n: int) -> int:
        if _copy.is_device_tensor(dst):
            host = np.empty(n, dtype=np.uint8)
            _recv_into(sock, memoryview(host))
            _copy.copy_bytes(dst, host)
            from regent.hipcore._rdma_shm import finish_device_copies

            finish_device_copies(dst)
        else:
            _recv_into(sock, memoryview(_copy.host_bytes(dst, writable=True, what="destination")))
        return n

    def _write_payload(self, sock: socket.socket, src: Any, n: int) -> int:
        if _copy.is_device_tensor(src):
            host = np.empty(n, dtype=np.uint8)
            _copy.copy_bytes(host, src)
            from regent.hipcore._rdma_shm import finish_device_copies

            finish_device_copies(src)
        else:
            host = _copy.host_bytes(src, writable=False, what="source")
        sock.sendall(memoryview(host))
        return n

    def read_into(self, handle: RDMAHandle, info: Any, dst: Any, offset: int, timeout: float | None) -> None:
        self._request(handle, info, OP_READ, dst, offset, timeout)

    def write_from(self, handle: RDMAHandle, info: Any, src: Any, offset: int, timeout: float | None) -> None:
        self._request(handle, info, OP_WRITE, src, offset, timeout)

    def drop(self, handle: RDMAHandle, info: Any, timeout: float | None) -> None:
        self._request(handle, info, OP_DROP, None, 0, timeout)
