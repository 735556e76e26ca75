"""The session's event loop: asyncio programs that replay to the same order after a takeover.

An asyncio loop resumes tasks in the order their wake-ups arrive, and a regent reply or a
deadline arrives when it likes, so a standby replaying an async program would see its tasks
resume in another order and make its calls in another order. `SessionLoop` runs the program's
tasks on the program's thread and lets exactly one thing from outside in at a time, only when
every task is blocked (the loop is quiescent): one regent future's completion, or the clock
reaching the earliest timer. Between two such wake-ups everything the tasks do follows from the
program alone (asyncio's own scheduling is first in, first out), so the sequence of wake-ups
decides the run. A wake-up that could have gone another way is journaled as a `loop` record
with the loop's clock before the tasks see it, and a replay feeds the journal's wake-ups back
in the same order, its sleeps and deadlines firing from the journaled clock, not the wall.

A wake-up is forced, and not journaled, when it is the only thing that can happen: one regent
future awaited and no timer, or a timer and nothing awaited. The loop's clock (`loop.time()`)
moves at journaled wake-ups and at forced timers (to their deadline); a program that reads it
after forced wake-ups (a new sleep or deadline does) gets a fresh reading, journaled too. Like a
value read before a deadline in sequential code, a journaled wake-up is an observation the
session's next call waits to see durable (docs/design.md, "Async programs").
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import msgpack

from regent.controller.engine import IN_TIME
from regent.controller.futures import Future
from regent.controller.replay import NonDeterminismError

if TYPE_CHECKING:
    from regent.controller.session import Session

LOOP = "loop"  # the kind of a wake-up's journal record


class _Await:
    """One task awaiting one regent future on the loop."""

    __slots__ = ("fut", "waiter")

    def __init__(self, fut: Future, waiter: asyncio.Future):
        self.fut, self.waiter = fut, waiter


class SessionLoop(asyncio.BaseEventLoop):
    """The event loop `Session.run` runs a program's coroutine on (see the module docstring)."""

    def __init__(self, session: Session):
        super().__init__()
        self.session = session
        self._awaits: list[_Await] = []  # in the order the tasks began awaiting
        self._vt: float | None = None  # the loop's clock: None until first read
        self._stale = True  # forced wake-ups since the clock was last journaled or moved
        self._tasks = 0
        self.set_task_factory(self._new_task)

    def _new_task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
        """Tasks are named by the order they are made in (the export's track per task)."""
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self._tasks += 1
        task.regent_name = f"task {self._tasks}: {getattr(coro, '__qualname__', type(coro).__name__)}"
        return task

    def task_name(self) -> str | None:
        """The name of the task running now, for the record of a call it makes."""
        task = asyncio.current_task(self)
        return getattr(task, "regent_name", None)

    # --- what regent futures call ---------------------------------------------------------

    def regent_wait_on(self, fut: Future) -> asyncio.Future | None:
        """An asyncio future the awaiting task blocks on until the loop lets `fut` in; None
        when nothing else could run or wake meanwhile (no other task ready or awaiting, no
        timer): the wake-up would be forced, so the task may simply wait for `fut` itself.
        Both depend on the program alone, so a replay takes the same path."""
        if not self._ready and not self._scheduled and all(a.waiter.done() for a in self._awaits):
            self._stale = True
            return None
        waiter = self.create_future()
        self._awaits.append(_Await(fut, waiter))
        return waiter

    # --- the clock ------------------------------------------------------------------------

    def time(self) -> float:
        if self._stale:  # true at first, so the clock is read (and journaled) before use
            self._stale = False
            self._vt = self._journaled("clock", b"", lambda: {"t": self._wall()})["t"]
        return self._vt

    def _wall(self) -> float:
        """The live clock: wall time, never behind what the journal says the clock read."""
        now = time.time()
        return now if self._vt is None or now > self._vt else self._vt

    # --- asyncio's hooks ------------------------------------------------------------------

    def _process_events(self, event_list: Any) -> None:
        """No selector: what comes from outside comes through `_wake`."""

    def _write_to_self(self) -> None:
        """A callback from another thread lands in the ready queue; `_wake` looks there."""

    def _run_once(self) -> None:
        """One turn: if every task is blocked, let one wake-up in; run what is ready."""
        scheduled, ready = self._scheduled, self._ready
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False
        if not ready and not self._stopping:
            self._wake()
        vt = self._vt
        while scheduled and vt is not None and scheduled[0]._when <= vt:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    # --- wake-ups -------------------------------------------------------------------------

    def _wake(self) -> None:
        awaits = self._awaits = [a for a in self._awaits if not a.waiter.done()]
        timer = self._scheduled[0]._when if self._scheduled else None
        if not awaits and timer is None:
            # Nothing can wake the program: a callback from another thread may yet (asyncio's
            # executor); else the program awaits something regent does not drive.
            if not self._wait_outside():
                raise RuntimeError(
                    "the program's tasks all wait, on nothing regent drives (no call's future and no "
                    "timer): await regent futures, asyncio.sleep or asyncio primitives inside s.run")
            return
        if timer is None and len(awaits) == 1:
            self._stale = True
            self._resume(awaits[0])
            return
        if not awaits:
            # A lone timer: it fires at its deadline. Replaying, that deadline is journaled
            # time gone by, so nothing waits; at the journal's end the rest of it is waited out.
            wait = timer - self._wall()
            if wait > 0:
                self.session.runtime.wait_until(self._ready_from_outside, wait)
            self._vt = max(timer, self._vt or timer)
            return
        self._choose(awaits, timer)

    def _choose(self, awaits: list[_Await], timer: float | None) -> None:
        """Several things may happen next: which did, journaled (or, replaying, the journal's)."""
        # As a set: asyncio itself starts some tasks in an order of its own (as_completed
        # iterates a set of futures), and that order decides nothing the program sees.
        tags = sorted(a.fut.tag for a in awaits)
        digest = hashlib.blake2b(msgpack.packb([tags, timer is not None]), digest_size=16).digest()
        chosen = self._journaled("wake", digest, lambda: self._first(awaits, timer))
        self._vt = chosen["t"]
        self._stale = False
        if "f" in chosen:
            for a in awaits:
                if a.fut.tag == chosen["f"]:
                    self._resume(a)
                    return
            raise NonDeterminismError(-1, f"a wake-up of the task awaiting seq {chosen['f']}",
                                      f"no task awaiting it (the tasks await seqs {tags})")

    def _first(self, awaits: list[_Await], timer: float | None) -> dict:
        """Live: the first awaited future to complete (the lowest seq if several have), or the
        clock reaching the timer."""
        def something() -> bool:
            return any(a.fut.done() for a in awaits) or bool(self._ready)

        if not something():
            wait = None if timer is None else max(0.0, timer - self._wall())
            self.session.runtime.wait_until(something, wait)
        done = [a.fut.tag for a in awaits if a.fut.done()]
        if done:
            return {"f": min(done), "t": self._wall()}
        return {"t": max(self._wall(), timer if timer is not None else 0.0)}

    def _resume(self, a: _Await) -> None:
        fut = a.fut
        if not fut.done():
            self.session.runtime.wait_for(fut, None)
        self._awaits.remove(a)
        a.waiter.set_result(None)

    def _ready_from_outside(self) -> bool:
        return bool(self._ready)

    def _wait_outside(self) -> bool:
        """Wait (briefly, repeatedly) for a callback from another thread; False if none can come."""
        executor = self._default_executor
        if executor is None:
            return False
        self.session.runtime.wait_until(self._ready_from_outside, 0.05)
        return True

    # --- journaling -----------------------------------------------------------------------

    def _journaled(self, what: str, digest: bytes, live: Any) -> dict:
        """A value of the loop's that another run might not reproduce: the journal's when
        replaying, else `live()`, journaled; the session's next call waits for it to be durable."""
        s = self.session
        # A journal-only record: durable after everything journaled before it, so it waits for none.
        seq, jc = s._begin(LOOP, LOOP, what, digest, durable_first=True)
        if jc is not None:
            s._finished(seq)
            value = jc.value
            if not isinstance(value, dict) or not isinstance(value.get("t"), (int, float)):
                raise NonDeterminismError(seq, f"a loop {what} record without a clock reading", repr(value)[:200])
            return value
        value = live()
        lsn = s._do(s._engine.loop_record(seq, what, digest, value))
        s._finished(seq)
        s._observed(lsn, (IN_TIME,))
        return value


def run(session: Session, main: Coroutine[Any, Any, Any]) -> Any:
    """`Session.run`: run `main` on a fresh SessionLoop on this thread; its result."""
    if not asyncio.iscoroutine(main):
        raise TypeError(f"s.run takes a coroutine (s.run(main())), not {type(main).__name__}")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        main.close()
        raise RuntimeError("s.run cannot be called from a running event loop: call it from plain code, "
                           "as asyncio.run would be")
    loop = SessionLoop(session)
    try:
        asyncio.set_event_loop(loop)
        session._loop = loop
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_rest(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            session._loop = None
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_rest(loop: SessionLoop) -> None:
    """Tasks the program left running are cancelled, as asyncio.run does."""
    rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in rest:
        task.cancel()
    if rest:
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))


__all__ = ["LOOP", "SessionLoop", "run"]
