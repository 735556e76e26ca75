"""A concurrent call in flight when the primary dies runs once: the standby sends it again
under its call id, the proc joins the running call (DESIGN invariant 2), and a later call
the standby makes opens it. Real controller processes, a SQLite journal."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.failover.harness import Cluster

PROGRAM = str(Path(__file__).parent / "programs" / "gate_failover.py")


def test_a_concurrent_call_waiting_when_the_primary_dies_runs_once_and_answers_the_standby(tmp_path):
    c = Cluster(f"gate-{os.getpid()}", f"sqlite://{tmp_path / 'journal.db'}", tmp_path, program=PROGRAM)
    try:
        primary = c.start(REGENT_TEST_HOLD="1")
        c.wait_leader(1)
        log = tmp_path / f"{c.session}.ctl0.log"
        deadline = time.monotonic() + 30
        while "holding" not in log.read_text():
            assert primary.poll() is None and time.monotonic() < deadline, c.log_tail()
            time.sleep(0.01)
        standby = c.start()
        c.wait_standby()
        os.kill(primary.pid, signal.SIGKILL)
        primary.wait()
        result = c.finish(standby, timeout=60)
        assert result == {"wait": "opened after 1 wait(s)", "runs": 1, "role": "standby-took-over"}
    finally:
        c.stop_all()
