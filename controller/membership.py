"""A mesh's membership when hosts are lost: the spare a lost host's procs move to, and the
process groups re-formed over the procs a mesh has now.

Each decision is journaled before it is acted on (`host_replaced`, `group_reformed`), so a
standby that takes over reads it and never decides again: it finishes a replacement on the
spare the primary picked. Runs on the supervisor's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from regent import wire
from regent.journal.hosts import literal_address
from regent.wire import Kind
from regent.worker.classref import class_ref
from regent.worker.errors import SupervisionError
from regent.worker.shape import point_of
from regent.worker.system import ProcGroup

if TYPE_CHECKING:
    from regent.controller._runtime import Runtime
    from regent.controller.cluster import ClusterHosts
    from regent.controller.refs import ProcRef

log = structlog.get_logger("regent.supervisor")


@dataclass
class GroupState:
    """A torch.distributed group a proc mesh formed (`init_process_group`); `procs` by rank are
    the same ProcRef objects the meshes hold, so a replacement shows here at once."""

    name: str  # its ProcGroup system mesh
    procs: list[ProcRef]
    backend: str
    timeout_s: float
    formed: tuple[str, ...]  # the proc ids its current generation was formed with
    generation: int = 0

    @property
    def dims(self) -> dict[str, int]:
        return {"ranks": len(self.procs)}


class Membership:
    """Spares and process groups of one session. `note(ev, **data)` journals a supervision
    record and returns once it is durable; `clusters()` is the session's ClusterHosts."""

    def __init__(self, runtime: Runtime, note: Callable[..., None], clusters: Callable[[], ClusterHosts],
                 journaled: list[dict]):
        self.runtime = runtime
        self.note = note
        self.clusters = clusters
        self.groups: dict[str, GroupState] = {}
        self.replacements: dict[str, str] = {}  # lost host address -> its spare's, decided or adopted
        self._journaled = _journaled_replacements(journaled)
        self._reformed = _journaled_reforms(journaled)
        self._lock = threading.Lock()
        self.on_formed: Callable[[], None] = lambda: None  # a group was formed (warm spares import torch)

    # --- spares ----------------------------------------------------------------------------

    def spare_for(self, lost: str, timeout_s: float) -> str:
        """The address of the spare host that replaces lost host `lost`: the one journaled
        (by this leader or a previous one), else the first unused registered host of its
        cluster, journaled before anything starts there. One spare per lost host."""
        with self._lock:
            done = self.replacements.get(lost)
            if done is not None:
                return done
            entry = self._journaled.get(lost)
            clusters = self.clusters()
            if entry is None:
                where = clusters.host_at(lost)
                if where is None:
                    raise SupervisionError(f"host agent at {lost} is not a host of a cluster: a proc of the "
                                           "controller's own machine has no spare to move to")
                cluster, old_id = where
                (spare,) = clusters.unused(cluster, 1, timeout_s, f"no spare host to replace lost host {old_id} "
                                                                   "(replace_timeout_s)")
                entry = {"cluster": cluster, **spare}
                self.note("host_replaced", cluster=cluster, host=old_id, addr=lost, new=entry)
                log.warning("lost host replaced by a spare", cluster=cluster, host=old_id, spare=entry["id"])
            new = entry["cluster"], {k: entry[k] for k in ("id", "addr", "inc", "hostname") if k in entry}
            (addr,) = clusters.attach(new[0], [new[1]], replaying=lost in self._journaled)
            self.replacements[lost] = addr
            return addr

    def adopt_journaled(self, cluster: str) -> None:
        """On replay: watch the spares previous leaders picked in `cluster`, as the hosts they are."""
        for lost, entry in list(self._journaled.items()):
            if entry["cluster"] == cluster and lost not in self.replacements:
                self.spare_for(lost, 0.0)

    # --- process groups ------------------------------------------------------------------

    def formed(self, name: str, procs: list[ProcRef], backend: str, timeout_s: float) -> None:
        """The program formed a process group over `procs` (live, or replayed: as a previous
        leader last re-formed it, its members that left with a lost host gone)."""
        generation, ids = self._reformed.get(name, (0, tuple(p.key for p in procs)))
        if generation:
            procs = [p for p in procs if p.id in ids or p.key in ids] or procs
        self.groups[name] = GroupState(name, list(procs), backend, timeout_s, ids, generation)
        self.runtime.groups[name] = self.groups[name].procs
        self.on_formed()

    def leave(self, gone: list[ProcRef]) -> None:
        """These procs left their meshes (a shrink): their groups lose them, to re-form smaller."""
        for group in self.groups.values():
            kept = [p for p in group.procs if p not in gone]
            if len(kept) != len(group.procs):
                group.procs = kept
                self.runtime.groups[group.name] = kept

    def is_group(self, mesh: str) -> bool:
        return mesh in self.groups

    def grown(self, old: list[ProcRef], added: list[ProcRef]) -> None:
        """A proc mesh grew by `added`: the groups formed over all of `old` take them (as the
        last ranks), to re-form larger."""
        for group in self.groups.values():
            if group.procs and all(p in old for p in group.procs):
                group.procs = group.procs + [p for p in added if p not in group.procs]
                self.runtime.groups[group.name] = group.procs

    def needs_reform(self, procs: list[ProcRef]) -> bool:
        """Whether a group with a member among `procs` has other members than it was formed with."""
        return any(any(p in procs for p in g.procs) and tuple(p.id for p in g.procs) != g.formed
                   for g in self.groups.values())

    def reform(self, procs: list[ProcRef]) -> None:
        """Re-form every group with a member among `procs` whose members changed since it was
        formed: a new rendezvous (new port at rank 0's host), same ranks and size, the old group
        left first (docs/multihost.md). SupervisionError if a member cannot join."""
        for group in list(self.groups.values()):
            if any(p in procs for p in group.procs) and tuple(p.id for p in group.procs) != group.formed:
                self._reform(group)

    def _reform(self, group: GroupState) -> None:
        rank0 = group.procs[0]
        reply = self.runtime.host_request(rank0.host, "free_port", timeout=10.0)
        port = reply.get("port")
        if reply.get("st") != "ok" or not isinstance(port, int):
            raise SupervisionError(f"process group {group.name}: rank 0's host agent gave no port: {reply.get('em')}")
        # The incarnation sent rises with the epoch too: a standby re-forming after a primary
        # that re-formed without journaling it never meets procs that take its generation for done.
        generation = group.generation + 1
        addr = _host_of(rank0.address)
        frames = wire.dumps((class_ref(ProcGroup), (len(group.procs),),
                             {"master_addr": addr, "master_port": port, "backend": group.backend,
                              "timeout_s": group.timeout_s, "generation": generation}))
        dims = group.dims
        asks = []
        for rank, proc in enumerate(group.procs):
            meta = {"sid": self.runtime.session, "e": self.runtime.epoch, "s": -1, "a": group.name, "m": "__init__",
                    "d": b"", "rt": self.runtime.reply_address, "pt": rank, "co": dict(point_of(dims, rank)),
                    "sz": dims, "restart": True, "inc": (self.runtime.epoch << 20) + generation}
            asks.append((proc, Kind.SPAWN, meta, frames))
        log.info("re-forming a process group", group=group.name, generation=generation, world_size=len(group.procs),
                 rendezvous=f"{addr}:{port}")
        replies = self.runtime.ask_procs(asks, group.timeout_s + 10.0)
        for rank, r in enumerate(replies):
            if r is None or r.get("st") != "ok":
                why = "no answer" if r is None else f"{r.get('et', r.get('st'))}: {r.get('em')}"
                raise SupervisionError(f"process group {group.name}: rank {rank} could not join generation "
                                       f"{generation} at {addr}:{port} ({why})")
        group.generation, group.formed = generation, tuple(p.id for p in group.procs)
        self.note("group_reformed", group=group.name, gen=generation, port=port, procs=list(group.formed))


def _host_of(address: str) -> str:
    return address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")


def _journaled_replacements(records: list[dict]) -> dict[str, dict]:
    """lost host address -> {cluster, id, addr, inc, hostname} of its spare, from `host_replaced`
    records (journal input: checked, and a malformed one is logged and skipped)."""
    out: dict[str, dict] = {}
    for d in records:
        if not isinstance(d, dict) or d.get("ev") != "host_replaced":
            continue
        new, lost = d.get("new"), d.get("addr")
        if (isinstance(lost, str) and isinstance(new, dict) and isinstance(new.get("id"), str)
                and literal_address(new.get("addr")) and isinstance(new.get("inc"), str)
                and isinstance(d.get("cluster"), str)):
            out[lost] = {**new, "cluster": d["cluster"]}
        else:
            log.warning("skipped a malformed host_replaced record in the journal", record=str(d)[:300])
    return out


def _journaled_reforms(records: list[dict]) -> dict[str, tuple[int, tuple[str, ...]]]:
    """group name -> (generation, proc ids) of its last journaled re-forming."""
    out: dict[str, tuple[int, tuple[str, ...]]] = {}
    for d in records:
        if (isinstance(d, dict) and d.get("ev") == "group_reformed" and isinstance(d.get("group"), str)
                and isinstance(d.get("gen"), int) and isinstance(d.get("procs"), list)
                and all(isinstance(p, str) for p in d["procs"])):
            out[d["group"]] = (d["gen"], tuple(d["procs"]))
    return out


def journaled_spare_addresses(records: list[Any]) -> list[str]:
    """The spares' addresses in a journal's supervision records (for fencing on takeover)."""
    return [e["addr"] for e in _journaled_replacements(records).values()]
