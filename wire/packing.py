"""msgpack encoding through one reusable Packer per thread (msgpack.packb builds a Packer
per call): the wire format and the journal's record codec both pack with it.

Plain values only; nothing here knows messages or records.
"""

from __future__ import annotations

import threading

import msgpack

_local = threading.local()


def packer() -> msgpack.Packer:
    """This thread's Packer (bin type on). A pack that raised may leave part of its value in
    the buffer: reset() it then, or use pack(), which does."""
    try:
        return _local.packer
    except AttributeError:
        _local.packer = msgpack.Packer(use_bin_type=True)
        return _local.packer


def pack(value: object) -> bytes:
    """msgpack bytes of `value`; a value msgpack cannot encode raises as msgpack does."""
    p = packer()
    try:
        return p.pack(value)
    except BaseException:
        p.reset()  # a failed pack may leave part of the value in the buffer
        raise
