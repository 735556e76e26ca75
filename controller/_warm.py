"""Warm spares. For meshes whose policy replaces lost hosts (`on_host_lost="replace"`) the
first `warm_spares` spares of each cluster keep procs started, one per index and environment
the mesh's procs have on its hosts, with the modules their actors use already imported
(worker/_warm.py). A lost host's procs are then replaced by procs that are already running.

Best effort, and nothing here is journaled: which proc serves a replacement is the agent's
answer to respawn_proc, as before; a spare without warm procs starts cold ones. A standby
that takes over warms the same spares again; the requests are idempotent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from regent.controller._runtime import Runtime
    from regent.controller.cluster import ClusterHosts
    from regent.controller.supervisor import Supervisor

log = structlog.get_logger("regent.supervisor")

REFRESH_S = 20.0  # sent again this often: the spare's orphan clock, and warm procs that died
SETTLE_S = 0.5  # a group formed and a mesh spawned together are warmed by one request
GROUP_MODULES = ("torch.distributed", "regent.hipcore.distributed")  # what re-forming a group imports


class SpareWarmer:
    """Keeps the session's spares warm from its own thread, woken by `poke()` when a mesh or a
    group is made and every REFRESH_S. `hosts()`: every agent it asked (stopped with the session)."""

    def __init__(self, runtime: Runtime, supervisor: Supervisor, clusters: Callable[[], ClusterHosts]):
        self.runtime = runtime
        self.supervisor = supervisor
        self.clusters = clusters
        self.spares: set[str] = set()
        self._leaving: set[str] = set()  # spares no longer wanted, released at the next refresh
        self._asked: set[str] = set()  # every agent ever asked: the session's end stops its procs there
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def poke(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="regent-warm-spares", daemon=True)
                self._thread.start()
        self._wake.set()

    def hosts(self) -> set[str]:
        return set(self._asked)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        # The refresh also keeps the spare's orphan clock: a third of the timeout at most.
        every = min(REFRESH_S, (self.runtime.orphan_timeout_s or REFRESH_S * 3) / 3)
        while not self._stop.is_set():
            if self._wake.wait(every):
                self._wake.clear()
                if self._stop.wait(SETTLE_S):
                    return
            if self.runtime.fenced is not None:
                return  # deposed: the new leader warms
            try:
                self.refresh()
            except Exception as e:  # never worth failing the session over
                log.warning("could not keep spares warm", error=f"{type(e).__name__}: {e}")

    def wanted(self) -> dict[str, tuple[int, list[dict], list[str]]]:
        """cluster -> (spares to keep warm, the warm procs each keeps, the modules they import)."""
        clusters = self.clusters()
        grouped = {id(p) for g in list(self.supervisor.membership.groups.values()) for p in g.procs}
        out: dict[str, tuple[int, dict[tuple, dict], list[str]]] = {}
        for state in list(self.supervisor.meshes.values()):
            sup = state.supervisor
            if sup is None or sup.policy.on_host_lost != "replace" or sup.policy.warm_spares < 1:
                continue
            for proc in list(state.procs):
                where = clusters.host_at(self.runtime.moved_hosts.get(proc.host, proc.host))
                if where is None:
                    continue
                k, procs, modules = out.setdefault(where[0], (0, {}, []))
                procs[(proc.index, tuple(sorted(proc.env.items())))] = {"idx": proc.index, "env": dict(proc.env)}
                modules += [m for m in (*state.preload, *(GROUP_MODULES if id(proc) in grouped else ()))
                            if m not in modules]
                out[where[0]] = (max(k, sup.policy.warm_spares), procs, modules)
        return {c: (k, list(procs.values()), modules) for c, (k, procs, modules) in out.items()}

    def refresh(self) -> None:
        """Ask each spare for its warm procs; a host no longer a spare (a lost host's
        replacement now, or no mesh wants it) is asked to keep none."""
        clusters = self.clusters()
        asked: set[str] = set()
        for cluster, (k, procs, modules) in self.wanted().items():
            for spare in clusters.spares(cluster, k):
                if self._ask(spare["addr"], procs, modules):
                    asked.add(spare["addr"])
        # One refresh later, not at once: a spare just picked for a lost host may still be
        # answering the respawns its warm procs serve.
        for addr in self._leaving - asked:
            self._ask(addr, [], [])
        self._leaving = self.spares - asked
        self.spares = asked

    def _ask(self, addr: str, procs: list[dict], modules: list[str]) -> bool:
        self._asked.add(addr)  # even unanswered: the request may have been taken
        try:
            reply = self.runtime.host_request(addr, "warm_procs", timeout=5.0, warm=procs, preload=modules,
                                              path=self.supervisor.path)
        except Exception as e:  # a spare that does not answer is not warm; the next refresh asks again
            log.info("a spare did not take warm procs", host=addr, error=f"{type(e).__name__}: {e}")
            return False
        return reply.get("st") == "ok"
