"""Prometheus metrics of a controller and a host agent in a real session: calls counted by kind
and endpoint, restarts counted with the cause of the failure they restarted, the agent's procs
with their memory and CPU; the text parses with prometheus-client's own parser."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from regent import Actor, RestartPolicy, Session, SupervisionError, endpoint
from regent.controller.status import session_status
from regent.journal import open_journal
from regent.worker.errors import ActorExit
from regent.worker.metrics import parse_address
from tests.support.etcd import free_port
from tests.support.loopback import CLUSTER, loopback_agents


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def move(self, nbytes: int) -> None:
        """Reads and writes `nbytes` through an RDMA buffer of its own proc."""
        import numpy as np

        from regent.hipcore import RDMABuffer

        buf = RDMABuffer(np.zeros(nbytes, dtype=np.uint8))
        out = np.empty(nbytes, dtype=np.uint8)
        buf.read_into(out).get()
        buf.write_from(out).get()

    @endpoint
    def die(self) -> None:
        os._exit(3)  # the proc dies

    @endpoint
    def fail(self) -> None:
        raise ActorExit("the actor fails; its proc lives", normal=False)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_calls_and_restarts_are_counted_with_their_endpoint_and_cause(own_home, tmp_path: Path) -> None:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    with Session("metrics-restarts", journal=f"sqlite://{tmp_path / 'j.db'}", metrics="127.0.0.1:0") as s:
        assert s.metrics_url is not None and s.metrics_url.startswith("http://127.0.0.1:")
        w = s.spawn_procs(per_host={"procs": 2}).spawn("w", Worker, restart=RestartPolicy(restart="permanent"))
        first = w.pid.call().get(timeout=30).values()
        for _ in range(16):
            w.slice(procs=0).pid.call_one().get(timeout=30)
        with pytest.raises(SupervisionError):
            w.slice(procs=1).die.call_one().get(timeout=60)
        with pytest.raises(SupervisionError):
            w.slice(procs=0).fail.call_one().get(timeout=60)
        again = w.pid.call().get(timeout=60).values()
        assert again[0] == first[0] and again[1] != first[1], "rank 1's proc was replaced, rank 0's kept"
        m = scrape(s.metrics_url)
        assert value(m, "regent_calls_total", kind="call", mesh="w", endpoint="pid") == 2
        assert value(m, "regent_calls_total", kind="call_one", mesh="w", endpoint="pid") == 16
        assert value(m, "regent_calls_total", kind="call_one", mesh="w", endpoint="die") == 1
        # One call in eight is timed, by seq: two or three of these 18 consecutive call_ones.
        assert 2 <= value(m, "regent_call_duration_seconds_count", kind="call_one") <= 3
        assert value(m, "regent_call_duration_seconds_bucket", kind="call_one", le="+Inf") == value(
            m, "regent_call_duration_seconds_count", kind="call_one")
        assert value(m, "regent_actor_failures_total", mesh="w", cause="proc_died") == 1
        assert value(m, "regent_actor_failures_total", mesh="w", cause="actor_failed") == 1
        assert value(m, "regent_restarts_total", mesh="w", reason="proc_died") == 1
        assert value(m, "regent_restarts_total", mesh="w", reason="actor_failed") == 1
        assert value(m, "regent_leader") == 1 and value(m, "regent_leader_epoch") >= 1
        assert value(m, "regent_takeovers_total") == 0  # a first run takes nothing over
        assert value(m, "regent_journal_records_total") >= value(m, "regent_journal_appends_total") > 0
        assert value(m, "regent_journal_commit_duration_seconds_count") == value(m, "regent_journal_appends_total")
        assert value(m, "regent_hosts", state="up") == 1 and value(m, "regent_hosts", state="lost") == 0
        # Served even while nothing was sent again; the counts are the runtime's.
        assert all(("regent_resends_total", (("reason", r),)) in m for r in ("link", "overdue", "deferred"))
        assert value(m, "regent_resends_total", reason="overdue") <= s.runtime.resends["overdue"]
        # Bounded labels: no pid, proc id or call id anywhere.
        labels = {v for _, ls in m for _, v in ls}
        assert not {str(p) for p in first + again} & labels
        url = s.metrics_url
    with pytest.raises(OSError):  # the session's end stops its server
        urllib.request.urlopen(url, timeout=5)
    # `regent status` reads the same story from the journal: the failures, their causes, the restarts.
    with open_journal(f"sqlite://{tmp_path / 'j.db'}") as j:
        st = session_status(j, "metrics-restarts")
    assert [(m["name"], m["failures"], m["restarts"]) for m in st["meshes"]] == [("w", 2, 2)]
    [(host, members)] = st["meshes"][0]["hosts"].items()  # rank 1's replacement counted where it runs
    assert host.startswith("tcp://127.0.0.1:") and members == 2
    assert [(e["ev"], e.get("cause")) for e in st["events"]] == [
        ("failure", "proc_died"), ("proc_replaced", None), ("restart", None), ("failure", "actor_failed"),
        ("restart", None)]


def test_a_session_without_an_address_serves_nothing(own_home, tmp_path: Path, monkeypatch) -> None:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    monkeypatch.delenv("REGENT_METRICS_ADDR", raising=False)
    with Session("metrics-off", journal="off") as s:
        assert s.metrics_url is None and s._metrics is None


def test_a_malformed_address_is_refused_saying_what_to_give(own_home) -> None:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    with pytest.raises(ValueError, match="give PORT or HOST:PORT"):
        Session("metrics-bad", journal="off", metrics="localhost:http")
    assert parse_address("9400") == ("127.0.0.1", 9400)
    assert parse_address("[::1]:0") == ("::1", 0)
    with pytest.raises(ValueError, match="not a literal IP"):
        parse_address("example.org:9400")


def test_a_host_agent_reports_its_procs_their_memory_and_its_backend(own_home, tmp_path: Path) -> None:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    port = free_port()
    agent_url = f"http://127.0.0.1:{port}/metrics"
    with loopback_agents(url, tmp_path, ttl_s=2.0) as add:
        add("a", extra=("--metrics", f"127.0.0.1:{port}"))
        with Session("metrics-agent", journal=url) as s:
            w = s.host_mesh(hosts=1, cluster=CLUSTER).spawn_procs(per_host={"procs": 3}).spawn("w", Worker)
            pids = w.pid.call().get(timeout=30).values()
            w.slice(procs=1).move.call_one(3 << 20).get(timeout=30)
            m = scrape(agent_url)
            assert value(m, "regent_agent_procs", session="metrics-agent") == 3
            rss = {dict(ls)["index"]: v for (name, ls), v in m.items()
                   if name == "regent_proc_resident_memory_bytes" and dict(ls)["session"] == "metrics-agent"}
            assert len(rss) == 3 and all(v > 1 << 20 for v in rss.values()), rss
            rss_index = sorted(int(i) for i in rss)  # the agent's index of each rank's proc, in spawn order
            assert len([k for k in m if k[0] == "regent_proc_cpu_seconds_total"]) == 3
            assert value(m, "regent_host_info", host="a", backend="cpu", hostname=os.uname().nodename) == 1
            moved = {(dict(ls)["index"], dict(ls)["op"]): v for (name, ls), v in m.items()
                     if name == "regent_rdma_bytes_total"}
            assert list(moved.values()) == [3 << 20, 3 << 20] and {i for i, _ in moved} == {str(rss_index[1])}, moved
            assert not {str(p) for p in pids} & {v for _, ls in m for _, v in ls}
        m = scrape(agent_url)  # the session's end stopped its procs there
        assert value(m, "regent_agent_procs", session="metrics-agent") == 0
