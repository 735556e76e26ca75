"""Calls sent again under the same id (controller/_links.py): an overdue call goes out again to a
proc that answered nothing since it was sent, and waits (counted as deferred) while its proc
answers others, since it is then queued or running there, not lost; either way it runs once."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from regent.controller import Session
from regent.worker import Actor, endpoint

RESEND_S = 0.3  # the first resend wait, instead of 3 s


class Slow(Actor):
    def __init__(self) -> None:
        self.runs = 0

    @endpoint
    async def work(self, seconds: float) -> int:
        self.runs += 1
        await asyncio.sleep(seconds)  # the proc answers its other actors meanwhile
        return self.runs

    @endpoint
    def count(self) -> int:
        return self.runs

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Fast(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()


def test_an_overdue_call_to_a_proc_answering_others_is_not_sent_again(own_home, monkeypatch):
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    monkeypatch.setattr("regent.controller.session.RESEND_FIRST_S", RESEND_S)
    with Session("resend-progress", journal="off") as s:
        procs = s.spawn_procs(per_host={"procs": 1})
        slow, fast = procs.spawn("slow", Slow), procs.spawn("fast", Fast)
        fut = slow.work.call_one(3.0)
        while not fut.done():  # the proc answers another actor all along
            fast.ping.call_one().get(timeout=30)
            time.sleep(0.05)
        assert fut.get(timeout=30) == 1
        _mostly_deferred(s.runtime.resends)
        assert slow.count.call_one().get(timeout=30) == 1


def test_an_overdue_call_to_a_proc_that_answers_nothing_is_sent_again_and_runs_once(own_home, monkeypatch):
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    monkeypatch.setattr("regent.controller.session.RESEND_FIRST_S", RESEND_S)
    with Session("resend-silent", journal="off") as s:
        slow = s.spawn_procs(per_host={"procs": 1}).spawn("slow", Slow)
        pid = slow.pid.call_one().get(timeout=30)
        os.kill(pid, signal.SIGSTOP)  # silent: nothing answered, nothing read
        try:
            fut = slow.work.call_one(0.0)
            deadline = time.monotonic() + 10
            while s.runtime.resends["overdue"] == 0:
                assert time.monotonic() < deadline, s.runtime.resends
                time.sleep(0.05)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert fut.get(timeout=30) == 1  # the proc dedupes the copies: one run
        assert slow.count.call_one().get(timeout=30) == 1


def test_a_silent_proc_is_sent_its_oldest_overdue_call_alone_and_every_call_runs_once(own_home, monkeypatch):
    """Ten calls to a stopped proc: each pass sends the oldest again, not all ten (a proc that
    is behind would run through every copy); once it goes on, each call has run once."""
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    monkeypatch.setattr("regent.controller.session.RESEND_FIRST_S", RESEND_S)
    with Session("resend-probe", journal="off") as s:
        slow = s.spawn_procs(per_host={"procs": 1}).spawn("slow", Slow)
        pid = slow.pid.call_one().get(timeout=30)
        futs = _one_call_again_per_pass(s, pid, lambda: [slow.work.call_one(0.0) for _ in range(10)])
        assert sorted(f.get(timeout=30) for f in futs) == list(range(1, 11))
        assert slow.count.call_one().get(timeout=30) == 10


def test_a_call_held_up_by_one_silent_proc_goes_again_to_it_alone(own_home, monkeypatch):
    """A mesh-wide call whose procs all answered since it was sent is deferred whole (no pass
    over its points); one silent proc among them makes the pass look at each point: the
    silent one gets the call again, the one answering others does not."""
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    monkeypatch.setattr("regent.controller.session.RESEND_FIRST_S", RESEND_S)
    with Session("resend-one-silent", journal="off") as s:
        procs = s.spawn_procs(per_host={"procs": 2})
        slow, fast = procs.spawn("slow", Slow), procs.slice(procs=0).spawn("fast", Fast)
        pids = slow.pid.call().get(timeout=30).values()
        os.kill(pids[1], signal.SIGSTOP)
        try:
            fut = slow.work.call(2.0)  # proc 0 runs it for 2 s, answering pings meanwhile
            deadline = time.monotonic() + 10
            while s.runtime.resends["overdue"] == 0 and time.monotonic() < deadline:
                fast.ping.call_one().get(timeout=30)
                time.sleep(0.05)
            resends = dict(s.runtime.resends)
        finally:
            os.kill(pids[1], signal.SIGCONT)
        assert resends["overdue"] >= 1, resends
        assert fut.get(timeout=30).values() == [1, 1]
        assert slow.count.call().get(timeout=30).values() == [1, 1]


def test_past_its_patience_an_answering_proc_gets_one_call_again_per_pass(own_home, monkeypatch):
    """Calls queued behind each other on a proc that answers others are, past
    PROGRESS_PATIENCE_S, sent again one per pass (the oldest), not all at once: sending every
    one made a backlog at 4,096 procs worse. Each still runs once."""
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    monkeypatch.setattr("regent.controller.session.RESEND_FIRST_S", RESEND_S)
    monkeypatch.setattr("regent.controller._links.PROGRESS_PATIENCE_S", 0.0)  # every call past it
    with Session("resend-patience", journal="off") as s:
        procs = s.spawn_procs(per_host={"procs": 1})
        slow, fast = procs.spawn("slow", Slow), procs.spawn("fast", Fast)
        futs = [slow.work.call_one(0.4) for _ in range(10)]  # 4 s of calls, run in order

        def counts() -> dict[str, int]:
            with s.runtime.drive:
                return dict(s.runtime.resends)

        last, passes = counts(), []
        deadline = time.monotonic() + 20
        while len(passes) < 2:  # the proc answers its other actor all along
            assert time.monotonic() < deadline, (passes, last)
            fast.ping.call_one().get(timeout=30)
            now = counts()
            if now["overdue"] != last["overdue"]:
                passes.append({k: now[k] - last[k] for k in now})
                last = now
            time.sleep(0.02)
        assert [p["overdue"] for p in passes] == [1, 1], passes
        assert sorted(f.get(timeout=30) for f in futs) == list(range(1, 11))
        assert slow.count.call_one().get(timeout=30) == 10


def test_through_a_relay_an_agent_relaying_other_procs_answers_is_progress(own_home, monkeypatch):
    """Relayed, a proc's messages keep their order in its agent: answers of its siblings
    coming through that agent mean its call is queued or running, not lost."""
    own_home(REGENT_HIPCORE_BACKEND="cpu", REGENT_RELAY="1")
    monkeypatch.setattr("regent.controller.session.RESEND_FIRST_S", RESEND_S)
    with Session("resend-relay", journal="off") as s:
        procs = s.spawn_procs(per_host={"procs": 2})
        slow, fast = procs.slice(procs=0).spawn("slow", Slow), procs.slice(procs=1).spawn("fast", Fast)
        assert s.runtime.relaying, "the host's agent relays"
        fut = slow.work.call_one(3.0)
        while not fut.done():  # only the other proc answers
            fast.ping.call_one().get(timeout=30)
            time.sleep(0.05)
        assert fut.get(timeout=30) == 1
        _mostly_deferred(s.runtime.resends)


def test_through_a_silent_relay_one_call_of_one_proc_goes_again_per_pass(own_home, monkeypatch):
    """Relayed, the silent one is the host's agent: each pass sends one call again through it,
    not one per proc or per call; once it goes on, each call has run once."""
    from regent.worker.discovery import live_host_record

    own_home(REGENT_HIPCORE_BACKEND="cpu", REGENT_RELAY="1")
    monkeypatch.setattr("regent.controller.session.RESEND_FIRST_S", RESEND_S)
    with Session("resend-relay-probe", journal="off") as s:
        slow = s.spawn_procs(per_host={"procs": 2}).spawn("slow", Slow)
        slow.count.call().get(timeout=30)
        assert s.runtime.relaying, "the host's agent relays"
        agent = live_host_record()["pid"]
        futs = _one_call_again_per_pass(s, agent, lambda: [slow.work.call(0.0) for _ in range(5)])  # 5 to each of 2
        assert [sorted(v) for v in zip(*(f.get(timeout=30).values() for f in futs), strict=True)] == [[1, 2, 3, 4, 5]] * 2
        assert slow.count.call().get(timeout=30).values() == [5, 5]


def test_strangers_coming_and_going_on_the_inbox_do_not_resend_every_call_each_time(own_home, monkeypatch):
    """A disconnect on the controller's inbox names no peer, so it sends every outstanding
    call again; connections that come and go (a stale proc retrying a reused port) must not
    make that a storm: at most once per RESEND_FIRST_S."""
    import zmq

    own_home(REGENT_HIPCORE_BACKEND="cpu")
    with Session("resend-strangers", journal="off") as s:
        slow = s.spawn_procs(per_host={"procs": 1}).spawn("slow", Slow)
        pid = slow.pid.call_one().get(timeout=30)
        ctx = zmq.Context()
        os.kill(pid, signal.SIGSTOP)
        try:
            fut = slow.work.call_one(0.0)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2.0:  # twenty strangers, one after another
                stranger = ctx.socket(zmq.DEALER)
                stranger.connect(s.runtime.reply_address)
                time.sleep(0.05)
                stranger.close(linger=0)
                time.sleep(0.05)
            time.sleep(0.5)
            resends = dict(s.runtime.resends)
        finally:
            os.kill(pid, signal.SIGCONT)
            ctx.term()
        assert 1 <= resends["link"] <= 2, resends  # the first at once, then none within 3 s
        assert fut.get(timeout=30) == 1
        assert slow.count.call_one().get(timeout=30) == 1


def _one_call_again_per_pass(s: Session, pid: int, issue) -> list:
    """With process `pid` stopped, `issue()` ten calls to it (or through it) and check the next
    two passes: each sends one call again; by the second every call is overdue (a loaded
    machine may take longer than RESEND_S to issue them, so the first may find only some) and
    nine are held back. The futures; `pid` goes on before this returns."""
    os.kill(pid, signal.SIGSTOP)
    try:
        futs = issue()
        passes = _passes(s, 2)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert [p["overdue"] for p in passes] == [1, 1], passes
    assert passes[-1]["deferred"] == 9, passes
    return futs


def _passes(s: Session, n: int) -> list[dict[str, int]]:
    """What each of the next `n` passes that sent a call again added to the resend counts (read
    under the drive, so never in the middle of a pass)."""
    def counts() -> dict[str, int]:
        with s.runtime.drive:
            return dict(s.runtime.resends)

    last, out = counts(), []
    deadline = time.monotonic() + 20
    while len(out) < n:
        assert time.monotonic() < deadline, (out, last)
        time.sleep(0.02)
        now = counts()
        if now["overdue"] != last["overdue"]:
            out.append({k: now[k] - last[k] for k in now})
            last = now
    return out


def _mostly_deferred(resends: dict[str, int]) -> None:
    """The overdue call was held back while answers came (none sent again on an idle machine;
    on a loaded one a ping's round trip can outlast the time between two looks, and a look
    finds no answer since: CI under 6 workers saw {'overdue': 2, 'deferred': 2}). Sending it
    again on every look, the rule before, defers none."""
    assert resends["deferred"] >= 1 and resends["overdue"] <= resends["deferred"], resends
