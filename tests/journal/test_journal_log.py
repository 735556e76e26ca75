"""Appending and reading a session's log, on both backends."""

from __future__ import annotations

import pytest

from regent.journal import (
    MAX_RECORD_BYTES,
    GroupCommitWriter,
    Journal,
    JournalError,
    RecordTooLarge,
    open_journal,
)
from regent.journal.batching import TXN_MAX_BYTES, TXN_MAX_VALUES, pack
from regent.journal.codec import encode_record


def test_append_then_read_returns_the_records_with_contiguous_lsns(journal: Journal, session: str):
    lead = journal.campaign(session, "primary")
    assert lead.next_lsn == 0
    assert (
        lead.append([("spawn", {"n": 4}), ("call", {"blob": b"\x00\xff", "args": [1, 2.5]})]) == 1
    )
    assert lead.append([("result", {"value": None, "ok": True})]) == 2
    assert lead.next_lsn == 3

    records = list(journal.read(session))
    assert [r.lsn for r in records] == [0, 1, 2]
    assert [r.kind for r in records] == ["spawn", "call", "result"]
    assert records[1].data == {"blob": b"\x00\xff", "args": [1, 2.5]}
    assert records[2].data == {"value": None, "ok": True}
    assert {r.epoch for r in records} == {lead.epoch}
    assert all(r.ts > 0 for r in records)
    assert [r.lsn for r in journal.read(session, start_lsn=2)] == [2]
    lead.close()


def test_nested_values_round_trip_as_msgpack_gives_them_back(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    data = {
        "nested": {"list": [1, [2, {"deep": b"\x01"}]], "none": None, "neg": -(2**63)},
        "int_keys": {1: "one", 2: "two"},
        "float": 1e-300,
        "unicode": "caf\u00e9 \u2603",
    }
    lead.append([("result", data)])
    assert next(journal.read(session)).data == data
    lead.close()


def test_a_new_leader_continues_at_the_lsn_after_the_last_record(journal: Journal, session: str):
    first = journal.campaign(session, "a")
    first.append([("call", {"i": i}) for i in range(5)])
    first.resign()

    second = journal.campaign(session, "b")
    assert second.next_lsn == 5
    assert second.epoch > first.epoch
    second.append([("call", {"i": 5})])
    assert [r.lsn for r in journal.read(session)] == list(range(6))
    assert [r.epoch for r in journal.read(session)] == [first.epoch] * 5 + [second.epoch]
    second.close()


def test_read_starting_inside_a_batch_skips_the_earlier_records(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    with GroupCommitWriter(lead, max_delay_s=0.05) as writer:
        for i in range(100):
            writer.submit("call", {"i": i})
        writer.flush()
    assert [r.data["i"] for r in journal.read(session, start_lsn=37)] == list(range(37, 100))
    lead.close()


def test_a_record_over_the_size_limit_is_rejected_and_nothing_is_written(
    journal: Journal, session: str
):
    lead = journal.campaign(session, "a")
    with pytest.raises(RecordTooLarge, match="keep large values out of the journal|Keep large"):
        lead.append([("result", {"value": b"x" * (MAX_RECORD_BYTES + 1)})])
    assert isinstance(RecordTooLarge("x"), ValueError)
    assert lead.next_lsn == 0
    assert list(journal.read(session)) == []
    lead.close()


def test_a_record_just_under_the_limit_is_stored(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    lead.append([("result", {"value": b"y" * (MAX_RECORD_BYTES - 100)})])
    (record,) = journal.read(session)
    assert len(record.data["value"]) == MAX_RECORD_BYTES - 100
    lead.close()


def test_data_msgpack_cannot_encode_is_rejected_with_the_allowed_types(
    journal: Journal, session: str
):
    lead = journal.campaign(session, "a")
    with pytest.raises(TypeError, match="str, int, float, bool, None, bytes"):
        lead.append([("call", {"obj": object()})])
    assert lead.next_lsn == 0
    lead.close()


def test_many_large_records_are_spread_over_values_and_txns_within_etcd_limits(
    journal: Journal, session: str, raw
):
    # 12 MiB in one append: etcd itself refuses any request over 1.5 MiB or 128 operations,
    # so this only passes if the journal splits the write.
    lead = journal.campaign(session, "a")
    records = [("result", {"i": i, "value": bytes([i % 251]) * 3000}) for i in range(4000)]
    assert lead.append(records) == 3999
    read = list(journal.read(session))
    assert [r.lsn for r in read] == list(range(4000))
    assert all(r.data["value"] == bytes([r.lsn % 251]) * 3000 for r in read)
    starts = raw.batch_starts(session)
    assert len(starts) > 8
    assert all(len(raw.get(session, s)) < 1_500_000 for s in starts)
    assert journal.verify(session).ok
    lead.close()


def test_pack_keeps_every_txn_under_the_op_and_byte_limits():
    frames = [encode_record(i, 1, "call", {"v": b"z" * (i % 7000)}, 0.0) for i in range(5000)]
    frames += [encode_record(5000 + i, 1, "call", {"i": i}, 0.0) for i in range(50_000)]
    txns = pack(frames, 0)
    lsn = 0
    for txn in txns:
        assert len(txn) <= TXN_MAX_VALUES < 128
        assert sum(len(b.value) for b in txn) <= max(TXN_MAX_BYTES, len(txn[0].value))
        for batch in txn:
            assert batch.first_lsn == lsn
            lsn += batch.count
    assert lsn == len(frames)


def test_a_retried_write_of_the_same_batch_succeeds_but_other_content_is_refused(
    journal: Journal, session: str
):
    # The idempotence that lets an append be retried after etcd restarts mid-request.
    lead = journal.campaign(session, "a")
    frames = [encode_record(0, lead.epoch, "call", {"i": 0}, 1.0)]
    (txn,) = pack(frames, 0)
    grant = lead._grant
    journal.backend.put_batches(grant, txn)
    journal.backend.put_batches(grant, txn)
    other = pack([encode_record(0, lead.epoch, "call", {"i": 1}, 1.0)], 0)[0]
    with pytest.raises(JournalError, match="already written with other content"):
        journal.backend.put_batches(grant, other)
    assert [r.data for r in journal.read(session)] == [{"i": 0}]
    lead.close()


def test_sessions_lists_counts_leader_and_whether_the_session_ended(journal: Journal, session: str):
    lead = journal.campaign(session, "primary")
    lead.append([("call", {"i": i}) for i in range(3)])
    info = {s.name: s for s in journal.sessions()}[session]
    assert (info.records, info.first_lsn, info.last_lsn) == (3, 0, 2)
    assert (info.leader, info.epoch, info.ended) == ("primary", lead.epoch, False)
    assert info.last_write is not None

    lead.append([("session_end", {})])
    lead.resign()
    info = {s.name: s for s in journal.sessions()}[session]
    assert info.ended and info.leader is None and info.records == 4

    journal.delete_session(session)
    assert session not in {s.name for s in journal.sessions()}


def test_the_default_journal_lives_under_regent_home(tmp_path, monkeypatch):
    monkeypatch.setenv("REGENT_HOME", str(tmp_path / "home"))
    with open_journal(None) as j:
        assert j.url == f"sqlite://{tmp_path / 'home' / 'journal.db'}"
    assert (tmp_path / "home" / "journal.db").exists()


def test_bad_urls_and_session_names_are_refused_with_the_expected_form(tmp_path):
    with pytest.raises(ValueError, match="etcd://host:port"):
        open_journal("redis://localhost")
    with pytest.raises(ValueError, match="absolute path"):
        open_journal("sqlite://relative.db")
    with open_journal(f"sqlite://{tmp_path / 'j.db'}") as j, pytest.raises(ValueError, match="'/'"):
        j.campaign("a/b", "x")
