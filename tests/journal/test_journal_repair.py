"""`regent journal repair`: a torn tail is dropped exactly, anything else is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from regent.controller import Session
from regent.controller.session import Handoff
from regent.journal import CorruptRecord, Journal, open_journal

_ROOT = Path(__file__).resolve().parents[2]


def _log_with_a_four_record_tail(journal: Journal, session: str):
    """lsn 0..9 one record per batch, then lsn 10..13 in one batch (the one to tear)."""
    lead = journal.campaign(session, "writer")
    for lsn in range(10):
        lead.append([("call", {"lsn": lsn, "pad": "A" * 40})])
    lead.append([("result", {"lsn": lsn, "pad": "B" * 40}) for lsn in range(10, 14)])
    return lead


def test_a_torn_tail_is_named_by_read_and_dropped_exactly_by_repair(
    journal: Journal, session: str, raw
):
    _log_with_a_four_record_tail(journal, session).close()
    value = raw.get(session, 10)
    raw.put(session, 10, value[: len(value) - 12])  # the last record loses its end

    with pytest.raises(CorruptRecord, match=f"`regent journal repair {session}`") as info:
        list(journal.read(session))
    assert info.value.lsn == 13 and "torn" in info.value.problem
    assert not journal.verify(session).ok

    dry = journal.repair(session, dry_run=True)
    assert dry.ok and [b.first_lsn for b in dry.tail] == [10]
    assert raw.batch_starts(session) == list(range(11))  # a dry run changes nothing
    text = "\n".join(dry.lines(dry_run=True))
    assert "would drop its torn tail, 1 batch(es)" in text
    assert f"lsn 10..13 (4 records), {len(value) - 12} bytes" in text
    assert "kinds 10:result, 11:result, 12:result" in text and "lsn ..9 stays" in text

    plan = journal.repair(session)
    assert plan.ok and plan.kept_last_lsn == 9
    (dropped,) = plan.tail
    assert (dropped.first_lsn, dropped.count, dropped.nbytes) == (10, 4, len(value) - 12)
    assert dropped.records == [(10, "result"), (11, "result"), (12, "result")]
    assert raw.batch_starts(session) == list(range(10))
    assert journal.verify(session).ok
    assert [r.lsn for r in journal.read(session)] == list(range(10))
    successor = journal.campaign(session, "successor")
    assert successor.next_lsn == 10
    successor.append([("call", {"again": True})])
    assert journal.verify(session).ok
    successor.close()
    assert journal.repair(session).lines() == [
        f"session {session!r}: no torn tail, nothing to drop"
    ]


def test_garbage_in_the_last_key_stops_a_new_leader_until_repair_drops_it(
    journal: Journal, session: str, raw
):
    _log_with_a_four_record_tail(journal, session).close()
    raw.put(session, 10, b"\xffnot a batch at all")

    # The header is unreadable: a new leader cannot even tell which lsn comes next.
    with pytest.raises(CorruptRecord, match=f"`regent journal repair {session}`"):
        journal.campaign(session, "standby", timeout=5)

    plan = journal.repair(session)
    (dropped,) = plan.tail
    assert (dropped.first_lsn, dropped.count, dropped.records) == (10, None, [])
    assert "unknown format byte" in dropped.problem
    assert "lsn 10.. (header unreadable: record count unknown), 19 bytes" in dropped.describe()
    lead = journal.campaign(session, "standby", timeout=5)
    assert lead.next_lsn == 10
    lead.close()


def test_several_damaged_batches_at_the_end_are_one_torn_tail(journal: Journal, session: str, raw):
    _log_with_a_four_record_tail(journal, session).close()
    raw.put(session, 9, b"\x01")
    raw.put(session, 10, b"\x02")
    plan = journal.repair(session)
    assert plan.ok and [b.first_lsn for b in plan.tail] == [9, 10]
    assert raw.batch_starts(session) == list(range(9))


def test_damage_in_the_middle_of_the_log_is_refused_and_nothing_is_dropped(
    journal: Journal, session: str, raw
):
    _log_with_a_four_record_tail(journal, session).close()
    value = bytearray(raw.get(session, 3))
    value[value.index(b"AAAA") + 2] ^= 0x01
    raw.put(session, 3, bytes(value))

    with pytest.raises(CorruptRecord, match="lsn 3: checksum mismatch") as info:
        list(journal.read(session))
    assert "journal repair" not in str(info.value) and "journal verify" in str(info.value)
    for dry_run in (True, False):
        plan = journal.repair(session, dry_run=dry_run)
        assert not plan.ok and plan.tail == []
        assert "lsn 4 reads fine after damaged batch(es) at lsn 3" in plan.refused
        assert "not a torn tail" in plan.refused
    assert raw.batch_starts(session) == list(range(11))


def test_a_torn_tail_after_a_gap_is_refused(journal: Journal, session: str, raw):
    _log_with_a_four_record_tail(journal, session).close()
    raw.delete(session, 5)
    raw.put(session, 10, b"\x01torn")
    plan = journal.repair(session)
    assert not plan.ok and "gap: lsn 5 missing" in plan.refused
    assert raw.batch_starts(session) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]


def test_a_torn_tail_a_checkpoint_covers_is_refused(journal: Journal, session: str, raw):
    lead = _log_with_a_four_record_tail(journal, session)
    lead.checkpoint({"state": 14})
    lead.close()
    raw.put(session, 10, b"\x01torn")
    plan = journal.repair(session)
    assert not plan.ok and "checkpoint at lsn 14 is ahead of the log" in plan.refused
    assert raw.batch_starts(session) == list(range(11))


def test_repair_is_refused_while_a_live_leader_holds_the_session(
    journal: Journal, session: str, raw
):
    lead = _log_with_a_four_record_tail(journal, session)
    raw.put(session, 10, b"\x01torn")
    plan = journal.repair(session)
    assert not plan.ok and "'writer' leads it" in plan.refused
    dry = journal.repair(session, dry_run=True)
    assert [b.first_lsn for b in dry.tail] == [10] and "'writer' leads it" in dry.refused
    assert raw.batch_starts(session) == list(range(11))
    assert lead.lost.is_set() is False
    lead.close()
    assert journal.repair(session).ok


def _regent(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    return subprocess.run([sys.executable, "-m", "regent.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_session_stopped_by_a_torn_tail_resumes_after_regent_journal_repair(
    journal_url: str, session: str, raw
):
    s = Session(session, journal=journal_url)
    values = [s.now() for _ in range(6)]
    s.close(error=Handoff("test hand-off"))  # the run stays open for a successor
    with open_journal(journal_url) as j:
        last = j.backend.last_batch(session)
    assert last is not None
    raw.put(session, last[0], last[1][: len(last[1]) - 5])

    with pytest.raises(CorruptRecord, match=f"`regent journal repair {session}`"):
        Session(session, journal=journal_url)

    verify = _regent("journal", "--journal", journal_url, "verify", session)
    assert verify.returncode == 1 and "torn record" in verify.stdout
    assert f"the log ends in a torn tail and is clean before it: `regent journal repair {session}" \
        in verify.stdout
    dry = _regent("journal", "--journal", journal_url, "repair", session, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"lsn {last[0]}" in dry.stdout and "would drop its torn tail" in dry.stdout
    done = _regent("journal", "--journal", journal_url, "repair", session)
    assert done.returncode == 0, done.stderr
    assert "dropped its torn tail, 1 batch(es)" in done.stdout
    assert _regent("journal", "--journal", journal_url, "verify", session).returncode == 0

    with Session(session, journal=journal_url) as s:
        assert s.replaying
        again = [s.now() for _ in range(6)]
    # Everything but the dropped value replays; the dropped one is taken anew.
    assert again[:5] == values[:5] and again[5] != values[5]


def test_the_cli_refuses_mid_log_damage_with_a_non_zero_exit(journal_url: str, session: str, raw):
    with open_journal(journal_url) as j:
        _log_with_a_four_record_tail(j, session).close()
    raw.put(session, 2, b"\x01torn")
    out = _regent("journal", "--journal", journal_url, "repair", session)
    assert out.returncode == 1
    assert "repair refused, nothing dropped" in out.stdout and "not a torn tail" in out.stdout
