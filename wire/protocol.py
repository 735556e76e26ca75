"""Message framing between controller, host agents and procs.

A message is a zmq multipart: frame 0 is an 8-byte header plus a msgpack map of
metadata; frame 1 (optional) is a pickle-5 payload; frames 2.. are its out-of-band
buffers. A BATCH message carries many messages to one peer in one send: its metadata
lists how many frames each one has, and each is then validated exactly as if it had
come alone. A RELAY message asks a host agent to pass the message in its payload frames
on, untouched, to the inbox "to" (a cast through the host: docs/design.md). Parsing
validates everything before a payload is ever unpickled, and payloads are only unpickled
from peers the transport authenticated.
"""

from __future__ import annotations

import enum
import io
import pickle
import reprlib
import struct
import sys
from collections.abc import Sequence
from typing import Any

import cloudpickle
import msgpack
import xxhash

from regent.wire.errors import ProtocolError
from regent.wire.packing import packer as _packer

MAGIC = b"RG"
VERSION = 1
_HEADER = struct.Struct("!2sBBI")  # magic, version, kind, meta length
MAX_META_BYTES = 64 * 1024
MAX_BUFFERS = 4096


class Kind(enum.IntEnum):
    CALL = 1  # controller -> proc: run an endpoint
    RESULT = 2  # proc -> controller: outcome of CALL / SPAWN / STOP
    SPAWN = 3  # controller -> proc: create an actor
    STOP = 4  # controller -> proc: stop an actor
    FENCE = 5  # controller -> proc/host: raise the epoch
    WATERMARK = 6  # controller -> proc: results below these seqs can be dropped
    HOST_REQ = 7  # controller -> host agent
    HOST_REP = 8  # host agent -> controller
    HOST_EVENT = 9  # host agent -> controller (a proc died, ...)
    PROC_READY = 10  # proc -> host agent
    PING = 11
    PONG = 12
    PROC_ADOPT = 13  # proc -> host agent: its agent died; the new one takes it over (answered by HOST_REP)
    BATCH = 14  # any -> any: several messages to one peer, in the order they were sent
    LOG = 15  # proc -> controller: lines its processes wrote to stdout / stderr
    RELAY = 16  # controller or proc -> host agent: forward the message in the payload frames to "to"
    BULK = 17  # any -> a process of the same host: the message in the payload, large frames in /dev/shm (wire.bulk)


_KINDS = {int(k) for k in Kind}
_KIND_OF = {int(k): k for k in Kind}
MAX_BATCH = 1024  # messages in one batch, at most


def encode(kind: Kind, meta: dict, payload: Sequence[Any] = ()) -> list:
    """Frames for one message; payload is [pickle bytes, *buffers] or empty."""
    packer = _packer()
    try:
        body = packer.pack(meta)
    except BaseException:
        packer.reset()  # a failed pack may leave part of the value in the buffer
        raise
    if len(body) > MAX_META_BYTES:
        raise ProtocolError(f"message metadata is {len(body)} bytes, above {MAX_META_BYTES}")
    return [_HEADER.pack(MAGIC, VERSION, kind, len(body)) + body, *payload]


def kind_byte(frame: Any) -> int:
    """The kind a message's first frame says, unchecked (0 for a frame too short to say)."""
    head = frame.buffer if hasattr(frame, "buffer") else frame
    return head[3] if len(head) > 3 else 0


def relay_header(to: str) -> bytes:
    """The frame that, put before a message's frames, asks a host agent to pass the message
    on to the inbox `to` (constant per destination: senders keep it)."""
    return encode(Kind.RELAY, {"to": to})[0]


class PointMessages:
    """The messages of one call to several points of a mesh: the shared metadata is packed
    once, and each point's message adds its own "pt" (a msgpack map has no key order)."""

    def __init__(self, kind: Kind, base: dict, payload: Sequence[Any]):
        if "pt" in base or len(base) >= 15:
            raise ValueError("PointMessages needs metadata of under 15 keys, without 'pt'")
        packed = _packer().pack(base)  # a fixmap: one header byte holding the key count
        self._prefix = bytes((0x80 | (len(base) + 1),)) + packed[1:] + b"\xa2pt"
        self._kind = kind
        self._payload = payload

    def encode(self, point: int) -> list:
        body = self._prefix + _packer().pack(point)
        if len(body) > MAX_META_BYTES:
            raise ProtocolError(f"message metadata is {len(body)} bytes, above {MAX_META_BYTES}")
        return [_HEADER.pack(MAGIC, VERSION, self._kind, len(body)) + body, *self._payload]


def decode_head(frames: Sequence[Any]) -> tuple[Kind, Any, list]:
    """Kind, metadata bytes (still to be decoded) and payload frames of one message, its
    header checked; raises ProtocolError naming the defect. wire.schema decodes the
    metadata of what a receiver accepts; `decode` decodes any metadata untyped."""
    if not frames:
        raise ProtocolError("empty message")
    if len(frames) > MAX_BUFFERS + 2:
        raise ProtocolError(f"message has {len(frames)} frames, above {MAX_BUFFERS + 2}")
    head = frames[0]
    head = head.buffer if hasattr(head, "buffer") else head
    if len(head) < _HEADER.size:
        raise ProtocolError(f"header frame is {len(head)} bytes, shorter than {_HEADER.size}")
    magic, version, kind, meta_len = _HEADER.unpack_from(head)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise ProtocolError(f"wire version {version}, this side speaks {VERSION}")
    if kind not in _KINDS:
        raise ProtocolError(f"unknown message kind {kind}")
    if meta_len > MAX_META_BYTES or _HEADER.size + meta_len != len(head):
        raise ProtocolError(f"metadata length {meta_len} does not match a {len(head)}-byte frame")
    return _KIND_OF[kind], head[_HEADER.size :], list(frames[1:])


def decode(frames: Sequence[Any]) -> tuple[Kind, dict, list]:
    """Parse one message, its metadata untyped (journal records, tools); receivers use
    wire.schema, which validates every field. Raises ProtocolError naming the defect."""
    kind, body, payload = decode_head(frames)
    try:
        meta = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"metadata is not valid msgpack: {e}") from None
    if not isinstance(meta, dict):
        raise ProtocolError("metadata is not a map")
    return kind, meta, payload


def encode_batch(messages: Sequence[list]) -> list:
    """One message carrying several (each a list of frames, as `encode` returns them):
    a header listing every frame's length, per message, and one frame of all their bytes."""
    lengths = []
    parts = []
    for m in messages:
        lengths.append([len(f) for f in m])
        parts += m
    return encode(Kind.BATCH, {"n": lengths}, [b"".join(parts)])


_SKETCH = reprlib.Repr()
_SKETCH.maxlevel, _SKETCH.maxlist, _SKETCH.maxstring, _SKETCH.maxother = 3, 8, 40, 40


def _sketch(value: Any) -> str:
    """A short repr of a decoded value for an error, safe at any depth (str() recurses)."""
    return _SKETCH.repr(value)


def split_batch(meta: dict, frames: list) -> list[list]:
    """The messages inside a decoded BATCH, each still to be `decode`d on its own (its
    frames are views into the batch's bytes, not copies).

    Raises ProtocolError when the lengths do not describe the batch's bytes exactly."""
    lengths = meta.get("n")
    if type(lengths) is not list or not lengths or len(lengths) > MAX_BATCH:
        raise ProtocolError(f"batch field 'n' must list the frame lengths of 1..{MAX_BATCH} messages")
    if len(frames) != 1:
        raise ProtocolError(f"a batch has one body frame, this one has {len(frames)}")
    body = frames[0]
    body = body.buffer if hasattr(body, "buffer") else memoryview(body)
    size = len(body)
    out = []
    at = 0
    for msg in lengths:
        if type(msg) is not list or not msg or len(msg) > BATCH_MESSAGE_FRAMES:
            raise ProtocolError(f"batch message lengths {_sketch(msg)} are not 1..{BATCH_MESSAGE_FRAMES} ints")
        sub = []
        for n in msg:
            if type(n) is not int or n < 0 or at + n > size:
                raise ProtocolError(f"batch lengths {_sketch(lengths)} do not fit its {size} bytes")
            sub.append(body[at : at + n])
            at += n
        out.append(sub)
    if at != size:
        raise ProtocolError(f"batch lengths cover {at} of its {size} bytes")
    return out


# What one batch carries: at most BATCH_MESSAGES messages and BATCH_BYTES bytes (less
# where the receiver's REGENT_MAX_MESSAGE_BYTES is lower: see batch_bytes).
# A message with a payload over BATCH_ALONE_BYTES, or many buffers, travels on its own:
# copying it into a batch would cost more than its own send.
BATCH_MESSAGES = 256
BATCH_BYTES = 1 << 20
BATCH_ALONE_BYTES = 64 * 1024
BATCH_MESSAGE_FRAMES = 4


def message_bytes(msg: list) -> int:
    """Payload bytes of an encoded message (the header frame is small and not counted)."""
    n = 0
    for f in msg[1:]:
        n += len(f)  # bytes, 'B'-format memoryviews (PickleBuffer.raw) and zmq Frames
    return n


def batchable(msg: list, size: int) -> bool:
    """A BULK envelope travels alone: its receiver's transport takes it apart, not its handler."""
    return size <= BATCH_ALONE_BYTES and len(msg) <= BATCH_MESSAGE_FRAMES and \
        (len(msg) < 3 or kind_byte(msg[0]) != Kind.BULK)


def batch_bytes(max_message: int) -> int:
    """The byte budget of one batch for a peer accepting frames up to max_message bytes."""
    return max(1, min(BATCH_BYTES, max_message // 2))


def pack(messages: Sequence[list], max_message: int = 4 << 30) -> list[list]:
    """Group messages to one peer into as few sends as the batch limits allow, in order.
    Each element is a list of frames ready to send: a single message or a BATCH."""
    limit = batch_bytes(max_message)
    out: list[list] = []
    group: list[list] = []
    nbytes = 0

    def close_group() -> None:
        if group:
            out.append(group[0] if len(group) == 1 else encode_batch(group))

    for msg in messages:
        size = message_bytes(msg)
        if not batchable(msg, size):
            close_group()
            group, nbytes = [], 0
            out.append(msg)
            continue
        if group and (len(group) >= BATCH_MESSAGES or nbytes + size + len(msg[0]) > limit):
            close_group()
            group, nbytes = [], 0
        group.append(msg)
        nbytes += size + len(msg[0])  # the header too: a batch is one message
    close_group()
    return out


def decode_one(frames: Sequence[Any]) -> tuple[Kind, dict, list]:
    """`decode` for a message taken out of a batch: batches do not nest."""
    kind, meta, payload = decode(frames)
    if kind is Kind.BATCH:
        raise ProtocolError("a batch inside a batch")
    return kind, meta, payload


def require(meta: dict, key: str, typ: type | tuple[type, ...]) -> Any:
    """A field of validated type, or ProtocolError naming it."""
    v = meta.get(key)
    if type(v) is typ:  # the usual case, and never a bool passing for an int
        return v
    if not isinstance(v, typ) or isinstance(v, bool) and typ is int:
        raise ProtocolError(f"field {key!r} missing or not {typ}")
    return v


_PLAIN = (int, float, str, bytes, bool, type(None))
_PLAIN_TYPES = frozenset(_PLAIN)


def _is_plain(obj: Any, depth: int = 0) -> bool:
    """True for data the stdlib pickler handles identically everywhere (no classes).

    On every call's path, so plain loops rather than all() over generators."""
    t = type(obj)
    if t in _PLAIN_TYPES:
        return True
    if t is tuple or t is list:
        if depth > 3 or len(obj) > 64:
            return False
        for x in obj:
            if not _is_plain(x, depth + 1):
                return False
        return True
    if t is dict:
        if depth > 3 or len(obj) > 64:
            return False
        for k, v in obj.items():
            if not (_is_plain(k, depth + 1) and _is_plain(v, depth + 1)):
                return False
        return True
    return isinstance(obj, _PLAIN)


def _rebuild_tensor(buf: Any, dtype: Any, shape: tuple, requires_grad: bool) -> Any:
    import torch

    t = torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)
    t = t.view(dtype).reshape(shape)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _reduce_tensor(obj: Any) -> Any:
    """Zero-copy reduction of a dense CPU tensor, or NotImplemented."""
    torch = sys.modules.get("torch")
    if torch is None or type(obj) is not torch.Tensor or obj.device.type != "cpu":
        return NotImplemented
    t = obj.detach().contiguous()
    if t.is_quantized or t.is_sparse or t.dtype.is_complex:
        return NotImplemented
    raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
    return _rebuild_tensor, (pickle.PickleBuffer(raw), t.dtype, tuple(t.shape), obj.requires_grad)


class _Pickler(cloudpickle.CloudPickler):
    """cloudpickle plus zero-copy CPU tensors: the storage travels as an out-of-band frame."""

    def reducer_override(self, obj: Any) -> Any:
        r = _reduce_tensor(obj)
        return super().reducer_override(obj) if r is NotImplemented else r


def _digested(identity: Any) -> None:
    """Stands in, in a digest only, for an object that says what identifies it."""


class _DigestPickler(pickle.Pickler):
    """Classes by name, never by value: the same call pickles to the same bytes in
    every process (cloudpickle's by-value classes carry a per-process id). An object whose
    class defines `__regent_digest__()` is digested as what that returns: a mesh reference
    names its procs by stable keys there, not by addresses a replacement changes."""

    def reducer_override(self, obj: Any) -> Any:
        ident = getattr(type(obj), "__regent_digest__", None)
        if ident is not None:
            return _digested, (ident(obj),)
        return _reduce_tensor(obj)


def dumps(obj: Any) -> list:
    """Pickle-5 frames: [main, *out-of-band buffers]. Classes from __main__ travel by value."""
    buffers: list = []
    if _is_plain(obj):
        main = pickle.dumps(obj, protocol=5)
    else:
        f = io.BytesIO()
        _Pickler(f, protocol=5, buffer_callback=buffers.append).dump(obj)
        main = f.getvalue()
    return [main, *(b.raw() for b in buffers)]


def loads(frames: Sequence[Any]) -> Any:
    """Inverse of dumps. Only call on frames from an authenticated peer."""
    if not frames:
        raise ProtocolError("missing payload frame")
    if len(frames) == 1:
        f = frames[0]
        return pickle.loads(f.buffer if hasattr(f, "buffer") else f)
    main, *bufs = (f.buffer if hasattr(f, "buffer") else f for f in frames)
    return pickle.loads(main, buffers=bufs)


def digest(frames: Sequence[Any]) -> bytes:
    """16-byte digest of a payload, used to tell a replayed call from a divergent one."""
    h = xxhash.xxh3_128()
    for f in frames:
        h.update(f.buffer if hasattr(f, "buffer") else f)
    return h.digest()


def call_digest(obj: Any, frames: Sequence[Any]) -> bytes:
    """Digest of a call's arguments, stable across processes (see _DigestPickler)."""
    if _is_plain(obj):
        return digest(frames)
    buffers: list = []
    f = io.BytesIO()
    try:
        _DigestPickler(f, protocol=5, buffer_callback=buffers.append).dump(obj)
    except (pickle.PicklingError, AttributeError, TypeError):
        return digest(frames)  # lambdas and local classes: only cloudpickle can say
    return digest([f.getvalue(), *(b.raw() for b in buffers)])


_EMPTY_CALL = pickle.dumps(((), {}), protocol=5)
_EMPTY_CALL_DIGEST = xxhash.xxh3_128_digest(_EMPTY_CALL)
_EMPTY_CALL_FRAMES = (_EMPTY_CALL,)


def dumps_call(args: tuple, kwargs: dict) -> tuple[Sequence[Any], bytes]:
    """Payload frames (not to be changed: they may be shared) and argument digest of a
    call: `dumps` and `call_digest` of (args, kwargs), no work for a call without any."""
    if not args and not kwargs:
        return _EMPTY_CALL_FRAMES, _EMPTY_CALL_DIGEST
    obj = (args, kwargs)
    if _is_plain(obj):
        main = pickle.dumps(obj, protocol=5)
        return [main], xxhash.xxh3_128_digest(main)
    frames = dumps(obj)
    return frames, call_digest(obj, frames)


def frame_bytes(frames: Sequence[Any]) -> list[bytes]:
    """The frames as bytes: a zmq Frame's cached copy, a bytes object itself, else a copy."""
    return [f if type(f) is bytes else getattr(f, "bytes", None) or bytes(f) for f in frames]


def payload_size(frames: Sequence[Any]) -> int:
    n = 0
    for f in frames:
        n += len(f)  # bytes, 'B'-format memoryviews (PickleBuffer.raw) and zmq Frames
    return n
