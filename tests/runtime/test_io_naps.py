"""The controller's IO thread sleeps until its next tick when there is nothing to do (no batch
queued, nothing left unread, no waiter or a long one), and whatever needs it wakes it: a batch
the program queued and left, a reply to a call nobody waits for, the end of a long wait. The
tick is stretched to 5 s here, so a wake-up that did not happen shows as seconds of delay."""

from __future__ import annotations

import time

import pytest

from regent.controller import Session
from regent.worker import Actor, endpoint


class Sleeper(Actor):
    @endpoint
    def nap(self, s: float) -> float:
        time.sleep(s)
        return s


def _done_within(fut, limit: float) -> float:
    """Seconds until `fut` is done, looked at without waiting on it (the IO thread must read its
    reply); fails past `limit`."""
    t0 = time.monotonic()
    while not fut.done():
        assert time.monotonic() - t0 < limit, "the reply was not read: the IO thread was not woken"
        time.sleep(0.01)
    return time.monotonic() - t0


@pytest.fixture
def slow_tick(own_home, monkeypatch):
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    monkeypatch.setattr("regent.controller._reading.TICK_S", 5.0)


def test_an_idle_controller_wakes_for_its_ticks_and_for_what_it_is_sent(slow_tick) -> None:
    with Session("io-naps-idle", journal="off") as s:
        m = s.spawn_procs(per_host={"procs": 2}).spawn("n", Sleeper)
        assert m.nap.call(0.0).get(timeout=60).values() == [0.0, 0.0]
        time.sleep(0.5)  # settles into its nap
        before = s.runtime.io_passes
        time.sleep(1.0)
        idle_passes = s.runtime.io_passes - before
        # Its ticks, and ~10 short naps after anything that reaches it (a proc's message): a
        # tenth of the old naps' count is the bound, loaded machine or not.
        assert idle_passes <= 50, f"an idle IO thread woke {idle_passes} times in 1 s (2 ms naps: ~500)"
        # A call nobody waits for: its batch wakes the thread, which sends it and reads the reply.
        fut = m.nap.call(0.0)
        _done_within(fut, 2.0)
        # While the program waits a long time, the thread sleeps as well.
        before = s.runtime.io_passes
        assert m.nap.call(1.0).get(timeout=60).values() == [1.0, 1.0]
        waiting_passes = s.runtime.io_passes - before
        assert waiting_passes <= 60, f"the IO thread woke {waiting_passes} times during a 1 s wait"


def test_a_long_wait_ending_gives_the_inbox_back_to_the_io_thread(slow_tick) -> None:
    with Session("io-naps-wait", journal="off") as s:
        m = s.spawn_procs(per_host={"procs": 2}).spawn("n", Sleeper)
        a, b = m.slice(procs=0), m.slice(procs=1)
        assert m.nap.call(0.0).get(timeout=60).values() == [0.0, 0.0]
        later = b.nap.call(0.8)  # its reply comes after the wait below has ended
        assert a.nap.call(0.4).get(timeout=60).values() == [0.4]
        _done_within(later, 3.0)  # without the wake at the wait's end: the 5 s tick
