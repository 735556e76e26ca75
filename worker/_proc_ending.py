"""How a proc ends its actors: one that exits or fails (its queued and running calls fail, its
__cleanup__ runs), one that is stopped, and all of them when the proc stops."""

from __future__ import annotations

import asyncio
import inspect
from functools import partial
from typing import Any

import structlog

from regent.worker._bodies import Body, Waiters, _Gone, current_body
from regent.worker._bodies import start as start_body
from regent.worker._slot import _cleanup_args, _Slot, end_tasks
from regent.worker.actor import CallSite, _calling, _current
from regent.worker.errors import ActorExit

log = structlog.get_logger("regent.proc")

CLOSE_S = 2.0  # what a stopping proc gives its actors' cancelled calls and __cleanup__ (the agent's grace is 3 s)
ENDED_KEPT = 4096  # actors a proc remembers the end of, for the calls that come after
CLEANUP_S = 30.0  # the longest an async __cleanup__ may take (a stop waits for it)


class _Ending:
    """Mixed into ProcRuntime, whose actors, loop and answers these methods use."""

    actors: dict[str, _Slot]
    loop: asyncio.AbstractEventLoop
    stopping: bool
    _closing: set[asyncio.Future]
    waiters: Waiters
    _ended: dict[str, str]

    def _end_actors(self) -> None:
        """Retire every actor (its __cleanup__ may go on in self._closing)."""
        self.stopping = True
        for slot in list(self.actors.values()):
            del self.actors[slot.name]
            slot.mailbox.clear()
            if slot.children:  # best effort: this proc will not be there to send them again
                self._stop_children(slot)
            self._close(slot, "the proc stopped", None)
        self._flush_out()

    def _close(self, slot: _Slot, why: str, exc: BaseException | None,
               site: CallSite | None = None) -> asyncio.Future | None:
        """End an actor: cancel its calls still running (not the one ending it), then run its
        __cleanup__(exc), awaited if async. Calls are answered as they end (_run_async). The
        future that waits for them, if any is needed. The calls __cleanup__ makes derive their
        ids from `site`, the call that ended the actor (a stop, or the call it exited in)."""
        slot.ended = why
        if slot.body is not None and slot.body is not current_body():  # a sync endpoint waiting for a call
            self.waiters.cancel(slot.body, _Gone())
            slot.body = None
        end_tasks(slot.ctx, slot.started)
        me = asyncio.current_task(self.loop)
        running = [t for t in slot.tasks if t is not me and not t.done()]
        for t in running:
            t.cancel()
        hook = getattr(slot.instance, "__cleanup__", None)
        if not running and (hook is None or not inspect.iscoroutinefunction(hook)):
            return self._cleanup_now(slot, hook, exc, site)  # the common case ends here, before the next message
        task = self.loop.create_task(self._close_later(slot, running, hook, exc, site))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task

    async def _close_later(self, slot: _Slot, running: list[asyncio.Task], hook: Any,
                           exc: BaseException | None, site: CallSite | None) -> None:
        if running:
            await asyncio.wait(running, timeout=CLOSE_S)  # a call may refuse to be cancelled
        if hook is not None and inspect.iscoroutinefunction(hook):
            token, calling = _current.set(slot.ctx), _calling.set(site)
            try:
                await asyncio.wait_for(hook(*_cleanup_args(hook, exc)), CLEANUP_S)
            except Exception:  # TimeoutError too: the actor is gone either way
                log.exception("actor __cleanup__ raised", actor=slot.name)
            finally:
                _calling.reset(calling)
                _current.reset(token)
        else:
            done = self._cleanup_now(slot, hook, exc, site)
            if done is not None:
                await done

    def _cleanup_now(self, slot: _Slot, hook: Any, exc: BaseException | None,
                     site: CallSite | None) -> asyncio.Future | None:
        """A sync __cleanup__, as a sync endpoint runs (worker/_bodies.py): None once it is done,
        else a future done when the calls it waits for are answered and it has returned."""
        if hook is None:
            return None
        run = partial(self._cleanup, slot, hook, exc, site)
        if current_body() is not None:  # the actor ends in its own sync endpoint: clean up in it
            run()
            return None
        done = self.loop.create_future()
        if start_body(Body(run, lambda _: done.set_result(None)), self.loop, self.waiters.idle):
            return None
        self._closing.add(done)
        done.add_done_callback(self._closing.discard)
        return done

    def _cleanup(self, slot: _Slot, hook: Any, exc: BaseException | None, site: CallSite | None) -> None:
        token, calling = _current.set(slot.ctx), _calling.set(site)
        try:
            hook(*_cleanup_args(hook, exc))
        except Exception:
            log.exception("actor __cleanup__ raised", actor=slot.name)
        finally:
            _calling.reset(calling)
            _current.reset(token)

    def _fail(self, slot: _Slot, seq: int, point: int, method: str, e: BaseException, o: str = "") -> None:
        """An endpoint raised a BaseException that is not an Exception (nor SystemExit or
        KeyboardInterrupt, which stop the proc): the actor fails, as an abnormal exit. The
        caller gets a SupervisionError, queued calls fail, and the mesh's restart policy applies."""
        self._exit(slot, seq, point, ActorExit(f"{method} raised {type(e).__name__}: {e}", normal=False), e, o=o)

    def _exit(self, slot: _Slot, seq: int, point: int, e: ActorExit, cause: BaseException | None = None,
              o: str = "") -> None:
        """The actor stopped itself: this call reports it, other calls fail, the actor is gone.
        Its __cleanup__ gets what failed it (`cause`, else the ActorExit), or None if normal."""
        kind = "normal" if e.normal else "abnormal"
        self._finish(seq, slot.name, point, "exit", o=o, em=f"actor {slot.name} stopped ({kind}): {e.reason}",
                     normal=e.normal)
        if not e.normal:
            self._tell_owner(slot, e.reason)
        why = f"actor {slot.name} stopped ({kind})" + ("" if e.normal else f": {e.reason}")
        self._retire(slot, why, None if e.normal else cause or e, _calling.get())

    def _retire(self, slot: _Slot, why: str, exc: BaseException | None = None,
                site: CallSite | None = None) -> asyncio.Future | None:
        """Remove an actor: what waits in its mailbox fails as a supervision error ("<why> before
        running this call"), as do its calls still running ("<why> while this call ran")."""
        if self.actors.get(slot.name) is slot:
            del self.actors[slot.name]
            self._ended[slot.name] = why
            if len(self._ended) > ENDED_KEPT:
                del self._ended[next(iter(self._ended))]
        for seq, point, _, _, o, _ in slot.mailbox.clear():
            self._finish(seq, slot.name, point, "dead", o=o, em=f"{why} before running this call")
        for _, answer in self.ports.of_actor(slot.name):  # calls it would have answered through a port
            answer(("gone", why))
        if slot.children:
            self._stop_children(slot)
        return self._close(slot, why, exc, site)
