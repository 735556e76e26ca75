"""asyncio programs fail over exactly (controller/loop.py).

Real controller processes run programs/async_mixed.py through `s.run`: tasks at different
speeds, a queue, a fan-out read with as_completed, a wait_for deadline that expires, sleeps.
Successive primaries are SIGKILLed at random points; each one's observations (written only
behind a later call, so durable) must be what its successors observed too, in the same order
(the last controller, which saw the whole run, holds each of theirs as a prefix), and
every call must run once on its actor.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from tests.failover.harness import Cluster

STEPS = 90


@pytest.fixture()
def cluster(tmp_path, journal_url):
    obs = tmp_path / "obs"
    obs.mkdir()
    c = Cluster(f"async-{os.getpid()}-{journal_url[:4]}", journal_url, tmp_path, program="async_mixed.py",
                steps=STEPS, extra_env={"REGENT_TEST_OBS_DIR": str(obs)})
    yield c
    c.stop_all()


def _observed(c: Cluster, pid: int) -> list:
    path = Path(c.extra_env["REGENT_TEST_OBS_DIR"]) / f"{pid}.obs"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _check_once(result: dict) -> None:
    """Each token ran once on its actor, and every token the program issued is there."""
    fast, slow, nap = result["reports"]
    for name, seen in (("fast", fast), ("slow", slow), ("nap", nap)):
        twice = {t: n for t, n in seen.items() if n != 1}
        assert not twice, f"{name}: calls run more than once: {twice}"
    assert {t for t in fast if t.startswith("f")} == {f"f{i}" for i in range(STEPS)}
    assert {t for t in slow if t.startswith("s")} == {f"s{i}" for i in range(STEPS // 3)}
    fans = {i for i in range(STEPS) if i % 10 == 9}
    assert {t for t in fast if t.startswith("a")} == {f"a{i}.0" for i in fans}
    assert {t for t in slow if t.startswith("a")} == {f"a{i}.1" for i in fans}
    assert set(nap) == {f"n{i}" for i in range(STEPS) if i % 15 == 14}


def test_an_async_program_sees_the_same_wake_ups_in_the_same_order_across_20_kills(cluster):
    c = cluster
    rng = random.Random(int(os.environ.get("REGENT_TEST_SEED", "4321")))
    c.start()
    c.start()  # standby
    pids = c.kill_leaders(20, rng, max_live_steps=4)
    assert len(pids) == 20, f"the program finished after {len(pids)} kills; make it longer"
    final_pid = c.wait_leader(len(pids) + 1, timeout=60)
    result = c.finish(c.by_pid(final_pid))
    final = result["out"]
    seen = [_observed(c, pid) for pid in pids]
    for k, before in enumerate(seen):
        assert final[:len(before)] == before, f"controller {k} saw another order than the last one"
    assert sum(1 for before in seen if before) >= 10, "too few primaries observed anything before their kill"
    # Each deadline is seen once: mostly expired; answered in time where a standby sent the
    # call again and the actor's cache replied at once, the primary having seen neither.
    deadlines = [o for o in final if o[0] == "d"]
    assert [o[1] for o in deadlines] == [i for i in range(STEPS) if i % 15 == 14]
    assert sum(1 for o in deadlines if o[2] == "timeout") >= 1
    _check_once(result)
    # The last leader replayed the run: a standby that waited, or the fresh process started after
    # the last kill that found the seat empty first (its role then says "primary").
    assert result["stats"]["replayed"] > 0


def test_a_paused_async_primary_is_deposed_and_no_call_runs_twice(cluster):
    c = cluster
    c.start()
    c.start()
    old, new_pid = c.pause_until_deposed(step=10)
    old_pid = old.pid
    assert old.returncode != 0
    log = c.log_of(old_pid).read_text()
    assert "leadership" in log and "lost" in log, log[-3000:]
    result = c.finish(c.by_pid(new_pid))
    before = _observed(c, old_pid)
    assert result["out"][:len(before)] == before
    _check_once(result)


def test_a_changed_async_program_fails_replay_naming_the_seq(cluster):
    c = cluster
    first = c.start()
    pid = c.wait_leader(1)
    c.wait_step(pid, 20)
    os.kill(pid, signal.SIGKILL)
    first.wait()
    edited = c.start(REGENT_TEST_CHANGE_AT="12")
    out, _ = edited.communicate(timeout=60)
    assert edited.returncode != 0
    text = c.log_of(edited.pid).read_text()
    assert "NonDeterminismError" in text and "non-determinism at seq " in text
    assert "call_one fast.work" in text
    assert "changed12" not in out
