"""Large payload frames to a peer on another host, out of band, over TCP with AES-GCM.

The sender keeps the frames and sends a BULK envelope on the CURVE socket naming its data port, a
fresh 128-bit transfer id and a fresh 256-bit AES key: only the authenticated peer that gets the
envelope learns them. The receiver connects to the data port, answers the server's random
challenge with an HMAC under the key (so a request seen on the network cannot be replayed), and
reads the frames as AES-GCM records of up to CHUNK bytes, each bound by its associated data to the
transfer, the frame, its index and the frame's size, which it decrypts into one buffer per frame:
a record altered, dropped, reordered or cut short fails its tag, and the message is dropped.

Untrusted input: whatever reaches the data port is checked before anything is sent; a bad
request is logged with its peer and the connection closed, and no payload byte leaves without a
valid proof. Nothing from the network is unpickled here. Lifetimes as for wire.bulk's segments: a
transfer is served once, then dropped; one nobody fetched is dropped when its receiver is
forgotten and after TTL_S.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import hmac
import ipaddress
import mmap
import os
import secrets
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import structlog
import tenacity
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from regent.wire import protocol
from regent.wire.errors import BulkError
from regent.wire.protocol import Kind

log = structlog.get_logger("regent.transport")

ADDR_ENV = "REGENT_BULK_ADDR"
TIMEOUT_ENV = "REGENT_BULK_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0
CHUNK = 1 << 20  # plaintext bytes per AES-GCM record: small enough to stay in cache between the passes
TAG = 16
# A transfer nobody fetched by then is given up (wire.bulk's segments live as long): a backstop,
# since one offered to a receiver known to be gone is given up at once (`forget`).
TTL_S = 600.0
SOCKET_BUFFER = 4 << 20
MAX_CONNECTIONS = 256  # open data connections a server keeps; more are closed at once
FIRST_REQUEST_S = 5.0  # a new connection must ask within this, or it is closed
IDLE_S = 60.0  # a connection that proved itself may wait this long for its next request
CONNECT_TIMEOUT_S = 3.0  # a reachable sender accepts in milliseconds; the receive loop waits this at most
POOL_IDLE_S = 45.0  # the receiver reuses a connection idle for less (the server keeps it IDLE_S)
KEEP_BYTES = 256 << 20  # receive buffers a process keeps for reuse, all together

_MAGIC = b"RGBK\x01"
_CHALLENGE = struct.Struct("!5s3x16s")  # magic + version, a random nonce for the next request
_REQUEST = struct.Struct("!5s3x16s32s")  # magic + version, transfer id, HMAC(key, label nonce id)
_STATUS = struct.Struct("!B7x")
ST_OK, ST_DENIED = 0, 1
_LABEL = b"regent bulk fetch v1"


def _mac(key: bytes, nonce: bytes, tid: bytes) -> bytes:
    return hmac.new(key, _LABEL + nonce + tid, hashlib.sha256).digest()


def _nonce(frame: int, chunk: int) -> bytes:
    return struct.pack("!IQ", frame, chunk)


def _aad(tid: bytes, frame: int, chunk: int, size: int) -> bytes:
    return tid + struct.pack("!IQQ", frame, chunk, size)


def timeout_s() -> float:
    """Seconds a data connection may make no progress before the fetch is given up."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r} must be a number of seconds") from None
    return max(0.1, value)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"the connection closed after {got} of {n} bytes")
        got += k


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


# --- the sender's side: transfers and the data server ------------------------------------------

@dataclass
class _Transfer:
    tid: bytes
    aead: AESGCM
    key: bytes
    frames: list  # (frame index in the message, 'B' memoryview of its bytes)
    to: str
    made: float


class _Transfers:
    """The transfers this process offers and nobody has fetched yet, oldest first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[bytes, _Transfer] = {}
        self.order: collections.deque[_Transfer] = collections.deque()
        self.served = 0

    def add(self, t: _Transfer) -> None:
        with self.lock:
            self.by_id[t.tid] = t
            self.order.append(t)
            while self.order and (self.order[0].tid not in self.by_id
                                  or t.made - self.order[0].made > TTL_S):
                self.by_id.pop(self.order.popleft().tid, None)  # fetched already, or expired

    def get(self, tid: bytes) -> _Transfer | None:
        with self.lock:
            t = self.by_id.get(tid)
            if t is not None and time.monotonic() - t.made > TTL_S:
                self.by_id.pop(tid, None)
                return None
            return t

    def pop(self, tid: bytes, served: bool = False) -> None:
        with self.lock:
            self.by_id.pop(tid, None)
            self.served += served

    def remove(self, which: Any) -> None:
        with self.lock:
            for tid in [tid for tid, t in self.by_id.items() if which(t.to)]:
                del self.by_id[tid]
            self.order = collections.deque(t for t in self.order if t.tid in self.by_id)

    def count(self) -> int:
        with self.lock:
            return len(self.by_id)


_transfers = _Transfers()


class _Server:
    """The data port: an accept thread and a thread per connection, each a loop of challenge,
    request, records. Stopped by `stop`."""

    def __init__(self) -> None:
        bind = os.environ.get(ADDR_ENV) or ""
        self._listener = _listen(bind)
        self.port = int(self._listener.getsockname()[1])
        self.advertise = bind  # empty: the address that routes to each receiver (`_source_address`)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, name="regent-bulk-accept", daemon=True)
        self._thread.start()
        log.debug("bulk data port listening", bind=bind or "*", port=self.port)

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
                full = len(self._conns) >= MAX_CONNECTIONS
                if not full:
                    self._conns.add(conn)
            if full:
                log.warning("refused a data connection: too many open", peer=peer, limit=MAX_CONNECTIONS)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, peer), name="regent-bulk-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        scratch = bytearray(CHUNK + TAG)
        try:
            _tune(conn)
            wait = FIRST_REQUEST_S
            while True:
                nonce = secrets.token_bytes(16)
                conn.sendall(_CHALLENGE.pack(_MAGIC, nonce))
                conn.settimeout(wait)
                try:
                    raw = _recv_exact(conn, _REQUEST.size)
                except ConnectionError:
                    return  # the receiver closed it (between requests, as a pool does)
                magic, tid, proof = _REQUEST.unpack(raw)
                t = _transfers.get(tid) if magic == _MAGIC else None
                if t is None or not hmac.compare_digest(proof, _mac(t.key, nonce, tid)):
                    log.warning("refused a bulk data request: not a transfer this process offers, or a "
                                "proof that does not match it", peer=peer,
                                reason="not a bulk request" if magic != _MAGIC else "unknown transfer or bad proof")
                    conn.sendall(_STATUS.pack(ST_DENIED))
                    return
                conn.settimeout(timeout_s())
                conn.sendall(_STATUS.pack(ST_OK))
                _send_records(conn, t, memoryview(scratch))
                _transfers.pop(tid, served=True)  # served once, like a segment mapped once
                wait = IDLE_S
        except (OSError, ConnectionError) as e:
            log.debug("bulk data connection ended", peer=peer, error=repr(e))
        except Exception:  # noqa: BLE001 - bad input must never take the sender down
            log.exception("bulk data connection failed; closed it", peer=peer)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

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


def _listen(bind: str) -> socket.socket:
    """A listening socket on `bind` (empty: every address, IPv6 and IPv4 where the host has both)."""
    if not bind and socket.has_dualstack_ipv6():
        return socket.create_server(("::", 0), family=socket.AF_INET6, backlog=128, dualstack_ipv6=True)
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    return socket.create_server((bind or "0.0.0.0", 0), family=family, backlog=128)


def _send_records(conn: socket.socket, t: _Transfer, scratch: memoryview) -> None:
    """Every frame of `t` as AES-GCM records, encrypted from the frame into `scratch` and sent."""
    encrypt = t.aead.encrypt_into
    for j, (_, view) in enumerate(t.frames):
        size = len(view)
        for i, at in enumerate(range(0, size, CHUNK)):
            n = min(CHUNK, size - at)
            encrypt(_nonce(j, i), view[at:at + n], _aad(t.tid, j, i, size), scratch[:n + TAG])
            conn.sendall(scratch[:n + TAG])


_server: _Server | None = None
_server_pid = 0
_server_lock = threading.Lock()


def server() -> _Server:
    """This process's data server, started on first use (and again in a forked child)."""
    global _server, _server_pid
    with _server_lock:
        if _server is None or _server_pid != os.getpid():
            _server, _server_pid = _Server(), os.getpid()
        return _server


def stop_server() -> None:
    global _server
    with _server_lock:
        if _server is not None and _server_pid == os.getpid():
            _server.stop()
        _server = None


def _host_of(address: str) -> str:
    """The host of a `tcp://host:port` inbox address (brackets of an IPv6 literal removed)."""
    rest = address.split("://", 1)[-1]
    host = rest.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


_sources: dict[str, str] = {}


def _source_address(to: str) -> str:
    """The address of this host that the kernel would use to reach the inbox `to`, which the
    receiver reaches this host at (a UDP connect sends nothing)."""
    host = _host_of(to)
    known = _sources.get(host)
    if known is not None:
        return known
    try:
        info = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as probe:
            probe.connect(info[4])
            found = str(probe.getsockname()[0])
    except OSError as e:
        raise OSError(f"no route from this host to {host} for large frames ({e}); set {ADDR_ENV} "
                      "to the address the other hosts reach this one at") from None
    _sources[host] = found
    return found


def export(frames: list, threshold: int, to: str) -> list:
    """`frames`, for the inbox at `to` on another host, with payload frames of `threshold` bytes
    or more offered on this process's data port, as a BULK envelope (inside a RELAY's, which
    the agent passes on untouched); `frames` itself if there is none."""
    outer: list = []
    inner = frames
    if protocol.kind_byte(frames[0]) == Kind.RELAY:
        outer, inner = [frames[0]], frames[1:]
        to = str(protocol.decode([frames[0]])[1].get("to"))
    big = [i for i in range(1, len(inner)) if len(inner[i]) >= threshold]
    if not big:
        return frames
    try:
        srv = server()
        host = srv.advertise or _source_address(to)
    except OSError as e:  # no port or no route: the bytes go inline, as they always could
        log.warning("could not offer a large frame on the bulk data port; sending it inline", error=str(e))
        return frames
    key, tid = AESGCM.generate_key(256), secrets.token_bytes(16)
    offered = [(i, memoryview(inner[i]).cast("B")) for i in big]
    _transfers.add(_Transfer(tid, AESGCM(key), key, offered, to, time.monotonic()))
    body = list(inner)
    for i in big:
        body[i] = b""
    meta = {"tcp": [host, srv.port], "id": tid, "key": key, "f": [[i, len(v)] for i, v in offered]}
    return [*outer, *protocol.encode(Kind.BULK, meta, body)]


def discard(frames: list) -> None:
    """Withdraw the transfer of an envelope `export` made that will not be sent after all."""
    for f in frames[:2]:
        if protocol.kind_byte(f) == Kind.BULK:
            meta = protocol.decode([f])[1]
            if isinstance(meta.get("id"), bytes):
                _transfers.pop(meta["id"])
            return


def forget(address: str) -> None:
    """The inbox at `address` is gone: withdraw the transfers offered to it that it never fetched."""
    _transfers.remove(lambda to: to == address)


def offered() -> int:
    """How many transfers this process offers that nobody has fetched: for tests and tools."""
    return _transfers.count()


def served() -> int:
    """How many transfers this process has served whole: for tests and tools."""
    return _transfers.served


# --- the receiver's side ---------------------------------------------------------------------

class _Retry(Exception):
    """A pooled connection that failed before any record arrived (its server closed it while it
    was idle): a fresh one may do."""


class _Unreachable(Exception):
    """A fresh connection to the data port failed before any record arrived."""


class _Pool:
    """Idle data connections per sender address, with when each was last used."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[tuple[socket.socket, float]]] = {}

    def take(self, addr: tuple[str, int], timeout: float) -> tuple[socket.socket, bool]:
        """A connection to `addr`, and whether it was pooled (a stale one fails its first read)."""
        now = time.monotonic()
        with self._lock:
            idle = self._idle.get(addr, [])
            while idle:
                sock, since = idle.pop()
                if now - since < POOL_IDLE_S:
                    return sock, True
                sock.close()
        sock = socket.create_connection(addr, timeout=timeout)
        try:
            _tune(sock)
        except OSError:
            sock.close()
            raise
        return sock, False

    def give(self, addr: tuple[str, int], sock: socket.socket) -> None:
        with self._lock:
            self._idle.setdefault(addr, []).append((sock, time.monotonic()))

    def clear(self) -> None:
        with self._lock:
            socks = [s for idle in self._idle.values() for s, _ in idle]
            self._idle.clear()
        for s in socks:
            s.close()


_pool = _Pool()


def _after_fork_in_child() -> None:
    """A forked child (a proc from its host's zygote) offers nothing and shares no connection."""
    global _transfers, _pool, _buffers
    _transfers, _pool, _buffers = _Transfers(), _Pool(), _Buffers()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class _Offer:
    """A checked BULK envelope's metadata: where to fetch, what, and into which frames."""

    addr: tuple[str, int]
    tid: bytes
    key: bytes
    frames: list  # [frame index, size]


def _offer(meta: Any, frames: list, limit: int) -> _Offer:
    """The envelope's metadata, each field checked (it came from the network)."""
    at, tid, key, wanted = (meta.get(k) for k in ("tcp", "id", "key", "f"))
    if not (isinstance(at, list) and len(at) == 2 and isinstance(at[0], str) and isinstance(at[1], int)
            and 0 < at[1] < 65536 and 0 < len(at[0]) <= 255):
        raise BulkError(f"a bulk envelope whose data port {at!r} is not [host, port]")
    try:
        ipaddress.ip_address(at[0])
    except ValueError:
        if not all(c.isalnum() or c in "-." for c in at[0]):
            raise BulkError(f"a bulk envelope whose data host {at[0]!r} is not an address") from None
    if not (isinstance(tid, bytes) and len(tid) == 16 and isinstance(key, bytes) and len(key) == 32):
        raise BulkError("a bulk envelope without a 16-byte transfer id and a 32-byte key")
    if not (isinstance(wanted, list) and 0 < len(wanted) <= len(frames)
            and all(isinstance(w, list) and len(w) == 2 and all(type(x) is int for x in w) for w in wanted)):
        raise BulkError("a bulk envelope whose 'f' is not a list of [frame, size]")
    seen = set()
    for index, size in wanted:
        if not 1 <= index < len(frames) or len(frames[index]) or index in seen or size <= 0:
            raise BulkError(f"a bulk envelope names frame {index!r} of {size!r} bytes, not an empty payload frame")
        seen.add(index)
    if sum(size for _, size in wanted) > limit:
        raise BulkError(f"a bulk envelope of more than {limit} bytes (REGENT_MAX_MESSAGE_BYTES)")
    return _Offer((at[0], at[1]), tid, key, wanted)


class _Buffers:
    """Receive buffers, kept for reuse once nothing but this pool holds them (no tensor, array or
    view over one is left): a fresh 64 MiB mapping costs ~25 ms of page faults here, a reused one
    none. Huge pages are not asked for: their compaction cost ~170 ms of CPU per 64 MiB here."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept: list[mmap.mmap] = []  # least recently handed out first

    def get(self, size: int) -> memoryview:
        with self.lock:
            for i in range(len(self.kept)):
                # Referenced by the list and getrefcount's argument only: nobody uses it.
                if len(self.kept[i]) == size and sys.getrefcount(self.kept[i]) == 2:
                    m = self.kept.pop(i)
                    self.kept.append(m)
                    return memoryview(m)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        fresh = mmap.mmap(-1, size, flags=flags)
        if size <= KEEP_BYTES:
            with self.lock:
                self.kept.append(fresh)
                while sum(len(m) for m in self.kept) > KEEP_BYTES:
                    self.kept.pop(0)  # let go: freed once its holders let go too
        return memoryview(fresh)


_buffers = _Buffers()


def _fetch_once(offer: _Offer, into: list[memoryview], timeout: float) -> None:
    try:
        sock, pooled = _pool.take(offer.addr, min(timeout, CONNECT_TIMEOUT_S))
    except OSError as e:  # refused, unreachable, a name that does not resolve, timed out
        raise _Unreachable(str(e)) from None
    started = False
    try:
        sock.settimeout(timeout)
        magic, nonce = _CHALLENGE.unpack(_recv_exact(sock, _CHALLENGE.size))
        if magic != _MAGIC:
            raise BulkError(f"{offer.addr[0]}:{offer.addr[1]} is not a regent bulk data port")
        sock.sendall(_REQUEST.pack(_MAGIC, offer.tid, _mac(offer.key, nonce, offer.tid)))
        (status,) = _STATUS.unpack(_recv_exact(sock, _STATUS.size))
        if status != ST_OK:
            raise BulkError("its sender no longer offers it (fetched already, given up after "
                            "its TTL, or the sender restarted)")
        started = True
        if not into:  # now, while the sender starts: faulting the buffers in overlaps its first records
            into.extend(_buffers.get(size) for _, size in offer.frames)
        _recv_records(sock, offer, into)
    except (OSError, ConnectionError) as e:
        sock.close()
        if not started:
            raise (_Retry if pooled else _Unreachable)(str(e)) from None
        raise BulkError(f"the data connection failed mid-transfer: {e}") from None
    except BaseException:
        sock.close()
        raise
    _pool.give(offer.addr, sock)


def _recv_records(sock: socket.socket, offer: _Offer, into: list[memoryview]) -> None:
    aead = AESGCM(offer.key)
    scratch = memoryview(bytearray(CHUNK + TAG))
    for j, dst in enumerate(into):
        size = len(dst)
        for i, at in enumerate(range(0, size, CHUNK)):
            n = min(CHUNK, size - at)
            record = scratch[:n + TAG]
            _recv_into(sock, record)
            try:
                aead.decrypt_into(_nonce(j, i), record, _aad(offer.tid, j, i, size), dst[at:at + n])
            except InvalidTag:
                raise BulkError(f"record {i} of frame {j} failed its AES-GCM check (altered, reordered "
                                "or from another transfer)") from None


def take(frames: list, meta: Any, limit: int) -> list:
    """The message inside a BULK envelope that names a data port (`frames` its payload, `meta` its
    metadata), its large frames fetched and decrypted. Raises BulkError when it cannot: the
    message is then dropped, and its sender sends it again."""
    offer = _offer(meta, frames, limit)
    into: list[memoryview] = []
    where = f"{offer.addr[0]}:{offer.addr[1]}"
    try:
        for attempt in tenacity.Retrying(retry=tenacity.retry_if_exception_type(_Retry),
                                         stop=tenacity.stop_after_attempt(3),
                                         wait=tenacity.wait_none(),
                                         reraise=True):
            with attempt:
                _fetch_once(offer, into, timeout_s())
    except (_Retry, _Unreachable) as e:
        raise BulkError(f"cannot fetch large frames from the sender's data port {where}: {e}. If hosts "
                        f"cannot reach each other's data ports, open them, set {ADDR_ENV} to an "
                        "address they can reach, or set REGENT_BULK_BYTES=0 to send bytes inline") from None
    except BulkError as e:
        raise BulkError(f"large frames from {where}: {e}") from None
    out = list(frames)
    for (index, _), view in zip(offer.frames, into, strict=True):
        out[index] = view
    return out
