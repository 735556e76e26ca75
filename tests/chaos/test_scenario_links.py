"""Scenarios 1-5: toxics on the controller<->proc links (both directions)."""

from __future__ import annotations

import pytest
from chaos_suite import assert_verdict, name

from chaos import Fault, Schedule
from chaos.run import run_schedule

pytestmark = pytest.mark.chaos

PROC_LINKS = [f"controller->proc/{i}" for i in range(3)]


def test_latency_and_jitter_on_every_proc_link_changes_nothing_but_speed(toxiproxy, etcd, baseline, tmp_path):
    steps = 60
    faults = [Fault("latency", link, at_s=0.0, stream=stream, attributes={"latency": 20, "jitter": 15})
              for link in PROC_LINKS for stream in ("upstream", "downstream")]
    faults.append(Fault("latency", "proc->controller", at_s=0.0, attributes={"latency": 10, "jitter": 10}))
    run = run_schedule(toxiproxy, etcd, tmp_path, name("latency"), Schedule(tuple(faults)),
                       expected=baseline(steps), steps=steps)
    assert_verdict(run, "latency+jitter")
    assert run.report.injected == len(faults)
    assert not run.runner_errors, run.runner_errors
