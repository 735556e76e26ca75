"""Casts through host agents (REGENT_RELAY=1): every message to a proc goes through its host's
agent, and the answers come back the same way, gathered per host. The route changes, nothing
else: each call runs once, each sender's order holds, and a host agent SIGKILLed while casts
pass through it (its procs start a successor at its address) or a proc SIGKILLed mid-cast loses
and repeats no call."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regent import Actor, RestartPolicy, Session, SupervisionError, context, endpoint, wire
from regent.wire import Kind
from tests.runtime.rawpeer import RawPeer
from tests.support.agenthome import agent_record
from tests.support.loopback import CLUSTER, loopback_agents

HOLLOW = 8


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def incr(self) -> tuple[int, int, int]:
        self.n += 1
        return os.getpid(), context().incarnation, self.n

    @endpoint
    def seen(self) -> int:
        return self.n

    @endpoint
    async def hold(self, started: str) -> None:
        """Runs until its proc is killed: a call certain to be in flight at the kill."""
        Path(started).touch()
        await asyncio.sleep(3600)

    @endpoint
    def total_of(self, mesh: object) -> int:
        """A sync endpoint waiting on calls to actors of its own host."""
        return sum(n for _, _, n in mesh.incr.call().get(timeout=30).values())


@pytest.fixture
def relayed(own_home) -> Path:
    return own_home(REGENT_HIPCORE_BACKEND="cpu", REGENT_RELAY="1")


@pytest.fixture
def hollow_hosts(relayed, tmp_path: Path) -> Iterator[str]:
    """Two hollow agents of HOLLOW procs, registered in an SQLite store: its url."""
    url = f"sqlite://{tmp_path / 'journal.db'}"
    with loopback_agents(url, tmp_path, ttl_s=1.0) as add:
        add("a", "b", hollow=HOLLOW)
        yield url


def test_casts_and_their_answers_go_through_the_host_agents(hollow_hosts) -> None:
    with Session("relay-route", journal=hollow_hosts) as s:
        procs = s.host_mesh(hosts=2, cluster=CLUSTER).spawn_procs(per_host={"procs": HOLLOW})
        c = procs.spawn("c", Counter)
        assert [n for _, _, n in c.incr.call().get(timeout=30).values()] == [1] * 2 * HOLLOW
        c.incr.broadcast()
        futures = [c.slice(hosts=1, procs=3).incr.call_one() for _ in range(50)]  # pipelined: in order
        assert [f.get(timeout=30)[2] for f in futures] == list(range(3, 53))
        values = c.seen.call().get(timeout=30).values()
        assert values[HOLLOW + 3] == 52 and values.count(2) == 2 * HOLLOW - 1
        # An actor's sync endpoint casting to its own host's actors, through the same agent.
        d = procs.spawn("d", Counter)
        assert c.slice(hosts=0, procs=0).total_of.call_one(d.slice(hosts=0)).get(timeout=30) == HOLLOW
        # The controller holds a connection to each agent and to no proc: the one route.
        hosts = {p.host for p in s.runtime.procs.values()}
        assert len(hosts) == 2 and s.runtime.relaying == hosts
        assert not {p.address for p in s.runtime.procs.values()} & set(s.runtime.outbox.addresses())


def test_the_release_watermark_reaches_relayed_procs(hollow_hosts) -> None:
    """The watermark goes to each agent as one batch for its procs (Peer.try_queue), and every
    proc drops the results the journal holds."""
    with Session("relay-watermark", journal=hollow_hosts) as s:
        c = s.host_mesh(hosts=2, cluster=CLUSTER).spawn_procs(per_host={"procs": HOLLOW}).spawn("c", Counter)
        for _ in range(20):
            c.incr.call().get(timeout=30)
        s.now()
        peer = RawPeer()
        try:
            deadline = time.monotonic() + 15
            for n, proc in enumerate(c._procs):
                while True:
                    peer.send(proc.address, wire.encode(Kind.PING, {"rt": peer.address, "n": n}))
                    _, pong, _ = peer.recv()
                    if pong["cached"] <= 2:
                        break
                    assert time.monotonic() < deadline, f"{proc.id} still caches {pong['cached']} results"
                    time.sleep(0.1)
        finally:
            peer.close()


def _agent_pid(home: Path) -> int:
    return int(agent_record(home)["pid"])


def test_a_host_agent_sigkilled_mid_cast_loses_and_repeats_no_call(relayed) -> None:
    with Session("relay-agent-kill", journal="off") as s:
        c = s.spawn_procs(per_host={"procs": 3}).spawn("c", Counter)
        pids = [pid for pid, _, _ in c.incr.call().get(timeout=30).values()]
        assert s.runtime.relaying, "the local agent relays"
        dead = _agent_pid(relayed)
        futures = [c.incr.call() for _ in range(100)]  # casts queued through the agent
        os.kill(dead, signal.SIGKILL)
        futures += [c.incr.call() for _ in range(100)]  # and more while it is gone
        # Its procs start a successor at its address; what the dead one dropped is sent again
        # by the controller and runs once (a resent call may run after later ones: what was
        # lost with a broken link or a dead relay has no place in the arrival order).
        got = [f.get(timeout=60).values() for f in futures]
        for rank, pid in enumerate(pids):
            assert sorted(v[rank] for v in got) == [(pid, 0, n) for n in range(2, 202)], f"rank {rank}"
        assert _agent_pid(relayed) != dead
        assert c.seen.call().get(timeout=30).values() == [201] * 3


def test_a_proc_sigkilled_mid_cast_is_restarted_and_no_call_runs_twice(relayed, tmp_path: Path) -> None:
    with Session("relay-proc-kill", journal="off") as s:
        c = s.spawn_procs(per_host={"procs": 3}).spawn("c", Counter, restart=RestartPolicy(restart="permanent"))
        pids = [pid for pid, _, _ in c.incr.call().get(timeout=30).values()]
        started = tmp_path / "held"
        futures = {rank: [c.slice(procs=rank).incr.call_one() for _ in range(100)] for rank in (0, 2)}
        futures[1] = [c.slice(procs=1).incr.call_one() for _ in range(50)]
        held = c.slice(procs=1).hold.call_one(str(started))
        futures[1] += [c.slice(procs=1).incr.call_one() for _ in range(50)]
        # The calls before the held one ran on the first proc, in order.
        assert [f.get(timeout=60) for f in futures[1][:50]] == [(pids[1], 0, n) for n in range(2, 52)]
        deadline = time.monotonic() + 60
        while not started.exists():  # the kill lands on a call in flight, never by luck
            assert time.monotonic() < deadline, "the held call never started"
            time.sleep(0.02)
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(SupervisionError):
            held.get(timeout=60)
        for rank in (0, 2):  # its neighbours on the host: every call once, in order
            assert [f.get(timeout=60) for f in futures[rank]] == [(pids[rank], 0, n) for n in range(2, 102)]
        got = []
        for f in futures[1][50:]:
            try:
                got.append(f.get(timeout=60))
            except SupervisionError:  # queued behind the held call when its proc died
                pass
        # Those queued behind it ran on the restarted proc, counting from 1, or failed: none twice.
        assert all(p != pids[1] for p, _, _ in got) and [n for _, _, n in got] == list(range(1, 1 + len(got)))
