"""The fuzz targets: each decoder that reads bytes regent did not check yet, with its valid
encodings (seeds), how to derive an input from them, and the oracle.

A target's `run(input)` calls the decoder as its caller does (a proc splits a batch and
decodes each message in it; verify inspects every batch) and returns what came of it: "ok" or
the name of a documented error. Any other exception, or a value that breaks the decoder's
contract, raises `Crash` with the input, to be kept as a regression test. The documented
errors are wire.ProtocolError for the wire and journal.CorruptRecord for the journal.

Used by tests/fuzz/test_decoders.py (bounded, Hypothesis) and bench/bench_fuzz.py (100,000
inputs a target). No target needs a process or a store; wire.address connects (and at once
disconnects) one zmq socket.
"""

from __future__ import annotations

import ipaddress
import random
import re
import reprlib
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgpack
import msgspec
import zmq

from regent import wire
from regent.journal import CorruptRecord
from regent.journal import codec as jcodec
from regent.journal.verify import verify_batches
from regent.wire import Kind, ProtocolError, schema
from regent.wire.transport import valid_address
from tests.fuzz.mutations import mutate_bytes, mutate_text, mutate_value, pack, wild_value

SESSION = "fuzz-session"
EPOCH = 3
RT = "tcp://127.0.0.1:45671"
_HEAD = struct.Struct("!2sBBI")


_REPR = reprlib.Repr()  # inputs nest deeper than repr() goes
_REPR.maxlevel, _REPR.maxlist, _REPR.maxstring, _REPR.maxother = 8, 64, 4000, 4000


class Crash(AssertionError):
    """A decoder raised an error it does not document, or returned a value it must not."""

    def __init__(self, target: str, data: Any, error: BaseException | str):
        self.target = target
        self.data = data
        self.error = error
        self.shown = _REPR.repr(data)
        what = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        super().__init__(f"{target}: {what}\n  input: {self.shown}")


@dataclass
class Target:
    """One decoder under fuzz. `seeds` are valid inputs; `mutate(rnd, seed, seeds)` derives
    one input from a seed; `random_input(rnd)` makes one from nothing; `run(input)` returns
    the outcome ("ok" or a documented error's name) or raises Crash."""

    name: str
    what: str
    seeds: list
    mutate: Callable[[random.Random, Any, Sequence], Any]
    random_input: Callable[[random.Random], Any]
    check: Callable[[Any], str]
    allowed: tuple[type[BaseException], ...]

    def run(self, data: Any) -> str:
        try:
            outcome = self.check(data)
        except Crash:
            raise
        except self.allowed as e:
            outcome = type(e).__name__
        except BaseException as e:  # noqa: BLE001 - RecursionError, MemoryError: findings all
            if isinstance(e, KeyboardInterrupt):
                raise
            raise Crash(self.name, data, e) from e
        return outcome

    def generate(self, rnd: random.Random) -> Any:
        """One input: mostly a mutated seed, sometimes one made from nothing."""
        if rnd.random() < 0.1:
            return self.random_input(rnd)
        return self.mutate(rnd, rnd.choice(self.seeds), self.seeds)


# --- wire: seeds --------------------------------------------------------------------------

def frame(kind: int, body: bytes) -> bytes:
    """A header frame for `body` whatever its size or kind (encode refuses oversized ones)."""
    return _HEAD.pack(b"RG", 1, kind, len(body)) + body


_CALL_ARGS = wire.dumps(((1, "x"), {"k": 2}))


def proc_seeds(sid: str = SESSION, epoch: int = EPOCH, rt: str = RT, actor: str = "fuzz-actor",
               method: str = "step", seq: int = 5) -> dict[Kind, list[list[bytes]]]:
    """Valid messages of every kind a proc accepts, from a controller at `rt` of session `sid`."""
    call = {"sid": sid, "e": epoch, "s": seq, "a": actor, "m": method, "d": wire.digest(_CALL_ARGS), "pt": 0,
            "rt": rt}
    listing = {"id": "h1-fuzz-0-abcdef", "idx": 0, "addr": "tcp://127.0.0.1:40001", "pid": 4242, "alive": True}
    seeds = {
        Kind.CALL: [wire.encode(Kind.CALL, call, _CALL_ARGS),
                    wire.encode(Kind.CALL, {**call, "s": -1, "pt": 7, "d": b""})],
        Kind.STOP: [wire.encode(Kind.STOP, {**call, "a": "fuzz-stopped", "m": "__stop__"})],
        Kind.SPAWN: [wire.encode(Kind.SPAWN, {**call, "a": "fuzz-spawned", "m": "__init__",
                                              "co": {"gpus": 0, "hosts": 1}, "inc": 0, "restart": False, "n": 1}),
                     wire.encode(Kind.SPAWN, {**call, "a": "fuzz-spawned", "m": "__init__", "restart": True,
                                              "inc": 2, "n": 9})],
        Kind.FENCE: [wire.encode(Kind.FENCE, {"sid": sid, "e": epoch, "rt": rt, "n": 2}),
                     wire.encode(Kind.FENCE, {"sid": sid, "e": epoch, "n": None})],
        Kind.WATERMARK: [wire.encode(Kind.WATERMARK, {"sid": sid, "e": epoch, "dw": -1, "cw": -1})],
        Kind.PING: [wire.encode(Kind.PING, {"rt": rt, "n": 3}), wire.encode(Kind.PING, {})],
        Kind.HOST_REP: [wire.encode(Kind.HOST_REP, {"sid": sid, "n": 4, "st": "ok", "s": None, "em": "", "e": epoch,
                                                    "pid": 100, "at": rt, "complete": True,
                                                    "procs": [listing, {**listing, "idx": 1, "addr": None}]}),
                        wire.encode(Kind.HOST_REP, {"sid": sid, "n": 5, "st": "fenced", "e": epoch,
                                                    "em": "deposed"})],
    }
    seeds[Kind.BATCH] = [
        wire.encode_batch([seeds[Kind.CALL][0], seeds[Kind.FENCE][0], seeds[Kind.PING][0]]),
        wire.encode_batch([seeds[Kind.WATERMARK][0], seeds[Kind.CALL][1], seeds[Kind.STOP][0],
                           seeds[Kind.SPAWN][0]]),
        wire.encode_batch([seeds[Kind.HOST_REP][0]]),
    ]
    return seeds


def host_seeds(sid: str = SESSION, epoch: int = EPOCH, rt: str = RT) -> dict[Kind, list[list[bytes]]]:
    """Valid messages of every kind a host agent accepts: a controller's requests (every op)
    and pings, and its procs' ready and adoption messages."""
    req = {"sid": sid, "e": epoch, "n": 1, "rt": rt, "orphan_s": 60.0}
    env = {"REGENT_PROC_RANK": "0", "X": "1"}
    proc = {"sid": sid, "id": "h1-fuzz-0-abcdef", "pid": 4242, "addr": "tcp://127.0.0.1:40001"}
    return {
        Kind.HOST_REQ: [
            wire.encode(Kind.HOST_REQ, {**req, "op": "hello"}),
            wire.encode(Kind.HOST_REQ, {**req, "op": "list", "orphan_s": None}),
            wire.encode(Kind.HOST_REQ, {**req, "op": "stop_procs", "ids": ["h1-fuzz-0-abcdef", "other"]}),
            wire.encode(Kind.HOST_REQ, {**req, "op": "stop_session"}),
            wire.encode(Kind.HOST_REQ, {**req, "op": "spawn_procs", "s": 1, "d": bytes(16), "count": 2,
                                        "envs": [env, {}], "path": ["/tmp/fuzz"]}),
            wire.encode(Kind.HOST_REQ, {**req, "op": "respawn_proc", "old": "h1-fuzz-0-abcdef", "idx": 0,
                                        "env": env, "path": []}),
        ],
        Kind.PING: [wire.encode(Kind.PING, {"rt": rt, "n": 3}), wire.encode(Kind.PING, {})],
        Kind.PROC_READY: [wire.encode(Kind.PROC_READY, proc)],
        Kind.PROC_ADOPT: [
            wire.encode(Kind.PROC_ADOPT, {**proc, "idx": 0, "n": 1, "orphan_s": 30.0, "s": 1, "size": 2, "pos": 0,
                                          "d": bytes(16), "e": epoch}),
            wire.encode(Kind.PROC_ADOPT, {**proc, "id": "h1-fuzz-1-abcdef", "idx": 1, "pid": 4243,
                                          "addr": "tcp://127.0.0.1:40002", "old": "h1-fuzz-0-abcdef"}),
        ],
    }


def controller_seeds(sid: str = SESSION, epoch: int = EPOCH) -> dict[Kind, list[list[bytes]]]:
    """Valid messages of every kind a controller accepts, from procs and host agents."""
    seeds = {
        Kind.RESULT: [wire.encode(Kind.RESULT, {"sid": sid, "s": 5, "a": "fuzz-actor", "pt": 0, "st": "ok"},
                                  _CALL_ARGS),
                      wire.encode(Kind.RESULT, {"sid": sid, "s": 6, "a": "fuzz-actor", "pt": 1, "st": "err",
                                                "et": "ValueError", "em": "bad", "tb": "Traceback ...", "n": 3,
                                                "pid": 4242, "inc": 1, "e": epoch, "normal": False})],
        Kind.PONG: [wire.encode(Kind.PONG, {"n": 3, "id": "p", "pid": 4242, "cached": 10, "epoch": epoch}),
                    wire.encode(Kind.PONG, {"n": 4, "pid": 4242, "host": "h1"})],
        Kind.HOST_REP: proc_seeds(sid, epoch)[Kind.HOST_REP],
        Kind.HOST_EVENT: [wire.encode(Kind.HOST_EVENT, {"sid": sid, "ev": "proc_died", "id": "p", "idx": 0,
                                                        "status": -9})],
        Kind.LOG: [wire.encode(Kind.LOG, {"sid": sid, "id": "p", "h": "h1", "i": 0,
                                          "lines": [[0, "hello"], [1, "Traceback (most recent call last):"]]})],
    }
    seeds[Kind.BATCH] = [wire.encode_batch([seeds[Kind.RESULT][0], seeds[Kind.PONG][0], seeds[Kind.LOG][0]])]
    return seeds


# --- wire: mutations -------------------------------------------------------------------------

def _meta_of(head: bytes) -> object:
    """The metadata of a (perhaps already mutated) header frame, or {} if it has none."""
    try:
        return msgpack.unpackb(head[_HEAD.size:], raw=False, strict_map_key=False)
    except Exception:
        return {}


def mutate_message(rnd: random.Random, frames: list, seeds: Sequence[list]) -> list[bytes]:
    """A message derived from a valid one: its metadata edited and re-framed (so the header
    checks pass and the fields are what is tested), its bytes edited with or without the
    header, its kind swapped, its frames added or dropped."""
    head, payload = bytes(frames[0]), [bytes(f) for f in frames[1:]]
    kind, body = (head[3] if len(head) > 3 else Kind.PING), head[_HEAD.size:]
    op = rnd.random()
    if op < 0.45:
        head = frame(kind, pack(mutate_value(rnd, _meta_of(head))))
    elif op < 0.65:
        bodies = [bytes(s[0])[_HEAD.size:] for s in rnd.sample(list(seeds), min(3, len(seeds)))]
        head = frame(kind, mutate_bytes(rnd, body, bodies))
    elif op < 0.78:
        head = mutate_bytes(rnd, head, [bytes(s[0]) for s in seeds])
    elif op < 0.88:  # the same fields under another kind
        head = frame(rnd.choice([int(k) for k in Kind] + [0, 99, 255]), body)
    else:
        r = rnd.randrange(4)
        if r == 0:
            payload = []
        elif r == 1:
            payload = payload + [rnd.randbytes(rnd.randint(0, 40)) for _ in range(rnd.randint(1, 4))]
        elif r == 2:
            payload = [b""] * rnd.choice((1, 2, 5, wire.protocol.MAX_BUFFERS + 1))
        else:
            payload = payload + [bytes(f) for f in rnd.choice(seeds)]
    out = [head, *payload]
    if rnd.random() < 0.15:
        return mutate_message(rnd, out, seeds)
    return out


def mutate_batch(rnd: random.Random, frames: list, seeds: Sequence[list],
                 subs: Sequence[list] = ()) -> list[bytes]:
    """A batch derived from a valid one: a message inside it mutated (and the batch's lengths
    made to fit, so the message itself is what is tested), messages added, dropped or nested,
    the lengths edited, the body's bytes edited, or the batch mutated as any message."""
    op = rnd.random()
    messages = split_valid_batch(frames)
    if op < 0.4:
        i = rnd.randrange(len(messages))
        messages[i] = mutate_message(rnd, messages[i], list(subs) or messages)
        if rnd.random() < 0.2 and len(messages[i]) > wire.protocol.BATCH_MESSAGE_FRAMES:
            messages[i] = messages[i][:wire.protocol.BATCH_MESSAGE_FRAMES]
        return wire.encode_batch(messages)
    if op < 0.5:
        r = rnd.randrange(3)
        if r == 0:
            messages.append(rnd.choice(subs or messages))
        elif r == 1 and len(messages) > 1:
            del messages[rnd.randrange(len(messages))]
        else:
            messages.insert(rnd.randrange(len(messages) + 1), list(rnd.choice(seeds)))  # a batch in a batch
        return wire.encode_batch(messages)
    if op < 0.7:
        meta = {"n": [[len(f) for f in m] for m in messages]}
        body = pack(mutate_value(rnd, meta))
        return [frame(Kind.BATCH, body), *[bytes(f) for f in frames[1:]]]
    if op < 0.85:
        return [bytes(frames[0]), mutate_bytes(rnd, bytes(frames[1]), [bytes(s[1]) for s in seeds if len(s) > 1])]
    return mutate_message(rnd, frames, seeds)


def split_valid_batch(frames: list) -> list[list[bytes]]:
    _, meta, payload = wire.decode(frames)
    return [[bytes(f) for f in sub] for sub in wire.split_batch(meta, payload)]


def random_frames(rnd: random.Random) -> list[bytes]:
    """Frames from nothing: random bytes, or a valid header over random or msgpack bytes."""
    r = rnd.randrange(3)
    if r == 0:
        return [rnd.randbytes(rnd.randint(0, 64)) for _ in range(rnd.randint(1, 3))]
    kind = rnd.choice([int(k) for k in Kind])
    if r == 1:
        return [frame(kind, rnd.randbytes(rnd.randint(0, 64)))]
    return [frame(kind, pack(wild_value(rnd))), *([rnd.randbytes(8)] if rnd.random() < 0.3 else [])]


# --- wire: oracles ---------------------------------------------------------------------------

def _accepted(receiver: schema.Receiver, kind: Kind, meta: object) -> None:
    """What a receiver returned must be what it declared: a known kind, a map of declared
    fields that decodes again to the same bytes."""
    if kind not in receiver.accepts or type(meta) is not dict:
        raise Crash(receiver.name, (kind, meta), f"returned {kind!r} with {type(meta).__name__} metadata")
    declared = receiver.accepts[kind].__annotations__
    undeclared = set(meta) - set(declared)
    if undeclared:
        raise Crash(receiver.name, meta, f"returned undeclared fields {sorted(undeclared)}")
    again = msgspec.msgpack.encode(meta)
    if msgspec.msgpack.encode(receiver._decoders[kind].decode(again)) != again:
        raise Crash(receiver.name, meta, "returned metadata that does not decode to itself")


def receive(receiver: schema.Receiver, frames: list) -> str:
    """The receiver's decode, and for a batch every message in it as the proc takes them: a
    bad one inside is dropped on its own. Outcome: "ok", or "ProtocolError" for the message
    (a batch is "ok" once split, whatever became of the messages inside)."""
    kind, meta, payload = receiver.decode(frames)
    _accepted(receiver, kind, meta)
    if kind is Kind.BATCH:
        subs = wire.split_batch(meta, payload)
        if not subs or len(subs) > wire.MAX_BATCH:
            raise Crash(receiver.name, frames, f"split_batch returned {len(subs)} messages")
        for sub in subs:
            try:
                k, m, _ = receiver.decode_one(sub)
            except ProtocolError:
                continue
            if k is Kind.BATCH:
                raise Crash(receiver.name, frames, "decode_one returned a batch inside a batch")
            _accepted(receiver, k, m)
    return "ok"


def untyped_decode(frames: list) -> str:
    """wire.decode and, for a batch, split_batch and decode_one (tools, RawPeer, the journal)."""
    kind, meta, payload = wire.decode(frames)
    if type(meta) is not dict or not isinstance(kind, Kind):
        raise Crash("wire.decode", frames, f"returned {kind!r} with {type(meta).__name__}")
    if kind is Kind.BATCH:
        for sub in wire.split_batch(meta, payload):
            try:
                wire.decode_one(sub)
            except ProtocolError:
                continue
    return "ok"


def verdicts(receiver: schema.Receiver, frames: list) -> tuple[int, list[tuple[Kind, dict]]]:
    """What a live receiver makes of one message, worked out here: how many messages it must
    drop as malformed (each bad one in a batch counts), and the valid ones it acts on."""
    try:
        kind, meta, payload = receiver.decode(frames)
        if kind is not Kind.BATCH:
            return 0, [(kind, meta)]
        subs = wire.split_batch(meta, payload)
    except ProtocolError:
        return 1, []
    drops, valid = 0, []
    for sub in subs:
        try:
            k, m, _ = receiver.decode_one(sub)
        except ProtocolError:
            drops += 1
            continue
        valid.append((k, m))
    return drops, valid


def live_messages(rnd: random.Random, seeds: dict[Kind, list[list[bytes]]], n: int) -> list[list[bytes]]:
    """`n` messages for a live receiver, mutated from its seeds (and some from nothing)."""
    subs = [m for k, ms in seeds.items() if k is not Kind.BATCH for m in ms]
    pool = [(k, m) for k, ms in seeds.items() for m in ms]
    out = []
    for _ in range(n):
        if rnd.random() < 0.1:
            out.append(random_frames(rnd))
            continue
        kind, seed = rnd.choice(pool)
        out.append(mutate_batch(rnd, seed, seeds[kind], subs) if kind is Kind.BATCH
                   else mutate_message(rnd, seed, seeds[kind]))
    return out


def _wire_target(name: str, what: str, receiver: schema.Receiver | None, seeds: list, subs: list) -> Target:
    batch = seeds and bytes(seeds[0][0])[3] == Kind.BATCH

    def mutate(rnd: random.Random, seed: list, pool: Sequence) -> list[bytes]:
        return mutate_batch(rnd, seed, pool, subs) if batch else mutate_message(rnd, seed, pool)

    check = (lambda f: receive(receiver, f)) if receiver is not None else untyped_decode
    return Target(name, what, seeds, mutate, random_frames, check, (ProtocolError,))


# --- wire: reply addresses ------------------------------------------------------------------

ADDRESS_SEEDS = ["tcp://127.0.0.1:45671", "tcp://10.0.0.2:1", "tcp://[::1]:65535", "tcp://localhost:8080",
                 "ipc:///tmp/regent-fuzz/inbox"]
_zmq: list = []


def _without_lookup(addr: str) -> str:
    """`addr` with a host name (anything but an IP literal) replaced by localhost: zmq checks a
    name's characters when a socket connects (the schema's are a subset of them) and resolves
    it later, in its IO thread, where a resolver with no server to ask holds each lookup, and a
    socket, for seconds."""
    if not addr.startswith("tcp://"):
        return addr
    host, _, port = addr[len("tcp://"):].rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return f"tcp://localhost:{port}"
    return addr


def mutate_address(rnd: random.Random, seed: str, seeds: Sequence[str]) -> str:
    return seed if rnd.random() < 0.02 else mutate_text(rnd, seed)


def check_address(addr: str) -> str:
    """An address valid_address takes is one the schema takes and zmq connects to: a proc acts
    on a message only once its reply address passed, and must then be able to answer."""
    if not valid_address(addr):
        return "refused"
    try:
        schema.PROC.decode(wire.encode(Kind.PING, {"rt": addr}))
    except ProtocolError as e:
        raise Crash("wire.schema", addr, f"valid_address takes it, the schema refuses it: {e}") from None
    if not _zmq:  # one socket connects to each address and disconnects: no fd is left behind
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.linger = 0
        _zmq.append(sock)
    tried = _without_lookup(addr)
    try:
        _zmq[0].connect(tried)
    except zmq.ZMQError as e:
        raise Crash("valid_address", addr, f"takes an address zmq will not connect to: {e}") from None
    _zmq[0].disconnect(tried)
    return "ok"


# --- journal: seeds -------------------------------------------------------------------------

def _records(first: int, n: int, epoch: int = EPOCH, pad: int = 0) -> list[tuple]:
    kinds = ("call", "result", "value", "loop", "supervision")
    out = []
    for i in range(n):
        lsn = first + i
        data: dict = {"s": lsn, "a": "trainer", "m": "step", "d": bytes(16), "pt": [0, 1], "st": "ok"}
        if pad:
            data["pad"] = "y" * pad
        if i % 3 == 1:
            data["v"] = {"x": 1.5, "n": None, "b": b"\x00\xff"}
        out.append((lsn, epoch, kinds[i % len(kinds)], data, 1_700_000_000.0 + lsn / 1000))
    return out


def encode_records(records: Sequence[tuple]) -> list[bytes]:
    return [jcodec.encode_record(*r) for r in records]


@dataclass(frozen=True)
class BatchSeed:
    """A valid batch, kept as its records, so record-level mutations can re-frame them."""

    first: int
    records: tuple
    compressed: bool

    @cached_property
    def frames(self) -> tuple[bytes, ...]:
        return tuple(encode_records(self.records))

    @cached_property
    def value(self) -> bytes:
        return jcodec.encode_batch(list(self.frames))


def _batch_seeds(compressed: bool) -> list[BatchSeed]:
    if compressed:  # COMPRESS_MIN_BYTES and more, records that shrink
        shapes = [(0, 80, 0), (100, 60, 64), (7, 25, 300)]
    else:
        shapes = [(0, 1, 0), (3, 4, 0), (250, 10, 0), (9, 2, 100)]
    seeds = [BatchSeed(first, tuple(_records(first, n, pad=pad)), compressed) for first, n, pad in shapes]
    for s in seeds:
        assert (s.value[:1] == jcodec.ZLIB_BATCH_FORMAT) == compressed, (s.first, len(s.records))
    return seeds


# --- journal: mutations ---------------------------------------------------------------------

def _mutate_record_frame(rnd: random.Random, record: tuple) -> bytes:
    """One framed record edited: its fields (checksum made to fit, so the fields are what is
    tested), its body's bytes with or without a fitting checksum, its checksum, its framing."""
    body = msgpack.packb(list(record), use_bin_type=True)
    op = rnd.random()
    if op < 0.4:
        body = pack(mutate_value(rnd, list(record)))
        return msgpack.packb((body, zlib.crc32(body)), use_bin_type=True)
    if op < 0.6:
        body = mutate_bytes(rnd, body)
        return msgpack.packb((body, zlib.crc32(body)), use_bin_type=True)
    if op < 0.75:
        return msgpack.packb((mutate_bytes(rnd, body), zlib.crc32(body)), use_bin_type=True)
    if op < 0.85:
        return pack([body, wild_value(rnd)])
    return pack(mutate_value(rnd, [body, zlib.crc32(body)]))


def _assemble(rnd: random.Random, frames: list[bytes], compressed: bool, count: int | None = None) -> bytes:
    """A batch value around framed records, its header sometimes lying."""
    body = b"".join(frames)
    n = len(frames) if count is None else count
    head = msgpack.packb(n)
    if rnd.random() < 0.1:
        head = pack(rnd.choice((n + 1, n - 1, 0, -1, 2**40, 2**63 - 1, 2**64 - 1, "3", None, [n], 1.0, True)))
    if not compressed:
        return jcodec.BATCH_FORMAT + head + body
    size = msgpack.packb(len(body))
    if rnd.random() < 0.1:
        size = pack(rnd.choice((len(body) + 1, len(body) - 1, 0, -1, jcodec.MAX_BATCH_BYTES + 1, "9", None)))
    stream = zlib.compress(body, 1)
    if rnd.random() < 0.1:
        stream = rnd.choice((stream[:-4], stream + rnd.randbytes(4), stream + zlib.compress(b"more"),
                             mutate_bytes(rnd, stream)))
    return jcodec.ZLIB_BATCH_FORMAT + head + size + stream


def mutate_journal_batch(rnd: random.Random, seed: BatchSeed, seeds: Sequence[BatchSeed]) -> tuple[int, bytes]:
    """(first lsn, value) derived from a valid batch: a record's fields or bytes (re-framed,
    re-counted, re-compressed, so what is inside the framing is tested), records dropped,
    repeated or reordered, the header lying, or the stored bytes edited as they are."""
    first, records = seed.first, list(seed.records)
    op = rnd.random()
    if op < 0.25:
        return first, mutate_bytes(rnd, seed.value, [s.value for s in seeds])
    frames = list(seed.frames)
    if op < 0.7:
        for _ in range(rnd.randint(1, 2)):
            i = rnd.randrange(len(frames))
            frames[i] = _mutate_record_frame(rnd, records[i])
    elif op < 0.8:
        r = rnd.randrange(4)
        if r == 0 and len(frames) > 1:
            del frames[rnd.randrange(len(frames))]
        elif r == 1:
            frames.insert(rnd.randrange(len(frames) + 1), rnd.choice(frames))
        elif r == 2:
            rnd.shuffle(frames)
        else:
            frames.append(rnd.randbytes(rnd.randint(1, 12)))
    elif op < 0.9:
        return first, _assemble(rnd, frames, seed.compressed, count=rnd.choice(
            (len(frames) - 1, len(frames) + 1, 2 * len(frames), 2**32)))
    else:
        first = rnd.choice((first + 1, max(0, first - 1), 0, 2**40))
    return first, _assemble(rnd, frames, seed.compressed if rnd.random() < 0.9 else not seed.compressed)


def random_batch(rnd: random.Random) -> tuple[int, bytes]:
    fmt = rnd.choice((jcodec.BATCH_FORMAT, jcodec.ZLIB_BATCH_FORMAT, b"", b"\x00", b"\x03"))
    r = rnd.randrange(3)
    if r == 0:
        tail = rnd.randbytes(rnd.randint(0, 64))
    elif r == 1:
        tail = pack(wild_value(rnd)) + pack(wild_value(rnd))
    else:
        tail = msgpack.packb(rnd.randint(1, 3)) + zlib.compress(rnd.randbytes(rnd.randint(0, 64)))
    return rnd.randrange(100), fmt + tail


# --- journal: oracles -----------------------------------------------------------------------

_LSN = re.compile(r"lsn (\d+)")


def check_batch(data: tuple[int, bytes]) -> str:
    """decode_batch (read, replay) and inspect_batch (verify, repair) on one stored batch: a
    batch decode_batch takes must be one inspect_batch finds whole, with the same records, and
    every record must be a well-typed Record at its own lsn."""
    first, value = data
    entries, problems = jcodec.inspect_batch(value, SESSION, first)
    if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
        raise Crash("inspect_batch", data, f"problems are not strings: {problems!r}")
    try:
        records = jcodec.decode_batch(value, SESSION, first)
    except CorruptRecord as e:
        if not problems:
            raise Crash("inspect_batch", data, f"decode_batch refused the batch ({e.problem}) but "
                                               "inspect_batch found nothing wrong") from None
        if not any(first <= int(x) < first + max(1, len(entries)) for p in problems for x in _LSN.findall(p)):
            raise Crash("inspect_batch", data, f"no problem names an lsn of the batch: {problems}") from None
        raise
    if problems:
        raise Crash("decode_batch", data, f"decoded a batch inspect_batch finds damaged: {problems}")
    if not records:
        raise Crash("decode_batch", data, "returned no records")
    for i, r in enumerate(records):
        if (type(r.lsn) is not int or r.lsn != first + i or type(r.epoch) is not int
                or type(r.kind) is not str or type(r.data) is not dict or type(r.ts) not in (int, float)):
            raise Crash("decode_batch", data, f"returned a malformed record {r!r}")
    if [(r.lsn, r.epoch, r.kind) for r in records] != entries:
        raise Crash("inspect_batch", data, f"lists {entries} for records {records}")
    return "ok"


@dataclass(frozen=True)
class LogSeed:
    """A session's batches as a store holds them, and a checkpoint and compaction note."""

    batches: tuple[BatchSeed, ...]


def _log_seeds() -> list[LogSeed]:
    plain, zipped = _batch_seeds(False), _batch_seeds(True)
    one = BatchSeed(0, tuple(_records(0, 3)), False)
    two = BatchSeed(3, tuple(_records(3, 50, pad=10)), True)
    three = BatchSeed(53, tuple(_records(53, 2, epoch=EPOCH + 1)), False)
    return [LogSeed((one, two, three)), LogSeed((plain[0], plain[1])), LogSeed((zipped[0],))]


def mutate_log(rnd: random.Random, seed: LogSeed, seeds: Sequence[LogSeed]) -> list[tuple[int, bytes]]:
    """A session's batches with some damaged (as mutate_journal_batch), dropped, stored twice
    or swapped."""
    batches = [(b.first, b.value) for b in seed.batches]
    for _ in range(rnd.randint(1, 2)):
        op = rnd.random()
        i = rnd.randrange(len(batches))
        if op < 0.7:
            batches[i] = mutate_journal_batch(rnd, rnd.choice(seed.batches), seed.batches)
        elif op < 0.8 and len(batches) > 1:
            del batches[i]
        elif op < 0.9:
            batches.insert(i, batches[i])
        else:
            j = rnd.randrange(len(batches))
            batches[i], batches[j] = (batches[i][0], batches[j][1]), (batches[j][0], batches[i][1])
    return sorted(batches, key=lambda b: b[0])  # a store lists batches by first lsn


def check_log(batches: list[tuple[int, bytes]]) -> str:
    """verify_batches never raises, and names (by an lsn inside it) every batch decode_batch
    refuses."""
    report = verify_batches(SESSION, batches)
    lsns = {int(x) for p in report.problems for x in _LSN.findall(p)}
    for first, value in batches:
        try:
            jcodec.decode_batch(value, SESSION, first)
        except CorruptRecord:
            try:
                count = jcodec.batch_count(value, SESSION, first)
            except CorruptRecord:
                count = 1
            if not any(first <= x < first + count for x in lsns):
                raise Crash("verify_batches", batches, f"the damaged batch at lsn {first} is not named: "
                                                       f"{report.problems}") from None
    return "ok" if report.ok else "problems"


def _checkpoint_seeds() -> list[dict]:
    return [{"lsn": 10, "epoch": EPOCH, "ts": 1.7e9, "data": {"actors": {"counter": 7}, "blob": b"\x01\x02"}},
            {"lsn": 0, "epoch": 1, "ts": 0.0, "data": {}}]


def mutate_checkpoint(rnd: random.Random, seed: dict, seeds: Sequence[dict]) -> bytes:
    """A stored checkpoint derived from a valid one: its fields edited (checksum made to fit),
    its bytes edited, its checksum or framing wrong."""
    value = jcodec.encode_checkpoint(seed["lsn"], seed["epoch"], seed["ts"], seed["data"])
    op = rnd.random()
    if op < 0.45:
        body = pack(mutate_value(rnd, seed))
        return jcodec.CHECKPOINT_FORMAT + msgpack.packb((body, zlib.crc32(body)), use_bin_type=True)
    if op < 0.6:
        body = pack(seed)
        return jcodec.CHECKPOINT_FORMAT + pack(mutate_value(rnd, [body, zlib.crc32(body)]))
    return mutate_bytes(rnd, value)


def random_checkpoint(rnd: random.Random) -> bytes:
    return rnd.choice((jcodec.CHECKPOINT_FORMAT, b"", b"\x02")) + pack(wild_value(rnd))


def check_checkpoint(value: bytes) -> str:
    """decode_checkpoint returns {"lsn", "epoch", "ts", "data"} well typed, or CorruptRecord;
    verify with it never raises."""
    verify_batches(SESSION, [], checkpoint=value)
    ckpt = jcodec.decode_checkpoint(value, SESSION)
    if (type(ckpt) is not dict or not {"lsn", "epoch", "ts", "data"} <= set(ckpt) or type(ckpt["lsn"]) is not int
            or ckpt["lsn"] < 0 or type(ckpt["epoch"]) is not int or type(ckpt["ts"]) not in (int, float)
            or type(ckpt["data"]) is not dict):
        raise Crash("decode_checkpoint", value, f"returned {ckpt!r}")
    return "ok"


def mutate_ranges(rnd: random.Random, seed: list, seeds: Sequence[list]) -> bytes:
    if rnd.random() < 0.6:
        return pack(mutate_value(rnd, [list(r) for r in seed]))
    return mutate_bytes(rnd, jcodec.encode_ranges(seed))


def check_ranges(value: bytes) -> str:
    """decode_ranges returns half-open [lo, hi) int ranges, or CorruptRecord; verify, merge and
    covered take what it returns."""
    ranges = jcodec.decode_ranges(value, SESSION)
    if not all(type(lo) is int and type(hi) is int and 0 <= lo < hi for lo, hi in ranges):
        raise Crash("decode_ranges", value, f"returned {ranges!r}")
    merged = jcodec.merge_ranges(ranges)
    jcodec.covered(merged, 0, 10)
    verify_batches(SESSION, [], compacted=ranges)
    return "ok"


# --- the registry -------------------------------------------------------------------------

def _targets() -> list[Target]:
    out: list[Target] = []
    wire_seeds = (("proc", schema.PROC, proc_seeds()), ("host", schema.HOST, host_seeds()),
                  ("controller", schema.CONTROLLER, controller_seeds()))
    for prefix, receiver, seeds in wire_seeds:
        subs = [m for k, ms in seeds.items() if k is not Kind.BATCH for m in ms]
        for kind, kind_seeds in seeds.items():
            out.append(_wire_target(f"wire.{prefix}.{kind.name}", f"a {receiver.name} receiving {kind.name}",
                                    receiver, kind_seeds, subs))
    everything = [m for _, _, seeds in wire_seeds for ms in seeds.values() for m in ms]
    out.append(_wire_target("wire.decode", "wire.decode (untyped) of any kind", None, everything, []))
    out.append(Target("wire.address", "valid_address and the schema's Address, against zmq's connect",
                      ADDRESS_SEEDS, mutate_address, lambda rnd: str(wild_value(rnd)), check_address, ()))
    out.append(Target("journal.record", "decode_batch and inspect_batch of a one-record batch",
                      [BatchSeed(5, tuple(_records(5, 1)), False), BatchSeed(0, tuple(_records(0, 1, pad=50)), False)],
                      mutate_journal_batch, random_batch, check_batch, (CorruptRecord,)))
    out.append(Target("journal.batch", "decode_batch and inspect_batch of a batch", _batch_seeds(False),
                      mutate_journal_batch, random_batch, check_batch, (CorruptRecord,)))
    out.append(Target("journal.zbatch", "decode_batch and inspect_batch of a compressed batch",
                      _batch_seeds(True), mutate_journal_batch, random_batch, check_batch, (CorruptRecord,)))
    out.append(Target("journal.verify", "verify_batches of a session's batches", _log_seeds(), mutate_log,
                      lambda rnd: [random_batch(rnd) for _ in range(rnd.randint(1, 3))], check_log, ()))
    out.append(Target("journal.checkpoint", "decode_checkpoint", _checkpoint_seeds(), mutate_checkpoint,
                      random_checkpoint, check_checkpoint, (CorruptRecord,)))
    out.append(Target("journal.ranges", "decode_ranges of a compaction note", [[(4, 200)], [(0, 1), (5, 9), (20, 30)]],
                      mutate_ranges, lambda rnd: pack(wild_value(rnd)), check_ranges, (CorruptRecord,)))
    return out


TARGETS: dict[str, Target] = {t.name: t for t in _targets()}
