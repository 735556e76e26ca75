"""A controller's metrics across a failover (real controllers, SQLite and etcd): the primary
leads and counts its calls, its standby serves its own metrics while it waits (not leading, its
lag the journal it would replay), and after the primary's SIGKILL the standby counts the
takeover once, leads at a higher epoch, and has nothing left to replay."""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import uuid

from tests.failover.harness import Cluster, check_exactly_once
from tests.runtime.test_metrics import scrape, value
from tests.support.etcd import free_port

STEPS = 8


def _scrape(port: int, timeout: float = 30.0) -> dict:
    """A controller's metrics; its server is up from before it campaigns, retried while it starts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(f"http://127.0.0.1:{port}/metrics")
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_takeover_is_counted_once_by_the_new_leader(tmp_path, journal_url) -> None:
    hold = tmp_path / "hold"
    hold.touch()  # each leader waits at its first live step from 3 on, until the test lets go
    c = Cluster(f"met-{uuid.uuid4().hex[:6]}", journal_url, tmp_path, steps=STEPS,
                extra_env={"REGENT_TEST_HOLD_FILE": str(hold)})
    p1, p2 = free_port(), free_port()
    try:
        primary, standby = c.primary_and_standby(primary_env={"REGENT_METRICS_ADDR": f"127.0.0.1:{p1}"},
                                                 standby_env={"REGENT_METRICS_ADDR": f"127.0.0.1:{p2}"})
        first, waiting = _scrape(p1), _scrape(p2)
        epoch = value(first, "regent_leader_epoch")
        assert value(first, "regent_leader") == 1 and epoch >= 1
        assert value(first, "regent_calls_total", kind="call", mesh="w", endpoint="work") == 1
        assert value(first, "regent_journal_appends_total") > 0
        assert value(waiting, "regent_leader") == 0 and value(waiting, "regent_takeovers_total") == 0
        assert value(waiting, "regent_standby_lag_records") > 0
        assert value(waiting, "regent_leader_epoch") == epoch

        os.kill(primary, signal.SIGKILL)
        c.by_pid(primary).wait()
        assert c.wait_leader(2, timeout=60) == standby.pid
        c.wait_step(standby.pid, 4)  # replayed steps 0-3, runs step 4 live
        after = _scrape(p2)
        assert value(after, "regent_takeovers_total") == 1
        assert value(after, "regent_takeover_duration_seconds_count") == 1
        assert value(after, "regent_leader") == 1 and value(after, "regent_leader_epoch") > epoch
        assert value(after, "regent_standby_lag_records") == 0 and value(after, "regent_replay_remaining_calls") == 0
        # The standby counts the calls it made live, not those it replayed: step 0's call was
        # the primary's, and step 5's is still to come.
        assert value(after, "regent_calls_total", kind="call", mesh="w", endpoint="work") == 0
        hold.unlink()
        result = c.finish(standby)
        check_exactly_once(result, STEPS)
    finally:
        c.stop_all()
