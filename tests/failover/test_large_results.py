"""A result too large for the journal is kept there as its digest: a standby observes the
same value (from the proc that still holds it) or stops, saying which result and what to do.
A value whose digest differs from the journal's never reaches the program."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.failover.harness import PROGRAMS


def _run(mode: str, session: str, journal: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROGRAMS / "big_result.py")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "MODE": mode, "SESSION": session, "JOURNAL": journal,
                                            "PYTHONUNBUFFERED": "1", **env})


def _digest(out: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.startswith("DIGEST ")]
    return line.split()[1]


@pytest.fixture
def journal(tmp_path) -> str:
    return f"sqlite://{tmp_path / 'j.db'}"


def test_a_standby_reads_a_digest_only_result_again_from_the_proc_that_holds_it(journal):
    session = f"big-kept-{os.getpid()}"
    primary = _run("primary", session, journal)
    assert primary.returncode == 0, primary.stderr[-2000:]
    standby = _run("standby", session, journal)
    assert standby.returncode == 0, standby.stderr[-2000:]
    assert _digest(standby.stdout) == _digest(primary.stdout)
    assert "DONE" in standby.stdout


def test_a_standby_stops_when_a_digest_only_result_comes_back_different(journal):
    """The proc died with the primary; its restarted actor runs the call again and returns
    other bytes: the standby refuses them and names the result and the remedies."""
    session = f"big-lost-{os.getpid()}"
    primary = _run("primary-kill-proc", session, journal)
    assert primary.returncode == 0, primary.stderr[-2000:]
    standby = _run("standby", session, journal)
    assert standby.returncode == 3, (standby.stdout, standby.stderr[-3000:])
    assert "DIGEST" not in standby.stdout
    assert re.search(r"seq \d+ \(b\.blob point 0\): the journal keeps its 2000\d\d-byte result as a "
                     "digest only, and the call, sent again, returned a different value", standby.stdout)
    assert "RDMA" in standby.stdout and "REGENT_JOURNAL_VALUE_BYTES" in standby.stdout


def test_a_larger_journal_value_limit_journals_the_value_so_any_standby_replays_it(journal):
    session = f"big-journaled-{os.getpid()}"
    env = {"REGENT_JOURNAL_VALUE_BYTES": str(256 * 1024)}
    primary = _run("primary-kill-proc", session, journal, **env)
    assert primary.returncode == 0, primary.stderr[-2000:]
    standby = _run("standby", session, journal, **env)
    assert standby.returncode == 0, standby.stderr[-2000:]
    assert _digest(standby.stdout) == _digest(primary.stdout)


@pytest.mark.parametrize("mode", ["primary", "primary-outstanding"])
def test_a_large_tensor_result_through_shared_memory_survives_a_failover_and_leaves_no_segment(journal, mode):
    """The result travels through /dev/shm (wire.bulk): read by the primary, or still being made
    when the primary dies. The standby gets the same bytes (the journal keeps their digest) or
    the value the call made, and no segment of the primary or of the proc is left behind."""
    from regent.wire import bulk

    session = f"big-tensor-{mode}-{os.getpid()}"
    env = {"BLOB": "tensor", "DELAY": "2.0" if mode == "primary-outstanding" else "0"}
    primary = _run(mode, session, journal, **env)
    proc = int(re.search(r"PROC (\d+)", primary.stdout).group(1))
    standby = _run("standby", session, journal, **env)
    assert standby.returncode == 0, standby.stderr[-2000:]
    if mode == "primary":
        assert primary.returncode == 0 and _digest(standby.stdout) == _digest(primary.stdout)
    else:
        assert primary.returncode == -9 and "DIGEST" not in primary.stdout and "DIGEST" in standby.stdout
    assert f"PROC {proc}" in standby.stdout  # the same proc served both
    # The proc stops with the session, and its segments go with it: unlinked at its exit, or swept
    # by an agent once it is dead. A standby that lost its (1 s) lease on a loaded machine leaves
    # the proc to its orphan timeout instead (a deposed controller stops nothing): it is killed
    # here then, as that timeout would end it, and the sweep must find what it left.
    deadline = time.monotonic() + 30
    while _running(proc) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _running(proc):
        assert "leadership lost" in standby.stderr, f"proc {proc} outlived its session:\n{standby.stderr[-3000:]}"
        os.kill(proc, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while left := bulk.held(proc) + bulk.held(primary_pid(primary)):
        assert time.monotonic() < deadline, f"segments left in /dev/shm: {left}"
        time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def primary_pid(run: subprocess.CompletedProcess) -> int:
    return int(re.search(r"PID (\d+)", run.stdout).group(1))


def test_a_journal_value_limit_below_the_workers_is_refused():
    from regent.controller.edge import journal_value_limit

    os.environ["REGENT_JOURNAL_VALUE_BYTES"] = "1000"
    try:
        with pytest.raises(ValueError, match="REGENT_JOURNAL_VALUE_BYTES"):
            journal_value_limit()
    finally:
        del os.environ["REGENT_JOURNAL_VALUE_BYTES"]
