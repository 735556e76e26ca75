"""A `__cleanup__` that calls other actors, as Monarch's test_cleanup, test_cleanup_async and
test_recursive_stop do: sync and async cleanups waiting on a counter of their own proc (async
endpoints), and an owner's stop reaching the cleanups of the meshes it spawned, on procs it was
passed and on procs it spawned itself. A stop sent again (a new controller) finds the cleanup's
calls by their ids and runs none twice."""

from __future__ import annotations

import time

import pytest

from regent.controller import Session
from regent.worker import Actor, ActorMeshRef, ProcMeshRef, endpoint, this_host


class Counter(Actor):
    def __init__(self, v: int) -> None:
        self.v = v

    @endpoint
    async def incr(self) -> None:
        self.v += 1

    @endpoint
    async def value(self) -> int:
        return self.v


class ActorWithCleanup(Actor):
    def __init__(self, counter: ActorMeshRef) -> None:
        self.counter = counter

    @endpoint
    def check(self) -> None:
        pass

    def __cleanup__(self, exc: Exception | None) -> None:
        self.counter.incr.call_one().get(timeout=30)


class ActorWithAsyncCleanup(Actor):
    def __init__(self, counter: ActorMeshRef) -> None:
        self.counter = counter

    @endpoint
    async def check(self) -> None:
        pass

    async def __cleanup__(self, exc: Exception | None) -> None:
        await self.counter.incr.call_one()


class WrapperActor(Actor):
    """Spawns a mesh on procs it was passed and one on procs it spawned; no __cleanup__ of its own."""

    def __init__(self, procs: ProcMeshRef, counter: ActorMeshRef) -> None:
        self.procs = this_host().spawn_procs(per_host={"procs": 1})
        self.on_passed = procs.spawn("inner_passed", ActorWithCleanup, counter)
        self.on_owned = self.procs.spawn("inner_owned", ActorWithCleanup, counter)

    @endpoint
    def check(self) -> None:
        self.on_passed.check.call().get(timeout=30)
        self.on_owned.check.call().get(timeout=30)


@pytest.fixture(scope="module")
def session():
    with Session("monarch-cleanup-calls") as s:
        yield s


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", [ActorWithCleanup, ActorWithAsyncCleanup], ids=["sync", "async"])
def test_cleanup_calls_a_counter_on_its_own_proc(session, cls):
    procs = session.spawn_procs(per_host={"procs": 1})
    counter = procs.spawn("counter", Counter, 0)
    cleanup = procs.spawn("cleanup", cls, counter)
    cleanup.check.call_one().get(timeout=30)
    cleanup.stop()  # returns once __cleanup__ is done, its call answered
    assert counter.value.call_one().get(timeout=30) == 1
    procs.stop()


@pytest.mark.timeout(120)
def test_recursive_stop_runs_the_cleanups_of_what_the_owner_spawned(session):
    procs = session.spawn_procs(per_host={"procs": 1})
    counter = procs.spawn("rs_counter", Counter, 0)
    wrapper = procs.spawn("wrapper", WrapperActor, procs, counter)
    wrapper.check.call_one().get(timeout=30)
    wrapper.stop()
    # The owner's stop of its meshes is not waited for (Monarch's neither): wait for the count.
    deadline = time.monotonic() + 30
    while counter.value.call_one().get(timeout=30) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counter.value.call_one().get(timeout=30) == 2
    procs.stop()


class FaultActor(Actor):
    @endpoint
    def sigsegv(self) -> None:
        import ctypes

        ctypes.string_at(0)

    @endpoint
    def check(self) -> str:
        return "ok"


@pytest.mark.timeout(120)
def test_sigsegv_then_stop_then_a_mesh_of_the_same_name_on_new_procs():
    """Monarch's test_sigsegv_handling: the name of a mesh whose procs died, or were stopped,
    is free again."""
    from regent.worker import SupervisionError

    with Session("monarch-sigsegv", on_unhandled_fault=lambda failure: None) as s:
        procs = s.spawn_procs(per_host={"procs": 2})
        actor = procs.spawn("fault", FaultActor)
        assert actor.check.call().get(timeout=30).values() == ["ok", "ok"]
        with pytest.raises(SupervisionError):
            actor.sigsegv.call().get(timeout=60)
        with pytest.raises(SupervisionError):
            actor.check.call().get(timeout=60)
        # Its procs are dead: the name is free for a mesh on new procs, stopped or not.
        again = s.spawn_procs(per_host={"procs": 2})
        assert again.spawn("fault", FaultActor).check.call().get(timeout=30).values() == ["ok", "ok"]
        with pytest.raises(ValueError, match="already exists"):
            again.spawn("fault", FaultActor)  # that one lives
        procs.stop()  # the dead procs: the live mesh keeps its name
        with pytest.raises(ValueError, match="already exists"):
            again.spawn("fault", FaultActor)
        again.stop()
        procs = s.spawn_procs(per_host={"procs": 2})
        actor = procs.spawn("fault", FaultActor)
        assert actor.check.call().get(timeout=30).values() == ["ok", "ok"]


class Printer(Actor):
    @endpoint
    def hi(self) -> str:
        return "hi"


class Asker(Actor):
    @endpoint
    def ask(self, mesh: ActorMeshRef) -> str:
        from regent.worker import SupervisionError

        try:
            return mesh.hi.call_one().get(timeout=30)
        except SupervisionError as e:
            return str(e)


@pytest.mark.timeout(120)
def test_a_call_to_a_stopped_actor_says_it_was_stopped_and_by_whom(session):
    procs = session.spawn_procs(per_host={"procs": 1})
    printer = procs.spawn("printer", Printer)
    asker = procs.spawn("asker", Asker)
    assert asker.ask.call_one(printer).get(timeout=30) == "hi"
    printer.stop()
    said = asker.ask.call_one(printer).get(timeout=30)
    assert "no actor 'printer'" in said and "printer was stopped by the program" in said, said
    procs.stop()


class RunForeverOnInitActor(Actor):
    """Monarch's test_run_forever_on_init, with its work as a task its __init__ starts: it
    spawns a counter, sends it through the program's port, and never ends."""

    def __init__(self, procs: ProcMeshRef, port) -> None:
        import asyncio

        async def forever() -> None:
            counter = procs.spawn("counter_from_init", Counter, 42)
            port.send(counter)
            await asyncio.Event().wait()

        self.work = asyncio.get_event_loop().create_task(forever())  # the proc's loop; none runs in __init__

    @endpoint
    async def unreachable(self) -> None:
        pass


@pytest.mark.timeout(120)
def test_run_forever_on_init_its_side_effects_arrive_and_the_actor_stops(session):
    procs = session.spawn_procs(per_host={"procs": 1})
    port, rx = session.open_port()
    forever = procs.spawn("forever", RunForeverOnInitActor, procs, port)
    counter = rx.recv().get(timeout=30)
    assert counter.value.call_one().get(timeout=30) == 42
    forever.stop()
    procs.stop()


class _StoreActor(Actor):
    def __init__(self) -> None:
        self._store: dict = {}

    @endpoint
    def put(self, key: str, value: int) -> None:
        self._store[key] = value

    @endpoint
    def get(self, key: str) -> int:
        return self._store[key]


class Reader(Actor):
    @endpoint
    def read(self, store: ActorMeshRef, key: str) -> int:
        return store.get.call_one(key).get(timeout=30)

    @endpoint
    def own_controller(self) -> str:
        from regent import get_or_spawn_controller

        try:
            get_or_spawn_controller("store", _StoreActor)
        except RuntimeError as e:
            return str(e)
        return ""


@pytest.mark.timeout(120)
def test_get_or_spawn_controller_gives_the_programs_one_actor_of_a_name(session):
    from regent import get_or_spawn_controller

    store = get_or_spawn_controller("store", _StoreActor)
    store.put.call_one("a", 1).get(timeout=30)
    assert get_or_spawn_controller("store", _StoreActor) is store  # the same one, not spawned again
    assert get_or_spawn_controller("store", _StoreActor).get.call_one("a").get(timeout=30) == 1
    with pytest.raises(TypeError, match="is a _StoreActor, not a Reader"):
        get_or_spawn_controller("store", Reader)
    procs = session.spawn_procs(per_host={"procs": 1})
    reader = procs.spawn("reader", Reader)
    assert reader.read.call_one(store, "a").get(timeout=30) == 1  # handed to an actor as a mesh
    assert "pass the mesh to this actor" in reader.own_controller.call_one().get(timeout=30)
    procs.stop()


class Quitter(Actor):
    @endpoint
    def quit(self) -> None:
        from regent.worker.errors import ActorExit

        raise ActorExit("done here")

    @endpoint
    def check(self) -> str:
        return "ok"


@pytest.mark.timeout(120)
def test_a_mesh_whose_members_all_failed_frees_its_name_on_live_procs():
    from regent.worker import SupervisionError

    with Session("monarch-failed-name", on_unhandled_fault=lambda failure: None) as s:
        procs = s.spawn_procs(per_host={"procs": 2})
        q = procs.spawn("quitter", Quitter)
        with pytest.raises(SupervisionError):
            q.slice(procs=0).quit.call_one().get(timeout=30)
        with pytest.raises(ValueError, match="already exists"):
            procs.spawn("quitter", Quitter)  # one member still lives
        with pytest.raises(SupervisionError):
            q.slice(procs=1).quit.call_one().get(timeout=30)
        assert procs.spawn("quitter", Quitter).check.call().get(timeout=30).values() == ["ok", "ok"]


class Stopper(Actor):
    @endpoint
    def stop_it(self, mesh: ActorMeshRef) -> None:
        mesh.stop()


class PrinterOwner(Actor):
    def __init__(self, procs: ProcMeshRef) -> None:
        self.printers = procs.spawn("owned_printer", Printer)

    @endpoint
    def printers_mesh(self) -> ActorMeshRef:
        return self.printers


@pytest.mark.timeout(120)
def test_a_call_to_an_actor_stopped_by_an_actor_or_by_its_owner_ending_names_that_actor(session):
    procs = session.spawn_procs(per_host={"procs": 1})
    asker = procs.spawn("asker2", Asker)
    printer = procs.spawn("printer2", Printer)
    procs.spawn("stopper", Stopper).stop_it.call_one(printer).get(timeout=30)
    said = asker.ask.call_one(printer).get(timeout=30)
    assert "printer2 was stopped by actor stopper[0]" in said, said

    owner = procs.spawn("printer_owner", PrinterOwner, procs)
    owned = owner.printers_mesh.call_one().get(timeout=30)
    assert asker.ask.call_one(owned).get(timeout=30) == "hi"
    owner.stop()
    deadline = time.monotonic() + 30  # an owner's stop of its meshes is not waited for
    while (said := asker.ask.call_one(owned).get(timeout=30)) == "hi" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "owned_printer was stopped by its owner printer_owner[0] ending" in said, said
    procs.stop()


class Ticker(Actor):
    """Work that goes on forever, started by __init__ as a task: it ends with the actor."""

    def __init__(self, counter: ActorMeshRef) -> None:
        import asyncio

        async def tick() -> None:
            while True:
                await counter.incr.call_one()
                await asyncio.sleep(0.02)

        asyncio.get_event_loop().create_task(tick())

    @endpoint
    def check(self) -> None:
        pass


@pytest.mark.timeout(120)
def test_a_task_an_actor_started_is_cancelled_when_the_actor_is_stopped(session):
    procs = session.spawn_procs(per_host={"procs": 1})
    counter = procs.spawn("tick_counter", Counter, 0)
    ticker = procs.spawn("ticker", Ticker, counter)
    deadline = time.monotonic() + 30
    while counter.value.call_one().get(timeout=30) < 3:
        assert time.monotonic() < deadline, "the task never ticked"
        time.sleep(0.05)
    ticker.stop()
    stopped_at = counter.value.call_one().get(timeout=30)
    time.sleep(0.5)
    assert counter.value.call_one().get(timeout=30) <= stopped_at + 1  # a tick in flight at the stop
    procs.stop()
