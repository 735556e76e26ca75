"""Receiver-side guarantees (DESIGN invariants 2, 5, 8): dedupe by call id, epoch
fencing, proc death surfacing as SupervisionError, workers outliving a SIGKILLed
controller. Messages are forged with a raw wire peer where the session would
never produce them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from regent.controller import Session, SupervisionError
from regent.wire import Kind
from regent.worker import Actor, endpoint
from regent.worker.discovery import ensure_local_host
from tests.runtime.rawpeer import RawPeer


class Tally(Actor):
    """Counts its own executions, so a test can prove what ran and how often."""

    def __init__(self) -> None:
        self.executions = 0
        self.total = 0

    @endpoint
    def add(self, x: int) -> int:
        self.executions += 1
        self.total += x
        return self.total

    @endpoint
    def slow_add(self, x: int, delay: float) -> int:
        time.sleep(delay)
        return self.add(x)

    @endpoint
    def sub(self, x: int) -> int:
        self.executions += 1
        self.total -= x
        return self.total

    @endpoint
    async def add_later(self, x: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return self.add(x)

    @endpoint
    async def sub_later(self, x: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return self.sub(x)

    @endpoint
    def count(self) -> int:
        return self.executions

    @endpoint
    def state(self) -> tuple[int, int]:
        return self.executions, self.total

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def exit_now(self) -> None:
        os._exit(3)


@pytest.fixture()
def tally():
    with Session("receivers") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("tally", Tally)
        peer = RawPeer()
        yield s, mesh, peer
        peer.close()


def _result(peer: RawPeer) -> tuple[dict, object]:
    while True:
        kind, meta, value = peer.recv()
        if kind is Kind.RESULT:
            return meta, value


def test_the_same_call_id_sent_twice_runs_once(tally):
    s, mesh, peer = tally
    addr = mesh._procs[0].address
    for _ in range(2):
        peer.call(addr, s.sid, s.epoch, seq=10_000, actor="tally", method="add", args=(5,))
    first, v1 = _result(peer)
    second, v2 = _result(peer)
    assert (first["st"], second["st"]) == ("ok", "ok")
    assert v1 == v2 == 5
    assert mesh.slice(procs=0).count.call_one().get() == 1


def test_a_repeat_while_in_flight_joins_the_running_execution(tally):
    s, mesh, peer = tally
    addr = mesh._procs[1].address
    peer.call(addr, s.sid, s.epoch, 20_000, "tally", "slow_add", (7, 0.3), point=1)
    time.sleep(0.05)
    peer.call(addr, s.sid, s.epoch, 20_000, "tally", "slow_add", (7, 0.3), point=1)
    results = [_result(peer), _result(peer)]
    assert [v for _, v in results] == [7, 7]
    assert mesh.slice(procs=1).count.call_one().get() == 1


def test_same_id_with_different_arguments_is_a_divergence_not_a_rerun(tally):
    s, mesh, peer = tally
    addr = mesh._procs[0].address
    peer.call(addr, s.sid, s.epoch, 30_000, "tally", "add", (1,))
    assert _result(peer)[0]["st"] == "ok"
    peer.call(addr, s.sid, s.epoch, 30_000, "tally", "add", (2,))
    meta, _ = _result(peer)
    assert meta["st"] == "divergence"
    assert "seq 30000" in meta["em"] and "not run again" in meta["em"]
    assert mesh.slice(procs=0).count.call_one().get() == 1


def test_same_id_and_arguments_for_another_endpoint_after_the_first_finished_is_a_divergence(tally):
    s, mesh, peer = tally
    addr = mesh._procs[0].address
    peer.call(addr, s.sid, s.epoch, 31_000, "tally", "add", (5,))
    assert _result(peer) == ({"sid": s.sid, "s": 31_000, "a": "tally", "pt": 0, "st": "ok"}, 5)
    peer.call(addr, s.sid, s.epoch, 31_000, "tally", "sub", (5,))
    meta, _ = _result(peer)
    assert meta["st"] == "divergence", meta
    assert "'add'" in meta["em"] and "'sub'" in meta["em"] and "not run again" in meta["em"]
    assert mesh.slice(procs=0).state.call_one().get() == (1, 5)  # sub never ran


def test_same_id_and_arguments_for_another_endpoint_while_the_first_runs_is_a_divergence(tally):
    s, mesh, peer = tally
    addr = mesh._procs[1].address
    peer.call(addr, s.sid, s.epoch, 32_000, "tally", "add_later", (7, 0.5), point=1)
    time.sleep(0.1)  # the proc has admitted it: it awaits its sleep
    peer.call(addr, s.sid, s.epoch, 32_000, "tally", "sub_later", (7, 0.5), point=1)
    first, _ = _result(peer)
    assert first["st"] == "divergence", first  # at once, not joined to add_later's result
    assert "'add_later'" in first["em"] and "'sub_later'" in first["em"]
    second, value = _result(peer)
    assert (second["st"], value) == ("ok", 7)
    with pytest.raises(TimeoutError):
        peer.recv(timeout=0.8)  # no second answer: sub_later never ran
    assert mesh.slice(procs=1).state.call_one().get() == (1, 7)


def test_same_id_at_another_point_is_a_divergence(tally):
    s, mesh, peer = tally
    addr = mesh._procs[0].address
    peer.call(addr, s.sid, s.epoch, 33_000, "tally", "add", (3,), point=0)
    assert _result(peer)[0]["st"] == "ok"
    peer.call(addr, s.sid, s.epoch, 33_000, "tally", "add", (3,), point=1)
    meta, _ = _result(peer)
    assert meta["st"] == "divergence" and "point 1" in meta["em"], meta
    assert mesh.slice(procs=0).state.call_one().get() == (1, 3)


def test_a_lower_epoch_is_rejected_after_a_higher_one_was_seen(tally):
    s, mesh, peer = tally
    addr = mesh._procs[0].address
    peer.call(addr, s.sid, s.epoch + 5, 40_000, "tally", "add", (1,))
    assert _result(peer)[0]["st"] == "ok"
    peer.call(addr, s.sid, s.epoch, 40_001, "tally", "add", (1,))
    meta, _ = _result(peer)
    assert meta["st"] == "fenced"
    assert "deposed" in meta["em"]
    # The session itself now holds a stale epoch: its calls are refused too.
    from regent.controller import LeadershipLost

    with pytest.raises(LeadershipLost, match="deposed"):
        mesh.slice(procs=0).add.call_one(1).get()


def test_results_are_released_when_the_watermark_passes(tally):
    s, mesh, peer = tally
    addr = mesh._procs[0].address
    peer.call(addr, s.sid, s.epoch, 50_000, "tally", "add", (1,))
    _result(peer)
    from regent import wire

    peer.send(addr, wire.encode(Kind.WATERMARK, {"sid": s.sid, "e": s.epoch, "dw": 50_000, "cw": -1}))
    time.sleep(0.1)
    # The id is below the watermark: it is refused rather than run a second time.
    peer.call(addr, s.sid, s.epoch, 50_000, "tally", "add", (1,))
    meta, _ = _result(peer)
    assert meta["st"] == "divergence" and "released" in meta["em"]
    peer.call(addr, s.sid, s.epoch, 50_001, "tally", "count")
    assert _result(peer)[1] == 1


def test_a_killed_proc_fails_its_calls_within_a_second_and_others_keep_serving(tally):
    s, mesh, _ = tally
    victim = mesh.slice(procs=0)
    pid = victim.pid.call_one().get()
    inflight = victim.slow_add.call_one(1, 30.0)
    time.sleep(0.1)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(SupervisionError, match="exited"):
        inflight.get(timeout=5)
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(SupervisionError):
        victim.add.call_one(1).get(timeout=1)
    assert mesh.slice(procs=1).add.call_one(2).get(timeout=5) == 2
    vm = mesh.count.call()
    with pytest.raises(SupervisionError):
        vm.get(timeout=5)


def test_an_endpoint_calling_os_exit_is_a_supervision_error(tally):
    s, mesh, _ = tally
    with pytest.raises(SupervisionError):
        mesh.slice(procs=1).exit_now.call_one().get(timeout=5)
    assert mesh.slice(procs=0).add.call_one(1).get(timeout=5) == 1


CONTROLLER = textwrap.dedent(
    """
    import json, sys, time
    from regent import Session, Actor, endpoint

    class Keeper(Actor):
        def __init__(self):
            self.n = 0
        @endpoint
        def bump(self):
            self.n += 1
            return self.n

    s = Session("survivor")
    mesh = s.spawn_procs(per_host={"procs": 2}).spawn("keeper", Keeper)
    for _ in range(3):
        mesh.bump.call().get()
    procs = [{"addr": p.address, "pid": p.pid} for p in mesh._procs]
    print(json.dumps({"sid": s.sid, "epoch": s.epoch, "procs": procs}), flush=True)
    time.sleep(600)
    """
)


def test_workers_outlive_a_sigkilled_controller(tmp_path):
    script = tmp_path / "survivor_program.py"
    script.write_text(CONTROLLER)
    ctl = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(ctl.stdout.readline())
    finally:
        ctl.kill()
        ctl.wait()
    time.sleep(0.3)
    for p in info["procs"]:
        os.kill(p["pid"], 0)  # still alive
    peer = RawPeer()
    try:
        # A second controller finds the procs through the host agent and reaches the actor state.
        reply = peer.ask_host(ensure_local_host(), info["sid"], info["epoch"] + 1, "list")
        assert [p["pid"] for p in reply["procs"]] == [p["pid"] for p in info["procs"]]
        peer.call(info["procs"][1]["addr"], info["sid"], info["epoch"] + 1, 99, "keeper", "bump", point=1)
        meta, value = _result(peer)
        assert meta["st"] == "ok" and value == 4
        peer.ask_host(ensure_local_host(), info["sid"], info["epoch"] + 1, "stop_session")
    finally:
        peer.close()
