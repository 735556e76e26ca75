"""Controller failover on both journal backends (DESIGN invariants 1-8).

Real controller processes run the same program; the primary is SIGKILLed,
SIGSTOPped or asked to hand over, and a standby finishes the run. The actors count
their own executions, so "exactly once" is checked where it happens."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import time

import pytest

from tests.failover.harness import Cluster, check_exactly_once


@pytest.fixture()
def cluster_factory(tmp_path, journal_url):
    made = []

    def make(name: str, **kw) -> Cluster:
        c = Cluster(f"{name}-{os.getpid()}-{len(made)}", journal_url, tmp_path, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop_all()


def _baseline(cluster_factory, steps: int) -> dict:
    clean = cluster_factory("clean", steps=steps)
    return clean.finish(clean.start())


def test_standby_replays_to_each_kill_point_and_runs_every_call_once(cluster_factory):
    """30 SIGKILLs of successive primaries at random points of one run."""
    steps = 400
    expected = _baseline(cluster_factory, steps)
    c = cluster_factory("kills", steps=steps)
    rng = random.Random(int(os.environ.get("REGENT_TEST_SEED", "1234")))
    c.start()
    c.start()  # standby
    kills = len(c.kill_leaders(30, rng, max_live_steps=8))
    assert kills == 30, f"the program finished after {kills} kills; make it longer"
    final = c.by_pid(c.wait_leader(kills + 1, timeout=60))
    result = c.finish(final)
    assert result["out"] == expected["out"]
    check_exactly_once(result, steps)
    # A standby that waited, or the fresh process started after the last kill that found the seat
    # empty first (its role then says "primary"): either way it replayed the run.
    assert result["stats"]["replayed"] > 0


def test_a_paused_primary_is_deposed_and_its_late_writes_are_refused(cluster_factory):
    steps = 300
    c = cluster_factory("zombie", steps=steps)
    c.start()
    c.start()
    old, new_pid = c.pause_until_deposed(step=20)
    log = c.log_of(old.pid).read_text()
    assert old.returncode != 0
    assert "leadership" in log and "lost" in log, log[-3000:]
    result = c.finish(c.by_pid(new_pid))
    check_exactly_once(result, steps)


def _takeover(cluster_factory, tag: str, sig: int, steps: int = 200) -> tuple:
    """Primary + standby with a 10 s lease; signal the primary at step 20. Returns the
    cluster, both pids and seconds from the signal to the standby leading."""
    c = cluster_factory(tag, steps=steps, ttl=10.0)
    c.start()
    c.start()
    first = c.wait_leader(1)
    c.wait_step(first, 20)
    t0 = time.monotonic()
    os.kill(first, sig)
    second = c.wait_leader(2, timeout=20.0)
    return c, first, second, time.monotonic() - t0


def test_a_graceful_exit_hands_over_to_the_standby_at_once(cluster_factory):
    c, first, second, took = _takeover(cluster_factory, "handoff", signal.SIGTERM)
    # With a 10 s lease, anything well under it proves the lease was released, not expired.
    assert took < 3.0, f"hand-over took {took:.2f} s"
    assert c.by_pid(first).wait(timeout=10) == 0
    check_exactly_once(c.finish(c.by_pid(second)), 200)


def test_a_killed_primary_is_replaced_long_before_its_lease_runs_out(cluster_factory):
    """The standby sees the dead primary's beacon close and refuse connections, and evicts it."""
    c, _, second, took = _takeover(cluster_factory, "beacon", signal.SIGKILL)
    # With a 10 s lease, anything well under it proves the standby did not wait for it.
    assert took < 3.0, f"take-over took {took:.2f} s"
    assert "evicted a dead leader" in c.log_of(second).read_text()
    check_exactly_once(c.finish(c.by_pid(second)), 200)


def test_a_program_changed_at_seq_k_fails_replay_naming_k(cluster_factory):
    steps = 400
    c = cluster_factory("edited", steps=steps)
    first = c.start()
    pid = c.wait_leader(1)
    c.wait_step(pid, 12)  # well past step 10
    os.kill(pid, signal.SIGKILL)
    first.wait()
    edited = c.start(REGENT_TEST_CHANGE_AT="10")
    out, _ = edited.communicate(timeout=60)
    assert edited.returncode != 0
    text = (c.workdir / f"{c.session}.ctl1.log").read_text()
    assert "NonDeterminismError" in text
    # Seqs 0-3 are this_host, spawn_procs, spawn and now(); step i is seq 4 + i.
    assert "changed10" not in out
    assert "non-determinism at seq 14:" in text and "call w.work" in text


def test_a_standby_whose_primary_finishes_the_run_exits_without_running_it_again(cluster_factory):
    c = cluster_factory("finished", steps=30)
    hold = c.workdir / "finished.hold"  # the primary waits at step 3 until the standby stands by: on a
    hold.touch()  # loaded machine the second process once started after the run had ended
    first = c.start(REGENT_TEST_HOLD_FILE=str(hold))
    c.wait_leader(1)
    c.start()
    c.wait_standby()
    hold.unlink()
    result = c.finish(first)
    check_exactly_once(result, 30)
    standby = next(p for p in c.procs if p is not first)
    out, _ = standby.communicate(timeout=30)
    assert standby.returncode == 0
    assert out.strip() == ""  # it printed no result: it ran nothing
    assert "has finished; exiting without running it again" in c.log_of(standby.pid).read_text()


def test_a_standby_carries_on_when_the_journaled_host_agent_and_its_procs_are_gone(tmp_path):
    """The machine's worker side is lost with the primary (agent and procs SIGKILLed, and the
    agent's port taken by something that never answers): the standby replays what the
    journal holds, moves to a new agent on this machine, and the program goes on."""
    from regent.chaos.cluster import _host_pid
    from regent.worker.discovery import host_file

    url = f"sqlite://{tmp_path / 'journal.db'}"
    go = tmp_path / "go"
    c = Cluster(f"losthost-{os.getpid()}", url, tmp_path, program="lost_host.py",
                extra_env={"REGENT_TEST_GO_FILE": str(go)})
    squatter = None
    try:
        c.start()
        first = c.wait_leader(1)
        c.wait_step(first, 0)
        host_pid = _host_pid()
        old_address = json.loads(host_file().read_text())["address"]
        victims = [int(p) for p in subprocess.run(["pgrep", "-P", str(host_pid)], capture_output=True,
                                                 text=True).stdout.split()]
        for pid in [*victims, host_pid, first]:  # procs first: a live proc restarts a dead agent
            os.kill(pid, signal.SIGKILL)
        c.by_pid(first).wait()
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        port = int(old_address.rsplit(":", 1)[1])
        deadline = time.monotonic() + 5.0
        while True:  # SIGKILL is asynchronous: the dead agent's sockets close as it exits
            try:
                squatter.bind(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        squatter.listen()
        go.touch()
        standby = c.start()
        out = c.finish(standby)
    finally:
        c.stop_all()
        if squatter is not None:
            squatter.close()
    assert out["before"] == [2, 2] and out["after"] == [11, 11], out
    assert json.loads(host_file().read_text())["address"] != old_address


def test_a_standby_rebuilds_an_actor_its_predecessor_had_not_rebuilt_on_a_replaced_proc(cluster_factory, tmp_path):
    """The primary replaced a killed proc and was killed while it rebuilt the first of the two
    meshes there. The journal says the proc was replaced, so the standby calls the new one,
    where the second mesh's actor was never built: that call fails (the actor is gone, as
    after any crash), the mesh's policy rebuilds it, and the program's next try is answered."""
    go, flag = tmp_path / "go", tmp_path / "rebuilding"
    c = cluster_factory("rebuild", program="rebuild_interrupted.py",
                        extra_env={"REGENT_TEST_GO_FILE": str(go), "REGENT_TEST_FLAG_FILE": str(flag)})
    c.start()
    c.start()  # standby
    first = c.wait_leader(1)
    c.wait_step(first, 0)
    c.wait_standby()  # under load the standby may still be starting: it must stand by first
    proc_pid = int(re.search(r"^proc (\d+)$", c.log_of(first).read_text(), re.M).group(1))
    os.kill(proc_pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while not flag.exists():  # the primary replaced the proc and is rebuilding "w" on it
        assert time.monotonic() < deadline, f"no rebuild of w began\n{c.log_tail()}"
        time.sleep(0.02)
    time.sleep(0.5)  # the replacement is journaled (within a linger), "kv" not rebuilt yet
    os.kill(first, signal.SIGKILL)
    c.by_pid(first).wait()
    second = c.wait_leader(2, timeout=30)
    go.touch()
    out = c.finish(c.by_pid(second))
    assert out["role"] == "standby-took-over"
    assert out["after"] is not None, f"kv was never rebuilt: {out['failures'][-1:]}"
    new_pid = out["w_after"][0]
    assert new_pid != proc_pid and out["after"][0] == new_pid and out["after"][1] >= 1, out
    assert 1 <= len(out["failures"]) <= 2 and "no actor 'kv'" in out["failures"][0], out
