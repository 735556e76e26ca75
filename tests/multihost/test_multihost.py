"""Host meshes over namespace hosts: where actors run, what a host's loss does."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from regent import RestartPolicy, Session, SupervisionError
from regent.chaos.netcluster import HOST_TTL_S, MultiHost
from tests.multihost.actors import Counter


def _session() -> str:
    return f"mh-{uuid.uuid4().hex[:8]}"


def test_a_mesh_over_three_hosts_runs_every_actor_in_its_hosts_namespace(multihost: MultiHost) -> None:
    with multihost.controller_env(), Session(_session()) as s:
        hosts = s.host_mesh(hosts=3)
        assert hosts.dims == {"hosts": 3}
        procs = hosts.spawn_procs(per_host={"procs": 2})
        assert procs.dims == {"hosts": 3, "procs": 2}
        c = procs.spawn("c", Counter)
        where = c.where.call().get()
        by_host = [[where.item(hosts=h, procs=p)["netns"] for p in range(2)] for h in range(3)]
        assert by_host == [[multihost.netns_inode(h)] * 2 for h in ("h1", "h2", "h3")]
        assert os.stat("/proc/self/ns/net").st_ino not in {n for row in by_host for n in row}
        assert c.slice(hosts=2).incr.call().get().values() == [1, 1]
        assert c.incr.call().get().values() == [1, 1, 1, 1, 2, 2]


def _supervision_events(s: Session, ev: str) -> list[dict]:
    from regent.controller.replay import SUPERVISION
    from regent.journal import open_journal

    j = open_journal(s._edge.journal_url)
    try:
        return [r.data for r in j.read(s.name) if r.kind == SUPERVISION and r.data.get("ev") == ev]
    finally:
        j.close()


def _fails_within(fut, limit_s: float) -> float:
    """Seconds until `fut` failed with SupervisionError (at most `limit_s`)."""
    t0 = time.monotonic()
    with pytest.raises(SupervisionError):
        fut.get(timeout=limit_s)
    return time.monotonic() - t0


def test_a_host_whose_processes_all_die_fails_its_points_in_time_and_the_rest_serve(multihost: MultiHost) -> None:
    with multihost.controller_env(), Session(_session()) as s:
        c = s.host_mesh(hosts=3).spawn_procs(per_host={"procs": 1}).spawn("c", Counter)
        assert c.incr.call().get().values() == [1, 1, 1]
        pending = c.slice(hosts=2).nap.call_one(60.0)
        time.sleep(0.3)
        t0 = time.monotonic()
        multihost.net.kill_host("h3")
        took = _fails_within(pending, 2 * HOST_TTL_S + 2)
        assert time.monotonic() - t0 <= 2 * HOST_TTL_S, f"h3's pending call failed after {took:.1f} s"
        with pytest.raises(SupervisionError):
            c.slice(hosts=2).incr.call_one().get(timeout=5)
        assert c.slice(hosts=slice(0, 2)).incr.call().get().values() == [2, 2]
        time.sleep(2 * HOST_TTL_S)  # the loss is recorded once the registration expires, whichever saw it first
        lost = _supervision_events(s, "host_lost")
        assert [e["host"] for e in lost] == ["h3"], lost


def test_a_partitioned_host_is_lost_and_comes_back_as_a_new_incarnation(multihost: MultiHost) -> None:
    with multihost.controller_env(), Session(_session()) as s:
        c = s.host_mesh(hosts=3).spawn_procs(per_host={"procs": 1}).spawn("c", Counter)
        old = c.where.call().get().values()
        before = next(h for h in multihost.hosts() if h.id == "h2")
        pending = c.slice(hosts=1).nap.call_one(60.0)
        time.sleep(0.3)
        t0 = time.monotonic()
        multihost.net.link_down("h2")
        try:
            _fails_within(pending, 2 * HOST_TTL_S + 2)
            assert time.monotonic() - t0 <= 2 * HOST_TTL_S
            assert c.slice(hosts=0).incr.call_one().get(timeout=5) == 1
            assert c.slice(hosts=2).incr.call_one().get(timeout=5) == 1
        finally:
            multihost.net.link_up("h2")
        after = next(h for h in multihost.wait_registered(3, new_incarnation_of=before) if h.id == "h2")
        assert after.incarnation != before.incarnation and after.address == before.address
        deadline = time.monotonic() + 10
        while not _supervision_events(s, "host_back"):
            assert time.monotonic() < deadline, "the returning host was not journaled"
            time.sleep(0.1)
        # The proc this session gave up on h2 is stopped once its host is back.
        deadline = time.monotonic() + 15
        while _alive(old[1]["pid"]):
            assert time.monotonic() < deadline, "the proc left on the returned host was not stopped"
            time.sleep(0.1)
        with pytest.raises(SupervisionError):
            c.slice(hosts=1).incr.call_one().get(timeout=5)
        # New procs can be spawned there again.
        again = s.host_mesh(hosts=3).slice(hosts=1).spawn_procs(per_host={"procs": 1}).spawn("d", Counter)
        assert again.incr.call().get().values() == [1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


# The host must not be lost while its procs start a new agent: a lease TTL longer than that start
# takes on a loaded machine (about 5 s seen with the suite's workers beside it).
@pytest.mark.parametrize("multihost", [15.0], indirect=True, ids=["ttl15"])
def test_an_agent_that_dies_alone_is_restarted_by_its_procs_and_the_host_serves_on(multihost: MultiHost) -> None:
    with multihost.controller_env(), Session(_session()) as s:
        c = s.host_mesh(hosts=3).spawn_procs(per_host={"procs": 1}).spawn("c", Counter)
        pids = [w["pid"] for w in c.where.call().get().values()]
        before = next(h for h in multihost.hosts() if h.id == "h1")
        multihost.agent_procs["h1"].kill()  # the agent only: its proc starts a successor
        after = next(h for h in multihost.wait_registered(3, new_incarnation_of=before) if h.id == "h1")
        assert after.pid != before.pid and after.address == before.address
        for n in range(1, 5):
            assert c.incr.call().get().values() == [n, n, n]
        assert [w["pid"] for w in c.where.call().get().values()] == pids
        assert not _supervision_events(s, "host_lost")


def test_a_supervised_mesh_that_loses_a_host_escalates_to_the_program(multihost: MultiHost) -> None:
    """one_for_all restarts the whole mesh where it can; the lost host's member cannot be
    restarted, so the budget runs out and the failure escalates, naming the host."""
    policy = RestartPolicy(strategy="one_for_all", max_restarts=2, window_s=60, backoff_max_s=0.1)
    with multihost.controller_env(), Session(_session()) as s:
        hosts = s.host_mesh(hosts=3)
        c = hosts.spawn_procs(per_host={"procs": 1}).spawn("c", Counter, restart=policy)
        assert c.incr.call().get().values() == [1, 1, 1]
        multihost.net.kill_host("h3")
        deadline = time.monotonic() + 2 * HOST_TTL_S + 10
        while not (escalated := _supervision_events(s, "escalation")):
            assert time.monotonic() < deadline, "the lost host's member was neither restarted nor escalated"
            time.sleep(0.1)
        assert "h3" in str(escalated[0]["report"])
        assert len(_supervision_events(s, "restart")) == 0  # no restart of the whole mesh could complete
        with pytest.raises(SupervisionError, match="escalated|h3"):
            c.incr.call().get(timeout=10)
        # The program carries on with the hosts it has left.
        d = hosts.slice(hosts=slice(0, 2)).spawn_procs(per_host={"procs": 1}).spawn("d", Counter)
        assert d.incr.call().get().values() == [1, 1]
