"""Ports, channels and accumulators as Monarch programs use them: an endpoint that answers
through an explicit response port (later, from another call, from another actor), a channel
whose port travels to other actors, values and errors sent through it, and accumulate over a
mesh call, from the controller and from inside an actor (docs/design.md, "Ports")."""

from __future__ import annotations

import operator

import pytest

from regent.controller import Session
from regent.worker import (
    Accumulator,
    Actor,
    ActorError,
    ActorMeshRef,
    Channel,
    Port,
    SupervisionError,
    current_rank,
    endpoint,
)


class Responder(Actor):
    def __init__(self) -> None:
        self.waiting: list[Port] = []

    @endpoint(explicit_response_port=True)
    def now(self, port: Port, x: int) -> None:
        port.send(x + 1)

    @endpoint(explicit_response_port=True)
    def later(self, port: Port) -> None:
        self.waiting.append(port)  # a long poll: answered by release

    @endpoint(explicit_response_port=True)
    async def later_async(self, port: Port) -> str:
        self.waiting.append(port)
        return "ignored: the port answers"

    @endpoint
    def release(self, value: int) -> int:
        waiting, self.waiting = self.waiting, []
        for p in waiting:
            p.send(value)
        return len(waiting)

    @endpoint
    def refuse(self) -> int:
        waiting, self.waiting = self.waiting, []
        for p in waiting:
            p.exception(KeyError("nothing for you"))
        return len(waiting)

    @endpoint(explicit_response_port=True)
    def raises(self, port: Port) -> None:
        raise ValueError("before answering")

    @endpoint(explicit_response_port=True)
    def by_helper(self, port: Port, helper: ActorMeshRef, x: int) -> None:
        helper.answer.broadcast(port, x)  # another actor, on another proc, answers this call


class Helper(Actor):
    @endpoint
    def answer(self, port: Port, x: int) -> None:
        port.send(f"helper {current_rank().rank} answered {x}")

    @endpoint
    def produce(self, port: Port, n: int) -> None:
        for i in range(n):
            port.send((current_rank().rank, i))

    @endpoint
    def fail_into(self, port: Port) -> None:
        port.exception(RuntimeError("producer broke"))

    @endpoint
    def value(self) -> int:
        return current_rank().rank + 1


class Consumer(Actor):
    @endpoint
    def gather(self, producers: ActorMeshRef, n: int) -> list[tuple[int, int]]:
        port, rx = Channel.open()
        producers.produce.call(port, n).get(timeout=30)
        return sorted(rx.recv().get(timeout=30) for _ in range(n * len(producers)))

    @endpoint
    async def gather_async(self, producers: ActorMeshRef, n: int) -> list[tuple[int, int]]:
        port, rx = Channel.open()
        producers.produce.broadcast(port, n)
        return sorted([await rx.recv() for _ in range(n * len(producers))])

    @endpoint
    def failed(self, producers: ActorMeshRef) -> str:
        port, rx = Channel.open()
        producers.slice(procs=0).fail_into.call_one(port).get(timeout=30)
        try:
            rx.recv().get(timeout=30)
        except ActorError as e:
            return f"{e.exc_type}: {e.message}"
        return ""

    @endpoint
    def total(self, producers: ActorMeshRef) -> int:
        return Accumulator(producers.value, 100, operator.add).accumulate().get(timeout=30)


@pytest.fixture(scope="module")
def session():
    with Session("monarch-ports") as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 2})


@pytest.fixture(scope="module")
def responder(procs):
    return procs.slice(procs=0).spawn("responder", Responder)


@pytest.fixture(scope="module")
def helpers(procs):
    return procs.spawn("helpers", Helper)


def test_an_explicit_response_port_answers_the_call(responder):
    assert responder.now.call_one(41).get(timeout=30) == 42


def test_a_response_port_kept_and_sent_by_a_later_call_answers_a_long_poll(responder):
    polled = responder.later.call_one()
    polled_async = responder.later_async.call_one()
    assert not polled.wait(0.2)  # nothing answered yet, and the actor serves on
    assert responder.release.call_one(7).get(timeout=30) == 2
    assert polled.get(timeout=30) == 7
    assert polled_async.get(timeout=30) == 7


def test_an_exception_sent_to_a_response_port_reaches_the_caller(responder):
    polled = responder.later.call_one()
    assert responder.refuse.call_one().get(timeout=30) == 1
    with pytest.raises(ActorError, match="KeyError"):
        polled.get(timeout=30)


def test_an_endpoint_that_raises_before_answering_fails_its_call(responder):
    with pytest.raises(ActorError, match="before answering"):
        responder.raises.call_one().get(timeout=30)


def test_a_response_port_passed_to_another_actor_is_answered_from_there(responder, helpers):
    got = responder.by_helper.call_one(helpers.slice(procs=1), 5).get(timeout=30)
    assert got == "helper 1 answered 5"


def test_a_stopped_actor_fails_the_calls_its_ports_had_not_answered(procs):
    r = procs.slice(procs=1).spawn("short-lived", Responder)
    polled = r.later.call_one()
    assert not polled.wait(0.2)
    r.stop()
    with pytest.raises(SupervisionError, match="stopped"):
        polled.get(timeout=30)


def test_a_channel_port_travels_to_producers_and_the_receiver_gets_every_value(procs, helpers):
    consumer = procs.slice(procs=0).spawn("consumer", Consumer)
    expected = sorted((r, i) for r in range(2) for i in range(3))
    assert consumer.gather.call_one(helpers, 3).get(timeout=60) == expected
    assert consumer.gather_async.call_one(helpers, 3).get(timeout=60) == expected
    assert consumer.failed.call_one(helpers).get(timeout=60) == "RuntimeError: producer broke"
    assert consumer.total.call_one(helpers).get(timeout=60) == 103
    consumer.stop()


def test_accumulate_folds_a_mesh_call_in_the_controller(helpers):
    assert Accumulator(helpers.value, 0, operator.add).accumulate().get(timeout=30) == 3
    assert Accumulator(helpers.value, [], lambda acc, v: [*acc, v]).accumulate().get(timeout=30) == [1, 2]


def test_the_controller_opens_a_port_actors_send_to(session, helpers):
    port, rx = session.open_port()
    assert isinstance(port, Port)
    helpers.produce.broadcast(port, 2)
    got = sorted(rx.recv().get(timeout=30) for _ in range(4))
    assert got == [(0, 0), (0, 1), (1, 0), (1, 1)]
    helpers.slice(procs=1).fail_into.call_one(port).get(timeout=30)
    with pytest.raises(ActorError, match="producer broke"):
        rx.recv().get(timeout=30)


def test_an_async_program_awaits_its_port(session, helpers):
    async def main() -> list:
        port, rx = session.open_port()
        helpers.slice(procs=0).produce.broadcast(port, 3)
        return [await rx.recv() for _ in range(3)]

    assert session.run(main()) == [(0, 0), (0, 1), (0, 2)]


class SendAlot(Actor):
    @endpoint
    def send(self, port: Port) -> None:
        for i in range(100):
            port.send(i)


def test_channel_open_in_the_controller_program_is_the_sessions_port(procs):
    """Monarch's test_port_as_argument, as written there."""
    s = procs.slice(procs=1).spawn("send-alot", SendAlot)
    send, recv = Channel[int].open()
    s.send.broadcast(send)
    for i in range(100):
        assert i == recv.recv().get(timeout=30)


class Inbox(Actor):
    """Opens a channel in __init__ and hands its port out: the controller program sends to it."""

    def __init__(self) -> None:
        self.port, self.rx = Channel.open()

    @endpoint
    def where(self) -> Port:
        return self.port

    @endpoint
    def take(self, n: int) -> list:
        out = []
        for _ in range(n):
            try:
                out.append(self.rx.recv().get(timeout=30))
            except ActorError as e:
                out.append(f"{e.exc_type}: {e.message}")
        return out


def test_the_controller_program_sends_to_a_port_an_actor_opened(procs):
    inbox = procs.slice(procs=1).spawn("inbox", Inbox)
    port = inbox.where.call_one().get(timeout=30)
    for v in ("a", "b", "c"):
        port.send(v)
    port.exception(KeyError("no more"))
    assert inbox.take.call_one(4).get(timeout=30) == ["a", "b", "c", "KeyError: 'no more'"]


def test_a_port_of_another_session_or_an_unknown_proc_is_refused_by_name(session, procs):
    inbox = procs.slice(procs=0).spawn("inbox-2", Inbox)
    port = inbox.where.call_one().get(timeout=30)
    with pytest.raises(ValueError, match="belongs to session 'elsewhere'"):
        Port("elsewhere", port.target, port.id).send(1)
    stranger = type(port.target)(port.target.address, "no-such-proc", port.target.host)
    with pytest.raises(ValueError, match="which this program did not spawn"):
        Port(port.session, stranger, port.id).send(1)
