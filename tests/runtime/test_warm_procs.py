"""Warm procs at the host agent (worker/_warm.py): a spare keeps the procs a controller asks
for, a respawn at the same index and environment takes one instead of starting a process, and
a successor agent knows a taken one as the replacement it is. Real agents and procs, each test
in its own REGENT_HOME."""

from __future__ import annotations

import os
import signal
import time

import pytest

from regent.wire.security import load_credentials
from regent.worker.discovery import ensure_local_host
from regent.worker.procinfo import running
from tests.runtime.rawpeer import RawPeer
from tests.support.agenthome import agent_record as _agent
from tests.support.agenthome import ask as _ask
from tests.support.agenthome import successor as _successor
from tests.support.agenthome import wait_for as _wait

ENV = [{"REGENT_PROC_RANK": str(i), "REGENT_PROC_DIM": "procs"} for i in range(2)]
WANTED = [{"idx": i, "env": ENV[i]} for i in range(2)]


@pytest.fixture
def agent(home, request):
    """(this machine's agent, a wire peer talking to it as a controller, a session id of the test's)."""
    peer = RawPeer(load_credentials())
    try:
        yield ensure_local_host(), peer, f"{request.node.name[:40]}-{os.getpid()}"
    finally:
        peer.close()


def _listed(peer: RawPeer, host: str, sid: str) -> dict[int, dict]:
    """The session's live procs on the agent, by index, once each said it is ready."""
    def ready() -> dict[int, dict] | None:
        procs = [p for p in _ask(peer, host, sid, "list")["procs"] if p["alive"]]
        return {p["idx"]: p for p in procs} if procs and all(p["addr"] for p in procs) else None

    return _wait(ready, 30, "the warm procs are ready")


def _gone(pid: int, timeout: float = 10.0) -> None:
    _wait(lambda: not running(pid), timeout, f"proc {pid} stopped")


def test_a_spare_keeps_the_warm_procs_asked_for_and_a_respawn_at_their_index_and_env_takes_one(agent):
    host, peer, sid = agent
    assert _ask(peer, host, sid, "warm_procs", warm=WANTED, preload=["json"])["warm"] == 2
    warm = _listed(peer, host, sid)
    assert sorted(warm) == [0, 1]
    # Asked again (the controller's periodic refresh): the same procs, nothing started.
    assert _ask(peer, host, sid, "warm_procs", warm=WANTED, preload=["json"])["warm"] == 2
    assert {i: p["pid"] for i, p in _listed(peer, host, sid).items()} == {i: p["pid"] for i, p in warm.items()}

    took = _ask(peer, host, sid, "respawn_proc", old="lost-1", idx=1, env=ENV[1])["procs"]
    assert [(p["idx"], p["pid"]) for p in took] == [(1, warm[1]["pid"])] and took[0]["addr"]
    assert _ask(peer, host, sid, "respawn_proc", old="lost-1", idx=1, env=ENV[1])["procs"] == took
    # Another environment at index 0 is another proc: the warm one does not serve it.
    other = _ask(peer, host, sid, "respawn_proc", old="lost-0", idx=0, env={"X": "1"})["procs"]
    assert other[0]["pid"] not in (warm[0]["pid"], warm[1]["pid"])

    # No warm procs wanted any more: the one left is stopped, the one in use is not.
    assert _ask(peer, host, sid, "warm_procs", warm=[])["warm"] == 0
    _gone(warm[0]["pid"])
    assert running(warm[1]["pid"]) and running(other[0]["pid"])
    _ask(peer, host, sid, "stop_session")
    _gone(warm[1]["pid"])


def test_a_successor_agent_knows_a_taken_warm_proc_as_the_replacement_and_stops_an_untaken_one(agent, home):
    host, peer, sid = agent
    _ask(peer, host, sid, "warm_procs", warm=WANTED)
    warm = _listed(peer, host, sid)
    took = _ask(peer, host, sid, "respawn_proc", old="lost-0", idx=0, env=ENV[0])["procs"]
    assert took[0]["pid"] == warm[0]["pid"]
    dead = _agent(home)
    os.kill(dead["pid"], signal.SIGKILL)
    assert _successor(home, dead)["address"] == host
    _gone(warm[1]["pid"], timeout=20)  # the untaken one: a cache the successor did not fill
    # A replaying controller asks for the same replacement: the same process, adopted.
    deadline = time.monotonic() + 20
    while (again := _ask(peer, host, sid, "respawn_proc", old="lost-0", idx=0, env=ENV[0])["procs"]) != took:
        assert time.monotonic() < deadline, (again, took)
        time.sleep(0.2)
    _ask(peer, host, sid, "stop_session")
    _gone(warm[0]["pid"])


def test_a_respawn_that_arrives_before_its_warm_proc_is_ready_waits_for_it(agent):
    host, peer, sid = agent
    _ask(peer, host, sid, "warm_procs", warm=WANTED[:1])
    took = _ask(peer, host, sid, "respawn_proc", old="lost-0", idx=0, env=ENV[0])["procs"]
    listed = _listed(peer, host, sid)
    assert list(listed) == [0] and listed[0]["pid"] == took[0]["pid"] and took[0]["addr"]
    _ask(peer, host, sid, "stop_session")
