"""Message framing between controller, host agents and procs.

A message is a zmq multipart: frame 0 is an 8-byte header plus a msgpack map of
metadata; frame 1 (optional) is a pickle-5 payload; frames 2.. are its out-of-band
buffers. Parsing validates everything before a payload is ever unpickled, and
payloads are only unpickled from peers the transport authenticated.
"""

from __future__ import annotations

import enum
import io
import pickle
import struct
import sys
from collections.abc import Sequence
from typing import Any

import cloudpickle
import msgpack
import xxhash

from worker.errors import ProtocolError

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


_KINDS = {int(k) for k in Kind}


def encode(kind: Kind, meta: dict, payload: Sequence[Any] = ()) -> list:
    """Frames for one message; payload is [pickle bytes, *buffers] or empty."""
    body = msgpack.packb(meta, use_bin_type=True)
    if len(body) > MAX_META_BYTES:
        raise ProtocolError(f"message metadata is {len(body)} bytes, above {MAX_META_BYTES}")
    return [_HEADER.pack(MAGIC, VERSION, int(kind), len(body)) + body, *payload]


def decode(frames: Sequence[Any]) -> tuple[Kind, dict, list]:
    """Parse and validate one message; raises ProtocolError naming the defect."""
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
    try:
        meta = msgpack.unpackb(
            head[_HEADER.size :], raw=False, strict_map_key=True
        )
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"metadata is not valid msgpack: {e}") from None
    if not isinstance(meta, dict):
        raise ProtocolError("metadata is not a map")
    return Kind(kind), meta, list(frames[1:])


def require(meta: dict, key: str, typ: type | tuple[type, ...]) -> Any:
    """A field of validated type, or ProtocolError naming it."""
    v = meta.get(key)
    if not isinstance(v, typ) or isinstance(v, bool) and typ is int:
        raise ProtocolError(f"field {key!r} missing or not {typ}")
    return v


_PLAIN = (int, float, str, bytes, bool, type(None))


def _is_plain(obj: Any, depth: int = 0) -> bool:
    """True for data the stdlib pickler handles identically everywhere (no classes)."""
    if isinstance(obj, _PLAIN):
        return True
    if depth > 3:
        return False
    t = type(obj)
    if t is tuple or t is list:
        return len(obj) <= 64 and all(_is_plain(x, depth + 1) for x in obj)
    if t is dict:
        return len(obj) <= 64 and all(
            _is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in obj.items()
        )
    return False


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


class _DigestPickler(pickle.Pickler):
    """Classes by name, never by value: the same call pickles to the same bytes in
    every process (cloudpickle's by-value classes carry a per-process id)."""

    def reducer_override(self, obj: Any) -> Any:
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


def payload_size(frames: Sequence[Any]) -> int:
    return sum(len(f.buffer if hasattr(f, "buffer") else f) for f in frames)
