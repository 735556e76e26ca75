"""The host agent: one per machine, owner of the procs that run there.

It spawns procs on a controller's request (deduped by call id, so a replaying
controller gets the same procs back), watches them through pidfds, reports deaths
to the session's controllers, and stops a session's procs when told to. Procs are
its children, never the controller's, so they outlive a controller crash.

The agent can die too. Its procs then start a new one, which binds the dead agent's
address and adopts them (PROC_ADOPT, worker/_adopting.py): from then on it watches,
reports and stops them as its own, OTP-style. What it knows comes from its procs, except
each session's epoch fence, which it also keeps on disk ($REGENT_HOME/fences): a successor
refuses a deposed controller from its first message, before any proc has adopted it
(DESIGN invariant 9).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
import zmq

from regent import wire
from regent.hipcore.ports import free_port, listen_port
from regent.wire import Kind, ProtocolError, bulk, schema, split_batch
from regent.wire.security import load_credentials, regent_home, stop_authenticator
from regent.wire.transport import RECEIVER_MAX_PEERS, Inbox, Outbox, context, peer_of, valid_address
from regent.worker import discovery
from regent.worker._adopting import ADOPT_GRACE_S, _Adoption
from regent.worker._forking import _Forking
from regent.worker._hoststate import (
    _Proc,
    _SessionState,
)
from regent.worker._relay import Relay
from regent.worker._spawning import _Spawning
from regent.worker._warm import _WarmPool
from regent.worker.fencing import EpochFence, FenceStore

log = structlog.get_logger("regent.host")

SWEEP_EVERY_S = 5.0

SOCKETS_PER_HOLLOW_PROC = 16  # its inbox and the peers it answers, in the agent's zmq context
STOP_GRACE_S = 3.0
# How long the serve loop sleeps with nothing to read: short while a spawn is under way (its
# timeouts, procs adopting, requests held for a zygote), long when only housekeeping is due
# (orphans, the /dev/shm sweep), so an idle agent wakes once a second, not five times.
BUSY_TICK_MS = 200
IDLE_TICK_MS = 1000
STOPPED_SESSIONS_KEPT = 4096


class HostAgent(_Adoption, _WarmPool, _Forking, _Spawning):
    """One machine's host agent. `succeeds` is the host.json record of a dead agent whose
    address (if still free) and procs this one takes over. `fences`: where each session's
    epoch fence is kept (default $REGENT_HOME/fences), so a successor starts from it."""

    def __init__(self, bind_host: str = "127.0.0.1", port: int = 0, idle_exit_s: float = 60.0,
                 succeeds: dict | None = None, fences: FenceStore | None = None, advertise: str | None = None,
                 hollow: int = 0):
        self.ctx = context(hollow * SOCKETS_PER_HOLLOW_PROC)
        self.creds = load_credentials()
        self.advertise = advertise or bind_host
        self.inbox = self._bind(bind_host, port, succeeds)
        self.outbox = Outbox(self.ctx, self.creds, max_peers=RECEIVER_MAX_PEERS)
        self.relay = Relay(self.outbox, self.inbox.max_message)  # casts to this host's procs, answers back
        self.bind_host = bind_host
        self.idle_exit_s = idle_exit_s
        self.sessions: dict[str, _SessionState] = {}
        self.fences = fences or FenceStore(regent_home() / "fences")
        self.stopped: dict[str, None] = {}  # sessions stopped by their controller, oldest first
        self.by_pidfd: dict[int, tuple[str, _Proc]] = {}
        self.last_activity = time.monotonic()
        self.running = True
        previous_id = (succeeds or {}).get("host")
        self.host_id = previous_id if isinstance(previous_id, str) and previous_id.isalnum() else uuid.uuid4().hex[:8]
        # A dead hollow agent's procs died with it: none will come to be adopted.
        self.adopt_until = time.monotonic() + ADOPT_GRACE_S if succeeds and not hollow else 0.0
        self.deferred: list[dict] = []  # spawn requests held while procs adopt this agent
        self.hollow = None  # with --hollow K, the procs served inside this process (worker/hollow.py)
        if hollow:
            from regent.worker.hollow import HollowProcs

            self.hollow = HollowProcs(hollow, self.ctx)
        self.next_sweep = 0.0
        self._init_forking(not hollow)  # procs forked from zygotes unless REGENT_FORK=0 (worker/_forking.py)

    def _bind(self, bind_host: str, port: int, succeeds: dict | None) -> Inbox:
        """The inbox, at the dead predecessor's address when free: controllers and journals
        name a host agent by address, so a successor there is the same agent to them."""
        if not port and succeeds:
            host, _, old_port = str(succeeds.get("address", "")).removeprefix("tcp://").rpartition(":")
            if host == self.advertise and old_port.isdigit():
                try:
                    return Inbox(self.ctx, self.creds, bind_host, int(old_port), self.advertise)
                except zmq.ZMQError as e:
                    log.warning("cannot take over the dead host agent's address; controllers that "
                                "knew it will not find this agent", address=succeeds["address"], error=str(e))
        if port:
            return Inbox(self.ctx, self.creds, bind_host, port, self.advertise)
        # Below the ephemeral range, where no outgoing connection can take the port once this
        # agent is gone: its successor binds the same address.
        for _ in range(3):
            try:
                return Inbox(self.ctx, self.creds, bind_host, listen_port(bind_host), self.advertise)
            except zmq.ZMQError:  # bound by another process since it was found free
                continue
        return Inbox(self.ctx, self.creds, bind_host, 0, self.advertise)

    # --- main loop ---------------------------------------------------------------

    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # SIGTERM ends the loop's wait at once

        def stop(*_: object) -> None:
            self.running = False
            try:
                os.write(wake_w, b"x")
            except OSError:  # the pipe is full: a wake is already pending
                pass

        signal.signal(signal.SIGTERM, stop)
        try:
            self._serve(wake_r)
        finally:
            os.close(wake_r)
            os.close(wake_w)

    def _serve(self, wake: int) -> None:
        while self.running:
            poller = zmq.Poller()
            poller.register(self.inbox.sock, zmq.POLLIN)
            poller.register(wake, zmq.POLLIN)
            for fd in self.by_pidfd:
                poller.register(fd, zmq.POLLIN)
            zygotes = self._zygote_fds()
            for fd in zygotes:
                poller.register(fd, zmq.POLLIN)
            tick = 2 if self.relay.backlogged else BUSY_TICK_MS if self._spawning() else IDLE_TICK_MS
            if (hold := self.relay.hold_s()) is not None:  # answers gathered go out by then
                tick = min(tick, math.ceil(hold * 1000))
            for sock_or_fd, _ in poller.poll(tick):
                if sock_or_fd is self.inbox.sock:
                    self._drain_inbox()
                elif sock_or_fd in self.by_pidfd:  # not stopped meanwhile by a request
                    self._reap(sock_or_fd)
                elif sock_or_fd in zygotes:
                    zygotes[sock_or_fd].pump()
            self._release_held()
            if self.relay.hold_s() == 0.0:  # answers held GATHER_S and not yet sent
                self.relay.release()
            if self.relay.backlogged:
                self.relay.retry()
            self._after_adoption()
            self._check_spawn_timeouts()
            self._stop_orphans()
            if time.monotonic() >= self.next_sweep:  # large frames a dead process left in /dev/shm
                self.next_sweep = time.monotonic() + SWEEP_EVERY_S
                if swept := bulk.sweep():
                    log.info("removed shared-memory segments of dead processes", segments=swept)
            if self._idle():
                log.info("host agent idle, exiting", idle_s=self.idle_exit_s)
                break
        self.shutdown()

    def _spawning(self) -> bool:
        """Whether a spawn is under way: requests held for a zygote or for procs to adopt this
        agent, or procs asked for and not yet all answered for."""
        return bool(self.held or self.deferred) or self._adopting() or any(
            req.answered is None for state in self.sessions.values() for req in state.requests())

    def _idle(self) -> bool:
        if any(s.procs for s in self.sessions.values()):
            self.last_activity = time.monotonic()
            return False
        return time.monotonic() - self.last_activity > self.idle_exit_s

    def shutdown(self) -> None:
        for sid in list(self.sessions):
            self._stop_session(sid)
        self._close_forks()
        bulk.sweep(grace_s=0.0)  # no agent may be left to sweep what a killed proc left in /dev/shm
        if self.hollow is not None:
            self.hollow.shutdown()
        self.inbox.close()
        self.outbox.close()
        stop_authenticator(self.ctx)
        self.ctx.destroy(linger=0)

    def _drain_inbox(self) -> None:
        for frames in self.inbox.pending():
            self.last_activity = time.monotonic()
            try:
                kind, meta, payload = schema.HOST.decode(frames)
                subs = split_batch(meta, payload) if kind is Kind.BATCH else None
            except ProtocolError as e:
                _dropped(frames[0], e)
                continue
            if subs is None:
                self._take(frames[0], kind, meta, payload)
            for sub in subs or ():  # each as if it had come alone: one bad spoils no other
                try:
                    self._take(frames[0], *schema.HOST.decode_one(sub))
                except ProtocolError as e:
                    _dropped(frames[0], e)
        self.relay.flush()

    def _take(self, head: Any, kind: Kind, meta: dict, payload: list) -> None:
        """One message: relayed on, or acted on. `head`: its (batch's) first frame, for the peer."""
        try:
            if kind is Kind.RELAY:
                if not payload:
                    raise ProtocolError("a relayed message without frames")
                self.relay.take(meta["to"], payload)
            else:
                self._dispatch(kind, meta)
        except ProtocolError as e:
            _dropped(head, e)
        except Exception:
            log.exception("dropped message that failed to dispatch", peer=peer_of(head))

    def _dispatch(self, kind: Kind, meta: dict) -> None:
        if kind is Kind.PROC_READY:
            self._on_ready(meta)
            return
        if kind is Kind.PROC_ADOPT:
            self._on_adopt(meta)
            return
        rt = meta.get("rt")
        if not valid_address(rt):
            raise ProtocolError(f"request without a valid reply address: {rt!r}")
        if kind is Kind.PING:
            self._send(rt, wire.encode(Kind.PONG, {"n": meta.get("n"), "pid": os.getpid(), "host": self.host_id}))
            return
        if kind is not Kind.HOST_REQ:
            raise ProtocolError(f"a host agent does not accept {kind.name}")
        sid, epoch, op = meta["sid"], meta["e"], meta["op"]  # wire.schema.HostRequest
        n = meta.get("n")
        if sid in self.stopped and sid not in self.sessions:
            # Its controller ended it here: nothing to report, nothing to start again.
            if op in ("spawn_procs", "respawn_proc"):
                self._send(rt, wire.encode(Kind.HOST_REP, {
                    "sid": sid, "n": n, "st": "err", "s": meta.get("s"),
                    "em": f"session {sid} was stopped on this host; a new run gets a new session id"}))
            else:
                self._reply(rt, sid, n, procs=[])
            return
        state = self._session(sid)
        if not self._admit_epoch(sid, state, epoch):
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
            # complete: every live proc of the session on this host is listed, so the
            # controller may take one that is missing for dead (it died with an old agent).
            self._reply(rt, sid, n, procs=self._proc_list(state), at=self.inbox.address,
                        complete=not self._adopting(), rl=True)
            for event in state.undelivered:
                self._send(rt, wire.encode(Kind.HOST_EVENT, event))
            state.undelivered = []
        elif op in ("spawn_procs", "respawn_proc"):
            if not meta.get("o"):  # an actor's spawn does not make its proc a subscriber to events
                state.controllers.add(rt)
            if self._adopting() and self._unknown_request(state, op, meta):
                self.deferred.append(meta)
            elif op == "spawn_procs":
                self._on_spawn(sid, state, meta, rt)
            else:
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
        elif op == "free_port":  # a process group's new rendezvous, served by a proc of this host
            self._reply(rt, sid, n, port=free_port(self.advertise))
        elif op == "warm_procs":  # a spare keeps procs started for a lost host's (worker/_warm.py)
            self._on_warm(sid, state, meta, rt)
        else:
            raise ProtocolError(f"unknown host op {op!r}")

    def _session(self, sid: str) -> _SessionState:
        """A session's state, created with the fence a dead predecessor left on disk."""
        state = self.sessions.get(sid)
        if state is None:
            state = self.sessions[sid] = _SessionState(fence=EpochFence(self.fences.load(sid)))
        return state

    def _admit_epoch(self, sid: str, state: _SessionState, epoch: int) -> bool:
        """The fence's verdict on `epoch`; a raised fence is on disk before anything acts on it."""
        before = state.fence.epoch
        if not state.fence.admit(epoch):
            return False
        if state.fence.epoch > before:
            try:
                self.fences.save(sid, state.fence.epoch, keep=set(self.sessions))
            except OSError as e:
                # Availability over a lost fence: the procs still carry the epoch they saw.
                log.error("cannot keep the session's epoch fence on disk; an agent restarted after this "
                          "one dies may accept a deposed controller until procs adopt it (check "
                          "$REGENT_HOME/fences: space, permissions)", session=sid, epoch=state.fence.epoch,
                          error=str(e))
        return True

    def _reply(self, rt: str, sid: str, n: object, **extra: object) -> None:
        self._send(rt, wire.encode(Kind.HOST_REP, {"sid": sid, "n": n, "st": "ok", **extra}))

    def _send(self, rt: str, msg: list) -> None:
        self.relay.release()  # what procs said through this agent goes first (a proc's answers before its death)
        try:
            sent = self.outbox.peer(rt).try_send(msg)
        except ProtocolError as e:  # an address zmq will not connect to, though it looked valid
            log.warning("reply not sent", peer=rt, error=str(e))
            return
        if not sent:
            log.warning("controller inbox full, reply dropped", peer=rt)

    # --- procs -------------------------------------------------------------------

    def _proc_list(self, state: _SessionState) -> list[dict]:
        return [
            {"id": p.id, "idx": p.index, "addr": p.addr, "pid": p.pid, "alive": not p.exited}
            for p in sorted(state.procs.values(), key=lambda p: p.index)
        ]

    def _stop_orphans(self) -> None:
        """A session no controller has contacted for its orphan timeout holds resources for
        nobody: stop its procs. Failovers are far shorter than the timeout."""
        now = time.monotonic()
        for sid, state in list(self.sessions.items()):
            if any(req.answered is None for req in state.requests()):
                # A controller waits for this agent's answer to a spawn (procs still starting,
                # slowly on a loaded machine): its silence until then is this agent's doing.
                state.last_contact = now
                continue
            if state.procs and now - state.last_contact > state.orphan_timeout_s:
                log.warning("no controller contacted this session; stopping its procs as orphans",
                            session=sid, silent_s=round(now - state.last_contact, 1))
                self._stop_session(sid, by_controller=False)

    def _reap(self, pidfd: int) -> None:
        sid, proc = self.by_pidfd[pidfd]
        if not proc.wait(0):  # the fd was closed and reused since the poll: a live proc
            return
        del self.by_pidfd[pidfd]
        os.close(pidfd)
        log.info("proc exited", session=sid, proc=proc.id, status=proc.status_text())
        state = self.sessions.get(sid)
        if state is None:
            return
        # status None: the proc was adopted, so only init learns how it ended.
        event = {"sid": sid, "ev": "proc_died", "id": proc.id, "idx": proc.index, "status": proc.exit_status}
        if state.controllers:
            for rt in state.controllers:
                self._send(rt, wire.encode(Kind.HOST_EVENT, event))
        else:  # a restarted agent has heard from no controller yet: the next hello gets it
            state.undelivered.append(event)
        state.procs.pop(proc.id, None)
        if proc.addr:
            self.relay.forget(proc.addr)
        state.exited_ids.add(proc.id)
        self._forget_warm(state, proc)

    def _stop_procs(self, state: _SessionState, ids: list[str]) -> None:
        """Stop some of a session's procs (SIGTERM, then SIGKILL after the grace period)."""
        state.stopped_ids.update(ids)  # one that has yet to adopt is stopped when it does
        self._terminate([p for i in ids if (p := state.procs.pop(i, None)) is not None and not p.exited])

    def _stop_session(self, sid: str, by_controller: bool = True) -> None:
        if by_controller:  # procs of it that adopt later (after an agent restart) are stopped then
            self.stopped[sid] = None
            while len(self.stopped) > STOPPED_SESSIONS_KEPT:
                del self.stopped[next(iter(self.stopped))]
        state = self.sessions.pop(sid, None)
        if state is None:
            return
        live = [p for p in state.procs.values() if not p.exited]
        self._terminate(live)
        log.info("session stopped", session=sid, procs=len(live))

    def _terminate(self, live: list[_Proc]) -> None:
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in live:
            if not p.wait(deadline - time.monotonic()):
                p.send_signal(signal.SIGKILL)
                if not p.wait(10.0):
                    log.error("proc did not exit 10 s after SIGKILL", proc=p.id, pid=p.pid)
            self.by_pidfd.pop(p.pidfd, None)
            os.close(p.pidfd)


def _dropped(head: Any, e: ProtocolError) -> None:
    log.warning("dropped malformed message", peer=peer_of(head), error=str(e))


def daemonize(log_path: str | None) -> None:
    """Fork into the background (a new session, never the caller's child), output to `log_path`."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    fd = os.open(log_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    nul = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nul, 0)


def serve_agent(bind_host: str = "127.0.0.1", port: int = 0, idle_exit_s: float = 60.0,
                advertise: str | None = None,
                on_serving: Callable[[HostAgent], Callable[[], None]] | None = None, hollow: int = 0,
                metrics: str | None = None) -> None:
    """Run this machine's agent until it is stopped (SIGTERM) or idle: it takes over from a
    dead predecessor named by the host file, publishes itself there, and withdraws at the
    end. `on_serving(agent)` runs once it is bound (a cluster agent registers in the store
    there) and returns what to call when it stops. `metrics`: where to serve /metrics
    (worker/metrics.py; None: off, whatever the environment says, since a controller's
    $REGENT_METRICS_ADDR is its own and reaches the agents it starts)."""
    from regent.worker.logsetup import configure_logging
    from regent.worker.metrics import agent_registry, serve_metrics

    configure_logging()
    previous = discovery.host_record()
    if previous is not None and discovery.live_host_record() is not None:
        previous = None  # a live agent: nothing to take over
    agent = HostAgent(bind_host, port, idle_exit_s, succeeds=previous, advertise=advertise, hollow=hollow)
    discovery.publish(agent.inbox.address, agent.host_id)
    if previous is not None:
        log.warning("host agent restarted in place of a dead one; its procs will adopt this one",
                    address=agent.inbox.address, pid=os.getpid(), dead_pid=previous["pid"],
                    same_address=agent.inbox.address == previous["address"])
    else:
        log.info("host agent serving", address=agent.inbox.address, pid=os.getpid())
    try:
        stop = on_serving(agent) if on_serving is not None else None
    except BaseException:
        discovery.withdraw()  # refused (a live agent holds its name): it never served
        raise
    exporter = serve_metrics(agent_registry(agent, hollow > 0), metrics or "", "host agent")
    gc.freeze()  # what the agent imported and built lives as long as it: out of its collections' scans
    try:
        agent.serve()
    finally:
        try:
            if stop is not None:
                stop()
        finally:
            discovery.withdraw()
            if exporter is not None:
                exporter.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="regent host", description="Run this machine's regent host agent.")
    p.add_argument("--bind-host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--idle-exit", type=float, default=float(os.environ.get("REGENT_HOST_IDLE_EXIT_S", "60")))
    p.add_argument("--daemonize", action="store_true", help="fork into the background and return at once")
    p.add_argument("--log", default=None, help="log file (with --daemonize)")
    p.add_argument("--metrics", default=None, metavar="ADDR", help="serve Prometheus /metrics at PORT or HOST:PORT")
    a = p.parse_args(argv)
    if a.daemonize:
        daemonize(a.log)
    serve_agent(a.bind_host, a.port, a.idle_exit, metrics=a.metrics)


if __name__ == "__main__":
    main()
