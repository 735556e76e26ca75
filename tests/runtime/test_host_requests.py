"""Requests to several host agents at once (controller/_hosttable.py `host_requests`): every
request is out before any answer is awaited, so a spawn over many hosts, or a takeover's
greeting of every agent, takes the time of the slowest agent rather than their sum. The
agents here are bare wire peers that answer when the test says."""

from __future__ import annotations

import threading

import pytest

from regent import wire
from regent.controller._runtime import Runtime
from regent.controller.core import ControllerCore
from regent.wire import Kind
from regent.worker.errors import FencedError
from tests.runtime.rawpeer import RawPeer


@pytest.fixture
def runtime(own_home):
    own_home()
    rt = Runtime("s-requests", 3, ControllerCore("s-requests"))
    yield rt
    rt.close()


def _next_request(agent: RawPeer) -> dict:
    while True:
        kind, meta, _ = agent.recv(timeout=20)
        if kind is Kind.HOST_REQ:
            return meta


def _answer(agent: RawPeer, request: dict, **fields) -> None:
    agent.send(request["rt"], wire.encode(Kind.HOST_REP, {"sid": request["sid"], "n": request["n"], "st": "ok",
                                                          **fields}))


def test_every_agent_has_its_request_before_any_answers(runtime) -> None:
    agents = [RawPeer(), RawPeer(), RawPeer()]
    got: list = []
    try:
        asking = threading.Thread(target=lambda: got.append(runtime.host_requests(
            [(a.address, "spawn_procs", {"s": 1, "count": 1}) for a in agents], timeout=30)))
        asking.start()
        # Sequential requests would leave the second agent waiting for the first one's answer:
        # here no agent answers until all three have theirs.
        requests = [_next_request(a) for a in agents]
        assert [r["op"] for r in requests] == ["spawn_procs"] * 3 and {r["e"] for r in requests} == {3}
        for k, (a, r) in enumerate(reversed(list(zip(agents, requests, strict=True)))):
            _answer(a, r, procs=[{"id": f"p{k}", "idx": 0, "addr": None, "pid": 1}])
        asking.join(30)
        assert [reply["procs"][0]["id"] for reply in got[0]] == ["p2", "p1", "p0"]  # in the order asked
    finally:
        for a in agents:
            a.close()


def test_an_agent_that_does_not_answer_is_a_timeout_in_its_place_when_asked_for(runtime) -> None:
    quiet, talking = RawPeer(), RawPeer()
    try:
        answered = threading.Thread(target=lambda: _answer(talking, _next_request(talking)))
        answered.start()
        replies = runtime.host_requests([(quiet.address, "hello", {}), (talking.address, "hello", {})],
                                        timeout=2.0, timeouts=True)
        answered.join(10)
        assert isinstance(replies[0], TimeoutError) and "did not answer 'hello'" in str(replies[0])
        assert replies[1]["st"] == "ok"
        with pytest.raises(TimeoutError, match="did not answer 'hello' within 1 s"):
            runtime.host_requests([(quiet.address, "hello", {})], timeout=1.0)
    finally:
        quiet.close()
        talking.close()


def test_a_fenced_answer_deposes_the_controller_whatever_the_others_said(runtime) -> None:
    newer, other = RawPeer(), RawPeer()
    try:
        def agents() -> None:
            first = _next_request(newer)
            second = _next_request(other)
            newer.send(first["rt"], wire.encode(Kind.HOST_REP, {
                "sid": first["sid"], "n": first["n"], "st": "fenced", "e": 4, "em": "epoch 3 is below 4"}))
            _answer(other, second)

        t = threading.Thread(target=agents)
        t.start()
        with pytest.raises(FencedError, match="epoch 3 is below 4"):
            runtime.host_requests([(newer.address, "hello", {}), (other.address, "hello", {})], timeout=20)
        t.join(10)
        assert runtime.fenced == "epoch 3 is below 4"
    finally:
        newer.close()
        other.close()
