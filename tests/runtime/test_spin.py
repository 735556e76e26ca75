"""Readers spin briefly before they sleep (wire/transport.py spin_budget_s): the
controller while it waits for a result, a proc after it has answered. The spin is
bounded: a long call does not burn its waiter's CPU, an idle proc goes back to sleep,
and a proc's event loop still runs its timers and tasks while calls keep arriving."""

from __future__ import annotations

import asyncio
import os
import time

import psutil
import pytest

from regent.controller import Session
from regent.wire.transport import DEFAULT_SPIN_US, spin_budget_s
from regent.worker import Actor, endpoint


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


class Clock(Actor):
    def __init__(self) -> None:
        self.ticks = 0

    @endpoint
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def now(self) -> int:
        return self.ticks

    @endpoint
    async def start_ticking(self) -> None:
        """A background task of the actor's own, which only the proc's event loop runs."""
        asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.002)
            self.ticks += 1


@pytest.mark.parametrize(("raw", "expected_us"), [
    ("", DEFAULT_SPIN_US), ("0", 0.0), ("50", 50.0), ("not-a-number", DEFAULT_SPIN_US),
    ("-5", 0.0), ("1e9", 100_000.0),
])
def test_spin_budget_comes_from_regent_spin_us(monkeypatch, raw, expected_us):
    monkeypatch.setenv("REGENT_SPIN_US", raw)
    assert spin_budget_s() == pytest.approx(expected_us / 1e6)


def test_a_waiting_program_sleeps_once_its_spin_budget_is_spent():
    with Session("spin-long-call") as s:
        clock = s.this_host().spawn_procs(per_host={"procs": 1}).spawn("clock", Clock)
        clock.nap.call_one(0.0).get()
        before = time.thread_time()
        assert clock.nap.call_one(0.6).get() == 0.6
        spent = time.thread_time() - before
    # A waiter that kept spinning would burn the whole 0.6 s.
    assert spent < 0.2, f"the waiting thread used {spent:.3f} s of CPU during a 0.6 s call"


def test_an_idle_proc_stops_spinning():
    with Session("spin-idle-proc") as s:
        clock = s.this_host().spawn_procs(per_host={"procs": 1}).spawn("clock", Clock)
        for _ in range(200):
            clock.now.call_one().get()
        pid = clock._procs[0].pid
        before = _cpu_s(pid)
        time.sleep(1.0)
        idle_cpu = _cpu_s(pid) - before
    assert idle_cpu < 0.3, f"an idle proc used {idle_cpu:.2f} s of CPU in 1 s"


@pytest.mark.serial  # counts calls and ticks in 0.8 s: timing, measured alone
def test_a_proc_loop_runs_its_tasks_while_calls_keep_the_reader_spinning(own_home):
    # A spin budget far longer than the gap between calls: without the reader's time
    # slice, the proc would never leave its reader and the actor's task would never tick.
    own_home(REGENT_SPIN_US="50000")
    with Session("spin-slice") as s:
        clock = s.this_host().spawn_procs(per_host={"procs": 1}).spawn("clock", Clock)
        clock.start_ticking.call_one().get()
        first = clock.now.call_one().get()
        deadline = time.monotonic() + 0.8
        calls = 0
        while time.monotonic() < deadline:
            last = clock.now.call_one().get()
            calls += 1
    assert calls > 100
    assert last - first >= 20, f"the actor's task ticked {last - first} times in 0.8 s of calls"


class Env(Actor):
    @endpoint
    def get(self, key: str) -> str | None:
        return os.environ.get(key)


def test_the_sessions_spin_setting_reaches_its_procs_through_a_running_agent(monkeypatch):
    with Session("spin-env-default") as s:  # starts (or reuses) the agent without the setting
        s.this_host().spawn_procs(per_host={"procs": 1}).spawn("env", Env)
    monkeypatch.setenv("REGENT_SPIN_US", "0")
    with Session("spin-env-set") as s:
        env = s.this_host().spawn_procs(per_host={"procs": 1}).spawn("env", Env)
        assert env.get.call_one("REGENT_SPIN_US").get() == "0"
