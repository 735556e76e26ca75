"""A standby that catches up before it leads: the program `regent upgrade` starts.

A standby of a plain failover waits inside `Session(...)` and replays the whole program only
once it leads. The program `regent upgrade` starts instead runs at once, on this edge, against
the journal as it grows: every call is checked and answered from its records with no store
write, no socket and no message to a worker, and the program waits wherever it needs what the
journal does not hold yet (the next call's record, a result, a stream's pick), reading the
journal's tail as the primary writes it. Once it has caught up it asks the primary to hand
over; when it wins the campaign it reads the last records, and where the program waits at the
journal's end it goes live (`_go_live`): the edge becomes a LiveEdge (writer, runtime, fence,
supervisor), the procs, meshes, groups and cluster hosts the replay made are handed to it, and
calls the journal does not answer are sent under their ids, as a takeover sends them. The
hand-over then costs the tail, not the whole history.

A few rare steps (a proc mesh's `grow`, `stop_procs`) are not caught up: the program waits
there to lead, and replays the rest as any new leader does. A supervision event the tail
brings once meshes exist (a restart, a lost host, a shrink) makes the program start over
(`_start_over`): a takeover applies those as it replays each spawn.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from regent.controller._links import RESEND_FIRST_S
from regent.controller.edge import LiveEdge, RunFinished, in_regent
from regent.controller.ephemeral import RefusingWriter
from regent.controller.refs import ProcRef, Wire
from regent.controller.replay import PLACED, ReplayIndex
from regent.controller.upgrade import upgrading
from regent.wire.transport import max_message_bytes, refuse_oversized_call

if TYPE_CHECKING:
    from regent.controller.core import PendingCall
    from regent.controller.session import Session

log = structlog.get_logger("regent.session")

CATCHUP_ENV = "REGENT_CATCHUP"  # "0": the upgraded program replays only once it leads
STARTS_ENV = "REGENT_CATCHUP_STARTS"  # how often this program started its catch-up over
MAX_STARTS_OVER = 3
POLL_S = 0.01  # how often a waiting catch-up reads the journal's tail


def wants_catchup(name: str, journal: str | None) -> bool:
    """Whether this process's Session(`name`) catches up before it leads: it is the program
    `regent upgrade` started, with a journal, unless $REGENT_CATCHUP=0."""
    return upgrading(name) and journal != "off" and os.environ.get(CATCHUP_ENV, "1") != "0"


class CatchUpError(RuntimeError):
    """The journal went somewhere the catching-up program cannot follow (a new run)."""


class CatchUpEdge(LiveEdge):
    """A LiveEdge that runs the program against the growing journal before it leads."""

    def __init__(self, name: str, journal: str | None, *, lease_ttl_s: float | None = None,
                 campaign_timeout: float | None = None, links: Any = None,
                 orphan_timeout_s: float | None = None, metrics: Any = None):
        self._open(name, journal, lease_ttl_s, links, orphan_timeout_s, metrics)
        try:
            index, self._next_lsn = _read(self.journal, name, 0, ReplayIndex())
        except BaseException:
            self.journal.close()
            raise
        if index.run is None or index.ended:  # the primary finished (or never began) since the check
            self.journal.close()
            raise RunFinished(f"session {name!r}: {'its run ended' if index.run else 'no run began'} before this "
                              "program could take it over; nothing to upgrade (start the program as you would "
                              "to begin a new run)")
        self.catching_up = True
        self.replay, self.run_id, self.sid = index, index.run, f"{name}.{index.run}"
        self.epoch = index.epochs[-1] if index.epochs else 0  # the primary's, until this one leads
        self.takeover_at = time.monotonic()
        self.lead: Any = None
        self.session: Session | None = None
        self._won = threading.Event()
        self._won_lead: Any = None
        self._campaign_error: BaseException | None = None
        self._asked = False
        self._attached: list[tuple[str, list[dict]]] = []  # cluster attaches the replay made
        self._campaigner = threading.Thread(target=self._campaign_behind, args=(campaign_timeout,),
                                            name=f"regent-campaign-{name}", daemon=True)
        self._campaigner.start()

    def _campaign_behind(self, timeout: float | None) -> None:
        try:
            self._won_lead = self._campaign(timeout)
        except BaseException as e:  # noqa: BLE001 - raised on the program's thread, where it waits
            self._campaign_error = e
        finally:
            self._won_at = time.monotonic()
            self._won.set()

    @property
    def role(self) -> str:
        return "standby-catching-up" if self.catching_up else "standby-took-over"

    def connect(self, core: Any, drive: Any, outcomes: Any, on_failure: Callable,
                on_lost: Callable[[str], None]) -> None:
        if not self.catching_up:
            super().connect(core, drive, outcomes, on_failure, on_lost)
            return
        self._connect_args = (core, drive, outcomes, on_failure, on_lost)
        if threading.current_thread() is threading.main_thread():  # stop standing by, withdrawing the request
            for signum, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
                if signal.getsignal(signum) is default:
                    signal.signal(signum, _stop_standing_by)
        self.writer = RefusingWriter(lambda kind: CatchUpError(
            f"a catching-up standby tried to journal a {kind!r} record before it leads (a regent bug: report "
            "it; REGENT_CATCHUP=0 replays after the takeover instead)"))
        outcomes.use(self.writer)
        self.runtime = _CatchUpRuntime(core, drive, self)
        self.supervisor = _CatchUpSupervisor()

    def bind(self, session: Session) -> None:
        self.session = session

    # --- waiting at the journal's end -------------------------------------------------------

    def at_next_seq(self) -> None:
        """Before the program's next seq: its record is in the journal, or this one leads."""
        s = self.session
        index = self.replay
        self.await_journal(lambda: s._engine.core.next_seq <= index.max_seq)

    def await_journal(self, ready: Callable[[], bool], deadline: float | None = None) -> bool:
        """Until `ready()` (True), `deadline` (time.monotonic(); False), or, at the journal's
        end, this controller leads and goes live (ready() then says)."""
        while self.catching_up:
            _raise_pending_stop()
            if ready():
                return True
            won = self._won.is_set()  # read before the tail: a leader's last read is complete
            if self._tail():
                continue
            if won:
                self._go_live()
                break
            if not self._asked:
                self._asked = True
                log.info("caught up with the journal; asking the primary to hand over", session=self.name,
                         seq=self.replay.max_seq)
                self._ask_handover()
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._won.wait(POLL_S)
        return ready()

    def lead_now(self) -> None:
        """A step the catch-up does not take: wait to lead, and take it as a new leader does."""
        while self.catching_up:
            self.await_journal(lambda: False)

    def _tail(self) -> bool:
        """Index what the primary journaled since the last read; hand the program the results
        it waits for. True if anything was new."""
        index = self.replay
        run, seen = index.run, len(index.supervision)
        before = self._next_lsn
        _, self._next_lsn = _read(self.journal, self.name, before, index)
        if self._next_lsn == before:
            return False
        if index.run != run:
            raise CatchUpError(f"session {self.name!r} began a new run ({index.run}) while this program caught up "
                               f"with run {run}: start `regent upgrade` again")
        if index.ended:
            raise RunFinished(f"session {self.name!r}: the run finished while this program caught up with it; "
                              "nothing to take over")
        events = [d.get("ev") for d in index.supervision[seen:] if isinstance(d, dict) and d.get("ev") != PLACED]
        if events and self.session._lifecycle.procs:
            self._start_over(events)
        deliver_journaled(self.session)
        return True

    def _start_over(self, events: list) -> None:
        """The tail brought supervision events (a restart, a lost host, a shrink...) that change
        meshes this program has replayed already: what a takeover derives from them at each
        spawn cannot be applied after the fact, so the program starts over, in this process
        (exec), and catches up with the journal that now holds them. After MAX_STARTS_OVER it
        replays only once it leads."""
        starts = int(os.environ.get(STARTS_ENV, "0")) + 1
        log.warning("the journal's tail changes meshes this program has replayed; catching up again from the "
                    "start", session=self.name, events=sorted({str(e) for e in events})[:5], time=starts)
        os.environ[STARTS_ENV] = str(starts)
        if starts > MAX_STARTS_OVER:
            os.environ[CATCHUP_ENV] = "0"
        self.catching_up = False
        if self._presence is not None:  # a new holder asks again
            self._presence.stop(wait_s=2.0)
        if self._won_lead is not None:
            self._won_lead.resign()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, sys.orig_argv)

    # --- going live ---------------------------------------------------------------------------

    def _go_live(self) -> None:
        """This controller leads and the program waits at the journal's end: become a LiveEdge
        and hand it what the replay made."""
        if self._campaign_error is not None:
            raise self._campaign_error
        s = self.session
        was_runtime, was_supervisor = self.runtime, self.supervisor
        for signum, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
            if signal.getsignal(signum) is _stop_standing_by:  # a leader's SIGTERM hands over (edge.py)
                signal.signal(signum, default)
        self.catching_up = False
        self.waited = True
        self._led(self._won_lead, self.replay)
        super().connect(*self._connect_args)  # fences every worker the journal names
        connected = time.monotonic()
        live = self.runtime
        with live.drive:
            self._adopt_procs(was_runtime.procs.values())
        for i, host in enumerate(s._lifecycle.hosts):
            if host not in live.hosts:  # its agent did not answer the fence's hello
                s._lifecycle.hosts[i] = self.attach_host(host)
        for cluster, entries in self._attached:
            self.clusters().attach(cluster, entries, True)
        sup = self.supervisor
        sup.on_unhandled, sup.shapes = s._faults.seen, s._shapes
        for cluster in was_supervisor.membership.adopted:
            sup.membership.adopt_journaled(cluster)
        for args in was_supervisor.membership.formed_groups:
            sup.membership.formed(*args)
        for state in was_supervisor.meshes.values():
            sup.register(state)
        s._wire_edge()
        self.fenced()
        with live.drive:
            sent = self._send_unanswered(s._engine.core.calls.values())
        live.flush()
        now = time.monotonic()
        log.info("caught up and leading; the program goes on live", session=self.name, epoch=self.epoch,
                 seq=s._engine.core.next_seq, resent=sent, won_ms=round((self.takeover_at - self._won_at) * 1000, 1),
                 connect_ms=round((connected - self.takeover_at) * 1000, 1),
                 handed_ms=round((now - connected) * 1000, 1))

    def _adopt_procs(self, refs: Any) -> None:
        """The procs the replay knows, as the hosts' hellos found them: the same objects the
        meshes hold, alive where they are (or where a previous leader replaced them), dead
        where not. Caller holds the drive."""
        live, replaced = self.runtime, self.replay.replaced
        for ref in list(refs):
            latest, seen = ref.id, set()
            while latest in replaced and latest not in seen:
                seen.add(latest)
                latest = replaced[latest]
            found: ProcRef | None = live.procs.get(latest)
            if found is not None and found.alive:
                live.procs.pop(found.id, None)
                ref.id, ref.address, ref.pid, ref.host = found.id, found.address, found.pid, found.host
                live.procs[ref.id] = ref
                continue
            live.procs[ref.id] = ref
            if ref.alive and (live.hosts or ref.host in live.lost_hosts):
                live.mark_dead(ref, f"proc {ref.id} (pid {ref.pid}) is gone")

    def _send_unanswered(self, calls: Any) -> int:
        """Send every point the journal did not answer, under its call id, with this leader's
        epoch and address (workers dedupe what they ran already). Caller holds the drive."""
        live, sent = self.runtime, 0
        for call in list(calls):
            w = call.wire
            if w is None:
                continue
            base = {**w.base, "e": self.epoch, "rt": live.reply_address}
            if live.relay:
                base["rv"] = True
            call.wire = Wire(w.kind, base, w.frames, w.metas, w.procs, time.monotonic(), RESEND_FIRST_S,
                             many=len(call.targets) > 1)
            for rank in call.targets:
                if rank not in call.results:
                    live.send_call(call, rank)
                    sent += 1
        return sent

    # --- what the replay asks of the edge while catching up -----------------------------------

    def unanswered(self, call: PendingCall, rank: int) -> bool:
        return not self.catching_up  # while catching up, the tail or the takeover answers it

    def attach_host(self, host: str) -> str:
        return host if self.catching_up else super().attach_host(host)

    def clusters(self) -> Any:
        return _CatchUpClusters(self) if self.catching_up else super().clusters()

    def live(self, engine: Any = None) -> None:
        if not self.catching_up:
            super().live(engine)

    def close(self, *, deposed: bool) -> None:
        if not self.catching_up:
            super().close(deposed=deposed)
            return
        self.catching_up = False
        if self._presence is not None:  # the hand-over it asked for is off (controller/upgrade.py)
            self._presence.stop(wait_s=2.0)
        if self._standby_links is not None:
            self._standby_links.close()
        if self._won_lead is not None:
            self._won_lead.resign()
            self._won_lead.close()
        self.journal.close()


_stop_pending: BaseException | None = None


def _stop_standing_by(signum: int, frame: Any) -> None:
    """SIGINT or SIGTERM while catching up: the program stops (Session.close withdraws its
    standby record, and with it the hand-over it asked for): KeyboardInterrupt, or exit status
    128 + 15. Raised in the program's own code at once; inside regent's, or a library it called
    (a store client's lock held), at its next look at the journal (`await_journal`)."""
    global _stop_pending
    stop = KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(128 + signum)
    if in_regent(frame):
        _stop_pending = stop
        return
    raise stop


def _raise_pending_stop() -> None:
    global _stop_pending
    stop, _stop_pending = _stop_pending, None
    if stop is not None:
        raise stop


def _read(journal: Any, name: str, start: int, index: ReplayIndex) -> tuple[ReplayIndex, int]:
    """Index `name`'s records from lsn `start`; the index and the next lsn to read."""
    last = [start - 1]

    def track(records: Any) -> Any:
        for rec in records:
            last[0] = rec.lsn
            yield rec

    index.extend(track(journal.read(name, start)))
    return index, last[0] + 1


def deliver_journaled(s: Session) -> None:
    """Hand the program the outcomes the journal now holds for its calls in flight."""
    engine, runtime = s._engine, s.runtime
    with s._drive.lock:
        for call in list(engine.core.calls.values()):
            jc = engine.replay.calls.get(call.seq)
            if jc is None or not jc.results:
                continue
            for rank in list(call.targets):
                res = jc.results.get(rank)
                if rank in call.results or res is None or "big" in res:
                    continue
                outcome = engine.replayed(jc, rank)
                runtime.deliver_local(call, rank, outcome)
                if outcome.status == "exit":
                    s._replayed_exit(call, rank, outcome)


class _CatchUpRuntime:
    """The runtime while catching up: outcomes come from the journal, nothing is sent."""

    reply_address = ""  # calls made now get the leader's when they are sent (_send_unanswered)
    fenced = None
    relay = False

    def __init__(self, core: Any, drive: Any, edge: CatchUpEdge):
        self.core, self.drive, self.edge = core, drive, edge
        self.procs: dict[str, ProcRef] = {}
        self.hosts: dict[str, str] = {}
        self.lost_hosts: dict[str, str] = {}
        self.moved_hosts: dict[str, str] = {}
        self.groups: dict[str, list[ProcRef]] = {}
        self.checkpoint_seq = -1
        self.quiet: Callable[[], bool] = lambda: True
        self._max_message = max_message_bytes()

    def refuse_oversized_call(self, actor: str, method: str, frames: Any) -> None:
        """As a live runtime does: a call too large to send was refused to the primary too."""
        refuse_oversized_call(actor, method, frames, self._max_message, self.core.session,
                              "tcp://127.0.0.1:65535")  # the longest loopback reply address

    def deliver_local(self, call: PendingCall, point: int, outcome: Any) -> None:
        if self.core.on_result(call.seq, point, outcome) is not None:
            call.sink.deliver(call, point)

    def wait_for(self, fut: Any, timeout: float | None) -> bool:
        """A result: from the journal's tail, else from the worker once this one leads. A
        deadline is the journal's while catching up (it holds the timeout the primary saw)."""
        if fut.done():
            return True
        s, seq = self.edge.session, fut.tag
        engine = s._engine

        def ready() -> bool:
            return fut.done() or (timeout is not None and (seq, "timeout", engine.timeouts.get(seq, 0))
                                  in engine.replay.obs)

        if self.edge.await_journal(ready) and not fut.done():
            with self.drive.lock:
                engine.replayed_timeout(seq)
            raise TimeoutError(f"call seq {seq} not complete after {timeout} s (replayed)")
        return fut.done() or s.runtime.wait_for(fut, timeout)

    def wait_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.edge.await_journal(done, deadline):
            return True
        if self.edge.catching_up:
            return False  # the deadline passed while catching up
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self.edge.session.runtime.wait_until(done, left)

    def flush(self) -> None:
        """Nothing is sent while catching up."""

    def drain_ready(self) -> None:
        """No inbox: outcomes come from the journal."""


class _Membership:
    """Process groups formed and spares adopted while catching up, for the live supervisor."""

    def __init__(self) -> None:
        self.formed_groups: list[tuple] = []
        self.adopted: list[str] = []

    def formed(self, *args: Any) -> None:
        self.formed_groups.append(args)

    def adopt_journaled(self, cluster: str) -> None:
        self.adopted.append(cluster)


class _CatchUpSupervisor:
    """The supervisor while catching up: it keeps the meshes the replay made, to register them
    with the live one. Failures are the journal's (the faults it records reach the program)."""

    warmer = None

    def __init__(self) -> None:
        self.meshes: dict = {}
        self.membership = _Membership()
        self.shapes: Any = None
        self.on_unhandled: Any = None

    def register(self, state: Any) -> None:
        self.meshes[state.name] = state

    def stopped(self, mesh: str, ranks: Any) -> None:
        state = self.meshes.get(mesh)
        if state is not None:
            state.stopped.update(ranks)

    def failed(self, *args: Any, **kwargs: Any) -> None:
        """A journaled failure: the previous leaders handled it, and journaled what they did."""

    def note(self, ev: str, **data: Any) -> None:
        """Replayed steps note nothing."""

    def close(self) -> None:
        pass


class _CatchUpClusters:
    """Cluster hosts while catching up: the journal says which were picked; they are greeted
    and watched once this controller leads."""

    def __init__(self, edge: CatchUpEdge):
        self.edge = edge

    def attach(self, cluster: str, entries: list[dict], replaying: bool) -> list[str]:
        if not self.edge.catching_up:
            return self.edge.clusters().attach(cluster, entries, replaying)
        self.edge._attached.append((cluster, entries))
        return [e["addr"] for e in entries]

    def __getattr__(self, name: str) -> Any:
        """A live pick: the program made it once it led."""
        if self.edge.catching_up:
            raise CatchUpError(f"cluster hosts asked for {name!r} while catching up (a regent bug: report it; "
                               "REGENT_CATCHUP=0 replays after the takeover instead)")
        return getattr(self.edge.clusters(), name)


__all__ = ["CATCHUP_ENV", "CatchUpEdge", "CatchUpError", "deliver_journaled", "wants_catchup"]
