"""The host agent's warm procs: procs of a session started on a spare host before any host is
lost, with the modules its actors need already imported. When a lost host's proc is replaced
here (respawn_proc at the same index, with the same environment), a warm proc takes its place
and the replacement costs a message instead of a new Python process importing torch.

A warm proc belongs to its session like any other (stopped with it, or as an orphan) but to
no mesh until one is assigned. The assignment reaches the proc, and is acknowledged, before
the respawn is answered: a successor agent then learns from the proc which proc it replaces,
as for a proc started by respawn_proc. A warm proc never assigned is stopped by a successor
(the controller's next warm_procs starts another)."""

from __future__ import annotations

import structlog

from regent import wire
from regent.wire import Kind
from regent.worker._hoststate import _env_at, _Proc, _SessionState

log = structlog.get_logger("regent.host")


def _warm_key(index: int, env: dict[str, str]) -> tuple:
    """Which respawns a warm proc can serve: the same index (its device binding) and the
    same requested environment (rank variables and tuning)."""
    return index, tuple(sorted(env.items()))


class _WarmPool:
    """Mixed into HostAgent, whose sessions, sockets and proc control these methods use."""

    def _on_warm(self, sid: str, state: _SessionState, meta: dict, rt: str) -> None:
        """Keep exactly the warm procs a controller wants (wire.schema.WarmProc): start the
        missing ones, stop those no longer wanted. Sent again periodically; idempotent."""
        preload = [m for m in meta.get("preload") or [] if isinstance(m, str)]
        argv = ["--warm"] + [arg for m in preload for arg in ("--preload", m)]
        wanted = {}
        for w in meta.get("warm") or []:
            env = _env_at([w.get("env") or {}], 0)
            wanted[_warm_key(w["idx"], env)] = (w["idx"], env)
        for key, proc in list(state.warm.items()):
            if key not in wanted or proc.exited:
                del state.warm[key]
                if not proc.exited:
                    self._stop_procs(state, [proc.id])
        for key, (index, env) in wanted.items():
            if key in state.warm:
                continue
            try:
                state.warm[key] = self._start_proc(sid, state, index, env, meta.get("path") or [], argv)
            except ValueError as e:  # a device binding this host cannot give: no warm proc for it
                log.warning("cannot keep a warm proc at this index", session=sid, index=index, error=str(e))
        self._reply(rt, sid, meta.get("n"), warm=len(state.warm))

    def _take_warm(self, sid: str, state: _SessionState, index: int, env: dict[str, str],
                   old: str) -> _Proc | None:
        """A warm proc that can replace proc `old` (at `index`, started with `env`), now assigned
        to it; None if there is none. The request it serves is answered once the proc says it
        knows (_on_ready with "old")."""
        proc = state.warm.pop(_warm_key(index, env), None)
        if proc is None or proc.exited:
            return None
        proc.replaces = old
        if proc.addr is not None:  # ready: tell it now; not ready: when it says it is
            self._assign(sid, proc, proc.addr)
        log.info("a warm proc replaces a lost one", proc=proc.id, replaces=old, index=index)
        return proc

    def _assign(self, sid: str, proc: _Proc, addr: str) -> None:
        """Tell warm proc `proc` (at `addr`) which proc it replaces; until it acknowledges, its
        address stays unknown, so the respawn waits for the acknowledgement."""
        proc.addr = None
        self._send(addr, wire.encode(Kind.HOST_REP, {"sid": sid, "st": "assigned", "old": proc.replaces}))

    def _warm_ready(self, proc: _Proc, meta: dict) -> bool:
        """A PROC_READY from `proc`: True if it may count as ready. A warm proc assigned to a
        respawn counts only once it acknowledges the assignment."""
        if proc.replaces is None or meta.get("old") == proc.replaces:
            return True
        self._assign(meta["sid"], proc, meta["addr"])  # it became ready after it was taken
        return False

    def _forget_warm(self, state: _SessionState, proc: _Proc) -> None:
        for key, p in list(state.warm.items()):
            if p is proc:
                del state.warm[key]

    @staticmethod
    def _warm_unassigned(meta: dict) -> bool:
        """An adoption claim from a warm proc no respawn took: a successor stops it."""
        return meta.get("warm") is True and not isinstance(meta.get("old"), str)

