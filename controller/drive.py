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
    """`with drive:` makes this thread the engine's driver until the block ends."""

    __slots__ = ("_lock", "_posted", "_count", "wanted", "owner")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._posted: collections.deque[Callable[[], Any]] = collections.deque()
        self._count = threading.Lock()  # guards `wanted`, on the slow path only
        self.wanted = 0  # threads blocked waiting for the drive: a holder that can, yields
        self.owner: int | None = None

    def __enter__(self) -> Drive:
        if not self._lock.acquire(blocking=False):
            self._block()
        self.owner = threading.get_ident()
        return self

    def _block(self) -> None:
        with self._count:
            self.wanted += 1
        try:
            self._lock.acquire()
        finally:
            with self._count:
                self.wanted -= 1

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self, timeout: float) -> bool:
        """Take the drive within `timeout` seconds (0: only if free); True if taken."""
        if not (self._lock.acquire(False) if timeout <= 0 else self._lock.acquire(True, timeout)):
            return False
        self.owner = threading.get_ident()
        return True

    def release(self) -> None:
        """Apply what was posted, then let go. A post that lands after the last look and
        finds the drive still held is applied by whoever takes it next: the IO thread does
        within a poll, so after letting go we look once more and take it back for those."""
        if self._posted:
            self.run_posted()
        self.owner = None
        self._lock.release()
        while self._posted and self._lock.acquire(blocking=False):
            self.owner = threading.get_ident()
            self.run_posted()
            self.owner = None
            self._lock.release()

    def held(self) -> bool:
        """Is this thread the driver now?"""
        return self.owner == threading.get_ident()

    def post(self, event: Callable[[], Any]) -> None:
        """Have the driver apply `event` (now, if nobody holds the drive)."""
        self._posted.append(event)
        if self._lock.acquire(blocking=False):
            self.owner = threading.get_ident()
            self.release()

    def run_posted(self) -> None:
        """Apply posted events (the holder only)."""
        posted = self._posted
        while posted:
            event = posted.popleft()
            try:
                event()
            except Exception:  # noqa: BLE001 - one event's failure must not stall the others
                log.exception("a posted controller event failed")


__all__ = ["Drive"]
