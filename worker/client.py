"""The proc's side of the calls its actors make (docs/design.md, "Calls made by actors").

An actor that calls another mesh sends the call itself, from its proc, under an id derived
from the call it is running (`actor.CallSite`), and the callee dedupes it as it dedupes the
controller's calls. This module keeps each such call until it is answered: it resends it
every RESEND_S (a lost message is found again by id; a repeat joins the execution in flight),
follows a new controller's epoch when a callee says this proc's is old, and asks the callee's
host agent whether the proc still lives when a call waits long, failing the call with a
SupervisionError when it does not. It runs on the proc's loop thread only.
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from asyncio import current_task
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from regent import wire
from regent.wire import Kind
from regent.worker._bodies import current_body
from regent.worker.actor import _current
from regent.worker.errors import DeadlockError

if TYPE_CHECKING:
    from regent.worker.proc import ProcRuntime

log = structlog.get_logger("regent.proc")

RESEND_S = 2.0  # an unanswered call is sent again this often
TICK_S = 0.5
CHECK_S = 5.0  # a call waiting this long has its proc's liveness checked with its host agent
MAX_FENCED = 8  # a callee refusing this proc's epoch so many times in a row: give up


def _dead_after_s() -> float:
    """How long a callee's host agent may stay silent before its calls fail."""
    try:
        return max(1.0, float(os.environ.get("REGENT_ACTOR_CALL_DEAD_S", "30")))
    except ValueError:
        return 30.0


Key = tuple[int, str, int, str]  # (root seq, actor, point, origin): a derived call id at one point


@dataclass(slots=True)
class Target:
    """Where one point of a mesh lives: the proc's inbox, its id and its host agent."""

    address: str
    proc: str
    host: str


@dataclass(slots=True)
class _Outgoing:
    kind: Kind
    target: Target
    meta: dict  # everything but the epoch, which is the proc's own when it is sent
    frames: Any
    future: asyncio.Future  # (meta, payload) of the answer
    sent_at: float
    since: float
    fenced: int = 0


@dataclass(slots=True)
class _HostRequest:
    host: str
    meta: dict  # everything but the session, epoch and reply address, added when it is sent
    future: asyncio.Future
    sent_at: float = 0.0


class ActorClient:
    """The calls in flight that this proc's actors made, by id."""

    def __init__(self, runtime: ProcRuntime):
        self.rt = runtime
        self.out: dict[Key, _Outgoing] = {}
        self._asked: dict[str, float] = {}  # host agent -> when it was asked and has not answered
        self._asks: dict[int, tuple[str, set[str]]] = {}  # request "n" -> (host agent, procs asked about)
        self._timer: asyncio.TimerHandle | None = None
        self._dead_s = _dead_after_s()
        self._host_out: dict[int, _HostRequest] = {}  # an actor's spawn_procs, by request "n"

    def send(self, kind: Kind, target: Target, seq: int, actor: str, point: int, origin: str, method: str,
             digest: bytes, frames: Any, extra: dict | None = None) -> asyncio.Future:
        """Send one call (CALL, SPAWN or STOP) to one point; the future gets (meta, payload) of its answer.
        A call already in flight under this id (the same code running again) shares its future."""
        key = (seq, actor, point, origin)
        found = self.out.get(key)
        if found is not None:
            return found.future
        meta = {"sid": self.rt.session, "s": seq, "a": actor, "m": method, "d": digest, "pt": point,
                "rt": self.rt.inbox.address, "o": origin}
        if extra:
            meta.update(extra)
        now = time.monotonic()
        o = self.out[key] = _Outgoing(kind, target, meta, frames, self.rt.loop.create_future(), now, now)
        self._transmit(o)
        if self._timer is None:
            self._timer = self.rt.loop.call_later(TICK_S, self._tick)
        return o.future

    def _transmit(self, o: _Outgoing) -> None:
        o.sent_at = time.monotonic()
        self.rt._send(o.target.address, wire.encode(o.kind, {**o.meta, "e": self.rt.fence.epoch}, o.frames))

    # --- answers ---------------------------------------------------------------------

    def on_result(self, meta: dict, payload: list) -> None:
        key = (meta["s"], meta.get("a", ""), meta["pt"], meta.get("o", ""))
        o = self.out.get(key)
        if o is None:
            return  # a late repeat of an answer already taken
        if meta["st"] == "fenced":
            e = meta.get("e", 0)
            if e > self.rt.fence.epoch:
                self.rt.fence.admit(e)  # a newer controller leads the session; its epoch is ours now
            o.fenced += 1
            if o.fenced < MAX_FENCED:
                self._transmit(o)
                return
        del self.out[key]
        if not o.future.done():
            o.future.set_result((meta, payload))

    def _fail(self, key: Key, why: str) -> None:
        o = self.out.pop(key)
        if not o.future.done():
            o.future.set_result(({"s": key[0], "a": key[1], "pt": key[2], "o": key[3], "st": "dead", "em": why}, []))

    # --- resends and liveness ------------------------------------------------------

    def _tick(self) -> None:
        self._timer = None
        if not self.out and not self._host_out:
            return
        now = time.monotonic()
        for req in self._host_out.values():
            if now - req.sent_at >= RESEND_S:
                self._transmit_host(req)
        check: dict[str, set[str]] = {}
        for o in list(self.out.values()):
            if now - o.sent_at >= RESEND_S:
                self._transmit(o)
            if now - o.since >= CHECK_S:
                check.setdefault(o.target.host, set()).add(o.target.proc)
        for host, procs in check.items():
            asked = self._asked.get(host)
            if asked is not None:
                if now - asked > self._dead_s:
                    self._lost(lambda t, h=host: t.host == h,
                               f"the host agent at {host} has not answered for {now - asked:.0f} s")
                    del self._asked[host]
                    self._asks = {n: a for n, a in self._asks.items() if a[0] != host}
                continue
            self._ask(host, procs)
        if self.out or self._host_out:
            self._timer = self.rt.loop.call_later(TICK_S, self._tick)
        if self.rt.waiters:  # a call failed above may be what a sync endpoint waits for
            self.rt.waiters.check()

    # --- requests to host agents -------------------------------------------------------

    def ask_host(self, host: str, op: str, fields: dict) -> asyncio.Future:
        """A request an actor makes of a host agent (spawn_procs under a derived id), sent
        again every RESEND_S until answered: the agent dedupes it by its id, as a proc does a
        call. The future gets the answer's metadata."""
        n = next(self.rt._ack_ids)
        req = self._host_out[n] = _HostRequest(host, {"op": op, "n": n, **fields}, self.rt.loop.create_future())
        self._transmit_host(req)
        if self._timer is None:
            self._timer = self.rt.loop.call_later(TICK_S, self._tick)
        return req.future

    def _transmit_host(self, req: _HostRequest) -> None:
        req.sent_at = time.monotonic()
        rt = self.rt
        meta = {**req.meta, "sid": rt.session, "e": rt.fence.epoch, "rt": rt.inbox.address}
        rt._send(req.host, wire.encode(Kind.HOST_REQ, meta, []))

    def _ask(self, host: str, procs: set[str]) -> None:
        """Ask a callee's host agent which of the session's procs live there. Answered through
        `on_host_reply`, called by the proc's dispatch itself: a sync endpoint waiting in `pump`
        runs no loop callbacks."""
        rt = self.rt
        n = next(rt._ack_ids)
        self._asks[n] = (host, procs)
        self._asked[host] = time.monotonic()
        rt._send(host, wire.encode(Kind.HOST_REQ, {"sid": rt.session, "e": rt.fence.epoch, "op": "list", "n": n,
                                                   "rt": rt.inbox.address}, []))

    def on_host_reply(self, listing: dict) -> bool:
        """A host agent's answer to `_ask` or `ask_host`; False if it answers something else."""
        req = self._host_out.get(listing.get("n")) if isinstance(listing.get("n"), int) else None
        if req is not None:
            if listing.get("st") == "fenced" and isinstance(listing.get("e"), int) \
                    and listing["e"] > self.rt.fence.epoch:
                self.rt.fence.admit(listing["e"])  # a newer controller leads: ours now, and ask again
                self._transmit_host(req)
                return True
            del self._host_out[listing["n"]]
            if not req.future.done():
                req.future.set_result(listing)
            return True
        found = self._asks.pop(listing.get("n"), None) if isinstance(listing.get("n"), int) else None
        if found is None:
            return False
        host, procs = found
        self._asked.pop(host, None)
        gone: set[str] = set()
        if listing.get("st") == "ok":
            alive = {p.get("id") for p in listing.get("procs") or [] if p.get("alive", True)}
            gone = procs - alive
        elif listing.get("st") == "fenced" and isinstance(listing.get("e"), int):
            self.rt.fence.admit(max(self.rt.fence.epoch, listing["e"]))  # a newer controller leads: ours now
        if gone:
            self._lost(lambda t: t.host == host and t.proc in gone,
                       f"proc {sorted(gone)[0]} is gone (its host agent at {host} no longer lists it)")
        for o in self.out.values():  # alive (or the agent could not say): checked again CHECK_S on
            if o.target.host == host and o.target.proc not in gone:
                o.since = time.monotonic()
        return True

    def _lost(self, where: Callable[[Target], bool], why: str) -> None:
        for key in [k for k, o in self.out.items() if where(o.target)]:
            log.warning("a call an actor made failed: its callee is gone", actor=key[1], point=key[2], why=why)
            self._fail(key, why)

    # --- waiting without the loop ----------------------------------------------------

    def _refuse_self_wait(self, waits_on: Sequence[asyncio.Future]) -> None:
        me = _current.get()
        if me is None or not waits_on:
            return
        mine = self.rt.inbox.address
        for (_, actor, point, _), o in self.out.items():
            if actor == me.mesh and point == me.rank and o.target.address == mine and o.future in waits_on:
                raise DeadlockError(
                    f"{me} waits on its own call {actor}[{point}].{o.meta['m']}: an actor takes one message at "
                    "a time, so that call can only run after this endpoint returns. Call the method "
                    "directly, or make this endpoint an async @concurrent_endpoint that awaits the call")

    def refuse_self_await(self, waits_on: Sequence[asyncio.Future]) -> None:
        """An async endpoint awaiting a call to its own actor, from the task that holds the actor's
        mailbox, could never be answered: DeadlockError at once. A concurrent endpoint's await, or
        a task the endpoint started, waits for no message of its actor, so it may."""
        me = _current.get()
        slot = self.rt.actors.get(me.mesh) if me is not None else None
        if slot is not None and slot.holder is not None and slot.holder is current_task(self.rt.loop):
            self._refuse_self_wait(waits_on)

    def pump(self, done: Callable[[], bool], timeout: float | None, waits_on: Sequence[asyncio.Future] = ()) -> bool:
        """Wait until `done()` (True) or `timeout` (False) for the answers `waits_on`: how an
        actor waits for a call it made without awaiting it. A sync endpoint gives the thread back
        to the loop until then (worker/_bodies.py); one waiting on its own actor fails at once
        (DeadlockError), since that call can only run after it. Elsewhere (an __init__, a
        __cleanup__, `.get()` in an async endpoint, which warns as Monarch does) the proc's
        inbox is served on this thread meanwhile: its actors' sync endpoints go on serving."""
        body = current_body()
        if body is not None:
            self._refuse_self_wait(waits_on)
            return self.rt.waiters.wait(body, done, timeout)
        if asyncio._get_running_loop() is not None and current_task(self.rt.loop) is not None:
            warnings.warn("a call's .get() was called from within an active event loop (an async endpoint): "
                          "it blocks the proc's loop, so async endpoints and timers of this proc wait; "
                          "await the call instead", UserWarning, stacklevel=3)
        rt = self.rt
        end = None if timeout is None else time.monotonic() + timeout
        next_tick = time.monotonic() + TICK_S
        while not done():
            now = time.monotonic()
            if end is not None and now >= end:
                return False
            if now >= next_tick:
                if self._timer is not None:
                    self._timer.cancel()
                self._tick()
                next_tick = now + TICK_S
            rt._flush_out()
            rt.pump_once(int(1000 * min(TICK_S, max(0.0, (end or now + TICK_S) - now))))
        rt._flush_out()
        return True

