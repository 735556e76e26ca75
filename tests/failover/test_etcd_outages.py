"""etcd trouble as a session sees it: unreachable at start, restarted mid-session."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from regent.controller import Session
from regent.controller.replay import expand
from regent.journal import JournalUnavailable, open_journal
from regent.worker import Actor, endpoint
from tests.support.etcd import MISSING_REASON, EtcdServer, etcd_available, free_port

pytestmark = pytest.mark.skipif(not etcd_available(), reason=MISSING_REASON)


class Adder(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def add(self, x: int) -> int:
        self.calls += 1
        return x + 1

    @endpoint
    def count(self) -> int:
        return self.calls


def test_unreachable_etcd_names_the_address_and_how_to_start_it():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(JournalUnavailable) as info:
        Session("nowhere", journal=f"etcd://127.0.0.1:{port}")
    text = str(info.value)
    assert f"127.0.0.1:{port}" in text
    assert "etcd --data-dir" in text or "start" in text
    assert time.monotonic() - t0 < 60


def test_a_session_rides_out_an_etcd_restart_without_losing_or_duplicating_records():
    with EtcdServer() as etcd:
        with Session("outage", journal=etcd.url, lease_ttl_s=5.0) as s:
            mesh = s.spawn_procs(per_host={"procs": 2}).spawn("adder", Adder)
            done = 0
            results = []

            def bounce() -> None:
                time.sleep(0.3)
                etcd.kill()
                time.sleep(0.7)
                etcd.start()

            t = threading.Thread(target=bounce)
            t.start()
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline or t.is_alive():
                results.append(mesh.add.call(done).get(timeout=30).values())
                s.now()  # a durable observation: must wait out the outage, not fail
                done += 1
            t.join()
            assert results == [[i + 1, i + 1] for i in range(done)]
            counts = mesh.count.call().get().values()
            assert counts == [done, done]
            name = s.name
        j = open_journal(etcd.url)
        try:
            assert j.verify(name).ok
            calls = collections.Counter()
            results_seen = collections.Counter()
            for rec in expand(j.read(name)):
                if rec.kind == "call":
                    calls[rec.data["s"]] += 1
                elif rec.kind == "result":
                    results_seen[(rec.data["s"], rec.data["pt"])] += 1
            assert calls and max(calls.values()) == 1, "a call record was written twice"
            assert max(results_seen.values()) == 1, "a result record was written twice"
            assert len(calls) == 3 + 2 * done + 1  # this_host and 2 spawns; call + now per step; count
        finally:
            j.close()
