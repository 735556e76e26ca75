"""Mutations of valid encodings, driven by a random.Random: bytes (bit flips, truncations,
extensions, interesting integers, splices) and msgpack values (a field dropped, added, its type
swapped, its text edited, nested too deeply). The bench drives them with a seeded Random, the
tests with Hypothesis' st.randoms(), which shrinks what they find. Pure: nothing here knows
regent's formats; tests/fuzz/targets.py applies these to messages and batches.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import msgpack

INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0x90, 0x9F, 0x8F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2,
                     0xC3, 0xC4, 0xC6, 0xC7, 0xCA, 0xCB, 0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD3, 0xD4,
                     0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xE0)
INTERESTING_INTS = (0, 1, -1, 2, 15, 16, 127, 128, 255, 256, 1023, 1024, 1025, 4096, 65535, 65536,
                    2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -2**31, -2**63, 2**64 - 1)

# Values msgpack's packer will not make: pack() replaces each placeholder's encoding with the
# raw bytes. Arrays nested deeply, a timestamp (ext -1) of a length none has, and a str that
# is not UTF-8.
DEEP = "\x00regent-fuzz-deep\x00"  # 5000 deep: past every decoder's limit
DEEPISH = "\x00regent-fuzz-deepish\x00"  # 1000 deep: within msgpack's limit, past repr()'s
BAD_TIMESTAMP = "\x00regent-fuzz-timestamp\x00"
BAD_UTF8 = "\x00regent-fuzz-utf8\x00"
_RAW = {msgpack.packb(DEEP): b"\x91" * 5000 + b"\xc0",
        msgpack.packb(DEEPISH): b"\x91" * 1000 + b"\xc0",
        msgpack.packb(BAD_TIMESTAMP): b"\xc7\x03\xff\x00\x00\x01",
        msgpack.packb(BAD_UTF8): b"\xa3\xff\xfe\xc0"}


def mutate_bytes(rnd: random.Random, data: bytes, others: Sequence[bytes] = (), max_ops: int = 4) -> bytes:
    """`data` with 1..max_ops byte-level edits; `others` are spliced from."""
    buf = bytearray(data)
    for _ in range(rnd.randint(1, max_ops)):
        op = rnd.randrange(12)
        n = len(buf)
        if op == 0 and n:  # flip a bit
            buf[rnd.randrange(n)] ^= 1 << rnd.randrange(8)
        elif op == 1 and n:  # any byte
            buf[rnd.randrange(n)] = rnd.randrange(256)
        elif op == 2 and n:  # a byte msgpack or a length reads specially
            buf[rnd.randrange(n)] = rnd.choice(INTERESTING_BYTES)
        elif op == 3:  # insert
            at = rnd.randint(0, n)
            buf[at:at] = rnd.randbytes(rnd.randint(1, 8))
        elif op == 4 and n:  # delete a range
            at = rnd.randrange(n)
            del buf[at:at + rnd.randint(1, 16)]
        elif op == 5 and n:  # truncate
            del buf[rnd.randrange(n):]
        elif op == 6:  # extend
            buf += rnd.randbytes(rnd.randint(1, 32))
        elif op == 7 and n:  # an interesting integer, big-endian, 1/2/4/8 bytes wide
            width = rnd.choice((1, 2, 4, 8))
            value = rnd.choice(INTERESTING_INTS) % (1 << (8 * width))
            at = rnd.randrange(n)
            buf[at:at + width] = value.to_bytes(width, "big")
        elif op == 8 and n:  # duplicate a chunk
            at = rnd.randrange(n)
            chunk = buf[at:at + rnd.randint(1, 64)]
            to = rnd.randint(0, n)
            buf[to:to] = chunk
        elif op == 9 and others:  # splice another input's tail
            other = rnd.choice(others)
            buf = buf[:rnd.randint(0, n)] + other[rnd.randint(0, len(other)):]
        elif op == 10 and n > 1:  # swap two bytes
            i, j = rnd.randrange(n), rnd.randrange(n)
            buf[i], buf[j] = buf[j], buf[i]
        elif op == 11:  # empty, or one interesting byte
            buf = bytearray() if rnd.random() < 0.5 else bytearray((rnd.choice(INTERESTING_BYTES),))
    return bytes(buf)


def wild_value(rnd: random.Random, depth: int = 0) -> object:
    """A msgpack value of any type, often one a field was never meant to hold."""
    pick = rnd.randrange(16 if depth < 2 else 12)
    if pick == 0:
        return rnd.choice(INTERESTING_INTS)
    if pick == 1:
        return rnd.randint(-1000, 1000)
    if pick == 2:
        return rnd.choice((True, False, None))
    if pick == 3:
        return rnd.choice((0.0, -0.0, 1.5, -1.0, math.inf, -math.inf, math.nan, 1e308, 5e-324))
    if pick == 4:
        return rnd.choice(("", "x", "ok", "err", "hello", "list", "spawn_procs", "tcp://", "ipc://",
                           "tcp://127.0.0.1:1", "tcp://nonsense", "ipc:///", "é\u2028\U0001F600"))
    if pick == 5:
        return "x" * rnd.choice((255, 256, 257, 1024, 1025, 4097, 20000))
    if pick == 6:
        return rnd.randbytes(rnd.choice((0, 1, 16, 64, 65, 300)))
    if pick == 7:
        return msgpack.ExtType(rnd.randrange(128), rnd.randbytes(rnd.randint(0, 12)))
    if pick == 8:
        return rnd.choice((DEEP, DEEPISH, BAD_TIMESTAMP, BAD_UTF8))
    if pick == 9:
        return [rnd.choice(INTERESTING_INTS) for _ in range(rnd.choice((0, 1, 2, 5, 1025)))]
    if pick == 10:
        return {}
    if pick == 11:
        return []
    if pick == 12:
        return [wild_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    if pick == 13:  # keys of any type: strict_map_key refuses some, msgspec others
        return {wild_key(rnd): wild_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))}
    if pick == 14:
        return [[rnd.randint(-2, 300) for _ in range(rnd.randint(0, 5))] for _ in range(rnd.randint(0, 5))]
    return {"sid": "s", "e": 0, "n": [1]}


def wild_key(rnd: random.Random) -> object:
    return rnd.choice(("", "k", "sid", "e", "n", "rt", 0, -1, 2**40, b"k", None, True, 1.5, (1, 2)))


def mutate_text(rnd: random.Random, text: str) -> str:
    """`text` with 1..3 character edits (separators, digits, NULs, truncation, growth)."""
    chars = list(text)
    for _ in range(rnd.randint(1, 3)):
        op = rnd.randrange(6)
        if op == 0 and chars:
            chars[rnd.randrange(len(chars))] = rnd.choice("x:/.09 -_[]\x00\x7f\né")
        elif op == 1:
            chars.insert(rnd.randint(0, len(chars)), rnd.choice(":/.0x-[]\x00\n"))
        elif op == 2 and chars:
            del chars[rnd.randrange(len(chars)):]
        elif op == 3 and chars:
            del chars[rnd.randrange(len(chars))]
        elif op == 4 and chars:
            i = rnd.randrange(len(chars))
            chars[i:i] = chars[i:i + rnd.randint(1, 8)]
        else:
            chars += rnd.choice(("0", ":1", "/", "99999", "65536", "x" * 300))
    return "".join(chars)


def _mutate_leaf(rnd: random.Random, value: object) -> object:
    """An edit of a value that keeps (mostly) its type: text, numbers, bytes, lists."""
    if isinstance(value, str):
        return mutate_text(rnd, value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        edited = rnd.choice((value + 1, value - 1, -value, value * 2**32, rnd.choice(INTERESTING_INTS)))
        return max(-2**63, min(edited, 2**64 - 1))  # what msgpack can carry
    if isinstance(value, float):
        return rnd.choice((-value, value * 1e300, math.nan, -math.inf, 0.5, -1.0))
    if isinstance(value, bytes):
        return mutate_bytes(rnd, value, max_ops=2)
    return wild_value(rnd)


def mutate_value(rnd: random.Random, value: object, max_ops: int = 3) -> object:
    """A copy of the msgpack value `value` (a map or an array, say) with 1..max_ops edits
    somewhere inside it: a child dropped, added, swapped, retyped or edited."""
    value = _copy(value)
    for _ in range(rnd.randint(1, max_ops)):
        value = _edit(rnd, value)
    return value


_EDIT_DEPTH = 16  # below this (a value nested 1000 deep, say) nothing is copied or edited


def _copy(value: object, depth: int = 0) -> object:
    if depth > _EDIT_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: _copy(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v, depth + 1) for v in value]
    return value


def _edit(rnd: random.Random, value: object, depth: int = 0) -> object:
    if not isinstance(value, dict | list) or depth >= _EDIT_DEPTH or rnd.random() < 0.05:
        return _mutate_leaf(rnd, value) if rnd.random() < 0.6 else wild_value(rnd)
    if isinstance(value, dict):
        keys = list(value)
        op = rnd.randrange(7)
        if keys and op <= 2:  # descend into a child or edit it in place
            k = rnd.choice(keys)
            value[k] = _edit(rnd, value[k], depth + 1) if rnd.random() < 0.7 else wild_value(rnd)
        elif keys and op == 3:
            del value[rnd.choice(keys)]
        elif op == 4:
            value[wild_key(rnd) if rnd.random() < 0.3 else rnd.choice(keys or ["x"])] = wild_value(rnd)
        elif len(keys) > 1 and op == 5:  # the value of another field: a type swap
            a, b = rnd.sample(keys, 2)
            value[a], value[b] = value[b], value[a]
        else:
            value[rnd.choice(("extra", "pt", "s", "e", "n", "rt", "op", "st", "co"))] = wild_value(rnd)
        return value
    op = rnd.randrange(5)
    if value and op <= 2:
        i = rnd.randrange(len(value))
        value[i] = _edit(rnd, value[i], depth + 1) if rnd.random() < 0.7 else wild_value(rnd)
    elif value and op == 3:
        del value[rnd.randrange(len(value)):]
    else:
        value.insert(rnd.randint(0, len(value)), wild_value(rnd))
    return value


def pack(value: object) -> bytes:
    """msgpack bytes of a (mutated) value, its placeholders replaced by their raw bytes."""
    body = msgpack.packb(value, use_bin_type=True)
    if b"regent-fuzz-" in body:
        for placeholder, raw in _RAW.items():
            body = body.replace(placeholder, raw)
    return body
