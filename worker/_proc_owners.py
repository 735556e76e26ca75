"""Actors that own actors: a child spawned from inside an actor is stopped with its owner, and
its failure is offered to the owner's `__supervise__` (Monarch's supervision tree); an owner
that does not handle it fails at its next message."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import structlog

from regent import wire
from regent.wire import Kind
from regent.worker._slot import _Slot
from regent.worker.actor import (
    CallSite,
    _calling,
    _current,
)
from regent.worker.client import ActorClient, Target
from regent.worker.remote import OwnedProcs
from regent.worker.shape import Point
from regent.worker.supervision import MeshFailure

log = structlog.get_logger("regent.proc")
SUPERVISE_ACTOR = "__supervise__"  # a child's failure, sent to its owner's proc (m: the owner)


class _Owners:
    """Mixed into ProcRuntime, whose actors, client and loop these methods use."""

    loop: asyncio.AbstractEventLoop
    client: ActorClient
    actors: dict[str, _Slot]
    _born_with: dict[str, list]  # meshes spawned by actors still in __init__
    _async_running: int  # async endpoint calls (and hooks) in flight: the loop must run them
    stopping: bool  # the proc is on its way out

    def _supervise(self, slot: _Slot, seq: int, point: int, payload: list, o: str) -> bool:
        """Offer a child's failure to the owner's `__supervise__(failure)`: True (handled) or the owner
        fails at its next message, as Monarch's owners do. True here if an async hook now runs."""
        try:
            (fields,), _ = wire.loads(payload)
            failure = MeshFailure(str(fields["mesh"]), int(fields["rank"]),
                                  Point(int(fields["rank"]), dict(fields["co"]), dict(fields["sz"])),
                                  str(fields["reason"]), "unsupervised")
        except Exception as e:  # a notice this proc cannot read: answered, and the owner serves on
            self._finish_error(seq, SUPERVISE_ACTOR, point, e, o=o)
            return False
        hook = getattr(slot.instance, "__supervise__", None)

        def settle(handled: Any, error: BaseException | None = None) -> None:
            if handled is not True:
                why = f"raised {error!r}" if error else "did not handle it" if hook else "has no __supervise__"
                slot.failed = f"its child {failure.mesh}{failure.point!r} failed ({failure.reason}) and it {why}"
            self._finish(seq, SUPERVISE_ACTOR, point, "ok", frames=wire.dumps(handled is True), o=o)

        if hook is None:
            settle(False)
            return False
        token, site = _current.set(slot.ctx), _calling.set(CallSite(seq, o, slot.name, slot.ctx.rank))
        try:
            handled = hook(failure)
        except Exception as e:
            settle(False, e)
            return False
        finally:
            _calling.reset(site)
            _current.reset(token)
        if not inspect.isawaitable(handled):
            settle(handled)
            return False

        async def wait() -> None:
            token = _current.set(slot.ctx)
            try:
                settle(await handled)
            except Exception as e:
                settle(False, e)
            finally:
                _current.reset(token)
                self._async_running -= 1
            if slot.ended is None:
                self._drain(slot)

        self._async_running += 1
        task = self.loop.create_task(wait())
        slot.tasks.add(task)
        task.add_done_callback(slot.tasks.discard)
        return True

    def owned(self, actor: str, child: Any) -> None:
        """Actor `actor` spawned mesh `child` (an ActorMeshRef, or OwnedProcs): it is stopped when
        the actor ends."""
        slot = self.actors.get(actor)
        if slot is not None:
            slot.children.append(child)
        else:  # spawned from its __init__: the slot is not made yet (_construct takes these)
            self._born_with.setdefault(actor, []).append(child)

    def _stop_children(self, slot: _Slot) -> None:
        """An owner ended: stop the meshes it spawned, without waiting (Monarch's recursive stop)."""
        self._stop_meshes(f"{slot.name}[{slot.ctx.rank}]@{slot.ctx.incarnation}/stop", slot.children)
        slot.children.clear()

    def _stop_meshes(self, origin: str, meshes: list) -> None:
        """Stop the meshes, then the procs: an actor on an owned proc gets its stop, and its
        __cleanup__ runs and may call, before its proc goes."""
        stops = [self.client.send(Kind.STOP, target, -1, child.name, rank, f"{origin}#{k}", "__stop__", b"", [])
                 for k, child in enumerate(meshes) if not isinstance(child, OwnedProcs)
                 for rank, target in zip(child.ranks, child.targets, strict=True)]
        procs = [child for child in meshes if isinstance(child, OwnedProcs)]
        if not procs:
            return

        asked: list[bool] = []

        def stop_procs(_: Any = None, now: bool = False) -> None:
            if not asked and (now or all(f.done() for f in stops)):
                asked.append(True)
                for child in procs:
                    self.client.ask_host(child.host, "stop_procs", {"ids": list(child.ids)})

        if not stops or self.stopping:  # a proc on its way out asks now: it will not be there later
            stop_procs(None, now=True)
        for f in stops:  # each answered, or failed once its proc is found gone
            f.add_done_callback(stop_procs)

    def _tell_owner(self, slot: _Slot, reason: str) -> None:
        """An owned actor failed: its owner's proc hears of it (worker/remote.py ProcMeshRef.spawn)."""
        ow = slot.owner
        if not ow:
            return
        ctx = slot.ctx
        fields = {"mesh": slot.name, "rank": ctx.rank, "co": dict(ctx.point), "sz": dict(ctx.sizes), "reason": reason}
        frames, digest = wire.dumps_call((fields,), {})
        origin = f"{slot.name}[{ctx.rank}]@{ctx.incarnation}"  # one failure per incarnation
        fut = self.client.send(Kind.CALL, Target(ow["addr"], ow["p"], ow["h"]), -1, SUPERVISE_ACTOR, ow["pt"],
                               origin, ow["a"], digest, frames)
        fut.add_done_callback(lambda f: log.debug("told an owner of its child's failure", owner=ow["a"],
                                                 child=slot.name, status=f.result()[0]["st"]))
