"""An Accumulator folded on its hosts (`Accumulator(..., on_host=True)`): each host's first point
folds its host's values and answers the controller with one value; the program sees the same
fold as without it, every actor runs once, an error is the first point's in mesh order, and a
point that dies mid-fold (the folder or another) fails the accumulate rather than hang it."""

from __future__ import annotations

import collections
import operator
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regent import Actor, ActorError, Session, SupervisionError, context, endpoint
from regent.controller import mesh as mesh_module
from regent.worker import Accumulator
from tests.support.agenthome import wait_for
from tests.support.loopback import CLUSTER, loopback_agents

HOLLOW = 6


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def seen(self) -> int:
        return self.n

    @endpoint
    def words(self) -> collections.Counter:
        self.n += 1
        return collections.Counter({"calls": 1, f"pid{os.getpid()}": 1})

    @endpoint
    def fail_at(self, rank: int) -> int:
        if context().rank == rank:
            raise ValueError(f"point {rank} refuses")
        return 1

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def slow(self, started: str) -> int:
        Path(started, str(context().rank)).touch()
        time.sleep(4)
        self.n += 1
        return 1


@pytest.fixture(params=["direct", "relay"])
def hollow_hosts(request, own_home, tmp_path: Path) -> Iterator[str]:
    """Two hollow agents of HOLLOW procs in an SQLite store, casts direct or through the agents."""
    own_home(REGENT_HIPCORE_BACKEND="cpu", REGENT_RELAY="1" if request.param == "relay" else "0")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    with loopback_agents(url, tmp_path, ttl_s=1.0) as add:
        add("a", "b", hollow=HOLLOW)
        yield url


@pytest.fixture
def folds_seen(monkeypatch) -> list[dict]:
    """The points each FoldSink found folded on their hosts, as {folder: points folded in}."""
    seen: list[dict] = []
    real = mesh_module.FoldSink._value

    def spy(self, call):
        seen.append({r: tuple(o.meta["fp"]) for r, o in sorted(call.results.items()) if o.meta.get("fp")})
        return real(self, call)

    monkeypatch.setattr(mesh_module.FoldSink, "_value", spy)
    return seen


def test_each_host_folds_its_values_and_every_actor_runs_once(hollow_hosts, folds_seen) -> None:
    with Session("host-fold", journal=hollow_hosts) as s:
        procs = s.host_mesh(hosts=2, cluster=CLUSTER).spawn_procs(per_host={"procs": HOLLOW})
        c = procs.spawn("c", Counter)
        total = Accumulator(c.incr, 0, operator.add, on_host=True)
        assert total.accumulate().get(timeout=30) == 2 * HOLLOW
        assert total.accumulate().get(timeout=30) == 4 * HOLLOW
        counts = Accumulator(c.words, collections.Counter(), operator.add, on_host=True).accumulate().get(timeout=30)
        assert counts["calls"] == 2 * HOLLOW and len(counts) == 3  # the two hollow agents' pids
        assert c.seen.call().get(timeout=30).values() == [3] * 2 * HOLLOW  # each once, folded or not
        # One value per host reached the controller: its first point's, naming the others.
        assert folds_seen == [{0: tuple(range(1, HOLLOW)), HOLLOW: tuple(range(HOLLOW + 1, 2 * HOLLOW))}] * 3
        # A slice folds its own points; without on_host the controller folds, to the same value.
        part = c.slice(procs=slice(0, 2))
        assert Accumulator(part.incr, 0, operator.add, on_host=True).accumulate().get(timeout=30) == 4 * 4
        assert Accumulator(part.incr, 0, operator.add).accumulate().get(timeout=30) == 5 * 4
        assert folds_seen[-1] == {0: (1,), HOLLOW: (HOLLOW + 1,)}


def test_an_error_is_the_first_failing_points_and_an_unpicklable_reducer_folds_here(hollow_hosts,
                                                                                    folds_seen) -> None:
    with Session("host-fold-errors", journal=hollow_hosts) as s:
        procs = s.host_mesh(hosts=2, cluster=CLUSTER).spawn_procs(per_host={"procs": HOLLOW})
        c = procs.spawn("c", Counter)
        for bad in (0, 3, HOLLOW + 1):
            fut = Accumulator(c.fail_at, 0, operator.add, on_host=True).accumulate(bad)
            with pytest.raises(ActorError, match=f"point {bad} refuses"):
                fut.get(timeout=30)
        lock = threading.Lock()  # a reducer closing over a lock does not pickle

        def locked_add(acc: int, v: int) -> int:
            with lock:
                return acc + v

        assert Accumulator(c.incr, 0, locked_add, on_host=True).accumulate().get(timeout=30) == 2 * HOLLOW
        assert folds_seen[-1] == {}


@pytest.fixture
def real_host(own_home, tmp_path: Path) -> Iterator[str]:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    with loopback_agents(url, tmp_path, ttl_s=1.0) as add:
        add("r")
        yield url


@pytest.mark.parametrize("victim", ["folder", "member"])
def test_a_point_killed_mid_fold_fails_the_accumulate_rather_than_hang_it(real_host, tmp_path, victim) -> None:
    started = tmp_path / "started"
    started.mkdir()
    with Session(f"host-fold-kill-{victim}", journal=real_host) as s:
        procs = s.host_mesh(hosts=1, cluster=CLUSTER).spawn_procs(per_host={"procs": 3})
        c = procs.spawn("c", Counter)
        pids = c.pid.call().get(timeout=60).values()
        fut = Accumulator(c.slow, 0, operator.add, on_host=True).accumulate(str(started))
        wait_for(lambda: len(list(started.iterdir())) == 3, 30, "every point running")
        os.kill(pids[0 if victim == "folder" else 2], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(SupervisionError):
            fut.get(timeout=60)
        assert time.monotonic() - t0 < 30


@pytest.fixture
def mixed_hosts(own_home, tmp_path: Path) -> Iterator[str]:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    url = f"sqlite://{tmp_path / 'journal.db'}"
    with loopback_agents(url, tmp_path, ttl_s=1.0) as add:
        add("h", hollow=4)
        add("r")
        yield url


def test_hollow_and_real_hosts_fold_in_one_mesh(mixed_hosts, folds_seen) -> None:
    with Session("host-fold-mixed", journal=mixed_hosts) as s:
        procs = s.host_mesh(hosts=2, cluster=CLUSTER).spawn_procs(per_host={"procs": 4})
        c = procs.spawn("c", Counter)
        assert Accumulator(c.incr, 0, operator.add, on_host=True).accumulate().get(timeout=30) == 8
        assert folds_seen[-1] == {0: (1, 2, 3), 4: (5, 6, 7)}
