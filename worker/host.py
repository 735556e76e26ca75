"""The host agent: one per machine, owner of the procs that run there.

It spawns procs on a controller's request (deduped by call id, so a replaying
controller gets the same procs back), watches them through pidfds, reports deaths
to the session's controllers, and stops a session's procs when told to. Procs are
its children, never the controller's, so they outlive a controller crash.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import zmq

from worker import _wire as wire
from worker._wire import Kind
from worker.errors import ProtocolError
from worker.fencing import EpochFence
from worker.security import load_credentials, regent_home, stop_authenticator
from worker.transport import Inbox, Outbox, valid_address

log = structlog.get_logger("regent.host")

PROC_START_TIMEOUT_S = 60.0
STOP_GRACE_S = 3.0


@dataclass
class _Proc:
    id: str
    index: int
    popen: subprocess.Popen
    pidfd: int
    addr: str | None = None
    exit_status: int | None = None


@dataclass
class _SpawnRequest:
    sid: str
    seq: int
    procs: list[_Proc]
    waiters: list[tuple[str, object]]
    started: float
    answered: dict | None = None


@dataclass
class _SessionState:
    fence: EpochFence = field(default_factory=EpochFence)
    controllers: set[str] = field(default_factory=set)
    procs: dict[str, _Proc] = field(default_factory=dict)
    spawns: dict[int, _SpawnRequest] = field(default_factory=dict)
    last_contact: float = field(default_factory=time.monotonic)
    orphan_timeout_s: float = field(default_factory=lambda: float(os.environ.get("REGENT_ORPHAN_TIMEOUT_S", "300")))


class HostAgent:
    def __init__(self, bind_host: str = "127.0.0.1", port: int = 0, idle_exit_s: float = 60.0):
        self.ctx = zmq.Context()
        self.creds = load_credentials()
        self.inbox = Inbox(self.ctx, self.creds, bind_host, port)
        self.outbox = Outbox(self.ctx, self.creds)
        self.bind_host = bind_host
        self.idle_exit_s = idle_exit_s
        self.sessions: dict[str, _SessionState] = {}
        self.by_pidfd: dict[int, tuple[str, _Proc]] = {}
        self.last_activity = time.monotonic()
        self.running = True
        self.host_id = uuid.uuid4().hex[:8]

    # --- main loop ---------------------------------------------------------------

    def serve(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "running", False))
        while self.running:
            poller = zmq.Poller()
            poller.register(self.inbox.sock, zmq.POLLIN)
            for fd in self.by_pidfd:
                poller.register(fd, zmq.POLLIN)
            for sock_or_fd, _ in poller.poll(200):
                if sock_or_fd is self.inbox.sock:
                    self._drain_inbox()
                else:
                    self._reap(sock_or_fd)
            self._check_spawn_timeouts()
            self._stop_orphans()
            if self._idle():
                log.info("host agent idle, exiting", idle_s=self.idle_exit_s)
                break
        self.shutdown()

    def _idle(self) -> bool:
        if any(s.procs for s in self.sessions.values()):
            self.last_activity = time.monotonic()
            return False
        return time.monotonic() - self.last_activity > self.idle_exit_s

    def shutdown(self) -> None:
        for sid in list(self.sessions):
            self._stop_session(sid)
        self.inbox.close()
        self.outbox.close()
        stop_authenticator(self.ctx)
        self.ctx.destroy(linger=0)

    def _drain_inbox(self) -> None:
        for frames in self.inbox.pending():
            self.last_activity = time.monotonic()
            try:
                kind, meta, _ = wire.decode(frames)
                self._dispatch(kind, meta)
            except ProtocolError as e:
                log.warning("dropped malformed message", peer=_peer(frames[0]), error=str(e))
            except Exception:
                log.exception("dropped message that failed to dispatch")

    def _dispatch(self, kind: Kind, meta: dict) -> None:
        if kind is Kind.PROC_READY:
            self._on_ready(meta)
            return
        rt = meta.get("rt")
        if not valid_address(rt):
            raise ProtocolError(f"request without a valid reply address: {rt!r}")
        if kind is Kind.PING:
            self._send(rt, wire.encode(Kind.PONG, {"n": meta.get("n"), "pid": os.getpid(), "host": self.host_id}))
            return
        if kind is not Kind.HOST_REQ:
            raise ProtocolError(f"a host agent does not accept {kind.name}")
        sid = wire.require(meta, "sid", str)
        epoch = wire.require(meta, "e", int)
        op = wire.require(meta, "op", str)
        n = meta.get("n")
        state = self.sessions.setdefault(sid, _SessionState())
        if not state.fence.admit(epoch):
            self._send(rt, wire.encode(Kind.HOST_REP, {
                "sid": sid, "n": n, "st": "fenced", "e": state.fence.epoch,
                "em": f"epoch {epoch} is below {state.fence.epoch}: this controller was deposed"}))
            return
        state.last_contact = time.monotonic()
        orphan = meta.get("orphan_s")
        if isinstance(orphan, int | float) and orphan > 0:
            state.orphan_timeout_s = float(orphan)
        if op == "hello":
            # The newest controller of a session replaces the older ones as event subscriber.
            state.controllers = {rt}
            self._reply(rt, sid, n, procs=self._proc_list(state))
        elif op == "spawn_procs":
            state.controllers.add(rt)
            self._on_spawn(sid, state, meta, rt)
        elif op == "respawn_proc":
            self._on_respawn(sid, state, meta, rt)
        elif op == "stop_session":
            self._stop_session(sid)
            self._reply(rt, sid, n)
        elif op == "stop_procs":
            ids = meta.get("ids") or []
            self._stop_procs(state, [i for i in ids if isinstance(i, str)])
            self._reply(rt, sid, n)
        elif op == "list":
            self._reply(rt, sid, n, procs=self._proc_list(state))
        else:
            raise ProtocolError(f"unknown host op {op!r}")

    def _reply(self, rt: str, sid: str, n: object, **extra: object) -> None:
        self._send(rt, wire.encode(Kind.HOST_REP, {"sid": sid, "n": n, "st": "ok", **extra}))

    def _send(self, rt: str, msg: list) -> None:
        if not self.outbox.peer(rt).try_send(msg):
            log.warning("controller inbox full, reply dropped", peer=rt)

    # --- procs -------------------------------------------------------------------

    def _proc_list(self, state: _SessionState) -> list[dict]:
        return [
            {"id": p.id, "idx": p.index, "addr": p.addr, "pid": p.popen.pid, "alive": p.exit_status is None}
            for p in sorted(state.procs.values(), key=lambda p: p.index)
        ]

    def _on_spawn(self, sid: str, state: _SessionState, meta: dict, rt: str) -> None:
        seq = wire.require(meta, "s", int)
        count = wire.require(meta, "count", int)
        if not 0 < count <= 1024:
            raise ProtocolError(f"spawn_procs count {count} out of range")
        envs = meta.get("envs") or [{}] * count
        req = state.spawns.get(seq)
        if req is not None:  # a replaying controller asks again: same procs
            if req.answered is not None:
                self._send(rt, wire.encode(Kind.HOST_REP, {**req.answered, "n": meta.get("n")}))
            else:
                req.waiters.append((rt, meta.get("n")))
            return
        try:  # a device binding this host cannot give fails the request before any proc starts
            for e in envs[:count]:
                _bound_env({**os.environ, **{k: str(v) for k, v in e.items() if isinstance(k, str)}})
        except ValueError as e:
            self._send(rt, wire.encode(Kind.HOST_REP, {"sid": sid, "n": meta.get("n"), "st": "err", "s": seq,
                                                       "em": f"cannot bind procs to devices on this host: {e}"}))
            return
        first = len(state.procs)
        procs = []
        for i in range(count):
            env = {k: str(v) for k, v in (envs[i] if i < len(envs) else {}).items() if isinstance(k, str)}
            procs.append(self._start_proc(sid, state, first + i, env, meta.get("path") or []))
        state.spawns[seq] = _SpawnRequest(sid, seq, procs, [(rt, meta.get("n"))], time.monotonic())

    def _start_proc(self, sid: str, state: _SessionState, index: int, extra_env: dict, path: list) -> _Proc:
        proc_id = f"{self.host_id}-{sid[:16]}-{index}-{uuid.uuid4().hex[:6]}"
        env = _bound_env({**os.environ, **extra_env})
        pypath = [p for p in path if isinstance(p, str)] + env.get("PYTHONPATH", "").split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in pypath if p))
        popen = subprocess.Popen(
            [sys.executable, "-m", "worker.proc", "--session", sid, "--index", str(index),
             "--id", proc_id, "--host-inbox", self.inbox.address, "--bind-host", self.bind_host],
            env=env, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        pidfd = os.pidfd_open(popen.pid)
        proc = _Proc(proc_id, index, popen, pidfd)
        state.procs[proc_id] = proc
        self.by_pidfd[pidfd] = (sid, proc)
        log.info("proc started", session=sid, proc=proc_id, pid=popen.pid)
        return proc

    def _on_ready(self, meta: dict) -> None:
        sid = wire.require(meta, "sid", str)
        proc_id = wire.require(meta, "id", str)
        addr = meta.get("addr")
        state = self.sessions.get(sid)
        proc = state.procs.get(proc_id) if state else None
        if proc is None or not valid_address(addr):
            raise ProtocolError(f"ready from unknown proc {proc_id!r}")
        proc.addr = addr
        for req in state.spawns.values():
            if req.answered is None and all(p.addr for p in req.procs):
                self._answer_spawn(req, "ok")

    def _answer_spawn(self, req: _SpawnRequest, status: str, error: str = "") -> None:
        req.answered = {
            "sid": req.sid, "st": status, "em": error, "s": req.seq,
            "procs": [{"id": p.id, "idx": p.index, "addr": p.addr, "pid": p.popen.pid} for p in req.procs],
        }
        for rt, n in req.waiters:
            self._send(rt, wire.encode(Kind.HOST_REP, {**req.answered, "n": n}))
        req.waiters = []

    def _on_respawn(self, sid: str, state: _SessionState, meta: dict, rt: str) -> None:
        """A supervisor replaces a dead proc: same index, fresh process, answered when ready."""
        old = wire.require(meta, "old", str)
        n = meta.get("n")
        key = -abs(hash(("respawn", old))) - 1
        req = state.spawns.get(key)
        if req is not None:
            if req.answered is not None:
                self._send(rt, wire.encode(Kind.HOST_REP, {**req.answered, "n": n}))
            else:
                req.waiters.append((rt, n))
            return
        index = wire.require(meta, "idx", int)
        env = {k: str(v) for k, v in (meta.get("env") or {}).items() if isinstance(k, str)}
        proc = self._start_proc(sid, state, index, env, meta.get("path") or [])
        state.spawns[key] = _SpawnRequest(sid, key, [proc], [(rt, n)], time.monotonic())

    def _stop_orphans(self) -> None:
        """A session no controller has contacted for its orphan timeout holds resources for
        nobody: stop its procs. Failovers are far shorter than the timeout."""
        now = time.monotonic()
        for sid, state in list(self.sessions.items()):
            if state.procs and now - state.last_contact > state.orphan_timeout_s:
                log.warning("no controller contacted this session; stopping its procs as orphans",
                            session=sid, silent_s=round(now - state.last_contact, 1))
                self._stop_session(sid)

    def _check_spawn_timeouts(self) -> None:
        now = time.monotonic()
        for state in self.sessions.values():
            for req in state.spawns.values():
                if req.answered is None:
                    dead = [p for p in req.procs if p.exit_status is not None]
                    if dead or now - req.started > PROC_START_TIMEOUT_S:
                        why = (f"proc {dead[0].id} exited with status {dead[0].exit_status} while starting"
                               if dead else f"procs did not start within {PROC_START_TIMEOUT_S:.0f} s")
                        self._answer_spawn(req, "err", why + " (see the host agent's log)")

    def _reap(self, pidfd: int) -> None:
        sid, proc = self.by_pidfd.pop(pidfd)
        os.close(pidfd)
        proc.exit_status = proc.popen.wait()
        log.info("proc exited", session=sid, proc=proc.id, status=proc.exit_status)
        state = self.sessions.get(sid)
        if state is None:
            return
        event = wire.encode(Kind.HOST_EVENT, {
            "sid": sid, "ev": "proc_died", "id": proc.id, "idx": proc.index, "status": proc.exit_status})
        for rt in state.controllers:
            self._send(rt, event)
        state.procs.pop(proc.id, None)

    def _stop_procs(self, state: _SessionState, ids: list[str]) -> None:
        """Stop some of a session's procs (SIGTERM, then SIGKILL after the grace period)."""
        self._terminate([p for i in ids if (p := state.procs.pop(i, None)) is not None and p.exit_status is None])

    def _stop_session(self, sid: str) -> None:
        state = self.sessions.pop(sid, None)
        if state is None:
            return
        live = [p for p in state.procs.values() if p.exit_status is None]
        self._terminate(live)
        log.info("session stopped", session=sid, procs=len(live))

    def _terminate(self, live: list[_Proc]) -> None:
        for p in live:
            _signal(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in live:
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(p.popen, signal.SIGKILL)
                p.popen.wait()
            self.by_pidfd.pop(p.pidfd, None)
            os.close(p.pidfd)


def _bound_env(env: dict[str, str]) -> dict[str, str]:
    """A proc's environment with its device binding: proc i of a {"gpus": N} mesh sees GPU i
    of this host only (hipcore.binding, docs/hipcore.md). Other meshes are left unbound.
    Raises ValueError when this host cannot give the proc its GPU."""
    if env.get("REGENT_PROC_DIM") != "gpus":
        return env
    from hipcore import HipcoreError, backend, binding  # imported once a mesh asks for GPUs

    rank = env.get("REGENT_PROC_RANK", "")
    if not rank.isdigit():
        raise ValueError(f"REGENT_PROC_RANK={rank!r} is not a proc rank")
    try:
        info = backend()
    except HipcoreError as e:  # e.g. REGENT_HIPCORE_BACKEND forces a GPU backend this host lacks
        raise ValueError(str(e)) from e
    if info.is_gpu and binding.VISIBLE_DEVICES_ENV[info.name] not in env and int(rank) >= info.device_count:
        raise ValueError(f"proc {rank} needs GPU {rank}, but this host has {info.device_count} "
                         f"{info.name} GPU(s); spawn at most {info.device_count} procs per host")
    return binding.child_env(env, int(rank), 1)


def _signal(popen: subprocess.Popen, sig: int) -> None:
    try:
        popen.send_signal(sig)
    except ProcessLookupError:
        pass


def _peer(frame: object) -> str:
    try:
        return frame.get("Peer-Address")  # type: ignore[attr-defined]
    except Exception:
        return "?"


# --- finding or starting the local host agent ------------------------------------


def host_file() -> Path:
    return regent_home() / "host.json"


def _read_host_file() -> dict | None:
    try:
        info = json.loads(host_file().read_text())
        os.kill(int(info["pid"]), 0)
        return info
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure_local_host(timeout: float = 30.0) -> str:
    """Address of this machine's host agent, starting one (detached) if none runs."""
    info = _read_host_file()
    if info:
        return info["address"]
    lock_path = regent_home() / "host.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = _read_host_file()
        if info:
            return info["address"]
        log_path = regent_home() / "host.log"
        # The launcher forks the agent and exits at once, so the agent is never a
        # child of this (controller) process: SIGKILL of the controller spares it.
        subprocess.run(
            [sys.executable, "-m", "worker.host", "--daemonize", "--log", str(log_path)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            check=True, stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = _read_host_file()
            if info:
                return info["address"]
            time.sleep(0.02)
    raise RuntimeError(f"the host agent did not start within {timeout:.0f} s: see {log_path}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="regent host", description="Run this machine's regent host agent.")
    p.add_argument("--bind-host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--idle-exit", type=float, default=float(os.environ.get("REGENT_HOST_IDLE_EXIT_S", "60")))
    p.add_argument("--daemonize", action="store_true", help="fork into the background and return at once")
    p.add_argument("--log", default=None, help="log file (with --daemonize)")
    a = p.parse_args(argv)
    if a.daemonize:
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        fd = os.open(a.log or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, 0)
    from worker.logsetup import configure_logging

    configure_logging()
    agent = HostAgent(a.bind_host, a.port, a.idle_exit)
    tmp = host_file().with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "address": agent.inbox.address, "host": agent.host_id}))
    os.replace(tmp, host_file())
    log.info("host agent serving", address=agent.inbox.address, pid=os.getpid())
    try:
        agent.serve()
    finally:
        try:
            if json.loads(host_file().read_text()).get("pid") == os.getpid():
                host_file().unlink()
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    main()
