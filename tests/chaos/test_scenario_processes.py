"""Scenarios 9-11: etcd killed; procs killed under a restart policy; the host agent killed,
then a proc. (Scenarios 6-8, the primary's faults, are in test_scenario_controllers.py: two
files, so that parallel workers share the chaos suite's longest runs.)"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from chaos_suite import assert_verdict, name

from regent.chaos import Fault, Schedule
from regent.chaos.cluster import _proc_pid
from regent.chaos.run import run_schedule
from regent.worker.discovery import host_file

pytestmark = pytest.mark.chaos

LONG = 800  # steps of the runs that must outlast their faults (one shared fault-free run)
PACED = {"REGENT_CHAOS_STEP_S": "0.02"}  # about 10 s live: results do not depend on the pace


def test_etcd_sigkilled_and_restarted_mid_session_costs_time_not_calls(toxiproxy, etcd, baseline, tmp_path):
    steps = LONG
    sched = Schedule((Fault("kill", "etcd", at_s=0.3), Fault("kill", "etcd", at_s=3.0)))
    run = run_schedule(toxiproxy, etcd, tmp_path, name("etcdkill"), sched, expected=baseline(steps),
                       steps=steps, ttl_s=2.0, env=PACED)
    assert_verdict(run, "etcd SIGKILL+restart")
    # A kill that finds etcd still starting from the first one kills that start, and one restart
    # then serves both (the harness starts it again until it runs).
    assert run.report.injected == 2 and 1 <= len(run.cluster.etcd_restarts) <= 2


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
    # Up to 30 s for the target to run a call: beside five other workers, a restarted proc
    # once took longer than 10 s to come back and take one (fresh-clone run 3).
    sched = Schedule(tuple(Fault("kill", f"proc/{i % 3}", at_s=0.3 + 0.35 * i, attributes={"in_flight_s": 30.0})
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
        # A new agent, at the old address unless something took that port while no agent held
        # it (on a loaded machine, an outgoing connection's ephemeral port can): the controller
        # then follows it to the new one, which the verdict above covers either way.
        assert new["pid"] != old["pid"], (old, new)
        (proc_kill,) = [f for f in run.report.faults if f.target == "proc/1"]
        assert "proc restarted" in proc_kill.effect, run.report.text()
        assert run.cluster.winner.popen.returncode == 0, "the controller did not end the session itself"
        assert seen["left"] == [None, None, None], f"procs left running after the session ended: {seen}"
    finally:
        for pid in [_proc_pid(session, i) for i in range(3)]:
            if pid:
                os.kill(pid, signal.SIGKILL)
