"""A session's edge: everything a Session drives that is not a decision.

The engine (controller/engine.py) decides; an edge does the IO: the journal store and its
leadership, the group-commit writer, the runtime's sockets, the supervisor's restarts. Two
edges exist. `LiveEdge` is a real session's (a primary, or a standby that took over).
An audit (`regent journal replay`, controller/audit.py) installs a journal-only edge, so a
program's `Session(...)` replays against its records with no store, socket or host agent:
standby replay and audit replay are the same Session and engine, fed by different edges.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import os
import secrets
import signal
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from regent.controller._runtime import Runtime
from regent.controller._standby import StandbyLinks, links_while_standing_by
from regent.controller.cluster import ClusterHosts, controller_address
from regent.controller.drive import Drive
from regent.controller.ephemeral import NoJournal, NoWriter
from regent.controller.membership import journaled_spare_addresses
from regent.controller.refs import ProcRef
from regent.controller.replay import START, SUPERVISION, ReplayIndex, placed_hosts
from regent.controller.supervisor import Supervisor
from regent.controller.upgrade import (
    HandoverWatch,
    ProgramChanged,
    announce_program,
    request_handover,
    takeover_check,
    upgrading,
)
from regent.journal import GroupCommitWriter, open_journal
from regent.journal.standbys import StandbyPresence
from regent.wire.security import secure_requested
from regent.worker.dedupe import LARGE_RESULT_BYTES
from regent.worker.discovery import ensure_local_host

if TYPE_CHECKING:
    from regent.controller.metrics import ControllerMetrics

log = structlog.get_logger("regent.session")

DEFAULT_LEASE_TTL_S = 2.0
# How long a journal record nobody waits for may wait for company (group commit). Records a
# program must see durable first are written at once; the rest (call records, plain results)
# lose nothing by waiting: a takeover sends an unjournaled call again and the worker dedupes it.
JOURNAL_LINGER_S = 0.05
HANDOVER_POLL_S = 0.005  # a standby that asked for a hand-over looks for the primary's resignation this often
# How long a new leader waits for a restarted host agent to finish adopting its procs.
ADOPTION_WAIT_S = 8.0


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


class JournalWriter(Protocol):
    """What a session writes its records through (GroupCommitWriter, NoWriter, an audit's)."""

    durable_lsn: int

    def submit(self, kind: str, data: dict, *, lazy: bool = False) -> int: ...
    def collector(self, kind: str) -> Callable[[Any], None]: ...
    def ticket(self) -> int: ...
    def bound(self, ticket: int) -> int | None: ...
    def seal(self) -> int: ...
    def wait_durable(self, lsn: int, timeout: float | None = None) -> None: ...
    def flush(self, timeout: float | None = None) -> int: ...
    def close(self) -> None: ...


# The start of the log line a controller writes once it waits behind a leader: launchers, the
# training demo and the tests watch controllers' output for it before they kill the primary.
STANDING_BY = "standing by: another controller leads this session"


class Handoff(BaseException):  # noqa: N818 - a control-flow signal, like KeyboardInterrupt
    """SIGTERM asked this primary to step down: it hands leadership to a standby at once,
    leaving workers and the run as they are."""


_HANDOFF = "SIGTERM: handing the session over to a standby"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../regent
_REGENT_DIRS = tuple({_PACKAGE + os.sep} | {os.path.realpath(os.path.join(_PACKAGE, part)) + os.sep for part in (
    "controller", "worker", "wire", "journal", "hipcore", "chaos", "cli")})
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "purelib", "platlib")})
_handoff_pending = False
_handoff_confirm: Callable[[], bool] | None = None  # a store-asked hand-over's last check
_handoff_asks = 0  # requests the store's watch reported: one during the check keeps the hand-over


def _raise_handoff(signum: int, frame: Any) -> None:
    """SIGTERM: raise Handoff in the program, but never inside regent's own code (or a library
    it called), where an exception between two frames of a message would leave half of it in
    a socket and the next send would complete it with another's frames. There it is raised at
    the next safe point (`raise_pending_handoff`): a session call, or a poll of a wait."""
    global _handoff_pending, _handoff_confirm
    _handoff_confirm = None  # a SIGTERM hands over whoever asked before
    _handoff_pending = True  # raised at every later safe point (raise_pending_handoff)
    if not in_regent(frame):
        raise Handoff(_HANDOFF)


def in_regent(frame: Any) -> bool:
    """Whether a signal handler's `frame` is inside regent's own code, or a library regent
    called: an exception raised there could tear a message or a lock in half."""
    while frame is not None:  # from the innermost frame out, to the first that is not a library's
        filename = frame.f_code.co_filename
        if filename.startswith(_REGENT_DIRS):
            return True
        if not filename.startswith(_LIBRARY_DIRS) and not filename.startswith("<"):
            return False  # the program's own code
        frame = frame.f_back
    return False


def raise_pending_handoff() -> None:
    """Raise the Handoff a SIGTERM deferred, if one did (a safe point of the session's). Once
    raised it stays raised: another task of an async program (or another thread) that makes a
    session call after the hand-over began gets it too, rather than journal a call the standby
    taking over would not make at that point. A hand-over the store asked for is checked
    first (`_handoff_confirm`): its requester may have gone since."""
    global _handoff_pending, _handoff_confirm
    if not _handoff_pending:
        return
    confirm, _handoff_confirm, asks = _handoff_confirm, None, _handoff_asks
    if confirm is not None and not confirm():
        if asks != _handoff_asks:  # the watch reported a new request meanwhile: that one stands
            return
        _handoff_pending = False
        log.warning("the program that asked for the hand-over no longer stands by (stopped or killed); this "
                    "primary goes on")
        return
    raise Handoff(_HANDOFF)


class RunFinished(SystemExit):
    """A standby's primary finished the run: the standby has nothing to do (exit status 0)."""

    def __init__(self, message: str):
        super().__init__(0)
        self.message = message
        sys.stderr.write(message + "\n")


def sys_path() -> list[str]:
    cwd = os.getcwd()
    return [p or cwd for p in sys.path]


class LiveEdge:
    """A real session's IO: it campaigns, reads the journal, writes it, and talks to workers."""

    audit = False
    catching_up = False  # controller/catchup.py: a standby running its program before it leads

    def __init__(self, name: str, journal: str | None, *, lease_ttl_s: float | None = None,
                 campaign_timeout: float | None = None, links: Any = None,
                 orphan_timeout_s: float | None = None, metrics: ControllerMetrics | None = None):
        self._open(name, journal, lease_ttl_s, links, orphan_timeout_s, metrics)
        try:
            lead = self._campaign(campaign_timeout)
            try:
                previous = ReplayIndex(self.journal.read(name))
            except BaseException:
                self.journal.close()  # resigns: a damaged journal must not stay led by a dead Session
                raise
            self._led(lead, previous)
        except BaseException:
            if self._standby_links is not None:
                self._standby_links.close()
            raise

    def _open(self, name: str, journal: str | None, lease_ttl_s: float | None, links: Any,
              orphan_timeout_s: float | None, metrics: ControllerMetrics | None) -> None:
        """What the edge is before it campaigns: the store, who it is, where it is reached."""
        global _handoff_pending, _handoff_confirm
        _handoff_pending, _handoff_confirm = False, None  # an earlier session's hand-over is over
        self.name = name
        self.metrics = metrics
        self._ttl = lease_ttl_s or float(os.environ.get("REGENT_LEASE_TTL_S", DEFAULT_LEASE_TTL_S))
        self.journal = NoJournal() if journal == "off" else open_journal(journal)
        self.journal_url = self.journal.url
        self.journaled = journal != "off"
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.waited = False
        self.upgrade_asked: tuple[float, int] | None = None  # (when, the epoch asked to hand over)
        # Where workers and standbys reach this controller: its inbox and its liveness beacon.
        self.address = controller_address(self.journal_url, secure_requested())
        self._presence: StandbyPresence | None = None  # while standing by: its record in the store
        self._clusters: ClusterHosts | None = None
        self._links = links
        self._orphan_timeout_s = orphan_timeout_s
        # The session freezes what the collector tracks at its start, unless the program
        # manages the collector itself (disabled it, or froze objects): its choice is kept.
        self._gc_owned = gc.isenabled() and gc.get_freeze_count() == 0
        self._gc_frozen = False
        self._fence_wait: Callable[[], None] | None = None  # a takeover's fence, confirmed before its first live call
        self._handover: HandoverWatch | None = None
        self._standby_links: StandbyLinks | None = None  # while standing by: links to the journal's workers

    def _campaign(self, timeout: float | None) -> Any:
        """Lead the session, waiting behind its leader (a standby) as long as it has one."""
        try:
            return self.journal.campaign(self.name, self.holder, ttl_s=self._ttl, timeout=timeout,
                                         on_waiting=self._on_waiting, poll_s=self._campaign_poll_s,
                                         beacon_host=None if self.address == "127.0.0.1" else self.address)
        finally:
            if self._presence is not None:
                self._presence.stop()

    def _led(self, lead: Any, previous: ReplayIndex) -> None:
        """This controller leads: `previous` is the journal as it found it."""
        name = self.name
        self.lead = lead
        self.takeover_at = time.monotonic()
        self.epoch = self.lead.epoch
        if self.waited and previous.ended:
            # The primary this process stood by for finished the run: there is nothing to
            # take over, and starting the program again would run every call a second time.
            self.lead.resign()
            self.lead.close()
            self.journal.close()
            raise RunFinished(f"session {name!r}: the run this standby waited on ({previous.run}) has "
                              "finished; exiting without running it again")
        resuming = previous.run is not None and not previous.ended
        # A standby of a program the session no longer runs (or is being handed to) steps
        # aside; the one `regent upgrade` started journals itself as the run's program.
        refusal, self._announce = takeover_check(self.journal.backend, name, previous) if resuming else (None, False)
        if refusal is not None:
            self.lead.resign()
            self.lead.close()
            self.journal.close()
            raise ProgramChanged(refusal)
        self.replay: ReplayIndex | None = previous if resuming else None
        self.run_id = previous.run if resuming else secrets.token_hex(4)
        self.sid = f"{name}.{self.run_id}"
        if self.journaled:
            self._handover = HandoverWatch(self.journal.backend, name, self.epoch, self._on_handover_request)
        if self.upgrade_asked is not None:
            asked_at, old_epoch = self.upgrade_asked
            print(f"regent upgrade: session {name!r} handed over by the primary of epoch {old_epoch}; this "
                  f"program leads it at epoch {self.epoch}, {time.time() - asked_at:.3f} s after asking",
                  file=sys.stderr, flush=True)

    def _on_waiting(self) -> None:
        self.waited = True
        if self.metrics is not None:  # before it says it stands by: a scrape then reads its lag
            self.metrics.standing_by(self.journal)
        log.info(STANDING_BY, session=self.name)
        if self.journaled and links_while_standing_by():
            self._standby_links = StandbyLinks(self.journal, self.name, self.address, self._links)
        if self.journal_url != "off":  # listed by `regent status` and the dashboard while it waits
            self._presence = StandbyPresence(self.journal.backend, self.name, self.holder,
                                             {"metrics": None if self.metrics is None else self.metrics.url})
        if upgrading(self.name) and not self.catching_up:  # `regent upgrade`: this program asks the
            self._ask_handover()  # primary to hand over (once caught up, when it catches up first)

    def _campaign_poll_s(self) -> float:
        """How long the campaign waits before it looks at the leader key again: the store's
        interval, or HANDOVER_POLL_S once this standby asked for the session (the primary steps
        down within one of its session calls; each look is one read)."""
        return HANDOVER_POLL_S if self.upgrade_asked is not None else self.journal.backend.poll_interval_s

    def _ask_handover(self) -> None:
        """Ask the session's primary, through the store, to hand it over to this program."""
        leader = self.journal.backend.leader(self.name)
        if leader is not None:
            self.upgrade_asked = (request_handover(self.journal.backend, self.name, leader[1], self.holder),
                                  leader[1])
            log.info("asked the primary to hand the session over", session=self.name, epoch=leader[1],
                     primary=leader[0])

    def _on_handover_request(self, request: dict) -> None:
        """The store asks this primary to hand over (`regent upgrade`): as SIGTERM does."""
        global _handoff_pending, _handoff_confirm, _handoff_asks
        log.info("a hand-over was asked for through the store; handing the session over at the next "
                 "session call", session=self.name, by=request["by"])
        watch = self._handover
        _handoff_confirm = None if watch is None else watch.asked
        _handoff_asks += 1
        _handoff_pending = True

    @property
    def role(self) -> str:
        return "standby-took-over" if self.waited else "primary"

    def connect(self, core: Any, drive: Drive, outcomes: Any, on_failure: Callable,
                on_lost: Callable[[str], None]) -> None:
        """Start the writer, the runtime and the supervisor; a takeover fences the workers."""
        metrics = self.metrics
        self.writer: JournalWriter = GroupCommitWriter(
            self.lead, max_delay_s=JOURNAL_LINGER_S, on_failure=on_failure,
            on_commit=None if metrics is None else metrics.committed) if self.journaled else NoWriter()
        announced = None
        if self.replay is None:
            self.writer.submit(START, {"run": self.run_id, "ts": time.time()})
        elif self._announce:  # durable before this program's first live call (controller/upgrade.py)
            announced = announce_program(self.writer, self.holder)  # committing while the runtime starts
        outcomes.use(self.writer)
        standby, self._standby_links = self._standby_links, None
        self.runtime = Runtime(self.sid, self.epoch, core, self._links, outcomes=outcomes, drive=drive,
                               interrupt=raise_pending_handoff, bind_host=self.address, metrics=metrics,
                               transport=None if standby is None else standby.take())
        self.runtime.orphan_timeout_s = self._orphan_timeout_s
        self.runtime.replayable = self.journaled
        self.supervisor = Supervisor(self.runtime, self._record_supervision, self.sid,
                                     sys_path(), clusters=self.clusters,
                                     journaled=self.replay.supervision if self.replay is not None else [],
                                     durable=lambda lsn: self.writer.wait_durable(lsn, timeout=30.0))
        self.lead.on_lost(on_lost)
        if metrics is not None:
            replay = self.replay
            metrics.leading(self.epoch, self.writer, lambda: 0 if replay is None else
                            max(0, replay.max_seq - core.next_seq + 1))
            runtime = self.runtime
            metrics.host_counts(lambda: len(set(runtime.hosts) - set(runtime.lost_hosts)),
                                lambda: len(runtime.lost_hosts))
            metrics.resends(runtime.resends)
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _raise_handoff)
        if self.replay is not None:
            self._fence_known_workers()
        if announced is not None:
            self.writer.wait_durable(announced, timeout=30.0)
        # What exists now lives as long as the session: the program's imports (torch's ~200k
        # objects), a standby's replay index. Each full collection would scan it again; the
        # session keeps it out of the collector's scans until it closes (see docs/design.md).
        if self._gc_owned:
            gc.freeze()
            self._gc_frozen = True

    def _record_supervision(self, entry: dict) -> int:
        """Journal a supervision event (the supervisor's `record`), then count it."""
        lsn = self.writer.submit(SUPERVISION, entry)
        if self.metrics is not None:
            self.metrics.supervision(entry)
        return lsn

    def live(self, engine: Any = None) -> None:
        """Replay is over (or, with no engine, the session closes: what it froze is given back to
        the cyclic GC); the fence is confirmed before the first live call."""
        if engine is not None:
            self.fenced()
        else:
            self._fence_wait = None
        if engine is not None and self.metrics is not None and self.replay is not None:
            self.metrics.took_over(time.monotonic() - self.takeover_at)
        if engine is not None:
            log.info("replay complete; now live", session=self.name, seq=engine.core.next_seq - 1,
                     replayed=engine.stats["replayed"], resent=engine.stats["resent"],
                     takeover_s=round(time.monotonic() - self.takeover_at, 3))
            if self.upgrade_asked is not None:
                print(f"regent upgrade: replayed through seq {engine.core.next_seq - 1} "
                      f"({round(time.monotonic() - self.takeover_at, 3)} s after taking over); the new "
                      "program runs live from here", file=sys.stderr, flush=True)
        if engine is None and self._gc_frozen:
            self._gc_frozen = False
            gc.unfreeze()

    def clusters(self) -> ClusterHosts:
        """The cluster hosts this session uses (made on first use: most sessions use none)."""
        if self._clusters is None:
            if not self.journaled:
                raise ValueError("a session without a journal (journal='off') cannot use cluster hosts: "
                                 "hosts register in the store, so pass the session its journal url")
            self._clusters = ClusterHosts(self.journal.backend, self.runtime,
                                          lambda ev, **d: self.supervisor.note(ev, **d), self.runtime.drive.post)
        return self._clusters

    def _fence_known_workers(self) -> None:
        """Before anything else, raise every known worker's epoch to ours (invariant 5)."""
        placements = self.replay.placements
        hosts = {addr for jc in placements for addr in placed_hosts(jc.kind, jc.value)}
        hosts |= set(journaled_spare_addresses(self.replay.supervision))  # where lost hosts' procs moved
        runtime = self.runtime
        known = sorted(h for h in hosts if isinstance(h, str) and runtime.moved_hosts.get(h, h) not in runtime.lost_hosts)
        # Every agent greeted at once: a takeover waits for the slowest, not for their sum.
        greeted = runtime.host_requests([(host, "hello", {}) for host in known], timeout=2.0, timeouts=True)
        for host, reply in zip(known, greeted, strict=True):
            try:
                if isinstance(reply, TimeoutError):
                    raise reply
                # A restarted agent is still adopting the procs that outlived its
                # predecessor: wait for its list to be complete (bounded), or procs on
                # their way would be taken for dead and restarted.
                deadline = time.monotonic() + ADOPTION_WAIT_S
                while reply.get("complete") is False and time.monotonic() < deadline:
                    time.sleep(0.2)
                    reply = runtime.host_request(host, "hello", timeout=2.0)
            except TimeoutError as e:
                log.warning("host agent from the journal did not answer", host=host, error=str(e))
                continue
            runtime.register_host(host)
            for p in reply.get("procs") or []:
                if p.get("alive") and p.get("addr"):
                    ref = ProcRef(p["id"], p["idx"], p["addr"], p["pid"], host)
                    runtime.procs[ref.id] = ref
        with runtime.drive:  # links the standby made to workers that are gone (controller/_standby.py)
            let_go = runtime.let_go(set(known) | {p.address for p in runtime.procs.values()})
        if let_go:
            log.info("closed the standby's links to workers that are gone", session=self.name, links=let_go)
        # The procs confirm while the program replays (which sends them nothing new); the first
        # live call waits for them (`fenced`).
        self._fence_wait = runtime.fence_procs(list(runtime.procs.values()))

    def fenced(self) -> None:
        """Wait (at most the fence's second) for the procs the takeover fenced to confirm our
        epoch: once, before this leader's first new call."""
        wait, self._fence_wait = self._fence_wait, None
        if wait is not None:
            wait()

    def attach_host(self, host: str) -> str:
        """Say hello to the journal's host agent for this machine; if it is gone, work goes on
        on this machine's agent (calls whose results the journal lacks run again there, at
        least once, as for any dead process). A new agent takes the old one's address when it
        can, and adopts the procs that outlived it."""
        try:
            self.runtime.host_request(host, "hello", timeout=3.0)
        except TimeoutError:
            local = ensure_local_host()
            if local != host:
                log.warning("the journaled host agent is gone; using this machine's", was=host, now=local)
                host = local
            self.runtime.host_request(host, "hello", timeout=10.0)
        self.runtime.register_host(host)
        return host

    @staticmethod
    def local_host() -> str:
        return ensure_local_host()

    # --- replay policies: what a live session does where an audit reports -------------------

    @staticmethod
    def match(engine: Any, seq: int, kind: str, actor: str, method: str, digest: bytes,
              points: Any) -> Any:
        """The journal's record of call `seq` (checked by the engine); past the journal's end a
        live session simply goes on (None)."""
        return engine.match(seq, kind, actor, method, digest, points)

    def resume_from(self, seq: int, data: dict) -> bool:
        """Skip to the checkpoint `data` (after `resume` at `seq`)? A live session always does."""
        return True

    def replayed_checkpoint(self, seq: int, state: Any) -> None:
        """The program made its checkpoint at `seq` again on replay."""

    def unanswered(self, call: Any, rank: int) -> bool:
        """A replayed call the journal cannot answer: send it (True). An audit records a gap."""
        return True

    def close(self, *, deposed: bool) -> None:
        """Release everything; resign unless deposed."""
        try:
            if self._handover is not None:
                self._handover.close()
            if self._clusters is not None:
                self._clusters.close()
            self.supervisor.close()
            self.runtime.close()
            try:
                self.writer.close()
            finally:
                if not deposed:
                    self.lead.resign()
                self.lead.close()
                self.journal.close()
        finally:
            self.live()


_edge_factory: contextvars.ContextVar[Callable[..., Any] | None] = contextvars.ContextVar(
    "regent_edge_factory", default=None)


def open_edge(name: str, journal: str | None, live: Callable[..., Any] = LiveEdge, **options: Any) -> Any:
    """The edge a new Session gets: a live one (`live`: LiveEdge, or a class of its), or the
    one an audit has installed."""
    factory = _edge_factory.get()
    return live(name, journal, **options) if factory is None else factory(name, journal)


@contextlib.contextmanager
def installed(factory: Callable[..., Any]) -> Iterator[None]:
    """While active, Session(...) gets its edge from `factory(name, journal)` (an audit)."""
    token = _edge_factory.set(factory)
    try:
        yield
    finally:
        _edge_factory.reset(token)
