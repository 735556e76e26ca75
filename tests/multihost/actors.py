"""Actors the multi-host tests spawn (importable by procs on every host)."""

from __future__ import annotations

import os

from regent import Actor, endpoint


class Counter(Actor):
    """Counts the calls it ran: a call run twice shows as a count too high."""

    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def where(self) -> dict:
        return {"pid": os.getpid(), "netns": os.stat("/proc/self/ns/net").st_ino}

    @endpoint
    def nap(self, seconds: float) -> float:
        import time

        time.sleep(seconds)
        return seconds
