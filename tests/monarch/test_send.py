"""Monarch's `send(endpoint, args, kwargs, port=None, selection="all")`: fire and forget to a
mesh or to one member it picks, the answers going to a port when one is given, from the
controller program and from inside an actor."""

from __future__ import annotations

import pytest

from regent import (
    Actor,
    ActorError,
    ActorMeshRef,
    Channel,
    Port,
    Session,
    current_rank,
    endpoint,
    send,
)


class Member(Actor):
    def __init__(self) -> None:
        self.seen: list = []

    @endpoint
    def note(self, x: int) -> int:
        self.seen.append(x)
        return current_rank().rank * 100 + x

    @endpoint
    def seen_so_far(self) -> list:
        return list(self.seen)

    @endpoint
    def refuse(self, x: int) -> int:
        raise KeyError(f"no {x}")

    @endpoint(explicit_response_port=True)
    def twice(self, port: Port, x: int) -> None:
        port.send(("first", x))
        port.send(("second", x))


class Relay(Actor):
    @endpoint
    def fan_out(self, members: ActorMeshRef, x: int) -> list:
        port, rx = Channel.open()
        send(members.note, (x,), {}, port=port)
        got = sorted(rx.recv().get(timeout=30) for _ in range(len(members)))
        send(members.note, (x + 1,), {}, port=port, selection="choose")
        return [*got, rx.recv().get(timeout=30)]


@pytest.fixture(scope="module")
def session():
    with Session("monarch-send") as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 3})


@pytest.fixture()
def members(procs, request):
    return procs.spawn(f"m-{request.node.name[-30:]}", Member)


def test_send_to_all_runs_on_every_member_without_an_answer(members):
    assert send(members.note, (7,), {}) is None
    assert members.seen_so_far.call().get(timeout=30).values() == [[7], [7], [7]]


def test_send_with_choose_runs_on_one_member(members):
    send(members.note, (5,), {}, selection="choose")
    seen = members.seen_so_far.call().get(timeout=30).values()
    assert sorted(seen) == [[], [], [5]]


def test_send_with_a_port_delivers_each_members_answer_there(session, members):
    port, rx = session.open_port()
    send(members.note, (3,), {}, port=port)
    assert sorted(rx.recv().get(timeout=30) for _ in range(3)) == [3, 103, 203]
    send(members.note, (4,), {}, port=port, selection="choose")
    assert rx.recv().get(timeout=30) in (4, 104, 204)


def test_an_error_goes_to_the_port_and_the_actor_serves_on(session, members):
    port, rx = session.open_port()
    send(members.slice(procs=1).refuse, (9,), {}, port=port)
    with pytest.raises(ActorError, match="KeyError"):
        rx.recv().get(timeout=30)
    assert members.slice(procs=1).note.call_one(1).get(timeout=30) == 101


def test_an_endpoint_taking_a_response_port_gets_the_senders_port(session, members):
    port, rx = session.open_port()
    send(members.slice(procs=2).twice, (8,), {}, port=port)
    assert [rx.recv().get(timeout=30) for _ in range(2)] == [("first", 8), ("second", 8)]


def test_an_actor_sends_to_a_mesh_it_was_given_with_its_own_port(procs, members):
    relay = procs.slice(procs=0).spawn("relay", Relay)
    got = relay.fan_out.call_one(members, 10).get(timeout=30)
    assert got[:3] == [10, 110, 210] and got[3] in (11, 111, 211)


def test_a_bad_selection_or_port_is_refused_by_name(members):
    with pytest.raises(ValueError, match="'all' or 'choose'"):
        send(members.note, (1,), {}, selection="some")
    with pytest.raises(TypeError, match="takes a Port"):
        send(members.note, (1,), {}, port="not a port")
