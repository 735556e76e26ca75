"""Actors calling actors across controller failover: successive primaries SIGKILLed at random
points of a run in which actors call meshes they were given, spawn child meshes and stream;
every call an actor made ran once, and the last standby finishes with the results of a run
without failure (docs/design.md, "Calls made by actors"). Real controller processes."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.failover.harness import Cluster

PROGRAM = str(Path(__file__).parent / "programs" / "actor_calls_failover.py")


@pytest.fixture()
def clusters(tmp_path):
    made: list[Cluster] = []

    def make(name: str, steps: int) -> Cluster:
        c = Cluster(f"{name}-{os.getpid()}-{len(made)}", f"sqlite://{tmp_path / f'{name}.db'}", tmp_path,
                    program=PROGRAM, steps=steps)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop_all()


def test_calls_made_by_actors_run_once_across_controller_kills(clusters):
    steps = 120
    clean = clusters("clean", steps)
    expected = clean.finish(clean.start())
    for seen in expected["reports"] + expected["children"]:
        assert seen and set(seen.values()) == {1}, seen

    c = clusters("kills", steps)
    rng = random.Random(int(os.environ.get("REGENT_TEST_SEED", "2112")))
    c.start()
    c.start()  # standby
    kills = len(c.kill_leaders(6, rng, max_live_steps=12))
    assert kills == 6, f"the program finished after {kills} kills; make it longer\n{c.log_tail()}"
    result = c.finish(c.by_pid(c.wait_leader(kills + 1, timeout=60)), timeout=180)
    twice = {t: n for seen in result["reports"] + result["children"] for t, n in seen.items() if n != 1}
    assert not twice, f"calls made by actors ran more than once: {twice}"
    assert result["reports"] == expected["reports"]
    assert result["children"] == expected["children"]
    assert result["out"] == expected["out"]
    # The last leader replayed the run (it waited as a standby, or found the seat empty first).
    assert result["replayed"] > 0


RERUN = str(Path(__file__).parent / "programs" / "actor_rerun_failover.py")


def test_a_caller_run_again_after_its_proc_died_makes_the_same_calls_and_the_callee_runs_them_once(tmp_path):
    """The primary and the calling actor's proc die together: the standby re-runs the call on
    the restarted actor (at least once), which re-issues its call to the store, and its
    spawn_procs, under the same derived ids; the store answers from its cache, and the host
    agent with the proc it started."""
    c = Cluster(f"rerun-{os.getpid()}", f"sqlite://{tmp_path / 'journal.db'}", tmp_path, program=RERUN,
                extra_env={"REGENT_TEST_DIR": str(tmp_path)})
    try:
        primary = c.start()
        c.wait_leader(1)
        deadline = time.monotonic() + 60
        while not (tmp_path / "held").exists():
            assert primary.poll() is None and time.monotonic() < deadline, c.log_tail()
            time.sleep(0.01)
        standby = c.start()
        c.wait_standby()
        relay_pid = int((tmp_path / "relay.pid").read_text())
        # The primary first: one that outlived the relay by a moment would see its call fail and
        # end the run itself.
        os.kill(primary.pid, signal.SIGKILL)
        primary.wait()
        os.kill(relay_pid, signal.SIGKILL)
        result = c.finish(standby, timeout=120)
        assert (tmp_path / "relay.log").read_text().split() == ["t1", "t1"]  # the relay ran twice
        assert (tmp_path / "store.log").read_text().split() == ["t1", "far-t1"]  # each store once
        first, again = (tmp_path / "spawned.log").read_text().split()
        assert first == again  # the re-run's spawn_procs got the proc the first run started
        assert result == {"answer": "stored t1 as put 1; stored far-t1 as put 1", "puts": 1,
                          "role": "standby-took-over"}
    finally:
        c.stop_all()
