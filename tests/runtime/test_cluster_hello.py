"""Attaching a cluster's picked hosts (controller/cluster.py): an agent still registered at the
address it was picked at that misses the first hello (a loaded machine, a pause) is asked once
more before the mesh fails, so one slow agent among hundreds starting does not fail a job; one
that answers neither fails the mesh with an error that says what to do. The agent here is a
bare wire peer registered in the store by hand."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from regent import Session, SupervisionError, wire
from regent.controller import cluster as cluster_mod
from regent.journal import open_journal
from regent.journal.hosts import HostRecord
from regent.wire import Kind
from tests.runtime.rawpeer import RawPeer

CLUSTER = "hello-test"


class _Agent:
    """A registered host that answers its requests from the `first_answered`-th hello on."""

    def __init__(self, url: str, first_answered: int) -> None:
        self.peer = RawPeer()
        self.hellos = 0
        self._first = first_answered
        self._stop = threading.Event()
        self._journal = open_journal(url)
        record = HostRecord(id="h0", address=self.peer.address, hostname="node", incarnation="i1",
                            pid=os.getpid(), cores=2, memory_bytes=1 << 30, backend="cpu", since=time.time())
        self._lease = self._journal.backend.join_cluster(CLUSTER, "h0", record.encode(), 60.0)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                kind, meta, _ = self.peer.recv(timeout=0.2)
            except Exception:
                continue
            if kind is not Kind.HOST_REQ or "rt" not in meta:
                continue
            if meta.get("op") == "hello" and meta.get("n"):
                self.hellos += 1
                if self.hellos < self._first:
                    continue
            if meta.get("n"):
                self.peer.send(meta["rt"], wire.encode(Kind.HOST_REP, {"sid": meta["sid"], "n": meta["n"], "st": "ok"}))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._journal.backend.leave_cluster(self._lease)
        self._journal.close()
        self.peer.close()


@pytest.fixture
def url(own_home, tmp_path: Path, monkeypatch) -> str:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    monkeypatch.setattr(cluster_mod, "HELLO_S", 0.5)
    monkeypatch.setattr(cluster_mod, "HELLO_AGAIN_S", 1.5)
    return f"sqlite://{tmp_path / 'journal.db'}"


def test_an_agent_that_misses_the_first_hello_is_asked_again(url: str) -> None:
    agent = _Agent(url, first_answered=2)
    try:
        with Session("hello-slow", journal=url) as s:
            s.host_mesh(hosts=1, cluster=CLUSTER)
            assert agent.hellos == 2
            assert s.runtime.hosts and agent.peer.address in s.runtime.hosts
    finally:
        agent.close()


def test_an_agent_that_answers_no_hello_fails_the_mesh_saying_what_to_do(url: str) -> None:
    agent = _Agent(url, first_answered=1_000)
    try:
        with Session("hello-silent", journal=url) as s:
            with pytest.raises(SupervisionError, match=r"does not answer.*asked twice.*stop it"):
                s.host_mesh(hosts=1, cluster=CLUSTER)
            assert agent.hellos == 2
    finally:
        agent.close()
