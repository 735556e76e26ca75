"""`regent journal replay`: a controller program run again against its journal, with no workers.

The program runs in this process with an audit's edge installed (controller/edge.py): its
`Session(...)` is an ordinary Session and engine, fed by an edge that opens no store, never
campaigns, starts no host agent and opens no socket. Every call is checked against its record
(invariant 6) and answered from it; the report is OK, the first divergence, or what the
journal could not answer. The same path a standby replays through, with journal-only IO.
Running the program unpickles the results it sees, as running it for real would: audit
programs you would run.
"""

from __future__ import annotations

import os
import pickle
import runpy
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from regent.controller import edge as edges
from regent.controller.core import Outcome
from regent.controller.drive import Drive
from regent.controller.engine import Engine
from regent.controller.ephemeral import RefusingWriter
from regent.controller.mesh import StreamSink
from regent.controller.replay import (
    END,
    START,
    JournaledCall,
    NonDeterminismError,
    ReplayIndex,
    describe,
)
from regent.wire.transport import max_message_bytes, refuse_oversized_call
from regent.worker.errors import RegentError


class AuditGap(RegentError):
    """The program needs something the journal does not hold (a large result kept by the
    worker, a result the primary never journaled): a real worker would be asked for it."""


class AuditComplete(BaseException):  # noqa: N818 - a control-flow signal, like StopIteration
    """The program matched every call of a run that has not ended, and went on past it: made
    a call past the last journaled one, or waits for a result not journaled yet (`waiting`)."""

    def __init__(self, seq: int, waiting: str | None = None):
        super().__init__(f"the program reached the end of the journal at seq {seq}")
        self.seq = seq
        self.waiting = waiting


@dataclass
class AuditContext:
    session: str
    index: ReplayIndex
    checkpoint: dict | None
    url: str = ""
    divergence: dict | None = None
    mode: str = "from the start of the run"
    gaps: list[str] = field(default_factory=list)
    checked: int = 0
    bar: Any = None

    def diverge(self, seq: int, jc: JournaledCall | None, new: dict | None) -> None:
        """Keep the first divergence for the report's field-by-field table."""
        old = None if jc is None else {"kind": jc.kind, "actor": jc.actor, "method": jc.method,
                                       "digest": jc.digest, "points": list(jc.points)}
        self.divergence = {"seq": seq, "journaled": old, "new": new}

    def progress(self, seq: int) -> None:
        if self.bar is not None:
            self.bar.n = min(seq + 1, self.bar.total or seq + 1)
            self.bar.refresh()


class _NoRuntime:
    """The IO edge of an audit: results come from the journal; asking a worker is a gap."""

    reply_address = ""
    fenced = None
    relay = False  # nothing is sent, through agents or otherwise

    def __init__(self, core: Any, drive: Drive, ctx: AuditContext):
        self.core = core
        self.drive = drive
        self.ctx = ctx
        self.procs: dict = {}
        self.hosts: dict = {}
        self.lost_hosts: dict = {}
        self.checkpoint_seq = -1
        self.max_message = max_message_bytes()  # this process's setting, as the run's was

    def deliver_local(self, call: Any, point: int, outcome: Outcome) -> None:
        if self.core.on_result(call.seq, point, outcome) is not None:
            call.sink.deliver(call, point)

    def wait_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Everything an audit can answer was answered from the journal when it was issued; a
        wait with a deadline (an event loop's timer) passes at once: an audit never waits."""
        with self.drive:
            if done():
                return True
            if timeout is not None:
                return False
            missing = [(c.seq, c.actor, c.method, sorted(set(c.targets) - set(c.results)))
                       for c in self.core.calls.values()]
        self._at_live_tail(missing)
        what = ", ".join(f"seq {s} {a}.{m} (points {p})" for s, a, m, p in missing[:3]) or "a call"
        raise AuditGap(f"the program waits for {what}, whose results the journal does not hold (kept by the "
                       "worker, or never journaled): an audit cannot answer it")

    def wait_for(self, fut: Any, timeout: float | None) -> bool:
        if fut.done():
            return True
        waiting = [c for c in self.core.calls.values() if getattr(c.sink, "future", None) is fut]
        what = f"seq {waiting[0].seq} {waiting[0].actor}.{waiting[0].method}" if waiting else "a call"
        missing = sorted(set(waiting[0].targets) - set(waiting[0].results)) if waiting else []
        if waiting:
            self._at_live_tail([(waiting[0].seq, waiting[0].actor, waiting[0].method, missing)])
        raise AuditGap(f"the program waits for {what} (points {missing}), whose result the journal does "
                       "not hold (kept by the worker, or never journaled): an audit cannot answer it")

    def _at_live_tail(self, missing: list[tuple[int, str, str, list[int]]]) -> None:
        """A run that has not ended may simply not have journaled these results yet (group
        commit writes plain results after the fact; a primary killed first never does): waiting
        on them is reaching the live end of the journal, as a call past its last record is. A
        result kept as a digest, or any missing result of a run that ended, stays a gap."""
        index = self.ctx.index
        missing = [m for m in missing if m[3]]
        if index.ended or not missing:
            return
        for seq, _, _, points in missing:
            jc = index.calls.get(seq)
            if jc is None or any(p in jc.results for p in points):
                return
        seq, actor, method, _ = min(missing)
        self.ctx.gaps[:] = [g for g in self.ctx.gaps if not any(g.startswith(f"seq {m[0]} ") for m in missing)]
        raise AuditComplete(self.core.next_seq, f"seq {seq} {actor}.{method}")

    def refuse_oversized_call(self, actor: str, method: str, frames: Any) -> None:
        """As the live edge: a call too large to send was refused there, so it is here."""
        refuse_oversized_call(actor, method, frames, self.max_message, self.core.session,
                              "tcp://127.0.0.1:65535")  # the longest loopback reply address

    def host_request(self, host: str, op: str, **_: Any) -> dict:
        raise AuditGap(f"the program needs host agent {host} to {op!r}, and the journal does not say "
                       "what it answered")

    def host_requests(self, asks: list[tuple[str, str, dict]], timeout: float = 60.0,
                      timeouts: bool = False) -> list[dict]:
        return [self.host_request(host, op) for host, op, _ in asks]

    def flush(self) -> None:
        """Nothing is ever queued for a worker in an audit."""

    def drain_ready(self) -> None:
        """An audit has no inbox: every answer came from the journal when its call was issued."""

    def register_host(self, host: str) -> None:
        pass

    def mark_dead(self, proc: Any, reason: str) -> None:
        pass

    def close(self) -> None:
        pass


class _NoMembership:
    """An audit re-forms no groups and picks no spares: the journal says what the session did."""

    def formed(self, *args: Any) -> None:
        pass

    def adopt_journaled(self, cluster: str) -> None:
        pass


class _NoSupervisor:
    def __init__(self) -> None:
        self.meshes: dict = {}
        self.membership = _NoMembership()
        self.shapes: Any = None

    def register(self, state: Any) -> None:
        self.meshes[state.name] = state

    def failed(self, *args: Any, **kwargs: Any) -> None:
        pass

    def note(self, ev: str, **data: Any) -> None:
        """An audit journals no event."""

    def close(self) -> None:
        pass


class _CheckpointView:
    """What `resume` reads of the store: the checkpoint the audit loaded beforehand."""

    def __init__(self, ctx: AuditContext):
        self._ctx = ctx

    def read_checkpoint(self, session: str) -> dict | None:
        return self._ctx.checkpoint

    def close(self) -> None:
        pass

class _NoLead:
    """An audit leads nothing."""

    def checkpoint(self, data: dict, *, lsn: int | None = None) -> None:
        raise AuditGap("the program tried to store a new checkpoint: an audit only reads")


class _JournaledClusters:
    """An audit's clusters: the hosts a run picked are in the journal; none are asked anything."""

    def pick(self, cluster: str, n: int, timeout_s: float) -> list[dict]:
        raise AuditGap(f"the program picked {n} hosts of cluster {cluster!r}, and the journal does not say "
                       "which it got")

    def attach(self, cluster: str, entries: list[dict], replaying: bool) -> list[str]:
        return [e["addr"] for e in entries]


class AuditEdge:
    """The journal-only edge a program's Session gets inside an audit (see the module docstring)."""

    audit = True
    catching_up = False
    journaled = False  # nothing an audit sees is to be written
    holder = "audit"
    waited = False
    role = "audit"

    def __init__(self, ctx: AuditContext, name: str, journal: str | None = None):
        if name != ctx.session:
            raise AuditGap(f"the program opened session {name!r}, but this audit replays {ctx.session!r}: "
                           "pass the program the arguments it ran with (after --)")
        if ctx.index.run is None:
            raise AuditGap(f"the journal holds no run of session {name!r}")
        self.ctx = ctx
        self.name = name
        self.journal = _CheckpointView(ctx)
        self.journal_url = ctx.url
        self.lead = _NoLead()
        self.takeover_at = time.monotonic()
        self.epoch = ctx.index.epochs[-1] if ctx.index.epochs else 0
        self.replay = ctx.index
        self.run_id = ctx.index.run
        self.sid = f"{name}.{self.run_id}"

    def connect(self, core: Any, drive: Drive, outcomes: Any, on_failure: Callable,
                on_lost: Callable[[str], None]) -> None:
        self.writer = RefusingWriter(lambda kind: AuditGap(
            f"the program tried to journal a new {kind!r} record: an audit only reads"))
        outcomes.use(self.writer)
        self.runtime = _NoRuntime(core, drive, self.ctx)
        self.supervisor = _NoSupervisor()

    def live(self, engine: Engine | None = None) -> None:
        """An audit never goes live: past the journal's end it stops (match)."""

    def match(self, engine: Engine, seq: int, kind: str, actor: str, method: str, digest: bytes,
              points: Any) -> JournaledCall | None:
        ctx = self.ctx
        ctx.progress(seq)
        jc = ctx.index.calls.get(seq)
        new = {"kind": kind, "actor": actor, "method": method, "digest": digest,
               "points": None if points is None else list(points)}
        if jc is None:
            if ctx.index.ended:
                ctx.diverge(seq, None, new)
                raise NonDeterminismError(seq, f"no call: the recorded run ended after seq {ctx.index.max_seq}",
                                          describe(kind, actor, method, digest, points or ()))
            raise AuditComplete(seq)
        try:
            found = engine.match(seq, kind, actor, method, digest, points)
        except NonDeterminismError:
            ctx.diverge(seq, jc, new)
            raise
        ctx.checked += 1
        return found

    def attach_host(self, host: str) -> str:
        return host

    def clusters(self) -> _JournaledClusters:
        return _JournaledClusters()

    @staticmethod
    def local_host() -> str:
        raise AuditGap("the program asked for this host, and the journal does not say which it was")

    def resume_from(self, seq: int, data: dict) -> bool:
        if all(s in self.replay.calls for s in range(seq + 1, data["seq"] + 1)):
            # Nothing compacted: check every call, and the checkpointed state on the way.
            self.ctx.mode = "from the start of the run (nothing compacted)"
            return False
        self.ctx.mode = f"from the checkpoint at seq {data['seq']} (earlier calls were compacted)"
        return True

    def replayed_checkpoint(self, seq: int, state: Any) -> None:
        ckpt = self.ctx.checkpoint
        data = ckpt["data"] if ckpt else None
        if data and data.get("run") == self.run_id and data["seq"] == seq:
            recorded = pickle.loads(data["state"])
            if recorded != state:
                self.ctx.divergence = {"seq": seq, "journaled": {"state": recorded}, "new": {"state": state}}
                raise NonDeterminismError(seq, f"checkpoint(state) with state {_short(recorded)}",
                                          f"checkpoint(state) with state {_short(state)}")

    def unanswered(self, call: Any, rank: int) -> bool:
        """A call the journal cannot answer: a gap (the program may never wait for it)."""
        reason = f"seq {call.seq} {call.actor}[{rank}].{call.method}: no result in the journal"
        res = self.replay.calls[call.seq].results.get(rank)
        if res is not None and res.get("big"):
            reason += f" (a {res['big'][1]}-byte result, kept by the worker until the next checkpoint)"
        self.ctx.gaps.append(reason)
        if isinstance(call.sink, StreamSink):
            raise AuditGap(reason)
        return False

    def finish(self, session: Any, error: BaseException | None) -> None:
        """The program closed its session: without an error it must have made every call."""
        if error is None:
            following = [s for s in self.replay.calls if s >= session.core.next_seq]
            if following:
                seq = min(following)
                jc = self.replay.calls[seq]
                self.ctx.diverge(seq, jc, None)
                raise NonDeterminismError(seq, jc.describe(), "no further call: the program ended")


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass
class AuditReport:
    session: str
    program: str
    ok: bool
    outcome: str
    calls: int
    mode: str
    divergence: dict | None = None
    gaps: list[str] = field(default_factory=list)
    error: BaseException | None = None

    def render(self) -> str:
        lines = [f"audit replay of session {self.session!r} with {self.program}: "
                 + ("OK" if self.ok else "FAILED"), f"  {self.outcome}",
                 f"  {self.calls} calls checked {self.mode}"]
        if self.divergence:
            lines += ["", *_diff_table(self.divergence)]
        if self.gaps:
            lines += ["", f"  {len(self.gaps)} calls the program never waited for had no journaled result:"]
            lines += [f"    {g}" for g in self.gaps[:10]]
        return "\n".join(lines)


def _diff_table(div: dict) -> list[str]:
    old, new = div.get("journaled") or {}, div.get("new") or {}
    rows = [f"  first divergence at seq {div['seq']}:", f"    {'':2}{'field':<10} {'journal':<40} program"]
    for key in ("kind", "actor", "method", "points", "digest", "state"):
        if key not in old and key not in new:
            continue
        a, b = old.get(key, "-"), new.get(key, "-")
        mark = "!" if a != b else " "
        rows.append(f"    {mark:2}{key:<10} {_cell(a):<40} {_cell(b)}")
    return rows


def _cell(v: Any) -> str:
    return v.hex()[:16] if isinstance(v, bytes) else _short(v, 38)


def replay_program(program: str, session: str, records: Iterable, checkpoint: dict | None,
                   argv: Iterable[str] = (), url: str = "", progress: bool | None = None) -> AuditReport:
    """Run `program` against the recorded journal of `session`, with no workers.

    records: the session's journal records (read beforehand: the replay itself touches no
    store). Returns a report: OK, the first divergence, or what the journal could not answer.
    """
    from tqdm import tqdm

    ending: list[dict] = []  # the run's end record: how it ended

    def watch(recs: Iterable) -> Iterator:
        for rec in recs:
            if rec.kind == START:
                ending.clear()
            elif rec.kind == END:
                ending.append(rec.data)
            yield rec

    index = ReplayIndex(watch(tqdm(records, desc="reading journal", unit="rec", disable=_no_bar(progress),
                                   leave=False)))
    ctx = AuditContext(session, index, checkpoint, url)
    ctx.bar = tqdm(total=index.max_seq + 1, desc=f"replaying {session}", unit="call", disable=_no_bar(progress),
                   leave=False)
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [program, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))  # as `python program.py` would
    error: BaseException | None = None
    try:
        with edges.installed(lambda name, journal: AuditEdge(ctx, name, journal)):
            runpy.run_path(program, run_name="__main__")
        ok, outcome = True, f"the program made every call the journal records, in order, through seq {index.max_seq}"
    except AuditComplete as e:
        past = ("went on past the end of the journal" if e.waiting is None else
                f"waits for the result of {e.waiting}, which the journal does not hold yet")
        ok, outcome = True, (f"the program matched every recorded call (seq 0..{e.seq - 1}) and {past}: this run "
                             "has not ended")
    except NonDeterminismError as e:
        ok, outcome, error = False, str(e), e
    except AuditGap as e:
        ok, outcome, error = False, f"the journal cannot answer the program: {e}", e
    except SystemExit as e:
        ok = e.code in (0, None)
        outcome = "the program exited" + ("" if ok else f" with status {e.code}")
    except Exception as e:  # noqa: BLE001 - the program's own failure, reported as such
        error = e
        recorded = ending[-1].get("error") if ending else None
        if recorded is not None and recorded == repr(e)[:2000]:
            ok, outcome = True, f"the program failed as the recorded run did: {type(e).__name__}: {e}"
        else:
            ok, outcome = False, f"the program raised {type(e).__name__}: {e}"
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
        ctx.bar.close()
    return AuditReport(session, program, ok, outcome, ctx.checked, ctx.mode, ctx.divergence, ctx.gaps, error)


def _no_bar(progress: bool | None) -> bool | None:
    return None if progress is None else not progress

