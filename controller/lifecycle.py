"""Meshes coming and going: hosts, proc spawns, actor spawns and stops, for one Session.

Each is a journaled side effect like a call (a seq, a record, replayed on takeover); what is
particular to them is the host agents they talk to and the supervision they set up.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import msgpack
import structlog

from regent import wire
from regent.controller._files import check_room
from regent.controller.edge import sys_path
from regent.controller.mesh import ActorMesh, GatherSink, HostMesh, ProcMesh, View, host_of
from regent.controller.refs import ProcRef
from regent.controller.replay import CALL, PLACED, PROCS
from regent.controller.supervisor import MeshState, policy_of
from regent.journal.hosts import check_name, literal_address
from regent.wire import Kind
from regent.wire.security import is_loopback
from regent.worker.classref import class_ref, modules_of
from regent.worker.errors import FencedError, SupervisionError
from regent.worker.shape import point_of
from regent.worker.supervision import MeshSupervisor
from regent.worker.zygote import wanted_preload

log = structlog.get_logger("regent.controller")

if TYPE_CHECKING:
    from regent.controller.session import Session

PROC_TUNING_ENV = ("REGENT_SPIN_US",)  # passed from the controller's environment to its procs


class Lifecycle:
    """The mesh side effects of one session (Session delegates to it)."""

    def __init__(self, session: Session):
        self.s = session
        self.hosts: list[str] = []
        self.actor_names: set[str] = set()
        self._placed: dict[str, list[ProcRef]] = {}  # an actor mesh's procs, by name: stopped, they free it
        self.procs: list[ProcRef] = []  # every proc spawned, in the program's order

    def this_host(self) -> HostMesh:
        """The machine this controller runs on (the journal remembers which it was)."""
        s = self.s
        if not self.hosts:
            host = s._value("this_host", s._edge.local_host)
            self.hosts.append(s._edge.attach_host(host))
        return HostMesh(s, list(self.hosts))

    def host_mesh(self, hosts: int, cluster: str | None, timeout_s: float) -> HostMesh:
        """`hosts` hosts of a cluster registered in the store; which ones is journaled, so a
        replay gets the same ones back (those that are gone meanwhile are lost hosts)."""
        cluster = cluster or os.environ.get("REGENT_CLUSTER")
        if not cluster:
            raise ValueError("name the cluster: s.host_mesh(hosts=N, cluster=NAME), or set REGENT_CLUSTER")
        check_name(cluster, "cluster name")
        if not isinstance(hosts, int) or isinstance(hosts, bool) or hosts < 1:
            raise ValueError(f"hosts={hosts!r}: ask for a positive number of hosts")
        s = self.s
        clusters = s._edge.clusters()
        seq, jc = s._begin("host_mesh", cluster, str(hosts))
        if jc is not None:
            s._engine.stats["replayed"] += 1
            picked = _journaled_pick(seq, jc.value, cluster, hosts)
        else:
            picked = {"cluster": cluster, "hosts": clusters.pick(cluster, hosts, timeout_s)}
            self._check_reachable(cluster, picked["hosts"])
            s._do(s._engine.value_record(seq, "host_mesh", picked, cluster, str(hosts)))
        s._finished(seq)
        mesh = HostMesh(s, clusters.attach(cluster, picked["hosts"], jc is not None))
        if jc is not None:  # spares previous leaders moved lost hosts' procs to are this session's too
            s._supervisor.membership.adopt_journaled(cluster)
        return mesh

    def _check_reachable(self, cluster: str, entries: list[dict]) -> None:
        """Hosts off loopback reply to this controller's address: it must not be loopback."""
        remote = [e for e in entries if not is_loopback(host_of(e["addr"]))]
        reply = self.s.runtime.reply_address
        if remote and is_loopback(host_of(reply)):
            raise RuntimeError(
                f"host {remote[0]['id']} of cluster {cluster!r} is at {remote[0]['addr']}, but this controller "
                f"listens on {reply}, which that host cannot reach: set REGENT_SECURE=1 (with the cluster's "
                "keys from `regent keys init`) and REGENT_ADVERTISE=<this machine's IP as the hosts reach it>")

    def spawn_procs(self, hosts: list[str], per_host: dict[str, int]) -> ProcMesh:
        if len(per_host) != 1:
            raise ValueError(f"per_host names one dimension, e.g. {{'procs': 4}}; got {per_host}")
        ((dim, count),) = per_host.items()
        if dim == "hosts" or not isinstance(count, int) or count < 1:
            raise ValueError(f"per_host={per_host}: the count must be a positive int and the dim not 'hosts'")
        s = self.s
        relaying = getattr(s.runtime, "relaying", None)  # None: an audit, which links to nothing
        if relaying is not None:  # refused before anything is journaled, rather than hung later
            check_room(count * sum(s.runtime.moved_hosts.get(h, h) not in relaying for h in hosts))
        # The hosts themselves are journaled (`this_host`) and may be replaced on replay when
        # a journaled agent is gone; the call is identified by its shape.
        digest = wire.digest([msgpack.packb([len(hosts), dim, count])])
        seq, jc = s._begin("spawn_procs", "", dim, digest)
        if jc is not None and jc.procs is None and s._catchup is not None:  # what the hosts gave: coming
            s._catchup.await_journal(lambda: jc.procs is not None)
        runtime = s.runtime  # the live one, if catching up ended above
        if jc is None:
            s._append(CALL, {"s": seq, "k": "spawn_procs", "a": "", "m": dim, "d": digest, "pts": []})
        if jc is not None and jc.procs is not None:
            s._engine.stats["replayed"] += 1
            listing = jc.procs
        else:
            listing = []
            # The session's own tuning reaches its procs even through an agent started earlier.
            tuning = {k: os.environ[k] for k in PROC_TUNING_ENV if k in os.environ}
            envs = [{"REGENT_PROC_RANK": str(i), "REGENT_PROC_DIM": dim, **tuning} for i in range(count)]
            # Every host asked at once: each starts its procs together, all hosts in parallel.
            fields = {"s": seq, "count": count, "envs": envs, "path": sys_path(), "d": digest,
                      "preload": wanted_preload()}  # what hosts forking procs import once (worker/zygote.py)
            replies = runtime.host_requests([(host, "spawn_procs", fields) for host in hosts])
            for host, reply in zip(hosts, replies, strict=True):
                if reply.get("st") != "ok":
                    raise SupervisionError(f"host agent at {host} could not spawn procs: {reply.get('em')}")
                listing += [{**p, "host": host, "env": envs[k]} for k, p in enumerate(reply["procs"])]
            s._append(PROCS, {"s": seq, "procs": listing})
        procs = []
        for p in listing:
            ref = runtime.procs.get(p["id"])
            if ref is None and jc is not None:
                ref = self._replacement_of(p)
            if ref is None:
                ref = ProcRef(p["id"], p["idx"], p["addr"], p["pid"], p["host"], env=p.get("env") or {})
                # Known from the journal but not reported alive by its host: it died meanwhile.
                if jc is not None and (runtime.hosts or ref.host in runtime.lost_hosts):
                    with runtime.drive:
                        runtime.mark_dead(ref, f"proc {ref.id} (pid {ref.pid}) is gone")
                runtime.procs[ref.id] = ref
            procs.append(ref)
        self.procs += procs
        s._finished(seq)
        dims = {"hosts": len(hosts), dim: count}
        shape = s._shapes.made(seq, procs, dims)
        return ProcMesh(s, shape.procs, View.full(shape.dims), shape)

    def _replacement_of(self, listed: dict) -> ProcRef | None:
        """A journaled proc that a previous leader replaced (its `proc_replaced` events), if
        the replacement is alive: calls go on there, where results and rebuilt actors are.
        Taking the listed proc for dead instead would restart it a second time."""
        replaced = self.s._engine.replay.replaced
        latest, seen = listed["id"], set()
        while latest in replaced and latest not in seen:
            seen.add(latest)
            latest = replaced[latest]
        ref = self.s.runtime.procs.get(latest) if latest != listed["id"] else None
        if ref is None or not ref.alive:
            return None
        ref.key, ref.index, ref.env = listed["id"], listed["idx"], listed.get("env") or {}
        return ref

    def spawn_actors(self, mesh: ProcMesh, name: str, cls: type, args: tuple, kwargs: dict,
                     restart: Any = None) -> ActorMesh:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ValueError(f"actor mesh name {name!r} must be a non-empty string")
        if name in self.actor_names:
            if not self._lost(name):
                raise ValueError(f"an actor mesh named {name!r} already exists in this session: stop it first "
                                 "(mesh.stop()), or pick another name")
            self._free(name)
        s = self.s
        procs = mesh.procs()
        dims = mesh.dims
        # Spawned on a whole proc mesh of hosts, the actor mesh follows its shape (a shrink).
        shape = mesh._shape if mesh._shape is not None and len(procs) == len(mesh._shape.procs) else None
        frames = wire.dumps((class_ref(cls), args, kwargs))
        identity = (cls.__module__, cls.__qualname__, args, kwargs)
        digest = wire.call_digest(identity, wire.dumps(identity))
        sink = GatherSink(View.full(dims))
        metas = [{"co": dict(point_of(dims, rank)), "sz": dims} for rank in range(len(procs))]
        spawn = s._issue_call(Kind.SPAWN, "spawn", name, "__init__", frames, digest, procs,
                              tuple(range(len(procs))), sink, metas)
        policy = policy_of(restart)
        try:
            sink.future.get()
        except SupervisionError:
            if policy is None:
                raise  # unsupervised: a member that is gone stays gone
        self.actor_names.add(name)
        self._placed[name] = list(procs)
        mesh_sup = MeshSupervisor(name, len(procs), policy) if policy else None
        replay = s._engine.replay
        if replay is None or spawn.seq > replay.max_seq:
            # A live spawn: where its members live, for `regent status` (a replay notes nothing again).
            s._supervisor.note(PLACED, mesh=name, spawn=spawn.seq, procs=[p.id for p in procs])
        escalation = None
        if mesh_sup is not None and replay is not None:
            # Incarnations go on from where the previous leaders' restarts left them.
            mesh_sup.incarnation.update({r: inc for (m, r), inc in replay.incarnations.items() if m == name})
            # A mesh a previous leader gave up on stays given up on: it is not restarted again.
            escalation = _journaled_escalation(replay.supervision, name, spawn.seq)
            if escalation is not None:
                mesh_sup.escalated = escalation["report"]
        state = MeshState(name, procs, dims, frames, mesh_sup, coords=metas, spawn_seq=spawn.seq, shape=shape,
                          preload=tuple(modules_of(cls)))
        if shape is not None and len(shape.sup_procs) != len(procs):  # replayed: previous leaders shrank it
            state.reshape(shape.sup_procs, shape.sup_dims)
        s._supervisor.register(state)
        if escalation is not None:  # handed to the program after replay, unless it was already
            s._faults.seen(state, escalation["rank"], escalation["report"], "escalation")
        if shape is not None:
            return ActorMesh(s, name, cls, shape.procs, dict(shape.dims), shape=shape)
        return ActorMesh(s, name, cls, procs, dims)

    def grow(self, mesh: ProcMesh, hosts: int, timeout_s: float) -> None:
        """Add `hosts` registered hosts the session does not use to a proc mesh: new points at
        the end, actors of its meshes spawned there, its groups re-formed (Supervisor.grow).
        Which hosts is a journaled value, as for host_mesh; their procs a journaled spawn."""
        shape = mesh._shape
        if shape is None or len(mesh._view) != len(shape.procs):
            raise ValueError("grow() grows a whole proc mesh of a host mesh (what s.host_mesh(...).spawn_procs(...) "
                             "returned), not a slice or a mesh of this machine")
        if not isinstance(hosts, int) or isinstance(hosts, bool) or hosts < 1:
            raise ValueError(f"hosts={hosts!r}: grow by a positive number of hosts")
        s = self.s
        if s._catchup is not None:  # a grow is not caught up: taken as the new leader
            s._catchup.lead_now()
        s._shapes.adopt(s)
        clusters = s._edge.clusters()
        where = clusters.host_at(shape.procs[0].host) if shape.procs else None
        if where is None:
            raise ValueError("grow() needs a proc mesh on the hosts of a cluster (s.host_mesh(...))")
        cluster = where[0]
        seq, jc = s._begin("grow", cluster, str(hosts))
        if jc is not None:
            s._engine.stats["replayed"] += 1
            picked = _journaled_pick(seq, jc.value, cluster, hosts)
        else:
            entries = clusters.unused(cluster, hosts, timeout_s, f"cannot grow the proc mesh by {hosts} hosts")
            picked = {"cluster": cluster, "hosts": entries}
            self._check_reachable(cluster, entries)
            s._do(s._engine.value_record(seq, "grow", picked, cluster, str(hosts)))
        s._finished(seq)
        addresses = clusters.attach(cluster, picked["hosts"], jc is not None)
        ((dim, count),) = ((d, n) for d, n in shape.dims.items() if d != "hosts")
        added = self.spawn_procs(addresses, {dim: count}).procs()
        done_before = s._engine.replay is not None and any(
            isinstance(d, dict) and d.get("ev") == "grown" and d.get("at") == seq for d in s._engine.replay.supervision)
        s._supervisor.grow(shape, added, seq, done_before)
        shape.grow(added)

    def group_formed(self, name: str, procs: list[ProcRef], backend: str, timeout_s: float) -> None:
        """A proc mesh formed a process group (its system mesh `name`): supervision re-forms it
        when a member is replaced or leaves."""
        self.s._supervisor.membership.formed(name, procs, backend, timeout_s)

    def stop_actors(self, mesh: ActorMesh, reason: str) -> None:
        """Stop these actors; once every member of the mesh is stopped its name is free again."""
        if reason:
            log.info("stopping actors", mesh=mesh.name, ranks=len(mesh._view), reason=reason)
        sink = GatherSink(mesh._view)
        self.s._supervisor.stopped(mesh.name, mesh._view.ranks)  # a call finding them gone is no failure
        self.s._issue_call(Kind.STOP, "stop", mesh.name, "__stop__", [], b"", mesh._procs, mesh._view.ranks, sink)
        sink.future.get()
        if len(mesh._view) == len(mesh._procs) and mesh._class is not None:  # not a mesh an actor spawned
            self._free(mesh.name)

    def _lost(self, name: str) -> bool:
        """Whether the mesh `name` is gone: every member failed (or was stopped), or every proc it
        lived on died; its name may then be spawned again, as Monarch allows. A supervised mesh
        is not: its policy brings it back. Replaying, the leader's decision stands: a spawn of the
        name journaled next, or (none) a refusal, which its program may have caught."""
        if self.s.replaying:
            if self.s._catchup is not None:
                self.s._catchup.at_next_seq()
            jc = self.s._engine.next_journaled()
            if jc is not None:
                return jc.kind == "spawn" and jc.actor == name
        state = self.s._supervisor.meshes.get(name)
        if state is not None and state.supervisor is not None:
            return False
        if state is not None and len(state.failed | state.stopped) >= len(state.procs):
            return True  # every member failed (an actor that raised its way out) or was stopped
        on = self._placed.get(name)
        return bool(on) and all(not p.alive for p in on)

    def _free(self, name: str) -> None:
        """A mesh whose actors are all stopped, or whose procs are: its name may be spawned again."""
        self.actor_names.discard(name)
        self._placed.pop(name, None)
        self.s._supervisor.meshes.pop(name, None)  # a mesh stopped is not restarted

    def shutdown_hosts(self, hosts: list[str]) -> None:
        """Stop every proc of this session on these hosts that is not stopped already."""
        on = set(hosts)
        procs = list({id(p): p for p in self.procs if p.host in on and not p.stopped}.values())
        if procs:
            self.stop_procs(procs, "its host mesh was shut down")

    def stop_procs(self, procs: list[ProcRef], reason: str) -> None:
        """Stop these procs and the actors on them; supervision does not bring them back."""
        s = self.s
        if s._catchup is not None:  # it asks host agents even replayed: taken as the new leader
            s._catchup.lead_now()
        runtime = s.runtime
        digest = wire.digest([msgpack.packb([p.key for p in procs])])
        seq, jc = s._begin("stop_procs", "", "stop_procs", digest)
        if jc is None:
            s._append(CALL, {"s": seq, "k": "stop_procs", "a": "", "m": "stop_procs", "d": digest, "pts": []})
        for proc in procs:
            proc.stopped = True
        by_host: dict[str, list[str]] = {}
        for proc in procs:
            by_host.setdefault(proc.host, []).append(proc.id)
        for host, ids in by_host.items():
            runtime.host_request(host, "stop_procs", ids=ids, timeout=30.0)
        with runtime.drive:
            for proc in procs:
                runtime.mark_dead(proc, f"proc {proc.id} was stopped by the program" + (f": {reason}" if reason else ""))
        for name in [n for n, on in self._placed.items() if all(p.stopped for p in on)]:
            self._free(name)  # Monarch spawns a mesh of the name again on new procs; so does regent
        s._finished(seq)

    def stop_on_hosts(self) -> None:
        """The session ended: every host agent it used (this machine's, its clusters' hosts and
        spares it kept warm) stops its procs now, all asked at once, rather than at their
        orphan timeout. A lost host's agent is not asked."""
        runtime = self.s.runtime
        warmer = self.s._supervisor.warmer
        used = [*self.hosts, *runtime.hosts]
        spares = set(warmer.hosts() if warmer else ()) - set(used)  # a spare may have died unnoticed: less wait
        hosts = [h for h in dict.fromkeys([*used, *spares]) if runtime.moved_hosts.get(h, h) not in runtime.lost_hosts]

        def stop(host: str) -> None:
            try:
                runtime.host_request(host, "stop_session", timeout=5.0 if host in spares else 15.0)
            except (TimeoutError, FencedError, SupervisionError) as e:
                log.warning("could not stop the session on a host", host=host, error=str(e))

        if hosts:
            with ThreadPoolExecutor(max_workers=min(16, len(hosts)), thread_name_prefix="regent-stop") as pool:
                list(pool.map(stop, hosts))


def _journaled_escalation(records: list, name: str, spawn: int) -> dict | None:
    """The escalation a previous leader journaled for the mesh that spawn `spawn` made."""
    for d in records:
        if (isinstance(d, dict) and d.get("ev") == "escalation" and d.get("mesh") == name
                and d.get("spawn") == spawn and isinstance(d.get("report"), str)):
            rank = d.get("rank")
            return {"report": d["report"], "rank": rank if isinstance(rank, int) and rank >= 0 else 0}
    return None


def _journaled_pick(seq: int, value: Any, cluster: str, n: int) -> dict:
    """The host_mesh pick a journal holds, checked as the untrusted input it is."""
    entries = value.get("hosts") if isinstance(value, dict) else None
    if (not isinstance(entries, list) or len(entries) != n or value.get("cluster") != cluster
            or not all(isinstance(e, dict) and isinstance(e.get("id"), str) and literal_address(e.get("addr"))
                       and isinstance(e.get("inc"), str) for e in entries)):
        raise ValueError(f"the journal's host_mesh record at seq {seq} is malformed (not {n} hosts of cluster "
                         f"{cluster!r} with literal addresses): run `regent journal verify` on the session")
    return value
