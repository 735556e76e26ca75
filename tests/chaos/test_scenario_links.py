"""Scenarios 1-5: toxics on the links between the controller and its procs.

"controller->proc/<i>" is the controller's connection to proc i (upstream: the
requests, downstream: nothing, PUSH sockets are one-way), "proc->controller" the
procs' connections to the leader's inbox (upstream: the replies)."""

from __future__ import annotations

import time

import pytest
from chaos_suite import assert_verdict, name

from regent.chaos import Fault, Schedule
from regent.chaos.run import run_schedule

pytestmark = pytest.mark.chaos

PROC_LINKS = [f"controller->proc/{i}" for i in range(3)]
STREAMS = ("upstream", "downstream")


def test_latency_and_jitter_on_every_proc_link_changes_nothing_but_speed(toxiproxy, etcd, baseline, tmp_path):
    steps = 150
    faults = [Fault("latency", link, at_s=0.0, stream=s, attributes={"latency": 20, "jitter": 15})
              for link in PROC_LINKS for s in STREAMS]
    faults += [Fault("latency", "proc->controller", at_s=0.0, stream=s, attributes={"latency": 10, "jitter": 10})
               for s in STREAMS]
    run = run_schedule(toxiproxy, etcd, tmp_path, name("latency"), Schedule(tuple(faults)),
                       expected=baseline(steps), steps=steps)
    assert_verdict(run, "latency+jitter")
    assert run.report.injected == len(faults) and not run.runner_errors, run.runner_errors
    assert run.report.timed_out_points == 0  # slower, never failed


def test_a_bandwidth_limit_slows_arrays_in_both_directions_and_loses_none(toxiproxy, etcd, baseline, tmp_path):
    steps, env = 48, {"REGENT_CHAOS_PAYLOAD": str(256 * 1024)}
    faults = [Fault("bandwidth", link, at_s=0.0, stream="upstream", attributes={"rate": 1024})
              for link in PROC_LINKS]
    faults.append(Fault("bandwidth", "proc->controller", at_s=0.0, stream="upstream", attributes={"rate": 2048}))
    t0 = time.monotonic()
    run = run_schedule(toxiproxy, etcd, tmp_path, name("bandwidth"), Schedule(tuple(faults)),
                       expected=baseline(steps, **env), steps=steps, env=env)
    assert_verdict(run, "bandwidth")
    # 8 arrays of 256 KiB each way at ~1 MB/s: the limit really was in the path.
    assert time.monotonic() - t0 > 2.0
    assert run.report.timed_out_points == 0


def test_reset_peer_mid_call_cuts_connections_and_every_call_still_completes(toxiproxy, etcd, baseline, tmp_path):
    steps, env = 90, {"REGENT_CHAOS_CALL_TIMEOUT_S": "2"}
    faults = []
    for k in range(4):  # a reset every ~0.6 s on a rotating proc link, each lasting 0.2 s
        faults.append(Fault("reset_peer", PROC_LINKS[k % 3], at_s=0.3 + 0.6 * k, duration_s=0.2,
                            stream="upstream", attributes={"timeout": 0}))
        faults.append(Fault("reset_peer", "proc->controller", at_s=0.6 + 0.6 * k, duration_s=0.2,
                            stream="upstream", attributes={"timeout": 0}))
    run = run_schedule(toxiproxy, etcd, tmp_path, name("reset"), Schedule(tuple(faults)),
                       expected=baseline(steps, **env), steps=steps, env=env)
    assert_verdict(run, "reset_peer")


def test_a_black_holed_proc_link_fails_calls_at_their_deadline_never_later(toxiproxy, etcd, baseline, tmp_path):
    """timeout toxic, timeout=0: data on the link vanishes and the connection stays open.
    A call on it fails with TimeoutError at its deadline (2 s), journaled; the program
    issues it again, and once the link heals the retry completes."""
    # The hole opens while proc/1 runs a call the program waits for (in_flight_s), so the program
    # is issuing calls there as it opens: the next ones to proc/1 vanish in it. Paced steps
    # (>= 4.5 s of them) keep calls coming for the whole hole.
    steps = 150
    env = {"REGENT_CHAOS_CALL_TIMEOUT_S": "2", "REGENT_CHAOS_STEP_S": "0.03", "REGENT_CHAOS_DELAY_S": "0.01"}
    faults = [Fault("timeout", "controller->proc/1", at_s=0.5, duration_s=3.0, stream="upstream",
                    attributes={"timeout": 0, "in_flight_s": 10.0})]
    run = run_schedule(toxiproxy, etcd, tmp_path, name("blackhole"), Schedule(tuple(faults)),
                       expected=baseline(steps, **env), steps=steps, env=env, start_after_step=1)
    assert_verdict(run, "timeout (black hole)")
    r = run.report
    # The program saw its deadline pass and issued the call again (or, for a register call,
    # waited for it again: the black hole may catch one first). The timed-out call itself
    # stays outstanding (as a Ray task whose get timed out): once the link heals it is sent
    # again under its own id, and it runs once, journaled like any other call.
    assert r.retries["timeout"] + r.retries["waited_again"] >= 1, r.text()
    assert any("timed out" in f.effect for f in r.faults), r.text()
    assert [e.detail.get("in_flight") for e in run.cluster.faults.events() if e.kind == "toxic_add"] == [True]
    # Each timed-out call was told at its deadline (2 s after its issue, as the journal's
    # timestamps say), not when the link healed: the black hole lasts 3 s. The 1 s of slack is
    # for a loaded machine's scheduling, and the bound stays under the black hole's 3 s.
    assert r.timeout_waits_s, r.text()
    assert all(1.5 <= w <= 2.0 + 0.95 for w in r.timeout_waits_s), r.timeout_waits_s


def test_slicer_and_limit_data_fragment_and_cut_frames_and_nothing_is_misparsed(toxiproxy, etcd, baseline,
                                                                               tmp_path):
    steps, env = 90, {"REGENT_CHAOS_CALL_TIMEOUT_S": "2", "REGENT_CHAOS_PAYLOAD": "65536"}
    faults = [Fault("slicer", link, at_s=0.0, stream=s, attributes={"average_size": 64, "size_variation": 48,
                                                                    "delay": 200})
              for link in [*PROC_LINKS, "proc->controller"] for s in STREAMS]
    for k in range(3):  # cut each proc link after 100 KB, once
        faults.append(Fault("limit_data", PROC_LINKS[k], at_s=0.5 + 0.8 * k, duration_s=0.4, stream="upstream",
                            attributes={"bytes": 100_000}))
    run = run_schedule(toxiproxy, etcd, tmp_path, name("slicer"), Schedule(tuple(faults)),
                       expected=baseline(steps, **env), steps=steps, env=env)
    assert_verdict(run, "slicer+limit_data")
    assert not run.runner_errors, run.runner_errors
