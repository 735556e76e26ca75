"""The session's decisions, with no IO: what a Session drives and its tests feed directly.

The engine numbers the program's side effects (invariant 1), matches them against the journal
on replay (invariant 6), decides which journaled outcomes a call must see durable before it
may go out (invariant 4), what record each outcome gets, which observations are journaled and
how a replay answers them (choose picks, stream order, deadlines, values), and how far workers
may drop cached results (invariant 11). Its inputs are events and facts the driver hands in
(durable lsns, writer tickets, loads, arrival order); its outputs are decisions and small
effect values the driver carries out (append, collect, await reads, send, deliver). No
sockets, stores, threads, sleeps or clocks here: the driver passes timestamps in. One thread
steps it at a time, the one holding the session's drive (controller/drive.py).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from regent import wire
from regent.controller.core import ControllerCore, Outcome, PendingCall
from regent.controller.replay import (
    CALL,
    OBS,
    RESULT,
    RESULTS_MAX_BYTES,
    JournaledCall,
    LostResultError,
    ReplayIndex,
    covered,
)
from regent.journal.errors import JournalUnavailable, LeadershipLost
from regent.worker.dedupe import LARGE_RESULT_BYTES
from regent.worker.errors import SupervisionError, outcome_error

NEVER_DURABLE = 1 << 62  # the lsn of an outcome that could not be journaled
# An outcome journaled as an item of a CALLS record, until a writer ticket resolves its lsn:
# larger than any lsn, so never taken for durable.
COLLECTED = NEVER_DURABLE - 1
# A value read before a deadline: that it came in time may differ in another run, so a call
# made after it waits until it is durable, whichever proc holds it (no proc has this id).
IN_TIME = "<read before a deadline>"


# --- effects: what the driver must do -------------------------------------------------


@dataclass(slots=True, frozen=True)
class Append:
    """Journal one record; `durable`: wait until it is, before going on."""

    kind: str
    data: dict
    durable: bool = False
    lazy: bool = False  # bytes and small: the writer's thread may encode it


@dataclass(slots=True, frozen=True)
class Collect:
    """One item of the CALLS stream (a call's record, or a lone plain value after it)."""

    item: tuple


@dataclass(slots=True, frozen=True)
class AwaitReads:
    """Block until the outcomes the program has read are durable: through `lsn`, or, for
    values collected as items (`lsn` is COLLECTED), through the lsn `ticket` is bound to."""

    lsn: int
    ticket: int


@dataclass(slots=True, frozen=True)
class Send:
    """Send the call to one point (the IO edge encodes and queues its message)."""

    rank: int


_SENDS = 1024
_SEND = [Send(r) for r in range(_SENDS)]  # immutable: one each, not one per call


@dataclass(slots=True, frozen=True)
class Deliver:
    """Give one point an outcome decided on this side: the journal's, or a refusal."""

    rank: int
    outcome: Outcome


class Reads:
    """The durability rule's state: the last journaled outcome the program read and which
    proc processes hold read outcomes that are not durable yet."""

    __slots__ = ("lsn", "ticket", "holders")

    def __init__(self) -> None:
        self.lsn = -1
        self.ticket = 0  # for an lsn of COLLECTED: the writer's ticket taken at the read
        self.holders: set[str] = set()

    def observed(self, lsn: int, holders: Iterable[str], durable: int, ticket: int, bound: int | None) -> None:
        """The program read an outcome journaled at `lsn` (-1: from the journal; COLLECTED: an
        item whose lsn is not known yet) that the procs in `holders` keep until it is durable.
        `bound`: the lsn the previous ticket is bound to, if a close has ended since."""
        if lsn <= durable:
            return
        if self.lsn == COLLECTED and bound is not None:
            self.lsn = bound
        if self.lsn <= durable:
            self.holders.clear()  # what they held before is durable now
        if lsn > self.lsn:
            self.lsn = lsn
        if self.lsn == COLLECTED:
            # Taken after everything read so far was journaled or collected: its bound covers
            # every outcome read, the items and the records alike.
            self.ticket = ticket
        self.holders.update(holders)

    def wait_before(self, targets: Collection[str] | None, durable: int, durable_first: bool) -> AwaitReads | None:
        """Must a call to the proc processes `targets` (None: a host agent or the journal)
        wait for the reads first?

        A plain outcome is journaled off the latency path, and dedupe replays it from the
        worker's cache -- unless the proc holding it dies with the primary. Then a standby
        would see a SupervisionError (or a re-run) where the program saw a value, and a call
        issued after the read must not have run on a proc that survives. So a call waits,
        except one to the one proc process that holds every such outcome (if it dies, what the
        call did dies with it; if it lives, its cache replays them), and one that journals a
        durable record before it is sent (`durable_first`: durability comes in lsn order)."""
        if self.lsn <= durable or durable_first:
            return None
        holders = self.holders
        if targets is not None and len(holders) == 1 and all(t in holders for t in targets):
            return None
        return AwaitReads(self.lsn, self.ticket)

    def durable(self, lsn: int) -> None:
        """What the program read is durable now, through `lsn`."""
        self.lsn = lsn
        self.holders.clear()


class Releases:
    """The release watermark: the highest seq whose calls are all complete and journaled."""

    __slots__ = ("marks", "collected", "safe")

    def __init__(self) -> None:
        self.marks: collections.deque = collections.deque()  # (seq, lsn) of handed-over outcomes
        self.collected: collections.deque = collections.deque()  # seqs of values collected as items
        self.safe = -1

    def through(self, releasable: int, durable: int, seal: Any) -> int:
        """`releasable`: the core's (read first: every outcome it no longer counts registered
        its mark before). `seal()` gives the items collected so far their bound lsn."""
        collected = self.collected
        if collected:
            n = len(collected)
            try:
                bound = seal()
            except Exception:  # noqa: BLE001 - the writer failed: they will never be durable
                bound = NEVER_DURABLE
            for _ in range(n):
                self.marks.append((collected.popleft(), bound))
        marks = self.marks
        while marks and marks[0][1] <= durable:
            marks.popleft()
        pending = min((s for s, _ in marks), default=None)
        safe = releasable if pending is None else min(releasable, pending - 1)
        self.safe = max(self.safe, safe)
        return self.safe


class Engine:
    """The decisions of one session run (see the module docstring)."""

    def __init__(self, sid: str, replay: ReplayIndex | None, *, journaled: bool = True,
                 value_limit: int = LARGE_RESULT_BYTES):
        self.sid = sid
        self.core = ControllerCore(sid)
        self.replay = replay
        self.replaying = replay is not None and replay.max_seq >= 0
        self.journaled = journaled
        self.value_limit = value_limit
        self.reads = Reads()
        self.releases = Releases()
        self.timeouts: dict[int, int] = {}
        self.choose_rr = itertools.count()
        self.stats = {"replayed": 0, "resent": 0, "live": 0}
        self.lost: LostResultError | None = None  # a replay that cannot go on

    # --- seqs and replay matching ---------------------------------------------------

    def issue(self) -> tuple[int, bool]:
        """The next seq, and whether replay ends with it (the program goes live)."""
        seq = self.core.issue()
        if self.replaying and seq > self.replay.max_seq:
            self.replaying = False
            return seq, True
        return seq, False

    def match(self, seq: int, kind: str, actor: str = "", method: str = "", digest: bytes = b"",
              points: Any = None) -> JournaledCall | None:
        """The journaled call at seq if the new one matches it (NonDeterminismError if not);
        None past the journal's end."""
        if self.replay is None:
            return None
        return self.replay.check(seq, kind, actor, method, digest, points)

    def next_journaled(self) -> JournaledCall | None:
        """The journal's record at the next seq, while replaying (None past its end)."""
        if not self.replaying:
            return None
        return self.replay.calls.get(self.core.next_seq)

    def journal_answers(self, seq: int) -> bool:
        """Does the journal hold an outcome for every point of call `seq`?"""
        jc = self.replay.calls.get(seq) if self.replay is not None else None
        if jc is None or not jc.results:
            return False
        call = self.core.calls.get(seq)
        return call is None or all(r in jc.results for r in call.targets)

    # --- the call path ----------------------------------------------------------------

    def choose(self, seq: int, candidates: list[int], load: Mapping[int, int]) -> tuple[int, Append | None]:
        """A choose's pick: the journaled one on replay, else the least loaded candidate (ties
        round-robin), journaled durably before anything is sent."""
        key = (seq, "choose", 0)
        if self.replay is not None and key in self.replay.obs:
            return self.replay.obs[key], None
        low = min(load[r] for r in candidates)
        best = [r for r in candidates if load[r] == low]
        rank = best[next(self.choose_rr) % len(best)]
        return rank, Append(OBS, {"s": seq, "w": "choose", "i": 0, "v": rank}, durable=True)

    def expect(self, seq: int, kind: str, actor: str, method: str, targets: dict[int, str], sink: Any,
               jc: JournaledCall | None) -> PendingCall:
        """A call about to be sent; a replayed one checks digest-only results against the journal."""
        call = self.core.expect(seq, kind, actor, method, targets, sink)
        if jc is not None:
            big = {r: tuple(res["big"]) for r, res in jc.results.items() if "big" in res and r in targets}
            if big:
                call.expected = big
        return call

    def call_record(self, seq: int, kind: str, actor: str, method: str, digest: bytes, ranks: tuple,
                    ts: float, task: str | None = None) -> Collect:
        """A live call's record: an item of a CALLS record, which nobody waits for (a takeover
        sends an unjournaled call again and the worker dedupes it). A tuple of atoms, which the
        cyclic GC stops tracking. `task`: the async program's task that made it, if any."""
        self.stats["live"] += 1
        if task is None:
            return Collect((seq, kind, actor, method, digest, ranks, ts))
        return Collect((seq, kind, actor, method, digest, ranks, ts, task))

    def dispatch(self, jc: JournaledCall | None, ranks: Iterable[int],
                 unavailable: Mapping[int, str]) -> list[Send | Deliver]:
        """What becomes of each point of a call just expected: answered from the journal,
        failed at once (`unavailable`: the reason its actor cannot take calls), or sent."""
        if jc is None and not unavailable:  # a live call: every point is sent (the usual case)
            return [_SEND[r] if r < _SENDS else Send(r) for r in ranks]
        effects: list[Send | Deliver] = []
        for r in ranks:
            outcome = self.replayed(jc, r)
            if outcome is not None:
                effects.append(Deliver(r, outcome))
            elif r in unavailable:
                effects.append(Deliver(r, Outcome("dead", {"em": unavailable[r], "pt": r}, [])))
            else:
                effects.append(Send(r))
        return effects

    def replayed(self, jc: JournaledCall | None, rank: int) -> Outcome | None:
        """The journal's outcome for a point, if it holds one the program can be given."""
        res = jc.results.get(rank) if jc is not None else None
        if res is None or "big" in res:
            if jc is not None:
                self.stats["resent"] += 1
            return None
        self.stats["replayed"] += 1
        meta = {"pt": res["pt"], **(res.get("x") or {})}
        return Outcome(res["st"], meta, res.get("v") or (), journaled=True)

    # --- deadlines and reads ----------------------------------------------------------

    def replayed_timeout(self, seq: int) -> bool:
        """Did the program see its next deadline for `seq` pass, as the journal records?"""
        n = self.timeouts.get(seq, 0)
        if self.replay is not None and (seq, "timeout", n) in self.replay.obs:
            self.timeouts[seq] = n + 1
            return True
        return False

    def deadline(self, seq: int, timeout: float | None) -> float | None:
        """How long to wait for `seq`'s outcome: where the journal holds it, the clock decides
        nothing on replay."""
        return None if timeout is None or self.journal_answers(seq) else timeout

    def timed_out(self, seq: int, timeout: float | None) -> Append:
        """A deadline passed: journaled durably, since it may differ in another run."""
        n = self.timeouts.get(seq, 0)
        self.timeouts[seq] = n + 1
        return Append(OBS, {"s": seq, "w": "timeout", "i": n, "v": timeout}, durable=True)

    def stream_pick(self, seq: int, i: int) -> int | None:
        """The rank the journal says the stream yielded i-th, if it says so."""
        key = (seq, "stream", i)
        return self.replay.obs[key] if self.replay is not None and key in self.replay.obs else None

    @staticmethod
    def stream_yielded(seq: int, i: int, rank: int) -> Append:
        return Append(OBS, {"s": seq, "w": "stream", "i": i, "v": rank}, durable=True)

    @staticmethod
    def read_holders(holders: Iterable[str], deadline: float | None) -> Iterable[str]:
        """Who holds a value read: a read with a deadline is held by no proc (see IN_TIME)."""
        return holders if deadline is None else (IN_TIME,)

    # --- values the program asks the session for --------------------------------------

    @staticmethod
    def value_record(seq: int, kind: str, stored: Any, actor: str | None = None, method: str | None = None) -> Append:
        """A value the program observed; `actor` and `method` (default: the kind) are what a
        replay checks the program asks for again (host_mesh: the cluster and the count)."""
        return Append(CALL, {"s": seq, "k": kind, "a": actor or kind, "m": method or kind, "v": stored}, durable=True)

    @staticmethod
    def loop_record(seq: int, what: str, digest: bytes, value: dict) -> Append:
        """A wake-up of the session's event loop that another run might not repeat: journaled
        before the tasks see it, and durable before the next call goes out (controller/loop.py).
        `digest`: of what could have happened instead, which a replay checks."""
        return Append(CALL, {"s": seq, "k": "loop", "a": "loop", "m": what, "d": digest, "v": value})

    def outstanding_before(self, seq: int) -> bool:
        """Is a call before `seq` still in flight (the checkpoint barrier waits for none)?"""
        return any(c < seq for c in self.core.calls)

    def skip_to(self, seq: int) -> bool:
        """A checkpoint covers everything through `seq`: the program continues after it.
        Returns whether replay ends there."""
        core = self.core
        for s in range(core.next_seq, seq + 1):
            core.finished(s)
        core.next_seq = seq + 1
        if self.replaying and core.next_seq > self.replay.max_seq:
            self.replaying = False
            return True
        return False

    # --- outcomes, as replies arrive ------------------------------------------------------

    def outcome_record(self, call: PendingCall, point: int, outcome: Outcome, size: int,
                       ts: float) -> Collect | Append | None:
        """The record that journals one point's outcome before the program can see it (None:
        nothing to journal). `size`: the payload's bytes, for status ok; `ts`: now."""
        status = outcome.status
        if status in ("fenced", "lost") or not self.journaled:
            return None
        if status == "ok":
            if "fd" in outcome.meta:  # folded into its host's folder's item, journaled just before
                outcome.lsn = COLLECTED
                return None
            if size <= LARGE_RESULT_BYTES:
                # An item of the CALLS stream, after its call's: no record of its own and no
                # lock on the program's path. Its lsn comes later, through the writer's tickets.
                outcome.lsn = COLLECTED
                self.releases.collected.append(call.seq)
                item = (call.seq, point, wire.frame_bytes(outcome.frames), ts)
                fp = outcome.meta.get("fp")
                return Collect((*item, fp) if fp else item)  # a host's fold: its points too
            data: dict[str, Any] = {"s": call.seq, "pt": point, "st": status}
            if size <= self.value_limit:
                data["v"] = wire.frame_bytes(outcome.frames)  # too large for a CALLS item
            else:
                data["big"] = [wire.digest(outcome.frames), size]
            return Append(RESULT, data, lazy=True)
        data = {"s": call.seq, "pt": point, "st": status,
                "x": {k: outcome.meta[k] for k in ("et", "em", "tb", "pid", "normal") if k in outcome.meta}}
        # A supervision failure may differ between runs: durable before it is seen (invariant 4).
        return Append(RESULT, data, durable=status in ("dead", "exit", "noactor", "grp"))

    def journaled_at(self, seq: int, lsn: int) -> None:
        """An outcome of `seq` was submitted at `lsn` (NEVER_DURABLE: it could not be)."""
        self.releases.marks.append((seq, lsn))

    def batch_record(self, replies: list[tuple[wire.Kind, dict, list]], size: int) -> tuple[int, list[int]] | None:
        """Which replies of a batch one RESULTS record journals (their indices), with the lowest
        seq among them; None: each reply gets its own record. Under a pipelined load replies
        arrive a hundred to a message, and a record per reply costs more than the call."""
        if not self.journaled or len(replies) < 2 or size > RESULTS_MAX_BYTES:
            return None
        marked = covered(replies, size <= LARGE_RESULT_BYTES)
        if len(marked) < 2:
            return None
        low = NEVER_DURABLE
        calls = self.core.calls
        for i in marked:
            meta = replies[i][1]
            call = calls.get(meta["s"])
            # A repeated reply (a resend answered twice) is not journaled again: then the batch
            # goes reply by reply, where only the first answer counts.
            if call is None or meta["pt"] in call.results:
                return None
            low = min(low, meta["s"])
        return low, marked

    # --- what the program sees ----------------------------------------------------------

    def decode(self, call: PendingCall, outcome: Outcome) -> Any:
        """An outcome as the program sees it: its value, or the error it raises."""
        st = outcome.status
        if st == "ok":
            return wire.loads(outcome.frames) if outcome.frames else None
        meta = outcome.meta
        who = f"{call.actor}[{meta.get('pt', '?')}]"
        error = outcome_error(st, meta, who, call.method)
        if error is not None:
            raise error
        if st == "fenced":
            raise LeadershipLost(f"{who} refused {call.method}: {meta.get('em')}")
        if st == "unjournaled":
            raise JournalUnavailable(f"{who}.{call.method}: {meta.get('em')}")
        if st == "lost":
            self.lost = LostResultError(str(meta.get("em")))
            raise self.lost
        raise SupervisionError(f"{who}.{call.method}: unexpected status {st!r}", actor=who, reason=st)


__all__ = ["COLLECTED", "IN_TIME", "NEVER_DURABLE", "Append", "AwaitReads", "Collect", "Deliver", "Engine",
           "Reads", "Releases", "Send"]
