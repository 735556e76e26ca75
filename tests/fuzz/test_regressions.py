"""Inputs the fuzzers found that broke a decoder, kept as they were found: each is refused now
with the documented error, naming what is wrong, and a live proc keeps serving after one."""

from __future__ import annotations

import os
import time
import zlib

import msgpack
import pytest
import zmq

from regent import wire
from regent.controller import Session
from regent.journal import CorruptRecord
from regent.journal import codec as jcodec
from regent.journal.verify import verify_batches
from regent.wire import Kind, ProtocolError, schema
from regent.wire.security import load_credentials
from regent.wire.transport import RECEIVER_MAX_PEERS, Peer, valid_address
from regent.worker import Actor, endpoint
from regent.worker.discovery import ensure_local_host, live_host_record
from tests.fuzz.live import ping
from tests.fuzz.targets import TARGETS, frame
from tests.runtime.rawpeer import RawPeer
from tests.support.agenthome import wait_for

DEEP = b"\x91" * 5000 + b"\xc0"  # arrays 5000 deep: msgspec gives up with a RecursionError


def _record(body: list) -> bytes:
    raw = msgpack.packb(body, use_bin_type=True)
    return msgpack.packb((raw, zlib.crc32(raw)), use_bin_type=True)


# --- the wire ----------------------------------------------------------------------------------

@pytest.mark.parametrize("receiver, kind, key", [(schema.PROC, Kind.PING, b"\xa1e"), (schema.HOST, Kind.PING, b"\xa1e"),
                                                 (schema.CONTROLLER, Kind.PONG, b"\xa2zz")],
                         ids=["proc", "host", "controller"])
def test_metadata_nested_too_deeply_is_a_protocol_error_for_every_receiver(receiver, kind, key):
    # Found as a PING whose field "e", which a PING does not declare, held arrays 5000 deep.
    frames = [frame(kind, b"\x81" + key + DEEP)]
    with pytest.raises(ProtocolError, match=f"{kind.name} metadata is nested too deeply"):
        receiver.decode(frames)


def test_a_spawn_whose_coordinates_nest_too_deeply_is_a_protocol_error():
    call = {"sid": "s", "e": 0, "s": 1, "a": "x", "m": "m", "d": b"", "pt": 0}
    body = bytes((0x80 | (len(call) + 1),)) + msgpack.packb(call)[1:] + b"\xa2co\x81\xa1k" + DEEP
    with pytest.raises(ProtocolError, match="SPAWN metadata is nested too deeply"):
        schema.PROC.decode([frame(Kind.SPAWN, body)])


# Found by the live proc: reply addresses the old check ("tcp://" or "ipc://" first) let through,
# which zmq refused at connect, in the proc's reply flush: the exception left the inbox unread.
BAD_ADDRESSES = ["tcp://127.0.0.1:409\x7f9", "tcp://127.0.0/.1:\x004098:9", "tcp://127\x00\x00\x00\x00\x00\x00\x00\x020989",
                 "tcp://127.0.0.1:", "tcp://nonsense", "tcp://127.0.0.1:*", "ipc://", "tcp://x:5\n",
                 "ipc://@", "ipc://" + "é" * 60]  # found by Hypothesis (wire.address): no name; over 107 bytes


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_a_reply_address_zmq_cannot_connect_to_is_refused_by_the_schema(address):
    assert not valid_address(address)
    with pytest.raises(ProtocolError, match=r"\$\.rt"):
        schema.PROC.decode(wire.encode(Kind.PING, {"rt": address}))


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:1", "tcp://10.0.0.2:65535", "tcp://[::1]:5555",
                                     "tcp://host-1.example:8080", "ipc:///tmp/regent/inbox"])
def test_addresses_regent_uses_still_pass(address):
    assert valid_address(address)
    assert TARGETS["wire.address"].run(address) == "ok"


def test_a_peer_zmq_cannot_connect_to_raises_protocol_error_and_keeps_no_socket(own_home):
    own_home()
    ctx = zmq.Context()
    try:
        with pytest.raises(ProtocolError, match="cannot connect to 'tcp://127.0.0.1:'"):
            Peer(ctx, load_credentials(), "tcp://127.0.0.1:")
    finally:
        ctx.destroy(linger=0)  # would block on a socket left open


class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x


def test_a_live_proc_answers_after_a_call_with_an_address_zmq_refuses(own_home):
    own_home()
    with Session("fuzz-regress-rt") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        addr = mesh._procs[0].address
        peer = RawPeer()
        try:
            args = wire.dumps(((1,), {}))
            for i, bad in enumerate(BAD_ADDRESSES):
                meta = {"sid": s.sid, "e": s.epoch, "s": 1 << 40 | i, "a": "echo", "m": "echo",
                        "d": wire.digest(args), "pt": 0, "rt": bad}
                peer.send(addr, [frame(Kind.CALL, msgpack.packb(meta, use_bin_type=True)), *args])
            peer.send(addr, wire.encode(Kind.PING, {"rt": peer.address, "n": 77}))
            kind, meta, _ = peer.recv(timeout=10)
            assert (kind, meta["n"]) == (Kind.PONG, 77)
            assert mesh.echo.call_one("alive").get(timeout=10) == "alive"
        finally:
            peer.close()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _answered(peer: RawPeer, address: str, within_s: float = 90.0) -> bool:
    """Pinged as a controller would call: again every 3 s until answered. A reply can be lost
    when its socket is closed to make room for newer peers before it left; the controller
    sends again, as it does every unanswered call."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            return ping(peer, address, 10**6, timeout=3.0)["n"] == 10**6
        except TimeoutError:
            continue
    return False


def test_receivers_answer_a_new_peer_after_pings_naming_thousands_of_reply_addresses(own_home):
    # Found reading the live fuzz: a proc or agent kept a socket for every reply address it was
    # ever given, so 1500 pings, each naming another, used up its zmq context's 1023 sockets:
    # it then answered no new peer (a standby controller taking over, say).
    own_home()
    with Session("fuzz-regress-peers") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        proc = mesh._procs[0]
        host = ensure_local_host()
        agent = live_host_record()
        assert agent is not None
        peer = RawPeer()
        try:
            for address in (proc.address, host):
                for i in range(1200):  # more than the 1023 sockets a zmq context may hold
                    peer.send(address, wire.encode(Kind.PING, {"rt": f"tcp://127.0.0.1:{20000 + i}", "n": i}))
                newcomer = RawPeer()
                try:
                    assert _answered(newcomer, address), f"{address} answers no new peer"
                finally:
                    newcomer.close()
            # Evicted peers' sockets are closed by zmq's IO thread, which a loaded machine may run
            # late: the bound must hold once it has, not at this instant.
            bound = 2 * RECEIVER_MAX_PEERS + 100
            wait_for(lambda: _fds(proc.pid) < bound and _fds(agent["pid"]) < bound, 20,
                     f"the proc and the agent back under {bound} open files")
            assert mesh.echo.call_one("alive").get(timeout=10) == "alive"
        finally:
            peer.close()


# --- the journal -------------------------------------------------------------------------------

def test_a_compressed_batch_claiming_billions_of_records_is_refused_before_it_is_listed():
    # Found by journal.batch: verify listed every lsn the header claimed (2**31 - 1 here) and
    # ran out of memory; a next leader would have started writing at that lsn.
    value = b"\x02\xce\x7f\xff\xff\xff\x94\xcd\xff\xff\x80\x90\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00"
    with pytest.raises(CorruptRecord, match="lsn 53: compressed batch of 2147483647 records"):
        jcodec.batch_count(value, "s", 53)
    entries, problems = jcodec.inspect_batch(value, "s", 53)
    assert entries == [] and len(problems) == 1 and problems[0].startswith("lsn 53: compressed batch")


def test_a_count_header_raised_by_a_flipped_byte_is_refused():
    frames = [jcodec.encode_record(i, 1, "call", {"pad": "x" * 64}, 0.0) for i in range(80)]
    good = jcodec.encode_batch(frames)
    assert good[:1] == jcodec.ZLIB_BATCH_FORMAT and good[1:2] == msgpack.packb(80)
    for count in (2**32, 10**6):
        value = good[:1] + msgpack.packb(count) + good[2:]
        with pytest.raises(CorruptRecord, match=rf"lsn 7: compressed batch of {count} records"):
            jcodec.batch_count(value, "s", 7)
    plain = jcodec.BATCH_FORMAT + msgpack.packb(1000) + b"".join(frames[:2])
    with pytest.raises(CorruptRecord, match="claims 1000 records, more than its"):
        jcodec.decode_batch(plain, "s", 0)


def test_a_record_of_two_fields_is_refused_not_returned():
    # Found by journal.record: a record [lsn, epoch] with a good checksum came back as a Record
    # whose kind, data and ts raised IndexError (and its repr TypeError).
    value = b"\x01\x01\x92\xc4\x05\x92\x05\xd1\xfe\xde\xce=%\x1f\xb8"
    with pytest.raises(CorruptRecord, match=r"lsn 5: record is list \[5, -290\], not \[lsn, epoch, kind, data, ts\]"):
        jcodec.decode_batch(value, "s", 5)
    assert jcodec.inspect_batch(value, "s", 5)[1] == [
        "lsn 5: record is list [5, -290], not [lsn, epoch, kind, data, ts]"]


@pytest.mark.parametrize("fields, problem", [
    ([0, {}, "call", {}, 0.0], "record's epoch is dict {}, not int"),
    ([0, 1, 7, {}, 0.0], "record's kind is int 7, not str"),
    ([0, 1, "call", "data", 0.0], "record's data is str 'data', not dict"),
    ([0, 1, "call", {}, "noon"], "record's ts is str 'noon', not a number"),
    ([False, 1, "call", {}, 0.0], "record's lsn is bool False, not int"),
])
def test_a_record_of_the_wrong_types_is_refused_and_verify_names_it(fields, problem):
    # Found by journal.batch and journal.verify: an epoch that is a map made verify raise
    # TypeError (unhashable, then unorderable); data that is not a map broke replay.
    value = jcodec.BATCH_FORMAT + msgpack.packb(1) + _record(fields)
    with pytest.raises(CorruptRecord, match=f"lsn 0: {problem}"):
        jcodec.decode_batch(value, "s", 0)
    assert verify_batches("s", [(0, value)]).problems == [f"lsn 0: {problem}"]


def test_records_beyond_the_declared_count_fail_the_read_as_they_fail_verify():
    # Found by journal.batch: decode_batch read the declared count and ignored the rest, so a
    # last batch whose count lost a record read back short without an error.
    frames = [jcodec.encode_record(i, 1, "call", {}, 0.0) for i in range(3)]
    value = jcodec.BATCH_FORMAT + msgpack.packb(2) + b"".join(frames)
    with pytest.raises(CorruptRecord, match="lsn 0: batch holds more than the 2 records it declares"):
        jcodec.decode_batch(value, "s", 0)
    assert verify_batches("s", [(0, value)]).problems == [
        f"lsn 0: batch holds more than the 2 records it declares ({len(frames[2])} bytes after them)"]


@pytest.mark.parametrize("value, problem", [
    (b"\x01" + msgpack.packb([1, 2]), "checkpoint checksum mismatch"),  # found: TypeError from crc32
    (b"\x01" + msgpack.packb([b"\xc1", zlib.crc32(b"\xc1")]), "checkpoint is undecodable"),
    (b"\x01" + msgpack.packb([b"\x91\x01", zlib.crc32(b"\x91\x01")]), "checkpoint is not {lsn, epoch, ts, data}"),
    (b"\x01" + msgpack.packb([msgpack.packb({"lsn": "7", "epoch": 1, "ts": 0.0, "data": {}}),
                              zlib.crc32(msgpack.packb({"lsn": "7", "epoch": 1, "ts": 0.0, "data": {}}))]),
     "checkpoint is not {lsn, epoch, ts, data}"),
])
def test_a_damaged_checkpoint_is_corrupt_record_and_verify_reports_it(value, problem):
    with pytest.raises(CorruptRecord, match=problem):
        jcodec.decode_checkpoint(value, "s")
    report = verify_batches("s", [], checkpoint=value)
    assert len(report.problems) == 1 and report.problems[0].startswith(f"checkpoint: {problem}")


DEEPISH = b"\x91" * 1000 + b"\xc0"  # within msgpack's nesting limit, past repr()'s


def test_values_nested_past_repr_are_described_not_recursed_into():
    # Found by journal.ranges, journal.checkpoint and journal.record (arrays 1000 deep, which
    # msgpack decodes): the message describing the value raised RecursionError from str().
    framed = msgpack.packb([DEEPISH, zlib.crc32(DEEPISH)])
    with pytest.raises(CorruptRecord, match=r"compaction note is not a list of lsn ranges: \[\[\[\[\.\.\.\]\]\]\]"):
        jcodec.decode_ranges(DEEPISH, "s")
    with pytest.raises(CorruptRecord, match="checkpoint is not {lsn, epoch, ts, data}"):
        jcodec.decode_checkpoint(b"\x01" + framed, "s")
    assert jcodec.inspect_batch(b"\x01\x01" + framed, "s", 0)[1] == [
        "lsn 0: record is list [[[[...]]]], not [lsn, epoch, kind, data, ts]"]
    batch = wire.encode(Kind.BATCH, {"n": [[0]]}, [b""])
    head = batch[0][:8 - 4] + (len(b"\x81\xa1n\x91" + DEEPISH)).to_bytes(4, "big") + b"\x81\xa1n\x91" + DEEPISH
    _, meta, payload = wire.decode([head, b""])
    with pytest.raises(ProtocolError, match=r"batch lengths \[\[\[\[\.\.\.\]\]\]\] do not fit"):
        wire.split_batch(meta, payload)


@pytest.mark.parametrize("value", [b"\x01", b"\xc1", msgpack.packb([[1]]), msgpack.packb([[5, 2]]),
                                   msgpack.packb([["1", 2]]), msgpack.packb({"a": 1})])
def test_a_damaged_compaction_note_is_corrupt_record(value):
    # Found by journal.ranges: TypeError, ValueError and msgpack's FormatError, from read and verify.
    with pytest.raises(CorruptRecord, match="session 's': compaction note is"):
        jcodec.decode_ranges(value, "s")


def test_verify_names_a_damaged_batch_that_claims_the_next_ones_lsns_and_not_the_next_one():
    # Found by test_verify_names_damage: bit flips in a compressed batch of 60 raised its count
    # to 124 and damaged its stream; verify took the count and called the intact batch after it
    # "stored twice".
    frames = [jcodec.encode_record(i, 1, "call", {"pad": "p" * 40}, 0.0) for i in range(64)]
    good = jcodec.encode_batch(frames[:60])
    assert good[:1] == jcodec.ZLIB_BATCH_FORMAT and good[1:2] == msgpack.packb(60)
    damaged = bytearray(good[:1] + msgpack.packb(124) + good[2:])
    damaged[len(damaged) // 2] ^= 0x10
    batches = [(0, bytes(damaged)), (60, jcodec.encode_batch(frames[60:]))]
    problems = verify_batches("s", batches).problems
    assert len(problems) == 1 and problems[0].startswith("lsn 0: compressed batch of 124 records"), problems
