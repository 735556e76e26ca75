"""The host agent's spawns: a controller's spawn_procs (deduped by call id and origin, so a
replaying controller gets the same procs back), a supervisor's replacement of a dead proc, each
answered once its procs said they are ready, or failed when one died starting or the wait ran
out."""

from __future__ import annotations

import os
import time
import uuid

import structlog

from regent import wire
from regent.wire import Kind, ProtocolError
from regent.wire.transport import valid_address
from regent.worker._forking import _bound_env, _proc_env
from regent.worker._hoststate import (
    _env_at,
    _Proc,
    _RequestIdentity,
    _SessionState,
    _spawn_origin,
    _SpawnRequest,
)

log = structlog.get_logger("regent.host")

PROC_START_TIMEOUT_S = 60.0


class _Spawning:
    """Mixed into HostAgent, whose sessions, sockets, launcher and warm pool these methods use."""

    def _on_spawn(self, sid: str, state: _SessionState, meta: dict, rt: str) -> None:
        seq = wire.require(meta, "s", int)
        count = wire.require(meta, "count", int)
        if not 0 < count <= 1024:
            raise ProtocolError(f"spawn_procs count {count} out of range")
        envs = meta.get("envs") or [{}] * count
        if not isinstance(envs, list) or not all(isinstance(e, dict) for e in envs):
            raise ProtocolError("spawn_procs envs is not a list of maps")
        path = meta.get("path") or []
        digest = meta.get("d")
        if digest is not None and (not isinstance(digest, bytes) or len(digest) > 64):
            raise ProtocolError("spawn_procs digest 'd' is not bytes of at most 64")
        origin = meta.get("o") or ""
        if not isinstance(origin, str):
            raise ProtocolError("spawn_procs origin 'o' is not a string")
        identity = _RequestIdentity("spawn_procs", count, -1, digest)
        req = state.spawns.get((seq, origin))
        if req is not None:  # a replaying controller asks again: same procs
            if not self._same_request(rt, sid, meta.get("n"), req, identity):
                return
            if req.answered is not None:
                self._send(rt, wire.encode(Kind.HOST_REP, {**req.answered, "n": meta.get("n")}))
            else:
                req.waiters.append((rt, meta.get("n")))
                if len(req.procs) < req.size:  # adopted in part: the rest died with the old agent
                    req.refill = (envs, path)
            return
        # A full hollow host, or a device binding this host cannot give, fails the request
        # before any proc starts.
        why = self.hollow.refusal(count, envs[:count]) if self.hollow is not None else None
        if why is None:
            try:
                for e in envs[:count]:
                    _bound_env({**os.environ, **{k: str(v) for k, v in e.items() if isinstance(k, str)}})
            except ValueError as e:
                why = f"cannot bind procs to devices on this host: {e}"
        if why is not None:
            self._send(rt, wire.encode(Kind.HOST_REP, {"sid": sid, "n": meta.get("n"), "st": "err", "s": seq,
                                                       "em": why}))
            return
        preload = tuple(m for m in meta.get("preload") or [] if isinstance(m, str))
        if self._hold_for_zygote(meta, _proc_env(_env_at(envs, 0), path), preload):
            return  # its zygote is still importing: dispatched again once it is ready
        first = state.next_index
        procs = [self._start_proc(sid, state, first + i, _env_at(envs, i), path,
                                  _spawn_origin(seq, identity, i, origin), preload) for i in range(count)]
        state.spawns[(seq, origin)] = _SpawnRequest(sid, seq, identity, procs, [(rt, meta.get("n"))],
                                                    time.monotonic(), count, first, origin=origin)

    def _same_request(self, rt: str, sid: str, n: object, req: _SpawnRequest, identity: _RequestIdentity) -> bool:
        """Whether a request under a known key is the one recorded there; if not, it is
        answered as a divergence and nothing is started or joined."""
        if req.identity == identity:
            return True
        key = f"call seq {req.seq}" if req.seq != -1 else "the replacement of that proc"
        log.warning("refused a host request that reuses a key for another request", session=sid,
                    first=req.identity.describe(), now=identity.describe())
        self._send(rt, wire.encode(Kind.HOST_REP, {
            "sid": sid, "n": n, "st": "divergence", "s": req.seq,
            "em": f"{key} was first asked as {req.identity.describe()} and now as {identity.describe()}: "
                  "the controller program is not deterministic (or two controllers disagree); "
                  "nothing was started again"}))
        return False

    def _start_proc(self, sid: str, state: _SessionState, index: int, extra_env: dict, path: list,
                    origin: list[str], preload: tuple[str, ...] = ()) -> _Proc:
        """Start a proc. `origin` (argv) names the request that started it, and with the agent's
        pid and the session's orphan timeout is what the proc tells a successor agent."""
        proc_id = f"{self.host_id}-{sid[:16]}-{index}-{uuid.uuid4().hex[:6]}"
        path = [p for p in path if isinstance(p, str)]
        argv = ["--session", sid, "--index", str(index), "--id", proc_id, "--host-inbox", self.inbox.address,
                "--bind-host", self.bind_host, "--advertise", self.advertise, "--orphan-s",
                repr(state.orphan_timeout_s), "--epoch", str(state.fence.epoch), *origin]
        if self.hollow is not None:
            proc: _Proc = self.hollow.start(proc_id, index, argv, path, extra_env)
        else:
            argv += ["--host-pid", str(os.getpid())]
            proc = self._launch(proc_id, index, argv, _proc_env(extra_env, path), preload)
        state.procs[proc_id] = proc
        state.next_index = max(state.next_index, index + 1)
        self.by_pidfd[proc.pidfd] = (sid, proc)
        log.info("proc started", session=sid, proc=proc_id, pid=proc.pid, hollow=self.hollow is not None)
        return proc

    def _on_ready(self, meta: dict) -> None:
        sid, proc_id, addr = meta["sid"], meta["id"], meta["addr"]  # wire.schema.ProcReady
        state = self.sessions.get(sid)
        proc = state.procs.get(proc_id) if state else None
        if proc is None or not valid_address(addr):
            raise ProtocolError(f"ready from unknown proc {proc_id!r}")
        if not self._warm_ready(proc, meta):
            return
        proc.addr = addr
        for req in state.requests():
            if req.answered is None and req.complete():
                self._answer_spawn(req, "ok")

    def _answer_spawn(self, req: _SpawnRequest, status: str, error: str = "") -> None:
        req.answered = {
            "sid": req.sid, "st": status, "em": error, "s": req.seq, "rl": True,
            "procs": [{"id": p.id, "idx": p.index, "addr": p.addr, "pid": p.pid}
                      for p in sorted(req.procs, key=lambda p: p.index)],
        }
        for rt, n in req.waiters:
            self._send(rt, wire.encode(Kind.HOST_REP, {**req.answered, "n": n}))
        req.waiters = []

    def _on_respawn(self, sid: str, state: _SessionState, meta: dict, rt: str) -> None:
        """A supervisor replaces a dead proc: same index, fresh process, answered when ready."""
        old = wire.require(meta, "old", str)
        index = wire.require(meta, "idx", int)
        n = meta.get("n")
        identity = _RequestIdentity("respawn_proc", 1, index, None)
        req = state.respawns.get(old)
        if req is not None:
            if not self._same_request(rt, sid, n, req, identity):
                return
            if req.answered is not None:
                self._send(rt, wire.encode(Kind.HOST_REP, {**req.answered, "n": n}))
            else:
                req.waiters.append((rt, n))
            return
        env = meta.get("env") or {}
        if not isinstance(env, dict):
            raise ProtocolError("respawn_proc env is not a map")
        env = _env_at([env], 0)
        try:
            proc = self._take_warm(sid, state, index, env, old) or self._start_proc(
                sid, state, index, env, meta.get("path") or [], ["--replaces", old])
        except ValueError as e:  # a device binding this host cannot give, or a full hollow host
            self._send(rt, wire.encode(Kind.HOST_REP, {"sid": sid, "n": n, "st": "err", "s": -1,
                                                       "em": f"cannot start a proc on this host: {e}"}))
            return
        state.respawns[old] = _SpawnRequest(sid, -1, identity, [proc], [(rt, n)], time.monotonic(), 1, index)

    def _check_spawn_timeouts(self) -> None:
        now = time.monotonic()
        for state in self.sessions.values():
            for req in state.requests():
                if req.answered is None and len(req.procs) == req.size:
                    dead = [p for p in req.procs if p.exited]
                    if dead or now - req.started > PROC_START_TIMEOUT_S:
                        why = (f"proc {dead[0].id} exited with status {dead[0].status_text()} while starting"
                               if dead else f"procs did not start within {PROC_START_TIMEOUT_S:.0f} s")
                        self._answer_spawn(req, "err", why + " (see the host agent's log)")
                        self._forget_failed_respawn(state, req)

    @staticmethod
    def _forget_failed_respawn(state: _SessionState, req: _SpawnRequest) -> None:
        """A replacement that died while starting was never used by anyone: the next request to
        replace the same proc (the supervisor retrying, or a new leader) starts a fresh one
        rather than being answered with this failure for ever."""
        if req.seq == -1:
            for old, r in list(state.respawns.items()):
                if r is req:
                    del state.respawns[old]
