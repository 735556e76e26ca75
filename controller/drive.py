"""The drive: the one thread that steps a session's engine at any moment.

The engine (controller/engine.py) and its core are plain objects that are never stepped by two
threads at once. Whoever holds the drive steps them: the program's thread while it issues a
call or waits for one (it then reads the inbox itself, so a reply is handled where it is
awaited, with no hand-off between threads), the runtime's IO thread while the program runs its
own code. A thread that must not wait for the drive (the lease keeper telling us leadership is
lost, the IO thread's timer) posts its event instead; the holder applies posted events before
it lets go, and a waiting holder applies them as it polls, so none waits longer than one poll.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("regent.controller")


class Drive:
    """The engine's one driver at a time.

    Short sections on the program's thread take `lock` itself (`with drive.lock:`: the call
    path pays a bare lock). Whoever holds the drive for longer, reading the inbox (the IO
    thread, a program thread waiting for a result), takes it through `acquire` / `release`
    or `with drive:`, which apply posted events."""

    __slots__ = ("lock", "posted", "_count", "wanted")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.posted: collections.deque[Callable[[], Any]] = collections.deque()  # for the next driver
        self._count = threading.Lock()  # guards `wanted`, on the slow path only
        self.wanted = 0  # threads blocked in `with drive:`: a holder reading the inbox yields

    def __enter__(self) -> Drive:
        lock = self.lock
        if not lock.acquire(False):
            with self._count:
                self.wanted += 1
            try:
                lock.acquire()
            finally:
                with self._count:
                    self.wanted -= 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self, timeout: float) -> bool:
        """Take the drive within `timeout` seconds (0: only if free); True if taken."""
        return self.lock.acquire(False) if timeout <= 0 else self.lock.acquire(True, timeout)

    def release(self) -> None:
        """Apply what was posted, then let go. A post that lands after the last look and
        finds the drive still held is applied by whoever takes it next (the IO thread does
        within a poll); after letting go we look once more and take it back for those."""
        if self.posted:
            self.run_posted()
        lock = self.lock
        lock.release()
        while self.posted and lock.acquire(False):
            self.run_posted()
            lock.release()

    def post(self, event: Callable[[], Any]) -> None:
        """Have the driver apply `event` (now, if nobody holds the drive)."""
        self.posted.append(event)
        if self.lock.acquire(False):
            self.release()

    def run_posted(self) -> None:
        """Apply posted events (the holder only)."""
        posted = self.posted
        while posted:
            event = posted.popleft()
            try:
                event()
            except Exception:  # noqa: BLE001 - one event's failure must not stall the others
                log.exception("a posted controller event failed")


__all__ = ["Drive"]
