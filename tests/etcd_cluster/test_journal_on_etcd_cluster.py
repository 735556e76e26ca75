"""The journal on a 3-member etcd, each member its own namespace host: a session runs through
the loss of the etcd leader, a member restarted from its data directory, and a member cut off
from the rest, with every call run once, a journal that verifies, and the results of a run
without faults."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from regent.chaos.etcd_cluster import EtcdCluster
from regent.journal import open_journal
from tests.failover.harness import Cluster, check_exactly_once

STEPS = 80


def _run(etcd_cluster: EtcdCluster, workdir: Path, fault: Callable[[], None] | None, at_step: int = 10) -> dict:
    cluster = Cluster(f"ec-{uuid.uuid4().hex[:8]}", etcd_cluster.url, workdir, program="mixed.py", steps=STEPS,
                      ttl=3.0)
    try:
        cluster.start()
        cluster.start()  # a standby, campaigning through the faults too
        leader = cluster.wait_leader(1)
        if fault is not None:
            cluster.wait_step(leader, at_step)
            fault()
            assert f"step {STEPS - 1}\n" not in cluster.log_of(leader).read_text(), "the fault came after the last call"
        first = cluster.by_pid(leader)
        out, _ = first.communicate(timeout=180)
        if first.returncode == 0:
            result = json.loads(out.strip().splitlines()[-1])
        else:
            # A lease that could not be renewed while etcd elected a new leader deposes the
            # primary (safe: fenced); its standby then finishes the run.
            assert "leadership lost" in cluster.log_of(leader).read_text(), cluster.log_tail()
            result = cluster.finish(cluster.by_pid(cluster.wait_leader(2, timeout=60)), timeout=180)
    finally:
        cluster.stop_all()
    check_exactly_once(result, STEPS)
    j = open_journal(etcd_cluster.url)
    try:
        report = j.verify(cluster.session)
    finally:
        j.close()
    assert report.ok, report.problems
    return result


@pytest.fixture
def reference(etcd_cluster: EtcdCluster, tmp_path: Path) -> dict:
    (tmp_path / "ref").mkdir()
    return _run(etcd_cluster, tmp_path / "ref", None)


def test_the_etcd_leader_sigkilled_mid_session(etcd_cluster: EtcdCluster, tmp_path: Path, reference: dict) -> None:
    killed = []

    def kill_leader() -> None:
        killed.append(etcd_cluster.leader())
        etcd_cluster.kill(killed[0])

    result = _run(etcd_cluster, tmp_path, kill_leader)
    assert etcd_cluster.leader() != killed[0]
    assert result["out"] == reference["out"]


def test_a_member_restarted_from_its_data_dir(etcd_cluster: EtcdCluster, tmp_path: Path, reference: dict) -> None:
    def restart_a_follower() -> None:
        follower = next(m for m in etcd_cluster.members if m != etcd_cluster.leader())
        etcd_cluster.kill(follower)
        etcd_cluster.start_member(follower)  # from the data it had: it catches up

    assert _run(etcd_cluster, tmp_path, restart_a_follower)["out"] == reference["out"]


def test_a_minority_partitioned_away_and_healed(etcd_cluster: EtcdCluster, tmp_path: Path, reference: dict) -> None:
    cut = []

    def cut_the_leader() -> None:
        cut.append(etcd_cluster.leader())
        etcd_cluster.partition(cut[0])  # the majority elects another; the client fails over

    try:
        result = _run(etcd_cluster, tmp_path, cut_the_leader)
    finally:
        if cut:
            etcd_cluster.heal(cut[0])
    assert result["out"] == reference["out"]
