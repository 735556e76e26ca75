"""Standbys' records in the store (journal/standbys.py): listed while they wait, gone when they
stop or their lease runs out, and a record of the wrong shape is skipped, not trusted."""

from __future__ import annotations

import time

from regent.journal import open_journal
from regent.journal.standbys import StandbyPresence, standbys


def _until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_standby_is_listed_while_it_waits_and_not_after(tmp_path) -> None:
    with open_journal(f"sqlite://{tmp_path / 'j.db'}") as j:
        presence = StandbyPresence(j.backend, "s", "vm:42:abc", {"metrics": "http://127.0.0.1:9/metrics"}, ttl_s=1.0)
        _until(lambda: standbys(j.backend, "s") != [])
        [found] = standbys(j.backend, "s")
        assert found["holder"] == "vm:42:abc" and found["metrics"] == "http://127.0.0.1:9/metrics"
        time.sleep(1.5)  # renewed past its TTL
        assert len(standbys(j.backend, "s")) == 1 and standbys(j.backend, "other") == []
        presence.stop()
        _until(lambda: standbys(j.backend, "s") == [])


def test_a_malformed_standby_record_is_skipped(tmp_path) -> None:
    with open_journal(f"sqlite://{tmp_path / 'j.db'}") as j:
        j.backend.join_cluster("session:s", "vm:1:a", b"\xff not json", 5.0)
        j.backend.join_cluster("session:s", "vm:2:b", b'{"holder": "someone else"}', 5.0)
        j.backend.join_cluster("session:s", "vm:3:c", b'{"holder": "vm:3:c", "since": "soon", "metrics": 7}', 5.0)
        assert standbys(j.backend, "s") == [{"holder": "vm:3:c", "since": None, "metrics": None}]
