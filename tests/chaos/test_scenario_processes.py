"""Scenarios 6-11: the primary cut off from etcd, frozen, killed 20 times; etcd killed;
procs killed under a restart policy; the host agent killed, then a proc."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
from chaos_suite import assert_verdict, name

from regent.chaos import Fault, Schedule, kill
from regent.chaos.cluster import _proc_pid
from regent.chaos.run import run_schedule
from regent.worker.discovery import host_file

pytestmark = pytest.mark.chaos

LONG = 800  # steps of the runs that must outlast their faults (one shared fault-free run)
PACED = {"REGENT_CHAOS_STEP_S": "0.02"}  # about 10 s live: results do not depend on the pace


def _first_leader_deposed(run):
    """The first primary, which must have stopped by itself before the run ended. (A loaded
    machine may depose a later leader too, its 1 s lease run out: that is no failure here.)"""
    pids = {pid for pid, _ in run.cluster.leaders()}
    deposed = [c for c in run.cluster.controllers
               if c.pid in pids and c is not run.cluster.winner and c not in run.cluster.stopped_at_end]
    first = run.cluster.leaders()[0][0]
    old = next((c for c in deposed if c.pid == first), None)
    assert old is not None, f"the first primary (pid {first}) was not deposed; deposed: {[c.pid for c in deposed]}"
    return old


def test_a_primary_partitioned_from_etcd_stops_and_the_standby_finishes_the_run(toxiproxy, etcd, baseline,
                                                                                tmp_path):
    steps = LONG
    sched = Schedule((Fault("down", "controller->etcd", at_s=0.3, duration_s=4.0),))
    run = run_schedule(toxiproxy, etcd, tmp_path, name("partition"), sched, expected=baseline(steps), steps=steps,
                       env=PACED)
    assert_verdict(run, "partition primary<->etcd")
    assert len(run.cluster.leaders()) >= 2, run.report.text()
    old = _first_leader_deposed(run)
    text = old.log_path.read_text()
    assert old.popen.returncode != 0 and "leadership lost" in text, text[-2000:]
    # It could neither write (the journal verifies, one writer per epoch) nor drive workers
    # (no execution the journal cannot explain, none twice): asserted by the verdict.
    assert run.report.failovers_s and run.report.failovers_s[0] < 10


def test_a_primary_frozen_past_its_lease_is_deposed_and_cannot_act_when_it_wakes(toxiproxy, etcd, baseline,
                                                                                 tmp_path):
    steps = LONG
    sched = Schedule((Fault("pause", "controller", at_s=0.3, duration_s=3.0),))
    run = run_schedule(toxiproxy, etcd, tmp_path, name("zombie"), sched, expected=baseline(steps), steps=steps,
                       env=PACED)
    assert_verdict(run, "SIGSTOP primary")
    assert len(run.cluster.leaders()) >= 2, run.report.text()
    old = _first_leader_deposed(run)
    assert old.popen.returncode != 0 and "lost" in old.log_path.read_text()


def test_twenty_sigkills_of_the_primary_at_random_points_lose_and_repeat_nothing(toxiproxy, etcd, baseline,
                                                                                 tmp_path):
    rng = random.Random(int(os.environ.get("REGENT_CHAOS_SEED", "20")))
    kills = []

    def kill_leaders(c) -> None:
        while len(kills) < 20 and c.result is None:
            lead, standby = c.leader(), c.standby()
            if lead is None or lead.popen.poll() is not None or standby is None or \
                    "standing by" not in standby.log_path.read_text():
                time.sleep(0.02)
                continue
            time.sleep(rng.uniform(0.05, 0.5))
            if c.result is not None or lead.popen.poll() is not None:
                continue
            kill(lead.pid, target="controller", log_to=c.faults, note={"n": len(kills)})
            kills.append(lead.pid)
            while c.leader() is lead and c.result is None:
                time.sleep(0.01)

    run = run_schedule(toxiproxy, etcd, tmp_path, name("kills"), Schedule(()), expected=baseline(LONG),
                       steps=LONG, driver=kill_leaders, ttl_s=0.5, env={"REGENT_CHAOS_STEP_S": "0.05"})
    assert_verdict(run, "20 SIGKILLs of the primary")
    assert len(kills) >= 20, f"the program finished after {len(kills)} kills; make it longer"
    assert len(run.report.failovers_s) >= 20
    assert run.result["role"] == "standby-took-over"


def test_etcd_sigkilled_and_restarted_mid_session_costs_time_not_calls(toxiproxy, etcd, baseline, tmp_path):
    steps = LONG
    sched = Schedule((Fault("kill", "etcd", at_s=0.3), Fault("kill", "etcd", at_s=3.0)))
    run = run_schedule(toxiproxy, etcd, tmp_path, name("etcdkill"), sched, expected=baseline(steps),
                       steps=steps, ttl_s=2.0, env=PACED)
    assert_verdict(run, "etcd SIGKILL+restart")
    assert run.report.injected == 2 and len(run.cluster.etcd_restarts) == 2


def test_procs_sigkilled_during_calls_are_restarted_and_calls_run_at_most_once(toxiproxy, etcd, baseline,
                                                                               tmp_path):
    """permanent restart policy: a call in flight on a killed proc fails with
    SupervisionError (it ran at most once, journaled as failed); the program issues it
    again and the restarted actor runs it."""
    steps = LONG
    # Each kill waits (up to 10 s) for its proc to be running a call the program waits for, so
    # every kill fails one: a kill between two calls, or during a broadcast, tests nothing
    # here. Each square call takes 10 ms (REGENT_CHAOS_DELAY_S), far longer than the runner
    # takes from seeing the call to its SIGKILL.
    kills = 5
    sched = Schedule(tuple(Fault("kill", f"proc/{i % 3}", at_s=0.3 + 0.35 * i, attributes={"in_flight_s": 10.0})
                           for i in range(kills)))
    # A kill due while its proc is still being restarted waits for the new one (up to 25 s: a
    # restart whose new proc was killed under it waits out restart_timeout_s, 20 s).
    run = run_schedule(toxiproxy, etcd, tmp_path, name("prockill"), sched, expected=baseline(steps),
                       steps=steps, env={**PACED, "REGENT_CHAOS_DELAY_S": "0.01"}, target_wait_s=25.0)
    assert_verdict(run, "proc SIGKILL, permanent restart")
    assert run.report.injected == kills, run.runner_errors
    kills_in_flight = [e for e in run.cluster.faults.events() if e.kind == "kill" and e.detail.get("in_flight")]
    assert len(kills_in_flight) == kills, run.cluster.faults.events()
    assert run.report.retries["supervision"] >= 1, run.report.text()
    assert any("proc restarted" in f.effect for f in run.report.faults), run.report.text()


def test_a_sigkilled_host_agent_is_replaced_and_a_proc_killed_later_is_restarted(toxiproxy, etcd, baseline,
                                                                                tmp_path):
    """The host agent's procs outlive it (they are in their own sessions) and start a new
    agent at its address, which adopts them: calls keep flowing with none lost or repeated,
    a proc SIGKILLed afterwards is reported by the new agent and restarted under the
    permanent policy, and at session end the new agent stops every proc (none leaked)."""
    steps = LONG
    session = name("hostkill")
    seen: dict = {}

    def until_the_session_ends(c) -> None:
        c.wait_step(1)
        seen["agent"] = json.loads(host_file().read_text())
        # The controller ends the session itself (stop_session to the new agent); the run's
        # teardown would otherwise kill it while it closes.
        deadline = time.monotonic() + 150
        while c.result is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if c.winner is not None:
            c.winner.popen.wait(timeout=30)
        seen["agent_after"] = json.loads(host_file().read_text())
        seen["left"] = [_proc_pid(session, i) for i in range(3)]

    sched = Schedule((Fault("kill", "host", at_s=0.3), Fault("kill", "proc/1", at_s=4.0)))
    run = run_schedule(toxiproxy, etcd, tmp_path, session, sched, expected=baseline(steps), steps=steps,
                       standbys=0, driver=until_the_session_ends, env=PACED)
    try:
        assert_verdict(run, "host agent SIGKILL, then a proc SIGKILL")
        assert run.report.injected == 2, run.runner_errors
        old, new = seen["agent"], seen["agent_after"]
        assert new["pid"] != old["pid"] and new["address"] == old["address"], (old, new)
        (proc_kill,) = [f for f in run.report.faults if f.target == "proc/1"]
        assert "proc restarted" in proc_kill.effect, run.report.text()
        assert run.cluster.winner.popen.returncode == 0, "the controller did not end the session itself"
        assert seen["left"] == [None, None, None], f"procs left running after the session ended: {seen}"
    finally:
        for pid in [_proc_pid(session, i) for i in range(3)]:
            if pid:
                os.kill(pid, signal.SIGKILL)
