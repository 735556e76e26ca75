"""Futures and value meshes: what every endpoint adverb returns.

A Future is resolved by the session's IO thread and waited on by the program,
either blocking (`get`) or with `await`. The wake-up is a bare lock, the
cheapest cross-thread signal CPython has, because it sits on every call's path.
"""

from __future__ import annotations

import _thread
import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from regent.worker.shape import Point, ValueMesh

__all__ = ["Future", "Point", "ValueMesh"]

T = TypeVar("T")

_PENDING = object()


class Future(Generic[T]):
    """The eventual value (or error) of a call."""

    __slots__ = ("_lock", "_value", "_exc", "_callbacks", "_guard", "_on_get", "_on_wait", "tag", "lsn",
                 "holders", "__weakref__")

    def __init__(self, on_get: Callable[[Future, float | None], None] | None = None) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._guard = _thread.allocate_lock()
        self._value: Any = _PENDING
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] | None = None
        self._on_get = on_get
        self._on_wait: Callable[[], None] | None = None  # e.g. send the queued call first
        self.tag: Any = None  # for on_get: which call this future belongs to
        self.lsn = -1  # the journal position of the outcome it holds, once known (-1: none)
        self.holders: Any = ()  # the proc processes (ProcRef.id) whose caches hold that outcome

    def attach(self, tag: Any, on_get: Callable[[Future, float | None], None] | None,
               on_wait: Callable[[], None] | None) -> None:
        """Bind the future to its call: `on_get(fut, timeout)` runs in `get` (journaled deadlines),
        `on_wait()` before a wait blocks (send the queued call first)."""
        self.tag, self._on_get, self._on_wait = tag, on_get, on_wait

    def done(self) -> bool:
        return self._value is not _PENDING or self._exc is not None

    def set_result(self, value: T) -> None:
        self._finish(value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(None, exc)

    def _finish(self, value: Any, exc: BaseException | None) -> None:
        with self._guard:
            if self.done():
                return
            if exc is not None:
                self._exc = exc
            else:
                self._value = value
            callbacks, self._callbacks = self._callbacks, None
        self._lock.release()
        if callbacks:
            for cb in callbacks:
                cb(self)

    def add_done_callback(self, cb: Callable[[Future], None]) -> None:
        with self._guard:
            if not self.done():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(cb)
                return
        cb(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done or timeout; True if done. Does not raise the call's error."""
        if self.done():
            return True
        if self._on_wait is not None:
            self._on_wait()
        if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            return False
        self._lock.release()
        return True

    def get(self, timeout: float | None = None) -> T:
        """The value, or raise the call's error; TimeoutError if not done in time."""
        if self._on_get is not None:
            self._on_get(self, timeout)
        elif not self.wait(timeout):
            raise TimeoutError(f"call not complete after {timeout} s")
        if self._exc is not None:
            raise self._exc
        return self._value

    def exception(self) -> BaseException | None:
        return self._exc

    def __await__(self):
        """Awaitable on the session's event loop (`s.run(main())`), which lets completions in
        one at a time in an order a replay repeats; on any other loop, an error at once."""
        wait_on = getattr(asyncio.get_running_loop(), "regent_wait_on", None)
        if wait_on is None:
            raise RuntimeError(
                "a regent future was awaited on an event loop that is not its session's: run the "
                "program's coroutine with s.run(main()) instead of asyncio.run(main()), so a standby "
                "replays its tasks in the same order after a takeover")
        # Even a future done already waits its turn: answered from the journal on replay, it
        # may be done where the primary's was not, and the task must not run ahead of the others.
        if not self.done() and self._on_wait is not None:
            self._on_wait()
        waiter = wait_on(self)
        if waiter is not None:
            yield from waiter.__await__()
        return self.get()


def stopped_future() -> Future[None]:
    """What a stop returns once it is done: Monarch's stop() is a future to wait on."""
    done: Future[None] = Future()
    done.set_result(None)
    return done
