"""Leader election and fencing: one leader per session, epochs that grow, deposed writers refused."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from regent.journal import Journal, LeadershipLost, open_journal
from tests.journal.leaders import campaign_in_thread, leader_process


def test_a_standby_waits_until_the_leader_resigns_then_takes_over_at_once(
    journal: Journal, session: str
):
    primary = journal.campaign(session, "primary")
    waiting = threading.Event()
    thread, result = campaign_in_thread(journal, session, "standby", on_waiting=waiting.set)
    assert waiting.wait(5)
    time.sleep(0.3)
    assert "lead" not in result, "standby became leader while the primary still held the lease"

    resigned_at = time.monotonic()
    primary.resign()
    thread.join(5)
    standby = result["lead"]
    assert result["at"] - resigned_at < 0.5
    assert standby.holder == "standby" and standby.epoch > primary.epoch
    standby.close()


def test_the_keepalive_holds_leadership_well_beyond_the_ttl(journal: Journal, session: str):
    primary = journal.campaign(session, "primary", ttl_s=1.0)
    with pytest.raises(TimeoutError, match="'primary' holds it"):
        journal.campaign(session, "standby", timeout=3.0)
    assert not primary.lost.is_set()
    primary.append([("call", {})])
    primary.close()


def test_on_waiting_is_called_once_and_never_when_the_session_is_free(
    journal: Journal, session: str
):
    calls: list[int] = []
    first = journal.campaign(session, "a", on_waiting=lambda: calls.append(1))
    assert calls == []
    thread, result = campaign_in_thread(journal, session, "b", on_waiting=lambda: calls.append(2))
    time.sleep(0.5)
    first.resign()
    thread.join(5)
    assert calls == [2]
    result["lead"].close()


def test_epochs_only_grow_across_leaders(journal: Journal, session: str):
    epochs = []
    for holder in ["a", "b", "a", "c"]:
        lead = journal.campaign(session, holder)
        epochs.append(lead.epoch)
        lead.resign()
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)


def test_a_deposed_leader_cannot_append_and_learns_it_lost(journal: Journal, session: str):
    old = journal.campaign(session, "old", ttl_s=1.0)
    old.append([("call", {"i": 0})])
    reasons: list[str] = []
    old.on_lost(reasons.append)
    old.pause_keepalive()  # as if the process were SIGSTOPped: the lease runs out

    new = journal.campaign(session, "new", ttl_s=1.0, timeout=10)
    assert new.epoch > old.epoch
    with pytest.raises(LeadershipLost, match="'old' no longer leads"):
        old.append([("call", {"i": 1})])
    assert old.lost.is_set()
    assert len(reasons) == 1 and "'new' holds it" in reasons[0]
    with pytest.raises(LeadershipLost):
        old.checkpoint({"state": 1})

    new.append([("call", {"i": 1})])
    records = list(journal.read(session))
    assert [(r.lsn, r.epoch) for r in records] == [(0, old.epoch), (1, new.epoch)]
    old.close()
    new.close()


def test_a_deposed_leaders_checkpoint_is_refused(journal: Journal, session: str):
    old = journal.campaign(session, "old", ttl_s=1.0)
    old.pause_keepalive()
    new = journal.campaign(session, "new", ttl_s=1.0, timeout=10)
    new.checkpoint({"by": "new"})
    with pytest.raises(LeadershipLost):
        old.checkpoint({"by": "old"})
    assert journal.read_checkpoint(session)["data"] == {"by": "new"}
    old.close()
    new.close()


def test_a_leader_whose_lease_expires_notices_on_its_own(journal: Journal, session: str):
    lead = journal.campaign(session, "a", ttl_s=1.0)
    reasons: list[str] = []
    lead.on_lost(reasons.append)
    lead.pause_keepalive()
    time.sleep(lead.ttl_s + 1.0)
    lead.resume_keepalive()
    assert lead.lost.wait(lead.ttl_s + 2)
    deadline = time.monotonic() + 2
    while not reasons and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reasons and "lease" in reasons[0]
    with pytest.raises(LeadershipLost):
        lead.append([("call", {})])
    lead.close()


def test_a_killed_leader_is_replaced_within_its_ttl(
    journal_url: str, session: str, monkeypatch: pytest.MonkeyPatch
):
    # The lease alone: with the beacon on, the standby would not wait for it at all
    # (test_journal_beacon.py).
    monkeypatch.setenv("REGENT_BEACON", "0")
    with (
        leader_process(journal_url, session, ttl_s=1.0) as victim,
        open_journal(journal_url) as journal,
    ):
        ttl = victim.ttl_s
        thread, result = campaign_in_thread(journal, session, "standby", timeout=ttl + 10)
        time.sleep(0.3)
        assert "lead" not in result
        killed_at = victim.send(signal.SIGKILL)
        thread.join(ttl + 10)
        standby = result["lead"]
        assert result["at"] - killed_at < ttl + 1.5
        assert standby.epoch > victim.epoch
        assert standby.next_lsn == 1
        standby.close()
