"""The controller side of supervision: it hears of failures, asks each mesh's
`MeshSupervisor` what to do, and carries the decision out (a replacement proc from
the host agent, the actor rebuilt from its original spawn arguments).

Restarts run on the supervisor's own thread, since they wait on host agents and
procs; the IO thread only queues failures. Calls issued while an actor restarts
wait for it (bounded by the policy's restart_timeout_s); every supervision event
is journaled.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from regent.controller._warm import SpareWarmer
from regent.controller.membership import Membership
from regent.controller.shapes import Shape, Shapes
from regent.wire import Kind
from regent.worker.errors import SupervisionError
from regent.worker.shape import point_of
from regent.worker.supervision import MeshSupervisor, RestartPolicy

if TYPE_CHECKING:
    from regent.controller._runtime import Runtime
    from regent.controller.cluster import ClusterHosts
    from regent.controller.refs import ProcRef

log = structlog.get_logger("regent.supervisor")


@dataclass
class MeshState:
    """What the session remembers of a spawned actor mesh, to rebuild its members."""

    name: str
    procs: list[ProcRef]
    dims: dict[str, int]
    frames: list  # the original spawn payload: class reference, args, kwargs
    supervisor: MeshSupervisor | None
    ready: dict[int, threading.Event] = field(default_factory=dict)
    coords: list[dict] = field(default_factory=list)
    spawn_seq: int = -1  # the seq of the spawn that made it (a name may be spawned again)
    down: set[int] = field(default_factory=set)  # members their policy left down
    stopped: set[int] = field(default_factory=set)  # members the program stopped: never restarted
    failed: set[int] = field(default_factory=set)  # members of an unsupervised mesh that failed: gone for good
    rebuilt_at: dict[int, float] = field(default_factory=dict)  # rank -> when its last restart finished
    shape: Shape | None = None  # the proc mesh it was spawned on whole, which a shrink reshapes
    preload: tuple[str, ...] = ()  # modules its actor class needs (what warm spares import)

    def reshape(self, procs: list[ProcRef], dims: dict[str, int]) -> None:
        """Its members are now `procs` (a shrink): ranks renumbered densely, each member's
        incarnation kept with its proc, every member waiting for its rebuild."""
        rank_of = {id(p): r for r, p in enumerate(self.procs)}
        sup = self.supervisor
        if sup is not None:
            sup.size = len(procs)
            sup.incarnation = {r: sup.incarnation.get(rank_of.get(id(p), -1), 0) for r, p in enumerate(procs)}
        self.procs, self.dims = list(procs), dict(dims)
        self.coords = [{"co": dict(point_of(dims, r)), "sz": dict(dims)} for r in range(len(procs))]
        old = self.ready
        self.ready = {r: threading.Event() for r in range(len(procs))}
        for ev in old.values():
            ev.set()  # what waited on an old rank goes on (and finds the new shape)
        self.down, self.stopped, self.rebuilt_at = set(), set(), {}

    def wait_all_ready(self, ranks: Iterable[int]) -> dict[int, str]:
        """Block a call while its members restart, all against one deadline (the policy's
        restart_timeout_s); the members it cannot go to, with why. A member whose restart ended
        while the others were waited for is not left out: one restart brings a strategy's
        members back together, and a collective sent to only some of them waits for the
        others for ever."""
        sup = self.supervisor
        deadline = time.monotonic() + (sup.policy.restart_timeout_s if sup else 30.0)
        unavailable: dict[int, SupervisionError] = {}
        for r in ranks:
            try:
                self.wait_ready(r, deadline)
            except SupervisionError as e:
                unavailable[r] = e
        late = [r for r, e in unavailable.items() if e.reason == "restart-timeout"]
        if late and all(r in self.ready and self.ready[r].is_set() for r in late) and not (sup and sup.escalated):
            for r in late:  # all back, or none: never a part of one restart's members
                del unavailable[r]
        return {r: str(e) for r, e in unavailable.items()}

    def wait_ready(self, rank: int, deadline: float | None = None) -> None:
        """Block a call while its actor restarts, until `deadline` (monotonic; default the
        policy's restart_timeout_s from now); raise if the mesh has escalated."""
        sup = self.supervisor
        if sup is not None and sup.escalated:
            raise SupervisionError(sup.escalated, actor=f"{self.name}[{rank}]", reason="escalated")
        ev = self.ready.get(rank)
        if ev is not None and not ev.is_set():
            timeout = sup.policy.restart_timeout_s if sup else 30.0
            if not ev.wait(timeout if deadline is None else max(0.0, deadline - time.monotonic())):
                raise SupervisionError(
                    f"{self.name}[{rank}] did not come back from a restart within {timeout:g} s",
                    actor=f"{self.name}[{rank}]", reason="restart-timeout")
            if sup is not None and sup.escalated:
                raise SupervisionError(sup.escalated, actor=f"{self.name}[{rank}]", reason="escalated")


class Supervisor:
    def __init__(self, runtime: Runtime, record: Any, sid: str, path: list[str], *,
                 clusters: Callable[[], ClusterHosts] | None = None, journaled: list[dict] | None = None,
                 durable: Callable[[int], None] | None = None):
        self.runtime = runtime
        self.record = record  # (data) -> lsn: journals a supervision event
        self._durable = durable or (lambda lsn: None)
        self.membership = Membership(runtime, self._decided, clusters or _no_clusters, journaled or [])
        self.warmer = SpareWarmer(runtime, self, clusters) if clusters is not None else None
        self.membership.on_formed = self._warm
        self.shapes: Shapes = Shapes(None)  # the session's (Session sets it)
        self.sid = sid
        self.path = path
        self.meshes: dict[str, MeshState] = {}
        self.events: list[dict] = []
        # (mesh state, rank, reason, kind) -> None: a failure nothing handles (controller/faults.py)
        self.on_unhandled: Callable[[MeshState, int, str, str], None] | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"regent-supervisor-{sid}", daemon=True)
        self._thread.start()
        runtime.on_proc_death(self._on_proc_death)

    def register(self, state: MeshState) -> None:
        self.meshes[state.name] = state
        if state.supervisor is not None and state.supervisor.policy.on_host_lost == "replace":
            self._warm()
        for rank in range(len(state.procs)):
            state.ready[rank] = threading.Event()
            state.ready[rank].set()
        for rank, proc in enumerate(state.procs):
            if not proc.alive:  # it died while no controller was looking (a takeover)
                self.failed(state.name, rank, proc.death or "proc is gone", abnormal=True)
        if state.supervisor is not None and self.membership.needs_reform(state.procs):
            # A previous leader shrank the mesh and was deposed before it re-formed its group.
            for ev in state.ready.values():
                ev.clear()
            self._queue.put(("rebuild", state))

    # --- failures (any thread) --------------------------------------------------------

    def _on_proc_death(self, proc: ProcRef) -> None:
        if proc.stopped:
            return
        for state in list(self.meshes.values()):
            for rank, p in enumerate(state.procs):
                if p is proc:
                    self.failed(state.name, rank, proc.death, abnormal=True)

    def failed(self, mesh: str, rank: int, reason: str, abnormal: bool) -> None:
        state = self.meshes.get(mesh)
        if state is None or rank in state.stopped or rank not in state.ready:  # (a rank a shrink took away)
            return
        if state.supervisor is None:  # unsupervised: nothing handles it
            state.failed.add(rank)
            if self.membership.is_group(mesh):  # a process group's own actor: re-formed with the mesh
                return
            if abnormal and self.on_unhandled is not None:
                self.on_unhandled(state, rank, reason, "unsupervised")
            return
        state.ready[rank].clear()  # calls wait until the supervisor decides
        self._queue.put((mesh, rank, reason, abnormal, state.procs[rank]))

    def missing(self, mesh: str, rank: int, reason: str, issued_at: float) -> None:
        """A call issued at `issued_at` (monotonic) found no actor where a supervised member
        should be: a leader deposed while it restarted the member's proc left the member
        unbuilt on the new one, and its successor took the journal's word that it was there.
        A failure like any other, which its policy restarts; unless the member is down by
        decision, is restarting, or was rebuilt after the call left."""
        state = self.meshes.get(mesh)
        if state is None or state.supervisor is None or rank in state.down or rank not in state.ready:
            return  # (a stopped member is not restarted by failed() either)
        if not state.ready[rank].is_set() or issued_at < state.rebuilt_at.get(rank, float("-inf")):
            return
        log.warning("a supervised actor is missing from its proc; its policy restarts it", mesh=mesh, rank=rank,
                    reason=reason)
        self.failed(mesh, rank, reason, abnormal=True)

    def stopped(self, mesh: str, ranks: Iterable[int]) -> None:
        """The program stopped these members: down for good, not missing."""
        state = self.meshes.get(mesh)
        if state is not None:
            state.stopped.update(ranks)

    def note(self, ev: str, **data: Any) -> None:
        """Journal a supervision event that happened outside this supervisor (a host lost)."""
        self._event(ev, **data)

    def _event(self, ev: str, **data: Any) -> int | None:
        entry = {"ev": ev, "t": time.time(), **data}
        self.events.append(entry)
        try:
            return self.record(entry)
        except Exception as e:  # deposed: the event is lost with our leadership
            log.warning("could not journal a supervision event", error=str(e))
            return None

    def _decided(self, ev: str, **data: Any) -> None:
        """Journal a decision a standby must find and never take again (a spare picked), and
        return once it is durable: nothing is acted on before that."""
        lsn = self._event(ev, **data)
        if lsn is None:
            raise SupervisionError(f"could not journal the decision {ev!r}; this controller is no longer leader")
        self._durable(lsn)

    # --- the supervisor thread --------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if item is None:
                return
            try:
                if item[0] == "rebuild":
                    self._rebuild_after_takeover(item[1])
                elif item[0] == "grow":
                    self._grow(*item[1])
                else:
                    self._handle(*item)
            except Exception:
                log.exception("supervisor failed to handle a failure", mesh=str(item[0]), rank=item[1])

    def _handle(self, mesh: str, rank: int, reason: str, abnormal: bool, proc: ProcRef) -> None:
        state = self.meshes.get(mesh)
        if state is None:  # the program stopped the mesh meanwhile
            return
        if rank >= len(state.procs) or state.procs[rank] is not proc:
            return  # the mesh shrank since: this point left with its host
        sup = state.supervisor
        lost = self._lost_host(proc)
        # A bounded name for why (the reason's text names pids and hosts): metrics and status use it.
        cause = "host_lost" if lost else "proc_died" if not proc.alive else "actor_failed" if abnormal \
            else "actor_exited"
        self._event("failure", mesh=mesh, rank=rank, reason=reason, abnormal=abnormal, cause=cause)
        if lost is not None and sup.policy.on_host_lost == "shrink" and not sup.escalated:
            self._shrink(state, rank, lost, reason)
            return
        decision = sup.on_failure(rank, reason, abnormal, time.monotonic())
        if decision.action == "ignore":
            state.down.add(rank)
            if sup.escalated is None:
                state.ready[rank].set()  # not restarted: calls go through and fail there
            else:
                self._release(state)
            return
        if decision.action == "escalate":
            self._escalate(state, rank, decision.report)
            return
        for r in decision.ranks:
            state.ready[r].clear()
        time.sleep(decision.delay_s)
        failed_again = None
        r = decision.ranks[0]
        try:
            # Dead procs first (a lost host's on a spare), then the groups over them, then actors.
            for r in decision.ranks:
                self._replace_if_dead(state, r)
            self.membership.reform([state.procs[r] for r in decision.ranks])
            self._spawn_all(state, list(decision.ranks), [sup.incarnation.get(r, 1) for r in decision.ranks])
        except _ProcDied as e:  # its death is a failure of its own, queued already: one restart for it
            log.warning("a restart's proc died under it; its death restarts it again", mesh=mesh, rank=r,
                        error=str(e))
            return
        except Exception as e:
            failed_again = (r, str(e))
        if failed_again is not None:
            log.warning("restart failed; the supervisor will try again under its policy",
                        mesh=mesh, rank=failed_again[0], error=failed_again[1])
            self.failed(mesh, failed_again[0], failed_again[1], abnormal=True)
            return
        self._event("restart", mesh=mesh, ranks=list(decision.ranks),
                    incarnation=[sup.incarnation.get(r) for r in decision.ranks], delay_s=decision.delay_s)
        rebuilt = time.monotonic()
        for r in decision.ranks:
            state.down.discard(r)
            state.rebuilt_at[r] = rebuilt
            state.ready[r].set()

    def _escalate(self, state: MeshState, rank: int, report: str) -> None:
        state.supervisor.escalated = report
        self._event("escalation", mesh=state.name, report=report, rank=rank, spawn=state.spawn_seq)
        log.error("supervision escalated to the program", mesh=state.name, report=report)
        self._release(state)
        if self.on_unhandled is not None:
            self.on_unhandled(state, rank, report, "escalation")

    def _lost_host(self, proc: ProcRef) -> str | None:
        """The address of the proc's host if that host is lost."""
        runtime = self.runtime
        return proc.host if runtime.moved_hosts.get(proc.host, proc.host) in runtime.lost_hosts else None

    def _shrink(self, state: MeshState, rank: int, host: str, reason: str) -> None:
        """on_host_lost="shrink": the lost host's points leave the proc mesh the actor mesh was
        spawned on, and every mesh on it; the groups over it re-form with the smaller world;
        every supervised mesh on it restarts with its members renumbered. Journaled before it
        is acted on; the program's handles follow at its next use of one (controller/shapes.py)."""
        shape = state.shape
        keep = shape.keep_without(host) if shape is not None else None
        if keep is None:
            self._escalate(state, rank, f"actor mesh {state.name!r} lost {state.name}[{rank}] with its host "
                                        f"({reason}) but cannot shrink: only a mesh spawned on a whole proc mesh "
                                        "of a host mesh loses whole hosts (spawn it on the proc mesh "
                                        "s.host_mesh(...).spawn_procs(...) returns, not on a slice)")
            return
        if not keep:
            self._escalate(state, rank, f"actor mesh {state.name!r} lost the last host it had ({reason}): a mesh "
                                        "cannot shrink to nothing (on_host_lost='shrink'); it is no longer restarted")
            return
        on_shape = [st for st in self.meshes.values() if st.shape is shape]
        for st in on_shape:
            for r in st.ready:
                st.ready[r].clear()
        try:
            self._decided("shrink", shape=shape.seq, host=host, keep=keep, mesh=state.name)
        except SupervisionError as e:
            log.warning("a shrink could not be journaled; not acted on", mesh=state.name, error=str(e))
            return
        gone = [p for i, p in enumerate(shape.sup_procs) if i not in set(keep)]
        shape.sup_apply(keep)
        self.shapes.decided(shape, host, keep)
        log.warning("a lost host's points left the mesh", mesh=state.name, host=host, dims=shape.sup_dims)
        for st in on_shape:
            st.reshape(shape.sup_procs, shape.sup_dims)
        try:
            self.membership.leave(gone)
            self.membership.reform(shape.sup_procs)
            for st in on_shape:
                if st.supervisor is not None and not st.supervisor.escalated:
                    self._rebuild_all(st)
        except Exception as e:
            log.warning("rebuilding a shrunk mesh failed; its policy goes on", mesh=state.name, error=str(e))
            self.failed(state.name, 0, str(e), abnormal=True)
            return
        self._event("shrunk", mesh=state.name, host=host, dims=shape.sup_dims)

    def grow(self, shape: Shape, added: list[ProcRef], seq: int, done_before: bool) -> None:
        """A proc mesh grows by `added` (its grow call at `seq`): every mesh on it takes the new
        points at the end, the groups over it re-form larger, supervised meshes rebuild at their
        new size and the others get members on the new points; unless a previous leader did all
        that (`done_before`), when only this side's view grows. On the supervisor's thread, as
        a failure is handled; the caller waits for it."""
        done: dict[str, Any] = {"event": threading.Event()}
        self._queue.put(("grow", (shape, added, seq, done_before, done)))
        done["event"].wait()
        if "error" in done:
            raise SupervisionError(f"the proc mesh grew by {len(added)} procs but its meshes could not be "
                                   f"rebuilt on them: {done['error']}")

    def _grow(self, shape: Shape, added: list[ProcRef], seq: int, done_before: bool, done: dict) -> None:
        try:
            old = list(shape.sup_procs)
            shape.sup_grow(added)
            on_shape = [st for st in self.meshes.values() if st.shape is shape]
            sizes = {st.name: len(st.procs) for st in on_shape}
            for st in on_shape:
                st.reshape(shape.sup_procs, shape.sup_dims)
            self.membership.grown(old, added)
            if not done_before:
                self.membership.reform(shape.sup_procs)
                for st in on_shape:
                    if self.membership.is_group(st.name):
                        continue  # built by the re-forming
                    if st.supervisor is not None:
                        self._rebuild_all(st)
                    else:
                        added_ranks = list(range(sizes[st.name], len(st.procs)))
                        self._spawn_all(st, added_ranks, [1] * len(added_ranks))
                self._event("grown", shape=shape.seq, at=seq, dims=shape.sup_dims)
            for st in on_shape:
                self._release(st)
        except Exception as e:
            done["error"] = str(e)
        finally:
            done["event"].set()

    def _rebuild_after_takeover(self, state: MeshState) -> None:
        if not self.membership.needs_reform(state.procs):  # a restart re-formed it meanwhile
            self._release(state)
            return
        try:
            self.membership.reform(state.procs)
            self._rebuild_all(state)
        except Exception as e:
            log.warning("rebuilding a shrunk mesh after a takeover failed; its policy goes on", mesh=state.name,
                        error=str(e))
            self.failed(state.name, 0, str(e), abnormal=True)

    def _rebuild_all(self, state: MeshState) -> None:
        """Every member of a reshaped mesh, rebuilt at its new point (a new incarnation each)."""
        sup = state.supervisor
        ranks = list(range(len(state.procs)))
        inc = max(sup.incarnation.values(), default=0) + 1  # above any member's, at whichever point it was
        for r in ranks:
            sup.incarnation[r] = inc
        self._spawn_all(state, ranks, [inc] * len(ranks))
        self._event("restart", mesh=state.name, ranks=ranks, incarnation=[sup.incarnation[r] for r in ranks],
                    delay_s=0.0)
        rebuilt = time.monotonic()
        for r in ranks:
            state.rebuilt_at[r] = rebuilt
            state.ready[r].set()

    def _release(self, state: MeshState) -> None:
        for ev in state.ready.values():
            ev.set()

    def _replace_if_dead(self, state: MeshState, rank: int) -> None:
        proc = state.procs[rank]
        if not proc.alive:
            self._replace_proc(proc, state.supervisor.policy)
            # Everything that lived on the old process is rebuilt there, mesh by mesh.
            for other in self.meshes.values():
                if other is not state and other.supervisor is not None:
                    for r, p in enumerate(other.procs):
                        if p is proc:
                            self.failed(other.name, r, f"its proc {proc.id} was replaced", abnormal=True)

    def _replace_proc(self, proc: ProcRef, policy: RestartPolicy) -> None:
        """A new process for a dead proc: from its own host's agent, or, when that host is lost
        and the policy says "replace", from the spare that replaces the host (same index)."""
        runtime = self.runtime
        host = proc.host
        to_spare = runtime.moved_hosts.get(host, host) in runtime.lost_hosts and policy.on_host_lost == "replace"
        if to_spare:
            host = self.membership.spare_for(host, policy.replace_timeout_s)
        reply = runtime.host_request(host, "respawn_proc", old=proc.id, idx=proc.index, env=proc.env, path=self.path)
        if reply.get("st") != "ok":
            raise SupervisionError(f"host agent at {host} could not replace proc {proc.id}: {reply.get('em')}")
        (new,) = reply["procs"]
        old_id = proc.id
        runtime.procs.pop(old_id, None)
        proc.id, proc.address, proc.pid = new["id"], new["addr"], new["pid"]
        proc.host = runtime.moved_hosts.get(host, host)  # where its agent serves now
        proc.alive, proc.death = True, ""
        runtime.procs[proc.id] = proc
        self._event("proc_replaced", old=old_id, new=proc.id, pid=proc.pid, host=host)
        if to_spare:
            self._warm()  # the spare is in use now: warm the next one

    def _spawn_all(self, state: MeshState, ranks: list[int], incarnations: list[int]) -> None:
        """Rebuild these members from the mesh's spawn arguments, every proc asked at once (each
        builds its own; a mesh of many ranks restarts in the time of one)."""
        asks = []
        for rank, incarnation in zip(ranks, incarnations, strict=True):
            meta = {"sid": self.sid, "e": self.runtime.epoch, "s": -1, "a": state.name, "m": "__init__",
                    "d": b"", "rt": self.runtime.reply_address, "pt": rank, **state.coords[rank],
                    "restart": True, "inc": incarnation}
            asks.append((state.procs[rank], Kind.SPAWN, meta, state.frames))
        timeout = state.supervisor.policy.restart_timeout_s if state.supervisor is not None else 60.0
        replies = self.runtime.ask_procs(asks, timeout)
        for rank, incarnation, reply in zip(ranks, incarnations, replies, strict=True):
            if reply is None:
                raise SupervisionError(f"{state.name}[{rank}] restart got no answer within {timeout:g} s")
            if reply.get("st") == "dead":  # its proc died while the restart waited
                raise _ProcDied(f"{state.name}[{rank}] restart failed: {reply.get('em')}")
            if reply.get("st") != "ok":
                raise SupervisionError(f"{state.name}[{rank}].__init__ raised {reply.get('et')}: {reply.get('em')} "
                                       f"(incarnation {incarnation})")

    def _warm(self) -> None:
        if self.warmer is not None:
            self.warmer.poke()

    def close(self) -> None:
        if self.warmer is not None:
            self.warmer.close()
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout=5)


class _ProcDied(SupervisionError):
    """A restart failed because its proc died: the runtime reported that death as a failure."""


def _no_clusters() -> ClusterHosts:
    raise SupervisionError("this session uses no cluster hosts, so a lost host has no spare")


def policy_of(restart: RestartPolicy | str | None) -> RestartPolicy | None:
    """restart= accepts a RestartPolicy, a restart type name, or None (no supervision)."""
    if restart is None or isinstance(restart, RestartPolicy):
        return restart
    if isinstance(restart, str):
        return RestartPolicy(restart=restart)  # type: ignore[arg-type]
    raise TypeError(f"restart= takes a RestartPolicy or 'permanent'/'transient'/'temporary', not {restart!r}")
