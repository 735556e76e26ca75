"""Untrusted fields and sizes: every field a receiver reads from the network is checked
against wire.schema first, and REGENT_MAX_MESSAGE_BYTES bounds a whole message, not
each frame. What fails is dropped and logged with its peer; the program's calls go on."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

from regent import wire
from regent.controller import ActorError, Session
from regent.wire import Kind, ProtocolError, schema
from regent.worker import Actor, endpoint
from regent.worker.discovery import ensure_local_host
from tests.runtime.rawpeer import RawPeer

CAP = 1 << 20


class Store(Actor):
    """Remembers what it was sent."""

    def __init__(self) -> None:
        self.seen: list = []

    @endpoint
    def add(self, x: object) -> int:
        self.seen.append(x)
        return len(self.seen)

    @endpoint
    def history(self) -> list:
        return [type(x).__name__ for x in self.seen]

    @endpoint
    def slow(self, x: object, delay: float) -> object:
        time.sleep(delay)
        return x

    @endpoint
    def blob(self, n: int) -> bytes:
        return b"x" * n


@pytest.fixture()
def capped_home(own_home):
    """A REGENT_HOME of its own (so its own host agent and host.log) with a 1 MiB cap."""
    return own_home(REGENT_MAX_MESSAGE_BYTES=str(CAP))


def _many_frames(value: object, frames: int = 6, each: int = 900_000) -> list:
    """Payload frames of (value, buffers...): `frames` out-of-band buffers, each under CAP,
    together far above it (6 x 900 kB: a 5.4 MB message in 8 frames with its header)."""
    bufs = [pickle.PickleBuffer(bytearray(each)) for _ in range(frames)]
    out = wire.dumps((value, *bufs))
    assert len(out) == frames + 1 and all(len(f) < CAP for f in out)
    return out


def _wait_for_lines(read, needle: str, count: int, timeout: float = 10.0) -> list[str]:
    """Lines containing needle in what read() returns, once there are `count` (or the timeout)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        seen += [line for line in read().splitlines() if needle in line]
        if len(seen) >= count or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


def _log_reader(path: Path):
    offset = 0

    def read() -> str:
        nonlocal offset
        try:
            text = path.read_text()
        except FileNotFoundError:
            return ""
        new, offset = text[offset:], len(text)
        return new

    return read


# --- the schema itself, without processes ------------------------------------------------


@pytest.mark.parametrize("kind, meta, field", [
    (Kind.PONG, {"n": [1, 2]}, "$.n"),
    (Kind.RESULT, {"s": "x", "pt": 0, "st": "ok"}, "$.s"),
    (Kind.RESULT, {"s": 1, "pt": None, "st": "ok"}, "$.pt"),
    (Kind.RESULT, {"s": 1, "pt": 0, "st": 5}, "$.st"),
    (Kind.RESULT, {"s": 1, "pt": 0, "st": "maybe"}, "$.st"),
    (Kind.RESULT, {"s": 1, "pt": -1, "st": "ok"}, "$.pt"),
    (Kind.RESULT, {"s": True, "pt": 0, "st": "ok"}, "$.s"),
    (Kind.RESULT, {"s": 1, "pt": 0, "st": "err", "et": "x" * 1025}, "$.et"),
    (Kind.RESULT, {"s": 1, "pt": 0}, "st"),
    (Kind.HOST_REP, {"st": "ok", "procs": [{"id": "p", "idx": 0, "addr": "http://x", "pid": 5}]}, "addr"),
    (Kind.HOST_EVENT, {"sid": "s", "ev": "proc_died", "id": ["x"]}, "$.id"),
])
def test_the_controller_schema_refuses_fields_of_the_wrong_type_or_out_of_bounds(kind, meta, field):
    with pytest.raises(ProtocolError, match=field.replace("$", r"\$")):
        schema.CONTROLLER.decode(wire.encode(kind, meta))


def test_a_receiver_sees_only_declared_fields_and_refuses_kinds_it_does_not_take():
    kind, meta, _ = schema.CONTROLLER.decode(wire.encode(Kind.PONG, {"n": 3, "pid": 10, "extra": [1]}))
    assert (kind, meta) == (Kind.PONG, {"n": 3, "pid": 10})
    with pytest.raises(ProtocolError, match="a proc does not accept PONG"):
        schema.PROC.decode(wire.encode(Kind.PONG, {"n": 1}))


# --- wrongly typed fields, through real sockets -------------------------------------------


def test_wrongly_typed_replies_are_dropped_and_logged_with_the_peer_and_calls_complete(capfd):
    with Session("typed-replies") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("store", Store)
        assert mesh.add.call_one(0).get(timeout=10) == 1
        peer = RawPeer()
        try:
            bad = [
                wire.encode(Kind.PONG, {"n": [1, 2]}),  # unhashable: a TypeError in .get() before
                wire.encode(Kind.RESULT, {"sid": s.sid, "s": "x", "pt": 0, "st": "ok"}),
                wire.encode(Kind.RESULT, {"sid": s.sid, "s": 1, "pt": None, "st": "ok"}),
                wire.encode(Kind.RESULT, {"sid": s.sid, "s": 1, "pt": 0, "st": 5}),
                wire.encode(Kind.RESULT, {"sid": s.sid, "s": 1, "pt": 0, "st": "ok", "n": {"a": 1}}),
                wire.encode(Kind.HOST_REP, {"n": [1], "st": "ok"}),
                wire.encode(Kind.HOST_EVENT, {"sid": s.sid, "ev": "proc_died", "id": ["x"]}),
            ]
            capfd.readouterr()
            for frames in bad:
                peer.send(s.runtime.reply_address, frames)
            peer.send(s.runtime.reply_address, wire.encode_batch([wire.encode(Kind.PONG, {"n": [3]})]))
            for i in range(20):
                assert mesh.add.call_one(i).get(timeout=10) == i + 2
                time.sleep(0.01)
            # Requests answered by id still reach their waiters.
            reply = s.runtime.host_request(s._lifecycle.hosts[0], "hello", timeout=10)
            assert any(p["id"] == mesh._procs[0].id for p in reply["procs"])
        finally:
            peer.close()
        lines = _wait_for_lines(lambda: capfd.readouterr().err, "dropped malformed message", len(bad) + 1)
        assert len(lines) == len(bad) + 1, lines
        assert all("127.0.0.1" in line for line in lines), lines  # the peer
        assert any("$.n" in line for line in lines)


def test_a_proc_drops_a_call_whose_point_is_out_of_bounds(own_home):
    home = own_home()
    with Session("typed-calls") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("store", Store)
        addr = mesh._procs[0].address
        peer = RawPeer()
        try:
            read = _log_reader(home / "host.log")
            peer.call(addr, s.sid, s.epoch, seq=70_000, actor="store", method="add", args=(1,), point=-1)
            frames = wire.dumps(((1,), {}))
            peer.send(addr, wire.encode(Kind.CALL, {"sid": s.sid, "e": s.epoch, "s": 70_001, "a": "store",
                                                   "m": "add", "d": wire.digest(frames), "rt": peer.address,
                                                   "pt": 0, "co": "not a map"}, frames))  # ignored field: runs
            lines = _wait_for_lines(read, "dropped malformed message", 1)
            assert len(lines) == 1 and "127.0.0.1" in lines[0] and "$.pt" in lines[0], lines
            kind, meta, value = peer.recv(timeout=10)
            assert (kind, meta["s"], value) == (Kind.RESULT, 70_001, 1)
            assert mesh.history.call_one().get(timeout=10) == ["int"]
        finally:
            peer.close()


def test_a_host_agent_drops_a_request_with_an_epoch_beyond_int64(own_home):
    home = own_home()
    with Session("typed-host") as s:
        s.spawn_procs(per_host={"procs": 1})
        host = ensure_local_host()
        peer = RawPeer()
        try:
            read = _log_reader(home / "host.log")
            peer.send(host, wire.encode(Kind.HOST_REQ, {"sid": s.sid, "e": 2**64 - 1, "op": "list", "n": 8,
                                                        "rt": peer.address}))
            lines = _wait_for_lines(read, "dropped malformed message", 1)
            assert len(lines) == 1 and "127.0.0.1" in lines[0] and "$.e" in lines[0], lines
            # Had it been taken, that epoch would fence the session's controller out for good.
            assert peer.ask_host(host, s.sid, s.epoch, "list")["st"] == "ok"
        finally:
            peer.close()


def test_a_host_agent_drops_malformed_relays_and_passes_a_good_one_on_untouched(own_home):
    home = own_home()
    host = ensure_local_host()
    peer = RawPeer()
    try:
        read = _log_reader(home / "host.log")
        ping = wire.encode(Kind.PING, {"n": 5, "rt": peer.address})
        peer.send(host, wire.encode(Kind.RELAY, {"to": host}))  # nothing to pass on
        peer.send(host, [wire.relay_header("tcp://nowhere:0"), *ping])  # not an address
        peer.send(host, wire.encode_batch([[wire.relay_header(host), *ping][:1], [b"junk"]]))
        lines = _wait_for_lines(read, "dropped malformed message", 4)  # the batch's two each count
        assert len(lines) == 4 and all("127.0.0.1" in line for line in lines), lines
        # A good one, relayed to the agent itself: the PING reaches its inbox as if sent there.
        peer.send(host, [wire.relay_header(host), *ping])
        kind, meta, _ = peer.recv(timeout=10)
        assert kind is Kind.PONG and meta["n"] == 5
    finally:
        peer.close()


# --- the cap on a whole message ------------------------------------------------------------


def test_the_controller_drops_a_message_over_the_cap_in_frames_each_under_it(capped_home, capfd):
    with Session("capped-controller") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("store", Store)
        peer = RawPeer()
        try:
            capfd.readouterr()
            fut = mesh.slow.call_one("real", 1.5)
            forged = wire.encode(Kind.RESULT, {"sid": s.sid, "s": fut.tag, "a": "store", "pt": 0, "st": "ok"},
                                 _many_frames("forged"))
            peer.send(s.runtime.reply_address, forged)
            assert fut.get(timeout=10) == "real"
            assert mesh.add.call_one(1).get(timeout=10) == 1
        finally:
            peer.close()
        lines = _wait_for_lines(lambda: capfd.readouterr().err, "dropped oversized message", 1)
        assert len(lines) == 1 and "127.0.0.1" in lines[0] and "REGENT_MAX_MESSAGE_BYTES" in lines[0], lines


def test_a_proc_drops_a_call_over_the_cap_in_frames_each_under_it(capped_home):
    with Session("capped-proc") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("store", Store)
        addr = mesh._procs[0].address
        peer = RawPeer()
        try:
            read = _log_reader(capped_home / "host.log")
            frames = _many_frames("big")
            meta = {"sid": s.sid, "e": s.epoch, "s": 80_000, "a": "store", "m": "add",
                    "d": wire.digest(frames), "rt": peer.address, "pt": 0}
            peer.send(addr, wire.encode(Kind.CALL, meta, frames))
            lines = _wait_for_lines(read, "dropped oversized message", 1)
            assert len(lines) == 1 and "127.0.0.1" in lines[0], lines
            assert mesh.history.call_one().get(timeout=10) == []
            assert mesh.add.call_one("alive").get(timeout=10) == 1
        finally:
            peer.close()


def test_a_host_agent_drops_a_request_over_the_cap_in_frames_each_under_it(capped_home):
    with Session("capped-host") as s:
        s.spawn_procs(per_host={"procs": 1})
        host = ensure_local_host()
        peer = RawPeer()
        try:
            read = _log_reader(capped_home / "host.log")
            meta = {"sid": s.sid, "e": s.epoch, "op": "list", "n": 9, "rt": peer.address}
            peer.send(host, wire.encode(Kind.HOST_REQ, meta, [b"x" * 900_000] * 6))
            lines = _wait_for_lines(read, "dropped oversized message", 1)
            assert len(lines) == 1 and "127.0.0.1" in lines[0], lines
            with pytest.raises(TimeoutError):
                peer.recv(timeout=0.5)  # no answer to it
            assert peer.ask_host(host, s.sid, s.epoch, "list")["st"] == "ok"
        finally:
            peer.close()


def test_a_call_over_the_cap_is_refused_with_the_limit_named_and_the_session_goes_on(capped_home):
    with Session("capped-call") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("store", Store)
        with pytest.raises(wire.MessageTooLarge, match=rf"above the {CAP}-byte .*REGENT_MAX_MESSAGE_BYTES"):
            mesh.add.call_one(b"x" * (2 * CAP)).get(timeout=5)
        assert mesh.add.call_one(1).get(timeout=10) == 1
        assert mesh.history.call_one().get(timeout=10) == ["int"]


def test_a_result_over_the_cap_fails_its_call_with_the_limit_named(capped_home):
    with Session("capped-result") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("store", Store)
        with pytest.raises(ActorError, match="MessageTooLarge.*REGENT_MAX_MESSAGE_BYTES"):
            mesh.blob.call_one(2 * CAP).get(timeout=5)
        assert len(mesh.blob.call_one(CAP // 2).get(timeout=10)) == CAP // 2
