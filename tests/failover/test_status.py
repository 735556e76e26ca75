"""`regent status` against a live session, through a failover, and once it ended (real
controllers, SQLite and etcd); and what it says of a session or a store that is not there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

from tests.failover.harness import Cluster, check_exactly_once

STEPS = 8


def _status(c: Cluster, *extra: str, session: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "regent.cli", "status", session or c.session, "--journal", c.journal,
                           *extra], capture_output=True, text=True, timeout=60)


def _json(c: Cluster) -> dict:
    done = _status(c, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_status_follows_a_session_through_a_failover_to_its_end(tmp_path, journal_url) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    c = Cluster(f"st-{uuid.uuid4().hex[:6]}", journal_url, tmp_path, steps=STEPS,
                extra_env={"REGENT_TEST_HOLD_FILE": str(hold)})
    try:
        primary, standby = c.primary_and_standby()
        live = _json(c)
        assert live["state"] == "running" and live["leader"]["holder"].split(":")[1] == str(primary)
        epoch = live["leader"]["epoch"]
        assert [w["holder"].split(":")[1] for w in live["standbys"]] == [str(standby.pid)]
        assert live["standbys"][0]["lag_records"] > 0
        assert live["failovers"] == 0 and live["epochs"] == [epoch]
        assert [(m["name"], m["members"], m["state"]) for m in live["meshes"]] == [("w", 3, "running")]
        assert list(live["procs_per_host"].values()) == [3] and live["meshes"][0]["hosts"] == live["procs_per_host"]
        assert live["calls"] >= 4  # steps 0-3: a call, a broadcast, a choose, a stream
        text = _status(c)
        assert text.returncode == 0 and f"at epoch {epoch}" in text.stdout and "w " in text.stdout, text.stdout

        os.kill(primary, signal.SIGKILL)
        c.by_pid(primary).wait()
        assert c.wait_leader(2, timeout=60) == standby.pid
        c.wait_step(standby.pid, 4)
        after = _json(c)
        assert after["state"] == "running" and after["leader"]["epoch"] > epoch
        assert after["failovers"] == 1 and after["last_failover"]["from_epoch"] == epoch
        assert after["standbys"] == []  # the standby leads now: its record went
        hold.unlink()
        check_exactly_once(c.finish(standby), STEPS)
        ended = _json(c)
        assert ended["state"] == "ended" and ended["leader"] is None and ended["failovers"] == 1
        assert [m["state"] for m in ended["meshes"]] == ["ended"]
    finally:
        c.stop_all()


def test_status_of_an_unknown_session_or_a_silent_store_says_so(tmp_path, journal_url) -> None:
    c = Cluster("nobody", journal_url, tmp_path)
    done = _status(c)
    assert done.returncode == 2 and "no session 'nobody'" in done.stderr, done.stderr
    silent = Cluster("nobody", "etcd://127.0.0.1:9", tmp_path)  # nothing listens on port 9
    done = _status(silent)
    assert done.returncode == 2 and "regent status: cannot open the journal etcd://127.0.0.1:9" in done.stderr
    assert "Traceback" not in done.stderr
