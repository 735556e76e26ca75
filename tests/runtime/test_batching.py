"""Batched sends (wire/protocol.py BATCH): many calls or replies travel in one message,
and each one inside is validated and handled as if it had come alone. A bad batch, or a
bad message in a batch, is dropped; the proc keeps serving; per-sender FIFO holds across
batch boundaries; nothing the program queued waits for a later call to go out."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from regent import wire
from regent.controller import Session
from regent.wire import Kind, ProtocolError
from regent.wire.security import load_credentials
from regent.wire.transport import wait_until
from regent.worker import Actor, endpoint
from tests.runtime.rawpeer import RawPeer


class Log(Actor):
    """Remembers what it was sent, in the order it ran."""

    def __init__(self, path: str = "") -> None:
        self.seen: list = []
        self.path = path

    @endpoint
    def add(self, x: object) -> int:
        self.seen.append(x)
        return len(self.seen)

    @endpoint
    def note(self, x: object) -> None:
        self.seen.append(x)
        if self.path:
            with open(self.path, "a") as f:
                f.write(f"{x}\n")

    @endpoint
    def history(self) -> list:
        return list(self.seen)


def _call(sid: str, epoch: int, seq: int, rt: str, x: object) -> list:
    frames = wire.dumps(((x,), {}))
    meta = {"sid": sid, "e": epoch, "s": seq, "a": "log", "m": "add", "d": wire.digest(frames),
            "rt": rt, "pt": 0}
    return wire.encode(Kind.CALL, meta, frames)


def _batch(lengths: object, body: bytes, extra: list | None = None) -> list:
    return wire.encode(Kind.BATCH, {"n": lengths}) + [body] + (extra or [])


def _results(peer: RawPeer, count: int) -> dict[int, tuple[dict, object]]:
    got: dict[int, tuple[dict, object]] = {}
    while len(got) < count:
        kind, meta, value = peer.recv(timeout=10)
        if kind is Kind.RESULT:
            got[meta["s"]] = (meta, value)
    return got


# --- the format itself, without processes --------------------------------------------


def test_pack_keeps_order_and_limits_and_split_gives_back_each_message():
    msgs = [wire.encode(Kind.PING, {"n": i}) for i in range(wire.BATCH_MESSAGES + 10)]
    big = wire.encode(Kind.PING, {"n": "big"}, [b"x" * (wire.BATCH_ALONE_BYTES + 1)])
    packed = wire.pack(msgs[:5] + [big] + msgs[5:])
    seen = []
    for frames in packed:
        kind, meta, payload = wire.decode(frames)
        if kind is Kind.BATCH:
            subs = wire.split_batch(meta, payload)
            assert len(subs) <= wire.BATCH_MESSAGES
            seen += [wire.decode_one(sub)[1]["n"] for sub in subs]
        else:
            seen.append(meta["n"])
    assert seen == list(range(5)) + ["big"] + list(range(5, wire.BATCH_MESSAGES + 10))
    assert wire.decode(packed[1])[0] is Kind.PING  # the big one travelled alone


@pytest.mark.parametrize("lengths, body, why", [
    ([[8, 3]], b"x" * 5, "do not fit"),  # truncated: the body is shorter than listed
    ([[2]], b"xyz", "cover 2 of its 3"),  # bytes left over
    ("nope", b"", "must list"),
    ([], b"", "must list"),
    ([[1]] * (wire.MAX_BATCH + 1), b"x" * (wire.MAX_BATCH + 1), "must list"),
    ([["1"]], b"x", "do not fit"),
    ([[-1]], b"x", "do not fit"),
    ([[]], b"", "are not 1.."),
    ([[1] * (wire.BATCH_MESSAGE_FRAMES + 1)], b"x" * 10, "are not 1.."),
])
def test_split_batch_refuses_lengths_that_do_not_describe_the_body(lengths, body, why):
    kind, meta, payload = wire.decode(_batch(lengths, body))
    assert kind is Kind.BATCH
    with pytest.raises(ProtocolError, match=why):
        wire.split_batch(meta, payload)


def test_a_batch_inside_a_batch_is_refused():
    inner = wire.encode_batch([wire.encode(Kind.PING, {"n": 1}), wire.encode(Kind.PING, {"n": 2})])
    kind, meta, payload = wire.decode(wire.encode_batch([inner]))
    (sub,) = wire.split_batch(meta, payload)
    with pytest.raises(ProtocolError, match="batch inside a batch"):
        wire.decode_one(sub)


# --- a proc fed bad batches by an authenticated peer ---------------------------------


@pytest.fixture()
def capped_home(own_home):
    """A REGENT_HOME of its own with a 1 MiB message cap (and so its own host agent)."""
    return own_home(REGENT_MAX_MESSAGE_BYTES=str(1 << 20))


def test_bad_batches_are_dropped_whole_and_the_proc_keeps_serving(capped_home):
    with Session("bad-batches") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("log", Log)
        addr = mesh._procs[0].address
        peer = RawPeer(load_credentials())
        try:
            good = _call(s.sid, s.epoch, 50_000, peer.address, "never")
            body = b"".join(bytes(f) for f in good)
            lengths = [len(f) for f in good]
            bad = [
                _batch([lengths], body[:-3]),  # truncated body
                _batch([lengths], body + b"!"),  # trailing bytes
                _batch([lengths[:1]], body),  # lengths cover part of the body
                _batch({"a": 1}, body),  # lengths are not a list
                _batch([lengths], body, [b"second body"]),  # two body frames
                wire.encode(Kind.BATCH, {"n": [lengths]}),  # no body at all
                wire.encode(Kind.BATCH, {"x": 1}, [body]),  # no lengths
                wire.encode_batch([wire.encode_batch([good])]),  # nested
            ]
            for frames in bad:
                peer.send(addr, frames)
            # Oversized: a batch body above the 1 MiB cap; the transport cuts the sender off.
            peer.send(addr, _batch([[1 << 21]], b"x" * (1 << 21)))
            time.sleep(0.2)
            assert mesh.history.call_one().get(timeout=10) == []  # nothing above ran
            assert mesh.add.call_one("alive").get(timeout=10) == 1
            # The proc's log reaches the agent's through a thread of its own: on a loaded
            # machine, seconds later; read while the proc lives (a stop may cut the tail).
            deadline = time.monotonic() + 20
            while (seen := (capped_home / "host.log").read_text().count("dropped malformed message")) < len(bad):
                assert time.monotonic() < deadline, f"{seen} of {len(bad)} bad batches logged"
                time.sleep(0.1)
        finally:
            peer.close()


def test_a_malformed_message_in_a_batch_spoils_none_of_the_others():
    with Session("mixed-batch") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("log", Log)
        addr = mesh._procs[0].address
        peer = RawPeer()
        try:
            first = _call(s.sid, s.epoch, 60_000, peer.address, "a")
            last = _call(s.sid, s.epoch, 60_001, peer.address, "b")
            garbage = [b"RG\x01\x01\x00\x00\x00\x03\xa2hi"]  # metadata is not a map
            missing = wire.encode(Kind.CALL, {"sid": s.sid, "e": s.epoch})  # fields missing
            truncated = _call(s.sid, s.epoch, 60_002, peer.address, "c" * 100)
            truncated[1] = truncated[1][:10]  # a pickle cut short: an error reply, not a crash
            peer.send(addr, wire.encode_batch([first, garbage, missing, truncated, last]))
            got = _results(peer, 3)
            assert got[60_000][0]["st"] == "ok" and got[60_001][0]["st"] == "ok"
            assert got[60_002][0]["st"] == "err"
            assert mesh.history.call_one().get(timeout=10) == ["a", "b"]
        finally:
            peer.close()


def test_the_controller_drops_a_bad_batch_and_keeps_its_calls_going():
    with Session("controller-bad-batch") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("log", Log)
        peer = RawPeer()
        try:
            result = wire.encode(Kind.RESULT, {"sid": s.sid, "s": 10**9, "pt": 0, "st": "ok"})
            peer.send(s.runtime.reply_address, _batch([[5]], b"abc"))
            peer.send(s.runtime.reply_address, wire.encode_batch([result, [b"junk"], result]))
            assert mesh.add.call_one(1).get(timeout=10) == 1
        finally:
            peer.close()


# --- ordering and delivery through the session ---------------------------------------


def test_fifo_holds_across_batch_boundaries():
    with Session("batch-fifo", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("log", Log)
        one = mesh.slice(procs=0)
        n = 3 * wire.BATCH_MESSAGES + 17
        futs = []
        for i in range(n):
            futs.append(one.add.call_one(i))
            if i % 100 == 99:
                mesh.note.broadcast(("b", i))  # a different path to the same actor
            if i == n // 2:
                assert futs[0].get(timeout=30) == 1  # a flush in the middle of the stream
        counts = [f.get(timeout=60) for f in futs]
        history = one.history.call_one().get(timeout=30)
        assert [x for x in history if not isinstance(x, list | tuple)] == list(range(n))
        assert counts == [history.index(i) + 1 for i in range(n)]
        marks = [x for x in history if isinstance(x, list | tuple)]
        assert [tuple(m) for m in marks] == [("b", i) for i in range(99, n, 100)]
        # Each broadcast came after the calls issued before it, and before those after it.
        for m in marks:
            at = history.index(m)
            assert history[at - 1] == m[1]


def test_a_broadcast_then_sleep_is_delivered_without_any_later_call(tmp_path: Path, monkeypatch):
    out = tmp_path / "seen"
    # An unanswered call is sent again after RESEND_FIRST_S; that must not be what delivers it.
    monkeypatch.setattr("regent.controller.session.RESEND_FIRST_S", 3600.0)

    def seen(word: str) -> bool:
        return out.exists() and out.read_text().count(word) == 2

    with Session("batch-stranded", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("log", Log, str(out))
        mesh.note.broadcast("first")
        assert wait_until(lambda: seen("first"), timeout=10)
        # Once every earlier call is complete, nothing else (a watermark, a reply) is on
        # its way to the procs: no get, no other call, so only the controller's own flush
        # of what waits in the queue can send this one.
        time.sleep(1.0)
        mesh.note.broadcast("second")
        assert wait_until(lambda: seen("second"), timeout=10)


def test_a_batch_stays_within_a_lower_message_cap():
    msgs = [wire.encode(Kind.PING, {"n": i}, [b"x" * 1000]) for i in range(200)]
    for frames in wire.pack(msgs, max_message=64 * 1024):
        assert all(len(f) <= 64 * 1024 for f in frames)
    assert sum(len(wire.split_batch(*wire.decode(f)[1:])) if wire.decode(f)[0] is Kind.BATCH else 1
               for f in wire.pack(msgs, max_message=64 * 1024)) == 200


def test_point_messages_decode_as_the_shared_metadata_plus_each_point():
    base = {"sid": "s.1", "e": 3, "s": 12, "a": "log", "m": "add", "d": b"\x01" * 16, "rt": "tcp://127.0.0.1:1"}
    points = wire.PointMessages(Kind.CALL, base, (b"payload",))
    for rank in (0, 5, 127, 128, 70_000):
        kind, meta, payload = wire.decode(points.encode(rank))
        assert (kind, meta, [bytes(f) for f in payload]) == (Kind.CALL, {**base, "pt": rank}, [b"payload"])


@pytest.mark.parametrize("batch_age_s, sent_at_once", [(0.001, True), (0.5, False)])
def test_a_peer_sends_its_batch_once_older_than_its_batch_age(own_home, batch_age_s: float,
                                                              sent_at_once: bool) -> None:
    """A controller's peers gather for BUSY_BATCH_AGE_S while its program issues (the IO thread
    sends what the program leaves after BATCH_MAX_AGE_S); a queue past the peer's age sends."""
    import zmq

    from regent.wire.transport import Peer

    own_home()
    receiver = RawPeer()
    ctx = zmq.Context()
    try:
        peer = Peer(ctx, load_credentials(), receiver.address, batch_age_s=batch_age_s)
        peer.queue(wire.encode(Kind.PING, {"n": 1}))
        time.sleep(0.02)
        peer.queue(wire.encode(Kind.PING, {"n": 2}))  # the batch is 20 ms old now
        if sent_at_once:
            assert [receiver.recv(timeout=5)[1]["n"] for _ in range(2)] == [1, 2]
        else:
            with pytest.raises(TimeoutError):
                receiver.recv(timeout=0.2)
            assert peer.flush()
            assert [receiver.recv(timeout=5)[1]["n"] for _ in range(2)] == [1, 2]
        peer.close()
    finally:
        ctx.destroy(linger=0)
        receiver.close()
