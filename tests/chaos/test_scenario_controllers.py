"""Scenarios 6-8: the primary cut off from etcd, frozen past its lease, killed 20 times."""

from __future__ import annotations

import os
import random
import time

import pytest
from chaos_suite import assert_verdict, name

from regent.chaos import Fault, Schedule, kill
from regent.chaos.run import run_schedule
from regent.controller.edge import STANDING_BY

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
                    STANDING_BY not in standby.log_path.read_text():
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
