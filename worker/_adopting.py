"""The host agent's side of adoption: procs whose agent died ask a successor to supervise
them (PROC_ADOPT). It checks each claim against the kernel, rebuilds the spawn records the
procs name, and holds unknown spawn requests until the procs have had time to adopt it."""

from __future__ import annotations

import os
import time

import structlog

from regent import wire
from regent.wire import Kind, ProtocolError
from regent.wire.transport import valid_address
from regent.worker import procinfo
from regent.worker._hoststate import (
    _env_at,
    _Proc,
    _RequestIdentity,
    _SessionState,
    _spawn_origin,
    _SpawnRequest,
)

log = structlog.get_logger("regent.host")

# A restarted agent holds spawn requests this long (and 1 s past the latest adoption), so
# a replayed request finds the procs it once started adopted, instead of starting more.
ADOPT_GRACE_S = 5.0


class _Adoption:
    """Mixed into HostAgent, whose sessions, sockets and proc control these methods use."""

    adopt_until: float  # monotonic time the grace period ends; 0.0 for an agent that succeeds none
    deferred: list[dict]  # spawn requests held while procs adopt this agent

    def _adopting(self) -> bool:
        return time.monotonic() < self.adopt_until

    def _unknown_request(self, state: _SessionState, op: str, meta: dict) -> bool:
        """A spawn this agent has no record of: maybe one whose procs have yet to adopt."""
        if op == "spawn_procs":
            seq = meta.get("s")
            return not isinstance(seq, int) or (seq, meta.get("o") or "") not in state.spawns
        old = meta.get("old")
        # One that died under this agent was alive when the old agent died: not replaced by it.
        return not isinstance(old, str) or old not in state.respawns and old not in state.exited_ids

    def _on_adopt(self, meta: dict) -> None:
        """A proc whose agent died asks this one to supervise it. The claim is checked against
        the kernel (its pidfd, its command line) before this agent will ever signal that pid."""
        sid, proc_id, index, pid, addr = (meta["sid"], meta["id"], meta["idx"], meta["pid"],
                                          meta["addr"])  # wire.schema.ProcAdopt
        if not valid_address(addr):
            raise ProtocolError(f"adoption request without a valid proc address: {addr!r}")
        n = meta.get("n")
        state = self.sessions.get(sid)
        known = state.procs.get(proc_id) if state else None
        if known is not None:  # a retry, or our own child
            self._send(addr, wire.encode(Kind.HOST_REP, self._adopted_meta(sid, n, "ok")))
            return
        try:
            pidfd = os.pidfd_open(pid)
        except (ProcessLookupError, ValueError, OSError) as e:
            raise ProtocolError(f"adoption request for pid {pid}, which is not running: {e}") from None
        if procinfo.proc_info(pid) != procinfo.ProcInfo(pid, sid, proc_id, index):
            os.close(pidfd)
            raise ProtocolError(f"adoption request for pid {pid}, which is not proc {proc_id} of {sid}")
        proc = _Proc(proc_id, index, pid, pidfd, addr=addr)
        if self._warm_unassigned(meta):  # a cache this agent did not fill: the next warm_procs refills it
            log.info("stopping a warm proc that no respawn took", session=sid, proc=proc_id, pid=pid)
            self._send(addr, wire.encode(Kind.HOST_REP, self._adopted_meta(sid, n, "stopped")))
            self._terminate([proc])
            return
        if sid in self.stopped or (state is not None and proc_id in state.stopped_ids):
            log.info("stopping a proc whose session was stopped while it had no host agent",
                     session=sid, proc=proc_id, pid=pid)
            self._send(addr, wire.encode(Kind.HOST_REP, self._adopted_meta(sid, n, "stopped")))
            self._terminate([proc])
            return
        if state is None:
            state = self._session(sid)
            orphan = meta.get("orphan_s")
            if isinstance(orphan, int | float) and not isinstance(orphan, bool) and orphan > 0:
                state.orphan_timeout_s = float(orphan)
        seen = meta.get("e")  # the highest epoch the proc has seen: the fence is at least that
        if isinstance(seen, int) and not isinstance(seen, bool) and seen >= 0:
            self._admit_epoch(sid, state, seen)
        state.procs[proc_id] = proc
        state.next_index = max(state.next_index, index + 1)
        self.by_pidfd[pidfd] = (sid, proc)
        self._claim(state, sid, proc, meta)
        if self._adopting():
            self.adopt_until = max(self.adopt_until, time.monotonic() + 1.0)
        self._send(addr, wire.encode(Kind.HOST_REP, self._adopted_meta(sid, n, "ok")))
        log.info("proc adopted", session=sid, proc=proc_id, pid=pid)

    def _adopted_meta(self, sid: str, n: object, status: str) -> dict:
        state = self.sessions.get(sid)
        meta = {"sid": sid, "n": n, "st": status, "pid": os.getpid(), "at": self.inbox.address}
        if state is not None:
            meta["e"] = state.fence.epoch  # the proc raises its own fence to it
        return meta

    def _claim(self, state: _SessionState, sid: str, proc: _Proc, meta: dict) -> None:
        """Rebuild the record of the request that started an adopted proc, so the same request
        sent again (a replaying controller) is answered with the same procs."""
        old = meta.get("old")
        if isinstance(old, str):
            identity = _RequestIdentity("respawn_proc", 1, proc.index, None)
            req = state.respawns.setdefault(old, _SpawnRequest(sid, -1, identity, [], [], time.monotonic(), 1,
                                                               proc.index))
        else:
            seq, size, pos, digest = meta.get("s"), meta.get("size"), meta.get("pos"), meta.get("d")
            origin = meta.get("o") or ""
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (seq, size, pos)) \
                    or not 0 <= pos < size <= 1024 or not (digest is None or isinstance(digest, bytes)) \
                    or not isinstance(origin, str):
                return  # started by hand, or by an agent that did not say: nothing to dedupe
            req = state.spawns.get((seq, origin))
            if req is None:
                identity = _RequestIdentity("spawn_procs", size, -1, digest)
                req = state.spawns[(seq, origin)] = _SpawnRequest(sid, seq, identity, [], [], time.monotonic(),
                                                                  size, proc.index - pos, origin=origin)
            elif req.identity != _RequestIdentity("spawn_procs", size, -1, digest):
                log.warning("an adopted proc names a spawn this agent knows otherwise; not counted as its proc",
                            session=sid, proc=proc.id, seq=seq)
                return
            state.next_index = max(state.next_index, req.first + req.size)
        if req.answered is None and len(req.procs) < req.size:
            req.procs.append(proc)
            if req.complete():
                self._answer_spawn(req, "ok")

    def _after_adoption(self) -> None:
        """Once the grace period is over: requests held meanwhile run, and procs of a replayed
        spawn that never adopted (they died with the old agent) are started afresh."""
        if self._adopting():
            return
        deferred, self.deferred = self.deferred, []
        for meta in deferred:
            try:
                self._dispatch(Kind.HOST_REQ, meta)
            except ProtocolError as e:
                log.warning("dropped malformed request", op=meta.get("op"), error=str(e))
        for sid, state in list(self.sessions.items()):
            for req in state.spawns.values():
                if req.answered is None and req.refill is not None and len(req.procs) < req.size:
                    envs, path = req.refill
                    req.refill = None
                    have = {p.index - req.first for p in req.procs}
                    for pos in range(req.size):
                        if pos not in have:
                            req.procs.append(self._start_proc(
                                sid, state, req.first + pos, _env_at(envs, pos), path,
                                _spawn_origin(req.seq, req.identity, pos, req.origin)))
                    req.started = time.monotonic()
