"""Scenario 12: a seeded random schedule mixing every fault above, >= 100 of them.

Every toxic and partition on the leader's and a standby's etcd links and on every
proc link in both directions, SIGKILL and SIGSTOP of the leader, a standby, each
proc and etcd, and SIGSTOP and SIGKILL of the host agent (its procs start a new one
and are adopted), over 40 s with outages of 0.1-3 s.
Reproduce a failure with REGENT_CHAOS_SEED=<the seed in the report>."""

from __future__ import annotations

import os

import pytest
from chaos_suite import assert_verdict, name

from regent.chaos import Schedule, random_schedule
from regent.chaos.run import run_schedule

# The mix's timing is part of what it tests: it runs alone, after the parallel part of the suite.
pytestmark = [pytest.mark.chaos, pytest.mark.serial]

LINKS = ["controller->etcd", "standby->etcd", "proc->controller", *(f"controller->proc/{i}" for i in range(3))]
PROCESSES = ["controller", "etcd", *(f"proc/{i}" for i in range(3))]
DURATION_S = float(os.environ.get("REGENT_CHAOS_MIX_S", "40"))
FAULT_S = (0.1, 3.0)  # each outage is short, so that targets are there for the next faults


def mixed_schedule(seed: int, n_faults: int = 190) -> Schedule:
    """Drawn: n_faults. A fault whose target is absent when it fires (no leader during a
    failover, a proc being restarted) is recorded as not applied."""
    main = random_schedule(seed, DURATION_S, n_faults - 4, LINKS, PROCESSES, fault_s=FAULT_S)
    host = random_schedule(seed + 1, DURATION_S, 4, processes=["host"], kinds=["pause", "kill"], fault_s=FAULT_S)
    faults = sorted(main.faults + host.faults, key=lambda f: f.at_s or 0.0)
    return Schedule(tuple(faults), name=f"mixed-{seed}", seed=seed)


@pytest.mark.timeout(600)  # 1.5-5 min here: failovers under etcd faults stall the program for seconds
def test_a_seeded_random_mix_of_over_100_faults_loses_and_repeats_nothing(toxiproxy, etcd, baseline, tmp_path):
    seed = int(os.environ.get("REGENT_CHAOS_SEED", "6"))
    steps, env = 700, {"REGENT_CHAOS_STEP_S": "0.06", "REGENT_CHAOS_CALL_TIMEOUT_S": "2"}
    run = run_schedule(toxiproxy, etcd, tmp_path, name(f"mixed{seed}"), mixed_schedule(seed),
                       expected=baseline(steps), steps=steps, env=env, ttl_s=1.0, timeout_s=420, standbys=2)
    assert_verdict(run, f"random mix (seed {seed})")
    # About a quarter of the drawn faults find no target when they fire (no leader during a
    # failover, etcd down, a proc being restarted) and are recorded as not applied.
    assert run.report.injected >= 100, f"seed {seed}: {run.report.injected} injected; not applied: {run.runner_errors}"
