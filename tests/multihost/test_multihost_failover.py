"""Controllers on different machines: the primary in one namespace host, its standby in
another, the workers on three more. A SIGKILLed primary is replaced by the standby, which
reaches every worker through the journal; every call ran once and no worker was replaced."""

from __future__ import annotations

import random
import re
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
