"""Hollow hosts (`regent host --hollow K`): an agent whose procs live inside its own process,
each the real proc (core, actors, inbox). To a controller they are hosts like any other:
spawn, calls, calls between actors, supervision, fencing and host loss; what needs a process
of its own (torch, GPUs, more than K procs) is refused with a reason."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regent import Actor, RestartPolicy, Session, SupervisionError, endpoint
from regent.journal import open_journal
from regent.journal.hosts import registered_hosts

TTL_S = 1.0
HOLLOW = 8


class Crash(BaseException):
    """Not an Exception: the actor fails (restarted by its policy) rather than answering it."""


class Echo(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def total_of(self, mesh: object) -> int:
        """A sync endpoint waiting on calls to actors of its own hollow host."""
        return sum(mesh.incr.call().get(timeout=30).values())

    @endpoint
    def fail(self) -> None:
        raise Crash("an abnormal exit")

    @endpoint
    def exit(self) -> None:
        raise SystemExit(3)  # ends a real proc: ends this hollow proc only


class NeedsTorch(Actor):
    def __init__(self) -> None:
        import torch  # noqa: F401

    @endpoint
    def ok(self) -> bool:
        return True


def _start(url: str, name: str, log: Path, hollow: int = HOLLOW) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "regent.cli", "host", "--cluster", "hollow", "--store", url, "--advertise",
         "127.0.0.1", "--name", name, "--ttl", str(TTL_S), "--hollow", str(hollow)],
        stdout=open(log, "w"), stderr=subprocess.STDOUT)


@pytest.fixture
def hollow_cluster(own_home, tmp_path: Path) -> Iterator[tuple[str, dict[str, subprocess.Popen]]]:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    agents = {name: _start(url, name, tmp_path / f"agent-{name}.log") for name in ("a", "b")}
    j = open_journal(url)
    deadline = time.monotonic() + 30
    while len(registered_hosts(j.backend, "hollow")) < 2:
        assert time.monotonic() < deadline, "the hollow agents did not register"
        time.sleep(0.05)
    assert {h.backend for h in registered_hosts(j.backend, "hollow")} == {"hollow"}
    j.close()
    try:
        yield url, agents
    finally:
        for p in agents.values():
            p.terminate()
            p.wait(10)


def test_a_mesh_of_hollow_procs_is_served_inside_the_agents(hollow_cluster) -> None:
    url, agents = hollow_cluster
    with Session("hollow-mesh", journal=url) as s:
        procs = s.host_mesh(hosts=2, cluster="hollow").spawn_procs(per_host={"procs": HOLLOW})
        e = procs.spawn("e", Echo)
        pids = e.pid.call().get(timeout=30).values()
        # Every proc is its agent's own process: 8 per host, none of them a child.
        assert sorted(set(pids)) == sorted(p.pid for p in agents.values())
        assert pids.count(agents["a"].pid) == pids.count(agents["b"].pid) == HOLLOW
        assert sum(e.incr.call().get().values()) == 2 * HOLLOW
        assert e.slice(hosts=1, procs=3).incr.call_one().get() == 2  # each actor its own state
        # An actor's sync endpoint waits on actors of its own hollow host: they go on serving.
        f = procs.spawn("f", Echo)
        assert e.slice(hosts=0, procs=0).total_of.call_one(f.slice(hosts=0)).get(timeout=30) == HOLLOW
        for p in agents.values():
            assert p.poll() is None


def test_an_actor_that_fails_on_a_hollow_proc_is_restarted_by_its_policy(hollow_cluster) -> None:
    url, _ = hollow_cluster
    with Session("hollow-restart", journal=url) as s:
        procs = s.host_mesh(hosts=2, cluster="hollow").spawn_procs(per_host={"procs": 2})
        e = procs.spawn("e", Echo, restart=RestartPolicy(max_restarts=3, window_s=60))
        e.incr.call().get()
        with pytest.raises(SupervisionError):
            e.slice(hosts=0, procs=1).fail.call_one().get(timeout=30)
        deadline = time.monotonic() + 30
        while True:  # the restarted actor starts from its __init__
            try:
                assert e.slice(hosts=0, procs=1).incr.call_one().get(timeout=10) == 1
                break
            except SupervisionError:
                assert time.monotonic() < deadline, "the actor was not restarted"
                time.sleep(0.1)
        assert e.slice(hosts=1, procs=1).incr.call_one().get() == 2


def test_a_hollow_proc_whose_actor_exits_dies_alone_and_its_agent_reports_it(hollow_cluster) -> None:
    url, agents = hollow_cluster
    with Session("hollow-exit", journal=url) as s:
        procs = s.host_mesh(hosts=2, cluster="hollow").spawn_procs(per_host={"procs": 2})
        e = procs.spawn("e", Echo)
        e.incr.call().get()
        with pytest.raises(SupervisionError, match="died|exited|dead|lost"):
            e.slice(hosts=0, procs=1).exit.call_one().get(timeout=30)
        assert e.slice(hosts=0, procs=0).incr.call_one().get() == 2  # its neighbour serves on
        assert agents["a"].poll() is None


def test_what_needs_a_real_process_is_refused_with_the_reason(hollow_cluster) -> None:
    url, _ = hollow_cluster
    with Session("hollow-refusals", journal=url) as s:
        hosts = s.host_mesh(hosts=2, cluster="hollow")
        with pytest.raises(Exception, match="at most 8 procs"):
            hosts.spawn_procs(per_host={"procs": HOLLOW + 1})
        with pytest.raises(Exception, match="no GPUs"):
            hosts.spawn_procs(per_host={"gpus": 1})
        procs = hosts.spawn_procs(per_host={"procs": 1})
        with pytest.raises(Exception, match="without torch"):
            procs.spawn("t", NeedsTorch)
        assert procs.spawn("e", Echo).incr.call().get().values() == [1, 1]


def test_a_killed_hollow_agent_is_a_lost_host(hollow_cluster) -> None:
    url, agents = hollow_cluster
    with Session("hollow-loss", journal=url) as s:
        e = s.host_mesh(hosts=2, cluster="hollow").spawn_procs(per_host={"procs": 4}).spawn("e", Echo)
        e.incr.call().get()
        os.kill(agents["a"].pid, signal.SIGKILL)
        agents["a"].wait(10)
        with pytest.raises(SupervisionError, match="lost|unreachable"):
            for _ in range(20):
                e.slice(hosts=0).incr.call().get(timeout=10)
                time.sleep(0.1)
        assert e.slice(hosts=1).incr.call().get().values() == [2] * 4


@pytest.mark.parametrize("route", ["direct", "relay"])
def test_a_mesh_wide_call_reaches_1024_hollow_procs(own_home, tmp_path: Path, route: str) -> None:
    """The smoke test of the control plane at a thousand procs (the curves are bench/
    bench_scale_hollow.py's): 8 hollow hosts of 128 procs, one actor each, a call() and a
    broadcast to all of them, each delivered once; straight to the procs, and through the
    host agents (REGENT_RELAY=1)."""
    own_home(REGENT_HIPCORE_BACKEND="cpu", REGENT_RELAY="1" if route == "relay" else "0")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    hosts, per_host = 8, 128
    agents = [_start(url, f"h{i}", tmp_path / f"agent-h{i}.log", hollow=per_host) for i in range(hosts)]
    try:
        j = open_journal(url)
        deadline = time.monotonic() + 120
        while len(registered_hosts(j.backend, "hollow")) < hosts:
            assert time.monotonic() < deadline, "the hollow agents did not register"
            time.sleep(0.1)
        j.close()
        with Session("hollow-1024", journal=url, lease_ttl_s=10) as s:
            procs = s.host_mesh(hosts=hosts, cluster="hollow").spawn_procs(per_host={"procs": per_host})
            e = procs.spawn("e", Echo)
            assert e.incr.call().get(timeout=120).values() == [1] * hosts * per_host
            e.incr.broadcast()
            assert e.incr.call().get(timeout=120).values() == [3] * hosts * per_host
            assert sorted(set(e.pid.call().get(timeout=120).values())) == sorted(a.pid for a in agents)
            assert s.runtime.relaying == ({p.host for p in s.runtime.procs.values()} if route == "relay" else set())
    finally:
        for a in agents:
            a.terminate()
        for a in agents:
            a.wait(30)


def test_a_fleet_is_many_hollow_hosts_each_its_own_process(own_home, tmp_path: Path) -> None:
    """`--fleet 3`: three agents forked from one command, each a host of its own (name,
    process, procs); one SIGKILLed is that host's loss alone; stopping the command stops and
    withdraws the rest."""
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    fleet = subprocess.Popen(
        [sys.executable, "-m", "regent.cli", "host", "--cluster", "hollow", "--store", url, "--advertise",
         "127.0.0.1", "--name", "f", "--ttl", str(TTL_S), "--hollow", "2", "--fleet", "3"],
        stdout=open(tmp_path / "fleet.log", "w"), stderr=subprocess.STDOUT)
    j = open_journal(url)
    try:
        deadline = time.monotonic() + 30
        while len(hosts := registered_hosts(j.backend, "hollow")) < 3:
            assert time.monotonic() < deadline, "the fleet's agents did not register"
            time.sleep(0.05)
        assert sorted(h.id for h in hosts) == ["f-0", "f-1", "f-2"]
        pid_of = {h.id: h.pid for h in hosts}
        assert len(set(pid_of.values())) == 3 and fleet.pid not in pid_of.values()
        with Session("hollow-fleet", journal=url) as s:
            e = s.host_mesh(hosts=3, cluster="hollow").spawn_procs(per_host={"procs": 2}).spawn("e", Echo)
            pids = e.pid.call().get(timeout=30).values()  # by point: host 0's two procs first
            assert sorted(set(pids)) == sorted(pid_of.values())
            assert pids[0] == pids[1] and pids[2] == pids[3] and pids[4] == pids[5]
            victim = pids[2]  # the host at point hosts=1
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(SupervisionError, match="lost|unreachable"):
                for _ in range(20):
                    e.slice(hosts=1).incr.call().get(timeout=10)
                    time.sleep(0.1)
            assert e.slice(hosts=0).incr.call().get().values() == [1, 1]
            assert e.slice(hosts=2).incr.call().get().values() == [1, 1]
            assert fleet.poll() is None
        fleet.terminate()
        assert fleet.wait(30) == 1  # one of its agents ended badly: the SIGKILLed one
        assert registered_hosts(j.backend, "hollow") == []
    finally:
        if fleet.poll() is None:
            fleet.kill()
        j.close()


def test_a_fleet_needs_hollow_agents_and_names_that_fit(own_home, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'journal.db'}"
    base = [sys.executable, "-m", "regent.cli", "host", "--cluster", "c", "--store", url, "--advertise", "127.0.0.1"]
    r = subprocess.run([*base, "--fleet", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "give --hollow K too" in r.stderr
    r = subprocess.run([*base, "--hollow", "1", "--fleet", "2", "--name", "n" * 99], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "shorter --name" in r.stderr
