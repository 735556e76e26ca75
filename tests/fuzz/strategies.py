"""Hypothesis strategies for the fuzz targets: `inputs(target)` draws one input for a target,
either mutated from its valid seeds by the target's own mutator (driven by a Random that
Hypothesis controls, so it shrinks), or built with fields Hypothesis chose inside valid framing
(so what is tested is the reading of the fields), or raw bytes. tests/fuzz/test_decoders.py
runs a bounded number; bench/bench_fuzz.py runs more.
"""

from __future__ import annotations

import zlib

import msgpack
from hypothesis import strategies as st

from regent import wire
from regent.journal import codec as jcodec
from regent.wire import Kind, schema
from tests.fuzz.mutations import BAD_TIMESTAMP, BAD_UTF8, DEEP, DEEPISH, pack
from tests.fuzz.targets import BatchSeed, Target, frame

# Any msgpack value, of the kinds a peer could put in a field, and some msgpack's packer will
# not make (nested thousands deep, not UTF-8, a bad timestamp: mutations.pack writes them).
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=24)
    | st.binary(max_size=24) | st.sampled_from([DEEP, DEEPISH, BAD_UTF8, BAD_TIMESTAMP]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6) | st.integers(-3, 3), inner,
                                                                 max_size=4),
    max_leaves=12)


@st.composite
def like(draw: st.DrawFn, seed: dict) -> dict:
    """A map with the seed's fields, each kept, dropped or replaced by any value, and a few
    fields more."""
    out = {}
    for key, value in seed.items():
        fate = draw(st.integers(0, 9))
        if fate == 0:
            continue
        out[key] = value if fate < 6 else draw(VALUES)
    out.update(draw(st.dictionaries(st.sampled_from(["x", "n", "rt", "e", "pt", "co"]), VALUES, max_size=2)))
    return out


def _message(draw: st.DrawFn, seed: list) -> list[bytes]:
    head = bytes(seed[0])
    meta = msgpack.unpackb(head[8:], raw=False, strict_map_key=False)
    return [frame(head[3], pack(draw(like(meta)))), *[bytes(f) for f in seed[1:]]]


@st.composite
def messages(draw: st.DrawFn, target: Target) -> list[bytes]:
    """A message whose header is right and whose fields Hypothesis chose (for a batch: such
    messages inside a batch whose lengths fit them)."""
    seed = draw(st.sampled_from(target.seeds))
    if bytes(seed[0])[3] != Kind.BATCH:
        return _message(draw, seed)
    _, meta, payload = wire.decode(seed)
    subs = [[bytes(f) for f in sub] for sub in wire.split_batch(meta, payload)]
    chosen = draw(st.lists(st.sampled_from(subs), min_size=1, max_size=4))
    return wire.encode_batch([_message(draw, sub) for sub in chosen])


@st.composite
def batches(draw: st.DrawFn, target: Target) -> tuple[int, bytes]:
    """A stored batch with up to two records whose fields Hypothesis chose, each under a
    checksum that fits, so what is tested is the reading of the fields, not the checksum."""
    seed: BatchSeed = draw(st.sampled_from(target.seeds))
    frames = list(seed.frames)
    for i in draw(st.sets(st.integers(0, len(frames) - 1), max_size=2)):
        fields = draw(st.lists(st.sampled_from(list(seed.records[i])) | VALUES, max_size=6))
        body = pack(fields)
        frames[i] = msgpack.packb((body, zlib.crc32(body)), use_bin_type=True)
    body = b"".join(frames)
    count = msgpack.packb(len(frames))
    if seed.compressed:
        return seed.first, jcodec.ZLIB_BATCH_FORMAT + count + msgpack.packb(len(body)) + zlib.compress(body, 1)
    return seed.first, jcodec.BATCH_FORMAT + count + body


def _framed(fields: object) -> bytes:
    body = pack(fields)
    return jcodec.CHECKPOINT_FORMAT + msgpack.packb((body, zlib.crc32(body)))


RAW_FRAMES = st.lists(st.binary(max_size=64), max_size=3)
RAW_BATCH = st.tuples(st.integers(0, 2**40), st.sampled_from([b"", jcodec.BATCH_FORMAT, jcodec.ZLIB_BATCH_FORMAT])
                      .flatmap(lambda fmt: st.binary(max_size=200).map(lambda b: fmt + b)))
CHECKPOINTS = (VALUES | like({"lsn": 10, "epoch": 3, "ts": 1.7e9, "data": {"k": b"v"}})).map(_framed)
NOTES = (VALUES | st.lists(st.lists(st.integers(-2, 2**64 - 1) | VALUES, max_size=3), max_size=4)).map(pack)
ADDRESSES = (st.from_regex(schema.ADDRESS, fullmatch=True) | st.text(max_size=40)
             | st.builds("tcp://{}:{}".format, st.text(max_size=12), st.text(max_size=6)))


def inputs(target: Target) -> st.SearchStrategy:
    """One input for `target`: mutated from its seeds, or generated, or raw."""
    mutated = st.randoms(use_true_random=False).map(target.generate)
    name = target.name
    if name == "wire.address":
        return mutated | ADDRESSES
    if name.startswith("wire."):
        return mutated | messages(target) | RAW_FRAMES
    if name in ("journal.record", "journal.batch", "journal.zbatch"):
        return mutated | batches(target) | RAW_BATCH
    if name == "journal.verify":
        return mutated | st.lists(RAW_BATCH, min_size=1, max_size=3)
    if name == "journal.checkpoint":
        return mutated | CHECKPOINTS | st.binary(max_size=64)
    if name == "journal.ranges":
        return mutated | NOTES | st.binary(max_size=64)
    raise KeyError(f"no strategy for fuzz target {name}")
