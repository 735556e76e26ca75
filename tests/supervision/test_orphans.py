"""A session nobody controls stops holding its procs; a failover never looks like that."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from regent.worker.procinfo import running

PROGRAM = Path(__file__).with_name("orphan_program.py")


def _start(session: str, orphan_s: float, idle_s: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(PROGRAM), session, str(orphan_s), str(idle_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def test_procs_of_an_abandoned_session_are_stopped_after_the_orphan_timeout():
    ctl = _start(f"orphaned-{os.getpid()}", 2.0, 600)
    info = json.loads(ctl.stdout.readline())
    os.kill(ctl.pid, signal.SIGKILL)
    ctl.wait()
    time.sleep(1.0)
    assert all(running(p) for p in info["pids"]), "stopped before the orphan timeout"
    deadline = time.monotonic() + 10
    while any(running(p) for p in info["pids"]):
        assert time.monotonic() < deadline, "orphaned procs still running"
        time.sleep(0.1)


def test_a_failover_inside_the_orphan_timeout_keeps_the_procs():
    session = f"adopted-{os.getpid()}"
    first = _start(session, 4.0, 600)
    info = json.loads(first.stdout.readline())
    standby = _start(session, 4.0, 6)
    time.sleep(0.5)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    # The standby replays to the same procs and keeps them beyond the orphan timeout.
    replayed = json.loads(standby.stdout.readline())
    assert replayed["pids"] == info["pids"] and replayed["leader"] == standby.pid
    time.sleep(5.0)
    assert all(running(p) for p in info["pids"])
    standby.wait(timeout=30)
