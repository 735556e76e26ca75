"""Owners supervising the meshes they spawned, as Monarch's `__supervise__` does: a child's
failure is offered to its owner; handled (True) the owner serves on, unhandled it fails at
its next message, and that failure goes up the chain: to the owner's own owner, or to the
controller (its restart policy, or the unhandled-fault hook)."""

from __future__ import annotations

import time

import pytest

from regent.controller import MeshFailure, Session
from regent.worker import Actor, ProcMeshRef, SupervisionError, endpoint, this_proc
from regent.worker.errors import ActorExit


class Fatal(BaseException):
    pass


class Child(Actor):
    @endpoint
    def quit(self) -> None:
        raise ActorExit("child gave up")

    @endpoint
    async def fatal(self) -> None:
        raise Fatal("child broke")

    @endpoint
    def ping(self) -> str:
        return "pong"


class Owner(Actor):
    def __init__(self, handle: bool | None) -> None:
        self.handle = handle  # None: no answer (not handled)
        self.seen: list[str] = []
        self.child = None

    def __supervise__(self, failure: MeshFailure) -> bool | None:
        self.seen.append(f"{failure.mesh}{failure.point!r}: {failure.reason}")
        return self.handle

    @endpoint
    def spawn_here(self, name: str) -> None:
        self.child = this_proc().spawn(name, Child)

    @endpoint
    def spawn_on(self, procs: ProcMeshRef, name: str) -> None:
        self.child = procs.spawn(name, Child)

    @endpoint
    def break_child(self, how: str) -> str:
        try:
            getattr(self.child.slice(**dict.fromkeys(self.child.dims, 0)), how).call_one().get(timeout=30)
        except SupervisionError as e:
            return e.reason
        return "no failure"

    @endpoint
    def failures(self) -> list[str]:
        return self.seen

    @endpoint
    def ping(self) -> str:
        return "owner pong"


class Bare(Owner):
    """An owner without __supervise__."""

    __supervise__ = None  # type: ignore[assignment]


@pytest.fixture(scope="module")
def faults():
    return []


@pytest.fixture(scope="module")
def session(faults):
    with Session("monarch-supervise", on_unhandled_fault=faults.append) as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 2})


def _failures(owner, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while not (seen := owner.failures.call_one().get(timeout=30)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return seen


def test_a_childs_failure_handled_by_its_owner_leaves_the_owner_serving(procs):
    owner = procs.slice(procs=0).spawn("owner-handles", Owner, True)
    owner.spawn_here.call_one("kid-a").get(timeout=30)
    assert owner.break_child.call_one("quit").get(timeout=30) == "exit"
    assert _failures(owner) == ["owner-handles[0].kid-a{'procs': 0/1}: child gave up"]  # scoped by its owner
    assert owner.ping.call_one().get(timeout=30) == "owner pong"


def test_a_child_on_another_proc_failing_is_offered_to_its_owner_too(procs):
    owner = procs.slice(procs=0).spawn("owner-remote", Owner, True)
    owner.spawn_on.call_one(procs.slice(procs=1), "kid-b").get(timeout=30)
    assert owner.break_child.call_one("fatal").get(timeout=30) == "exit"
    seen = _failures(owner)
    assert len(seen) == 1 and "kid-b" in seen[0] and "Fatal: child broke" in seen[0]


@pytest.mark.parametrize("cls, handle, why", [(Owner, None, "did not handle it"), (Owner, False, "did not handle it"),
                                              (Bare, True, "has no __supervise__")])
def test_an_unhandled_childs_failure_fails_the_owner_and_reaches_the_controller(procs, faults, cls, handle, why):
    name = f"owner-{cls.__name__}-{handle}".lower()
    owner = procs.slice(procs=0).spawn(name, cls, handle)
    owner.spawn_here.call_one(f"kid-{name}").get(timeout=30)
    owner.break_child.call_one("quit").get(timeout=30)
    deadline = time.monotonic() + 10
    with pytest.raises(SupervisionError) as failed:
        while time.monotonic() < deadline:  # the owner fails at the first message after the offer
            owner.ping.call_one().get(timeout=30)
            time.sleep(0.05)
    assert f"its child {name}[0].kid-{name}" in str(failed.value) and why in str(failed.value)
    procs.slice(procs=1).spawn(f"after-{name}", Child).ping.call_one().get(timeout=30)  # a session call
    assert any(f.mesh == name and why in f.reason for f in faults), faults


class Flaky(Actor):
    @endpoint
    def bad(self) -> None:
        raise ValueError("nobody reads a broadcast's answer")

    @endpoint
    def ping(self) -> str:
        return "pong"


def test_an_exception_in_a_broadcast_fails_the_actor_and_reaches_the_unhandled_fault_hook(procs, faults):
    flaky = procs.spawn("flaky", Flaky)
    flaky.bad.broadcast()
    with pytest.raises(SupervisionError, match="bad raised ValueError|no actor 'flaky'"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            flaky.ping.call().get(timeout=30)
            time.sleep(0.05)
    procs.spawn("after-flaky", Flaky).ping.call().get(timeout=30)  # the hook runs at a session call
    assert any(f.mesh == "flaky" and "ValueError" in f.reason for f in faults), faults


def test_a_broadcast_that_fails_a_supervised_actor_gets_it_restarted(procs):
    flaky = procs.spawn("flaky-supervised", Flaky, restart="permanent")
    flaky.bad.broadcast()
    deadline = time.monotonic() + 20
    while True:  # the restart is the supervisor's: calls fail until it is done, then run
        try:
            assert flaky.ping.call().get(timeout=30).values() == ["pong", "pong"]
            break
        except SupervisionError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


class Noting(Actor):
    """Writes a line to a file when it ends."""

    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.path, "a") as f:
            f.write("stopped\n")


class Parent(Actor):
    def __init__(self, procs: ProcMeshRef, path: str) -> None:
        self.here = this_proc().spawn("noting-here", Noting, path)
        self.there = procs.spawn("noting-there", Noting, path)

    @endpoint
    def check(self) -> list[str]:
        return [self.here.ping.call_one().get(timeout=30), *self.there.ping.call().get(timeout=30).values()]


def test_stopping_an_owner_stops_the_meshes_it_spawned(procs, tmp_path):
    path = tmp_path / "stops"
    parent = procs.slice(procs=0).spawn("parent", Parent, procs.slice(procs=1), str(path))
    assert parent.check.call_one().get(timeout=30) == ["pong", "pong"]
    parent.stop()
    deadline = time.monotonic() + 10
    while (path.read_text().count("stopped") if path.exists() else 0) < 2:
        assert time.monotonic() < deadline, "the owned meshes were not stopped"
        time.sleep(0.05)
    # Their names are free again on those procs.
    procs.slice(procs=1).spawn("again", Parent, procs.slice(procs=1), str(path)).stop()
