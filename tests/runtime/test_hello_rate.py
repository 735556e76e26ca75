"""The hellos to host agents (each answered with the agent's procs, which the controller checks)
go at most HOST_HELLO_SENDS_PER_S a second: with many hosts, each is greeted less often than
every second; with few, every second as before."""

from __future__ import annotations

import time

from regent.controller import Session
from tests.runtime.test_watermark_rate import Echo


def _hellos_in(s: Session, seconds: float) -> int:
    seen: set[float] = set()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        seen.add(s.runtime._last_hello)
        time.sleep(0.05)
    return len(seen - {0.0}) - 1  # the first value seen was set before the window


def test_hellos_go_every_second_to_few_hosts_and_less_often_past_the_budget(own_home, monkeypatch) -> None:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    with Session("hello-rate", journal="off") as s:
        e = s.spawn_procs(per_host={"procs": 1}).spawn("e", Echo)
        assert e.echo.call(1).get(timeout=30).values() == [1]
        assert len(s.runtime.hosts) == 1
        assert 3 <= _hellos_in(s, 4.1) <= 5  # every second
        monkeypatch.setattr("regent.controller._runtime.HOST_HELLO_SENDS_PER_S", 0.4)  # one host: every 2.5 s
        _hellos_in(s, 2.6)  # the last hello under the old rate is behind
        assert 1 <= _hellos_in(s, 5.1) <= 2
        assert e.echo.call(2).get(timeout=30).values() == [2]
