"""How an actor's messages run on its proc: one at a time from its mailbox, a sync endpoint in a
Body (worker/_bodies.py), an async one as a task, a concurrent one until its first await; and
the calls of one batch, queued before they run, so that an actor's run of sync calls costs one
greenlet switch rather than one each."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from greenlet import GreenletExit

from regent.worker._bodies import Body, Waiters, _Gone
from regent.worker._bodies import start as start_body
from regent.worker._proc_owners import SUPERVISE_ACTOR
from regent.worker._slot import _arguments, _Run, _Slot
from regent.worker.actor import CallSite, _calling, _current
from regent.worker.errors import ActorExit


class _Running:
    """Mixed into ProcRuntime, whose answers, ending and supervision these methods use."""

    loop: asyncio.AbstractEventLoop
    waiters: Waiters
    stopping: bool
    _async_running: int
    _deferred: list[_Slot] | None  # actors with calls queued by the batch being handled, to run after it

    def _start(self, slot: _Slot) -> None:
        """An idle actor got a message: run it now, or once the batch it came in is queued."""
        if self._deferred is None:
            self._drain(slot)
        elif slot not in self._deferred:
            self._deferred.append(slot)

    def _run_deferred(self) -> None:
        """Run what the batch queued so far (before a message that must come after it)."""
        deferred, self._deferred = self._deferred, None
        try:
            for slot in deferred or ():
                if slot.ended is None and not slot.mailbox.busy:
                    self._drain(slot)
        finally:
            if deferred is not None:
                self._deferred = []

    def _drain(self, slot: _Slot) -> None:
        """Run queued messages one at a time: a sync endpoint inline, an async one as a task that
        parks the mailbox until done. A concurrent endpoint's task parks it only until the task
        has run to its first await (the next message is taken on the loop's next turn)."""
        while (item := slot.mailbox.take()) is not None:
            seq, point, method, payload, o, how = item
            if slot.failed is not None:  # a child's failure it did not handle: this message finds it failed
                self._exit(slot, seq, point, ActorExit(slot.failed, normal=False), o=o)
                return
            if method == SUPERVISE_ACTOR:
                if self._supervise(slot, seq, point, payload, o):
                    return  # an async __supervise__ holds the mailbox until it returns
                continue
            fn, run, explicit = slot.endpoint(method)
            # A send with a port gives an explicit-port endpoint that port, not its call's own.
            port = self._response_port(slot, seq, point, o) if explicit and how != "rp" else None
            if run is not _Run.INLINE:
                self._async_running += 1
                task = self.loop.create_task(self._run_async(slot, seq, point, method, fn, payload, run, o, port, how))
                slot.tasks.add(task)
                task.add_done_callback(slot.tasks.discard)
                task.add_done_callback(partial(self._task_ended, slot, seq, point, o))
                if run is _Run.CONCURRENT:
                    self.loop.call_soon(self._resume, slot)  # after the task's first step
                else:
                    slot.holder = task  # an await of its own actor's call could never end
                return
            body = Body(partial(self._run_sync, slot, (seq, point, method, fn, payload, o, port, how, explicit)),
                        partial(self._after_body, slot))
            if not start_body(body, self.loop, self.waiters.idle):
                slot.body = body  # it waits for a call: the mailbox waits for it (_after_body)
                return
            if body.result:  # the actor ended
                return

    def _run_sync(self, slot: _Slot, call: tuple) -> bool:
        """In a Body: run `call`, then each sync call queued right behind it (one greenlet switch
        for a run of them, as a batch brings). True if the actor ended; the rest is _drain's."""
        while True:
            if self._run_inline(slot, *call):
                return True
            queued = slot.mailbox.items
            if not queued or slot.failed is not None or slot.ended is not None:
                return False
            seq, point, method, payload, o, how = queued[0]
            if method == SUPERVISE_ACTOR:
                return False
            fn, run, explicit = slot.endpoint(method)
            if run is not _Run.INLINE:
                return False
            queued.popleft()  # the actor stays busy with it
            port = self._response_port(slot, seq, point, o) if explicit and how != "rp" else None
            call = (seq, point, method, fn, payload, o, port, how, explicit)

    def _run_inline(self, slot: _Slot, seq: int, point: int, method: str, fn: Any, payload: list, o: str,
                    port: Any, how: str, explicit: bool) -> bool:
        """A sync endpoint's call, in its Body: True if it ended the actor."""
        token = _current.set(slot.ctx)
        site = _calling.set(CallSite(seq, o, slot.name, point))
        answer_to = None
        try:
            args, kwargs, answer_to = _arguments(payload, how)
            slot.executions += 1
            first = port or (answer_to if explicit else None)
            value = fn(*args, **kwargs) if first is None else fn(first, *args, **kwargs)
        except ActorExit as e:
            self._exit(slot, seq, point, e, o=o)
            return True
        except Exception as e:  # an error the endpoint raised: it goes back to the caller
            return self._raised(slot, seq, point, method, e, o, port, answer_to, how)
        except (SystemExit, KeyboardInterrupt, GreenletExit):
            raise
        except _Gone:  # its actor ended while it waited for a call (_close)
            self._finish(seq, slot.name, point, "dead", o=o, em=f"{slot.ended} while this call ran")
            return True
        except BaseException as e:  # noqa: BLE001 - not an error to answer with: the actor fails
            self._fail(slot, seq, point, method, e, o=o)
            return True
        else:
            self._returned(slot, seq, point, o, port, answer_to, explicit, value)
        finally:
            _calling.reset(site)
            _current.reset(token)
        return False

    def _after_body(self, slot: _Slot, body: Body) -> None:
        """A sync endpoint that waited for a call is done: its actor takes its next message."""
        slot.body = None
        if not body.result and slot.ended is None:
            self._drain(slot)

    def _task_ended(self, slot: _Slot, seq: int, point: int, o: str, task: asyncio.Task) -> None:
        """An async call's task cancelled before its first step (its actor was stopped in the
        same batch): _run_async never ran, so its answer is given here."""
        if slot.holder is task:
            slot.holder = None
        if task.cancelled() and not self.stopping:
            self._async_running -= 1
            self._finish(seq, slot.name, point, "dead", o=o, em=f"{slot.ended or 'its actor ended'} before this call ran")

    def _resume(self, slot: _Slot) -> None:
        if slot.ended is None:
            self._drain(slot)

    async def _run_async(self, slot: _Slot, seq: int, point: int, method: str, fn: Any, payload: list,
                         run: _Run, o: str = "", port: Any = None, how: str = "") -> None:
        token = _current.set(slot.ctx)
        _calling.set(CallSite(seq, o, slot.name, point))  # this task's own context
        # Only a send with a port needs the lookup: otherwise `port` says whether it takes one.
        answer_to, explicit = None, port is not None or (how == "rp" and slot.endpoint(method)[2])
        try:
            args, kwargs, answer_to = _arguments(payload, how)
            first = port or (answer_to if explicit else None)
            slot.executions += 1
            value = await (fn(*args, **kwargs) if first is None else fn(first, *args, **kwargs))
        except ActorExit as e:
            self._exit(slot, seq, point, e, o=o)
            return
        except Exception as e:
            if self._raised(slot, seq, point, method, e, o, port, answer_to, how):
                return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001 - the actor fails; its mailbox must not stay parked
            if isinstance(e, asyncio.CancelledError):
                if self.stopping:
                    raise  # the proc is shutting down and cancels what runs
                if slot.ended is not None:  # the actor ended while this call ran (_close)
                    self._finish(seq, slot.name, point, "dead", o=o, em=f"{slot.ended} while this call ran")
                    return
            self._fail(slot, seq, point, method, e, o=o)
            return
        else:
            self._returned(slot, seq, point, o, port, answer_to, explicit, value)
        finally:
            _current.reset(token)
            self._async_running -= 1
        if run is _Run.TASK and slot.ended is None:
            self._drain(slot)

