"""Controllers on different machines: the primary in one namespace host, its standby in
another, the workers on three more. A SIGKILLed primary is replaced by the standby, which
reaches every worker through the journal; every call ran once and no worker was replaced."""

from __future__ import annotations

import json
import random
import re
import time
import uuid
from collections import Counter
from pathlib import Path

from regent.chaos.netcluster import MultiHost
from regent.controller.replay import PROCS
from regent.journal import open_journal
from tests.failover.harness import Cluster, check_exactly_once

STEPS = 40


def _on(multihost: MultiHost, n: int) -> str:
    """The primary runs in c1, every later controller in c2."""
    return "c1" if n == 0 else "c2"


def test_a_standby_on_another_host_takes_over_with_the_same_workers(multihost: MultiHost, tmp_path: Path) -> None:
    cluster = Cluster(f"mhf-{uuid.uuid4().hex[:8]}", multihost.url, tmp_path, program="mixed.py", steps=STEPS,
                      extra_env={"REGENT_TEST_HOSTS": "3", "REGENT_TEST_PRINT": "1"},
                      prefix=lambda n: multihost.net.command(_on(multihost, n), []),
                      host_env=lambda n: multihost.env(_on(multihost, n)))
    try:
        cluster.start()
        cluster.start()
        # A standby still starting when the primary dies would find the seat empty and lead
        # as a fresh primary (it still replays): this test is about one that stood by.
        cluster.wait_standby()
        killed = cluster.kill_leaders(1, random.Random(18), max_live_steps=25)
        assert len(killed) == 1, "the primary finished before it could be killed"
        result = cluster.finish(cluster.by_pid(cluster.wait_leader(2)))
    finally:
        cluster.stop_all()
    assert result["role"] == "standby-took-over"
    check_exactly_once(result, STEPS)
    j = open_journal(multihost.url)
    try:
        spawned = [p["pid"] for r in j.read(cluster.session) if r.kind == PROCS for p in r.data["procs"]]
    finally:
        j.close()
    assert result["pids"] == spawned, "a worker was replaced across the takeover"
    # Output: every host's agent log keeps each line its procs wrote; the controllers print
    # a line at most once (a replaying standby prints nothing), and the standby prints what
    # the procs write once it leads, prefixed with host and index.
    for host in ("h1", "h2", "h3"):
        kept = Counter(re.findall(r"^\[" + host + r" 0\] ran (\S+)$", (tmp_path / f"agent-{host}.log").read_text(), re.M))
        assert kept and all(n == 1 for n in kept.values()), (host, kept)
    printed = Counter(m for f in tmp_path.glob(f"{cluster.session}.ctl*.log")
                      for m in re.findall(r"^\[h\d 0\] ran \S+$", f.read_text(), re.M))
    assert printed and all(n == 1 for n in printed.values()), printed
    standby_log = cluster.log_of(cluster.wait_leader(2)).read_text()
    assert re.search(r"^\[h\d 0\] ran \S+$", standby_log, re.M), "the standby printed none of the procs' output"


def test_an_upgrade_from_another_host_catches_up_and_keeps_the_workers(multihost: MultiHost, tmp_path: Path) -> None:
    # `regent upgrade` run in c2 for a primary in c1, over three cluster hosts: the request goes
    # through the store, the new program catches up with the running primary and takes its
    # workers over where it stopped: each call once, no worker replaced.
    import subprocess
    import sys

    from tests.failover.harness import PROGRAMS

    cluster = Cluster(f"mhu-{uuid.uuid4().hex[:8]}", multihost.url, tmp_path, program="mixed.py", steps=STEPS,
                      extra_env={"REGENT_TEST_HOSTS": "3", "REGENT_TEST_STEP_S": "0.05"},
                      prefix=lambda n: multihost.net.command("c1", []), host_env=lambda n: multihost.env("c1"))
    log = tmp_path / "upgrade.err"
    hold = tmp_path / "primary.hold"  # the primary waits from step 3 until the new program stands by
    hold.touch()
    try:
        primary = cluster.start(REGENT_TEST_HOLD_FILE=str(hold))
        cluster.wait_step(cluster.wait_leader(1), 3)
        env = {**multihost.env("c2"), **{k: v for k, v in cluster.env().items() if k.startswith("REGENT_TEST_")},
               "PYTHONPATH": f"{PROGRAMS}:{multihost.env('c2')['PYTHONPATH']}"}
        up = subprocess.Popen(multihost.net.command("c2", [sys.executable, "-m", "regent.cli", "upgrade",
                                                           cluster.session, str(PROGRAMS / "mixed.py")]),
                              env=env, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
        deadline = time.monotonic() + 120
        while "standing by" not in log.read_text():  # however loaded the machine, not done before
            assert up.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.01)
        hold.unlink()
        out, _ = up.communicate(timeout=180)
        assert primary.wait(timeout=60) == 0
    finally:
        cluster.stop_all()
        if "up" in locals() and up.poll() is None:
            up.kill()
    err = log.read_text()
    assert up.returncode == 0 and "caught up and leading" in err, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    check_exactly_once(result, STEPS)
    j = open_journal(multihost.url)
    try:
        spawned = [p["pid"] for r in j.read(cluster.session) if r.kind == PROCS for p in r.data["procs"]]
    finally:
        j.close()
    assert result["pids"] == spawned, "a worker was replaced across the upgrade"
