"""A live proc and a live host agent take fuzzed messages on their real, authenticated sockets
(tests/fuzz/live.py: mutated from valid ones of every kind they accept, and some from nothing),
drop and log each bad one, act on the valid ones, and stay up and serving: a real call, ping
and request are answered afterwards."""

from __future__ import annotations

import pytest

from regent.controller import Session
from regent.worker import Actor, endpoint
from regent.worker.discovery import ensure_local_host, live_host_record
from tests.fuzz.live import (
    DROPPED,
    FAILED,
    alive,
    fuzz_host,
    fuzz_proc,
    log_lines,
    ping,
    wait_for_lines,
)
from tests.runtime.rawpeer import RawPeer

pytestmark = pytest.mark.slow  # live processes under fuzzed input: left to `make test`
MESSAGES = 1500


class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x


@pytest.mark.timeout(120)
def test_a_live_proc_drops_and_logs_fuzzed_messages_and_keeps_serving(own_home):
    home = own_home()
    with Session("fuzz-live-proc") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        proc = mesh._procs[0]
        peer = RawPeer()
        try:
            run = fuzz_proc(peer, proc.address, s.sid, s.epoch, "echo", "echo", MESSAGES, seed=20261201)
            assert run.sent > MESSAGES * 0.9 and run.drops > MESSAGES * 0.5, run
            assert ping(peer, proc.address, 10**9)["pid"] == proc.pid and alive(proc.pid)
            assert mesh.echo.call_one("alive").get(timeout=20) == "alive"
        finally:
            peer.close()
        log = home / "host.log"
        assert len(wait_for_lines(log, DROPPED, run.drops, within=proc.id)) >= run.drops
        assert log_lines(log, FAILED) == [] and log_lines(log, "Traceback") == []


@pytest.mark.timeout(120)
def test_a_live_host_agent_drops_and_logs_fuzzed_messages_and_keeps_serving(own_home):
    home = own_home()
    with Session("fuzz-live-host") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        host = ensure_local_host()
        agent = live_host_record()
        assert agent is not None
        peer = RawPeer()
        try:
            run = fuzz_host(peer, host, s.sid, s.epoch, MESSAGES, seed=20261202)
            assert run.sent > MESSAGES * 0.8 and run.drops > MESSAGES * 0.5, run
            assert ping(peer, host, 10**9)["pid"] == agent["pid"] and alive(agent["pid"])
            assert peer.ask_host(host, s.sid, s.epoch, "list")["st"] == "ok"
            assert mesh.echo.call_one("alive").get(timeout=20) == "alive"
        finally:
            peer.close()
        log = home / "host.log"
        assert len(wait_for_lines(log, DROPPED, run.drops, without="proc=")) >= run.drops  # the agent's own
        assert log_lines(log, FAILED) == [] and log_lines(log, "Traceback") == []
