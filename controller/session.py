"""Session: the user's handle on a regent job, journaled and able to take over.

A Session drives two things: the engine (controller/engine.py), which makes every decision,
and an edge (controller/edge.py), which does the IO. The first process to open a session name
leads it; another one running the same program waits inside `Session(...)` as a standby. On
takeover its edge fences the workers with the new epoch, then the program runs again from the
top: each call is checked against its record (invariant 6) and answered from the journal, or
sent again under the same call id so workers dedupe it (invariants 2 and 3). An audit replay
is the same Session on an edge that only reads the journal.
"""

from __future__ import annotations

import pickle
import queue
import random as _random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import structlog

from regent import wire
from regent.controller._runtime import RESEND_FIRST_S, ProcRef, Wire
from regent.controller.core import ControllerCore, Outcome, PendingCall
from regent.controller.edge import Handoff, RunFinished, journal_value_limit, open_edge
from regent.controller.engine import COLLECTED, Append, Engine
from regent.controller.futures import Future, Point, point_of
from regent.controller.lifecycle import Lifecycle
from regent.controller.mesh import ActorMesh, GatherSink, HostMesh, ProcMesh, StreamSink
from regent.controller.recorder import Recorder, append
from regent.controller.replay import CALL, END, JournaledCall, NonDeterminismError
from regent.journal import LeadershipLost
from regent.wire import Kind
from regent.wire.transport import PeerGone
from regent.worker.errors import FencedError, SupervisionError
from regent.worker.logsetup import configure_logging

log = structlog.get_logger("regent.session")

class Session:
    """A regent session: `with Session("name") as s: ...`.

    journal: "etcd://host:port[,host:port]" (or "etcds://...?ca=&cert=&key=" for TLS, either
    with "user=NAME" for etcd auth: see journal.open_journal), "sqlite:///path.db", None for
    the embedded SQLite store in $REGENT_HOME, or "off" (no journal: no takeover).
    lease_ttl_s: how long a dead primary holds leadership before a standby takes over.
    orphan_timeout_s: how long host agents keep this session's procs when no controller
    (primary or standby) contacts them (default $REGENT_ORPHAN_TIMEOUT_S or 300 s).
    links: optional routing of this controller's connections (chaos tests put a Toxiproxy
    proxy on every link): an object with connect(addr) and advertise(addr).
    """

    def __init__(self, name: str, journal: str | None = None, *, lease_ttl_s: float | None = None,
                 campaign_timeout: float | None = None, links: Any = None,
                 orphan_timeout_s: float | None = None):
        if not name or "/" in name or len(name) > 128:
            raise ValueError(f"session name {name!r} must be 1..128 characters without '/'")
        configure_logging(only_if_unconfigured=True)
        self.name = name
        self._closed = False
        self._lost: str | None = None
        self._journal_failed: BaseException | None = None
        self._resumed = False
        self._resume_lsn: int | None = None
        self._log = structlog.get_logger("regent.program").bind(session=name)
        edge = self._edge = open_edge(name, journal, lease_ttl_s=lease_ttl_s, campaign_timeout=campaign_timeout,
                                      links=links, orphan_timeout_s=orphan_timeout_s)
        self.journal_url, self.holder, self.epoch = edge.journal_url, edge.holder, edge.epoch
        self.run_id, self.sid, self.takeover_at = edge.run_id, edge.sid, edge.takeover_at
        self._engine = Engine(edge.sid, edge.replay, journaled=edge.journaled, value_limit=journal_value_limit())
        lock = threading.Lock()  # the engine's, shared with the runtime's IO thread
        self._recorder = Recorder(self._engine, lock, on_exit=self._actor_exited)
        edge.connect(self._engine.core, lock, self._recorder, on_failure=self._on_journal_failed,
                     on_lost=self._on_leadership_lost)
        self.journal, self.lead, self.writer = edge.journal, edge.lead, edge.writer
        self.runtime, self._supervisor = edge.runtime, edge.supervisor
        self._lifecycle = Lifecycle(self)
        self._get_hook, self._flush_hook, self._decode_hook = self._get, self.runtime.flush, self._engine.decode

    # --- what the program and tools read -----------------------------------------------

    @property
    def replaying(self) -> bool:
        return self._engine.replaying

    @property
    def role(self) -> str:
        return self._edge.role

    @property
    def waited(self) -> bool:
        return self._edge.waited

    @property
    def core(self) -> ControllerCore:
        return self._engine.core

    @property
    def stats(self) -> dict[str, int]:
        return self._engine.stats

    def log(self, event: str, **kw: Any) -> None:
        """structlog, silent while replaying so output is not printed twice."""
        if not self.replaying:
            self._log.info(event, **kw)

    # --- context management ------------------------------------------------------------

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        self.close(error=exc)
        if isinstance(exc, Handoff):
            # The rest of the program belongs to the standby now: leave quietly.
            raise SystemExit(0) from None

    def close(self, error: BaseException | None = None) -> None:
        """End the run: record it, stop its actors and procs, hand leadership back."""
        if self._closed:
            return
        self._closed = True
        if self._edge.audit:
            self._edge.finish(self, error)
            return
        deposed = self._lost is not None or isinstance(error, (LeadershipLost, FencedError))
        try:
            if isinstance(error, Handoff) and not deposed:
                self.writer.flush(timeout=30)
                log.info("handing the session over", session=self.name)
            elif not deposed:
                self._settle(timeout=10.0)
                self.writer.submit(END, {"error": repr(error)[:2000] if error else None})
                self.writer.flush(timeout=30)
                for host in self._lifecycle.hosts:
                    try:
                        self.runtime.host_request(host, "stop_session", timeout=15.0)
                    except (TimeoutError, FencedError) as e:
                        log.warning("could not stop the session on a host", host=host, error=str(e))
        except LeadershipLost:
            deposed = True
        finally:
            self._edge.close(deposed=deposed)

    def _settle(self, timeout: float) -> None:
        """Let calls still in flight (broadcasts the program never waited for) finish
        before the run ends, so ending it does not cut them off."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.runtime.flush()
            with self.runtime.lock:
                if not self.core.calls:
                    return
            time.sleep(0.005)
        log.warning("ending the run with calls still outstanding", session=self.name,
                    outstanding=len(self.core.calls))

    # --- leadership and failures -------------------------------------------------------

    def _on_leadership_lost(self, reason: str) -> None:
        self._lost = f"leadership of session {self.name!r} lost: {reason}"
        log.error("leadership lost; this controller stops driving workers", session=self.name, reason=reason)
        self.runtime.fail_all(self._lost)

    def _on_journal_failed(self, exc: BaseException) -> None:
        """The writer could not append (its thread): the next call raises why (_check_live).
        A lost leadership has told us already (lead.on_lost), and fails what is in flight."""
        self._journal_failed = exc

    def _actor_exited(self, call: PendingCall, point: int, outcome: Outcome) -> None:
        self._supervisor.failed(call.actor, point, str(outcome.meta.get("em")),
                                abnormal=not outcome.meta.get("normal"))

    def _check_live(self) -> None:
        if self._closed:
            raise RuntimeError(f"session {self.name!r} is closed")
        if self._lost:
            raise LeadershipLost(self._lost)
        if self._journal_failed is not None:
            raise self._journal_failed
        if self._engine.lost is not None:
            raise self._engine.lost
        if self.runtime.fenced:
            raise LeadershipLost(f"leadership of session {self.name!r} lost: {self.runtime.fenced}")

    # --- driving the engine --------------------------------------------------------------

    def _begin(self, kind: str, actor: str = "", method: str = "", digest: bytes = b"", points: Any = None, *,
               targets: list[str] | None = None, durable_first: bool = False) -> tuple[int, JournaledCall | None]:
        """Take the next seq for a side effect on the proc processes `targets` (None: a host
        agent or the journal), once what it rests on is durable; its journal record, if any."""
        self._check_live()
        engine, writer = self._engine, self.writer
        wait = engine.reads.wait_before(targets, writer.durable_lsn, durable_first)
        if wait is not None:
            lsn = wait.lsn
            if lsn == COLLECTED:
                lsn = writer.bound(wait.ticket)
                if lsn is None:
                    lsn = writer.seal()
            writer.wait_durable(lsn)
            engine.reads.durable(lsn)
        seq, went_live = engine.issue()
        if went_live:
            self._go_live()
        return seq, self._edge.match(engine, seq, kind, actor, method, digest, points)

    def _go_live(self) -> None:
        self._edge.live(self._engine)

    def _append(self, kind: str, data: dict, durable: bool = False) -> int:
        return self._do(Append(kind, data, durable))

    def _do(self, effect: Append) -> int:
        try:
            return append(self.writer, effect)
        except LeadershipLost as e:
            self._on_leadership_lost(str(e))
            raise

    def _finished(self, seq: int) -> None:
        with self.runtime.lock:
            self.core.finished(seq)

    def _observed(self, lsn: int, holders: Any) -> None:
        """The program read an outcome journaled at `lsn`, held until durable by `holders`."""
        writer = self.writer
        reads = self._engine.reads
        if lsn <= writer.durable_lsn:
            return
        bound = writer.bound(reads.ticket) if reads.lsn == COLLECTED else None
        reads.observed(lsn, holders, writer.durable_lsn, writer.ticket(), bound)

    # --- the call path -------------------------------------------------------------------

    def _call(self, mesh: ActorMesh, method: str, args: tuple, kwargs: dict, kind: str,
              ranks: tuple[int, ...] | None, sink: Any) -> PendingCall:
        frames, digest = wire.dumps_call(args, kwargs)
        self.runtime.refuse_oversized_call(mesh.name, method, frames)
        return self._issue_call(Kind.CALL, kind, mesh.name, method, frames, digest, mesh._procs, ranks, sink,
                                choose_from=mesh if ranks is None else None)

    def _issue_call(self, wire_kind: Kind, kind: str, actor: str, method: str, frames: list, digest: bytes,
                    procs: list[ProcRef], ranks: tuple[int, ...] | None, sink: Any,
                    metas: list[dict] | None = None, choose_from: ActorMesh | None = None) -> PendingCall:
        engine = self._engine
        if ranks is None:  # choose: the pick is journaled durably before anything is sent
            seq, jc = self._begin(kind, actor, method, digest, None, durable_first=True)
            rank, pick = engine.choose(seq, *self._loads(choose_from))
            if pick is not None:
                self._do(pick)
            ranks = (rank,)
        else:
            seq, jc = self._begin(kind, actor, method, digest, ranks, targets=[procs[r].id for r in ranks])
        sink.decode = self._decode_hook
        if isinstance(sink, GatherSink):
            sink.future.attach(seq, self._get_hook, self._flush_hook)
        # Members that are restarting are waited for before anything is recorded as sent.
        unavailable: dict[int, str] = {}
        mesh_state = self._supervisor.meshes.get(actor) if wire_kind is Kind.CALL else None
        if mesh_state is not None and mesh_state.supervisor is not None:
            for r in ranks:
                if jc is None or r not in jc.results or "big" in jc.results[r]:
                    try:
                        mesh_state.wait_ready(r)
                    except SupervisionError as e:
                        unavailable[r] = str(e)
        targets = {r: procs[r].key for r in ranks}
        with self.runtime.lock:
            call = engine.expect(seq, kind, actor, method, targets, sink, jc)
        if isinstance(sink, StreamSink):  # the stream reads results from its call; other
            sink.call = call  # sinks get it on delivery, so a finished call is no cycle for GC
        if jc is None:
            self._recorder.collect(engine.call_record(seq, kind, actor, method, digest, ranks, time.time()).item)
        base = {"sid": self.sid, "e": self.epoch, "s": seq, "a": actor, "m": method, "d": digest,
                "rt": self.runtime.reply_address}
        call.wire = Wire(wire_kind, base, frames, metas, procs, time.monotonic(), RESEND_FIRST_S)
        # Several points share one packing of the metadata; one point (call_one) packs it once anyway.
        points = wire.PointMessages(wire_kind, base, frames) if not metas and len(ranks) > 1 else None
        for r in ranks:
            outcome = engine.replayed(jc, r)
            if outcome is not None:
                self.runtime.deliver_local(call, r, outcome)
            elif r in unavailable:
                self.runtime.deliver_local(call, r, Outcome("dead", {"em": unavailable[r], "pt": r}, []))
            elif self._edge.unanswered(call, r):
                if points is not None:
                    msg = points.encode(r)
                elif metas:
                    msg = wire.encode(wire_kind, {**base, "pt": r, **metas[r]}, frames)
                else:
                    msg = wire.encode(wire_kind, {**base, "pt": r}, frames)
                try:
                    self.runtime.queue_to_proc(procs[r], msg)
                except PeerGone as e:
                    self.runtime.deliver_local(call, r, Outcome("dead", {"em": str(e), "pt": r}, []))
        return call

    def _loads(self, mesh: ActorMesh) -> tuple[list[int], dict[int, int]]:
        """A choose's candidates (the live members, or all if none is) and their calls in flight."""
        ranks = mesh._view.ranks
        live = [r for r in ranks if mesh._procs[r].alive] or list(ranks)
        load = dict.fromkeys(live, 0)
        with self.runtime.lock:
            for call in self.core.calls.values():
                for r, pid in call.targets.items():
                    if r in load and mesh._procs[r].key == pid and r not in call.results:
                        load[r] += 1
        return live, load

    def _get(self, fut: Future, timeout: float | None) -> None:
        """Future.get for calls: a deadline the program saw is journaled, and replayed."""
        seq, engine = fut.tag, self._engine
        if engine.replayed_timeout(seq):
            raise TimeoutError(f"call seq {seq} not complete after {timeout} s (replayed)")
        if not self.runtime.wait_for(fut, engine.deadline(seq, timeout)):
            self._do(engine.timed_out(seq, timeout))
            raise TimeoutError(f"call seq {seq} not complete after {timeout} s")
        self._observed(fut.lsn, engine.read_holders(fut.holders, timeout))

    def _stream_results(self, sink: StreamSink, timeout: float | None = None) -> Iterator[tuple[Point, Any]]:
        """Completion order, journaled durably before each value is seen; replayed as recorded.
        A deadline that passed is journaled too, and replayed where it happened."""
        call, engine = sink.call, self._engine
        index = {r: i for i, r in enumerate(sink.view.ranks)}
        buffered: dict[int, None] = {}  # arrived but not yet yielded, in arrival order
        deadline = None if timeout is None else time.monotonic() + timeout
        for i in range(len(sink.view.ranks)):
            self.runtime.flush()
            rank = engine.stream_pick(call.seq, i)
            if rank is not None:
                while rank not in buffered:
                    buffered[sink.queue.get()[1]] = None
            else:
                if engine.replayed_timeout(call.seq):
                    raise TimeoutError(f"stream seq {call.seq} not complete after {timeout} s (replayed)")
                if not buffered:
                    try:
                        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                        buffered[sink.queue.get(timeout=wait)[1]] = None
                    except queue.Empty:
                        self._do(engine.timed_out(call.seq, timeout))
                        raise TimeoutError(f"stream seq {call.seq} not complete after {timeout} s") from None
                rank = next(iter(buffered))
                self._do(engine.stream_yielded(call.seq, i, rank))
            del buffered[rank]
            outcome = call.results[rank]
            self._observed(outcome.lsn, engine.read_holders((outcome.holder,), timeout))
            yield point_of(sink.view.dims, index[rank]), engine.decode(call, outcome)

    # --- values the program may ask for ----------------------------------------------------

    def _value(self, kind: str, produce: Callable[[], Any], encode: bool = False) -> Any:
        """A value that may differ between runs: journaled durably before the program sees it."""
        seq, jc = self._begin(kind, kind, kind)
        if jc is not None:
            self.stats["replayed"] += 1
            self._finished(seq)
            return pickle.loads(jc.value) if encode else jc.value
        value = produce()
        self._do(self._engine.value_record(seq, kind, pickle.dumps(value, protocol=5) if encode else value))
        self._finished(seq)
        return value

    def now(self) -> float:
        """Wall-clock time, journaled so a replay sees the same value."""
        return self._value("now", time.time)

    def random(self) -> float:
        """A random float in [0, 1), journaled so a replay sees the same value."""
        return self._value("random", _random.random)

    def side_effect(self, fn: Callable[[], Any]) -> Any:
        """Run fn once; a replay gets its journaled result instead of running it again."""
        return self._value("side_effect", fn, encode=True)

    def checkpoint(self, state: Any) -> None:
        """Snapshot the program's state; a takeover resumes from here (see `resume`)."""
        seq, jc = self._begin("checkpoint", "checkpoint", "checkpoint")
        if jc is not None:
            self._finished(seq)
            self._edge.replayed_checkpoint(seq, state)
            return
        blob = pickle.dumps(state, protocol=5)
        # A checkpoint is a barrier: a takeover skips everything before it, so every earlier
        # call must have completed (broadcasts included) and be journaled.
        while True:
            self.runtime.flush()
            with self.runtime.lock:
                if not self._engine.outstanding_before(seq):
                    break
            self._check_live()
            time.sleep(0.001)
        lsn = self._append(CALL, {"s": seq, "k": "checkpoint", "a": "checkpoint", "m": "checkpoint", "v": None},
                           durable=True)
        self.lead.checkpoint({"seq": seq, "run": self.run_id, "state": blob, "resume_lsn": self._resume_lsn},
                             lsn=lsn + 1)
        self._finished(seq)
        self.runtime.checkpoint_seq = seq

    def resume(self, default: Any) -> Any:
        """The state of the last checkpoint of this run, or default. Call it once, after
        creating meshes: a takeover skips from here straight to the checkpoint."""
        if self._resumed:
            raise RuntimeError("resume() may be called once per session")
        self._resumed = True
        seq, jc = self._begin("resume", "resume", "resume")
        if jc is None:
            self._resume_lsn = self._append(CALL, {"s": seq, "k": "resume", "a": "resume", "m": "resume", "v": None},
                                            durable=True)
            self._finished(seq)
            return default
        self._finished(seq)
        ckpt = self.journal.read_checkpoint(self.name)
        data = ckpt["data"] if ckpt else None
        self._resume_lsn = data.get("resume_lsn") if data else None
        if not data or data.get("run") != self.run_id or data["seq"] <= seq or not self._edge.resume_from(seq, data):
            return default
        # Skip the calls the checkpoint covers: the program continues after it.
        with self.runtime.lock:
            went_live = self._engine.skip_to(data["seq"])
        self.runtime.checkpoint_seq = data["seq"]
        if went_live:
            self._go_live()
        return pickle.loads(data["state"])

    # --- meshes ------------------------------------------------------------------------------

    def this_host(self) -> HostMesh:
        """The machine this controller runs on (the journal remembers which it was)."""
        return self._lifecycle.this_host()

    def spawn_procs(self, per_host: Mapping[str, int] | None = None) -> ProcMesh:
        """Procs on this host: shorthand for `s.this_host().spawn_procs(per_host)`."""
        return self.this_host().spawn_procs(per_host)


__all__ = ["Handoff", "NonDeterminismError", "RunFinished", "Session"]
