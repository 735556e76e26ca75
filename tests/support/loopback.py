"""Hosts of a cluster on one machine without root: `regent host --cluster` agents on loopback,
registered in an SQLite store. A host dies as chaos's kill_host kills it (its agent and every
proc it started); `stop_then_kill` freezes it first, as a machine that hangs before it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from regent.chaos import host_processes, kill_host
from regent.journal import open_journal
from regent.journal.hosts import registered_hosts

CLUSTER = "loop"


def start_agent(url: str, name: str, logs: Path, ttl_s: float, hollow: int = 0,
                extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """An agent; `hollow`: a hollow host of that many procs at most (`regent host --hollow`);
    `extra`: more arguments of `regent host`."""
    return subprocess.Popen(
        [sys.executable, "-m", "regent.cli", "host", "--cluster", CLUSTER, "--store", url, "--advertise",
         "127.0.0.1", "--name", name, "--ttl", str(ttl_s), *(["--hollow", str(hollow)] if hollow else []), *extra],
        stdout=open(logs / f"agent-{name}.log", "a"), stderr=subprocess.STDOUT)


def wait_registered(url: str, names: list[str], timeout_s: float = 30.0) -> None:
    """Until every one of these agents is registered."""
    j = open_journal(url)
    try:
        deadline = time.monotonic() + timeout_s
        while not set(names) <= {h.id for h in registered_hosts(j.backend, CLUSTER)}:
            assert time.monotonic() < deadline, f"agents {names} did not register within {timeout_s:g} s"
            time.sleep(0.05)
    finally:
        j.close()


@contextmanager
def loopback_agents(url: str, logs: Path, ttl_s: float) -> Iterator[Callable[..., dict[str, subprocess.Popen]]]:
    """add("a", "b"): more agents, registered; every agent is gone (procs too) at exit.
    add("h", hollow=8): a hollow one."""
    agents: dict[str, subprocess.Popen] = {}

    def add(*names: str, hollow: int = 0, extra: tuple[str, ...] = ()) -> dict[str, subprocess.Popen]:
        for name in names:
            agents[name] = start_agent(url, name, logs, ttl_s, hollow, extra)
        wait_registered(url, list(names))
        return agents

    try:
        yield add
    finally:
        for p in agents.values():
            for pid in [p.pid, *host_processes(p.pid)]:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            p.terminate()
            p.wait(10)


def stop_then_kill(agent: subprocess.Popen, pause_s: float = 0.5) -> list[int]:
    """The host freezes (agent and procs SIGSTOPped), then dies (all SIGKILLed): its procs' pids."""
    procs = host_processes(agent.pid)
    for pid in [agent.pid, *procs]:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(pause_s)
    kill_host(agent.pid, target="host")
    return procs


def supervision_records(url: str, session: str) -> list[dict]:
    """The session's journaled supervision events (host_lost, host_replaced, restart, ...)."""
    j = open_journal(url)
    try:
        return [r.data for r in j.read(session) if r.kind == "sup"]
    finally:
        j.close()
