"""Large frames to a peer on another host (wire.bulk_tcp): offered on the sender's data port,
fetched by the receiver that got the CURVE envelope with the transfer's id and key, AES-GCM
encrypted per record; nobody else gets a payload byte, an altered, reordered or cut stream is
detected and its message dropped, and an offer nobody fetched is withdrawn.

On one machine the cross-host path is forced with REGENT_BULK_ROUTE=tcp (every peer is treated
as if on another host); tests/multihost runs it between namespace hosts."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest
import torch
import zmq

from regent import wire
from regent.controller import Session
from regent.wire import bulk, bulk_tcp
from regent.wire.protocol import Kind, kind_byte
from regent.worker import endpoint
from tests.runtime.test_bulk import Echo, _arrays, _same, _tensors

BIG = 3 * bulk_tcp.CHUNK + 12345  # several records, the last one short
THRESHOLD = 256 * 1024
TO = "tcp://127.0.0.1:1"


def _message(*payload: bytes) -> list:
    return wire.encode(Kind.CALL, {"s": 1}, [b"main", *payload])


def _offer(*payload: bytes) -> tuple[list, dict]:
    out = bulk_tcp.export(_message(*payload), THRESHOLD, TO)
    assert kind_byte(out[0]) == Kind.BULK
    _, meta, inner = wire.decode(out)
    return inner, meta


@pytest.fixture(autouse=True)
def _withdraw_offers():
    yield
    bulk.forget(TO)


def test_a_large_frame_is_offered_fetched_once_and_decrypted_whole():
    small, big = b"s" * 100, os.urandom(BIG)
    before = bulk_tcp.offered()
    inner, meta = _offer(small, big)
    assert inner[3] == b"" and inner[2] == small and meta["f"] == [[3, BIG]]  # only the large frame moved
    assert len(meta["id"]) == 16 and len(meta["key"]) == 32 and bulk_tcp.offered() == before + 1
    frames = bulk.take(inner, meta, 1 << 30)
    assert bytes(frames[3]) == big and bytes(frames[2]) == small and bulk_tcp.offered() == before
    frames[3][:4] = b"\0\0\0\0"  # the receiver's own buffer
    with pytest.raises(bulk.BulkError, match="no longer offers"):
        bulk.take(inner, meta, 1 << 30)  # served once


def test_a_receive_buffer_is_reused_only_once_nothing_holds_it(monkeypatch):
    monkeypatch.setattr(bulk_tcp, "_buffers", bulk_tcp._Buffers())  # none kept from other tests
    first, second = os.urandom(BIG), os.urandom(BIG)
    held = bulk.take(*_offer(first), 1 << 30)[-1]
    array = np.frombuffer(held, dtype=np.uint8)  # what the program built over it
    got = bulk.take(*_offer(second), 1 << 30)[-1]
    assert got.obj is not held.obj and bytes(array) == first  # still held: a fresh buffer
    mapping = id(held.obj)  # the pool keeps it alive, so the id stays its own
    del held, array
    got = bulk.take(*_offer(first), 1 << 30)[-1]
    assert id(got.obj) == mapping and bytes(got) == first  # let go: reused, and written whole


def test_the_route_is_shared_memory_on_this_host_and_tcp_elsewhere(monkeypatch):
    assert bulk.route("tcp://127.0.0.1:5") == "shm" and bulk.route("tcp://10.0.0.2:5") == "tcp"
    monkeypatch.setenv("REGENT_BULK_ROUTE", "tcp")
    assert bulk.route("tcp://127.0.0.1:5") == "tcp"
    monkeypatch.setenv("REGENT_BULK_ROUTE", "udp")
    with pytest.raises(ValueError, match="REGENT_BULK_ROUTE"):
        bulk.route("tcp://127.0.0.1:5")


@pytest.mark.parametrize("defect", ["no data port", "bad id", "frame not empty", "over the limit", "bad host"])
def test_an_envelope_that_does_not_check_out_is_refused_before_any_connection(defect):
    inner, meta = _offer(os.urandom(BIG))
    limit = 1 << 30
    if defect == "no data port":
        meta["tcp"] = ["127.0.0.1", 0]
    elif defect == "bad id":
        meta["id"] = b"short"
    elif defect == "frame not empty":
        meta["f"] = [[1, BIG]]
    elif defect == "over the limit":
        limit = BIG - 1
    else:
        meta["tcp"][0] = "host name; rm -rf /"
    with pytest.raises(bulk.BulkError, match="a bulk envelope"):
        bulk.take(inner, meta, limit)


def test_a_sender_that_cannot_be_reached_fails_the_fetch_with_what_to_do():
    inner, meta = _offer(os.urandom(BIG))
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]  # nothing listens there once closed
    meta["tcp"] = ["127.0.0.1", port]
    with pytest.raises(bulk.BulkError, match="cannot fetch large frames.*REGENT_BULK_BYTES=0"):
        bulk.take(inner, meta, 1 << 30)


def test_a_pooled_connection_its_server_closed_is_replaced(monkeypatch):
    monkeypatch.setattr(bulk_tcp, "IDLE_S", 0.1)  # the server closes a connection idle this long
    big = os.urandom(BIG)
    assert bytes(bulk.take(*_offer(big), 1 << 30)[-1]) == big  # leaves its connection in the pool
    time.sleep(0.5)
    assert bytes(bulk.take(*_offer(big), 1 << 30)[-1]) == big


def test_an_offer_nobody_fetched_is_withdrawn_after_its_ttl_and_when_its_receiver_is_forgotten(monkeypatch):
    inner, meta = _offer(os.urandom(BIG))
    bulk.forget(TO)  # the receiver is gone
    with pytest.raises(bulk.BulkError, match="no longer offers"):
        bulk.take(inner, meta, 1 << 30)
    monkeypatch.setattr(bulk_tcp, "TTL_S", 0.0)
    inner, meta = _offer(os.urandom(BIG))
    time.sleep(0.01)
    with pytest.raises(bulk.BulkError, match="no longer offers"):
        bulk.take(inner, meta, 1 << 30)
    assert bulk_tcp.offered() == 0


# --- who may fetch -------------------------------------------------------------------------

def _read_all(sock: socket.socket) -> bytes:
    got = b""
    sock.settimeout(10)
    while chunk := sock.recv(1 << 16):
        got += chunk
    return got


def _challenge(sock: socket.socket) -> bytes:
    magic, nonce = bulk_tcp._CHALLENGE.unpack(bulk_tcp._recv_exact(sock, bulk_tcp._CHALLENGE.size))
    assert magic == bulk_tcp._MAGIC
    return nonce


@pytest.mark.parametrize("attack", ["garbage", "random id", "wrong key", "replayed", "silent", "half a request"])
def test_a_peer_without_the_envelope_gets_no_payload_bytes_and_the_server_survives(monkeypatch, attack):
    monkeypatch.setattr(bulk_tcp, "FIRST_REQUEST_S", 0.5)
    inner, meta = _offer(os.urandom(BIG))
    tid, port = meta["id"], meta["tcp"][1]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        nonce = _challenge(sock)
        if attack == "garbage":
            sock.sendall(os.urandom(bulk_tcp._REQUEST.size))
        elif attack == "random id":
            forged = os.urandom(16)
            sock.sendall(bulk_tcp._REQUEST.pack(bulk_tcp._MAGIC, forged, bulk_tcp._mac(os.urandom(32), nonce, forged)))
        elif attack == "wrong key":  # the id leaked, the key did not
            sock.sendall(bulk_tcp._REQUEST.pack(bulk_tcp._MAGIC, tid, bulk_tcp._mac(os.urandom(32), nonce, tid)))
        elif attack == "replayed":  # a valid request, seen on the network, for another connection's challenge
            with socket.create_connection(("127.0.0.1", port)) as other:
                seen = bulk_tcp._REQUEST.pack(bulk_tcp._MAGIC, tid, bulk_tcp._mac(meta["key"], _challenge(other), tid))
            sock.sendall(seen)
        elif attack == "half a request":
            sock.sendall(bulk_tcp._REQUEST.pack(bulk_tcp._MAGIC, tid, b"\0" * 32)[:20])
            sock.shutdown(socket.SHUT_WR)
        rest = _read_all(sock)  # until the server closes the connection
    assert len(rest) <= bulk_tcp._STATUS.size  # a refusal at most: no record
    if rest:
        assert bulk_tcp._STATUS.unpack(rest)[0] == bulk_tcp.ST_DENIED
    big = bulk.take(inner, meta, 1 << 30)[-1]  # the offer stands, and the server still serves it
    assert len(big) == BIG


# --- a stream altered on its way --------------------------------------------------------------

class _Proxy:
    """A TCP relay to the data port that passes the challenge, request and status on unchanged and
    hands the records to `alter` (all of them, as bytes) before passing them on."""

    def __init__(self, meta: dict, alter):
        self.port, self.sizes, self.alter = meta["tcp"][1], [size for _, size in meta["f"]], alter
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(("127.0.0.1", self.port))
        head = bulk_tcp._CHALLENGE.size
        client.sendall(bulk_tcp._recv_exact(server, head))
        server.sendall(bulk_tcp._recv_exact(client, bulk_tcp._REQUEST.size))
        status = bulk_tcp._recv_exact(server, bulk_tcp._STATUS.size)
        n = 0
        for size in self.sizes:
            records = -(-size // bulk_tcp.CHUNK)
            n += size + records * bulk_tcp.TAG
        client.sendall(status + self.alter(bulk_tcp._recv_exact(server, n)))
        time.sleep(0.2)
        client.close()
        server.close()


def _flip(data: bytes) -> bytes:
    at = bulk_tcp.CHUNK + 100  # inside the second record
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


def _swap(data: bytes) -> bytes:
    r = bulk_tcp.CHUNK + bulk_tcp.TAG
    return data[r:2 * r] + data[:r] + data[2 * r:]


def _cut(data: bytes) -> bytes:
    return data[:-1000]


@pytest.mark.parametrize("alter", [_flip, _swap, _cut], ids=["a flipped bit", "two records swapped", "cut short"])
def test_an_altered_stream_is_detected_and_nothing_torn_is_delivered(alter):
    inner, meta = _offer(os.urandom(BIG))
    proxy = _Proxy(meta, alter)
    meta = {**meta, "tcp": ["127.0.0.1", proxy.listener.getsockname()[1]]}
    match = "mid-transfer" if alter is _cut else "AES-GCM"
    with pytest.raises(bulk.BulkError, match=match):
        bulk.take(inner, meta, 1 << 30)


def test_a_record_corrupted_in_flight_drops_its_message_at_the_inbox(own_home, monkeypatch):
    own_home()
    monkeypatch.setenv("REGENT_BULK_ROUTE", "tcp")
    from regent.wire.security import load_credentials
    from regent.wire.transport import Inbox, Peer

    send = bulk_tcp._send_records

    def corrupting(conn, t, scratch):  # the wire flips one bit of the first record's ciphertext
        class Flipping:
            def sendall(self, data):
                data = bytearray(data)
                data[7] ^= 1
                conn.sendall(data)
                self.sendall = conn.sendall

        send(Flipping(), t, scratch)

    ctx = zmq.Context()
    creds = load_credentials()
    inbox = Inbox(ctx, creds, "127.0.0.1")
    peer = Peer(ctx, creds, inbox.address)
    try:
        big = os.urandom(BIG)
        monkeypatch.setattr(bulk_tcp, "_send_records", corrupting)
        peer.send(_message(big))
        assert inbox.admit(inbox.sock.recv_multipart(copy=False)) is None  # dropped, not torn
        monkeypatch.setattr(bulk_tcp, "_send_records", send)
        peer.send(_message(big))  # its sender sends it again
        frames = inbox.admit(inbox.sock.recv_multipart(copy=False))
        assert bytes(frames[-1]) == big
    finally:
        peer.close()
        inbox.close()
        ctx.destroy(linger=0)


# --- through real sessions -----------------------------------------------------------------

class Offers(Echo):
    @endpoint
    def offered(self) -> tuple[int, int]:
        return bulk_tcp.offered(), bulk_tcp.served()

    @endpoint
    def ship(self, n: int) -> np.ndarray:
        return np.arange(n, dtype=np.int64)


@pytest.fixture(params=["direct", "relay"])
def route(request, own_home) -> str:
    own_home(REGENT_HIPCORE_BACKEND="cpu", REGENT_RELAY="1" if request.param == "relay" else "0",
             REGENT_BULK_ROUTE="tcp")
    return request.param


def test_tensors_and_arrays_above_and_below_the_threshold_echo_equal_over_tcp(route):
    served = bulk_tcp.served()
    with Session(f"bulk-xhost-{route}", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("e", Offers)
        one = mesh.slice(procs=1)
        values = [*_tensors(), *_arrays()]
        for value in values:
            assert _same(value, one.echo.call_one(value).get(timeout=60)), value.dtype
        for value in values[::4]:
            assert _same(value, one.echo_async.call_one(value).get(timeout=60))
            got = mesh.echo.call({"v": value, "n": 3}).get(timeout=60)  # a mesh-wide call: a transfer each
            assert all(_same(value, r["v"]) and r["n"] == 3 for r in got.values())
        assert np.array_equal(one.ship.call_one(1 << 20).get(timeout=60), np.arange(1 << 20))
        a = np.arange(1 << 18, dtype=np.int64)
        assert np.array_equal(one.add_one.call_one(a).get(timeout=60), a + 1) and a[0] == 0
        pids = [os.getpid(), *mesh.pid.call().get(timeout=30).values()]
        # nothing went through /dev/shm (this process may keep free segments of earlier tests)
        assert not [n for p in pids[1:] for n in bulk.held(p)] and not bulk.in_use(pids[0])
        assert bulk_tcp.offered() == 0 and bulk_tcp.served() > served  # every call's large frames fetched
        procs = mesh.offered.call().get(timeout=30).values()
        assert all(offered == 0 and served > 0 for offered, served in procs)  # every result's too


def test_a_large_tensor_result_to_a_controller_on_another_host(own_home):
    own_home(REGENT_HIPCORE_BACKEND="cpu", REGENT_BULK_ROUTE="tcp")
    value = torch.randn(16 << 20)  # 64 MiB
    with Session("bulk-xhost-64m", journal="off") as s:
        one = s.spawn_procs(per_host={"procs": 1}).spawn("e", Offers)
        for _ in range(2):
            assert _same(value, one.echo.call_one(value).get(timeout=120))
