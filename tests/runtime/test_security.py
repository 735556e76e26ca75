"""Untrusted input: garbage, truncated and oversized frames, and peers without the
cluster's CURVE keys, are refused; the proc keeps serving its real controller."""

from __future__ import annotations

import time

import pytest
import zmq

from controller import Session
from tests.runtime.rawpeer import RawPeer
from worker import Actor, endpoint
from worker import _wire as wire
from worker._wire import Kind
from worker.security import Credentials, is_loopback, load_credentials, secure_server


class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x


@pytest.fixture()
def secure_home(own_home):
    """A separate REGENT_HOME with CURVE on and a 1 MiB message cap: its own host agent."""
    return own_home(REGENT_SECURE="1", REGENT_MAX_MESSAGE_BYTES=str(1 << 20))


def _still_serves(mesh) -> None:
    assert mesh.echo.call_one("alive").get(timeout=10) == "alive"


def test_malformed_frames_are_dropped_and_the_proc_keeps_serving(secure_home):
    with Session("hostile") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        addr = mesh._procs[0].address
        peer = RawPeer(load_credentials())  # an authenticated peer gone wrong
        try:
            bad = [
                [b"garbage"],
                [b""],
                [b"RG\x01\x01\x00\x00\x10\x00" + b"\x80"],  # metadata length beyond the frame
                [b"RG\x09\x01\x00\x00\x00\x01\xc0"],  # wire version 9
                [b"RG\x01\x63\x00\x00\x00\x01\xc0"],  # unknown kind
                [b"RG\x01\x01\x00\x00\x00\x03\xa2hi"],  # metadata is not a map
                wire.encode(Kind.CALL, {"sid": s.sid}),  # fields missing
                wire.encode(Kind.CALL, {"sid": s.sid, "e": "one", "s": 1}),  # wrong types
            ]
            for frames in bad:
                peer.send(addr, frames)
            # A well-formed call whose pickle payload is truncated: an error reply, not a crash.
            frames = wire.dumps((("x" * 1000,), {}))
            meta = {"sid": s.sid, "e": s.epoch, "s": 7000, "a": "echo", "m": "echo",
                    "d": wire.digest(frames), "rt": peer.address, "pt": 0}
            peer.send(addr, wire.encode(Kind.CALL, meta, [frames[0][:20]]))
            kind, reply, _ = peer.recv()
            assert kind is Kind.RESULT and reply["st"] == "err"
            _still_serves(mesh)
            # Oversized: above the 1 MiB cap, the transport disconnects the sender.
            peer.send(addr, [b"x" * (2 << 20)])
            time.sleep(0.2)
            _still_serves(mesh)
        finally:
            peer.close()
        log = (secure_home / "host.log").read_text()
        assert log.count("dropped malformed message") >= len(bad)


def test_a_peer_without_the_cluster_keys_is_refused(secure_home):
    with Session("keys") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        addr = mesh._procs[0].address
        # Right PLAIN secret but no CURVE keys: the handshake fails, nothing is delivered.
        plain = RawPeer(Credentials(load_credentials().secret))
        try:
            plain.call(addr, s.sid, s.epoch, 8000, "echo", "echo", ("sneaky",))
            with pytest.raises(TimeoutError):
                plain.recv(timeout=1.0)
        finally:
            plain.close()
        # A socket with no security at all.
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.PUSH)
            sock.linger = 0
            sock.connect(addr)
            sock.send_multipart(wire.encode(Kind.PING, {"rt": "tcp://127.0.0.1:1", "n": 1}))
        finally:
            ctx.destroy(linger=0)
        _still_serves(mesh)


def test_binding_beyond_loopback_requires_curve_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("REGENT_HOME", str(tmp_path / "h"))
    ctx = zmq.Context()
    try:
        with pytest.raises(RuntimeError, match="regent keys init"):
            secure_server(ctx.socket(zmq.PULL), Credentials(b"s"), "0.0.0.0")
    finally:
        ctx.destroy(linger=0)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("10.1.2.3")
