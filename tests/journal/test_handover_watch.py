"""The primary's watch for a hand-over request (controller/upgrade.py HandoverWatch): on etcd
it looks when the store reports a change of the session's space, not fifty times a second; on
SQLite, which cannot report one, it looks every WATCH_INTERVAL_S. Either way a request made by
a standby standing by reaches `on_request` once."""

from __future__ import annotations

import threading
import time

import pytest

import regent.controller.upgrade as upgrade
from regent.journal import Journal
from regent.journal.standbys import StandbyPresence


def test_a_request_is_seen_once_and_an_idle_etcd_session_is_not_polled(
        journal: Journal, session: str, monkeypatch: pytest.MonkeyPatch) -> None:
    b = journal.backend
    watched = b.url.startswith("etcd")
    monkeypatch.setattr(upgrade, "WATCHED_LOOK_S", 30.0)  # only the store's notice can wake it in time
    looks = 0
    real = upgrade.handover_request

    def counted(*args: object) -> dict | None:
        nonlocal looks
        looks += 1
        return real(*args)

    monkeypatch.setattr(upgrade, "handover_request", counted)
    seen: list[dict] = []
    got = threading.Event()
    w = upgrade.HandoverWatch(b, session, 1, lambda r: (seen.append(r), got.set()))
    presence = StandbyPresence(b, session, "vm:7:new", {}, ttl_s=5.0)
    try:
        time.sleep(1.0)
        idle = looks
        if watched:
            assert idle <= 3, f"{idle} looks in a second of an unchanged session: polled, not watched"
        else:
            assert idle >= 10
        upgrade.request_handover(b, session, 1, "vm:7:new")
        assert got.wait(10), "the hand-over request was not seen"
        time.sleep(0.3)
        assert [r["by"] for r in seen] == ["vm:7:new"]
    finally:
        w.close()
        presence.stop()
