"""Cluster agents on one machine with the embedded store (SQLite): the same registration,
pick and loss semantics as across machines, without namespaces or root. A SIGSTOPped agent
stops renewing: its host is lost, and it comes back as a new incarnation on SIGCONT."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from regent import Actor, RestartPolicy, Session, SupervisionError, endpoint
from regent.chaos import host_processes, kill_host
from regent.journal import open_journal
from regent.journal.hosts import registered_hosts

TTL_S = 1.0


class Echo(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def loopback_cluster(own_home, tmp_path: Path) -> Iterator[tuple[str, dict[str, subprocess.Popen]]]:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    agents = {}
    for name in ("a", "b"):
        agents[name] = subprocess.Popen(
            [sys.executable, "-m", "regent.cli", "host", "--cluster", "loop", "--store", url, "--advertise",
             "127.0.0.1", "--name", name, "--ttl", str(TTL_S)],
            stdout=open(tmp_path / f"agent-{name}.log", "w"), stderr=subprocess.STDOUT)
    j = open_journal(url)
    deadline = time.monotonic() + 30
    while len(registered_hosts(j.backend, "loop")) < 2:
        assert time.monotonic() < deadline, "the agents did not register"
        time.sleep(0.05)
    j.close()
    try:
        yield url, agents
    finally:
        for p in agents.values():
            os.kill(p.pid, signal.SIGCONT)
            p.terminate()
            p.wait(10)


def test_the_hosts_listed_are_the_hosts_a_mesh_gets(loopback_cluster) -> None:
    url, agents = loopback_cluster
    ls = subprocess.run([sys.executable, "-m", "regent.cli", "hosts", "ls", "--cluster", "loop", "--store", url],
                        capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] for line in ls.splitlines()[1:]] == ["a", "b"]
    assert all("tcp://127.0.0.1:" in line for line in ls.splitlines()[1:])
    with Session("loop-mesh", journal=url) as s:
        procs = s.host_mesh(hosts=2, cluster="loop").spawn_procs(per_host={"procs": 2})
        assert procs.dims == {"hosts": 2, "procs": 2}
        assert len(set(procs.spawn("e", Echo).pid.call().get().values())) == 4


def test_an_agent_that_stops_renewing_loses_its_host_and_comes_back_as_a_new_incarnation(loopback_cluster) -> None:
    url, agents = loopback_cluster
    with Session("loop-loss", journal=url) as s:
        e = s.host_mesh(hosts=2, cluster="loop").spawn_procs(per_host={"procs": 1}).spawn("e", Echo)
        e.pid.call().get()
        os.kill(agents["a"].pid, signal.SIGSTOP)  # alive, but silent to the store
        t0 = time.monotonic()
        while True:
            try:
                e.slice(hosts=0).pid.call_one().get(timeout=5)
            except SupervisionError as err:
                assert "is lost" in str(err) or "unreachable" in str(err), err
                break
            assert time.monotonic() - t0 < 2 * TTL_S + 1, "a silent host was not taken for lost in time"
            time.sleep(0.05)
        assert time.monotonic() - t0 <= 2 * TTL_S + 0.5
        assert e.slice(hosts=1).pid.call_one().get(timeout=5) > 0  # the other host serves on
        os.kill(agents["a"].pid, signal.SIGCONT)
        j = open_journal(url)
        try:
            deadline = time.monotonic() + 10
            while True:
                events = [r.data["ev"] for r in j.read("loop-loss") if r.kind == "sup"]
                if "host_back" in events:
                    break
                assert time.monotonic() < deadline, f"the agent did not come back: {events}"
                time.sleep(0.1)
        finally:
            j.close()
        assert events.count("host_lost") == 1


def test_waiting_for_more_hosts_than_registered_says_how_many_and_how_to_start_more(loopback_cluster) -> None:
    url, _ = loopback_cluster
    os.environ["REGENT_CLUSTER"] = "loop"
    try:
        with Session("loop-short", journal=url) as s:
            with pytest.raises(TimeoutError) as info:
                s.host_mesh(hosts=3, timeout_s=0.5)
    finally:
        del os.environ["REGENT_CLUSTER"]
    text = str(info.value)
    assert "'loop' has 2 of the 3 hosts" in text and "a, b" in text and "regent host --cluster loop" in text


def test_a_host_killed_with_all_its_procs_is_lost_and_its_points_fail(loopback_cluster) -> None:
    """chaos's kill_host (the agent and every proc it started, at once), on a real agent: no
    proc of the host survives to start a new agent, and the controller takes the host for lost."""
    url, agents = loopback_cluster
    with Session("loop-host-kill", journal=url) as s:
        e = s.host_mesh(hosts=2, cluster="loop").spawn_procs(per_host={"procs": 2}).spawn("e", Echo)
        pids = e.pid.call().get().values()
        # The host's processes: its procs, and the zygote they were forked from (worker/zygote.py).
        zygotes = {psutil.Process(p).ppid() for p in pids[:2]}
        assert all("regent.worker.zygote" in psutil.Process(z).cmdline() for z in zygotes)
        assert host_processes(agents["a"].pid) == sorted([*pids[:2], *zygotes])
        event = kill_host(agents["a"].pid, target="host/a")
        assert event.detail["procs"] == sorted([*pids[:2], *zygotes])
        with pytest.raises(SupervisionError, match="lost|unreachable"):
            for _ in range(3):
                e.slice(hosts=0).pid.call().get(timeout=10)
        assert e.slice(hosts=1).pid.call().get().values() == pids[2:]
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                       for p in [agents["a"].pid, *pids[:2]])


def test_a_host_killed_whole_and_started_again_at_another_port_gets_its_points_back(loopback_cluster, tmp_path) -> None:
    """A lost host that registers again as a new incarnation at another address: its points'
    restarts go to the new agent, not to the dead one's address (found by the hosts chaos mix)."""
    url, agents = loopback_cluster
    with Session("loop-host-back", journal=url) as s:
        e = s.host_mesh(hosts=2, cluster="loop").spawn_procs(per_host={"procs": 1}).spawn(
            "e", Echo, restart=RestartPolicy(max_restarts=100, window_s=300))
        before = e.pid.call().get(timeout=30).values()
        kill_host(agents["a"].pid, target="host/a")
        j = open_journal(url)
        try:
            deadline = time.monotonic() + 10
            while not (lost := [r.data for r in j.read("loop-host-back") if r.kind == "sup"
                                and r.data["ev"] == "host_lost"]):
                assert time.monotonic() < deadline, "the killed host was not taken for lost"
                time.sleep(0.05)
            lost_addr = lost[0]["addr"]
        finally:
            j.close()
        # Its old port taken meanwhile: the new agent serves at another address.
        taken = socket.create_server(("127.0.0.1", int(lost_addr.rsplit(":", 1)[1])))
        agents["a"] = subprocess.Popen(
            [sys.executable, "-m", "regent.cli", "host", "--cluster", "loop", "--store", url, "--advertise",
             "127.0.0.1", "--name", "a", "--ttl", str(TTL_S)],
            stdout=open(tmp_path / "agent-a2.log", "w"), stderr=subprocess.STDOUT)
        deadline, pid = time.monotonic() + 45, None
        while pid is None:
            try:
                pid = e.slice(hosts=0).pid.call_one().get(timeout=10)
            except (SupervisionError, TimeoutError):
                assert time.monotonic() < deadline, "the host's point never came back on its new agent"
                time.sleep(0.2)
        assert pid != before[0] and psutil.Process(pid).ppid() == agents["a"].pid
        assert e.slice(hosts=1).pid.call_one().get(timeout=10) == before[1]
        taken.close()


def _agent(url: str, name: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "regent.cli", "host", "--cluster", "loop", "--store", url,
                           "--advertise", "127.0.0.1", "--name", name, "--ttl", str(TTL_S)],
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_second_agent_with_a_live_hosts_name_is_refused_and_the_live_one_keeps_its_host(
        loopback_cluster, tmp_path: Path) -> None:
    """Another machine (its own REGENT_HOME, the cluster's keys) or this one starting an agent
    under a name a live agent holds: refused at start, naming the holder; nothing flaps."""
    url, agents = loopback_cluster
    j = open_journal(url)
    try:
        before = {r.id: r for r in registered_hosts(j.backend, "loop")}["a"]
        elsewhere = tmp_path / "elsewhere"
        shutil.copytree(os.environ["REGENT_HOME"], elsewhere, ignore=shutil.ignore_patterns("host*"))
        r = _agent(url, "a", {**os.environ, "REGENT_HOME": str(elsewhere)})
        assert r.returncode == 2, r.stderr
        assert "host name 'a' of cluster 'loop' is registered by the agent at " + before.address in r.stderr
        assert f"pid {agents['a'].pid}" in r.stderr and "--name" in r.stderr
        r = _agent(url, "a")  # on this machine, beside the live agent
        assert r.returncode == 2 and "already runs on this machine" in r.stderr, r.stderr
        time.sleep(2 * TTL_S)
        after = {r.id: r for r in registered_hosts(j.backend, "loop")}["a"]
        assert (after.incarnation, after.address) == (before.incarnation, before.address)
        assert agents["a"].poll() is None
    finally:
        j.close()


def test_an_agent_off_loopback_without_cluster_keys_refuses_to_start_and_says_how(tmp_path: Path) -> None:
    home = tmp_path / "keyless"
    home.mkdir(mode=0o700)
    r = subprocess.run([sys.executable, "-m", "regent.cli", "host", "--cluster", "c", "--store",
                        f"sqlite://{tmp_path / 'j.db'}", "--advertise", "10.254.254.254", "--name", "x"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "REGENT_HOME": str(home)})
    assert r.returncode == 2
    assert "CURVE keys not found" in r.stderr and "regent keys init" in r.stderr


def test_an_advertised_hostname_is_refused() -> None:
    r = subprocess.run([sys.executable, "-m", "regent.cli", "host", "--cluster", "c", "--store", "sqlite:///tmp/x.db",
                        "--advertise", "node1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a literal IP address" in r.stderr
