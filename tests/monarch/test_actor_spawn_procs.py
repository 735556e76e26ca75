"""An actor spawning procs on its own machine (Monarch's `this_host().spawn_procs()` inside an
actor): procs owned by the actor, under an id derived from its call, so the host agent gives a
re-run of that call the same procs; they are stopped when their owner ends."""

from __future__ import annotations

import os
import time

import pytest

from regent import Actor, ProcMeshRef, Session, endpoint, this_host
from regent.worker import SupervisionError
from regent.worker.procinfo import running

BOOTED = "REGENT_TEST_BOOTED"


def _boot() -> None:
    os.environ[BOOTED] = "yes"


class Worker(Actor):
    @endpoint
    def info(self) -> tuple[int, str]:
        return os.getpid(), os.environ.get(BOOTED, "no")


class Trainer(Actor):
    """Spawns its own procs, and actors on them, as a Monarch trainer spawns its generators."""

    def __init__(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_boot)
        self.workers = self.procs.spawn("gen", Worker)

    @endpoint
    def infos(self) -> list:
        return self.workers.info.call().get(timeout=60).values()

    @endpoint
    def own_pid(self) -> int:
        return os.getpid()

    @endpoint
    def mesh(self) -> ProcMeshRef:
        return self.procs

    @endpoint
    def twice(self) -> list[list[str]]:
        """Two spawns in one call are two requests: each gets procs of its own."""
        a = this_host().spawn_procs(per_host={"procs": 1})
        b = this_host().spawn_procs(per_host={"procs": 1})
        return [list(a.keys), list(b.keys)]


@pytest.fixture(scope="module")
def session():
    with Session("monarch-actor-spawn-procs") as s:
        yield s


@pytest.fixture(scope="module")
def trainer(session):
    return session.spawn_procs(per_host={"procs": 1}).spawn("trainer", Trainer)


def test_an_actor_spawns_procs_on_its_host_and_actors_on_them(trainer):
    infos = trainer.infos.call_one().get(timeout=60)
    mine = trainer.own_pid.call_one().get(timeout=30)
    assert len(infos) == 2 and len({pid for pid, _ in infos} | {mine}) == 3
    assert [booted for _, booted in infos] == ["yes", "yes"]  # bootstrap ran in each, before the actors
    mesh = trainer.mesh.call_one().get(timeout=30)
    assert isinstance(mesh, ProcMeshRef) and mesh.dims == {"hosts": 1, "gpus": 2}


def test_each_spawn_an_actor_makes_gets_procs_of_its_own(trainer):
    a, b = trainer.twice.call_one().get(timeout=60)
    assert len(a) == len(b) == 1 and a != b


def test_an_actors_procs_are_stopped_when_it_is_stopped(session):
    owner = session.spawn_procs(per_host={"procs": 1}).spawn("owner", Trainer)
    pids = [pid for pid, _ in owner.infos.call_one().get(timeout=60)]
    owner.stop()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.1)
    assert not any(running(p) for p in pids), f"procs {pids} outlived the actor that owned them"
    with pytest.raises(SupervisionError):
        owner.infos.call_one().get(timeout=30)
