"""A host agent of a test's own REGENT_HOME, driven at the wire level: its record, its
successor after a kill, the processes it runs, and host requests as a controller makes them."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from regent import wire
from regent.wire import Kind
from regent.worker.procinfo import running
from tests.runtime.rawpeer import RawPeer

STOP_WAIT_S = 6.0  # an agent stopping takes up to its 3 s grace per batch of procs


def agent_record(home: Path) -> dict:
    """The agent's host.json: its pid and address."""
    return json.loads((home / "host.json").read_text())


def wait_for(pred, timeout: float, what: str):
    """pred()'s first true value, polled; fails saying `what` did not happen."""
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.05)
    return got


def successor(home: Path, dead: dict, timeout: float = 10.0) -> dict:
    """The agent that replaced `dead`, once it runs."""
    def new() -> dict | None:
        try:
            info = agent_record(home)
        except (OSError, ValueError):
            return None
        return info if info["pid"] != dead["pid"] and running(info["pid"]) else None

    return wait_for(new, timeout, "a new host agent started")


def workers_of(home: Path) -> list[int]:
    """Host agents and procs running with this REGENT_HOME."""
    found = []
    for p in psutil.process_iter(["cmdline", "environ"], ad_value=None):
        argv, env = p.info["cmdline"] or [], p.info["environ"] or {}
        if {"regent.worker.host", "regent.worker.proc"} & set(argv) and env.get("REGENT_HOME") == str(home) \
                and running(p.pid):
            found.append(p.pid)
    return found


def ask(peer: RawPeer, host: str, sid: str, op: str, timeout: float = 20.0, epoch: int = 1,
        expect: str | None = "ok", **fields) -> dict:
    """A host request as a controller of `epoch` makes it; the reply, whose status must be
    `expect` (None: any)."""
    n = int(time.monotonic() * 1e6)
    peer.send(host, wire.encode(Kind.HOST_REQ, {"sid": sid, "e": epoch, "op": op, "n": n, "rt": peer.address,
                                                 **fields}))
    deadline = time.monotonic() + timeout
    while True:
        kind, reply, _ = peer.recv(max(0.0, deadline - time.monotonic()))
        if kind is Kind.HOST_REP and reply.get("n") == n:
            assert expect is None or reply["st"] == expect, reply
            return reply


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Iterator[Path]:
    """A REGENT_HOME of this test's own. At the end its agent is stopped (and with it its
    procs); anything a failed test left running there is killed."""
    home = tmp_path / "home"
    monkeypatch.setenv("REGENT_HOME", str(home))
    monkeypatch.setenv("REGENT_HOST_IDLE_EXIT_S", "20")
    yield home
    try:
        os.kill(agent_record(home)["pid"], signal.SIGTERM)
    except (OSError, ValueError, KeyError):
        pass
    deadline = time.monotonic() + STOP_WAIT_S
    while (left := workers_of(home)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
