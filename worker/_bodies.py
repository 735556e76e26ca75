"""A sync endpoint's run, as a greenlet on its proc's one thread (a "body").

A sync endpoint runs inline, but in a greenlet of its own, so that waiting for a call it made
(`.get()`, a stream, a spawn, a port) gives the thread back to the proc's loop rather than
blocking it: the proc's other actors, async endpoints and timers included, go on serving, and
the endpoint resumes where it waited once its answer is in. Its actor stays busy meanwhile (one
message at a time per actor, each sender's order kept). The proc's core stays single-threaded:
a body runs only when the loop's greenlet switches to it, and gives the thread back only where
it waits. Inside a body no event loop is running, as in Monarch's sync endpoints.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from typing import Any

from greenlet import getcurrent, greenlet

_set_running_loop = asyncio.events._set_running_loop


class _Gone(BaseException):
    """Raised where a sync endpoint waits when its actor ends meanwhile (stopped, its proc
    stopping): its call is answered as cut short, like an async endpoint's cancelled task."""


class Body:
    """One run of a sync endpoint (or a sync __cleanup__): `run()` in a runner greenlet."""

    __slots__ = ("run", "then", "result", "finished", "cancelled", "runner")

    def __init__(self, run: Callable[[], Any], then: Callable[[Body], None] | None = None) -> None:
        self.run, self.then = run, then  # then(body): on the loop's greenlet once a body that waited ends
        self.result: Any = None  # what the run returned, once it has
        self.finished = False
        self.cancelled: BaseException | None = None
        self.runner: _Runner | None = None

    def suspend(self) -> None:
        """From inside the body: give the thread back to the loop until resumed."""
        runner = self.runner
        _set_running_loop(runner.loop)
        try:
            runner.parent.switch()
        finally:
            _set_running_loop(None)
        if self.cancelled is not None:
            raise self.cancelled

    def resume(self) -> None:
        """From the loop's greenlet: run on from where the body waits, until it waits again or ends."""
        self.runner.switch()


class _Runner(greenlet):
    """A greenlet that runs bodies one after another (a new greenlet per call costs more)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, idle: list[_Runner]) -> None:
        hub = getcurrent()
        if isinstance(hub, _Runner):
            raise RuntimeError("a sync endpoint's run started another one inline: a proc dispatches "
                               "messages on its loop's greenlet only")
        super().__init__(self._serve, parent=hub)
        self.loop, self._idle = loop, idle
        self.body: Body | None = None

    def _serve(self, body: Body) -> None:
        while True:
            self.body = body
            _set_running_loop(None)  # as in Monarch, a sync endpoint runs outside any event loop
            try:
                body.result = body.run()
            finally:
                _set_running_loop(self.loop)
                body.finished = True
                self.body = None
            self._idle.append(self)
            body = self.parent.switch()


def start(body: Body, loop: asyncio.AbstractEventLoop, idle: list[_Runner]) -> bool:
    """Run `body` until it returns (True) or waits for a call (False). A runner is one proc's
    (`idle` is its own), made in its context: a hollow host's procs share a thread and tell
    their calls apart by a context variable (worker/remote.py serving_client)."""
    if idle:
        runner = idle.pop()
    else:
        runner = _Runner(loop, idle)
        runner.gr_context = contextvars.copy_context()
    body.runner = runner
    runner.switch(body)
    return body.finished


def current_body() -> Body | None:
    """The sync endpoint's run this code is part of, or None (the loop, a task, an __init__)."""
    g = getcurrent()
    return g.body if isinstance(g, _Runner) else None


class Waiters:
    """The bodies of one proc waiting for a call's answer, each with what it waits for and
    until when. The proc checks them after each message it handles and each client tick
    (answers come from there) and when a deadline passes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.idle: list[_Runner] = []  # runners free for the next sync endpoint
        self._waiting: dict[Body, tuple[Callable[[], bool], float | None]] = {}

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def wait(self, body: Body, done: Callable[[], bool], timeout: float | None) -> bool:
        """Suspend `body` until `done()` (True) or `timeout` seconds pass (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not done():
            if end is not None and time.monotonic() >= end:
                return False
            self._waiting[body] = (done, end)
            timer = None if end is None else self.loop.call_at(
                self.loop.time() + max(0.0, end - time.monotonic()), self.check)
            try:
                body.suspend()
            finally:
                self._waiting.pop(body, None)
                if timer is not None:
                    timer.cancel()
        return True

    def check(self) -> None:
        """Resume every body whose wait is over (on the loop's greenlet)."""
        if not self._waiting:
            return
        now = time.monotonic()
        ready = [b for b, (done, end) in list(self._waiting.items()) if done() or (end is not None and now >= end)]
        for body in ready:
            if self._waiting.pop(body, None) is not None:
                body.resume()
                if body.finished and body.then is not None:
                    body.then(body)

    def cancel(self, body: Body, exc: BaseException) -> None:
        """End a waiting body: `exc` is raised where it waits (its actor is gone)."""
        if self._waiting.pop(body, None) is None:
            return
        body.cancelled = exc
        body.resume()
