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
import enum
import importlib
import inspect
import itertools
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog
import zmq

from regent import wire
from regent.wire import Kind, MessageTooLarge, ProtocolError, schema
from regent.wire.security import load_credentials, stop_authenticator
from regent.wire.transport import (
    RECEIVER_MAX_PEERS,
    Inbox,
    Outbox,
    max_message_bytes,
    peer_of,
    readable,
    refuse_oversized,
    spin_budget_s,
    spin_until_readable,
    valid_address,
)
from regent.worker._host_watch import _environment_of, _HostWatch
from regent.worker.actor import (
    ActorContext,
    CallSite,
    _calling,
    _current,
    endpoint_names,
    is_async_endpoint,
    is_concurrent_endpoint,
    takes_response_port,
)
from regent.worker.classref import load_class
from regent.worker.client import ActorClient, Target
from regent.worker.dedupe import CallIdentity, DedupeCache
from regent.worker.errors import (
    GROUP_FAILED,
    ActorExit,
    DivergenceError,
    error_fields,
    group_failure,
)
from regent.worker.fencing import EpochFence
from regent.worker.logsetup import prefix_actor_logs
from regent.worker.output import OutputForwarder, forwarding_enabled
from regent.worker.ports import PORT_ACTOR, Port, ProcPorts
from regent.worker.remote import OwnedProcs, install_client
from regent.worker.shape import Point
from regent.worker.supervision import MeshFailure

log = structlog.get_logger("regent.proc")
_NO_FRAMES: tuple = ()
SUPERVISE_ACTOR = "__supervise__"  # a child's failure, sent to its owner's proc (m: the owner)

READ_SLICE_S = 0.005  # the longest the reader spins for more calls before the loop runs again
CLOSE_S = 2.0  # what a stopping proc gives its actors' cancelled calls and __cleanup__ (the agent's grace is 3 s)
CLEANUP_S = 30.0  # the longest an async __cleanup__ may take (a stop waits for it)


class _Run(enum.Enum):
    """How a call of an endpoint runs."""

    INLINE = "inline"  # a sync endpoint, on the loop's thread, before the next message
    TASK = "task"  # an async one: the mailbox waits for it
    CONCURRENT = "concurrent"  # an async concurrent_endpoint: the mailbox goes on once it has started


@dataclass
class _Slot:
    """One actor living in this proc, with its mailbox and the calls running as tasks."""

    name: str
    instance: Any
    endpoints: set[str]
    ctx: ActorContext
    mailbox: collections.deque = field(default_factory=collections.deque)
    busy: bool = False
    executions: int = 0
    bound: dict[str, tuple[Any, _Run, bool]] = field(default_factory=dict)  # method -> (fn, how it runs, port)
    tasks: set[asyncio.Task] = field(default_factory=set)
    ended: str | None = None  # why the actor is gone, once it is ("actor a stopped (normal)")
    owner: dict | None = None  # the actor that spawned it from inside an actor (wire.schema.Owner)
    failed: str | None = None  # a child's failure it did not handle: it fails at its next message
    children: list = field(default_factory=list)  # ActorMeshRefs of the meshes it spawned: stopped with it

    def endpoint(self, method: str) -> tuple[Any, _Run, bool]:
        """The bound method, how it runs, and whether it answers through an explicit port."""
        found = self.bound.get(method)
        if found is None:
            fn = getattr(self.instance, method)
            if not is_async_endpoint(fn):
                run = _Run.INLINE
            else:
                run = _Run.CONCURRENT if is_concurrent_endpoint(fn) else _Run.TASK
            found = self.bound[method] = (fn, run, takes_response_port(fn))
        return found


class ProcRuntime(_HostWatch):
    """host_pid: the agent that started this proc, watched so that its death is noticed
    (None: nothing watches). origin: what a successor agent needs to adopt this proc: the
    request that started it ("s", "size", "pos" or "old") and the session's "orphan_s"."""

    def __init__(self, session: str, index: int, proc_id: str, host_inbox: str, bind_host: str,
                 host_pid: int | None = None, origin: dict | None = None, epoch: int = 0,
                 advertise: str | None = None):
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
        self.ctx = zmq.Context()
        self.creds = load_credentials()
        self.inbox = Inbox(self.ctx, self.creds, bind_host, advertise=advertise)
        self.outbox = Outbox(self.ctx, self.creds, max_peers=RECEIVER_MAX_PEERS)
        self.host_inbox = host_inbox
        self.fence = EpochFence(epoch)  # what its session had seen when this proc started
        self.dedupe = DedupeCache()
        self.client = ActorClient(self)  # the calls this proc's actors make
        self.ports = ProcPorts(self)  # channels its actors opened, calls answered through a port
        self._born_with: dict[str, list] = {}  # meshes spawned by actors still in __init__
        self.actors: dict[str, _Slot] = {}
        self.pending: dict[str, collections.deque] = {}
        self._out: dict[str, list] = {}  # replies not yet sent, per return address
        self._reading = False
        self._spin_s = spin_budget_s()
        self._async_running = 0  # async endpoint calls in flight: the loop must run them
        self._closing: set[asyncio.Task] = set()  # actors' ends still cancelling calls or in __cleanup__
        self._rt_checked = ""  # the last reply address found valid
        self._max_message = max_message_bytes()  # what a controller accepts, as far as we know
        self.loop = asyncio.new_event_loop()
        self.log_to: str | None = None  # the current controller, where output is forwarded
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
                                          lambda: self.log_to).start()
        self.loop.add_reader(self.inbox.sock.getsockopt(zmq.FD), self._on_readable)
        self.loop.add_signal_handler(signal.SIGTERM, self._begin_stop)
        self.loop.add_signal_handler(signal.SIGINT, self._begin_stop)
        ready = wire.encode(
            Kind.PROC_READY,
            {"sid": self.session, "id": self.proc_id, "pid": os.getpid(), "addr": self.inbox.address},
        )
        self.outbox.peer(self.host_inbox).send(ready)
        self.loop.call_soon(self._on_readable)
        if self.host_pid is not None:
            self._watch_host(self.host_pid, parent=True)
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

    def _begin_stop(self) -> None:
        self.stopping = True
        self.loop.stop()

    def _cleanup_all(self) -> None:
        """The proc is stopping: every actor's calls still running are cancelled (their callers
        learn of it from the proc's death, as of the calls still queued) and its __cleanup__
        runs, all within CLOSE_S."""
        self.stopping = True
        for slot in list(self.actors.values()):
            del self.actors[slot.name]
            slot.mailbox.clear()
            if slot.children:  # best effort: this proc will not be there to send them again
                self._stop_children(slot)
            self._close(slot, "the proc stopped", None)
        self._flush_out()
        if self._closing:
            try:
                self.loop.run_until_complete(asyncio.wait(list(self._closing), timeout=CLOSE_S))
            except RuntimeError:  # a second SIGTERM stopped the loop again: stop now
                pass

    def _close(self, slot: _Slot, why: str, exc: BaseException | None) -> asyncio.Task | None:
        """End an actor: cancel its calls still running (not the one ending it), then run its
        __cleanup__(exc), awaited if async. Calls are answered as they end (_run_async). The
        task that waits for them, if any is needed."""
        slot.ended = why
        me = asyncio.current_task(self.loop)
        running = [t for t in slot.tasks if t is not me and not t.done()]
        for t in running:
            t.cancel()
        hook = getattr(slot.instance, "__cleanup__", None)
        if not running and (hook is None or not inspect.iscoroutinefunction(hook)):
            self._cleanup(slot, hook, exc)  # the common case ends here, before the next message
            return None
        task = self.loop.create_task(self._close_later(slot, running, hook, exc))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task

    async def _close_later(self, slot: _Slot, running: list[asyncio.Task], hook: Any,
                           exc: BaseException | None) -> None:
        if running:
            await asyncio.wait(running, timeout=CLOSE_S)  # a call may refuse to be cancelled
        if hook is not None and inspect.iscoroutinefunction(hook):
            token = _current.set(slot.ctx)
            try:
                await asyncio.wait_for(hook(*_cleanup_args(hook, exc)), CLEANUP_S)
            except Exception:  # TimeoutError too: the actor is gone either way
                log.exception("actor __cleanup__ raised", actor=slot.name)
            finally:
                _current.reset(token)
        else:
            self._cleanup(slot, hook, exc)

    def _cleanup(self, slot: _Slot, hook: Any, exc: BaseException | None) -> None:
        if hook is None:
            return
        token = _current.set(slot.ctx)
        try:
            hook(*_cleanup_args(hook, exc))
        except Exception:
            log.exception("actor __cleanup__ raised", actor=slot.name)
        finally:
            _current.reset(token)

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

    def take_one(self) -> bool:
        """Read one message from the inbox and handle it; False if there was none."""
        try:
            frames = self.inbox.sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        if self.inbox.accept(frames):
            self._handle(frames)
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
        for sub in subs:  # each as if it had come alone: one bad message spoils no other
            try:
                kind, meta, payload = schema.PROC.decode_one(sub)
                self._dispatch(kind, meta, payload, frames[0])
            except ProtocolError as e:
                self._drop(frames, e)
            except Exception:
                self.dropped += 1
                log.exception("dropped message from a batch that failed to dispatch", proc=self.proc_id)

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
        if kind is Kind.RESULT:  # the answer to a call one of our actors made
            if meta.get("sid", self.session) == self.session:
                self.client.on_result(meta, payload)
            return
        if kind is Kind.PING:
            rt = meta.get("rt")
            if valid_address(rt):
                self._reply(rt, Kind.PONG, {"id": self.proc_id, "pid": os.getpid(), "n": meta.get("n"),
                                            "cached": len(self.dedupe), "epoch": self.fence.epoch})
            return
        if meta["sid"] != self.session:  # wire.schema: CALL, SPAWN, STOP, FENCE, WATERMARK carry both
            raise ProtocolError(f"message for session {meta['sid']!r}, this proc serves {self.session!r}")
        epoch = meta["e"]
        rt = meta.get("rt")
        if rt is not None and rt != self._rt_checked:
            if not valid_address(rt):
                raise ProtocolError(f"bad reply address {rt!r}")
            self._rt_checked = rt  # the controller's address, in almost every message
        if not self.fence.admit(epoch):
            if rt:
                refused = {"sid": self.session, "s": meta.get("s", -1), "a": meta.get("a", ""),
                           "pt": meta.get("pt", 0), "st": "fenced", "e": self.fence.epoch,
                           "em": f"epoch {epoch} is below {self.fence.epoch}: this controller was deposed"}
                if meta.get("o"):
                    refused["o"] = meta["o"]  # an actor's call: its proc takes the newer epoch and resends
                self._reply(rt, Kind.RESULT, refused)
            return
        if rt and not meta.get("o"):
            self.log_to = rt  # an admitted epoch: the newest controller, which gets our output
        if kind is Kind.CALL:
            self._on_call(meta, payload, rt)
        elif kind is Kind.SPAWN:
            self._on_spawn(meta, payload, rt)
        elif kind is Kind.STOP:
            self._on_stop(meta, rt)
        elif kind is Kind.FENCE:
            if rt:
                self._reply(rt, Kind.PONG, {"id": self.proc_id, "e": self.fence.epoch, "n": meta.get("n")})
        elif kind is Kind.WATERMARK:
            self.dedupe.watermark(meta["dw"], meta["cw"])
        else:
            raise ProtocolError(f"a proc does not accept {kind.name}")

    # --- calls -------------------------------------------------------------------

    def _admit(self, kind: Kind, meta: dict, rt: str | None) -> tuple[str, int, int, str, str] | None:
        """Dedupe gate shared by calls, spawns and stops; returns (actor, seq, point, method,
        origin) to run. A message reusing an id for anything else is refused by the cache."""
        seq, actor, point, method = meta["s"], meta["a"], meta["pt"], meta["m"]  # wire.schema.Call
        origin = meta.get("o", "")  # "": the controller's call; else one an actor made
        identity = CallIdentity(kind, method, point, meta["d"])
        try:
            verdict, cached = self.dedupe.admit(seq, actor, identity, rt, origin)
        except DivergenceError as e:
            if rt:
                self._reply(rt, Kind.RESULT, self._result_meta(seq, actor, point, "divergence", o=origin, em=str(e)))
            return None
        if verdict == "cached":
            if rt:
                self._send(rt, wire.encode(Kind.RESULT, cached[0], cached[1]))
            return None
        if verdict == "joined":
            return None
        return actor, seq, point, method, origin

    def _on_call(self, meta: dict, payload: list, rt: str | None) -> None:
        admitted = self._admit(Kind.CALL, meta, rt)
        if admitted is None:
            return
        actor, seq, point, method, o = admitted
        if actor == PORT_ACTOR:
            self._on_port_send(seq, point, o, payload)
            return
        if actor == SUPERVISE_ACTOR:  # a child of actor `method` failed
            owner = self.actors.get(method)
            if owner is None:
                self._finish(seq, actor, point, "noactor", o=o, em=f"no actor {method!r} on proc {self.proc_id}")
                return
            owner.mailbox.append((seq, point, SUPERVISE_ACTOR, payload, o, False))
            if not owner.busy:
                self._drain(owner)
            return
        slot = self.actors.get(actor)
        if slot is None:
            self._finish(seq, actor, point, "noactor", o=o, em=f"no actor {actor!r} on proc {self.proc_id}")
            return
        if method not in slot.endpoints:
            self._finish(seq, actor, point, "err", o=o, et="AttributeError",
                         em=f"{type(slot.instance).__name__} has no endpoint {method!r}", tb="")
            return
        slot.mailbox.append((seq, point, method, payload, o, _how(meta)))
        if not slot.busy:
            self._drain(slot)

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
        for k, child in enumerate(meshes):
            if isinstance(child, OwnedProcs):  # after the meshes spawned before them, as listed
                self.client.ask_host(child.host, "stop_procs", {"ids": list(child.ids)})
                continue
            for rank, target in zip(child.ranks, child.targets, strict=True):
                self.client.send(Kind.STOP, target, -1, child.name, rank, f"{origin}#{k}", "__stop__", b"", [])

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

    def _on_port_send(self, seq: int, point: int, o: str, payload: list) -> None:
        """A value for one of our ports, sent from another proc (worker/ports.py); deduped like a call."""
        try:
            (pid, item, *order), _ = wire.loads(payload)
            refused = self.ports.deliver(pid, item, *order)
        except Exception as e:
            self._finish_error(seq, PORT_ACTOR, point, e, o=o)
            return
        if refused:
            self._finish(seq, PORT_ACTOR, point, "err", o=o, et="ValueError", em=refused, tb="")
        else:
            self._finish(seq, PORT_ACTOR, point, "ok", o=o)

    def _response_port(self, slot: _Slot, seq: int, point: int, o: str) -> Any:
        """The port an explicit-response endpoint answers its call through."""
        def answer(item: tuple) -> None:
            kind, body = item
            if kind == "v":
                self._finish_value(seq, slot.name, point, body, o=o)
            elif kind == "e":
                et, em, tb = body
                self._finish(seq, slot.name, point, "err", o=o, et=et, em=em, tb=tb)
            else:  # the actor is gone
                self._finish(seq, slot.name, point, "dead", o=o, em=f"{body} before answering this call")

        return self.ports.response(seq, slot.name, point, o, answer)

    def _drain(self, slot: _Slot) -> None:
        """Run queued messages one at a time: a sync endpoint inline, an async one as a task that
        parks the mailbox until done. A concurrent endpoint's task parks it only until the task
        has run to its first await (the next message is taken on the loop's next turn)."""
        slot.busy = True
        while slot.mailbox:
            seq, point, method, payload, o, how = slot.mailbox.popleft()
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
                if run is _Run.CONCURRENT:
                    self.loop.call_soon(self._resume, slot)  # after the task's first step
                return
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
                return
            except Exception as e:  # an error the endpoint raised: it goes back to the caller
                if self._raised(slot, seq, point, method, e, o, port, answer_to, how):
                    return
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as e:  # noqa: BLE001 - not an error to answer with: the actor fails
                self._fail(slot, seq, point, method, e, o=o)
                return
            else:
                self._returned(slot, seq, point, o, port, answer_to, explicit, value)
            finally:
                _calling.reset(site)
                _current.reset(token)
        slot.busy = False

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

    def _returned(self, slot: _Slot, seq: int, point: int, o: str, port: Any, answer_to: Port | None,
                  explicit: bool, value: Any) -> None:
        """An endpoint returned: its value answers the call, or goes to the send's port; an
        endpoint given a response port answered through it already."""
        if answer_to is not None:
            self._answer_port(seq, slot.name, point, o, answer_to, None if explicit else (value,))
        elif port is None:
            self._finish_value(seq, slot.name, point, value, o=o)

    def _raised(self, slot: _Slot, seq: int, point: int, method: str, e: Exception, o: str, port: Any,
                answer_to: Port | None, how: str) -> bool:
        """An endpoint raised an Exception: its caller, or the send's port, gets it. A broadcast
        has no reader, so the actor fails instead (True: it is gone)."""
        if how == "bc":
            self._fail(slot, seq, point, method, e, o=o)
            return True
        if answer_to is not None:
            self._answer_port(seq, slot.name, point, o, answer_to, error=e)
        else:
            self._answer_error(seq, slot.name, point, e, o, port)
        return False

    def _answer_port(self, seq: int, actor: str, point: int, o: str, answer_to: Port,
                     value: tuple | None = None, error: Exception | None = None) -> None:
        """Monarch's send(..., port=): the endpoint's value (`(v,)`; None: an explicit-port
        endpoint answered the port itself) or its error goes to that port, from this call's
        site, so a re-run sends it under the same id. The call itself is answered with None."""
        try:
            if error is not None:
                answer_to.exception(error)
            elif value is not None:
                answer_to.send(value[0])
        except Exception as e:  # the port refused it (closed, or not of this session)
            self._finish_error(seq, actor, point, e, o=o)
            return
        self._finish(seq, actor, point, "ok", o=o)

    def _answer_error(self, seq: int, actor: str, point: int, e: Exception, o: str, port: Any) -> None:
        """An endpoint raised: its caller gets the error, unless it was answered through its port already."""
        if port is None or self.ports.close(port.id):
            status = GROUP_FAILED if group_failure(e) else "err"
            self._finish(seq, actor, point, status, o=o, **error_fields(e))
        else:
            log.warning("an endpoint raised after answering through its port", actor=actor, error=repr(e))

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
        self._retire(slot, f"actor {slot.name} stopped ({kind})", None if e.normal else cause or e)

    def _retire(self, slot: _Slot, why: str, exc: BaseException | None = None) -> asyncio.Task | None:
        """Remove an actor: what waits in its mailbox fails as a supervision error ("<why> before
        running this call"), as do its calls still running ("<why> while this call ran")."""
        if self.actors.get(slot.name) is slot:
            del self.actors[slot.name]
        slot.busy = False
        while slot.mailbox:
            seq, point, _, _, o, _ = slot.mailbox.popleft()
            self._finish(seq, slot.name, point, "dead", o=o, em=f"{why} before running this call")
        for _, answer in self.ports.of_actor(slot.name):  # calls it would have answered through a port
            answer(("gone", why))
        if slot.children:
            self._stop_children(slot)
        return self._close(slot, why, exc)

    def _finish_value(self, seq: int, actor: str, point: int, value: Any, o: str = "") -> None:
        if value is None:  # no payload at all: the controller reads an empty result as None
            self._finish(seq, actor, point, "ok", o=o)
            return
        try:
            frames = wire.dumps(value)
            if wire.payload_size(frames) > self._max_message - wire.MAX_META_BYTES:  # near the limit
                msg = wire.encode(Kind.RESULT, self._result_meta(seq, actor, point, "ok"), frames)
                refuse_oversized(msg, self._max_message, "the controller")
        except Exception as e:  # MessageTooLarge too: the caller hears why, rather than nothing
            self._finish_error(seq, actor, point, e, o=o)
            return
        self._finish(seq, actor, point, "ok", frames=frames, o=o)

    def _finish_error(self, seq: int, actor: str, point: int, e: BaseException, o: str = "") -> None:
        self._finish(seq, actor, point, "err", o=o, **error_fields(e))

    def _result_meta(self, seq: int, actor: str, point: int, status: str, **extra: Any) -> dict:
        meta = {"sid": self.session, "s": seq, "a": actor, "pt": point, "st": status}
        if extra:
            meta.update(extra)
        return meta

    def _finish(self, seq: int, actor: str, point: int, status: str, frames: list | None = None, o: str = "",
                **extra: Any) -> None:
        meta = self._result_meta(seq, actor, point, status, **extra)
        if o:
            meta["o"] = o
        frames = frames or _NO_FRAMES
        waiters = self.dedupe.complete(seq, actor, (meta, frames), wire.payload_size(frames), o)
        if waiters:
            msg = wire.encode(Kind.RESULT, meta, frames)
            for rt in waiters:
                if rt:
                    self._send(rt, msg)

    # --- spawn / stop ------------------------------------------------------------

    def _on_spawn(self, meta: dict, payload: list, rt: str | None) -> None:
        if meta.get("restart"):
            self._on_restart(meta, payload, rt)
            return
        admitted = self._admit(Kind.SPAWN, meta, rt)
        if admitted is None:
            return
        actor, seq, point, _, o = admitted
        if o and actor in self.actors:  # an actor's spawn takes no name in use (the controller's may)
            self._finish(seq, actor, point, "err", o=o, et="ValueError", tb="",
                         em=f"an actor named {actor!r} already lives on proc {self.proc_id}: pick another name")
            return
        slot = self._construct(actor, point, meta, int(meta.get("inc", 0)), payload,
                               partial(self._finish_error, seq, actor, point, o=o), CallSite(seq, o, actor, point))
        if slot is None:
            return
        if actor in self.actors:
            self._retire(self.actors[actor], f"actor {actor} was spawned again")
        slot.owner = meta.get("ow")
        self.actors[actor] = slot
        self._finish(seq, actor, point, "ok", o=o, pid=os.getpid())

    def _on_restart(self, meta: dict, payload: list, rt: str | None) -> None:
        """A supervisor rebuilds an actor (new incarnation) from its original spawn arguments."""
        actor, point = meta["a"], meta["pt"]
        inc = wire.require(meta, "inc", int)
        n = meta.get("n")
        old = self.actors.get(actor)
        if old is not None and old.ctx.incarnation >= inc:
            if rt:
                self._reply(rt, Kind.RESULT, self._result_meta(-1, actor, point, "ok", n=n, pid=os.getpid(),
                                                               inc=old.ctx.incarnation))
            return
        if old is not None:
            self._retire(old, f"actor {actor} was restarted (incarnation {inc})")

        def failed(e: Exception) -> None:
            if rt:
                self._reply(rt, Kind.RESULT, self._result_meta(-1, actor, point, "err", n=n, **error_fields(e)))

        slot = self._construct(actor, point, meta, inc, payload, failed, CallSite(-1, f"restart{inc}", actor, point))
        if slot is None:
            return
        self.actors[actor] = slot
        if rt:
            self._reply(rt, Kind.RESULT, self._result_meta(-1, actor, point, "ok", n=n, pid=os.getpid(), inc=inc))

    def _construct(self, actor: str, point: int, meta: dict, incarnation: int, payload: list,
                   failed: Callable[[Exception], None], site: CallSite) -> _Slot | None:
        """Build actor `actor` from its spawn arguments, its context current while __init__ runs
        (and `site`, what the calls __init__ makes derive their ids from). What loading or
        constructing the class raised goes to `failed`, and None comes back."""
        sizes = dict(meta.get("sz") or {})
        ctx = ActorContext(mesh=actor, rank=point, point=Point(point, dict(meta.get("co") or {}), sizes),
                           proc_index=self.index, incarnation=incarnation, sizes=sizes)
        token = _current.set(ctx)
        calling = _calling.set(site)
        try:
            ref, args, kwargs = wire.loads(payload)
            cls = load_class(ref)
            instance = cls(*args, **kwargs)
        except Exception as e:
            failed(e)
            self._stop_meshes(f"{actor}[{point}]@{incarnation}/stop", self._born_with.pop(actor, []))
            return None
        finally:
            _calling.reset(calling)
            _current.reset(token)
        children = self._born_with.pop(actor, [])
        return _Slot(actor, instance, endpoint_names(cls), ctx, children=children)

    def _on_stop(self, meta: dict, rt: str | None) -> None:
        admitted = self._admit(Kind.STOP, meta, rt)
        if admitted is None:
            return
        actor, seq, point, _, o = admitted
        slot = self.actors.get(actor)
        closing = self._retire(slot, f"actor {actor} was stopped") if slot is not None else None
        if closing is not None:  # answered once its calls are cancelled and its __cleanup__ is done
            closing.add_done_callback(lambda _: self._finish(seq, actor, point, "ok", o=o))
            return
        self._finish(seq, actor, point, "ok", o=o)

    # --- sending -----------------------------------------------------------------

    def _reply(self, rt: str, kind: Kind, meta: dict, frames: list | None = None) -> None:
        self._send(rt, wire.encode(kind, meta, frames or []))

    def _send(self, rt: str, msg: list) -> None:
        """Collect a reply; `_flush_out` sends each address's replies as few batches."""
        out = self._out.get(rt)
        if out is None:
            if not self._out and not self._reading:  # from a task: send once this step is done
                self.loop.call_soon(self._flush_out)
            self._out[rt] = [msg]
        else:
            out.append(msg)

    def _flush_out(self) -> None:
        if not self._out:
            return
        out, self._out = self._out, {}
        for rt, msgs in out.items():
            try:
                for frames in wire.pack(msgs, self._max_message):
                    self._transmit(rt, frames)
            except Exception:  # one peer's replies lost, not every peer's, nor the inbox's reader
                log.exception("replies not sent", proc=self.proc_id, peer=rt, count=len(msgs))

    def _transmit(self, rt: str, msg: list) -> None:
        """Send without blocking the loop; a full peer gets a backlog retried shortly."""
        try:
            backlog = self.pending.get(rt)
            if backlog:
                refuse_oversized(msg, self._max_message, rt)
                backlog.append((time.monotonic(), msg))
                return
            sent = self.outbox.peer(rt).try_send(msg)
        except MessageTooLarge as e:  # a result too large was refused in _finish_value: not this
            log.error("reply not sent", proc=self.proc_id, error=str(e))
            return
        except ProtocolError as e:  # an address zmq will not connect to, though it looked valid
            log.warning("reply not sent", proc=self.proc_id, peer=rt, error=str(e))
            return
        if not sent:
            self.pending[rt] = collections.deque([(time.monotonic(), msg)])
            self.loop.call_later(0.001, self._flush, rt)

    def _flush(self, rt: str) -> None:
        backlog = self.pending.get(rt)
        if not backlog:
            self.pending.pop(rt, None)
            return
        peer = self.outbox.peer(rt)
        while backlog and peer.try_send(backlog[0][1]):
            backlog.popleft()
        if not backlog:
            del self.pending[rt]
            return
        if time.monotonic() - backlog[0][0] > 30.0:
            # The controller stopped reading for 30 s: it is gone. A successor will
            # re-request by call id and get the results from the dedupe cache.
            log.warning("dropping replies to an unresponsive controller", peer=rt, count=len(backlog))
            del self.pending[rt]
            self.outbox.drop(rt)
            return
        self.loop.call_later(0.002, self._flush, rt)


def _how(meta: dict) -> str:
    """How a call is answered: "rp", to the port its first argument is (Monarch's send with a
    port); "bc", nowhere, so an error fails the actor (a broadcast); "", to its caller."""
    return "rp" if meta.get("rp") else "bc" if meta.get("bc") else ""


def _arguments(payload: list, how: str) -> tuple[tuple, dict, Port | None]:
    """A call's arguments, and the port its answer goes to (for "rp")."""
    args, kwargs = wire.loads(payload)
    if how != "rp":
        return args, kwargs, None
    if not args or not isinstance(args[0], Port):
        raise TypeError(f"a send with a port carries the port as its first argument, got {type(args[0]).__name__ if args else 'none'}")
    return tuple(args[1:]), kwargs, args[0]


def _cleanup_args(hook: Any, exc: BaseException | None) -> tuple:
    """`__cleanup__(exc)`, or `__cleanup__()` for a hook that takes no argument."""
    try:
        takes = bool(inspect.signature(hook).parameters)
    except (TypeError, ValueError):  # no signature to read (a builtin): give it the argument
        takes = True
    return (exc,) if takes else ()


def main(argv: list[str] | None = None) -> None:
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
    a = p.parse_args(argv)
    from regent.worker.logsetup import configure_logging

    configure_logging()
    preload(a.preload)
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
    ProcRuntime(a.session, a.index, a.id, a.host_inbox, a.bind_host, a.host_pid, origin, a.epoch,
                advertise=a.advertise).run()
    sys.exit(0)


def preload(modules: list[str]) -> None:
    """Import what a warm proc's actors will need. A module that fails to import is logged and
    skipped: the proc still serves, and the actor's own import reports the error then."""
    for name in modules:
        started = time.monotonic()
        try:
            importlib.import_module(name)
        except Exception as e:
            log.warning("a warm proc could not preload a module", module=name, error=f"{type(e).__name__}: {e}")
        else:
            log.debug("preloaded", module=name, s=round(time.monotonic() - started, 2))


if __name__ == "__main__":
    main()
