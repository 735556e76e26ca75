"""Session: the user's handle on a regent job, journaled and able to take over.

A Session drives two things: the engine (controller/engine.py), which makes every decision,
and an edge (controller/edge.py), which does the IO. The first process to open a session name
leads it; another one running the same program waits inside `Session(...)` as a standby. On
takeover its edge fences the workers with the new epoch, then the program runs again from the
top: each call is checked against its record (invariant 6) and answered from the journal, or
sent again under the same call id so workers dedupe it (invariants 2 and 3). An audit replay
is the same Session on an edge that only reads the journal.
"""

from __future__ import annotations

import os
import pickle
import random as _random
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import structlog

from regent import wire
from regent.controller._links import RESEND_FIRST_S
from regent.controller.catchup import CatchUpEdge, wants_catchup
from regent.controller.checkpoints import Checkpoints
from regent.controller.core import ControllerCore, Outcome, PendingCall
from regent.controller.drive import Drive
from regent.controller.edge import (
    Handoff,
    LiveEdge,
    RunFinished,
    journal_value_limit,
    open_edge,
    raise_pending_handoff,
)
from regent.controller.engine import COLLECTED, Append, AwaitReads, Engine, Send
from regent.controller.faults import Faults, MeshFailure
from regent.controller.folding import fold_metas, groups
from regent.controller.futures import Future
from regent.controller.lifecycle import Lifecycle
from regent.controller.loop import run as run_on_loop
from regent.controller.mesh import ActorMesh, GatherSink, HostMesh, ProcMesh, StreamSink, View
from regent.controller.ports import ControllerPorts, PortReceiver
from regent.controller.recorder import Recorder, append
from regent.controller.refs import ProcRef, Wire
from regent.controller.replay import END, JournaledCall, NonDeterminismError
from regent.controller.replay import change_id as _change_id
from regent.controller.shapes import Shapes
from regent.controller.upgrade import patch_marker
from regent.journal import LeadershipLost
from regent.wire import Kind
from regent.worker.errors import FencedError
from regent.worker.logsetup import configure_logging
from regent.worker.ports import Port
from regent.worker.program import offer_program
from regent.worker.remote import ActorMeshRef, ProcMeshRef

log = structlog.get_logger("regent.session")
T = TypeVar("T")

# A program that ends on an uncaught LeadershipLost or FencedError exits with this status
# (EX_TEMPFAIL): it was deposed, and a standby carries its run on. Supervisors (regent run,
# the launchers) wait for the standby instead of ending the run on it.
DEPOSED_EXIT_STATUS = 75


def _install_deposed_exit() -> None:
    previous = sys.excepthook
    if getattr(previous, "regent_deposed", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        previous(exc_type, exc, tb)
        if issubclass(exc_type, (LeadershipLost, FencedError)):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(DEPOSED_EXIT_STATUS)  # an uncaught exception would exit 1, as a failed run does

    hook.regent_deposed = True  # type: ignore[attr-defined]
    sys.excepthook = hook

class Session:
    """A regent session: `with Session("name") as s: ...`.

    journal: "etcd://host:port[,host:port]" (or "etcds://...?ca=&cert=&key=" for TLS, either
    with "user=NAME" for etcd auth: see journal.open_journal), "sqlite:///path.db", None for
    the embedded SQLite store in $REGENT_HOME, or "off" (no journal: no takeover).
    lease_ttl_s: how long a dead primary holds leadership before a standby takes over.
    orphan_timeout_s: how long host agents keep this session's procs when no controller
    (primary or standby) contacts them (default $REGENT_ORPHAN_TIMEOUT_S or 300 s).
    links: optional routing of this controller's connections (chaos tests put a Toxiproxy
    proxy on every link): an object with connect(addr) and advertise(addr).
    on_unhandled_fault: `fn(failure: MeshFailure)`, Monarch's `unhandled_fault_hook`: called
    for an actor failure nothing handles (a supervised mesh escalated, or a member of a mesh
    with no restart policy failed), on the program's thread, at its next session call; journaled
    first, and called again at the same point by a standby's replay (controller/faults.py).
    Default: the failure is logged (it also reaches the program as SupervisionError on calls).
    metrics: where this controller serves Prometheus /metrics, "PORT" (loopback) or
    "HOST:PORT", from before it campaigns (a standby serves its own); default
    $REGENT_METRICS_ADDR, off when unset (docs/observability.md).
    """

    def __init__(self, name: str, journal: str | None = None, *, lease_ttl_s: float | None = None,
                 campaign_timeout: float | None = None, links: Any = None,
                 orphan_timeout_s: float | None = None,
                 on_unhandled_fault: Callable[[MeshFailure], Any] | None = None,
                 metrics: str | None = None):
        if not name or "/" in name or len(name) > 128:
            raise ValueError(f"session name {name!r} must be 1..128 characters without '/'")
        configure_logging(only_if_unconfigured=True)
        _install_deposed_exit()
        self.name = name
        self._closed = False
        self._lost: str | None = None
        self._journal_failed: BaseException | None = None
        self._log = structlog.get_logger("regent.program").bind(session=name)
        self._metrics = _open_metrics(name, metrics)
        try:
            edge = self._edge = open_edge(name, journal, CatchUpEdge if wants_catchup(name, journal) else LiveEdge,
                                          lease_ttl_s=lease_ttl_s, campaign_timeout=campaign_timeout,
                                          links=links, orphan_timeout_s=orphan_timeout_s, metrics=self._metrics)
        except BaseException:
            if self._metrics is not None:
                self._metrics.close()
            raise
        self.journal_url, self.holder, self.epoch = edge.journal_url, edge.holder, edge.epoch
        self.run_id, self.sid, self.takeover_at = edge.run_id, edge.sid, edge.takeover_at
        self._engine = Engine(edge.sid, edge.replay, journaled=edge.journaled, value_limit=journal_value_limit())
        self._engine.replaying |= edge.catching_up  # until it leads, every seq waits for its record
        self._faults = Faults(on_unhandled_fault, edge.replay)
        self._drive = Drive()  # who steps the engine: this thread, or the runtime's IO thread
        self._recorder = Recorder(self._engine, on_gone=self._actor_gone)
        edge.connect(self._engine.core, self._drive, self._recorder, on_failure=self._on_journal_failed,
                     on_lost=self._on_leadership_lost)
        self._shapes = Shapes(edge.replay)
        self._wire_edge()
        self._loop: Any = None  # the event loop of s.run, while it runs
        self._lifecycle = Lifecycle(self)
        self._ports: ControllerPorts | None = None
        self._own_proc: ProcMesh | None = None
        self._singletons: dict[str, ActorMesh] = {}  # get_or_spawn_controller's actors, by name
        offer_program(self)  # this_proc(), Channel.open() and Port.send in this program
        self._checkpoints = Checkpoints(self)
        self._get_hook, self._flush_hook, self._decode_hook = self._get, self._flush, self._engine.decode

    def _wire_edge(self) -> None:
        """Take the edge's store, writer, runtime and supervisor: as the session starts, and
        again when a catching-up standby (controller/catchup.py) goes live."""
        edge = self._edge
        self.journal, self.lead, self.writer = edge.journal, edge.lead, edge.writer
        self.runtime, self._supervisor = edge.runtime, edge.supervisor
        self.epoch, self.takeover_at = edge.epoch, edge.takeover_at
        self._supervisor.on_unhandled = self._faults.seen
        self._supervisor.shapes = self._shapes
        self.runtime.quiet = lambda: self._engine.replaying
        self._catchup = edge if edge.catching_up else None
        if self._catchup is not None:
            self._catchup.bind(self)

    def _flush(self) -> None:
        self.runtime.flush()

    # --- what the program and tools read -----------------------------------------------

    @property
    def replaying(self) -> bool:
        return self._engine.replaying

    @property
    def role(self) -> str:
        return self._edge.role

    @property
    def waited(self) -> bool:
        return self._edge.waited

    @property
    def metrics_url(self) -> str | None:
        """Where this controller serves Prometheus /metrics, or None when it does not."""
        return None if self._metrics is None else self._metrics.url

    @property
    def core(self) -> ControllerCore:
        return self._engine.core

    @property
    def stats(self) -> dict[str, int]:
        return self._engine.stats

    def log(self, event: str, **kw: Any) -> None:
        """structlog, silent while replaying so output is not printed twice."""
        if not self.replaying:
            self._log.info(event, **kw)

    # --- context management ------------------------------------------------------------

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        self.close(error=exc)
        if isinstance(exc, Handoff):
            # The rest of the program belongs to the standby now: leave quietly.
            raise SystemExit(0) from None

    def close(self, error: BaseException | None = None) -> None:
        """End the run: record it, stop its actors and procs, hand leadership back."""
        if self._closed:
            return
        self._closed = True
        offer_program(self, withdraw=True)
        if self._faults.undelivered():
            log.warning("actor failures nothing handled came after the program's last session call; "
                        "the unhandled-fault hook was not called for them", session=self.name,
                        failures=self._faults.undelivered())
        if self._edge.audit:
            self._edge.finish(self, error)
            return
        if self._catchup is not None:  # it never led: nothing to end, stop or hand back
            self._edge.close(deposed=True)
            if self._metrics is not None:
                self._metrics.close()
            return
        deposed = self._lost is not None or isinstance(error, (LeadershipLost, FencedError))
        try:
            if isinstance(error, Handoff) and not deposed:
                self.writer.flush(timeout=30)
                log.info("handing the session over", session=self.name)
            elif not deposed:
                self._settle(timeout=10.0)
                self.writer.submit(END, {"error": repr(error)[:2000] if error else None})
                self.writer.flush(timeout=30)
                self._lifecycle.stop_on_hosts()
        except LeadershipLost:
            deposed = True
        finally:
            try:
                self._edge.close(deposed=deposed)
            finally:
                if self._metrics is not None:
                    self._metrics.resigned()
                    self._metrics.close()

    def _settle(self, timeout: float) -> None:
        """Let calls still in flight (broadcasts the program never waited for) finish
        before the run ends, so ending it does not cut them off."""
        calls = self.core.calls
        if not self.runtime.wait_until(lambda: not calls, timeout):
            log.warning("ending the run with calls still outstanding", session=self.name, outstanding=len(calls))

    # --- leadership and failures -------------------------------------------------------

    def _on_leadership_lost(self, reason: str) -> None:
        """Any thread (the lease keeper's, or an append's)."""
        self._lost = f"leadership of session {self.name!r} lost: {reason}"
        log.error("leadership lost; this controller stops driving workers", session=self.name, reason=reason)
        runtime = getattr(self, "runtime", None)  # lost while the session was still being built: it raises
        if runtime is not None:
            runtime.fail_all(self._lost)

    def _on_journal_failed(self, exc: BaseException) -> None:
        """The writer could not append (its thread): the next call raises why (_check_live).
        A lost leadership has told us already (lead.on_lost), and fails what is in flight."""
        self._journal_failed = exc

    def _actor_gone(self, call: PendingCall, point: int, outcome: Outcome) -> None:
        """An actor exited while running a call, or a call found no actor where it was sent."""
        reason = str(outcome.meta.get("em"))
        if outcome.status == "noactor":
            if call.wire is not None and call.wire.kind is Kind.CALL:  # not a stop: that one is meant
                self._supervisor.missing(call.actor, point, reason, call.wire.issued_at)
            return
        self._supervisor.failed(call.actor, point, reason, abnormal=not outcome.meta.get("normal"))

    def _replayed_exit(self, call: PendingCall, point: int, outcome: Outcome) -> None:
        """A journaled exit of an unsupervised actor, replayed: a failure nothing handles, which
        the previous leader may not have handed to the program (faults dedupe it if it did).
        A supervised one was restarted by the previous leader already, unless its policy left it
        down: then it stays down here too, and a call finding it gone does not restart it."""
        state = self._supervisor.meshes.get(call.actor)
        if state is not None and state.supervisor is None:
            self._actor_gone(call, point, outcome)
        elif state is not None and state.supervisor.leaves_down(abnormal=not outcome.meta.get("normal")):
            state.down.add(point)

    def _check_live(self) -> None:
        raise_pending_handoff()  # a SIGTERM that came while regent's own code ran
        failed = self._failed()
        if failed is not None:
            raise failed

    def _failed(self) -> BaseException | None:
        """Why this session can go no further, if it cannot."""
        if self._closed:
            return RuntimeError(f"session {self.name!r} is closed")
        if self._lost:
            return LeadershipLost(self._lost)
        if self._journal_failed is not None:
            return self._journal_failed
        if self._engine.lost is not None:
            return self._engine.lost
        if self.runtime.fenced:
            return LeadershipLost(f"leadership of session {self.name!r} lost: {self.runtime.fenced}")
        return None

    # --- driving the engine --------------------------------------------------------------

    def _begin(self, kind: str, actor: str = "", method: str = "", digest: bytes = b"", points: Any = None, *,
               targets: list[str] | None = None, durable_first: bool = False) -> tuple[int, JournaledCall | None]:
        """Take the next seq for a side effect on the proc processes `targets` (None: a host
        agent or the journal), once what it rests on is durable; its journal record, if any."""
        self._check_live()
        if self._catchup is not None:
            self._catchup.at_next_seq()  # its record is journaled, or this controller leads
        faults = self._faults
        if faults.live or faults.replayed:  # failures nothing handles: the program's hook, first
            faults.deliver(self)
        engine, writer, lock = self._engine, self.writer, self._drive.lock
        with lock:
            wait = engine.reads.wait_before(targets, writer.durable_lsn, durable_first)
            if wait is None:
                seq, went_live = engine.issue()
                jc = self._edge.match(engine, seq, kind, actor, method, digest, points)
        if wait is not None:
            self._await_reads(wait)
            with lock:
                seq, went_live = engine.issue()
                jc = self._edge.match(engine, seq, kind, actor, method, digest, points)
        if went_live:
            self._edge.live(engine)
        return seq, jc

    def _await_reads(self, wait: AwaitReads) -> None:
        writer, lsn = self.writer, wait.lsn
        if lsn == COLLECTED:
            lsn = writer.bound(wait.ticket)
            if lsn is None:
                lsn = writer.seal()
        writer.wait_durable(lsn)
        with self._drive.lock:
            self._engine.reads.durable(lsn)

    def _append(self, kind: str, data: dict, durable: bool = False) -> int:
        return self._do(Append(kind, data, durable))

    def _do(self, effect: Append) -> int:
        try:
            return append(self.writer, effect)
        except LeadershipLost as e:
            self._on_leadership_lost(str(e))
            raise

    def _finished(self, seq: int) -> None:
        with self._drive.lock:
            self.core.finished(seq)

    def _observed(self, lsn: int, holders: Any) -> None:
        """The program read an outcome journaled at `lsn`, held until durable by `holders`."""
        writer = self.writer
        if lsn <= writer.durable_lsn:
            return
        with self._drive.lock:
            reads = self._engine.reads
            bound = writer.bound(reads.ticket) if reads.lsn == COLLECTED else None
            reads.observed(lsn, holders, writer.durable_lsn, writer.ticket(), bound)

    # --- the call path -------------------------------------------------------------------

    def _call(self, mesh: ActorMesh, method: str, args: tuple, kwargs: dict, kind: str,
              ranks: tuple[int, ...] | None, sink: Any, answer_to: Port | None = None,
              fold: bytes | None = None) -> PendingCall:
        """`answer_to`: Monarch's send(..., port=); the port goes first in the arguments. `fold`:
        an Accumulator's pickled (identity, reducer), for its hosts to fold with (folding.py)."""
        if answer_to is not None:
            args = (answer_to, *args)
        frames, digest = wire.dumps_call(args, kwargs)
        self.runtime.refuse_oversized_call(mesh.name, method, frames)
        return self._issue_call(Kind.CALL, kind, mesh.name, method, frames, digest, mesh._procs, ranks, sink,
                                choose_from=mesh if ranks is None else None, answer_to=answer_to is not None,
                                fold=fold)

    def _issue_call(self, wire_kind: Kind, kind: str, actor: str, method: str, frames: list, digest: bytes,
                    procs: list[ProcRef], ranks: tuple[int, ...] | None, sink: Any,
                    metas: list[dict] | None = None, choose_from: ActorMesh | None = None,
                    answer_to: bool = False, fold: bytes | None = None) -> PendingCall:
        engine = self._engine
        if ranks is None:  # choose: the pick is journaled durably before anything is sent
            seq, jc = self._begin(kind, actor, method, digest, None, durable_first=True)
            rank, pick = self._choose(seq, choose_from)
            if pick is not None:
                self._do(pick)
            ranks = (rank,)
        else:
            seq, jc = self._begin(kind, actor, method, digest, ranks, targets=[procs[r].id for r in ranks])
        sink.decode = self._decode_hook
        if isinstance(sink, GatherSink):
            sink.future.attach(seq, self._get_hook, self._flush_hook)
        # Members that are restarting are waited for before anything is recorded as sent.
        unavailable: dict[int, str] = {}
        mesh_state = self._supervisor.meshes.get(actor) if wire_kind is Kind.CALL else None
        if mesh_state is not None and mesh_state.supervisor is not None:
            unavailable = mesh_state.wait_all_ready(
                r for r in ranks if jc is None or r not in jc.results or "big" in jc.results[r])
        base = {"sid": self.sid, "e": self.epoch, "s": seq, "a": actor, "m": method, "d": digest,
                "rt": self.runtime.reply_address}
        if answer_to:
            base["rp"] = True  # its answer, error or value, goes to the port in its first argument
        elif kind == "broadcast":
            base["bc"] = True  # nobody reads its result: an error fails the actor, as in Monarch
        if self.runtime.relay:
            base["rv"] = True  # answered through the agent it came through, gathered per host
        runtime, edge = self.runtime, self._edge
        folds = groups(procs, ranks) if fold is not None and jc is None else None
        if folds:  # sent unfolded once a folder is gone (controller/folding.py)
            metas = fold_metas(procs, folds, fold, runtime.reply_address, runtime.relay)
        with self._drive.lock:
            call = engine.expect(seq, kind, actor, method, {r: procs[r].key for r in ranks}, sink, jc)
            if isinstance(sink, StreamSink):  # the stream reads results from its call; other
                sink.call = call  # sinks get it on delivery, so a finished call is no cycle for GC
            if jc is None:
                if self._metrics is not None:
                    self._metrics.call_issued(seq, kind, actor, method)
                task = None if self._loop is None else self._loop.task_name()
                self._recorder.collect(engine.call_record(seq, kind, actor, method, digest, ranks, time.time(),
                                                          task).item)
            call.wire = Wire(wire_kind, base, frames, metas, procs, time.monotonic(), RESEND_FIRST_S,
                             many=len(ranks) > 1, folds=folds)
            for effect in engine.dispatch(jc, ranks, unavailable):
                if type(effect) is Send:
                    if edge.unanswered(call, effect.rank):
                        runtime.send_call(call, effect.rank)
                else:
                    runtime.deliver_local(call, effect.rank, effect.outcome)
                    if effect.outcome.status == "exit" and effect.outcome.journaled:
                        self._replayed_exit(call, effect.rank, effect.outcome)
            # Replies waiting in the inbox are handled here, by the driver at hand, rather than
            # by the IO thread contending for the drive (a pipelined program issues while they come).
            runtime.drain_ready()
        return call

    def _choose(self, seq: int, mesh: ActorMesh) -> tuple[int, Append | None]:
        """A choose's pick among the live members (or all, if none is), by calls in flight."""
        ranks = mesh._view.ranks
        live = [r for r in ranks if mesh._procs[r].alive] or list(ranks)
        load = dict.fromkeys(live, 0)
        with self._drive.lock:
            for call in self.core.calls.values():
                for r, pid in call.targets.items():
                    if r in load and mesh._procs[r].key == pid and r not in call.results:
                        load[r] += 1
            return self._engine.choose(seq, live, load)

    def _get(self, fut: Future, timeout: float | None) -> None:
        """Future.get for calls: a deadline the program saw is journaled, and replayed."""
        seq, engine = fut.tag, self._engine
        wait = timeout
        if timeout is not None or engine.replay is not None:  # else nothing to look up
            with self._drive.lock:
                if engine.replayed_timeout(seq):
                    raise TimeoutError(f"call seq {seq} not complete after {timeout} s (replayed)")
                wait = engine.deadline(seq, timeout)
        if not self.runtime.wait_for(fut, wait):
            with self._drive.lock:
                effect = engine.timed_out(seq, timeout)
            self._do(effect)
            raise TimeoutError(f"call seq {seq} not complete after {timeout} s")
        self._observed(fut.lsn, engine.read_holders(fut.holders, timeout))

    # --- values the program may ask for ----------------------------------------------------

    def _value(self, kind: str, produce: Callable[[], Any], encode: bool = False) -> Any:
        """A value that may differ between runs: journaled durably before the program sees it."""
        seq, jc = self._begin(kind, kind, kind)
        if jc is not None:
            self.stats["replayed"] += 1
            self._finished(seq)
            return pickle.loads(jc.value) if encode else jc.value
        value = produce()
        self._do(self._engine.value_record(seq, kind, pickle.dumps(value, protocol=5) if encode else value))
        self._finished(seq)
        return value

    def now(self) -> float:
        """Wall-clock time, journaled so a replay sees the same value."""
        return self._value("now", time.time)

    def random(self) -> float:
        """A random float in [0, 1), journaled so a replay sees the same value."""
        return self._value("random", _random.random)

    def side_effect(self, fn: Callable[[], Any]) -> Any:
        """Run fn once; a replay gets its journaled result instead of running it again."""
        return self._value("side_effect", fn, encode=True)

    def patched(self, change_id: str) -> bool:
        """Whether this run takes the branch of change `change_id` here (Temporal's `patched`):
        live, it journals a marker and says True; replayed, True where the journal holds that
        marker at this point and False where the history was made by a program without the
        change, which then replays the old branch (nothing is consumed) until the program goes
        live. docs/failover.md, "Changing a running program"."""
        return patch_marker(self, _change_id(change_id), deprecated=False)

    def deprecate_patch(self, change_id: str) -> None:
        """For the version that has dropped the old branch of `change_id`: a history with the
        marker replays as with `patched`; one without it cannot be replayed by this program
        (NonDeterminismError naming the change). Live, the marker is journaled still, so
        the version before this one can replay what this one made."""
        patch_marker(self, _change_id(change_id), deprecated=True)

    def checkpoint(self, state: Any) -> None:
        """Snapshot the program's state; a takeover resumes from here (see `resume`)."""
        self._checkpoints.save(state)

    def resume(self, default: Any) -> Any:
        """The state of the last checkpoint of this run, or default. Call it once, after
        creating meshes: a takeover skips from here straight to the checkpoint."""
        return self._checkpoints.resume(default)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run an asyncio program, `s.run(main())`, on the session's event loop, which a standby
        replays in the same order (controller/loop.py); its result."""
        return run_on_loop(self, main)

    # --- meshes ------------------------------------------------------------------------------

    def this_host(self) -> HostMesh:
        """The machine this controller runs on (the journal remembers which it was)."""
        return self._lifecycle.this_host()

    def host_mesh(self, hosts: int, cluster: str | None = None, timeout_s: float = 60.0) -> HostMesh:
        """`hosts` machines of a cluster, as a HostMesh with dims {"hosts": N}: it waits up to
        `timeout_s` for that many host agents to be registered in the store (`regent host
        --cluster NAME`). `cluster` defaults to $REGENT_CLUSTER. Which hosts it got is
        journaled: a standby replaying the program gets the same ones."""
        return self._lifecycle.host_mesh(hosts, cluster, timeout_s)

    def spawn_procs(self, per_host: Mapping[str, int] | None = None,
                    bootstrap: Callable[[], Any] | None = None) -> ProcMesh:
        """Procs on this host: shorthand for `s.this_host().spawn_procs(per_host, bootstrap)`."""
        return self.this_host().spawn_procs(per_host, bootstrap)

    def this_proc(self) -> ProcMesh:
        """The program's own proc (Monarch's `this_proc()` in the client): one proc on this
        controller's machine, spawned on first use, for actors the program keeps near it. Unlike
        Monarch's it is not the controller's own process: it outlives the controller, and a
        standby adopts it as it adopts every proc (docs/monarch.md)."""
        if self._own_proc is None:  # at the same point of the program on every replay
            self._own_proc = self.this_host().spawn_procs(per_host={"procs": 1})
        return self._own_proc

    def get_or_spawn_controller(self, name: str, actor_class: type, *args: Any, **kwargs: Any) -> ActorMesh:
        """Monarch's `get_or_spawn_controller`: the one actor named `name` on the program's own
        proc (`this_proc()`), spawned by the first call with that name; later calls return it
        (their arguments unused). A journaled spawn like any, at the same point of a replay."""
        found = self._singletons.get(name)
        if found is None:
            found = self._singletons[name] = self.this_proc().spawn(name, actor_class, *args, **kwargs)
        elif found._class is not actor_class:
            raise TypeError(f"the controller actor {name!r} is a {found._class.__name__}, not a "
                            f"{actor_class.__name__}: pick another name")
        return found

    def mesh_of(self, ref: ActorMeshRef | ProcMeshRef) -> ActorMesh | ProcMesh:
        """The mesh a reference names, as this program calls it: a reference an actor sent back
        (a mesh it spawned, its own proc). Its calls, spawns and stops are the program's own,
        journaled; a mesh an actor spawned stays that actor's to supervise."""
        if ref.session != self.sid:
            raise ValueError(f"{ref!r} belongs to session {ref.session!r}, not to this one ({self.sid!r})")
        procs = [self.proc_named(t.proc, repr(ref), "have the actor send the mesh again") for t in ref.targets]
        if isinstance(ref, ActorMeshRef):
            return ActorMesh.of_ref(self, ref, procs)
        return ProcMesh(self, procs, View.full(ref.dims))

    def proc_named(self, proc_id: str, what: str, instead: str) -> ProcRef:
        """One of this program's procs, by id, for something an actor handed it (`what`)."""
        proc = self.runtime.procs.get(proc_id)
        if proc is None:
            raise ValueError(f"{what} is on proc {proc_id}, which this program did not spawn (an actor's own, or "
                             f"one replaced since): {instead}")
        return proc

    def send_to_port(self, port: Port, item: tuple) -> None:
        """`port.send(v)` in the program: a journaled call to the proc that owns the port."""
        if self._ports is None:
            self._ports = ControllerPorts(self)
        self._ports.send(port, item)

    def open_port(self) -> tuple[Port, PortReceiver]:
        """A port actors can send values to, and its receiver in this program (Monarch's
        `Channel.open()`): pass the port in a call, `rx.recv().get()` each value. Values are
        journaled as they are received, so a standby receives the same ones in the same order."""
        if self._ports is None:
            self._ports = ControllerPorts(self)
        return self._ports.open()


__all__ = ["Handoff", "NonDeterminismError", "RunFinished", "Session"]


def _open_metrics(session: str, address: str | None) -> Any:
    """The controller's metrics, served at `address` (else $REGENT_METRICS_ADDR); None when
    off, so a session without them pays nothing on its calls."""
    if not (address if address is not None else os.environ.get("REGENT_METRICS_ADDR")):
        return None
    from regent.controller.metrics import ControllerMetrics

    metrics = ControllerMetrics(session)
    return metrics if metrics.serve(address) else None
