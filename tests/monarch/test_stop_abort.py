"""Monarch's `stop()` is a future: programs write `mesh.stop().get()`, `await procs.stop()` and
`stop(reason=...)`. regent's stop returns once the mesh is stopped, with a done future, in the
program (sequential and `s.run`) and in actors (sync `.get()`, async `await`); a reason given
to a proc mesh's stop is in the error of a later call to its actors. And two more of Monarch's
spellings inside an actor: `context().actor_instance.abort(reason)` fails the actor (its
caller gets a SupervisionError with the reason, its restart policy brings it back), and
`self.logger` is a logger named for the actor's class."""

from __future__ import annotations

import pytest

from regent.controller import Session
from regent.worker import Actor, ActorMeshRef, RestartPolicy, SupervisionError, context, endpoint


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


class Aborter(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def count(self) -> int:
        self.calls += 1
        return self.calls

    @endpoint
    def give_up(self, reason: str) -> None:
        context().actor_instance.abort(reason)

    @endpoint
    def logger_name(self) -> tuple[str, int]:
        self.logger.debug("a debug line from the actor")
        return self.logger.name, self.logger.level


class Stopper(Actor):
    @endpoint
    def stop_sync(self, mesh: ActorMeshRef) -> object:
        return mesh.stop(reason="done with it").get(timeout=30)

    @endpoint
    async def stop_async(self, mesh: ActorMeshRef) -> object:
        return await mesh.stop()


@pytest.fixture(scope="module")
def session():
    with Session("monarch-stop-future") as s:
        yield s


@pytest.mark.timeout(120)
def test_the_programs_stop_returns_a_done_future(session):
    procs = session.spawn_procs(per_host={"procs": 1})
    mesh = procs.spawn("sf_echo", Echo)
    assert mesh.echo.call_one(1).get(timeout=30) == 1
    stopped = mesh.stop()
    assert stopped.done() and stopped.get() is None
    with pytest.raises(SupervisionError):
        mesh.echo.call_one(2).get(timeout=30)
    again = procs.spawn("sf_echo", Echo)  # the name is free once its mesh stopped
    assert again.echo.call_one(3).get(timeout=30) == 3
    assert procs.stop(reason="the test is over").get() is None
    with pytest.raises(SupervisionError, match="the test is over"):
        again.echo.call_one(4).get(timeout=30)


@pytest.mark.timeout(120)
def test_an_async_program_awaits_stop(session):
    procs = session.spawn_procs(per_host={"procs": 1})
    mesh = procs.spawn("sf_async", Echo)

    async def main() -> object:
        assert await mesh.echo.call_one(5) == 5
        got = await mesh.stop()
        return got, await procs.stop()

    assert session.run(main()) == (None, None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["stop_sync", "stop_async"])
def test_an_actor_stops_a_mesh_and_waits_on_the_future(session, method):
    procs = session.spawn_procs(per_host={"procs": 1})
    target = procs.spawn(f"sf_target_{method}", Echo)
    stopper = procs.spawn(f"sf_stopper_{method}", Stopper)
    assert getattr(stopper, method).call_one(target).get(timeout=30) is None
    with pytest.raises(SupervisionError):
        target.echo.call_one(6).get(timeout=30)
    procs.stop()


@pytest.mark.timeout(120)
def test_abort_fails_the_actor_and_its_policy_restarts_it(session):
    procs = session.spawn_procs(per_host={"procs": 1})
    mesh = procs.spawn("sf_abort", Aborter, restart=RestartPolicy(restart="permanent"))
    assert mesh.count.call_one().get(timeout=30) == 1
    with pytest.raises(SupervisionError, match="out of patience"):
        mesh.give_up.call_one("out of patience").get(timeout=30)
    assert mesh.count.call_one().get(timeout=30) == 1  # a new incarnation: its state starts again
    assert mesh.logger_name.call_one().get(timeout=30) == ("Aborter", 10)
    procs.stop()
