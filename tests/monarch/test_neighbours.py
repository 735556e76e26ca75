"""An actor waiting on another actor of its own proc, as Monarch's python/tests do it
(test_choose, test_value_mesh, test_mesh_passed_to_mesh): a sync endpoint that waits on an
async one, a stream from a sync endpoint, an actor waiting on itself (an error at once), and
what a sync endpoint sees of the event loop (none, as in Monarch)."""

from __future__ import annotations

import asyncio
import time
import warnings

import pytest

from regent.controller import Session
from regent.worker import (
    Actor,
    ActorError,
    ActorMeshRef,
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    endpoint,
)


class Counter(Actor):
    """Monarch's Counter: async endpoints only."""

    def __init__(self, v: int) -> None:
        self.v = v

    @endpoint
    async def incr(self) -> None:
        self.v += 1

    @endpoint
    async def value(self) -> int:
        return self.v


class SyncCounter(Actor):
    def __init__(self, c: ActorMeshRef) -> None:
        self.c = c

    @endpoint
    def value_sync_endpoint(self) -> int:
        return self.c.value.choose().get(timeout=30)

    @endpoint
    def twice(self) -> list[int]:
        """Two waits in one call: the endpoint resumes where it waited, each time."""
        first = self.c.value.choose().get(timeout=30)
        self.c.incr.broadcast()
        return [first, self.c.value.choose().get(timeout=30)]


class Indirect(Actor):
    @endpoint
    async def call_value(self, c: ActorMeshRef) -> int:
        return await c.value.choose()


class CastToCounter(Actor):
    @endpoint
    def doit(self, c: ActorMeshRef) -> list:
        return list(c.value.call().get())  # Monarch's: (point, value) pairs


class To(Actor):
    @endpoint
    async def whoami(self) -> str:
        return f"{current_actor_name()}#{current_rank().rank}"


class From(Actor):
    @endpoint
    async def fetch(self, to: ActorMeshRef) -> list[str]:
        return [v async for _, v in to.whoami.stream()]

    @endpoint
    def fetch_sync(self, to: ActorMeshRef) -> list[str]:
        return [v for _, v in to.whoami.stream()]


class Selfish(Actor):
    """Waits on a call to itself: it could only run after the wait."""

    def __init__(self, me: ActorMeshRef | None = None) -> None:
        self.me = me

    @endpoint
    def keep(self, me: ActorMeshRef) -> None:
        self.me = me

    @endpoint
    def ask_myself(self) -> int:
        return self.me.slice(procs=current_rank().rank).answer.call_one().get(timeout=30)

    @endpoint
    async def await_myself(self) -> int:
        return await self.me.slice(procs=current_rank().rank).answer.call_one()

    @endpoint
    async def stream_myself(self) -> list[int]:
        return [v async for _, v in self.me.answer.stream()]

    @concurrent_endpoint
    async def await_myself_concurrently(self) -> int:
        """Not a deadlock: a concurrent endpoint lets the actor's next message in while it awaits."""
        return await self.me.slice(procs=current_rank().rank).answer.call_one()

    @endpoint
    async def ask_myself_from_a_task(self) -> None:
        """A task of its own, which waits after this endpoint returned: no deadlock."""
        me = self.me.slice(procs=current_rank().rank)

        async def ask() -> None:
            self.got = await me.answer.call_one()

        self.got: int | None = None
        self.task = asyncio.get_running_loop().create_task(ask())

    @endpoint
    def got_from_task(self) -> int | None:
        return self.got

    @endpoint
    def answer(self) -> int:
        return 42


class LoopProbe(Actor):
    @endpoint
    def sync_sees(self) -> str:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return "no running loop"
        return "a running loop"

    @endpoint
    def who(self) -> tuple[str, str, int]:
        me = context().actor_instance
        return str(me), current_actor_name(), me.rank

    @endpoint
    def runs_its_own(self) -> int:
        async def seven() -> int:
            await asyncio.sleep(0)
            return 7
        return asyncio.run(seven())

    @endpoint
    def get_in_sync(self, c: ActorMeshRef) -> tuple[int, list[str]]:
        """Monarch's test_sync_endpoint_has_no_visible_loop_and_get_does_not_warn."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = c.value.choose().get()
        return value, [str(w.message) for w in caught]

    @endpoint
    async def get_in_async(self, c: ActorMeshRef) -> tuple[int, list[str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = c.value.choose().get(timeout=30)
        return value, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def session():
    with Session("monarch-neighbours") as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 2})


@pytest.mark.timeout(120)
def test_choose_a_sync_endpoint_waits_on_an_async_neighbour(procs):
    v = procs.spawn("counter", Counter, 3)
    i = procs.spawn("indirect", Indirect)
    v.incr.broadcast()
    result = v.value.choose().get(timeout=30)
    assert result == 4
    assert i.call_value.choose(v).get(timeout=30) == result
    v2 = procs.spawn("sync_counter", SyncCounter, v)
    assert v2.value_sync_endpoint.choose().get(timeout=30) == result
    assert v2.value_sync_endpoint.call().get(timeout=30).values() == [4, 4]
    assert v2.slice(procs=0).twice.call_one().get(timeout=30) == [4, 5]


@pytest.mark.timeout(120)
def test_value_mesh_a_sync_endpoint_casts_to_a_mesh_with_a_member_on_its_proc(procs):
    counter = procs.spawn("vm_counter", Counter, 0)
    counter.slice(procs=1).incr.broadcast()
    x = counter.value.call().get(timeout=30)
    assert x.item(hosts=0, procs=0) == 0 and x.item(hosts=0, procs=1) == 1
    assert x.slice(hosts=0, procs=1).item() == 1
    n = procs.spawn("ctc", CastToCounter)
    assert n.slice(procs=0).doit.call_one(counter).get(timeout=30) == list(x)


@pytest.mark.timeout(120)
def test_mesh_passed_to_mesh_streams_from_neighbours_async_and_sync(procs):
    f = procs.spawn("from", From)
    t = procs.spawn("to", To)
    t.whoami.call().get(timeout=30)
    everything = [y for _, got in f.fetch.stream(t) for y in got]
    assert len(everything) == 4 and len(set(everything)) == 2
    assert set(f.slice(procs=1).fetch_sync.call_one(t).get(timeout=30)) == set(everything)


@pytest.mark.timeout(120)
def test_an_actor_waiting_on_itself_fails_at_once_naming_both_ends(procs):
    s = procs.spawn("selfish", Selfish)
    s.keep.call(s).get(timeout=30)
    with pytest.raises(ActorError) as e:
        s.slice(procs=1).ask_myself.call_one().get(timeout=10)
    assert e.value.exc_type == "DeadlockError"
    assert "selfish" in e.value.message and "answer" in e.value.message
    assert s.slice(procs=1).answer.call_one().get(timeout=30) == 42  # it serves on
    for waits in ("await_myself", "stream_myself"):  # an async endpoint awaiting itself: the same
        with pytest.raises(ActorError) as e:
            getattr(s.slice(procs=0), waits).call_one().get(timeout=10)
        assert e.value.exc_type == "DeadlockError", e.value
        assert "selfish{" in e.value.message and "selfish[0].answer" in e.value.message
    assert s.slice(procs=0).await_myself_concurrently.call_one().get(timeout=30) == 42
    s.slice(procs=0).ask_myself_from_a_task.call_one().get(timeout=30)
    deadline = time.monotonic() + 30
    while (got := s.slice(procs=0).got_from_task.call_one().get(timeout=30)) is None:
        assert time.monotonic() < deadline, "the task's call to its own actor never ran"
        time.sleep(0.05)
    assert got == 42


@pytest.mark.timeout(120)
def test_a_sync_endpoint_sees_no_running_loop_and_get_in_an_async_one_warns(procs):
    p = procs.spawn("probe", LoopProbe)
    c = procs.spawn("probe_counter", Counter, 9)
    assert p.slice(procs=0).sync_sees.call_one().get(timeout=30) == "no running loop"
    assert p.slice(procs=0).runs_its_own.call_one().get(timeout=30) == 7
    shown, name, rank = p.slice(procs=1).who.call_one().get(timeout=30)
    assert shown == name and shown.startswith("probe{") and rank == 1
    value, warned = p.slice(procs=0).get_in_async.call_one(c.slice(procs=1)).get(timeout=30)
    assert value == 9
    assert any("active event loop" in w for w in warned), warned
    assert p.slice(procs=1).get_in_sync.call_one(c.slice(procs=1)).get(timeout=30) == (9, [])


class Kid(Actor):
    @endpoint
    def whose(self) -> str:
        return context().mesh


class Parent(Actor):
    """Monarch's ErrorActorWithSupervise: spawns its child mesh, always of one name, in __init__."""

    def __init__(self, procs) -> None:
        self.kids = procs.spawn("error_actor", Kid)

    @endpoint
    def ask(self) -> list[str]:
        return self.kids.whose.call().get(timeout=30).values()


@pytest.mark.timeout(120)
def test_owners_spawning_a_child_mesh_of_one_name_on_the_same_procs_do_not_collide(procs):
    a = procs.spawn("parent_a", Parent, procs)  # two owners, each spawning "error_actor" on both procs
    b = procs.spawn("parent_b", Parent, procs)
    assert a.ask.call().get(timeout=30).values() == [["parent_a[0].error_actor"] * 2, ["parent_a[1].error_actor"] * 2]
    assert b.slice(procs=1).ask.call_one().get(timeout=30) == ["parent_b[1].error_actor"] * 2


class InitCaller(Actor):
    """Its __init__ waits on an async endpoint of its own proc."""

    def __init__(self, c: ActorMeshRef) -> None:
        self.seen = c.slice(procs=current_rank().rank).value.call_one().get(timeout=30)

    @endpoint
    def seen_at_init(self) -> int:
        return self.seen


@pytest.mark.timeout(120)
def test_an_init_waits_on_an_async_neighbour_and_its_spawn_returns_after(procs):
    c = procs.spawn("init_counter", Counter, 5)
    c.slice(procs=1).incr.broadcast()
    ic = procs.spawn("init_caller", InitCaller, c)
    assert ic.seen_at_init.call().get(timeout=30).values() == [5, 6]


class Gate(Actor):
    """Holds each `wait_open` until `open` (a concurrent endpoint, so `open` gets in)."""

    def __init__(self) -> None:
        self.opened: asyncio.Event | None = None
        self.waiting = 0

    def _event(self) -> asyncio.Event:
        if self.opened is None:
            self.opened = asyncio.Event()
        return self.opened

    @concurrent_endpoint
    async def wait_open(self) -> str:
        self.waiting += 1
        await self._event().wait()
        return "open"

    @endpoint
    async def waiters(self) -> int:
        return self.waiting

    @endpoint
    async def open(self) -> None:
        self._event().set()


class Holder(Actor):
    def __init__(self) -> None:
        self.log: list = []

    @endpoint
    def hold(self, gate: ActorMeshRef) -> str:
        self.log.append("hold")
        got = gate.wait_open.call_one().get(timeout=60)
        self.log.append(got)
        return got

    @endpoint
    def note(self, i: int) -> None:
        self.log.append(i)

    @endpoint
    def seen(self) -> list:
        return list(self.log)


class Neighbour(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"


@pytest.mark.timeout(120)
def test_a_sync_endpoint_waiting_on_a_neighbour_holds_its_own_actors_calls_in_order_while_the_proc_serves(procs):
    """One message at a time per actor, not per proc: while `hold` waits, the same sender's
    later calls to its actor wait behind it, in order, and other actors of the proc run."""
    gate = procs.spawn("hold_gate", Gate).slice(procs=0)
    holder = procs.spawn("holder", Holder).slice(procs=0)
    neighbour = procs.spawn("hold_neighbour", Neighbour).slice(procs=0)
    held = holder.hold.call_one(gate)
    notes = [holder.note.call_one(i) for i in range(3)]
    deadline = time.monotonic() + 30
    while gate.waiters.call_one().get(timeout=30) == 0:
        assert time.monotonic() < deadline, "hold never called the gate"
        time.sleep(0.05)
    assert neighbour.ping.call_one().get(timeout=30) == "pong"  # a sync endpoint of the proc runs
    assert not held.wait(timeout=0.5) and not any(n.done() for n in notes)
    gate.open.call_one().get(timeout=30)
    assert held.get(timeout=30) == "open"
    assert [n.get(timeout=30) for n in notes] == [None, None, None]
    assert holder.seen.call_one().get(timeout=30) == ["hold", "open", 0, 1, 2]
