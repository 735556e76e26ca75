"""Byte formats of the journal: records, batches of records, checkpoints, compaction notes.

A record is msgpack `[lsn, epoch, kind, data, ts]` framed with its crc32, so a flipped bit is
caught and named by lsn. Many records share one stored value (a batch): that is what makes
group commit cheap. A batch of COMPRESS_MIN_BYTES or more is stored zlib-compressed: the
call path's records (digests, seqs, replies as the worker sent them) shrink about 14x, and
so do the bytes etcd replicates, fsyncs and counts against its quota. Pure functions only;
nothing here does IO or ever unpickles.
"""

from __future__ import annotations

import reprlib
import zlib
from typing import Any

import msgpack

from regent.wire.packing import pack

from .errors import CorruptRecord, JournalError, RecordTooLarge
from .records import Record

BATCH_FORMAT = b"\x01"  # count, then the framed records
ZLIB_BATCH_FORMAT = b"\x02"  # count, their length, then the framed records zlib-compressed
COMPRESS_MIN_BYTES = 4096  # below this a batch is stored as is: too small to gain
MAX_BATCH_BYTES = 16 << 20  # no batch the writer stores unpacks to more (it cuts ~512 KiB ones)
# The smallest framed record: [body, crc] around [lsn, epoch, kind, data, ts] is 10 bytes at
# least, so a batch of n bytes holds n // 10 records at most.
MIN_RECORD_BYTES = 10
CHECKPOINT_FORMAT = b"\x01"

# A record larger than this belongs outside the journal (digest and size only): etcd refuses
# requests over 1.5 MiB, and the batch it travels in needs headroom for keys and compares.
MAX_RECORD_BYTES = 1 << 20

# Decoding allows non-str map keys: the journal's own writer produced the bytes, and a record
# that was accepted on write must always read back.
_packb = msgpack.packb
_unpackb = msgpack.unpackb
_crc32 = zlib.crc32
def encode_record(lsn: int, epoch: int, kind: str, data: dict[str, Any], ts: float) -> bytes:
    """Return the framed bytes of one record; raise RecordTooLarge or TypeError on bad input."""
    if not isinstance(kind, str):
        raise TypeError(f"record kind must be a str, got {type(kind).__name__} for lsn {lsn}")
    if not isinstance(data, dict):
        raise TypeError(f"record data must be a dict, got {type(data).__name__} for lsn {lsn}")
    try:
        body = pack([lsn, epoch, kind, data, ts])
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"record {kind!r} (lsn {lsn}) holds a value msgpack cannot encode: {exc}; "
            "journal data may only contain str, int, float, bool, None, bytes, lists and "
            "dicts with str keys"
        ) from exc
    if len(body) > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            f"record {kind!r} (lsn {lsn}) is {len(body)} bytes; the journal takes at most "
            f"{MAX_RECORD_BYTES} bytes per record. Keep large values out of the journal "
            "(journal their digest and size and keep the bytes with the worker)."
        )
    return pack((body, _crc32(body)))


def encode_entries(epoch: int, entries: list) -> list[bytes]:
    """Frame a run of queued records: bytes pass through, `(lsn, kind, data, ts)` is encoded
    (the group-commit thread's lazily submitted records). A record that cannot be encoded
    raises JournalError naming it."""
    out: list[bytes] = []
    for entry in entries:
        if type(entry) is bytes:
            out.append(entry)
            continue
        try:
            out.append(encode_record(entry[0], epoch, entry[1], entry[2], entry[3]))
        except (TypeError, RecordTooLarge) as exc:
            raise JournalError(f"a lazily submitted record could not be written: {exc}") from exc
    return out


def encode_batch(frames: list[bytes]) -> bytes:
    """Join framed records (contiguous lsns) into one stored value, compressed if that pays.

    zlib level 1: about 1 ms for a 300 KiB batch, with the GIL released, where a 300 KiB
    value costs etcd about 1 ms more CPU than a 20 KiB one (and SQLite, overflow pages)."""
    body = b"".join(frames)
    if len(body) >= COMPRESS_MIN_BYTES:
        packed = zlib.compress(body, 1)
        if len(packed) < len(body):
            return b"".join([ZLIB_BATCH_FORMAT, _packb(len(frames)), _packb(len(body)), packed])
    return b"".join([BATCH_FORMAT, _packb(len(frames)), body])


def _header(value: bytes, session: str, first_lsn: int) -> tuple[int, int, int | None]:
    """The batch's header read and checked: (record count, where the framed records or the
    zlib stream start, the inflated size of a compressed batch). A count no batch of these
    bytes could hold is damage: read, verify and a new leader's next lsn all trust it."""
    if value[:1] not in (BATCH_FORMAT, ZLIB_BATCH_FORMAT):
        raise CorruptRecord(session, first_lsn, f"batch has unknown format byte {value[:1]!r}")
    unpacker = msgpack.Unpacker()
    unpacker.feed(value[1:20])
    try:
        count = unpacker.unpack()
    except Exception as exc:
        raise CorruptRecord(session, first_lsn, f"batch header is unreadable ({exc})") from exc
    if not isinstance(count, int) or count < 1:
        raise CorruptRecord(session, first_lsn, f"batch header claims {count!r} records")
    if value[:1] == BATCH_FORMAT:
        if count * MIN_RECORD_BYTES > len(value):
            raise CorruptRecord(session, first_lsn, f"batch header claims {count} records, more than "
                                                    f"its {len(value)} bytes can hold")
        return count, 1 + unpacker.tell(), None
    where = f"compressed batch of {count} records (lsn {first_lsn}..{first_lsn + count - 1})"
    try:
        size = unpacker.unpack()
    except Exception as exc:
        raise CorruptRecord(session, first_lsn, f"{where} has an unreadable length ({exc})") from exc
    if type(size) is not int or not 0 < size <= MAX_BATCH_BYTES:
        raise CorruptRecord(session, first_lsn, f"{where} claims {size!r} bytes")
    if count * MIN_RECORD_BYTES > size:
        raise CorruptRecord(session, first_lsn, f"{where} claims {size} bytes, too few for them")
    return count, 1 + unpacker.tell(), size


def batch_count(value: bytes, session: str, first_lsn: int) -> int:
    """Return how many records a stored batch claims to hold, reading only its header."""
    return _header(value, session, first_lsn)[0]


def _frames(value: bytes, session: str, first_lsn: int) -> tuple[msgpack.Unpacker, int, int]:
    """An unpacker over the batch's framed records, their count, and the bytes it was fed."""
    count, start, size = _header(value, session, first_lsn)
    if size is None:
        unpacker = msgpack.Unpacker(use_list=False, raw=False, max_buffer_size=len(value) + 16)
        unpacker.feed(memoryview(value)[start:])
        return unpacker, count, len(value) - start
    where = f"compressed batch of {count} records (lsn {first_lsn}..{first_lsn + count - 1})"
    inflate = zlib.decompressobj()
    try:
        body = inflate.decompress(memoryview(value)[start:], size)
    except zlib.error as exc:
        raise CorruptRecord(session, first_lsn, f"{where} is damaged ({exc})") from exc
    if len(body) != size or not inflate.eof or inflate.unconsumed_tail or inflate.unused_data:
        raise CorruptRecord(session, first_lsn,
                            f"{where} is damaged (it inflates to other than the {size} bytes it claims)")
    unpacker = msgpack.Unpacker(use_list=False, raw=False, max_buffer_size=size + 16)
    unpacker.feed(body)
    return unpacker, count, size


def decode_batch(value: bytes, session: str, first_lsn: int) -> list[Record]:
    """Decode every record of a batch, verifying checksums; raise CorruptRecord on any defect."""
    unpacker, count, fed = _frames(value, session, first_lsn)
    out: list[Record] = []
    append = out.append
    new = tuple.__new__
    lsn = first_lsn
    try:
        for _ in range(count):
            body, crc = unpacker.unpack()
            if _crc32(body) != crc:
                raise CorruptRecord(session, lsn, "checksum mismatch")
            fields = _unpackb(body, raw=False, strict_map_key=False)
            if type(fields) is not list or len(fields) != 5:
                raise CorruptRecord(session, lsn, _misshapen(fields))
            at, epoch, kind, data, ts = fields
            if (at != lsn or type(at) is not int or type(epoch) is not int or type(kind) is not str
                    or type(data) is not dict or type(ts) is not float and type(ts) is not int):
                raise CorruptRecord(session, lsn, _misshapen(fields) or
                                    f"record says lsn {at!r} but is stored at lsn {lsn}")
            append(new(Record, fields))
            lsn += 1
    except CorruptRecord:
        raise
    except Exception as exc:
        raise CorruptRecord(session, lsn, f"torn record ({type(exc).__name__}: {exc})") from exc
    if unpacker.tell() != fed:
        raise CorruptRecord(session, first_lsn, _more_than(count, fed - unpacker.tell()))
    return out


def _misshapen(fields: Any) -> str | None:
    """What is wrong with a decoded record's fields, or None if they are [lsn, epoch, kind,
    data, ts] of the right types (the lsn is the caller's to compare)."""
    if type(fields) is not list or len(fields) != 5:
        return f"record is {type(fields).__name__} {_sketch(fields)}, not [lsn, epoch, kind, data, ts]"
    lsn, epoch, kind, data, ts = fields
    for name, value, typ in (("lsn", lsn, int), ("epoch", epoch, int), ("kind", kind, str), ("data", data, dict)):
        if type(value) is not typ:
            return f"record's {name} is {type(value).__name__} {_sketch(value)}, not {typ.__name__}"
    if type(ts) not in (int, float):
        return f"record's ts is {type(ts).__name__} {_sketch(ts)}, not a number"
    return None


_SKETCH = reprlib.Repr()
_SKETCH.maxlevel, _SKETCH.maxlist, _SKETCH.maxdict, _SKETCH.maxstring, _SKETCH.maxother = 3, 6, 6, 40, 40


def _sketch(value: Any) -> str:
    """A short repr of a decoded value for a problem report, safe at any depth (str() recurses)."""
    return _SKETCH.repr(value)


def _more_than(count: int, extra: int) -> str:
    return f"batch holds more than the {count} records it declares ({extra} bytes after them)"


def inspect_batch(
    value: bytes, session: str, first_lsn: int
) -> tuple[list[tuple[int, int | None, str | None]], list[str]]:
    """Decode a batch leniently for verification.

    Returns ([(lsn, epoch or None, kind or None)], problems): a record whose checksum fails is
    listed with epoch None so the caller still counts its lsn; a torn batch stops the listing.
    """
    problems: list[str] = []
    entries: list[tuple[int, int | None, str | None]] = []
    try:
        unpacker, count, fed = _frames(value, session, first_lsn)
    except CorruptRecord as exc:
        try:
            count = batch_count(value, session, first_lsn)
        except CorruptRecord:
            return entries, [f"lsn {first_lsn}: {exc.problem}"]
        # A compressed batch that will not inflate: its header still says which lsns it held.
        return [(first_lsn + i, None, None) for i in range(count)], [f"lsn {first_lsn}: {exc.problem}"]
    lsn = first_lsn
    for _ in range(count):
        try:
            body, crc = unpacker.unpack()
        except Exception as exc:
            problems.append(
                f"lsn {lsn}: torn record, batch at lsn {first_lsn} ends early "
                f"(after {lsn - first_lsn} of the {count} records it declares; {type(exc).__name__})"
            )
            return entries, problems
        if not isinstance(body, bytes) or _crc32(body) != crc:
            problems.append(f"lsn {lsn}: checksum mismatch")
            entries.append((lsn, None, None))
            lsn += 1
            continue
        try:
            fields = _unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:
            problems.append(f"lsn {lsn}: undecodable record ({type(exc).__name__})")
            entries.append((lsn, None, None))
            lsn += 1
            continue
        misshapen = _misshapen(fields)
        if misshapen is not None:
            problems.append(f"lsn {lsn}: {misshapen}")
            entries.append((lsn, None, None))
            lsn += 1
            continue
        stored_lsn, epoch, kind = fields[0], fields[1], fields[2]
        if stored_lsn != lsn:
            problems.append(f"lsn {lsn}: record says lsn {stored_lsn}")
        entries.append((lsn, epoch, kind))
        lsn += 1
    if unpacker.tell() != fed:
        problems.append(f"lsn {first_lsn}: {_more_than(count, fed - unpacker.tell())}")
    return entries, problems


def encode_checkpoint(lsn: int, epoch: int, ts: float, data: dict[str, Any]) -> bytes:
    """Frame a checkpoint taken when records below `lsn` were all applied."""
    body = _packb({"lsn": lsn, "epoch": epoch, "ts": ts, "data": data}, use_bin_type=True)
    if len(body) > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            f"checkpoint at lsn {lsn} is {len(body)} bytes; the journal takes at most "
            f"{MAX_RECORD_BYTES}. Checkpoint digests and handles, not bulk data."
        )
    return CHECKPOINT_FORMAT + _packb((body, _crc32(body)), use_bin_type=True)


def decode_checkpoint(value: bytes, session: str) -> dict[str, Any]:
    """Return {"lsn", "epoch", "ts", "data"} of a stored checkpoint, verifying its checksum."""
    if value[:1] != CHECKPOINT_FORMAT:
        raise CorruptRecord(session, None, f"checkpoint has unknown format byte {value[:1]!r}")
    try:
        body, crc = _unpackb(value[1:], raw=False)
    except Exception as exc:
        raise CorruptRecord(session, None, f"checkpoint is torn ({exc})") from exc
    if type(body) is not bytes or _crc32(body) != crc:
        raise CorruptRecord(session, None, "checkpoint checksum mismatch")
    try:
        ckpt = _unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:
        raise CorruptRecord(session, None, f"checkpoint is undecodable ({type(exc).__name__}: {exc})") from exc
    if (type(ckpt) is not dict or not {"lsn", "epoch", "ts", "data"} <= ckpt.keys() or type(ckpt["lsn"]) is not int
            or ckpt["lsn"] < 0 or type(ckpt["epoch"]) is not int or type(ckpt["ts"]) not in (int, float)
            or type(ckpt["data"]) is not dict):
        raise CorruptRecord(session, None, f"checkpoint is not {{lsn, epoch, ts, data}}: {_sketch(ckpt)}")
    return ckpt


def encode_ranges(ranges: list[tuple[int, int]]) -> bytes:
    """Encode the half-open lsn ranges a compaction removed."""
    return _packb([[lo, hi] for lo, hi in ranges])


def decode_ranges(value: bytes | None, session: str) -> list[tuple[int, int]]:
    """The ranges `encode_ranges` wrote; CorruptRecord if the note is not a list of [lo, hi)."""
    if not value:
        return []
    try:
        ranges = _unpackb(value)
    except Exception as exc:
        raise CorruptRecord(session, None, f"compaction note is undecodable ({type(exc).__name__}: {exc})") from exc
    if type(ranges) is not list or not all(
            type(r) is list and len(r) == 2 and type(r[0]) is int and type(r[1]) is int and 0 <= r[0] < r[1]
            for r in ranges):
        raise CorruptRecord(session, None, f"compaction note is not a list of lsn ranges: {_sketch(ranges)}")
    return [(lo, hi) for lo, hi in ranges]


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping or touching half-open ranges."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def covered(ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """True if every lsn in [lo, hi) lies inside one of the (merged) ranges."""
    for r_lo, r_hi in ranges:
        if r_lo <= lo < r_hi:
            if hi <= r_hi:
                return True
            lo = r_hi
    return lo >= hi
