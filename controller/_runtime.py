"""The controller's IO edge: sockets and replies (host agent requests: _hosttable.py; who
reads the inbox, the IO thread among them: _reading.py; link monitors and resends: _links.py).

The program's thread queues calls on per-peer PUSH sockets (no hand-off on the call
path) and sends each peer's queue as one batch when the program blocks, a batch
fills, or it has waited BUSY_BATCH_AGE_S while the program issues calls (BATCH_MAX_AGE_S,
from the IO thread, once the program leaves it). The inbox is read, and
replies become core events, only by the thread holding the session's drive
(controller/drive.py): the program's thread while it waits for a result, the IO thread
while it does not. Nothing here decides what a call means; the engine does.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog
import zmq

from regent import wire
from regent.controller._groupblame import HeldGroupFailures
from regent.controller._hosttable import _HostTable
from regent.controller._links import _Links
from regent.controller._reading import TICK_S, _Reader
from regent.controller._standby import Transport
from regent.controller.core import ControllerCore, Outcome, PendingCall
from regent.controller.drive import Drive
from regent.controller.folding import expand
from regent.controller.futures import Future
from regent.controller.recorder import OutcomePort
from regent.controller.refs import ProcRef, ProcTable
from regent.wire import Kind, ProtocolError, bulk, schema
from regent.wire.protocol import MAX_BUFFERS
from regent.wire.transport import (
    Peer,
    PeerGone,
    peer_of,
    refuse_oversized_call,
    spin_budget_s,
)
from regent.worker.errors import GROUP_FAILED

log = structlog.get_logger("regent.controller")

WATERMARK_INTERVAL_S = TICK_S
# The release watermark is one message per proc: past this many procs a second it goes less
# often than every tick (workers then hold cached results a little longer), so at 4,096 procs
# it is not a dozen messages per proc for each mesh-wide call that takes two seconds.
WATERMARK_SENDS_PER_S = 2048
HOST_HELLO_INTERVAL_S = 1.0
# Each host agent answers a hello with its procs, which the controller checks (_reconcile): past
# this many hosts a second the hellos go less often than every second (at 512 agents, every
# 4 s): at 512 agents once a second, their answers were half of an idle controller's 0.1 core.
# Agents count a session orphaned after minutes without a hello; a proc that died unreported
# is found a few seconds later.
HOST_HELLO_SENDS_PER_S = 128


class Runtime(_HostTable, _Links, _Reader):
    def __init__(self, session: str, epoch: int, core: ControllerCore, links: Any = None, *,
                 outcomes: OutcomePort | None = None, drive: Drive | None = None,
                 interrupt: Callable[[], None] | None = None, bind_host: str = "127.0.0.1",
                 metrics: Any = None, transport: Transport | None = None):
        """`outcomes` journals each accepted outcome before the program sees it and says how far
        workers may drop results (controller.recorder); whoever holds `drive` steps `core`
        and reads the inbox (the session's engine shares it); `interrupt()` runs at each poll
        of a wait and may raise into the waiting program (a deferred SIGTERM hand-off).
        `metrics` (controller.metrics.ControllerMetrics) is told how long each live call took.
        `transport`: sockets made already (a standby's links, controller/_standby.py)."""
        self._interrupt = interrupt or _nothing
        self.metrics = metrics
        self.session = session
        self.epoch = epoch
        self.core = core
        self.drive = drive or Drive()
        self.outcomes = outcomes
        self._want_lock = threading.Lock()
        self._spin_s = spin_budget_s()
        self._wanted = 0  # program threads reading the inbox themselves
        self._wait_began = 0.0  # when the current wait (_wanted > 0) began
        # The IO thread's long nap (_io_loop) and what ends it.
        self._napping = False
        self.io_passes = 0  # the IO thread's wake-ups, counted
        self.answer_messages = 0  # results and batches read from the inbox (a batch counting once)
        self._unread = True  # the inbox may hold messages its descriptor will not signal again
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # links (chaos testing): see Transport.make. A TCP connection that breaks loses what was
        # on the wire (zmq reconnects, it does not retransmit): outstanding calls are sent again
        # under the same call id when a link comes back, and workers dedupe them.
        self.transport = made = transport or Transport.make(bind_host, links)
        self.ctx, self.creds, self.inbox, self.outbox = made.ctx, made.creds, made.inbox, made.outbox
        self.reply_address = made.reply_address
        self.outbox.dirty.on_add = self._wake_io  # a batch queued while the IO thread sleeps
        # Every peer's link monitor, made with the peer (Transport.make), and the inbox's.
        self._monitors: list[tuple[zmq.Socket, Peer | None]] = made.monitors
        self._reconnects: dict[int, int] = {}
        # Peers (by routed address) that accepted a connection but have not proven they hold
        # the secret: why, for the error of a request that they leave unanswered.
        self._unproven: dict[str, str] = {}
        self._resend_all = False
        self._resent_all_at = -1e9
        self._next_overdue_scan = 0.0
        self.resends = {"link": 0, "overdue": 0, "deferred": 0}  # controller/_links.py
        self.heard: dict[str, float] = {}  # proc id (and relaying agent) -> when it last answered a call
        self._monitors.append((self.inbox.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED), None))
        self.procs = ProcTable()
        self.hosts: dict[str, str] = {}  # host address -> last hello
        self.moved_hosts: dict[str, str] = {}  # a journaled agent address -> where its successor serves
        self.lost_hosts: dict[str, str] = {}  # cluster hosts whose registration vanished -> why
        self.groups: dict[str, list[ProcRef]] = {}  # process groups (their system mesh) -> members by rank
        self._held = HeldGroupFailures(self.groups, self._proc_of_result)
        self.quiet: Callable[[], bool] = lambda: False  # replaying: procs' output is not printed again
        self._requests: dict[int, Future] = {}
        self._asked_procs: dict[int, ProcRef] = {}  # ask_proc's requests in flight, by "n"
        self._req_ids = itertools.count(1)
        self._stop = threading.Event()
        self._on_proc_death: list[Callable[[ProcRef], None]] = []
        self._sent_watermark = (-1, -1)
        self._watermark_at = 0.0
        self._last_hello = 0.0
        self._issued = 0  # calls issued, for drain_ready
        self.checkpoint_seq = -1
        # Without a journal no replay can ask a proc for a result again: large results are
        # released with the rest, not kept for a checkpoint that never comes.
        self.replayable = True
        self.fenced: str | None = None
        self.orphan_timeout_s: float | None = None
        # Casts through host agents (REGENT_RELAY=1): every message to a proc goes through its
        # host's agent once that agent said it relays (`relaying`), answers come back the same
        # way, gathered per host. One route per proc keeps each sender's order (worker/_relay.py).
        self.relay = os.environ.get("REGENT_RELAY", "0") == "1"
        self.relaying: set[str] = set()
        self._relay_heads: dict[str, bytes] = {}
        self._host_alive: dict[str, Callable[[], bool]] = {}
        self._io = threading.Thread(target=self._io_loop, name=f"regent-io-{session}", daemon=True)
        self._io.start()

    # --- program-side sends -------------------------------------------------------

    def refuse_oversized_call(self, actor: str, method: str, frames: Sequence[Any]) -> None:
        """MessageTooLarge if this call would be above the message limit: checked before the
        call is issued, as a call sent never to arrive would wait for ever."""
        if len(frames) == 1 and len(frames[0]) + 4096 <= self.inbox.max_message:
            return  # the usual call, at once: this runs for every one
        refuse_oversized_call(actor, method, frames, self.inbox.max_message, self.session, self.reply_address)

    def _relay_host(self, proc: ProcRef) -> str | None:
        """The agent that relays messages to `proc`, or None (they go to the proc itself)."""
        if not self.relaying:
            return None
        host = self.moved_hosts.get(proc.host, proc.host)
        return host if host in self.relaying else None

    def _route(self, proc: ProcRef, msg: list) -> tuple[Peer, list, Callable[[], bool]]:
        """Where a message to `proc` goes: its host agent's peer and the message wrapped for
        the relay, or the proc's own peer. `alive` says whether a blocked send is still worth it."""
        host = self._relay_host(proc)
        if host is not None and len(msg) <= MAX_BUFFERS + 1:  # wrapped, it is still a valid message
            head = self._relay_heads.get(proc.address)
            if head is None:
                head = self._relay_heads[proc.address] = wire.relay_header(proc.address)
            alive = self._host_alive.get(host)
            if alive is None:
                alive = self._host_alive[host] = lambda: host not in self.lost_hosts
            return self.outbox.peer(host), [head, *msg], alive
        return self.outbox.peer(proc.address), msg, proc.is_alive

    def send_to_proc(self, proc: ProcRef, msg: list) -> None:
        """Send now (after whatever is queued for that proc)."""
        if not proc.alive:
            raise PeerGone(proc.death or f"proc {proc.id} is dead")
        peer, msg, alive = self._route(proc, msg)
        peer.send(msg, alive=alive)

    def queue_to_proc(self, proc: ProcRef, msg: list) -> None:
        """Add to the proc's next batch; `flush` (or the IO thread, soon) sends it."""
        if not proc.alive:
            raise PeerGone(proc.death or f"proc {proc.id} is dead")
        peer, msg, alive = self._route(proc, msg)
        peer.queue(msg, alive=alive)

    def try_send_to_proc(self, proc: ProcRef, msg: list) -> bool:
        """Send without waiting (False if the peer is full); PeerGone as the others."""
        peer, msg, _ = self._route(proc, msg)
        return peer.try_send(msg)

    def send_call(self, call: PendingCall, rank: int) -> None:
        """Queue a call's message to one point for its proc's next batch; a proc known dead
        answers at once. Caller holds the drive."""
        try:
            self.queue_to_proc(call.wire.procs[rank], call.wire.message(rank))
        except PeerGone as e:
            self.deliver_local(call, rank, Outcome("dead", {"em": str(e), "pt": rank}, []))

    def flush(self) -> None:
        """Send every queued batch: the program calls this before it blocks."""
        if self.outbox.dirty:
            self.outbox.flush()

    def ask_proc(self, proc: ProcRef, kind: Kind, meta: dict, frames: list, timeout: float) -> dict | None:
        """Send `proc` a request that is answered by id through the inbox (a supervisor's
        restart spawn): its reply's metadata ({"st": "dead"} if it is dead), or None after `timeout`."""
        return self.ask_procs([(proc, kind, meta, frames)], timeout)[0]

    def ask_procs(self, asks: list[tuple[ProcRef, Kind, dict, list]], timeout: float) -> list[dict | None]:
        """`ask_proc` to several procs at once, every request sent before any answer is awaited
        (a process group's members must all be inside its rendezvous together)."""
        waits = []
        try:
            for proc, kind, meta, frames in asks:
                n = next(self._req_ids)
                fut: Future = Future()
                self._requests[n] = fut
                self._asked_procs[n] = proc
                waits.append((n, fut))
                try:
                    self.send_to_proc(proc, wire.encode(kind, {**meta, "n": n}, frames))
                except PeerGone as e:
                    fut.set_result({"st": "dead", "em": str(e)})
            deadline = time.monotonic() + timeout
            return [fut.get() if fut.wait(max(0.0, deadline - time.monotonic())) else None for _, fut in waits]
        finally:
            for n, _ in waits:
                self._requests.pop(n, None)
                self._asked_procs.pop(n, None)

    def on_proc_death(self, cb: Callable[[ProcRef], None]) -> None:
        self._on_proc_death.append(cb)

    def _handle(self, frames: list) -> None:
        """One received message: its metadata is checked against wire.schema before any of
        it is read; what fails is dropped and logged with its peer."""
        try:
            kind, meta, payload = schema.CONTROLLER.decode(frames)
            subs = wire.split_batch(meta, payload) if kind is Kind.BATCH else None
        except ProtocolError as e:
            log.warning("dropped malformed message", peer=peer_of(frames[0]), error=str(e))
            return
        if kind is Kind.BATCH or kind is Kind.RESULT:
            self.answer_messages += 1
        replies = []
        if subs is None:
            if "fp" not in meta:
                try:
                    self._handle_one(kind, meta, payload)
                except Exception:  # never the program's error: it may be reading the inbox
                    log.exception("a message failed (dropped)", peer=peer_of(frames[0]), kind=kind.name)
                return
            replies.append((kind, meta, payload))  # a host's fold, alone
        for sub in subs or ():
            try:
                replies.append(schema.CONTROLLER.decode_one(sub))
            except ProtocolError as e:
                log.warning("dropped malformed message from a batch", peer=peer_of(frames[0]), error=str(e))
        folds = any("fp" in m for _, m, _ in replies)
        if folds:  # a host's fold: an outcome for each of its points (controller/folding.py)
            replies = expand(self.core.calls, replies)
        lsns = None
        if self.outcomes is not None and not folds and subs and len(replies) == len(subs):
            # The whole batch, before any reply is handled: one record may journal them all.
            lsns = self.outcomes.record_batch(frames, replies)
        for (kind, meta, payload), lsn in zip(replies, lsns or [None] * len(replies), strict=True):
            try:
                self._handle_one(kind, meta, payload, lsn)
            except Exception:
                log.exception("a message from a batch failed (handling the rest)", peer=peer_of(frames[0]))

    def _handle_one(self, kind: Kind, meta: dict, payload: list, lsn: int | None = None) -> None:
        """One message; `lsn`: the journal record its batch was journaled in (record_batch)."""
        if kind is Kind.RESULT:
            fut = self._requests.get(meta.get("n")) if "n" in meta else None
            if fut is not None:  # an answer to a supervisor's request, not a program call
                fut.set_result(meta)
            else:
                self._on_result(meta, payload, lsn)
        elif kind in (Kind.HOST_REP, Kind.PONG):
            fut = self._requests.get(meta.get("n"))
            if fut is not None:
                fut.set_result(meta)
            elif kind is Kind.HOST_REP and meta.get("complete") is True and meta.get("sid") == self.session:
                self._reconcile(meta)
        elif kind is Kind.LOG:
            if meta.get("sid") == self.session and not self.quiet():
                self._print_output(meta)
        elif kind is Kind.HOST_EVENT:
            if meta.get("ev") == "proc_died" and meta.get("sid") == self.session:
                proc = self.procs.get(meta.get("id"))
                if proc is not None:
                    status = meta.get("status")
                    how = "unknown (it was adopted by a restarted host agent)" if status is None else status
                    self.mark_dead(proc, f"proc {proc.id} (pid {proc.pid}) exited with status {how}")

    @staticmethod
    def _print_output(meta: dict) -> None:
        """A proc's lines, on this controller's stdout / stderr as they were written there,
        prefixed with the host and the proc's index on it."""
        prefix = f"[{meta['h']} {meta['i']}] "
        out = {0: [], 1: []}
        for stream, text in meta["lines"]:
            out[stream].append(prefix + text.replace("\r", "") + "\n")
        for stream, f in ((0, sys.stdout), (1, sys.stderr)):
            if out[stream]:
                try:
                    f.write("".join(out[stream]))
                    f.flush()
                except (OSError, ValueError):
                    pass  # the program closed its stream

    def _on_result(self, meta: dict, payload: list, lsn: int | None = None, held: bool = False) -> None:
        seq, point, status = meta.get("s"), meta.get("pt"), meta.get("st")
        if not isinstance(seq, int) or not isinstance(point, int) or not isinstance(status, str):
            log.warning("dropped result with bad fields", meta=str(meta)[:200])
            return
        if status == GROUP_FAILED and lsn is None and not self._held.blame(meta, final=held):
            self._held.hold(meta, payload)  # until the member that died is known (controller/_groupblame.py)
            return
        if status == "fenced":
            self.fenced = meta.get("em") or "a worker saw a newer controller epoch"
        outcome = Outcome(status, meta, payload) if lsn is None else Outcome(status, meta, payload, lsn, True)
        sent = self.core.calls.get(seq)
        if sent is not None and sent.wire is not None and 0 <= point < len(sent.wire.procs):
            proc, now = sent.wire.procs[point], time.monotonic()
            self.heard[proc.id] = now  # it is making progress (_links.py)
            if self.relaying and (host := self._relay_host(proc)) is not None:
                self.heard[host] = now  # and so is its agent's relay, which keeps each proc's order
        call = self.core.on_result(seq, point, outcome)
        if call is not None:
            self._deliver(call, point, call.results[point])

    def _proc_of_result(self, meta: dict) -> ProcRef | None:
        call = self.core.calls.get(meta["s"])
        return call.wire.procs[meta["pt"]] if call is not None and call.wire is not None else None

    def _release_held(self, expired_only: bool) -> None:
        """Deliver held group failures whose dead member is now known (or whose wait is over)."""
        for meta, payload in self._held.due(expired_only):
            self._on_result(meta, payload, held=True)

    def _deliver(self, call: PendingCall, point: int, outcome: Outcome) -> None:
        """Journal first (the session decides how durably), then let the program see it.
        An outcome journaled already (in its batch's record, or read from the journal) needs
        nothing more."""
        if call.wire is not None:
            outcome.holder = call.wire.procs[point].id
        if not outcome.journaled:
            try:
                if self.outcomes is not None:
                    self.outcomes.record(call, point, outcome)
            finally:
                self.core.recorded(call.seq)
        if self.metrics is not None and call.complete:
            self.metrics.call_done(call.seq)
        call.sink.deliver(call, point)

    def mark_dead(self, proc: ProcRef, reason: str) -> None:
        """A proc is gone: its outstanding points fail. Caller holds the drive."""
        if not proc.alive:
            return
        proc.alive = False
        proc.death = reason
        bulk.forget(proc.address)  # large frames sent to it that it never took (wire.bulk)
        for n, asked in list(self._asked_procs.items()):  # a restart spawn waiting on it: no answer will come
            fut = self._requests.get(n)
            if asked is proc and fut is not None and not fut.done():
                fut.set_result({"st": "dead", "em": reason})
        for call, point in self.core.on_proc_died(proc.key, reason):
            self._deliver(call, point, call.results[point])
        for call in list(self.core.calls.values()):  # a fold it was in cannot complete: unfolded
            w = call.wire
            for folder, pts in (w.folds or {}).items() if w is not None else ():
                if folder not in w.unfolded and any(w.procs[r] is proc for r in pts):
                    w.unfolded.add(folder)
                    for r in pts:
                        if r not in call.results:
                            self.send_call(call, r)
        self._release_held(expired_only=False)
        for cb in self._on_proc_death:
            cb(proc)

    def deliver_local(self, call: PendingCall, point: int, outcome: Outcome) -> None:
        """An outcome decided on this side (send failed, answered from the journal). Caller
        holds the drive."""
        if self.core.on_result(call.seq, point, outcome) is not None:
            self._deliver(call, point, call.results[point])

    def fail_all(self, reason: str) -> None:
        """Leadership is gone (any thread): nothing more is sent, and the driver fails every
        outstanding call."""
        self.fenced = reason
        self.drive.post(lambda: self._fail_outstanding(reason))

    def _fail_outstanding(self, reason: str) -> None:
        pending = [(c, p) for c in self.core.calls.values() for p in c.targets if p not in c.results]
        for call, point in pending:
            self.deliver_local(call, point, Outcome("fenced", {"em": reason}, []))

    def fence_procs(self, procs: list[ProcRef], timeout: float = 1.0) -> Callable[[], None]:
        """Raise every proc's epoch to ours; returns the wait (briefly) for each live one to
        confirm, which the caller runs before its first new call (a takeover replays meanwhile).

        A proc that does not answer in time is not waited for: every message we send it
        carries our epoch anyway, and a deposed primary's calls are ones this program
        makes again under the same ids, so the fence is a guard, not a gate."""
        waits = []
        self.flush()
        for proc in procs:
            n = next(self._req_ids)
            fut: Future = Future()
            self._requests[n] = fut
            meta = {"sid": self.session, "e": self.epoch, "rt": self.reply_address, "n": n}
            if self.relay:
                meta["rv"] = True  # answered through the host's agent, as calls are: one batch per host
            try:
                self.queue_to_proc(proc, wire.encode(Kind.FENCE, meta))  # batched per peer (per host, relayed)
                waits.append((proc, n, fut))
            except PeerGone:
                self._requests.pop(n, None)
        self.flush()
        deadline = time.monotonic() + timeout

        def confirmed() -> None:
            unconfirmed = 0
            for proc, n, fut in waits:
                if not fut.wait(max(0.0, deadline - time.monotonic())):
                    unconfirmed += 1
                    log.debug("proc did not confirm the new epoch", proc=proc.id)
                self._requests.pop(n, None)
            if unconfirmed:
                log.warning("procs did not confirm the new epoch in time; our calls carry it",
                            unconfirmed=unconfirmed, fenced=len(waits))
            waits.clear()

        return confirmed

    def _tick(self) -> None:
        """The timer's event (run by the driver): resends, the release watermark, hellos."""
        now = time.monotonic()
        self._check_links()
        self._release_held(expired_only=True)
        if self.outcomes is not None:
            through = self.outcomes.release_through()
        else:
            through = self.core.releasable_through
        mark = (through, self.checkpoint_seq if self.replayable else through)
        # A deposed controller releases nothing: what it journaled is the new leader's to judge.
        every = len(self.procs) / WATERMARK_SENDS_PER_S  # beyond a tick only past the budget
        due = every <= WATERMARK_INTERVAL_S or now - self._watermark_at >= every
        if mark != self._sent_watermark and self.fenced is None and due:
            self._sent_watermark, self._watermark_at = mark, now
            msg = wire.encode(Kind.WATERMARK, {"sid": self.session, "e": self.epoch, "dw": mark[0], "cw": mark[1]})
            for proc in list(self.procs.values()):
                if proc.alive:
                    peer, out, alive = self._route(proc, msg)
                    if out is msg:
                        peer.try_send(msg)
                    else:  # relayed: a host's procs get theirs in one batch to its agent
                        peer.try_queue(out, alive)
        hello_every = max(HOST_HELLO_INTERVAL_S, len(self.hosts) / HOST_HELLO_SENDS_PER_S)
        if self.hosts and now - self._last_hello >= hello_every:
            self._last_hello = now
            hello = wire.encode(Kind.HOST_REQ, {"sid": self.session, "e": self.epoch, "op": "hello", "n": 0,
                                                "rt": self.reply_address, "orphan_s": self.orphan_timeout_s})
            for host in list(self.hosts):
                self.outbox.peer(host).try_send(hello)

    def close(self) -> None:
        self._stop.set()
        self._napping = True  # whatever it is doing: write to the pipe
        self._wake_io()
        self._io.join(timeout=2.0)
        if not self._io.is_alive():  # else it may still poll them: they are left open
            self._napping = False
            r, w = self._wake_r, self._wake_w
            self._wake_r = self._wake_w = -1  # a late _wake_io writes to no descriptor, not a reused one
            os.close(r)
            os.close(w)
        with self.drive:  # a waiter on another thread lets go of the socket first
            pass
        self.transport.close()


def _nothing() -> None:
    """No interruption (a runtime outside a session)."""
