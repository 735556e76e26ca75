"""Concurrent endpoints (Monarch's `@concurrent_endpoint`): a call of one does not hold its
actor's mailbox once it has started, so gates, long polls and ping-pongs do not deadlock,
while calls of every other endpoint keep running one at a time, in order. Real host agent,
real procs; wire-level resends through a raw peer."""

from __future__ import annotations

import asyncio
import time

import pytest

from regent.controller import ActorError, Session, SupervisionError
from regent.wire import Kind
from regent.worker import Actor, concurrent_endpoint, endpoint
from tests.runtime.rawpeer import RawPeer


class Gate(Actor):
    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.opened = asyncio.Event()
        self.log: list[str] = []
        self.waits = 0
        self.items: asyncio.Queue = asyncio.Queue()

    @concurrent_endpoint
    async def wait(self) -> str:
        self.waits += 1
        self.log.append("waiting")
        self.ready.set()
        await self.opened.wait()
        self.log.append("opened")
        return "done"

    @endpoint
    async def release_when_ready(self) -> str:
        await self.ready.wait()
        self.opened.set()
        return "released"

    @endpoint
    def release(self) -> None:
        self.opened.set()

    @concurrent_endpoint
    async def poll(self) -> object:
        return await self.items.get()

    @endpoint
    def push(self, item: object) -> None:
        self.items.put_nowait(item)

    @endpoint
    async def step(self, name: str, delay: float) -> None:
        self.log.append(f"start {name}")
        await asyncio.sleep(delay)
        self.log.append(f"end {name}")

    @endpoint
    def note(self, name: str) -> None:
        self.log.append(name)

    @endpoint
    def seen(self) -> list[str]:
        return list(self.log)

    @endpoint
    def wait_count(self) -> int:
        return self.waits

    @concurrent_endpoint
    async def fail(self) -> None:
        await asyncio.sleep(0)
        raise KeyError("concurrent boom")

    @concurrent_endpoint
    async def fatal(self) -> None:
        await self.ready.wait()
        raise Fatal("concurrent fatal")

    @endpoint
    def ping(self) -> str:
        return "pong"


class Fatal(BaseException):
    """Not an Exception: no ActorError can carry it, so the actor fails."""


class Ending(Actor):
    """Records, in a file, the order in which a running concurrent call was cancelled and
    __cleanup__ ran."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.started = asyncio.Event()

    def _write(self, text: str) -> None:
        with open(self.path, "a") as f:
            f.write(text + "\n")

    @concurrent_endpoint
    async def run(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self._write("cancelled")
            raise

    @endpoint
    async def running(self) -> bool:
        await self.started.wait()
        return True

    def __cleanup__(self, exc: BaseException | None) -> None:
        self._write(f"cleanup {exc!r}")


@pytest.fixture(scope="module")
def session():
    with Session("monarch-concurrent") as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 1})


@pytest.fixture()
def gate(procs, request):
    return procs.spawn(request.node.name, Gate)


def test_concurrent_endpoint_marks_only_async_methods():
    with pytest.raises(ValueError, match="only mark an async def"):
        class Sync(Actor):
            @concurrent_endpoint
            def ping(self) -> str:
                return "pong"


def test_a_gate_opens_while_a_concurrent_call_waits_on_it(gate):
    waiting = gate.wait.call_one()
    assert gate.release_when_ready.call_one().get(timeout=5) == "released"
    assert waiting.get(timeout=5) == "done"


def test_a_long_poll_does_not_hold_the_mailbox(gate):
    polled = gate.poll.call_one()
    assert gate.ping.call_one().get(timeout=5) == "pong"
    gate.push.call_one({"item": 1}).get(timeout=5)
    assert polled.get(timeout=5) == {"item": 1}


def test_a_concurrent_call_starts_before_the_next_message_runs(gate):
    waiting = gate.wait.call_one()
    assert gate.seen.call_one().get(timeout=5) == ["waiting"]
    gate.release.call_one().get(timeout=5)
    assert waiting.get(timeout=5) == "done"


def test_calls_not_marked_concurrent_keep_one_at_a_time_order_beside_a_running_concurrent_call(gate):
    waiting = gate.wait.call_one()
    calls = [gate.step.call_one("a", 0.2), gate.note.call_one("b"), gate.step.call_one("c", 0.0),
             gate.release.call_one()]
    for c in calls:
        c.get(timeout=5)
    assert waiting.get(timeout=5) == "done"
    # `a` parks the mailbox while it sleeps: b, c and the release wait behind it; the
    # concurrent wait resumes only once released, after every one of them.
    assert gate.seen.call_one().get(timeout=5) == ["waiting", "start a", "end a", "b", "start c", "end c",
                                                   "opened"]


def test_an_exception_in_a_concurrent_endpoint_answers_its_caller_and_the_actor_serves_on(gate):
    with pytest.raises(ActorError, match="concurrent boom") as info:
        gate.fail.call_one().get(timeout=5)
    assert info.value.exc_type == "KeyError"
    assert gate.ping.call_one().get(timeout=5) == "pong"


def test_a_base_exception_in_a_concurrent_endpoint_fails_the_actor_and_its_other_calls(gate):
    waiting = gate.wait.call_one()
    with pytest.raises(SupervisionError, match="fatal raised Fatal"):
        gate.fatal.call_one().get(timeout=5)
    with pytest.raises(SupervisionError, match="while this call ran"):
        waiting.get(timeout=5)
    with pytest.raises(SupervisionError):
        gate.ping.call_one().get(timeout=5)


def test_stopping_an_actor_cancels_its_concurrent_calls_before_its_cleanup(procs, tmp_path):
    path = tmp_path / "order"
    mesh = procs.spawn("ending-actor", Ending, str(path))
    running = mesh.run.call_one()
    assert mesh.running.call_one().get(timeout=5)
    mesh.stop()
    assert path.read_text() == "cancelled\ncleanup None\n"
    with pytest.raises(SupervisionError, match="was stopped by the program while this call ran"):
        running.get(timeout=5)


def test_stopping_the_proc_cancels_concurrent_calls_before_cleanup(session, tmp_path):
    path = tmp_path / "order"
    procs = session.spawn_procs(per_host={"procs": 1})
    mesh = procs.spawn("ending-proc", Ending, str(path))
    running = mesh.run.call_one()
    assert mesh.running.call_one().get(timeout=5)
    procs.stop()
    assert path.read_text() == "cancelled\ncleanup None\n"
    with pytest.raises(SupervisionError):
        running.get(timeout=5)


def test_a_concurrent_call_sent_again_under_its_id_joins_the_running_one(session, gate):
    """What a standby does after a takeover: the same call id again, from another address."""
    peer = RawPeer()
    try:
        addr = gate._procs[0].address
        name = gate.name
        peer.call(addr, session.sid, session.epoch, 900_000, name, "wait")
        time.sleep(0.1)
        peer.call(addr, session.sid, session.epoch, 900_000, name, "wait")
        peer.call(addr, session.sid, session.epoch, 900_001, name, "release")
        answers: dict[int, list] = {}
        while sum(map(len, answers.values())) < 3:
            kind, meta, value = peer.recv()
            if kind is Kind.RESULT:
                answers.setdefault(meta["s"], []).append((meta["st"], value))
        assert answers == {900_000: [("ok", "done"), ("ok", "done")], 900_001: [("ok", None)]}
        assert gate.wait_count.call_one().get(timeout=5) == 1
    finally:
        peer.close()
