"""`regent upgrade SESSION PROGRAM.py` on a running session (real controllers, SQLite and etcd):
a v2 guarded by s.patched takes over from the v1 primary through the store, each call once, the
same actor; an incompatible v3 is refused with the seq named and v1 runs on; --dry-run changes
nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

from tests.failover.harness import PROGRAMS, Cluster

STEPS = 40


def _cluster(tmp_path, journal_url) -> Cluster:
    return Cluster(f"up-{uuid.uuid4().hex[:6]}", journal_url, tmp_path, program="versioned.py", steps=STEPS,
                   extra_env={"REGENT_TEST_STEP_S": "0.1"})


def _v1_running(tmp_path, journal_url) -> tuple[Cluster, subprocess.Popen]:
    """A v1 primary of a new session, past its step 3."""
    c = _cluster(tmp_path, journal_url)
    v1 = c.start(REGENT_TEST_VERSION="v1")
    try:
        c.wait_step(c.wait_leader(1), 3)
    except BaseException:
        c.stop_all()
        raise
    return c, v1


def _upgrade(c: Cluster, version: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "regent.cli", "upgrade", c.session, str(PROGRAMS / "versioned.py"),
                           "--journal", c.journal, *extra], env=c.env(REGENT_TEST_VERSION=version),
                          capture_output=True, text=True, timeout=120)


def test_an_upgrade_to_a_patched_program_takes_over_and_runs_each_call_once(tmp_path, journal_url) -> None:
    c, v1 = _v1_running(tmp_path, journal_url)
    try:
        done = _upgrade(c, "v2")
        v1_out, _ = v1.communicate(timeout=60)
    finally:
        c.stop_all()
    assert done.returncode == 0, done.stderr[-3000:]
    assert v1.returncode == 0 and not v1_out.strip(), "the primary asked to hand over exits 0, its run unfinished"
    assert "handed over by the primary of epoch" in done.stderr and "replayed through seq" in done.stderr, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["version"] == "v2" and result["role"] == "standby-took-over"
    ran = result["ran"]
    # One actor all along (its log holds v1's calls too), every call once and in order: v1's
    # steps, then v2's from the step it took over at, each with its extra call.
    assert [t for t in ran if t.startswith("a")] == [f"a{i}" for i in range(STEPS)]
    extras = [int(t[1:]) for t in ran if t.startswith("x")]
    k = extras[0]
    assert 3 <= k < STEPS and extras == list(range(k, STEPS)), ran
    assert ran.index(f"x{k}") == ran.index(f"a{k}") + 1
    assert result["n"] == STEPS + 10 * len(extras)


def test_an_incompatible_upgrade_is_refused_naming_the_seq_and_the_primary_runs_on(tmp_path, journal_url) -> None:
    c, v1 = _v1_running(tmp_path, journal_url)
    try:
        refused = _upgrade(c, "v3")
        dry = _upgrade(c, "v2", "--dry-run")
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


def test_an_upgrade_of_a_session_nobody_leads_says_so(tmp_path) -> None:
    env = {**os.environ, "REGENT_TEST_VERSION": "v2"}
    done = subprocess.run([sys.executable, "-m", "regent.cli", "upgrade", "nobody", str(PROGRAMS / "versioned.py"),
                           "--journal", f"sqlite://{tmp_path / 'j.db'}"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "no controller leads session 'nobody'" in done.stderr, done.stderr
