"""The liveness beacon: a standby evicts a leader whose process is gone, and only such a leader.

Real processes, real sockets, both stores. A killed leader is replaced long before its lease
would run out; a paused one, or one whose beacon merely drops a connection, keeps its lease.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from regent.journal import Journal, Leadership, LeadershipLost, open_journal
from regent.journal.backend import Incumbent
from tests.journal.leaders import campaign_in_thread, leader_process

# Long enough that a takeover within it can only be the beacon's doing.
LONG_TTL_S = 10.0
# A lease that runs out within a test's patience, for the cases that must wait for it.
SHORT_TTL_S = 3.0


def _takeover_after(
    journal_url: str, session: str, sig: signal.Signals, ttl_s: float
) -> tuple[float, int, Leadership]:
    """A leader process gets `sig` while a standby here waits: (seconds to lead, its epoch, lead)."""
    with (
        leader_process(journal_url, session, ttl_s=ttl_s) as victim,
        open_journal(journal_url) as journal,
    ):
        thread, result = campaign_in_thread(journal, session, "standby", timeout=ttl_s + 10)
        time.sleep(0.5)  # the standby is waiting, and watching the beacon
        assert not result, f"the standby led while the victim was alive: {result}"
        sent_at = victim.send(sig)
        thread.join(ttl_s + 12)
        assert "lead" in result, f"the standby did not take over: {result.get('error')!r}"
        standby: Leadership = result["lead"]
        assert standby.epoch > victim.epoch
        assert standby.next_lsn == 1, "the standby must see the victim's record"
        standby.close()
        return result["at"] - sent_at, victim.epoch, standby


def test_a_killed_leader_is_replaced_at_once_not_when_its_lease_runs_out(
    journal_url: str, session: str
):
    took, _, _ = _takeover_after(journal_url, session, signal.SIGKILL, LONG_TTL_S)
    assert took < 1.5, f"took {took:.2f}s: the standby waited for the {LONG_TTL_S:g}s lease"


@pytest.mark.slow
def test_a_paused_leader_is_not_evicted_its_lease_decides(journal_url: str, session: str):
    # SIGSTOP leaves the leader's sockets open: the standby's connection stays up and the
    # beacon proves nothing, so the standby must wait for the lease (at least 2/3 of its
    # ttl after the last renewal, which came at most ttl/3 before the pause).
    took, _, _ = _takeover_after(journal_url, session, signal.SIGSTOP, SHORT_TTL_S)
    assert took > SHORT_TTL_S / 2, f"a paused leader was evicted after {took:.2f}s"


@pytest.mark.slow
def test_with_the_beacon_off_a_killed_leader_is_replaced_when_its_lease_runs_out(
    journal_url: str, session: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("REGENT_BEACON", "0")  # for the leader process and this standby
    took, _, _ = _takeover_after(journal_url, session, signal.SIGKILL, SHORT_TTL_S)
    assert took > SHORT_TTL_S / 2, f"took {took:.2f}s with the beacon off: not the lease"


class _ClosingBeacon:
    """A live leader's beacon that closes each connection as soon as it accepts it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.listener.close()


@pytest.fixture
def closing_beacon() -> Iterator[_ClosingBeacon]:
    beacon = _ClosingBeacon()
    yield beacon
    beacon.close()


def test_a_live_leader_whose_beacon_drops_connections_is_not_evicted(
    journal: Journal, session: str, closing_beacon: _ClosingBeacon
):
    grant = journal.backend.try_acquire(
        session, "primary", LONG_TTL_S, beacon=closing_beacon.address
    )
    assert grant is not None
    with Leadership(journal.backend, grant) as primary:
        with pytest.raises(TimeoutError, match="'primary' holds it"):
            journal.campaign(session, "standby", timeout=2.0)
        # The standby saw its connection close and probed again, and the port answered.
        assert closing_beacon.accepted >= 2
        assert journal.backend.leader(session) == ("primary", primary.epoch)
        assert not primary.lost.is_set()
        primary.append([("call", {})])


def test_evict_ends_only_the_leadership_it_names(journal: Journal, session: str):
    backend = journal.backend
    old = journal.campaign(session, "x")
    stale = backend.incumbent(session)
    assert stale == Incumbent("x", old.epoch, old.beacon)
    old.resign()
    new = journal.campaign(session, "x")  # the same holder name, a newer epoch
    current = backend.incumbent(session)
    assert current is not None and current.epoch == new.epoch

    assert not backend.evict(session, stale)
    # The stored holder value alone (name and beacon) matches now; the epoch does not.
    assert not backend.evict(session, Incumbent("x", old.epoch, new.beacon))
    assert not backend.evict(session, Incumbent("y", new.epoch, new.beacon))
    assert not backend.evict(session, Incumbent("x", new.epoch, None))
    assert backend.incumbent(session) == current
    new.append([("call", {"i": 0})])

    # Evicting a live leader is safe: its writes are refused, and it learns it lost.
    assert backend.evict(session, current)
    assert backend.leader(session) is None
    with pytest.raises(LeadershipLost, match="'x' no longer leads"):
        new.append([("call", {"i": 1})])
    assert new.lost.wait(new.ttl_s + 2)
    new.close()
    assert [r.lsn for r in journal.read(session)] == [0]


def test_a_leader_serves_its_beacon_until_it_resigns(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    assert lead.holder == "a" and lead.beacon is not None
    assert lead.beacon.startswith("127.0.0.1:")
    assert journal.backend.incumbent(session) == Incumbent("a", lead.epoch, lead.beacon)
    host, port = lead.beacon.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2):
        pass
    lead.resign()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2).close()


def test_with_the_beacon_off_a_leader_publishes_none(
    journal: Journal, session: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("REGENT_BEACON", "0")
    with journal.campaign(session, "a") as lead:
        assert lead.beacon is None
        assert journal.backend.incumbent(session) == Incumbent("a", lead.epoch, None)


def test_a_holder_may_not_look_like_one_with_a_beacon(journal: Journal, session: str):
    with pytest.raises(ValueError, match="beacon="):
        journal.campaign(session, "a beacon=127.0.0.1:1")
