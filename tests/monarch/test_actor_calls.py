"""Meshes that travel and actors that call actors, as Monarch programs use them: a mesh passed
to an actor (as an argument, kept in its state, returned), calls from sync and async endpoints
with every adverb, ping-pong between two meshes, an actor spawning its own child mesh on
`this_proc()`, and errors crossing back (docs/design.md, "Calls made by actors")."""

from __future__ import annotations

import pickle

import pytest

from regent.controller import Session
from regent.worker import (
    Actor,
    ActorError,
    ActorMeshRef,
    ProcMeshRef,
    SupervisionError,
    concurrent_endpoint,
    current_actor_name,
    current_rank,
    endpoint,
    this_proc,
)
from regent.worker.errors import ActorExit
from regent.worker.program import offer_program


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.n = start
        self.runs = 0

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.runs += 1
        self.n += by
        return self.n

    @endpoint
    def value(self) -> int:
        return self.n

    @endpoint
    def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def boom(self) -> None:
        raise ValueError("no such thing")

    @endpoint
    def quit(self) -> None:
        raise ActorExit("asked to")


class Caller(Actor):
    """Holds a mesh reference in its state and calls through it."""

    def __init__(self, target: ActorMeshRef | None = None) -> None:
        self.target = target

    @endpoint
    def hold(self, mesh: ActorMeshRef) -> str:
        self.target = mesh
        return type(mesh).__name__

    @endpoint
    def call_all(self, by: int) -> list[int]:
        return self.target.incr.call(by).get(timeout=30).values()

    @endpoint
    async def call_all_async(self, by: int) -> list[int]:
        vm = await self.target.incr.call(by)
        return vm.values()

    @endpoint
    def call_first(self) -> int:
        return self.target.slice(procs=0).value.call_one().get(timeout=30)

    @endpoint
    def twice(self) -> list[int]:
        """Two calls of the same endpoint with the same arguments are two calls."""
        return [self.target.slice(procs=0).incr.call_one(1).get(timeout=30) for _ in range(2)]

    @endpoint
    def chosen(self) -> int:
        return self.target.rank.choose().get(timeout=30)

    @endpoint
    def streamed(self) -> list[tuple[int, int]]:
        return sorted((p.rank, v) for p, v in self.target.rank.stream())

    @endpoint
    async def streamed_async(self) -> list[tuple[int, int]]:
        return sorted([(p.rank, v) async for p, v in self.target.rank.stream()])

    @endpoint
    def broadcast_then_read(self, by: int) -> list[int]:
        self.target.incr.broadcast(by)
        return self.target.value.call().get(timeout=30).values()  # per-sender FIFO: after the broadcast

    @endpoint
    def error(self) -> tuple[str, str]:
        try:
            self.target.boom.call().get(timeout=30)
        except ActorError as e:
            return e.exc_type, e.message
        return "", ""

    @endpoint
    def failure(self) -> str:
        try:
            self.target.slice(procs=0).quit.call_one().get(timeout=30)
        except SupervisionError as e:
            return str(e)
        return ""

    @endpoint
    def spawn_child(self, name: str, start: int) -> ActorMeshRef:
        child = this_proc().spawn(name, Counter, start)
        child.incr.call_one(1).get(timeout=30)
        return child

    @endpoint
    def spawn_on(self, procs: ProcMeshRef, name: str) -> list[int]:
        mesh = procs.spawn(name, Counter, 10)
        return mesh.incr.call(5).get(timeout=30).values()

    @endpoint
    def own_proc(self) -> ProcMeshRef:
        return this_proc()

    @endpoint
    def read(self, mesh: ActorMeshRef) -> int:
        return mesh.value.call_one().get(timeout=30)


class Player(Actor):
    """Ping-pong between two meshes: each hit is returned by the other side until n runs out."""

    def __init__(self) -> None:
        self.hits = 0

    @concurrent_endpoint
    async def hit(self, other: ActorMeshRef, me: ActorMeshRef, n: int) -> int:
        self.hits += 1
        if n == 0:
            return 0
        back = await other.slice(procs=current_rank().rank).hit.call_one(me, other, n - 1)
        return back + 1

    @endpoint
    def count(self) -> int:
        return self.hits


@pytest.fixture(scope="module")
def session():
    with Session("monarch-actor-calls") as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 2})


@pytest.fixture(scope="module")
def counters(procs):
    return procs.spawn("counters", Counter)


@pytest.fixture(scope="module")
def caller(procs, counters):
    return procs.slice(procs=1).spawn("caller", Caller, counters)


def test_a_mesh_pickles_to_a_reference_without_its_session(counters):
    ref = pickle.loads(pickle.dumps(counters))
    assert isinstance(ref, ActorMeshRef)
    assert ref.name == "counters" and ref.dims == {"hosts": 1, "procs": 2} and len(ref) == 2
    assert ref.slice(procs=1).ranks == (1,)
    with pytest.raises(AttributeError, match="no endpoint 'nope'"):
        ref.nope  # noqa: B018


def test_a_reference_called_in_the_program_is_its_mesh_and_outside_any_session_says_where(session, counters):
    ref = pickle.loads(pickle.dumps(counters))
    assert ref.value.call().get(timeout=30).values() == counters.value.call().get(timeout=30).values()
    offer_program(session, withdraw=True)
    try:
        with pytest.raises(RuntimeError, match="only be made by an actor"):
            ref.value.call()
    finally:
        offer_program(session)


def test_a_mesh_passed_at_spawn_is_kept_in_state_and_called_from_a_sync_endpoint(caller, counters):
    before = counters.value.call().get(timeout=30).values()
    got = caller.call_all.call_one(2).get(timeout=60)
    assert got == [v + 2 for v in before]


def test_an_async_endpoint_awaits_the_calls_it_makes(caller, counters):
    before = counters.value.call().get(timeout=30).values()
    assert caller.call_all_async.call_one(3).get(timeout=60) == [v + 3 for v in before]


def test_a_mesh_passed_as_an_argument_replaces_the_held_one(procs, caller, counters):
    others = procs.spawn("others", Counter, 100)
    assert caller.hold.call_one(others).get(timeout=30) == "ActorMeshRef"
    try:
        assert caller.call_first.call_one().get(timeout=30) == 100
    finally:
        caller.hold.call_one(counters).get(timeout=30)
        others.stop()


def test_each_call_an_endpoint_makes_runs_once_even_with_the_same_arguments(caller, counters):
    start = counters.slice(procs=0).value.call_one().get(timeout=30)
    assert caller.twice.call_one().get(timeout=60) == [start + 1, start + 2]


def test_choose_stream_and_broadcast_from_an_actor(caller, counters):
    assert caller.chosen.call_one().get(timeout=30) in (0, 1)
    assert caller.streamed.call_one().get(timeout=30) == [(0, 0), (1, 1)]
    assert caller.streamed_async.call_one().get(timeout=30) == [(0, 0), (1, 1)]
    before = counters.value.call().get(timeout=30).values()
    assert caller.broadcast_then_read.call_one(7).get(timeout=30) == [v + 7 for v in before]


def test_an_error_in_the_callee_reaches_the_calling_actor_as_actor_error(caller):
    assert caller.error.call_one().get(timeout=30) == ("ValueError", "no such thing")


def test_a_callee_that_fails_gives_the_calling_actor_a_supervision_error(procs, caller, counters):
    victims = procs.spawn("victims", Counter)
    try:
        caller.hold.call_one(victims).get(timeout=30)
        assert "stopped (abnormal)" in caller.failure.call_one().get(timeout=30)
    finally:
        caller.hold.call_one(counters).get(timeout=30)


def test_an_actor_spawns_a_child_mesh_on_its_own_proc_and_returns_it(caller):
    child = caller.spawn_child.call_one("child", 40).get(timeout=60)
    assert isinstance(child, ActorMeshRef) and child.name == "caller[0].child" and len(child) == 1
    # The reference goes back to an actor, which calls it.
    assert caller.read.call_one(child).get(timeout=30) == 41
    with pytest.raises(ActorError, match="already lives"):
        caller.spawn_child.call_one("child", 0).get(timeout=60)


def test_the_program_calls_stops_and_spawns_on_meshes_an_actor_sent_back(caller):
    child = caller.spawn_child.call_one("returned", 60).get(timeout=60)
    assert child.value.call_one().get(timeout=30) == 61  # a journaled call of the program's
    child.incr.broadcast(2)
    assert child.slice(procs=0).value.call_one().get(timeout=30) == 63
    assert caller.read.call_one(child).get(timeout=30) == 63
    child.stop()
    with pytest.raises(SupervisionError):
        child.value.call_one().get(timeout=30)
    assert caller.spawn_child.call_one("returned", 0).get(timeout=60).value.call_one().get(timeout=30) == 1
    here = caller.own_proc.call_one().get(timeout=30)
    assert here.spawn("placed-by-program", Counter, 5).value.call_one().get(timeout=30) == 5


def test_an_actor_spawns_on_a_proc_mesh_it_was_given(procs, caller):
    assert caller.spawn_on.call_one(procs, "grandchildren").get(timeout=60) == [15, 15]


def test_ping_pong_between_two_meshes(procs):
    left = procs.spawn("left", Player)
    right = procs.spawn("right", Player)
    try:
        assert left.hit.call(right, left, 6).get(timeout=60).values() == [6, 6]
        assert left.count.call().get(timeout=30).values() == [4, 4]
        assert right.count.call().get(timeout=30).values() == [3, 3]
    finally:
        left.stop()
        right.stop()


class Sleeper(Actor):
    @endpoint
    def pid(self) -> int:
        import os

        return os.getpid()

    @endpoint
    def nap(self, seconds: float) -> float:
        import time

        time.sleep(seconds)  # holds the proc's only thread: it answers no ping meanwhile
        return seconds


class Waiter(Actor):
    @endpoint
    def wait_on(self, sleeper: ActorMeshRef, seconds: float) -> str:
        try:
            return f"answered {sleeper.nap.call_one(seconds).get(timeout=120)}"
        except SupervisionError as e:
            return f"failed: {e}"


def test_a_callee_busy_longer_than_the_liveness_check_is_waited_for(session):
    procs = session.spawn_procs(per_host={"procs": 2})
    try:
        sleeper = procs.slice(procs=0).spawn("busy-sleeper", Sleeper)
        waiter = procs.slice(procs=1).spawn("busy-waiter", Waiter)
        assert waiter.wait_on.call_one(sleeper, 7.0).get(timeout=60) == "answered 7.0"
    finally:
        procs.stop()


def test_a_callee_whose_proc_dies_fails_the_calling_actors_call(session):
    import os
    import signal

    procs = session.spawn_procs(per_host={"procs": 2})
    try:
        sleeper = procs.slice(procs=0).spawn("dying-sleeper", Sleeper)
        waiter = procs.slice(procs=1).spawn("dying-waiter", Waiter)
        pid = sleeper.pid.call_one().get(timeout=30)
        waited = waiter.wait_on.call_one(sleeper, 60.0)
        assert not waited.wait(1.0)
        os.kill(pid, signal.SIGKILL)
        answer = waited.get(timeout=60)
        assert answer.startswith("failed:") and "is gone" in answer, answer
    finally:
        procs.stop()


class To(Actor):
    @endpoint
    async def whoami(self) -> str:
        return current_actor_name()


class From(Actor):
    @endpoint
    async def fetch(self, to: ActorMeshRef) -> list[str]:
        return [v async for _, v in to.whoami.stream()]


def test_a_mesh_passed_to_a_mesh_on_other_procs_streams_each_members_name(session):
    """Monarch's test_mesh_passed_to_mesh_on_different_proc_mesh."""
    f = session.spawn_procs(per_host={"gpus": 2}).spawn("from", From)
    t = session.spawn_procs(per_host={"gpus": 2}).spawn("to", To)
    names = [n for got in f.fetch.call(t).get(timeout=60).values() for n in sorted(got)]
    assert names == ["to{'hosts': 0/1, 'gpus': 0/2}", "to{'hosts': 0/1, 'gpus': 1/2}"] * 2
