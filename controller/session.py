"""Session: the user's handle on a regent job, journaled and able to take over.

Every side effect of the program gets a seq (invariant 1) and a journal record.
The first process to open a session name leads it; another one running the same
program waits inside `Session(...)` as a standby. On takeover it fences the
workers with its new epoch, then re-runs the program from the top: each call is
checked against its record (invariant 6) and answered from the journal, or
re-sent under the same call id so workers dedupe it (invariants 2 and 3).
"""

from __future__ import annotations

import collections
import gc
import itertools
import math
import os
import pickle
import queue
import random as _random
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgpack
import structlog

from controller._runtime import RESEND_FIRST_S, ProcRef, Runtime, Wire
from controller.core import ControllerCore, Outcome, PendingCall
from controller.ephemeral import NoJournal, NoWriter
from controller.futures import Future, Point, point_of
from controller.mesh import ActorMesh, GatherSink, HostMesh, ProcMesh, StreamSink, View
from controller.replay import (
    CALL,
    CALLS,
    END,
    OBS,
    PROCS,
    RESULT,
    RESULTS,
    RESULTS_MAX_BYTES,
    START,
    SUPERVISION,
    JournaledCall,
    LostResultError,
    NonDeterminismError,
    ReplayIndex,
    covered,
)
from controller.supervisor import MeshState, Supervisor, policy_of
from journal import GroupCommitWriter, LeadershipLost, open_journal
from worker import _wire as wire
from worker._wire import Kind
from worker.classref import class_ref
from worker.dedupe import LARGE_RESULT_BYTES
from worker.discovery import ensure_local_host
from worker.errors import ActorError, DivergenceError, FencedError, SupervisionError
from worker.logsetup import configure_logging
from worker.supervision import MeshSupervisor
from worker.transport import PeerGone

# How long a new leader waits for a restarted host agent to finish adopting its procs.
ADOPTION_WAIT_S = 8.0
NEVER_DURABLE = 1 << 62  # the lsn of a result that could not be journaled
# The lsn of a value journaled as an item of a CALLS record, until a ticket resolves it
# (GroupCommitWriter.ticket, .bound): larger than any lsn, so never taken for durable.
COLLECTED = NEVER_DURABLE - 1

log = structlog.get_logger("regent.session")

DEFAULT_LEASE_TTL_S = 2.0
# How long a journal record nobody waits for may wait for company (group commit). Records a
# program must see durable first are written at once; the rest (call records, plain results)
# lose nothing by waiting: a takeover sends an unjournaled call again and the worker dedupes it.
# Each append costs about a millisecond of CPU (etcd on the 2-core bench machine: 0.4 ms in
# the controller, 0.6 ms in the server), so fewer appends leave more of the machine to the
# calls. A result the program has read waits like the rest: a call that must not run before
# it is durable waits for it (_held_by). Writing read results within 10 ms instead made a
# read-then-call loop append 100 times a second: with etcd, 50-60 us of its call_one p50.
JOURNAL_LINGER_S = 0.05
PROC_TUNING_ENV = ("REGENT_SPIN_US",)  # passed from the controller's environment to its procs
# A value read before a deadline: that it came in time may differ in another run, so a call
# made after it waits until it is durable, whichever proc holds it (no proc has this id).
IN_TIME = "<read before a deadline>"
# Values up to this size are journaled in full; larger ones as a digest (workers keep them until
# the next checkpoint). REGENT_JOURNAL_VALUE_BYTES may raise it, never lower it: workers drop a
# result below LARGE_RESULT_BYTES once it is durable, so it must be in the journal whole.
MAX_JOURNAL_VALUE_BYTES = 960 * 1024  # under journal.MAX_RECORD_BYTES, with room for the record


def journal_value_limit() -> int:
    """The largest result journaled in full ($REGENT_JOURNAL_VALUE_BYTES, checked)."""
    raw = os.environ.get("REGENT_JOURNAL_VALUE_BYTES")
    if not raw:
        return LARGE_RESULT_BYTES
    try:
        limit = int(raw)
    except ValueError:
        limit = -1
    if not LARGE_RESULT_BYTES <= limit <= MAX_JOURNAL_VALUE_BYTES:
        raise ValueError(f"REGENT_JOURNAL_VALUE_BYTES={raw!r} must be an int from {LARGE_RESULT_BYTES} "
                         f"to {MAX_JOURNAL_VALUE_BYTES} (bytes of a result journaled in full)")
    return limit


class Handoff(BaseException):  # noqa: N818 - a control-flow signal, like KeyboardInterrupt
    """SIGTERM asked this primary to step down: it hands leadership to a standby at once,
    leaving workers and the run as they are."""


def _raise_handoff(signum: int, frame: object) -> None:
    raise Handoff("SIGTERM: handing the session over to a standby")


class RunFinished(SystemExit):
    """A standby's primary finished the run: the standby has nothing to do (exit status 0)."""

    def __init__(self, message: str):
        super().__init__(0)
        self.message = message
        sys.stderr.write(message + "\n")


class Session:
    """A regent session: `with Session("name") as s: ...`.

    journal: "etcd://host:port[,host:port]" (or "etcds://...?ca=&cert=&key=" for TLS, either
    with "user=NAME" for etcd auth: see journal.open_journal), "sqlite:///path.db", None for
    the embedded SQLite store in $REGENT_HOME, or "off" (no journal: no takeover).
    orphan_timeout_s: how long host agents keep this session's procs when no controller
    (primary or standby) contacts them (default $REGENT_ORPHAN_TIMEOUT_S or 300 s).
    links: optional routing of this controller's connections (chaos tests put a
    Toxiproxy proxy on every link): an object with connect(addr) and advertise(addr). lease_ttl_s: how long a dead primary
    holds leadership before a standby takes over.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Session:
        # Audit replay (`regent journal replay`, controller/audit.py): inside an audit, the
        # program's Session is an AuditSession, answered from the recorded journal with no
        # store, host agent or socket. Nothing else in this class knows about audits.
        if cls is Session:
            from controller import audit

            if audit.active() is not None:
                return super().__new__(audit.AuditSession)
        return super().__new__(cls)

    def __init__(self, name: str, journal: str | None = None, *, lease_ttl_s: float | None = None,
                 campaign_timeout: float | None = None, links: Any = None,
                 orphan_timeout_s: float | None = None):
        if not name or "/" in name or len(name) > 128:
            raise ValueError(f"session name {name!r} must be 1..128 characters without '/'")
        configure_logging(only_if_unconfigured=True)
        self.name = name
        ttl = lease_ttl_s or float(os.environ.get("REGENT_LEASE_TTL_S", DEFAULT_LEASE_TTL_S))
        self.journal = NoJournal() if journal == "off" else open_journal(journal)
        self.journal_url = self.journal.url
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.waited = False
        self.lead = self.journal.campaign(name, self.holder, ttl_s=ttl, timeout=campaign_timeout,
                                          on_waiting=self._on_waiting)
        self.takeover_at = time.monotonic()
        self.epoch = self.lead.epoch
        try:
            previous = ReplayIndex(self.journal.read(name))
        except BaseException:
            self.journal.close()  # resigns: a damaged journal must not stay led by a dead Session
            raise
        if self.waited and previous.ended:
            # The primary this process stood by for finished the run: there is nothing to
            # take over, and starting the program again would run every call a second time.
            self.lead.resign()
            self.lead.close()
            self.journal.close()
            raise RunFinished(f"session {name!r}: the run this standby waited on ({previous.run}) has "
                              "finished; exiting without running it again")
        if previous.run is not None and not previous.ended:
            self._replay: ReplayIndex | None = previous
            self.run_id = previous.run
        else:
            self._replay = None
            self.run_id = secrets.token_hex(4)
        self.sid = f"{name}.{self.run_id}"
        self._journal_failed: BaseException | None = None
        self._replay_failed: LostResultError | None = None
        self._value_limit = journal_value_limit()
        self._warned_big = False
        self.writer = NoWriter() if journal == "off" else GroupCommitWriter(
            self.lead, max_delay_s=JOURNAL_LINGER_S, on_failure=self._on_journal_failed)
        # Each live call's record, and each plain value answering one alone: one deque append
        # (replay.expand reads CALLS records). In one stream, so a value follows its call.
        self._collect_call = self.writer.collector(CALLS)
        self._collected_marks: collections.deque = collections.deque()  # seqs of such values
        self._no_journal = isinstance(self.writer, NoWriter)
        self._observed_lsn = -1  # the last journaled outcome the program has read
        self._observed_ticket = 0  # for an _observed_lsn of COLLECTED: the writer's ticket
        self._observed_holders: set[str] = set()  # procs holding read outcomes not yet durable
        if self._replay is None:
            self.writer.submit(START, {"run": self.run_id, "ts": time.time()})
        self.replaying = self._replay is not None and self._replay.max_seq >= 0
        self.core = ControllerCore(self.sid)
        self._marks: collections.deque = collections.deque()
        self._safe_through = -1
        self.runtime = Runtime(self.sid, self.epoch, self.core, links)
        self.runtime.orphan_timeout_s = orphan_timeout_s
        self.runtime.record_result = self._record_result
        if not self._no_journal:
            self.runtime.record_batch = self._record_batch
        self._get_hook = self._get  # bound once: each call's future shares them
        self._flush_hook = self.runtime.flush
        self._decode_hook = self._decode
        self.runtime.durable_through = self._durable_through
        self._supervisor = Supervisor(self.runtime, lambda d: self.writer.submit(SUPERVISION, d), self.sid,
                                      _sys_path())
        self._hosts: list[str] = []
        self._actor_names: set[str] = set()
        self._choose_rr = itertools.count()
        self._timeouts: dict[int, int] = {}
        self._resumed = False
        self._closed = False
        self._lost: str | None = None
        self.stats = {"replayed": 0, "resent": 0, "live": 0}
        self._log = structlog.get_logger("regent.program").bind(session=name)
        self.lead.on_lost(self._on_leadership_lost)
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _raise_handoff)
        self._gc_frozen = False
        if self._replay is not None:
            self._fence_known_workers()
        # The replay index lives until replay ends: tens of thousands of objects the cyclic GC
        # would rescan again and again while the program replays (a 20,000-call standby replay:
        # 86-104k -> 121-127k records/s). Kept out of its scans until then, unless the program
        # froze objects itself (its unfreeze is its own).
        if self.replaying and gc.isenabled() and gc.get_freeze_count() == 0:
            gc.freeze()
            self._gc_frozen = True

    def _thaw(self) -> None:
        """Give back to the cyclic GC what was frozen for replay."""
        if self._gc_frozen:
            self._gc_frozen = False
            gc.unfreeze()

    def _on_waiting(self) -> None:
        self.waited = True
        log.info("standing by: another controller leads this session", session=self.name)

    @property
    def role(self) -> str:
        return "standby-took-over" if self.waited else "primary"

    # --- context management ----------------------------------------------------------

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
        self._thaw()
        deposed = self._lost is not None or isinstance(error, (LeadershipLost, FencedError))
        handoff = isinstance(error, Handoff)
        try:
            if handoff and not deposed:
                self.writer.flush(timeout=30)
                log.info("handing the session over", session=self.name)
            elif not deposed:
                self._settle(timeout=10.0)
                self.writer.submit(END, {"error": repr(error)[:2000] if error else None})
                self.writer.flush(timeout=30)
                for host in self._hosts:
                    try:
                        self.runtime.host_request(host, "stop_session", timeout=15.0)
                    except (TimeoutError, FencedError) as e:
                        log.warning("could not stop the session on a host", host=host, error=str(e))
        except LeadershipLost:
            deposed = True
        finally:
            self._supervisor.close()
            self.runtime.close()
            try:
                self.writer.close()
            finally:
                if not deposed:
                    self.lead.resign()
                self.lead.close()
                self.journal.close()

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

    # --- leadership ------------------------------------------------------------------

    def _on_leadership_lost(self, reason: str) -> None:
        self._lost = f"leadership of session {self.name!r} lost: {reason}"
        log.error("leadership lost; this controller stops driving workers", session=self.name, reason=reason)
        self.runtime.fail_all(self._lost)

    def _on_journal_failed(self, exc: BaseException) -> None:
        """The writer could not append (its thread): the next call raises why (_check_live).
        A lost leadership has told us already (lead.on_lost), and fails what is in flight."""
        self._journal_failed = exc

    def _check_live(self) -> None:
        if self._closed:
            raise RuntimeError(f"session {self.name!r} is closed")
        if self._lost:
            raise LeadershipLost(self._lost)
        if self._journal_failed is not None:
            raise self._journal_failed
        if self._replay_failed is not None:
            raise self._replay_failed
        if self.runtime.fenced:
            raise LeadershipLost(f"leadership of session {self.name!r} lost: {self.runtime.fenced}")

    def _fence_known_workers(self) -> None:
        """Before anything else, raise every known worker's epoch to ours (invariant 5)."""
        assert self._replay is not None
        hosts = {jc.value for jc in self._replay.calls.values() if jc.kind == "this_host"}
        for host in sorted(h for h in hosts if isinstance(h, str)):
            try:
                reply = self.runtime.host_request(host, "hello", timeout=2.0)
                # A restarted agent is still adopting the procs that outlived its
                # predecessor: wait for its list to be complete (bounded), or procs on
                # their way would be taken for dead and restarted.
                deadline = time.monotonic() + ADOPTION_WAIT_S
                while reply.get("complete") is False and time.monotonic() < deadline:
                    time.sleep(0.2)
                    reply = self.runtime.host_request(host, "hello", timeout=2.0)
            except TimeoutError:
                log.warning("host agent from the journal did not answer", host=host)
                continue
            self.runtime.register_host(host)
            for p in reply.get("procs") or []:
                if p.get("alive") and p.get("addr"):
                    ref = ProcRef(p["id"], p["idx"], p["addr"], p["pid"], host)
                    self.runtime.procs[ref.id] = ref
        self.runtime.fence_procs(list(self.runtime.procs.values()))

    # --- journaling ------------------------------------------------------------------

    def _submit(self, kind: str, data: dict, durable: bool = False) -> int:
        try:
            lsn = self.writer.submit(kind, data)
            if durable:
                self.writer.wait_durable(lsn)
        except LeadershipLost as e:
            self._on_leadership_lost(str(e))
            raise
        return lsn

    def _record_batch(self, frames: list, replies: list[tuple[Kind, dict, list]]) -> list[int | None] | None:
        """Journal a batch of plain values as the worker sent it: one record, not one each.

        Under a pipelined load replies arrive a hundred to a message; a record per reply
        cost the controller more than the call itself. Returns, per reply, the record's lsn
        if the record covers it (the runtime puts it on the reply's Outcome, and
        `_record_result` writes nothing more), else None."""
        if len(replies) < 2:
            return None
        size = wire.payload_size(frames)
        if size > RESULTS_MAX_BYTES:
            return None
        # A batch within LARGE_RESULT_BYTES holds no large reply: covered need not sum each.
        marked = covered(replies, size <= LARGE_RESULT_BYTES)
        if len(marked) < 2:
            return None
        low = math.inf
        calls = self.core.calls
        with self.runtime.lock:
            for i in marked:
                meta = replies[i][1]
                # A repeated reply (a resend answered twice) is not journaled again: then the
                # batch goes result by result, where only the first answer counts.
                seq = meta["s"]
                call = calls.get(seq)
                if call is None or meta["pt"] in call.results:
                    return None
                if seq < low:
                    low = seq
        try:
            lsn = self.writer.submit(RESULTS, {"b": wire.frame_bytes(frames)}, lazy=True)
        except Exception:  # noqa: BLE001 - each reply then tries its own record, and says why
            return None
        # One watermark mark for the batch, before any of its calls completes (_durable_through).
        self._marks.append((low, lsn))
        lsns: list[int | None] = [None] * len(replies)
        for i in marked:
            lsns[i] = lsn
        return lsns

    def _record_result(self, call: PendingCall, point: int, outcome: Outcome) -> None:
        """IO thread: journal a point's outcome before the program can see it."""
        if outcome.status in ("fenced", "lost"):  # (a journaled outcome never gets here)
            return
        if self._no_journal:
            if outcome.status == "exit":
                self._supervisor.failed(call.actor, point, str(outcome.meta.get("em")),
                                        abnormal=not outcome.meta.get("normal"))
            return
        data: dict[str, Any] = {"s": call.seq, "pt": point, "st": outcome.status}
        if outcome.status == "ok":
            size = wire.payload_size(outcome.frames)
            if size <= LARGE_RESULT_BYTES:
                # An item of the CALLS stream, after its call's (replay.expand reads it as a
                # result record): no record of its own and no lock on the program's path. Its
                # lsn comes later: _observed and _durable_through learn it through the writer.
                self._collect_call((call.seq, point, wire.frame_bytes(outcome.frames), time.time()))
                outcome.lsn = COLLECTED
                self._collected_marks.append(call.seq)
                return
            if size <= self._value_limit:
                data["v"] = wire.frame_bytes(outcome.frames)  # too large for a CALLS item
            else:
                data["big"] = [wire.digest(outcome.frames), size]
                self._warn_big(call, point, size)
        else:
            data["x"] = {k: outcome.meta[k] for k in ("et", "em", "tb", "pid", "normal") if k in outcome.meta}
        # A supervision failure may differ between runs: durable before it is seen (invariant 4).
        durable = outcome.status in ("dead", "exit", "noactor")
        if outcome.status == "exit":
            self._supervisor.failed(call.actor, point, str(outcome.meta.get("em")),
                                    abnormal=not outcome.meta.get("normal"))
        try:
            # A value's record is bytes and small (LARGE_RESULT_BYTES): the writer's thread may
            # encode it, off the path to the program. A failure's text came from a worker:
            # encoded here, where a bad one is refused without harming the writer.
            lsn = self.writer.submit(RESULT, data, lazy=outcome.status == "ok")
            outcome.lsn = lsn
            if durable:
                self.writer.wait_durable(lsn, timeout=30)
        except Exception as e:  # deposed or journal down: the program hears it on its next call
            log.warning("could not journal a result", seq=call.seq, error=str(e))
            # Never durable: the watermark must stay below it, or workers would release a
            # result that a standby can find neither in the journal nor on the worker.
            self._marks.append((call.seq, NEVER_DURABLE))
            return
        self._marks.append((call.seq, lsn))

    def _warn_big(self, call: PendingCall, point: int, size: int) -> None:
        """Tell the program, before it reads one, that a digest-only value binds a takeover to
        the proc that holds it (once a session: a program returning bulk data does it often)."""
        if self._warned_big:
            return
        self._warned_big = True
        log.warning("a result is journaled as a digest only: a standby can replay it only while "
                    "the proc holding it lives; move bulk data through RDMA buffers, or raise "
                    "REGENT_JOURNAL_VALUE_BYTES", session=self.name, seq=call.seq,
                    endpoint=f"{call.actor}.{call.method}", point=point, bytes=size,
                    limit=self._value_limit)

    def _durable_through(self) -> int:
        """Highest seq whose calls are all complete and journaled: workers may drop them."""
        # First what the core has accepted and seen handed to the journal: every outcome it
        # counts there registered its mark before, so the marks read below include it.
        with self.runtime.lock:
            through = self.core.releasable_through
        collected = self._collected_marks
        if collected:
            # Values journaled as CALLS items take the lsn that covers them: those marked so
            # far were added before their marks, so before the seal.
            n = len(collected)
            try:
                bound = self.writer.seal()
            except Exception:  # noqa: BLE001 - the writer failed: they will never be durable
                bound = NEVER_DURABLE
            for _ in range(n):
                self._marks.append((collected.popleft(), bound))
        durable = self.writer.durable_lsn
        while self._marks and self._marks[0][1] <= durable:
            self._marks.popleft()
        # A copy (made in C, under the GIL): the thread reading replies appends marks
        # meanwhile, and a deque changed under an iteration raises RuntimeError.
        pending = min((s for s, _ in list(self._marks)), default=None)
        safe = through if pending is None else min(through, pending - 1)
        self._safe_through = max(self._safe_through, safe)
        return self._safe_through

    def _issue(self, procs: list[ProcRef] | None = None, ranks: Iterable[int] = (), *,
               self_durable: bool = False) -> int:
        """Take the next seq for a side effect on `procs[r] for r in ranks` (procs None: anything
        else, a host agent or the journal; read only if a wait is in question). `self_durable`:
        it journals a durable record first."""
        self._check_live()
        if self._observed_lsn > self.writer.durable_lsn and not (self_durable or self._held_by(procs, ranks)):
            self._await_observed()
        seq = self.core.issue()
        if self.replaying and seq > self._replay.max_seq:
            self._end_replay()
        return seq

    def _held_by(self, procs: list[ProcRef] | None, ranks: Iterable[int]) -> bool:
        """May a call to `procs[r] for r in ranks` go out before the outcomes the program has
        read are durable?

        A plain outcome is journaled off the latency path, and dedupe replays it from the
        worker's cache (invariant 4) -- unless the proc holding it dies with the primary. Then
        a standby would see a SupervisionError (or, restarted, a re-run) where the program
        saw a value, and a call the primary issued after reading it must not have run on a
        proc that survives: the standby's program may not issue it again, or not alike (it
        would run twice, or trip a DivergenceError on the worker). So a call waits until what
        was read is durable, except
        - a call to the one proc that holds every such outcome: if that proc dies, what the
          call did dies with it (at-least-once, as for any call on a proc that died); if it
          lives, its cache replays the outcomes. A read-then-call loop on one actor pays no
          journal commit;
        - a call that journals a durable record before it is sent (a `choose` pick):
          durability comes in lsn order, so that record makes every outcome before it durable.
        """
        holders = self._observed_holders
        if procs is None or len(holders) != 1:
            return False
        for r in ranks:
            if procs[r].id not in holders:  # a replacement holds nothing its predecessor did
                return False
        return True

    def _await_observed(self) -> None:
        """Block until every outcome the program has read is durable (see _held_by)."""
        self.writer.wait_durable(self._resolve_observed(seal=True))
        self._observed_holders.clear()

    def _resolve_observed(self, seal: bool) -> int:
        """_observed_lsn, a COLLECTED one replaced by the lsn its ticket is bound to once the
        writer has closed the items (at once, with `seal`)."""
        if self._observed_lsn == COLLECTED:
            lsn = self.writer.bound(self._observed_ticket)
            if lsn is None and seal:
                lsn = self.writer.seal()
            if lsn is not None:
                self._observed_lsn = lsn
        return self._observed_lsn

    def _observed(self, lsn: int, holders: Iterable[str] = ()) -> None:
        """The program has read an outcome journaled at `lsn` (-1: none, or already durable;
        COLLECTED: an item whose lsn is not known yet) that the procs keyed in `holders` keep
        in their result caches until it is durable."""
        writer = self.writer
        durable = writer.durable_lsn
        if lsn <= durable:
            return
        before = self._observed_lsn
        if before == COLLECTED:  # no call on the common path: one per read
            before = self._resolve_observed(seal=False)
        if before <= durable:
            self._observed_holders.clear()  # what they held before is durable now
        if lsn > self._observed_lsn:
            self._observed_lsn = lsn
        if self._observed_lsn == COLLECTED:
            # Taken after everything read so far was journaled or collected: its bound covers
            # every outcome read, the items and the records alike.
            self._observed_ticket = writer.ticket()
        self._observed_holders.update(holders)

    def _end_replay(self) -> None:
        self.replaying = False
        self._thaw()
        log.info("replay complete; now live", session=self.name, seq=self.core.next_seq - 1,
                 replayed=self.stats["replayed"], resent=self.stats["resent"],
                 takeover_s=round(time.monotonic() - self.takeover_at, 3))

    def _journaled(self, seq: int, kind: str, actor: str = "", method: str = "", digest: bytes = b"",
                   points: Any = None) -> JournaledCall | None:
        if self._replay is None:
            return None
        return self._replay.check(seq, kind, actor, method, digest, points)

    # --- values the program may ask for ------------------------------------------------

    def _value(self, kind: str, produce: Callable[[], Any], encode: bool = False) -> Any:
        """A value that may differ between runs: journaled durably before the program sees it."""
        seq = self._issue()
        jc = self._journaled(seq, kind, kind, kind)
        if jc is not None:
            self.stats["replayed"] += 1
            with self.runtime.lock:
                self.core.finished(seq)
            return pickle.loads(jc.value) if encode else jc.value
        value = produce()
        stored = pickle.dumps(value, protocol=5) if encode else value
        self._submit(CALL, {"s": seq, "k": kind, "a": kind, "m": kind, "v": stored}, durable=True)
        with self.runtime.lock:
            self.core.finished(seq)
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
        seq = self._issue()
        jc = self._journaled(seq, "checkpoint", "checkpoint", "checkpoint")
        if jc is not None:
            with self.runtime.lock:
                self.core.finished(seq)
            return
        blob = pickle.dumps(state, protocol=5)
        # A checkpoint is a barrier: a takeover skips everything before it, so every
        # earlier call must have completed (broadcasts included) and be journaled.
        while True:
            self.runtime.flush()
            with self.runtime.lock:
                outstanding = [c for c in self.core.calls if c < seq]
            if not outstanding:
                break
            self._check_live()
            time.sleep(0.001)
        lsn = self._submit(CALL, {"s": seq, "k": "checkpoint", "a": "checkpoint", "m": "checkpoint", "v": None})
        self.writer.wait_durable(lsn)
        self.lead.checkpoint({"seq": seq, "run": self.run_id, "state": blob, "resume_lsn": self._resume_lsn},
                             lsn=lsn + 1)
        with self.runtime.lock:
            self.core.finished(seq)
        self.runtime.checkpoint_seq = seq

    def resume(self, default: Any) -> Any:
        """The state of the last checkpoint of this run, or default. Call it once, after
        creating meshes: a takeover skips from here straight to the checkpoint."""
        if self._resumed:
            raise RuntimeError("resume() may be called once per session")
        self._resumed = True
        seq = self._issue()
        jc = self._journaled(seq, "resume", "resume", "resume")
        if jc is None:
            lsn = self._submit(CALL, {"s": seq, "k": "resume", "a": "resume", "m": "resume", "v": None}, durable=True)
            self._resume_lsn = lsn
            with self.runtime.lock:
                self.core.finished(seq)
            return default
        self._resume_lsn = self._replay_resume_lsn()
        with self.runtime.lock:
            self.core.finished(seq)
        ckpt = self.journal.read_checkpoint(self.name)
        data = ckpt["data"] if ckpt else None
        if not data or data.get("run") != self.run_id or data["seq"] <= seq:
            return default
        # Skip the calls the checkpoint covers: the program continues after it.
        with self.runtime.lock:
            for s in range(self.core.next_seq, data["seq"] + 1):
                self.core.finished(s)
            self.core.next_seq = data["seq"] + 1
        self.runtime.checkpoint_seq = data["seq"]
        if self.replaying and self.core.next_seq > self._replay.max_seq:
            self._end_replay()
        return pickle.loads(data["state"])

    _resume_lsn: int | None = None

    def _replay_resume_lsn(self) -> int | None:
        ckpt = self.journal.read_checkpoint(self.name)
        return ckpt["data"].get("resume_lsn") if ckpt else None

    def log(self, event: str, **kw: Any) -> None:
        """structlog, silent while replaying so output is not printed twice."""
        if not self.replaying:
            self._log.info(event, **kw)

    # --- meshes ----------------------------------------------------------------------

    def this_host(self) -> HostMesh:
        """The machine this controller runs on (the journal remembers which it was)."""
        if not self._hosts:
            host = self._value("this_host", ensure_local_host)
            try:
                self.runtime.host_request(host, "hello", timeout=3.0)
            except TimeoutError:
                # The journal's host agent is gone, and the procs it owned with it: work
                # continues on this machine's agent, and calls whose results the journal
                # lacks run again there (at-least-once, as for any dead process).
                # A new agent takes the old one's address when it can (and adopts the procs
                # that outlived it); otherwise work moves to wherever this machine's agent is.
                local = ensure_local_host()
                if local != host:
                    log.warning("the journaled host agent is gone; using this machine's", was=host, now=local)
                    host = local
                self.runtime.host_request(host, "hello", timeout=10.0)
            self.runtime.register_host(host)
            self._hosts.append(host)
        return HostMesh(self, list(self._hosts))

    def spawn_procs(self, per_host: Mapping[str, int] | None = None) -> ProcMesh:
        """Procs on this host: shorthand for `s.this_host().spawn_procs(per_host)`."""
        return self.this_host().spawn_procs(per_host)

    def _spawn_procs(self, hosts: list[str], per_host: dict[str, int]) -> ProcMesh:
        if len(per_host) != 1:
            raise ValueError(f"per_host names one dimension, e.g. {{'procs': 4}}; got {per_host}")
        ((dim, count),) = per_host.items()
        if dim == "hosts" or not isinstance(count, int) or count < 1:
            raise ValueError(f"per_host={per_host}: the count must be a positive int and the dim not 'hosts'")
        # The hosts themselves are journaled (`this_host`) and may be replaced on replay when
        # a journaled agent is gone; the call is identified by its shape.
        digest = wire.digest([msgpack.packb([len(hosts), dim, count])])
        seq = self._issue()
        jc = self._journaled(seq, "spawn_procs", "", dim, digest)
        if jc is None:
            self._submit(CALL, {"s": seq, "k": "spawn_procs", "a": "", "m": dim, "d": digest, "pts": []})
        if jc is not None and jc.procs is not None:
            self.stats["replayed"] += 1
            listing = jc.procs
        else:
            listing = []
            # The session's own tuning reaches its procs even through an agent started earlier.
            tuning = {k: os.environ[k] for k in PROC_TUNING_ENV if k in os.environ}
            envs = [{"REGENT_PROC_RANK": str(i), "REGENT_PROC_DIM": dim, **tuning} for i in range(count)]
            for host in hosts:
                reply = self.runtime.host_request(
                    host, "spawn_procs", s=seq, count=count, envs=envs, path=_sys_path(), d=digest)
                if reply.get("st") != "ok":
                    raise SupervisionError(f"host agent at {host} could not spawn procs: {reply.get('em')}")
                listing += [{**p, "host": host, "env": envs[k]} for k, p in enumerate(reply["procs"])]
            self._submit(PROCS, {"s": seq, "procs": listing})
        procs = []
        for p in listing:
            ref = self.runtime.procs.get(p["id"])
            if ref is None and jc is not None:
                ref = self._replacement_of(p)
            if ref is None:
                ref = ProcRef(p["id"], p["idx"], p["addr"], p["pid"], p["host"], env=p.get("env") or {})
                # Known from the journal but not reported alive by its host: it died meanwhile.
                if jc is not None and self.runtime.hosts:
                    self.runtime.mark_dead(ref, f"proc {ref.id} (pid {ref.pid}) is gone")
                self.runtime.procs[ref.id] = ref
            procs.append(ref)
        with self.runtime.lock:
            self.core.finished(seq)
        return ProcMesh(self, procs, View.full({"hosts": len(hosts), dim: count}))

    def _replacement_of(self, listed: dict) -> ProcRef | None:
        """A journaled proc that a previous leader replaced (its `proc_replaced` events), if
        the replacement is alive: calls go on there, where results and rebuilt actors are.
        Taking the listed proc for dead instead would restart it a second time."""
        replaced = self._replay.replaced
        latest, seen = listed["id"], set()
        while latest in replaced and latest not in seen:
            seen.add(latest)
            latest = replaced[latest]
        ref = self.runtime.procs.get(latest) if latest != listed["id"] else None
        if ref is None or not ref.alive:
            return None
        ref.key, ref.index, ref.env = listed["id"], listed["idx"], listed.get("env") or {}
        return ref

    def _spawn_actors(self, mesh: ProcMesh, name: str, cls: type, args: tuple, kwargs: dict,
                      restart: Any = None) -> ActorMesh:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ValueError(f"actor mesh name {name!r} must be a non-empty string")
        if name in self._actor_names:
            raise ValueError(f"an actor mesh named {name!r} already exists in this session")
        procs = mesh.procs()
        dims = mesh.dims
        frames = wire.dumps((class_ref(cls), args, kwargs))
        identity = (cls.__module__, cls.__qualname__, args, kwargs)
        digest = wire.call_digest(identity, wire.dumps(identity))
        sink = GatherSink(View.full(dims))
        metas = [{"co": dict(point_of(dims, rank))} for rank in range(len(procs))]
        self._issue_call(Kind.SPAWN, "spawn", name, "__init__", frames, digest, procs,
                         tuple(range(len(procs))), sink, metas)
        policy = policy_of(restart)
        try:
            sink.future.get()
        except SupervisionError:
            if policy is None:
                raise  # unsupervised: a member that is gone stays gone
        self._actor_names.add(name)
        mesh_sup = MeshSupervisor(name, len(procs), policy) if policy else None
        if mesh_sup is not None and self._replay is not None:
            # Incarnations go on from where the previous leaders' restarts left them.
            mesh_sup.incarnation.update({r: inc for (m, r), inc in self._replay.incarnations.items() if m == name})
        self._supervisor.register(MeshState(name, procs, dims, frames, mesh_sup, coords=metas))
        return ActorMesh(self, name, cls, procs, dims)

    def _stop_actors(self, mesh: ActorMesh) -> None:
        sink = GatherSink(mesh._view)
        self._issue_call(Kind.STOP, "stop", mesh.name, "__stop__", [], b"", mesh._procs, mesh._view.ranks, sink)
        sink.future.get()

    def _stop_procs(self, mesh: ProcMesh) -> None:
        """Stop these procs and the actors on them; supervision does not bring them back."""
        procs = mesh.procs()
        keys = [p.key for p in procs]
        digest = wire.digest([msgpack.packb(keys)])
        seq = self._issue()
        if self._journaled(seq, "stop_procs", "", "stop_procs", digest) is None:
            self._submit(CALL, {"s": seq, "k": "stop_procs", "a": "", "m": "stop_procs", "d": digest, "pts": []})
        for proc in procs:
            proc.stopped = True
        by_host: dict[str, list[str]] = {}
        for proc in procs:
            by_host.setdefault(proc.host, []).append(proc.id)
        for host, ids in by_host.items():
            self.runtime.host_request(host, "stop_procs", ids=ids, timeout=30.0)
        for proc in procs:
            self.runtime.mark_dead(proc, f"proc {proc.id} was stopped by the program")
        with self.runtime.lock:
            self.core.finished(seq)

    # --- the call path ---------------------------------------------------------------

    def _call(self, mesh: ActorMesh, method: str, args: tuple, kwargs: dict, kind: str,
              ranks: tuple[int, ...] | None, sink: Any) -> PendingCall:
        frames, digest = wire.dumps_call(args, kwargs)
        self.runtime.refuse_oversized_call(mesh.name, method, frames)
        return self._issue_call(Kind.CALL, kind, mesh.name, method, frames, digest, mesh._procs, ranks, sink,
                                choose_from=mesh if ranks is None else None)

    def _issue_call(self, wire_kind: Kind, kind: str, actor: str, method: str, frames: list, digest: bytes,
                    procs: list[ProcRef], ranks: tuple[int, ...] | None, sink: Any,
                    metas: list[dict] | None = None, choose_from: ActorMesh | None = None) -> PendingCall:
        if ranks is None:
            seq = self._issue(self_durable=True)
        else:
            seq = self._issue(procs, ranks)
        jc = self._journaled(seq, kind, actor, method, digest, ranks)
        if ranks is None:  # choose: the pick is journaled durably before anything is sent
            key = (seq, "choose", 0)
            if self._replay is not None and key in self._replay.obs:
                ranks = (self._replay.obs[key],)
            else:
                ranks = (self._choose(choose_from),)
                self._submit(OBS, {"s": seq, "w": "choose", "i": 0, "v": ranks[0]}, durable=True)
        sink.decode = self._decode_hook
        if isinstance(sink, GatherSink):
            fut = sink.future
            fut.tag = seq
            fut._on_get = self._get_hook
            fut._on_wait = self._flush_hook
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
            call = self.core.expect(seq, kind, actor, method, targets, sink)
        if jc is not None:
            big = {r: tuple(res["big"]) for r, res in jc.results.items() if "big" in res and r in targets}
            if big:
                call.expected = big
        if isinstance(sink, StreamSink):  # the stream reads results from its call; other
            sink.call = call  # sinks get it on delivery, so a finished call is no cycle for GC
        if jc is None:
            # One item of a CALLS record (replay.expand): the writer's thread encodes it with the
            # others; nothing waits for a call record. A tuple of atoms (ranks is one too): the
            # cyclic GC stops tracking it, where ~5,000 lists in flight cost ~2 us a call.
            self._collect_call((seq, kind, actor, method, digest, ranks, time.time()))
            self.stats["live"] += 1
        base = {"sid": self.sid, "e": self.epoch, "s": seq, "a": actor, "m": method, "d": digest,
                "rt": self.runtime.reply_address}
        call.wire = Wire(wire_kind, base, frames, metas, procs, time.monotonic(), RESEND_FIRST_S)
        # Several points share one packing of the metadata; one point (call_one) packs it once anyway.
        points = wire.PointMessages(wire_kind, base, frames) if not metas and len(ranks) > 1 else None
        for r in ranks:
            res = jc.results.get(r) if jc is not None else None
            if res is not None and "big" not in res:
                self.stats["replayed"] += 1
                self.runtime.deliver_local(call, r, _outcome_of(res))
                continue
            if jc is not None:
                self.stats["resent"] += 1
            if r in unavailable:
                self.runtime.deliver_local(call, r, Outcome("dead", {"em": unavailable[r], "pt": r}, []))
                continue
            if points is not None:
                msg = points.encode(r)
            elif metas:
                msg = wire.encode(wire_kind, {**base, "pt": r, **metas[r]}, frames)
            else:
                msg = wire.encode(wire_kind, {**base, "pt": r}, frames)
            self._send(call, procs[r], r, msg)
        return call

    def _send(self, call: PendingCall, proc: ProcRef, rank: int, msg: list) -> None:
        try:
            self.runtime.queue_to_proc(proc, msg)
        except PeerGone as e:
            self.runtime.deliver_local(call, rank, Outcome("dead", {"em": str(e), "pt": rank}, []))

    def _get(self, fut: Future, timeout: float | None) -> None:
        """Future.get for calls: a timeout the program saw is journaled, and replayed."""
        seq = fut.tag
        self._replay_timeout(seq, "call", timeout)
        # The journal holds what the primary read here: the clock decides nothing on replay.
        wait = None if self._journal_answers(seq) else timeout
        if not self.runtime.wait_for(fut, wait):
            self._time_out(seq, "call", timeout)
        self._observed(fut.lsn, fut.holders if timeout is None else (IN_TIME,))

    def _journal_answers(self, seq: int) -> bool:
        """Does the journal hold an outcome for every point of call `seq`?"""
        jc = self._replay.calls.get(seq) if self._replay is not None else None
        if jc is None or not jc.results:
            return False
        with self.runtime.lock:
            call = self.core.calls.get(seq)
            return call is None or all(r in jc.results for r in call.targets)

    def _replay_timeout(self, seq: int, what: str, timeout: float | None) -> None:
        """Raise the TimeoutError the journal says the program saw next for this seq, if any."""
        n = self._timeouts.get(seq, 0)
        if self._replay is not None and (seq, "timeout", n) in self._replay.obs:
            self._timeouts[seq] = n + 1
            raise TimeoutError(f"{what} seq {seq} not complete after {timeout} s (replayed)")

    def _time_out(self, seq: int, what: str, timeout: float | None) -> None:
        """A deadline passed: journal it durably (it may differ in another run), then raise."""
        n = self._timeouts.get(seq, 0)
        self._timeouts[seq] = n + 1
        self._submit(OBS, {"s": seq, "w": "timeout", "i": n, "v": timeout}, durable=True)
        raise TimeoutError(f"{what} seq {seq} not complete after {timeout} s")

    def _decode(self, call: PendingCall, outcome: Outcome) -> Any:
        st = outcome.status
        if st == "ok":
            return wire.loads(outcome.frames) if outcome.frames else None
        meta = outcome.meta
        who = f"{call.actor}[{meta.get('pt', '?')}]"
        if st == "err":
            raise ActorError(who, call.method, str(meta.get("et")), str(meta.get("em")), str(meta.get("tb", "")))
        if st in ("dead", "noactor", "exit"):
            raise SupervisionError(f"{who}.{call.method} failed: {meta.get('em')}", actor=who, reason=st)
        if st == "fenced":
            raise LeadershipLost(f"{who} refused {call.method}: {meta.get('em')}")
        if st == "divergence":
            raise DivergenceError(f"{who}.{call.method}: {meta.get('em')}")
        if st == "lost":
            self._replay_failed = LostResultError(str(meta.get("em")))
            raise self._replay_failed
        raise SupervisionError(f"{who}.{call.method}: unexpected status {st!r}", actor=who, reason=st)

    def _choose(self, mesh: ActorMesh) -> int:
        """Least-busy live member, ties broken round-robin."""
        ranks = mesh._view.ranks
        live = [r for r in ranks if mesh._procs[r].alive] or list(ranks)
        with self.runtime.lock:
            load = dict.fromkeys(live, 0)
            for call in self.core.calls.values():
                for r, pid in call.targets.items():
                    if r in load and mesh._procs[r].key == pid and r not in call.results:
                        load[r] += 1
        low = min(load.values())
        best = [r for r in live if load[r] == low]
        return best[next(self._choose_rr) % len(best)]

    def _stream_results(self, sink: StreamSink, timeout: float | None = None) -> Iterator[tuple[Point, Any]]:
        """Completion order, journaled durably before each value is seen; replayed as recorded.
        A deadline that passed is journaled too, and replayed where it happened."""
        call = sink.call
        index = {r: i for i, r in enumerate(sink.view.ranks)}
        buffered: dict[int, None] = {}  # arrived but not yet yielded, in arrival order
        deadline = None if timeout is None else time.monotonic() + timeout
        for i in range(len(sink.view.ranks)):
            key = (call.seq, "stream", i)
            self.runtime.flush()
            if self._replay is not None and key in self._replay.obs:
                rank = self._replay.obs[key]
                while rank not in buffered:
                    buffered[sink.queue.get()[1]] = None
            else:
                self._replay_timeout(call.seq, "stream", timeout)
                if not buffered:
                    try:
                        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                        buffered[sink.queue.get(timeout=wait)[1]] = None
                    except queue.Empty:
                        self._time_out(call.seq, "stream", timeout)
                rank = next(iter(buffered))
                self._submit(OBS, {"s": call.seq, "w": "stream", "i": i, "v": rank}, durable=True)
            del buffered[rank]
            outcome = call.results[rank]
            self._observed(outcome.lsn, (IN_TIME,) if timeout is not None else (outcome.holder,))
            yield point_of(sink.view.dims, index[rank]), self._decode(call, outcome)


def _outcome_of(res: dict) -> Outcome:
    """A journaled result as the outcome the worker once sent."""
    meta = {"pt": res["pt"], **(res.get("x") or {})}
    return Outcome(res["st"], meta, res.get("v") or (), journaled=True)


def _sys_path() -> list[str]:
    cwd = os.getcwd()
    return [p or cwd for p in sys.path]


__all__ = ["Handoff", "NonDeterminismError", "RunFinished", "Session"]
