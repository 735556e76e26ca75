"""Host registration in both stores: entries live while their lease is renewed, a new join
is a new incarnation, and malformed entries are skipped."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from regent.journal import Journal
from regent.journal.errors import HostTaken
from regent.journal.hosts import (
    RUN_ENDED,
    HostMembership,
    HostNameInUse,
    HostRecord,
    end_run,
    literal_address,
    registered_hosts,
    run_ended,
)


def _record(host_id: str, incarnation: str = "i1", address: str = "tcp://10.0.0.1:5000") -> HostRecord:
    return HostRecord(id=host_id, address=address, hostname="node", incarnation=incarnation, pid=os.getpid(),
                      cores=2, memory_bytes=1 << 30, backend="cpu", devices=[], since=time.time())


@pytest.fixture
def cluster() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def test_a_joined_host_is_listed_until_its_lease_runs_out(journal: Journal, cluster: str) -> None:
    b = journal.backend
    lease = b.join_cluster(cluster, "h1", _record("h1").encode(), 1.0)
    b.join_cluster(cluster, "h2", _record("h2").encode(), 30.0)
    assert [r.id for r in registered_hosts(b, cluster)] == ["h1", "h2"]
    assert b.renew_host(lease)
    deadline = time.monotonic() + 5
    while "h1" in [r.id for r in registered_hosts(b, cluster)]:
        assert time.monotonic() < deadline, "an unrenewed host entry outlived its lease"
        time.sleep(0.1)
    assert not b.renew_host(lease), "an expired lease was renewed"
    assert [r.id for r in registered_hosts(b, cluster)] == ["h2"]
    assert journal.sessions() == [] or all(s.name != "clusters" for s in journal.sessions())


def test_a_live_registration_is_replaced_only_by_a_join_that_names_it(journal: Journal, cluster: str) -> None:
    """join_cluster refuses a live entry (HostTaken carries it) unless told its exact value: the
    one atomic step by which a successor takes over its dead predecessor's entry."""
    b = journal.backend
    old = _record("h1", "old").encode()
    first = b.join_cluster(cluster, "h1", old, 30.0)
    with pytest.raises(HostTaken) as taken:
        b.join_cluster(cluster, "h1", _record("h1", "new").encode(), 30.0)
    assert taken.value.holder == old
    with pytest.raises(HostTaken):  # naming another value than the live one takes nothing
        b.join_cluster(cluster, "h1", _record("h1", "new").encode(), 30.0, replace=b"stale")
    assert [r.incarnation for r in registered_hosts(b, cluster)] == ["old"] and b.renew_host(first)
    second = b.join_cluster(cluster, "h1", _record("h1", "new").encode(), 30.0, replace=old)
    assert [r.incarnation for r in registered_hosts(b, cluster)] == ["new"]
    assert not b.renew_host(first), "the replaced registration still renewed as if it held the entry"
    assert b.renew_host(second)
    b.leave_cluster(second)
    assert registered_hosts(b, cluster) == []


def test_a_second_agent_with_a_live_agents_name_is_refused_naming_the_holder(journal: Journal, cluster: str) -> None:
    b = journal.backend
    live = HostMembership(b, cluster, "h1", lambda inc: _record("h1", inc, "tcp://10.0.0.1:5000"), ttl_s=1.0).start()
    try:
        holder = registered_hosts(b, cluster)[0]
        second = HostMembership(b, cluster, "h1", lambda inc: _record("h1", inc, "tcp://10.0.0.2:5000"), ttl_s=1.0)
        with pytest.raises(HostNameInUse, match="tcp://10.0.0.1:5000") as refused:
            second.start()
        assert f"pid {os.getpid()}" in str(refused.value) and "--name" in str(refused.value)
        time.sleep(1.5)  # past the TTL: the live agent renews, and keeps the same incarnation
        assert [r.incarnation for r in registered_hosts(b, cluster)] == [holder.incarnation]
    finally:
        live.stop()


def test_an_agent_at_its_dead_predecessors_address_takes_the_registration_over_at_once(
        journal: Journal, cluster: str) -> None:
    """Procs restart their dead agent at its address: the new one need not wait out the lease."""
    b = journal.backend
    dead = b.join_cluster(cluster, "h1", _record("h1", "dead", "tcp://10.0.0.1:5000").encode(), 30.0)
    successor = HostMembership(b, cluster, "h1", lambda inc: _record("h1", inc, "tcp://10.0.0.1:5000"),
                               ttl_s=1.0).start()
    try:
        assert successor.joined.is_set()
        assert [r.incarnation for r in registered_hosts(b, cluster)] == [successor.record.incarnation]
        assert not b.renew_host(dead)
    finally:
        successor.stop()
    # A successor that could not bind the dead agent's port serves elsewhere: its host file named
    # that agent (pid and address), so it takes over all the same.
    gone = _record("h2", "dead", "tcp://10.0.0.1:5001")
    b.join_cluster(cluster, "h2", gone.encode(), 30.0)
    moved = HostMembership(b, cluster, "h2", lambda inc: _record("h2", inc, "tcp://10.0.0.1:6001"), ttl_s=1.0,
                           predecessor={"pid": gone.pid, "address": gone.address})
    stranger = HostMembership(b, cluster, "h2", lambda inc: _record("h2", inc, "tcp://10.0.0.1:6002"), ttl_s=1.0,
                              predecessor={"pid": gone.pid + 1, "address": gone.address})
    with pytest.raises(HostNameInUse):
        stranger.start()
    moved.start()
    try:
        assert {r.id: r.address for r in registered_hosts(b, cluster)}["h2"] == "tcp://10.0.0.1:6001"
    finally:
        moved.stop()


def test_a_name_whose_lease_ran_out_is_taken_by_a_new_agent(journal: Journal, cluster: str) -> None:
    b = journal.backend
    b.join_cluster(cluster, "h1", _record("h1", "gone", "tcp://10.0.0.1:5000").encode(), 1.0)
    deadline = time.monotonic() + 5
    while registered_hosts(b, cluster):
        assert time.monotonic() < deadline, "an unrenewed host entry outlived its lease"
        time.sleep(0.1)
    m = HostMembership(b, cluster, "h1", lambda inc: _record("h1", inc, "tcp://10.0.0.2:5000"), ttl_s=1.0).start()
    try:
        assert [r.address for r in registered_hosts(b, cluster)] == ["tcp://10.0.0.2:5000"]
    finally:
        m.stop()


def test_malformed_entries_are_skipped(journal: Journal, cluster: str) -> None:
    b = journal.backend
    b.join_cluster(cluster, "bad-json", b"{not json", 30.0)
    b.join_cluster(cluster, "hostname-address", _record("hostname-address", address="tcp://node1:5000").encode(), 30.0)
    b.join_cluster(cluster, "other-id", _record("someone-else").encode(), 30.0)
    b.join_cluster(cluster, "good", _record("good").encode(), 30.0)
    assert [r.id for r in registered_hosts(b, cluster)] == ["good"]


def test_membership_rejoins_as_a_new_incarnation_when_its_entry_vanishes(journal: Journal, cluster: str) -> None:
    b = journal.backend
    m = HostMembership(b, cluster, "h1", lambda inc: _record("h1", inc), ttl_s=1.0).start()
    try:
        assert m.joined.wait(5)
        first = registered_hosts(b, cluster)[0].incarnation
        time.sleep(1.5)  # renewed meanwhile: still the same incarnation
        assert [r.incarnation for r in registered_hosts(b, cluster)] == [first]
        b.leave_cluster(m.lease)  # as if the lease had run out during an outage
        deadline = time.monotonic() + 5
        while not (hosts := registered_hosts(b, cluster)) or hosts[0].incarnation == first:
            assert time.monotonic() < deadline, "the agent did not register again"
            time.sleep(0.05)
    finally:
        m.stop()
    assert registered_hosts(b, cluster) == [], "a stopped membership left its entry behind"


def test_only_literal_addresses_are_accepted() -> None:
    assert literal_address("tcp://10.1.2.3:4000")
    assert literal_address("tcp://[fd00::1]:4000")
    assert not literal_address("tcp://node1:4000")
    assert not literal_address("tcp://10.1.2.3:0")
    assert not literal_address("tcp://10.1.2.3")


@pytest.mark.slow
def test_membership_keeps_the_host_registered_across_a_store_outage(fresh_etcd, cluster: str) -> None:
    """etcd down for longer than the TTL: the agent keeps trying, and once etcd is back the
    host is registered again (etcd renews leases across its own restart, so it may well be
    the same incarnation: a store outage is not a host loss)."""
    from regent.journal import open_journal

    j = open_journal(fresh_etcd.url)
    m = HostMembership(j.backend, cluster, "h1", lambda inc: _record("h1", inc), ttl_s=1.0).start()
    try:
        assert m.joined.wait(5)
        fresh_etcd.restart(down_s=2.5)
        deadline = time.monotonic() + 20
        while [r.id for r in registered_hosts(j.backend, cluster)] != ["h1"]:
            assert time.monotonic() < deadline, "the host was not registered again after the outage"
            time.sleep(0.1)
        time.sleep(1.5)  # and it stays registered: renewals go on
        assert [r.id for r in registered_hosts(j.backend, cluster)] == ["h1"]
    finally:
        m.stop()
        j.close()


def test_the_first_to_end_a_clusters_run_is_the_one_recorded(journal: Journal, cluster: str) -> None:
    assert run_ended(journal.backend, cluster) is None
    first = end_run(journal.backend, cluster, 3, by="pod-a")
    assert first["status"] == 3 and first["by"] == "pod-a"
    again = end_run(journal.backend, cluster, 0, by="pod-b")  # a standby that found the run over
    assert again["by"] == "pod-a" and again["status"] == 3
    assert run_ended(journal.backend, cluster)["by"] == "pod-a"
    assert registered_hosts(journal.backend, cluster) == []  # a value is not a host
    assert run_ended(journal.backend, f"{cluster}-other") is None


def test_a_malformed_run_ended_record_is_ignored_and_said(journal: Journal, cluster: str) -> None:
    journal.backend.claim_cluster_value(cluster, RUN_ENDED, b"\xff not json")
    assert run_ended(journal.backend, cluster) is None


def test_the_clusters_version_changes_with_its_hosts_and_not_with_renewals(journal: Journal, cluster: str) -> None:
    """What lets a controller list a cluster's hosts only when they changed (controller/cluster.py)."""
    b = journal.backend
    if b.cluster_version(cluster) is None:
        pytest.skip(f"{b.url}: records expire as they are read; the watcher lists every time")
    empty = b.cluster_version(cluster)
    short = b.join_cluster(cluster, "h1", _record("h1").encode(), 1.0)
    one = b.cluster_version(cluster)
    assert one != empty
    b.renew_host(short)
    assert b.cluster_version(cluster) == one
    h2 = _record("h2").encode()
    b.join_cluster(cluster, "h2", h2, 30.0)
    two = b.cluster_version(cluster)
    assert two != one
    deadline = time.monotonic() + 10
    while b.cluster_version(cluster) == two:  # h1's lease runs out
        assert time.monotonic() < deadline, "an expiry did not change the version"
        time.sleep(0.1)
    expired = b.cluster_version(cluster)
    assert [r.id for r in registered_hosts(b, cluster)] == ["h2"]
    again = b.join_cluster(cluster, "h2", _record("h2", incarnation="i2").encode(), 30.0, replace=h2)
    assert b.cluster_version(cluster) not in (expired, two)
    rejoined = b.cluster_version(cluster)
    b.leave_cluster(again)
    assert b.cluster_version(cluster) != rejoined
