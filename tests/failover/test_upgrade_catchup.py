"""The program `regent upgrade` starts catches up with the running session before it leads
(controller/catchup.py): it replays the journal as the primary goes on writing it, asks for the
hand-over once at its end, and goes live there; or takes over at its end when the primary dies
instead. Real controllers and workers, SQLite and etcd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from regent.controller.replay import CALL, CALLS, PROGRAM
from regent.journal import open_journal
from tests.failover.harness import PROGRAMS, Cluster, check_exactly_once
from tests.failover.test_upgrade import STEPS, _cluster, _start_upgrade, _v1_held

CAUGHT_UP = "caught up with the journal; asking the primary to hand over"
LEADING = "caught up and leading; the program goes on live"


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} (exit {proc.poll()}):\n{path.read_text()[-3000:]}")
        time.sleep(0.01)


def _upgrade_to_itself(c: Cluster, log: Path) -> subprocess.Popen:
    """`regent upgrade` of `c`'s session to the program it runs, its JSON line on stdout."""
    return subprocess.Popen([sys.executable, "-m", "regent.cli", "upgrade", c.session, str(PROGRAMS / c.program),
                             "--journal", c.journal], env=c.env(), stdout=subprocess.PIPE, stderr=open(log, "w"),
                            text=True)


def _live_calls_after(journal: str, session: str) -> int:
    """Calls journaled after the new program's PROGRAM record: what it ran live."""
    with open_journal(journal) as j:
        records = list(j.read(session))
    at = max(i for i, r in enumerate(records) if r.kind == PROGRAM)
    return sum(1 for r in records[at:] if r.kind == CALL) + sum(
        sum(1 for item in r.data["items"] if len(item) in (7, 8)) for r in records[at:] if r.kind == CALLS)


def test_mixed_calls_are_caught_up_with_a_running_primary_and_each_runs_once(tmp_path, journal_url) -> None:
    # The primary is not held: it goes on calling (calls, broadcasts, choose, streams, slices)
    # while the new program follows the journal, and hands over at its next call once asked.
    c = Cluster(f"cu-{os.urandom(3).hex()}", journal_url, tmp_path, steps=40,
                extra_env={"REGENT_TEST_STEP_S": "0.05", "PYTHONPATH": str(PROGRAMS)})
    hold = tmp_path / "primary.hold"  # held from step 3 until the new program stands by: not done before
    hold.touch()
    primary = c.start(REGENT_TEST_HOLD_FILE=str(hold))
    log = tmp_path / "upgrade.err"
    try:
        c.wait_step(c.wait_leader(1), 3)
        up = _upgrade_to_itself(c, log)
        _wait_for(log, "standing by", up)
        hold.unlink()  # the primary calls on while the new program follows the journal
        out, _ = up.communicate(timeout=120)
        primary_out, _ = primary.communicate(timeout=60)
    finally:
        c.stop_all()
        if "up" in locals() and up.poll() is None:
            up.kill()
    err = log.read_text()
    assert up.returncode == 0, err[-3000:]
    assert primary.returncode == 0 and not primary_out.strip(), "the primary handed over, its run unfinished"
    assert CAUGHT_UP in err and LEADING in err and "handed over by the primary of epoch" in err, err[-3000:]
    assert "took over the standby's links" in err, err[-3000:]  # linked to the workers while it caught up
    result = json.loads(out.strip().splitlines()[-1])
    assert result["role"] == "standby-took-over"
    check_exactly_once(result, 40)
    assert len(set(result["pids"])) == 3
    assert result["stats"]["replayed"] > 0 and _live_calls_after(c.journal, c.session) > 0


def test_a_catching_up_program_takes_over_at_the_journals_end_when_the_primary_dies(tmp_path, journal_url) -> None:
    k = 5
    c, v1, hold = _v1_held(tmp_path, journal_url, k)
    log = tmp_path / "upgrade.err"
    up = _start_upgrade(c, "v2", log)
    try:
        _wait_for(log, CAUGHT_UP, up)  # it replayed v1's steps and waits at the journal's end
        v1.send_signal(signal.SIGKILL)  # held after step k, with no call in flight: it never hands over
        v1.wait()
        up.wait(timeout=120)
    finally:
        c.stop_all()
        if up.poll() is None:
            up.kill()
    err = log.read_text()
    assert up.returncode == 0, err[-3000:]
    assert LEADING in err, err[-3000:]
    result = json.loads(log.with_suffix(".out").read_text().strip().splitlines()[-1])
    ran = result["ran"]
    assert [t for t in ran if t.startswith("a")] == [f"a{i}" for i in range(STEPS)]
    assert [int(t[1:]) for t in ran if t.startswith("x")] == list(range(k, STEPS)), ran
    assert result["n"] == STEPS + 10 * (STEPS - k) and result["role"] == "standby-took-over"


def test_an_async_program_is_caught_up_mid_run_with_the_same_wake_ups(tmp_path, journal_url) -> None:
    # s.run's tasks, a queue, as_completed, an expiring wait_for and sleeps: the loop's journaled
    # wake-ups are followed as they are written, and the hand-over lands between two of them.
    from tests.failover.test_async_failover import STEPS as ASYNC_STEPS
    from tests.failover.test_async_failover import _check_once, _observed

    obs = tmp_path / "obs"
    obs.mkdir()
    c = Cluster(f"cua-{os.urandom(3).hex()}", journal_url, tmp_path, program="async_mixed.py", steps=ASYNC_STEPS,
                extra_env={"REGENT_TEST_OBS_DIR": str(obs), "PYTHONPATH": str(PROGRAMS), "REGENT_TEST_STEP_S": "0.04"})
    hold = tmp_path / "primary.hold"  # held from step 10 until the new program stands by: not done before
    hold.touch()
    primary = c.start(REGENT_TEST_HOLD_FILE=str(hold))
    log = tmp_path / "upgrade.err"
    try:
        pid = c.wait_leader(1)
        deadline = time.monotonic() + 60
        while len(_observed(c, pid)) < 10:
            assert primary.poll() is None and time.monotonic() < deadline, c.log_tail()
            time.sleep(0.01)
        up = _upgrade_to_itself(c, log)
        _wait_for(log, "standing by", up)
        hold.unlink()
        out, _ = up.communicate(timeout=120)
        primary.wait(timeout=60)
    finally:
        c.stop_all()
        if "up" in locals() and up.poll() is None:
            up.kill()
    err = log.read_text()
    assert up.returncode == 0 and primary.returncode == 0, err[-3000:]
    assert LEADING in err, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    before = _observed(c, pid)
    assert before and result["out"][:len(before)] == before, "the new program saw another order than the primary"
    _check_once(result)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_upgrade_stopped_before_the_hand_over_leaves_the_primary_running(tmp_path, journal_url, stop) -> None:
    # Ctrl-C in `regent upgrade` once it has caught up and asked, while the primary is inside a
    # long step of its own code: the request goes with the standby's record, the primary checks
    # it again at its next session call, finds its requester gone, and finishes the run itself.
    c, v1, hold = _v1_held(tmp_path, journal_url, 4)
    log = tmp_path / "upgrade.err"
    # Ctrl-C's SIGINT as a terminal delivers it: a test run in the background (`cmd &` in a
    # script) would otherwise hand the program SIGINT ignored.
    up = _start_upgrade(c, "v2", log, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
    try:
        _wait_for(log, CAUGHT_UP, up)
        primary_log = c.log_of(v1.pid)
        _wait_for(primary_log, "a hand-over was asked for through the store", v1)
        up.send_signal(stop)
        assert up.wait(timeout=30) != 0
        hold.unlink()
        result = c.finish(v1)
    finally:
        c.stop_all()
        if up.poll() is None:
            up.kill()
    assert "no longer stands by" in primary_log.read_text()
    assert result["version"] == "v1" and result["role"] == "primary" and result["n"] == STEPS
    assert result["ran"] == [f"a{i}" for i in range(STEPS)]


def test_a_restart_journaled_while_catching_up_makes_the_program_catch_up_again(tmp_path, journal_url) -> None:
    # The counter's proc dies while v1 holds after step 4 and the new program waits at the
    # journal's end: v1's supervisor restarts it and journals so. A takeover applies restarts as
    # it replays each spawn, so the new program starts over (exec) and catches up again.
    from regent.worker.procinfo import running_procs

    c = _cluster(tmp_path, journal_url, PROGRAMS / "versioned.py")
    c.extra_env["REGENT_TEST_RESTART"] = "1"
    hold = tmp_path / f"{c.session}.hold"
    hold.touch()
    v1 = c.start(REGENT_TEST_VERSION="v1", REGENT_TEST_HOLD_FILE=str(hold), REGENT_TEST_HOLD_AT="4")
    log = tmp_path / "upgrade.err"
    try:
        c.wait_step(c.wait_leader(1), 4)
        up = _start_upgrade(c, "v2", log)
        _wait_for(log, CAUGHT_UP, up)
        (proc,) = [p for p in running_procs() if p.session.startswith(f"{c.session}.")]
        os.kill(proc.pid, signal.SIGKILL)
        _wait_for(log, "catching up again from the start", up)
        deadline = time.monotonic() + 60
        while log.read_text().count(CAUGHT_UP) < 2:
            assert up.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.01)
        hold.unlink()
        assert v1.wait(timeout=60) == 0
        up.wait(timeout=120)
    finally:
        c.stop_all()
        if "up" in locals() and up.poll() is None:
            up.kill()
    err = log.read_text()
    assert up.returncode == 0 and LEADING in err, err[-3000:]
    result = json.loads(log.with_suffix(".out").read_text().strip().splitlines()[-1])
    assert result["version"] == "v2" and result["pid"] != proc.pid
    # The restarted counter saw the calls from step 5 on, each once, and v2's from its hand-over:
    # after step 4, or a step or more later when v1 found the first request's program gone (it
    # started over) before the second one asked.
    ran = result["ran"]
    assert [t for t in ran if t.startswith("a")] == [f"a{i}" for i in range(5, STEPS)], ran
    extras = [int(t[1:]) for t in ran if t.startswith("x")]
    assert extras and extras[0] >= 4 and extras == list(range(extras[0], STEPS)), ran


def test_a_checkpointed_program_is_caught_up_from_its_checkpoint(tmp_path, journal_url) -> None:
    # `resume` skips to the run's checkpoint while catching up; the calls after it are followed
    # as they are journaled, and each step still runs once on each actor.
    steps = 60
    c = Cluster(f"cuk-{os.urandom(3).hex()}", journal_url, tmp_path, program="checkpointed.py", steps=steps,
                extra_env={"REGENT_TEST_STEP_S": "0.03", "PYTHONPATH": str(PROGRAMS)})
    hold = tmp_path / "primary.hold"  # held after step 25 until the new program stands by
    hold.touch()
    primary = c.start(REGENT_TEST_HOLD_FILE=str(hold), REGENT_TEST_HOLD_AT="25")
    log = tmp_path / "upgrade.err"
    try:
        c.wait_step(c.wait_leader(1), 25)  # checkpoints at steps 10 and 20 are behind it
        up = _upgrade_to_itself(c, log)
        _wait_for(log, "standing by", up)
        hold.unlink()
        out, _ = up.communicate(timeout=120)
        primary.wait(timeout=60)
    finally:
        c.stop_all()
        if "up" in locals() and up.poll() is None:
            up.kill()
    err = log.read_text()
    assert up.returncode == 0 and primary.returncode == 0 and LEADING in err, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["acc"] == sum(4 * i for i in range(steps))
    for seen in result["reports"]:
        assert {int(k): n for k, n in seen.items()} == {i: 1 for i in range(-steps, steps)}, seen


def test_an_upgrade_of_a_run_that_ended_since_its_check_starts_nothing(tmp_path, monkeypatch) -> None:
    # The primary finished between `regent upgrade`'s check and the new program's start: the new
    # program says so and exits 0, rather than begin a new run of its own.
    from regent.controller import Session
    from regent.controller.edge import RunFinished

    url = f"sqlite://{tmp_path / 'j.db'}"
    with Session("ended", journal=url) as s:
        s.now()
    monkeypatch.setenv("REGENT_UPGRADE", "ended")
    with pytest.raises(RunFinished) as e:
        Session("ended", journal=url)
    assert e.value.code == 0 and "its run ended before this program could take it over" in e.value.message
    with open_journal(url) as j:
        assert [r.kind for r in j.read("ended")].count("start") == 1, "no new run began"
