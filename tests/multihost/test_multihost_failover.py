"""Controllers on different machines: the primary in one namespace host, its standby in
another, the workers on three more. A SIGKILLed primary is replaced by the standby, which
reaches every worker through the journal; every call ran once and no worker was replaced."""

from __future__ import annotations

import random
import uuid
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
                      extra_env={"REGENT_TEST_HOSTS": "3"},
                      prefix=lambda n: multihost.net.command(_on(multihost, n), []),
                      host_env=lambda n: multihost.env(_on(multihost, n)))
    try:
        cluster.start()
        cluster.start()
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
    hosts = {h.id: h.pid for h in multihost.hosts()}
    assert len(hosts) == 3
