"""A host agent's relay gathers its procs' answers: those to one mesh-wide call reach the
controller as one batch, a straggler holds the others GATHER_S at most, nothing is reordered,
and calls on their way to the procs are never held. The relay's own tests, on a recording
outbox; the agent's loop waking for a held answer is tested through a hollow host."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from regent import Session
from regent.wire import Kind, decode, encode, split_batch
from regent.worker._relay import GATHER_S, Relay
from tests.runtime.test_relay import HOLLOW, Counter, hollow_hosts, relayed  # noqa: F401  (fixtures)
from tests.support.loopback import CLUSTER

CONTROLLER = "tcp://127.0.0.1:7001"
PROCS = [f"tcp://127.0.0.1:{7100 + i}" for i in range(8)]


class _Peer:
    def __init__(self, sent: list) -> None:
        self.sent = sent

    def try_send(self, frames: list) -> bool:
        self.sent.append(frames)
        return True


class _Outbox:
    """Records what the relay sends: (destination, the "i" of every message it carries)."""

    def __init__(self) -> None:
        self.sent: dict[str, list] = {}

    def peer(self, to: str) -> _Peer:
        return _Peer(self.sent.setdefault(to, []))

    def drop(self, to: str) -> None:
        pass

    def wires(self, to: str) -> list[list[int]]:
        out = []
        for frames in self.sent.get(to, []):
            kind, meta, payload = decode([bytes(f) for f in frames])
            subs = split_batch(meta, payload) if kind is Kind.BATCH else [frames]
            out.append([decode([bytes(f) for f in sub])[1]["i"] for sub in subs])
        return out


def _call(i: int) -> list:
    return encode(Kind.CALL, {"i": i})


def _result(i: int) -> list:
    return encode(Kind.RESULT, {"i": i})


def _log(i: int) -> list:
    return encode(Kind.LOG, {"i": i})


@pytest.fixture
def relay() -> tuple[Relay, _Outbox]:
    out = _Outbox()
    return Relay(out, 1 << 20), out  # type: ignore[arg-type]


def _cast(relay: Relay, n: int = 8) -> None:
    """A mesh-wide call: one call to each of `n` procs, in one drain."""
    for i in range(n):
        relay.take(PROCS[i], _call(i))
    relay.flush()


def test_a_hosts_answers_to_one_call_go_as_one_batch(relay) -> None:
    r, out = relay
    _cast(r)
    assert [out.wires(p) for p in PROCS] == [[[i]] for i in range(8)]  # the calls went at once
    for i in range(8):  # each answer in a drain of its own, as the procs answer apart
        r.take(CONTROLLER, _result(i))
        r.flush()
        if i < 7:
            assert out.wires(CONTROLLER) == [], f"answer {i} went before the others"
    assert out.wires(CONTROLLER) == [list(range(8))]
    assert r.hold_s() is None


def test_a_straggler_holds_the_others_no_longer_than_gather_s(relay) -> None:
    r, out = relay
    _cast(r)
    for i in range(7):
        r.take(CONTROLLER, _result(i))
        r.flush()
    hold = r.hold_s()
    assert hold is not None and 0 < hold <= GATHER_S
    assert out.wires(CONTROLLER) == []
    time.sleep(hold + 0.001)
    r.flush()  # the agent's loop wakes by then (hold_s) and flushes
    assert out.wires(CONTROLLER) == [list(range(7))]
    r.take(CONTROLLER, _result(7))  # every call answered: the straggler's goes at once
    r.flush()
    assert out.wires(CONTROLLER) == [list(range(7)), [7]]


def test_what_follows_a_held_answer_stays_behind_it(relay) -> None:
    r, out = relay
    _cast(r, 2)
    r.take(CONTROLLER, _log(0))  # before any answer: not held
    r.take(CONTROLLER, _result(1))
    r.take(CONTROLLER, _log(2))  # after one: behind it
    r.take(PROCS[0], _call(3))  # calls to the procs are never held
    r.flush()
    assert out.wires(CONTROLLER) == [[0]] and out.wires(PROCS[0]) == [[0], [3]]
    r.release()  # the agent sends a message of its own: what the procs said goes first
    assert out.wires(CONTROLLER) == [[0], [1, 2]]


def test_a_proc_that_ended_is_not_waited_for(relay) -> None:
    r, out = relay
    _cast(r, 2)
    r.forget(PROCS[1])  # its call is never answered
    r.take(CONTROLLER, _result(0))
    r.flush()
    assert out.wires(CONTROLLER) == [[0]]


def test_an_answer_held_for_a_proc_that_ended_is_dropped(relay) -> None:
    r, out = relay
    _cast(r, 2)
    r.take(PROCS[1], _result(5))  # an answer to a call one of its actors made, held
    r.flush()
    r.forget(PROCS[1])
    r.release()
    assert out.wires(PROCS[1]) == [[1]]  # its call went; the answer to it did not


def test_an_answer_counted_twice_leaves_nothing_held(relay) -> None:
    r, out = relay
    _cast(r, 1)
    for i in range(3):  # a resent call answered again from the proc's result cache, and more
        r.take(CONTROLLER, _result(i))
        r.flush()
    assert out.wires(CONTROLLER) == [[0], [1], [2]]


def test_a_held_answer_goes_out_while_another_call_runs(hollow_hosts, tmp_path: Path) -> None:  # noqa: F811
    """One proc of a host runs a call that does not end; its neighbours' answers, held for it,
    go out GATHER_S later by the agent's own clock, not with the agent's next message."""
    with Session("relay-gather", journal=hollow_hosts) as s:
        c = s.host_mesh(hosts=1, cluster=CLUSTER).spawn_procs(per_host={"procs": HOLLOW}).spawn("c", Counter)
        c.incr.call().get(timeout=30)
        started = tmp_path / "held"
        held = c.slice(procs=0).hold.call_one(str(started))
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline, "the held call never started"
            time.sleep(0.02)
        took = []
        for _ in range(5):
            t = time.monotonic()
            c.slice(procs=1).seen.call_one().get(timeout=30)
            took.append(time.monotonic() - t)
        # Without the agent waking for it, each answer waits for the agent's idle tick (1 s).
        assert sorted(took)[2] < 0.5, took
        assert not held.done()
