"""A controller SIGKILLed in the middle of replacing a lost host, and just after: its standby
replays the journaled pick (it never picks a spare again), finishes on the same hosts, and
observes what the primary observed. Loopback agents on the embedded store (no root)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.failover.harness import Cluster
from tests.support.loopback import loopback_agents, stop_then_kill, supervision_records

TTL_S = 1.0
STEPS = 24  # 6 s of steps at least: the faults land while the run goes on


def wait_event(url: str, session: str, done, timeout_s: float = 120.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        events = supervision_records(url, session)
        if done(events):
            return events
        assert time.monotonic() < deadline, f"timed out waiting in the journal; events: {[e['ev'] for e in events]}"
        time.sleep(0.02)


@pytest.mark.parametrize("kill", ["during", "after"])
def test_a_standby_finishes_a_replacement_on_the_spare_the_primary_picked(own_home, tmp_path: Path,
                                                                          kill: str) -> None:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    session = f"replace-{kill}"
    with loopback_agents(url, tmp_path, TTL_S) as add:
        agents = add("a", "b", "c")
        c = Cluster(session, url, tmp_path, program="replace_train.py", steps=STEPS, ttl=TTL_S,
                    extra_env={"REGENT_TEST_STEP_S": "0.25"})
        c.start()
        leader = c.wait_leader(1, timeout=60)
        standby = c.start()
        c.wait_standby()
        c.wait_step(leader, 2, timeout=120)
        stop_then_kill(agents["a"])
        if kill == "during":  # its pick is durable, the spare's proc is still starting
            wait_event(url, session, lambda evs: any(e["ev"] == "host_replaced" for e in evs))
        else:  # the mesh was rebuilt on the spare
            wait_event(url, session, lambda evs: any(e["ev"] == "restart" for e in evs))
        os.kill(leader, signal.SIGKILL)
        out, _ = standby.communicate(timeout=240)
        assert standby.returncode == 0, c.log_tail()
        result = json.loads(out.strip().splitlines()[-1])
        parents = [agents["c"].pid, agents["b"].pid]
    # The session's end stopped its procs on every host; the spare's log says what it started
    # (the warm proc the replacement took, or one cold replacement when the host died first).
    spare_procs = [line for line in (tmp_path / "agent-c.log").read_text().splitlines() if "proc started" in line]
    events = supervision_records(url, session)
    replaced = [(e["host"], e["new"]["id"]) for e in events if e["ev"] == "host_replaced"]
    assert replaced == [("a", "c")], "a standby must replay the pick, never pick again"
    assert len(spare_procs) == 1, f"the spare started {spare_procs}: the replacement was started twice"
    assert result["parents"] == parents
    oks = [entry for entry in result["seen"] if entry[0] == "ok"]
    assert [entry[1] for entry in oks] == list(range(STEPS))
    assert all(entry[2] == [3.0, 3.0] for entry in oks), oks
    errors = [entry for entry in result["seen"] if entry[0] == "error"]
    assert 1 <= len(errors) <= 4 and all(reason in ("dead", "group") for _, _, reason in errors), errors
    if kill == "after":  # the primary re-formed the group: the standby found it formed
        assert sum(e["ev"] == "group_reformed" for e in events) == 1


def test_a_mesh_over_hollow_and_real_hosts_goes_through_a_failover_running_every_call_once(
        own_home, tmp_path: Path) -> None:
    """Hollow hosts in a failover: the standby finds the hollow procs the primary spawned and
    goes on; every step's calls ran once on each actor (counters never skip nor repeat)."""
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    steps, per_host = 16, 4
    with loopback_agents(url, tmp_path, TTL_S) as add:
        agents = add("h", hollow=per_host)
        agents = add("r")
        c = Cluster("hollow-failover", url, tmp_path, program="hollow_steps.py", steps=steps, ttl=TTL_S,
                    extra_env={"REGENT_TEST_PROCS": str(per_host)})
        c.start()
        leader = c.wait_leader(1, timeout=60)
        standby = c.start()
        c.wait_standby()
        c.wait_step(leader, 5, timeout=120)
        os.kill(leader, signal.SIGKILL)
        out, _ = standby.communicate(timeout=240)
        assert standby.returncode == 0, c.log_tail()
        result = json.loads(out.strip().splitlines()[-1])
        assert agents["h"].poll() is None and agents["r"].poll() is None
    # The standby linked to both agents and every proc while it stood by (controller/_standby.py).
    took = [line for line in (tmp_path / "hollow-failover.ctl1.log").read_text().splitlines()
            if "took over the standby's links" in line]
    assert len(took) == 1 and "workers=10" in took[0], took
    assert [step for step, *_ in result["seen"]] == list(range(steps))
    for step, values, total, folded in result["seen"]:
        assert values == [step + 1] * 2 * per_host, (step, values)
        assert total == (step + 1) * per_host, (step, total)
        assert folded == (step + 1) * 2 * per_host, (step, folded)  # each host's fold, replayed or live
    assert [n for n, _, _ in result["folds"]] == [steps] * 2 * per_host  # each folded call ran once
    n, heard, pids = zip(*result["final"], strict=True)
    assert n == (steps,) * 2 * per_host and heard == (steps,) * 2 * per_host
    assert set(pids[:per_host]) == {agents["h"].pid}  # the hollow host's procs live in its agent
    assert len(set(pids[per_host:])) == per_host and agents["r"].pid not in pids
