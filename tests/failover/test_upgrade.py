"""`regent upgrade SESSION PROGRAM.py` on a running session (real controllers, SQLite and etcd):
a v2 guarded by s.patched takes over from the v1 primary through the store, each call once, the
same actor; an incompatible v3 is refused with the seq named and v1 runs on; --dry-run changes
nothing; standbys of the old program, once the session runs the new one, refuse to take over.

The v1 primary waits at a step on a hold file until the test has done what it needs of the
running session: under load it would otherwise finish first (CI: "no controller leads")."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from regent.controller.upgrade import EXIT_OTHER_PROGRAM, handover_request
from regent.journal import open_journal
from regent.journal.standbys import StandbyPresence, standbys
from tests.failover.harness import PROGRAMS, Cluster

STEPS = 24


def _cluster(tmp_path: Path, journal_url: str, program: Path) -> Cluster:
    # PYTHONPATH: the train_v*.py copies import common from the programs' folder.
    path = os.pathsep.join(filter(None, [str(PROGRAMS), os.environ.get("PYTHONPATH")]))
    return Cluster(f"up-{uuid.uuid4().hex[:6]}", journal_url, tmp_path, program=str(program), steps=STEPS,
                   extra_env={"REGENT_TEST_STEP_S": "0.02", "PYTHONPATH": path})


def _v1_held(tmp_path: Path, journal_url: str, at: int,
             program: Path = PROGRAMS / "versioned.py") -> tuple[Cluster, subprocess.Popen, Path]:
    """A v1 primary of a new session, waiting after its step `at` until the hold file is gone."""
    c = _cluster(tmp_path, journal_url, program)
    hold = tmp_path / f"{c.session}.hold"
    hold.touch()
    v1 = c.start(REGENT_TEST_VERSION="v1", REGENT_TEST_HOLD_FILE=str(hold), REGENT_TEST_HOLD_AT=str(at))
    try:
        c.wait_step(c.wait_leader(1), at)
    except BaseException:
        c.stop_all()
        raise
    return c, v1, hold


def _upgrade_args(c: Cluster, *extra: str, program: Path = PROGRAMS / "versioned.py") -> list[str]:
    return [sys.executable, "-m", "regent.cli", "upgrade", c.session, str(program), "--journal", c.journal, *extra]


def _upgrade(c: Cluster, version: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(_upgrade_args(c, *extra), env=c.env(REGENT_TEST_VERSION=version), capture_output=True,
                          text=True, timeout=120)


def _start_upgrade(c: Cluster, version: str, log: Path, program: Path = PROGRAMS / "versioned.py",
                   preexec_fn: Any = None, **env: str) -> subprocess.Popen:
    """`regent upgrade` in the background (it becomes the new controller), its output in files."""
    return subprocess.Popen(_upgrade_args(c, program=program), env=c.env(REGENT_TEST_VERSION=version, **env),
                            stdout=open(log.with_suffix(".out"), "w"), stderr=open(log, "w"), text=True,
                            preexec_fn=preexec_fn)


def _wait_handover_asked(c: Cluster, primary: subprocess.Popen, upgrade: subprocess.Popen, log: Path,
                         timeout: float = 90.0) -> None:
    """Until the upgrade has passed its check and asked the primary, through the store, to hand
    over, and the primary has seen the request (it hands over at its next session call)."""
    deadline = time.monotonic() + timeout
    with open_journal(c.journal) as j:
        while True:
            leader = j.backend.leader(c.session)
            if leader is not None and handover_request(j.backend, c.session, leader[1]) is not None:
                break
            if upgrade.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the upgrade asked for no hand-over (exit {upgrade.poll()}):\n"
                                     f"{log.read_text()[-3000:]}")
            time.sleep(0.02)
    while "a hand-over was asked for through the store" not in c.log_of(primary.pid).read_text():
        assert time.monotonic() < deadline, c.log_tail()
        time.sleep(0.01)


def test_an_upgrade_to_a_patched_program_takes_over_and_runs_each_call_once(tmp_path, journal_url) -> None:
    k = random.Random().randint(3, STEPS - 4)  # v1 hands over after its call of step k
    c, v1, hold = _v1_held(tmp_path, journal_url, k)
    log = tmp_path / "upgrade.err"
    up = _start_upgrade(c, "v2", log)
    try:
        _wait_handover_asked(c, v1, up, log)
        hold.unlink()  # v1 steps down at its next session call
        v1_out, _ = v1.communicate(timeout=60)
        up.wait(timeout=120)
    finally:
        c.stop_all()
        if up.poll() is None:
            up.kill()
    err = log.read_text()
    assert up.returncode == 0, err[-3000:]
    assert v1.returncode == 0 and not v1_out.strip(), "the primary asked to hand over exits 0, its run unfinished"
    assert "handed over by the primary of epoch" in err and "replayed through seq" in err, err
    result = json.loads(log.with_suffix(".out").read_text().strip().splitlines()[-1])
    assert result["version"] == "v2" and result["role"] == "standby-took-over"
    ran = result["ran"]
    # One actor all along (its log holds v1's calls too), every call once and in order: v1's
    # calls through a{k}; v2 replays them and, past the journal's end, s.patched is live: the
    # extra call from step k on.
    assert [t for t in ran if t.startswith("a")] == [f"a{i}" for i in range(STEPS)]
    extras = [int(t[1:]) for t in ran if t.startswith("x")]
    assert extras == list(range(k, STEPS)), ran
    assert ran.index(f"x{k}") == ran.index(f"a{k}") + 1
    assert result["n"] == STEPS + 10 * len(extras)
    # The new program named itself in the journal before its first live call.
    with open_journal(c.journal) as j:
        kinds = [r.kind for r in j.read(c.session)]
    assert kinds.count("program") == 1


def test_an_incompatible_upgrade_is_refused_naming_the_seq_and_the_primary_runs_on(tmp_path, journal_url) -> None:
    c, v1, hold = _v1_held(tmp_path, journal_url, 3)
    try:
        refused = _upgrade(c, "v3")
        dry = _upgrade(c, "v2", "--dry-run")
        assert v1.poll() is None, "v1 holds at step 3 until both checks have run"
        hold.unlink()
        result = c.finish(v1)
    finally:
        c.stop_all()
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert re.search(r"non-determinism at seq \d+: the journal records call_one c\.add", refused.stderr), refused.stderr
    assert "refused; the primary" in refused.stderr
    assert "s.patched" in refused.stderr
    assert dry.returncode == 0 and "would go through" in dry.stderr, dry.stderr[-3000:]
    assert result["version"] == "v1" and result["role"] == "primary" and result["n"] == STEPS
    # v1 was never deposed (it finished its run as primary); the checks replayed in the upgrade
    # processes, which open no socket to a worker (controller/audit.py).


def _program_file(tmp_path: Path, version: str) -> Path:
    """versioned.py as a file of its own per version, as a changed program is (the session
    knows programs by their file's digest)."""
    path = tmp_path / f"train_{version}.py"
    path.write_text((PROGRAMS / "versioned.py").read_text() + f"\n# {version}\n")
    return path


def test_after_the_new_program_is_killed_an_old_standby_refuses_and_a_new_one_finishes(
        tmp_path, journal_url) -> None:
    old_file, new_file = _program_file(tmp_path, "v1"), _program_file(tmp_path, "v2")
    c, v1, hold = _v1_held(tmp_path, journal_url, 3, program=old_file)
    log = tmp_path / "upgrade.err"
    v2_hold = tmp_path / "v2.hold"
    v2_hold.touch()
    # v2 takes over after v1's call of step 3 and waits after step 5: it has run calls v1
    # knows nothing of.
    up = _start_upgrade(c, "v2", log, new_file, REGENT_TEST_HOLD_FILE=str(v2_hold), REGENT_TEST_HOLD_AT="5")
    try:
        _wait_handover_asked(c, v1, up, log)
        hold.unlink()
        assert v1.wait(timeout=60) == 0
        deadline = time.monotonic() + 60
        while "step 5\n" not in log.read_text():
            assert up.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.01)
        old = c.start(REGENT_TEST_VERSION="v1")  # old_file, as v1's
        c.wait_standby()
        os.kill(up.pid, signal.SIGKILL)  # the new program dies right after the hand-over
        up.wait()
        old.communicate(timeout=60)
        old_log = (tmp_path / f"{c.session}.ctl1.log").read_text()
        c.program = str(new_file)
        new = c.start(REGENT_TEST_VERSION="v2")
        result = c.finish(new)
    finally:
        c.stop_all()
        if up.poll() is None:
            up.kill()
    # The old standby won the election, saw the new program's record and stepped aside.
    assert old.returncode == EXIT_OTHER_PROGRAM, old_log[-3000:]
    assert "runs another program since `regent upgrade`" in old_log and str(new_file) in old_log, old_log
    assert old.pid not in c.leaders()
    # The v2 standby replayed v1's steps and v2's, and finished: every call once.
    assert result["version"] == "v2"
    ran = result["ran"]
    assert [t for t in ran if t.startswith("a")] == [f"a{i}" for i in range(STEPS)]
    assert [int(t[1:]) for t in ran if t.startswith("x")] == list(range(3, STEPS)), ran
    assert result["n"] == STEPS + 10 * (STEPS - 3)


def test_an_upgrade_of_a_session_nobody_leads_says_so(tmp_path) -> None:
    env = {**os.environ, "REGENT_TEST_VERSION": "v2"}
    done = subprocess.run([sys.executable, "-m", "regent.cli", "upgrade", "nobody", str(PROGRAMS / "versioned.py"),
                           "--journal", f"sqlite://{tmp_path / 'j.db'}"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "no controller leads session 'nobody'" in done.stderr, done.stderr


def test_a_controller_steps_aside_for_the_program_a_session_is_handed_to_or_runs(tmp_path, monkeypatch) -> None:
    # The decision alone, over a real store: what a controller about to resume a run reads.
    from types import SimpleNamespace

    from regent.controller import upgrade

    mine, theirs = {"path": "/jobs/train_v1.py", "digest": "a" * 64}, {"path": "/jobs/train_v2.py", "digest": "b" * 64}
    monkeypatch.setattr(upgrade, "THIS_PROGRAM", mine)
    monkeypatch.delenv(upgrade.UPGRADE_ENV, raising=False)
    with open_journal(f"sqlite://{tmp_path / 'j.db'}") as j:
        backend = j.backend
        never_upgraded = SimpleNamespace(program=None, epochs=[1])
        assert upgrade.takeover_check(backend, "s", never_upgraded) == (None, False)
        # The new program runs the session since an upgrade: its record.
        refusal, _ = upgrade.takeover_check(backend, "s", SimpleNamespace(program=theirs, epochs=[1]))
        assert refusal is not None and "runs another program since `regent upgrade`" in refusal
        assert "/jobs/train_v2.py" in refusal and "/jobs/train_v1.py" in refusal
        assert upgrade.takeover_check(backend, "s", SimpleNamespace(program=mine, epochs=[1])) == (None, False)
        # In the instant of the hand-over the journal has no record yet; the request names the
        # program, while its requester stands by.
        monkeypatch.setattr(upgrade, "THIS_PROGRAM", theirs)
        upgrade.request_handover(backend, "s", 1, "new-holder")
        monkeypatch.setattr(upgrade, "THIS_PROGRAM", mine)
        assert upgrade.takeover_check(backend, "s", never_upgraded) == (None, False), "no requester stands by"
        presence = StandbyPresence(backend, "s", "new-holder", {})
        deadline = time.monotonic() + 10
        while not standbys(backend, "s"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        refusal, _ = upgrade.takeover_check(backend, "s", never_upgraded)
        assert refusal is not None and "is being handed over to another program" in refusal and "new-holder" in refusal
        # A standby of the program it is handed to may take over, and journals itself as the run's.
        monkeypatch.setattr(upgrade, "THIS_PROGRAM", theirs)
        assert upgrade.takeover_check(backend, "s", never_upgraded) == (None, True)
        # The program `regent upgrade` started was checked by replaying: it takes over and says so.
        monkeypatch.setattr(upgrade, "THIS_PROGRAM", mine)
        monkeypatch.setenv(upgrade.UPGRADE_ENV, "s")
        assert upgrade.takeover_check(backend, "s", never_upgraded) == (None, True)
        # Its requester gone (stopped, or its record expired), the request asks nothing.
        presence.stop(wait_s=5.0)
        monkeypatch.delenv(upgrade.UPGRADE_ENV)
        assert upgrade.takeover_check(backend, "s", never_upgraded) == (None, False)
