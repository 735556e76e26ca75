"""The release watermark (one message per proc) goes at most WATERMARK_SENDS_PER_S proc
messages a second: a large mesh gets it less often than every tick, and it still advances."""

from __future__ import annotations

import time

from regent.controller import Session
from regent.worker import Actor, endpoint


class Echo(Actor):
    @endpoint
    def echo(self, i: int) -> int:
        return i


def test_the_watermark_of_a_mesh_goes_at_most_at_its_budget_and_still_advances(own_home, monkeypatch) -> None:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    monkeypatch.setattr("regent.controller._runtime.WATERMARK_SENDS_PER_S", 4)  # 4 procs: once a second
    with Session("watermark-rate", journal="off") as s:
        e = s.spawn_procs(per_host={"procs": 4}).spawn("e", Echo)
        sent: set[float] = set()
        marks: set[int] = set()
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < 3.0:  # calls all along: the mark moves on every tick
            assert e.echo.call(i).get(timeout=30).values() == [i] * 4
            i += 1
            sent.add(s.runtime._watermark_at)
            marks.add(s.runtime._sent_watermark[0])
        sent.discard(0.0)
        assert 2 <= len(sent) <= 4, sorted(b - a for a, b in zip(sorted(sent), sorted(sent)[1:], strict=False))
        assert len(marks) >= 2  # it advances
