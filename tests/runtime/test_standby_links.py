"""A standby's links (controller/_standby.py): while it waits, it links to the host agents and
procs the journal names as the primary writes them, pings each, and hands the links to the
Runtime it leads with. Wire-level workers (RawPeer) stand in for agents and procs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from regent import wire
from regent.controller._standby import StandbyLinks
from regent.journal import open_journal
from regent.wire import Kind
from tests.runtime.rawpeer import RawPeer

SESSION = "standing-by"


def pinged(peer: RawPeer, timeout: float = 10.0) -> dict:
    kind, meta, _ = peer.recv(timeout)
    assert kind is Kind.PING, (kind, meta)
    return meta


def nothing_for(peer: RawPeer, seconds: float) -> None:
    with pytest.raises(TimeoutError):
        peer.recv(seconds)


@pytest.fixture
def store(own_home, tmp_path: Path):
    own_home()
    journal = open_journal(f"sqlite://{tmp_path / 'journal.db'}")
    lead = journal.campaign(SESSION, "primary")
    yield journal, lead
    lead.close()
    journal.close()


def test_a_standby_links_to_every_worker_the_journal_names_and_hands_the_links_over(store) -> None:
    journal, lead = store
    host, procs, late, replaced = RawPeer(), [RawPeer(), RawPeer()], RawPeer(), RawPeer()
    links = None
    try:
        lead.append([("start", {"run": "r1", "ts": 0.0}),
                     ("call", {"s": 0, "k": "host_mesh", "v": {"cluster": "c", "hosts": [
                         {"id": "h", "addr": host.address, "inc": 1}, {"id": "bad", "addr": 17},
                         {"id": "worse", "addr": "nowhere"}]}}),
                     ("procs", {"s": 1, "procs": [{"id": f"p{k}", "idx": k, "addr": p.address, "pid": 1}
                                                  for k, p in enumerate([*procs, replaced])]})])
        links = StandbyLinks(open_journal(journal.url), SESSION, "127.0.0.1")
        for peer in (host, *procs, replaced):
            assert pinged(peer)["rt"] == links.reply_address
        # The worker answers to the standby's inbox: its link back is up before any takeover.
        procs[0].send(links.reply_address, wire.encode(Kind.PONG, {"n": 0, "id": "p0"}))
        # What the primary journals later is linked to within a poll, and a proc replaced is let go.
        lead.append([("procs", {"s": 2, "procs": [{"id": "p9", "idx": 0, "addr": late.address, "pid": 1}]}),
                     ("sup", {"ev": "proc_replaced", "old": "p2", "new": "p7"})])
        assert pinged(late)["rt"] == links.reply_address
        deadline = time.monotonic() + 10
        while replaced.address in links.transport.outbox.addresses() and time.monotonic() < deadline:
            time.sleep(0.05)
        taken = links.take()
        assert taken is not None
        assert sorted(taken.outbox.addresses()) == sorted(p.address for p in (host, *procs, late))
        assert sorted(peer.address for _, peer in taken.monitors) == sorted(taken.outbox.addresses())
        nothing_for(procs[1], 0.7)  # each worker was pinged once: a poll sends nothing again
        taken.close()
    finally:
        if links is not None:
            links.journal.close()
        for peer in (host, *procs, late, replaced):
            peer.close()


def test_a_new_run_in_the_journal_lets_the_previous_runs_workers_go(store) -> None:
    journal, lead = store
    old, new = RawPeer(), RawPeer()
    try:
        lead.append([("start", {"run": "r1", "ts": 0.0}), ("call", {"s": 0, "k": "this_host", "v": old.address})])
        links = StandbyLinks(open_journal(journal.url), SESSION, "127.0.0.1")
        pinged(old)
        lead.append([("start", {"run": "r2", "ts": 1.0}), ("call", {"s": 0, "k": "this_host", "v": new.address})])
        pinged(new)
        taken = links.take()
        assert taken is not None and taken.outbox.addresses() == [new.address]
        taken.close()
        links.journal.close()
    finally:
        old.close()
        new.close()


def test_a_standby_that_never_leads_closes_its_links(store) -> None:
    journal, lead = store
    worker = RawPeer()
    try:
        lead.append([("start", {"run": "r1", "ts": 0.0}), ("call", {"s": 0, "k": "this_host", "v": worker.address})])
        links = StandbyLinks(open_journal(journal.url), SESSION, "127.0.0.1")
        pinged(worker)
        links.close()
        assert links.transport.ctx.closed
        links.journal.close()
    finally:
        worker.close()


def test_links_open_a_bounded_number_a_poll_and_a_bad_address_does_not_hold_the_rest_back(
        store, monkeypatch) -> None:
    from regent.controller import _standby

    monkeypatch.setattr(_standby, "LINKS_PER_POLL", 1)
    journal, lead = store
    host, proc = RawPeer(), RawPeer()
    try:
        lead.append([("start", {"run": "r1", "ts": 0.0}),
                     ("call", {"s": 0, "k": "host_mesh", "v": {"hosts": [{"addr": "nowhere"}, {"addr": host.address}]}}),
                     ("procs", {"s": 1, "procs": [{"id": "p0", "idx": 0, "addr": proc.address, "pid": 1}]})])
        links = StandbyLinks(open_journal(journal.url), SESSION, "127.0.0.1")
        time.sleep(0.2)
        assert len(links.transport.outbox.addresses()) <= 1  # the first poll: one address looked at
        pinged(host)
        pinged(proc)  # a poll after the agent's
        taken = links.take()
        assert taken is not None and sorted(taken.outbox.addresses()) == sorted([host.address, proc.address])
        taken.close()
        links.journal.close()
    finally:
        host.close()
        proc.close()


def test_the_runtime_that_leads_sends_over_the_standbys_links_and_lets_go_of_the_gone(store) -> None:
    from regent.controller._runtime import Runtime
    from regent.controller.core import ControllerCore

    journal, lead = store
    live, gone = RawPeer(), RawPeer()
    runtime = None
    try:
        lead.append([("start", {"run": "r1", "ts": 0.0}),
                     ("procs", {"s": 0, "procs": [{"id": "p0", "idx": 0, "addr": live.address, "pid": 1},
                                                  {"id": "p1", "idx": 1, "addr": gone.address, "pid": 1}]})])
        links = StandbyLinks(open_journal(journal.url), SESSION, "127.0.0.1")
        pinged(live)
        pinged(gone)
        taken = links.take()
        links.journal.close()
        runtime = Runtime("s-standby", 2, ControllerCore("s-standby"), transport=taken)
        assert runtime.reply_address == links.reply_address  # the address the workers linked back to
        with runtime.drive:
            assert runtime.let_go({live.address}) == 1
        assert runtime.outbox.addresses() == [live.address]
        assert [peer.address for _, peer in runtime._monitors if peer is not None] == [live.address]
        runtime.outbox.peer(live.address).send(wire.encode(Kind.PING, {"rt": runtime.reply_address, "n": 5}))
        assert pinged(live)["n"] == 5  # over the link the standby made: the same socket
    finally:
        if runtime is not None:
            runtime.close()
        live.close()
        gone.close()


def test_a_reader_stuck_in_the_store_does_not_hold_the_takeover_and_closes_its_links_itself(own_home) -> None:
    import threading

    from regent.controller import _standby

    own_home()

    class StuckJournal:
        def __init__(self) -> None:
            self.entered, self.release = threading.Event(), threading.Event()

        def read(self, name: str, start: int):
            self.entered.set()
            self.release.wait(30)
            return iter(())

    journal = StuckJournal()
    links = StandbyLinks(journal, SESSION, "127.0.0.1")
    assert journal.entered.wait(10)
    started = time.monotonic()
    assert links.take() is None  # the takeover opens its own links
    assert time.monotonic() - started < _standby.JOIN_S + 1.0
    assert not links.transport.ctx.closed
    journal.release.set()
    deadline = time.monotonic() + 10
    while not links.transport.ctx.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert links.transport.ctx.closed
