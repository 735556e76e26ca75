"""A proc: one OS process hosting actors, started by a host agent.

The proc's single thread runs an asyncio loop fed by its authenticated inbox. Each
actor has a mailbox and handles one message at a time; sync endpoints run inline
(no thread hand-off on the call path), async ones as tasks, and a concurrent endpoint's
call lets the mailbox go on once it has started. Every call passes the epoch fence and
the dedupe cache before it can run. The replies to one incoming message
(often a batch) are collected per return address and sent as one batch.

A proc outlives its host agent. It watches the agent through a pidfd on the loop
(no polling on the call path); when the agent dies, it starts a new one (or finds the
one a sibling started) and asks to be adopted, so it is supervised again
(worker/_host_watch.py).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import importlib
import itertools
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import structlog
import zmq

from regent import wire
from regent.wire import Kind, ProtocolError, bulk, schema
from regent.wire.security import load_credentials, stop_authenticator
from regent.wire.transport import (
    RECEIVER_MAX_PEERS,
    Inbox,
    Outbox,
    max_message_bytes,
    peer_of,
    readable,
    spin_budget_s,
    spin_until_readable,
)
from regent.worker._bodies import Body, Waiters, current_body
from regent.worker._bodies import start as start_body
from regent.worker._folding import Folds
from regent.worker._host_watch import _environment_of, _HostWatch
from regent.worker._proc_answers import _Answers
from regent.worker._proc_ending import CLOSE_S, _Ending
from regent.worker._proc_out import _Outbound
from regent.worker._proc_owners import SUPERVISE_ACTOR, _Owners
from regent.worker._proc_run import _Running
from regent.worker._slot import _how, _Slot, end_tasks, own_tasks, tasks_of
from regent.worker.actor import (
    ActorContext,
    CallSite,
    _calling,
    _current,
    endpoint_names,
)
from regent.worker.classref import load_class
from regent.worker.client import ActorClient
from regent.worker.errors import (
    error_fields,
)
from regent.worker.logsetup import prefix_actor_logs
from regent.worker.output import OutputForwarder, forwarding_enabled
from regent.worker.ports import PORT_ACTOR, ProcPorts
from regent.worker.proccore import Deliver, ProcCore, Reply
from regent.worker.remote import install_client
from regent.worker.shape import Point

log = structlog.get_logger("regent.proc")

READ_SLICE_S = 0.005  # the longest the reader spins for more calls before the loop runs again


class ProcRuntime(_HostWatch, _Owners, _Answers, _Outbound, _Ending, _Running):
    """host_pid: the agent that started this proc, watched so that its death is noticed
    (None: nothing watches). origin: what a successor agent needs to adopt this proc: the
    request that started it ("s", "size", "pos" or "old") and the session's "orphan_s"."""

    def __init__(self, session: str, index: int, proc_id: str, host_inbox: str, bind_host: str,
                 host_pid: int | None = None, origin: dict | None = None, epoch: int = 0,
                 advertise: str | None = None, ctx: zmq.Context | None = None,
                 loop: asyncio.AbstractEventLoop | None = None):
        self.session = session
        self.index = index
        self.proc_id = proc_id
        self.host_pid = host_pid
        self.origin = origin or {}
        # The agent's own environment, read while it lives: a successor started from this
        # proc must not inherit the proc's device binding or rank.
        self.host_env = _environment_of(host_pid) if host_pid else None
        self._host_fd: int | None = None
        self._adoption: asyncio.Task | None = None
        self._acks: dict[int, asyncio.Future] = {}
        self._ack_ids = itertools.count(1)
        self.ctx = ctx or zmq.Context()  # a hollow host's procs share their agent's (worker/hollow.py)
        self.creds = load_credentials()
        self.inbox = Inbox(self.ctx, self.creds, bind_host, advertise=advertise)
        self.own_address = self.inbox.address  # a fold's folder answers its own point here
        self.outbox = Outbox(self.ctx, self.creds, max_peers=RECEIVER_MAX_PEERS)
        self.host_inbox = host_inbox
        self.core = ProcCore(session, proc_id, epoch, os.getpid())  # admission, dedupe, results
        self.fence = self.core.fence  # what its session had seen when this proc started, and since
        self.dedupe = self.core.dedupe
        self.client = ActorClient(self)  # the calls this proc's actors make
        self.ports = ProcPorts(self)  # channels its actors opened, calls answered through a port
        self.folds = Folds(self._send, self._answer_through_agent)  # Accumulators folded here (_folding.py)
        self._born_with: dict[str, list] = {}  # meshes spawned by actors still in __init__
        self.actors: dict[str, _Slot] = {}
        self._ended: dict[str, str] = {}  # why each actor that is gone went (the latest ENDED_KEPT)
        self.pending: dict[str, collections.deque] = {}
        self._out: dict[str, list] = {}  # replies not yet sent, per return address
        # Return addresses whose calls came through this host's agent: their answers go back
        # that way, gathered per host (worker/_relay.py). Value: the relay header for the address.
        self._relayed: dict[str, bytes] = {}
        self._reading = False
        self._spin_s = spin_budget_s()
        self._async_running = 0  # async endpoint calls in flight: the loop must run them
        self._closing: set[asyncio.Future] = set()  # actors' ends still cancelling calls or in __cleanup__
        self._max_message = max_message_bytes()  # what a controller accepts, as far as we know
        self.loop = loop or asyncio.new_event_loop()
        own_tasks(self.loop)
        self.waiters = Waiters(self.loop)  # sync endpoints waiting for a call (worker/_bodies.py)
        self._deferred: list[_Slot] | None = None  # actors a batch queued calls for (_proc_run)
        self.output: OutputForwarder | None = None
        self.stopping = False
        self.dropped = 0

    # --- lifecycle -------------------------------------------------------------

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        install_client(self.client)
        prefix_actor_logs()
        if forwarding_enabled():
            host = os.environ.get("REGENT_HOST_NAME") or socket.gethostname()
            self.output = OutputForwarder(self.ctx, self.creds, self.session, self.proc_id, host, self.index,
                                          lambda: self.core.log_to).start()
        self.loop.add_reader(self.inbox.sock.getsockopt(zmq.FD), self._on_readable)
        self.loop.add_signal_handler(signal.SIGTERM, self._begin_stop)
        self.loop.add_signal_handler(signal.SIGINT, self._begin_stop)
        self._say_ready()
        self.loop.call_soon(self._on_readable)
        if self.host_pid is not None:
            self._watch_host(self.host_pid, parent=not FORKED)  # a forked proc's parent is a zygote
        log.debug("proc ready", proc=self.proc_id, addr=self.inbox.address)
        try:
            self.loop.run_forever()
        finally:
            self._cleanup_all()
            if self.output is not None:
                self.output.stop()
            self.inbox.close()
            self.outbox.close()
            stop_authenticator(self.ctx)
            self.ctx.destroy(linger=0)

    def _say_ready(self) -> None:
        ready = wire.encode(
            Kind.PROC_READY,
            {"sid": self.session, "id": self.proc_id, "pid": os.getpid(), "addr": self.inbox.address},
        )
        self.outbox.peer(self.host_inbox).send(ready)

    def _begin_stop(self) -> None:
        self.stopping = True
        self.loop.stop()

    def _cleanup_all(self) -> None:
        """The proc is stopping: every actor's calls still running are cancelled (their callers
        learn of it from the proc's death, as of the calls still queued) and its __cleanup__
        runs, all within CLOSE_S."""
        self._end_actors()
        if self._closing:
            try:
                self.loop.run_until_complete(asyncio.wait(list(self._closing), timeout=CLOSE_S))
            except RuntimeError:  # a second SIGTERM stopped the loop again: stop now
                pass

    # --- receiving ---------------------------------------------------------------

    def _on_readable(self) -> None:
        """Handle what the inbox holds, then spin briefly for the next call (see
        transport.spin_budget_s) unless an async endpoint or a backlog needs the loop;
        after READ_SLICE_S of spinning the loop gets its turn (timers, tasks, signals)."""
        sock = self.inbox.sock
        self._reading = True
        started = time.perf_counter()
        try:
            while True:
                while readable(sock):
                    if not self.take_one():
                        break
                    # A batch in, a batch out: under a steady stream of calls the inbox is never
                    # empty, and replies held until it is would all arrive at the very end.
                    self._flush_out()
                if (not self._spin_s or self._async_running or self.pending
                        or time.perf_counter() - started > READ_SLICE_S
                        or not spin_until_readable(sock, self._spin_s)):
                    break
        finally:
            self._reading = False
            self._flush_out()

    def pump_once(self, wait_ms: int) -> None:
        """Handle one message, waiting up to `wait_ms` for it (a sync endpoint waiting on a call)."""
        sock = self.inbox.sock
        if readable(sock) or sock.poll(max(1, wait_ms), zmq.POLLIN):
            self.take_one()

    def take_one(self) -> bool:
        """Read one message from the inbox and handle it; False if there was none."""
        try:
            frames = self.inbox.sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        frames = self.inbox.admit(frames)
        if frames is not None:
            self._handle(frames)
            if self.waiters:  # the answer a sync endpoint waits for may have come
                self.waiters.check()
        return True

    def _handle(self, frames: list) -> None:
        try:
            kind, meta, payload = schema.PROC.decode(frames)
            if kind is Kind.BATCH:
                subs = wire.split_batch(meta, payload)
            else:
                self._dispatch(kind, meta, payload, frames[0])
                return
        except ProtocolError as e:
            self._drop(frames, e)
            return
        except Exception:
            self.dropped += 1
            log.exception("dropped message that failed to dispatch", proc=self.proc_id)
            return
        # Each as if it had come alone (one bad message spoils no other), but an actor's calls
        # are queued before any runs, so that a run of them is one greenlet switch (_proc_run).
        # Anything else first runs what was queued before it.
        self._deferred = []
        try:
            for sub in subs:
                try:
                    kind, meta, payload = schema.PROC.decode_one(sub)
                    if kind is not Kind.CALL or meta.get("a") in (PORT_ACTOR, SUPERVISE_ACTOR):
                        self._run_deferred()
                    self._dispatch(kind, meta, payload, frames[0])
                except ProtocolError as e:
                    self._drop(frames, e)
                except Exception:
                    self.dropped += 1
                    log.exception("dropped message from a batch that failed to dispatch", proc=self.proc_id)
        finally:
            self._run_deferred()
            self._deferred = None

    def _drop(self, frames: list, e: ProtocolError) -> None:
        self.dropped += 1
        peer = peer_of(frames[0]) if frames else "?"
        log.warning("dropped malformed message", peer=peer, proc=self.proc_id, error=str(e))

    def _dispatch(self, kind: Kind, meta: dict, payload: list, head: Any) -> None:
        if kind is Kind.HOST_REP:
            if meta.get("st") == "assigned":  # a warm proc taken to replace another (worker/_warm.py)
                self._on_assigned(meta)
            elif not self.client.on_host_reply(meta):
                self._on_host_reply(meta)
            return
        if kind is Kind.RESULT:  # the answer to a call one of our actors made, or to a fold here
            if meta.get("sid", self.session) == self.session:
                if "o" in meta:
                    self.client.on_result(meta, payload)
                else:
                    self.folds.result(meta, payload)
            return
        if meta.get("rv") is True:
            self._answer_through_agent(meta.get("rt"))
        if kind is Kind.CALL and "fg" in meta and meta["sid"] == self.session:
            self.folds.expect(meta, self.fence.epoch)
        elif kind is Kind.WATERMARK and meta["sid"] == self.session:
            self.folds.release(meta["dw"])
        controller = self.core.log_to
        for effect in self.core.receive(kind, meta, payload):
            if isinstance(effect, Reply):
                self._reply(effect.rt, effect.kind, effect.meta, effect.frames)
            elif effect.kind is Kind.CALL:
                self._on_call(effect)
            elif effect.kind is Kind.SPAWN:
                self._on_restart(effect) if effect.restart else self._on_spawn(effect)
            else:
                self._on_stop(effect)
        if controller is not None and self.core.log_to != controller:
            bulk.forget(controller)  # a new controller: the deposed one takes no more large frames

    # --- calls -------------------------------------------------------------------

    def _on_call(self, call: Deliver) -> None:
        actor, seq, point, method, o, payload = call.actor, call.seq, call.point, call.method, call.origin, call.payload
        if actor == PORT_ACTOR:
            self._on_port_send(seq, point, o, payload)
            return
        if actor == SUPERVISE_ACTOR:  # a child of actor `method` failed
            owner = self.actors.get(method)
            if owner is None:
                self._finish(seq, actor, point, "noactor", o=o, em=f"no actor {method!r} on proc {self.proc_id}")
                return
            if owner.mailbox.put((seq, point, SUPERVISE_ACTOR, payload, o, False)):
                self._start(owner)
            return
        slot = self.actors.get(actor)
        if slot is None:
            gone = self._ended.get(actor)  # stopped or failed: say so, and by whom
            self._finish(seq, actor, point, "noactor", o=o,
                         em=f"no actor {actor!r} on proc {self.proc_id}" + (f": {gone}" if gone else ""))
            return
        if method not in slot.endpoints:
            self._finish(seq, actor, point, "err", o=o, et="AttributeError",
                         em=f"{type(slot.instance).__name__} has no endpoint {method!r}", tb="")
            return
        if slot.mailbox.put((seq, point, method, payload, o, _how(call.meta))):
            self._start(slot)


    # --- spawn / stop ------------------------------------------------------------

    def _on_spawn(self, spawn: Deliver) -> None:
        actor, seq, point, o, meta, payload = spawn.actor, spawn.seq, spawn.point, spawn.origin, spawn.meta, spawn.payload
        if o and actor in self.actors:  # an actor's spawn takes no name in use (the controller's may)
            self._finish(seq, actor, point, "err", o=o, et="ValueError", tb="",
                         em=f"an actor named {actor!r} already lives on proc {self.proc_id}: pick another name")
            return

        def built(slot: _Slot) -> None:
            if actor in self.actors:
                self._retire(self.actors[actor], f"actor {actor} was spawned again")
            slot.owner = meta.get("ow")
            self.actors[actor] = slot
            self._ended.pop(actor, None)
            self._finish(seq, actor, point, "ok", o=o, pid=os.getpid())

        self._construct(actor, point, meta, int(meta.get("inc", 0)), payload,
                        partial(self._finish_error, seq, actor, point, o=o), CallSite(seq, o, actor, point), built)

    def _on_restart(self, restart: Deliver) -> None:
        """A supervisor rebuilds an actor (new incarnation) from its original spawn arguments."""
        actor, point, meta, payload, rt = restart.actor, restart.point, restart.meta, restart.payload, restart.meta.get("rt")
        inc = wire.require(meta, "inc", int)
        n = meta.get("n")
        old = self.actors.get(actor)
        if old is not None and old.ctx.incarnation >= inc:
            if rt:
                self._reply(rt, Kind.RESULT, self.core.result_meta(-1, actor, point, "ok", n=n, pid=os.getpid(),
                                                               inc=old.ctx.incarnation))
            return
        if old is not None:
            self._retire(old, f"actor {actor} was restarted (incarnation {inc})")

        def failed(e: Exception) -> None:
            if rt:
                self._reply(rt, Kind.RESULT, self.core.result_meta(-1, actor, point, "err", n=n, **error_fields(e)))

        def built(slot: _Slot) -> None:
            self.actors[actor] = slot
            self._ended.pop(actor, None)
            if rt:
                self._reply(rt, Kind.RESULT, self.core.result_meta(-1, actor, point, "ok", n=n, pid=os.getpid(), inc=inc))

        self._construct(actor, point, meta, inc, payload, failed, CallSite(-1, f"restart{inc}", actor, point), built)

    def _construct(self, actor: str, point: int, meta: dict, incarnation: int, payload: list,
                   failed: Callable[[Exception], None], site: CallSite, built: Callable[[_Slot], None]) -> None:
        """Build actor `actor` from its spawn arguments, its context current while __init__ runs
        (and `site`, what the calls __init__ makes derive their ids from), then `built(slot)`.
        __init__ runs as a sync endpoint does (worker/_bodies.py): while it waits for a call the
        proc serves on, and `built` comes once it has returned. What loading or constructing the
        class raised goes to `failed` instead."""
        sizes = dict(meta.get("sz") or {})
        ctx = ActorContext(mesh=actor, rank=point, point=Point(point, dict(meta.get("co") or {}), sizes),
                           proc_index=self.index, incarnation=incarnation, sizes=sizes)
        started = tasks_of(ctx)  # what __init__ starts is the actor's

        def run() -> _Slot | None:
            token = _current.set(ctx)
            calling = _calling.set(site)
            try:
                ref, args, kwargs = wire.loads(payload)
                cls = load_class(ref)
                instance = cls(*args, **kwargs)
            except Exception as e:
                end_tasks(ctx, started)
                failed(e)
                self._stop_meshes(f"{actor}[{point}]@{incarnation}/stop", self._born_with.pop(actor, []))
                return None
            finally:
                _calling.reset(calling)
                _current.reset(token)
            return _Slot(actor, instance, endpoint_names(cls), ctx, children=self._born_with.pop(actor, []),
                         started=started)

        def then(body: Body) -> None:
            if body.result is not None and not self.stopping:
                built(body.result)

        body = Body(run, then)
        if current_body() is not None:  # cannot happen from the loop's dispatch; kept inline if it does
            body.result = run()
            then(body)
        elif start_body(body, self.loop, self.waiters.idle):
            then(body)

    def _on_stop(self, stop: Deliver) -> None:
        actor, seq, point, o = stop.actor, stop.seq, stop.point, stop.origin
        slot = self.actors.get(actor)
        # What its __cleanup__ calls derives its ids from this stop: a stop sent again finds them.
        closing = self._retire(slot, f"actor {actor} was stopped by {_stopper(o)}", None,
                               CallSite(seq, o, actor, point)) if slot is not None else None
        if closing is not None:  # answered once its calls are cancelled and its __cleanup__ is done
            closing.add_done_callback(lambda _: self._finish(seq, actor, point, "ok", o=o))
            return
        self._finish(seq, actor, point, "ok", o=o)

    # --- sending -----------------------------------------------------------------


def _stopper(origin: str) -> str:
    """Who sent a stop, from its call path: the program, an actor, or an owner that ended."""
    if not origin:
        return "the program"
    steps = origin.split("/")
    if steps[-1].startswith("stop#") and len(steps) > 1:  # worker/_proc_owners.py _stop_children
        return f"its owner {steps[-2].split('@')[0]} ending"
    return f"actor {steps[-1].split('#')[0]}"


FORKED = False  # set in a proc forked from its host's zygote (worker/zygote.py)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="regent-proc", description="A regent proc (started by a host agent).")
    p.add_argument("--session", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--host-inbox", required=True)
    p.add_argument("--bind-host", default="127.0.0.1")
    p.add_argument("--advertise", default=None, help="the address peers reach this proc at (default: --bind-host)")
    p.add_argument("--host-pid", type=int, default=None, help="the agent to watch; a new one adopts this proc")
    p.add_argument("--orphan-s", type=float, default=None, help="the session's orphan timeout")
    p.add_argument("--spawn-seq", type=int, default=None, help="call id of the spawn_procs that started it")
    p.add_argument("--spawn-size", type=int, default=None)
    p.add_argument("--spawn-pos", type=int, default=None)
    p.add_argument("--spawn-digest", default=None, help="the controller's digest of that spawn_procs (hex)")
    p.add_argument("--spawn-origin", default=None, help="the rest of its call id, for a spawn an actor made")
    p.add_argument("--replaces", default=None, help="id of the proc this one was started to replace")
    p.add_argument("--epoch", type=int, default=0, help="the highest epoch its session had seen at the agent")
    p.add_argument("--warm", action="store_true", help="started ahead of need on a spare, for a proc not yet lost")
    p.add_argument("--preload", action="append", default=[], help="a module to import before saying it is ready")
    return p.parse_args(argv)


def runtime_from(a: argparse.Namespace, make: type[ProcRuntime] = ProcRuntime, **edge: Any) -> ProcRuntime:
    """The proc the agent's command line describes (`make`, `edge`: a hollow proc, worker/hollow.py)."""
    origin: dict[str, Any] = {"warm": True} if a.warm else {}
    if a.orphan_s is not None:
        origin["orphan_s"] = a.orphan_s
    if a.replaces is not None:
        origin["old"] = a.replaces
    elif None not in (a.spawn_seq, a.spawn_size, a.spawn_pos):
        origin.update(s=a.spawn_seq, size=a.spawn_size, pos=a.spawn_pos)
        if a.spawn_digest is not None:
            origin["d"] = bytes.fromhex(a.spawn_digest)
        if a.spawn_origin:
            origin["o"] = a.spawn_origin
    return make(a.session, a.index, a.id, a.host_inbox, a.bind_host, a.host_pid, origin, a.epoch,
                advertise=a.advertise, **edge)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    from regent.worker.logsetup import configure_logging

    configure_logging()
    preload(a.preload)
    # What the proc imported lives as long as it: out of its collections' scans (a zygote's
    # child has most of it frozen already; docs/design.md, "The cyclic collector").
    gc.freeze()
    runtime_from(a).run()
    sys.exit(0)


def preload(modules: list[str], who: str = "a warm proc") -> None:
    """Import what a warm proc's (or a zygote's) actors will need. A module that fails to import
    is logged and skipped: the proc still serves, and the actor's own import reports the error then."""
    for name in modules:
        started = time.monotonic()
        try:
            importlib.import_module(name)
        except Exception as e:
            log.warning(f"{who} could not preload a module", module=name, error=f"{type(e).__name__}: {e}")
        else:
            log.debug("preloaded", module=name, s=round(time.monotonic() - started, 2))


if __name__ == "__main__":
    main()
