"""verify, read-side checksums, checkpoints and compaction: defects planted straight into storage."""

from __future__ import annotations

import zlib

import msgpack
import pytest

from regent.journal import CorruptRecord, Journal
from regent.journal.codec import (
    MAX_BATCH_BYTES,
    ZLIB_BATCH_FORMAT,
    decode_batch,
    encode_batch,
    encode_record,
)


def _write_one_per_batch(journal: Journal, session: str, holder: str, lsns: range):
    lead = journal.campaign(session, holder)
    for lsn in lsns:
        assert lead.append([("call", {"lsn": lsn, "payload": "A" * 40})]) == lsn
    return lead


def test_a_clean_log_verifies_ok(journal: Journal, session: str):
    lead = _write_one_per_batch(journal, session, "a", range(5))
    report = journal.verify(session)
    assert report.ok, report.problems
    assert (report.records, report.first_lsn, report.last_lsn) == (5, 0, 4)
    assert report.epochs == [lead.epoch]
    lead.close()


def test_verify_and_read_catch_a_flipped_byte(journal: Journal, session: str, raw):
    lead = _write_one_per_batch(journal, session, "a", range(5))
    value = bytearray(raw.get(session, 3))
    at = value.index(b"AAAA")
    value[at + 2] ^= 0x01
    raw.put(session, 3, bytes(value))

    report = journal.verify(session)
    assert not report.ok
    assert report.problems == ["lsn 3: checksum mismatch"]
    with pytest.raises(CorruptRecord, match="lsn 3: checksum mismatch") as info:
        list(journal.read(session))
    assert info.value.session == session and info.value.lsn == 3
    assert session in str(info.value)
    lead.close()


def test_verify_and_read_catch_a_missing_lsn(journal: Journal, session: str, raw):
    lead = _write_one_per_batch(journal, session, "a", range(6))
    raw.delete(session, 2)
    raw.delete(session, 3)

    report = journal.verify(session)
    assert report.problems == ["gap: lsn 2..3 missing"]
    with pytest.raises(CorruptRecord, match="gap: lsn 2..3 missing"):
        list(journal.read(session))
    lead.close()


def test_verify_catches_a_write_from_a_deposed_epoch(journal: Journal, session: str, raw):
    old = _write_one_per_batch(journal, session, "old", range(3))
    old.resign()
    new = _write_one_per_batch(journal, session, "new", range(3, 5))
    # What a deposed leader's write would look like had fencing failed.
    raw.put(session, 5, encode_batch([encode_record(5, old.epoch, "call", {}, 0.0)]))

    report = journal.verify(session)
    assert report.problems == [
        f"lsn 5 written by epoch {old.epoch} after epoch {new.epoch} (deposed leader)"
    ]
    assert report.epochs == [old.epoch, new.epoch]
    new.close()


def test_verify_catches_a_torn_batch(journal: Journal, session: str, raw):
    lead = journal.campaign(session, "a")
    lead.append([("call", {"i": i}) for i in range(4)])
    value = raw.get(session, 0)
    raw.put(session, 0, value[: len(value) - 12])
    report = journal.verify(session)
    assert any("torn record" in p for p in report.problems), report.problems
    with pytest.raises(CorruptRecord):
        list(journal.read(session))
    lead.close()


def _append_a_large_batch(journal: Journal, session: str) -> tuple:
    lead = journal.campaign(session, "a")
    records = [("call", {"i": i, "digest": bytes(16), "actor": "trainer", "method": "step"})
               for i in range(400)]
    lead.append(records)
    return lead, records


def test_a_large_batch_is_stored_compressed_and_reads_back_record_by_record(
    journal: Journal, session: str, raw
):
    lead, records = _append_a_large_batch(journal, session)
    value = raw.get(session, 0)
    framed = sum(len(encode_record(i, lead.epoch, k, d, 0.0)) for i, (k, d) in enumerate(records))
    assert value[:1] == ZLIB_BATCH_FORMAT and len(value) * 5 < framed
    assert [(r.lsn, r.kind, r.data) for r in journal.read(session)] == [
        (i, k, d) for i, (k, d) in enumerate(records)]
    assert journal.verify(session).ok
    lead.close()


def test_verify_and_read_name_a_compressed_batch_that_will_not_inflate(
    journal: Journal, session: str, raw
):
    lead, records = _append_a_large_batch(journal, session)
    value = bytearray(raw.get(session, 0))
    value[len(value) // 2] ^= 0x10
    raw.put(session, 0, bytes(value))

    report = journal.verify(session)
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith(
        f"lsn 0: compressed batch of {len(records)} records (lsn 0..{len(records) - 1}) is damaged")
    assert report.records == len(records)  # its header still says which lsns it held: no gap
    with pytest.raises(CorruptRecord, match="lsn 0: compressed batch .* is damaged") as info:
        list(journal.read(session))
    assert info.value.lsn == 0
    lead.close()


def test_a_compressed_batch_claiming_an_absurd_size_is_refused_before_it_is_inflated():
    body = b"".join(encode_record(i, 1, "call", {"pad": "x" * 64}, 0.0) for i in range(80))
    for size in (-1, 0, MAX_BATCH_BYTES + 1, "big", len(body) - 1):
        value = ZLIB_BATCH_FORMAT + msgpack.packb(80) + msgpack.packb(size) + zlib.compress(body, 1)
        with pytest.raises(CorruptRecord, match="lsn 9: compressed batch of 80 records"):
            decode_batch(value, "s", 9)
    good = ZLIB_BATCH_FORMAT + msgpack.packb(80) + msgpack.packb(len(body)) + zlib.compress(body, 1)
    assert [r.lsn for r in decode_batch(good, "s", 0)] == list(range(80))


def test_checkpoint_records_its_lsn_and_survives_a_new_leader(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    assert journal.read_checkpoint(session) is None
    lead.append([("call", {"i": i}) for i in range(10)])
    lead.checkpoint({"actors": {"counter": 7}, "blob": b"\x01\x02"})
    lead.resign()

    ckpt = journal.read_checkpoint(session)
    assert ckpt["lsn"] == 10 and ckpt["epoch"] == lead.epoch
    assert ckpt["data"] == {"actors": {"counter": 7}, "blob": b"\x01\x02"}
    successor = journal.campaign(session, "b")
    with pytest.raises(ValueError, match="not yet appended"):
        successor.checkpoint({}, lsn=11)
    successor.close()


def test_compaction_keeps_the_prologue_and_the_tail_and_still_verifies(
    journal: Journal, session: str
):
    lead = _write_one_per_batch(journal, session, "a", range(4))  # prologue: lsn 0..3
    lead.append([("call", {"i": i}) for i in range(4, 200)])
    lead.checkpoint({"state": "at 150"}, lsn=150)
    lead.append([("call", {"i": i}) for i in range(200, 210)])

    # Only whole batches go: the batch 4..199 straddles the checkpoint and stays.
    assert journal.compact(session, keep_before_lsn=4) == 0
    lead.checkpoint({"state": "at 200"}, lsn=200)
    assert journal.compact(session, keep_before_lsn=4) == 196

    report = journal.verify(session)
    assert report.ok, report.problems
    assert report.compacted == [(4, 200)] and report.checkpoint_lsn == 200
    assert [r.lsn for r in journal.read(session)] == [0, 1, 2, 3, *range(200, 210)]
    assert [r.lsn for r in journal.read(session, start_lsn=200)] == list(range(200, 210))
    info = {s.name: s for s in journal.sessions()}[session]
    assert info.records == 14 and info.checkpoint_lsn == 200
    lead.close()


def test_a_new_leader_after_compacting_everything_continues_after_the_checkpoint(
    journal: Journal, session: str
):
    lead = journal.campaign(session, "a")
    lead.append([("call", {"i": i}) for i in range(20)])
    lead.checkpoint({"done": 20})
    assert journal.compact(session) == 20
    lead.resign()
    successor = journal.campaign(session, "b")
    assert successor.next_lsn == 20
    successor.append([("call", {"i": 20})])
    assert journal.verify(session).ok
    assert [r.lsn for r in journal.read(session)] == [20]
    successor.close()


def test_a_gap_inside_the_compacted_range_is_not_reported_but_one_outside_is(
    journal: Journal, session: str, raw
):
    lead = _write_one_per_batch(journal, session, "a", range(8))
    lead.checkpoint({}, lsn=4)
    assert journal.compact(session, keep_before_lsn=1) == 3
    assert journal.verify(session).ok
    raw.delete(session, 6)
    assert journal.verify(session).problems == ["gap: lsn 6 missing"]
    lead.close()
