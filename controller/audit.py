"""Reading a session's journal as a person, an auditor or a tool would.

- `timeline`: one readable line per record, with filters (`regent journal show`); it
  never unpickles values (results are shown by size), so it is safe on any journal.
- `replay_program` (`regent journal replay`): the controller program re-run against its
  journal with no workers, reporting success or the first divergence.
- `export_perfetto`, `export_jsonl` (`regent journal export`).
"""

from __future__ import annotations

import collections
import datetime as _dt
import itertools
import json
import pickle
import runpy
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

from controller.core import ControllerCore, Outcome
from controller.mesh import HostMesh, StreamSink
from controller.replay import (
    CALL,
    CALLS,
    CHECKPOINT,
    END,
    OBS,
    PROCS,
    RESULT,
    START,
    SUPERVISION,
    VALUE_KINDS,
    JournaledCall,
    NonDeterminismError,
    ReplayIndex,
    describe,
    expand,
)
from controller.session import Session
from worker.errors import RegentError
from worker.logsetup import configure_logging
from worker.transport import max_message_bytes, refuse_oversized_call


@dataclass
class Filter:
    actor: str | None = None
    endpoint: str | None = None
    errors_only: bool = False
    since: float | None = None
    until: float | None = None


def _when(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def timeline(records: Iterable, flt: Filter | None = None) -> Iterator[str]:
    """One readable line per record that passes the filter."""
    flt = flt or Filter()
    calls: dict[int, tuple[str, str]] = {}
    for rec in expand(records):
        d = rec.data
        if rec.kind == CALL:
            calls[d["s"]] = (d.get("a", ""), d.get("m", ""))
        if flt.since is not None and rec.ts < flt.since or flt.until is not None and rec.ts > flt.until:
            continue
        actor, method = calls.get(d.get("s", -1), ("", "")) if isinstance(d, dict) else ("", "")
        if flt.actor and actor != flt.actor or flt.endpoint and method != flt.endpoint:
            continue
        line = _describe(rec, actor, method)
        if flt.errors_only and not _is_error(rec):
            continue
        yield f"{rec.lsn:>8}  e{rec.epoch:<6} {_when(rec.ts)}  {line}"


def _is_error(rec) -> bool:
    d = rec.data
    return (rec.kind == RESULT and d.get("st") != "ok") or rec.kind == SUPERVISION or (
        rec.kind == END and d.get("error")) or (rec.kind == OBS and d.get("w") == "timeout")


def _describe(rec, actor: str, method: str) -> str:
    d, k = rec.data, rec.kind
    if k == START:
        return f"run {d.get('run')} started"
    if k == CALL:
        kind = d.get("k")
        if "v" in d and kind in ("now", "random", "this_host"):
            return f"seq {d['s']:<6} {kind}() = {d['v']!r}"
        if kind in ("side_effect", "resume", "checkpoint"):
            return f"seq {d['s']:<6} {kind}()"
        return f"seq {d['s']:<6} {kind} {d.get('a')}.{d.get('m')} -> points {d.get('pts')}"
    if k == RESULT:
        where = f"seq {d['s']:<6} {actor}[{d.get('pt')}].{method}"
        if d.get("st") == "ok":
            size = d["big"][1] if d.get("big") else sum(len(b) for b in d.get("v") or [])
            kept = "kept by the worker" if d.get("big") else "in journal"
            return f"{where} ok ({size} bytes, {kept})"
        x = d.get("x") or {}
        return f"{where} {d.get('st').upper()} {x.get('et', '')} {x.get('em', '')}".rstrip()
    if k == OBS:
        return f"seq {d['s']:<6} observed {d.get('w')}[{d.get('i')}] = {d.get('v')!r}"
    if k == PROCS:
        return f"seq {d['s']:<6} procs " + ", ".join(f"{p['id']} pid {p['pid']}" for p in d.get("procs", []))
    if k == SUPERVISION:
        return f"supervision {d}"
    if k == CHECKPOINT:
        return f"seq {d.get('s')} checkpoint"
    if k == END:
        return "run ended" + (f" with error {d['error']}" if d.get("error") else "")
    return f"{k} {d}"


# --- audit replay: the program against its journal, with no workers -------------------
#
# `regent journal replay` runs a controller program in this process with an audit
# context installed. `Session(...)` inside the program then becomes an `AuditSession`
# (the one hook in controller/session.py, at construction): it never opens the journal
# store, campaigns, starts a host agent or creates a zmq context; every call is checked
# against the journal (invariant 6) and answered from it. Running the program unpickles
# the results it sees, as running it for real would: audit programs you would run.


class AuditGap(RegentError):
    """The program needs something the journal does not hold (a large result kept by the
    worker, a result the primary never journaled): a real worker would be asked for it."""


class AuditComplete(BaseException):  # noqa: N818 - a control-flow signal, like StopIteration
    """The program matched every call of a run that has not ended, and went on past it."""

    def __init__(self, seq: int):
        super().__init__(f"the program reached the end of the journal at seq {seq}")
        self.seq = seq


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

    def progress(self, seq: int) -> None:
        if self.bar is not None:
            self.bar.n = min(seq + 1, self.bar.total or seq + 1)
            self.bar.refresh()


_active: AuditContext | None = None


def active() -> AuditContext | None:
    """The audit replay in progress in this process, if any (read by Session at construction)."""
    return _active


class _NoWrites:
    """The journal writer of an audit: an audit never writes."""

    durable_lsn = -1

    def submit(self, kind: str, data: dict, *, lazy: bool = False) -> int:
        raise AuditGap(f"the program tried to journal a new {kind!r} record: an audit only reads")

    def collector(self, kind: str) -> Callable[[Any], None]:
        def refuse(item: Any) -> None:
            raise AuditGap(f"the program tried to journal a new {kind!r} record: an audit only reads")
        return refuse

    def ticket(self) -> int:
        return 0

    def bound(self, ticket: int) -> int | None:
        return -1

    def seal(self) -> int:
        return -1

    def wait_durable(self, lsn: int, timeout: float | None = None) -> None:
        pass

    def flush(self, timeout: float | None = None) -> int:
        return -1

    def close(self) -> None:
        pass


class _NoRuntime:
    """The IO edge of an audit: results come from the journal; asking a worker is a gap."""

    reply_address = ""
    fenced = None

    def __init__(self, core: ControllerCore):
        self.core = core
        self.lock = threading.Lock()
        self.procs: dict = {}
        self.hosts: dict = {}
        self.checkpoint_seq = -1
        self.max_message = max_message_bytes()  # this process's setting, as the run's was

    def deliver_local(self, call: Any, point: int, outcome: Outcome) -> None:
        with self.lock:
            done = self.core.on_result(call.seq, point, outcome)
        if done is not None:
            call.sink.deliver(call, point)

    def wait_for(self, fut: Any, timeout: float | None) -> bool:
        if fut.done():
            return True
        waiting = [c for c in self.core.calls.values() if getattr(c.sink, "future", None) is fut]
        what = f"seq {waiting[0].seq} {waiting[0].actor}.{waiting[0].method}" if waiting else "a call"
        missing = sorted(set(waiting[0].targets) - set(waiting[0].results)) if waiting else []
        raise AuditGap(f"the program waits for {what} (points {missing}), whose result the journal does "
                       "not hold (kept by the worker, or never journaled): an audit cannot answer it")

    def refuse_oversized_call(self, actor: str, method: str, frames: Any) -> None:
        """As the live edge: a call too large to send was refused there, so it is here."""
        refuse_oversized_call(actor, method, frames, self.max_message, self.core.session,
                              "tcp://127.0.0.1:65535")  # the longest loopback reply address

    def host_request(self, host: str, op: str, **_: Any) -> dict:
        raise AuditGap(f"the program needs host agent {host} to {op!r}, and the journal does not say "
                       "what it answered")

    def flush(self) -> None:
        """Nothing is ever queued for a worker in an audit."""

    def register_host(self, host: str) -> None:
        pass

    def mark_dead(self, proc: Any, reason: str) -> None:
        pass

    def close(self) -> None:
        pass


class _NoSupervisor:
    def __init__(self) -> None:
        self.meshes: dict = {}

    def register(self, state: Any) -> None:
        self.meshes[state.name] = state

    def failed(self, *args: Any, **kwargs: Any) -> None:
        pass

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


class AuditSession(Session):
    """A Session answered entirely from a recorded journal (see `replay_program`)."""

    def __init__(self, name: str, journal: str | None = None, **_: Any):
        ctx = _active
        assert ctx is not None, "AuditSession exists only inside an audit replay"
        if name != ctx.session:
            raise AuditGap(f"the program opened session {name!r}, but this audit replays {ctx.session!r}: "
                           "pass the program the arguments it ran with (after --)")
        if ctx.index.run is None:
            raise AuditGap(f"the journal holds no run of session {name!r}")
        configure_logging(only_if_unconfigured=True)
        self._ctx = ctx
        self.name = name
        self.journal = _CheckpointView(ctx)
        self.journal_url = ctx.url
        self.holder = "audit"
        self.waited = False
        self.lead = None
        self.takeover_at = time.monotonic()
        self.epoch = ctx.index.epochs[-1] if ctx.index.epochs else 0
        self._replay = ctx.index
        self.run_id = ctx.index.run
        self.sid = f"{name}.{self.run_id}"
        self.writer = _NoWrites()
        self._collect_call = self.writer.collector(CALLS)
        self.replaying = True  # for the whole audit: s.log stays quiet
        self.core = ControllerCore(self.sid)
        self._marks = collections.deque()
        self._safe_through = -1
        self.runtime = _NoRuntime(self.core)
        self._no_journal = False
        self._get_hook = self._get
        self._flush_hook = self.runtime.flush
        self._decode_hook = self._decode
        self._observed_lsn = -1  # every outcome comes from the journal
        self._observed_ticket = 0
        self._collected_marks = collections.deque()
        self._supervisor = _NoSupervisor()
        self._hosts = []
        self._actor_names = set()
        self._choose_rr = itertools.count()
        self._timeouts = {}
        self._resumed = False
        self._closed = False
        self._lost = None
        self.stats = {"replayed": 0, "resent": 0, "live": 0}
        self._log = structlog.get_logger("regent.program").bind(session=name)

    @property
    def role(self) -> str:
        return "audit"

    def close(self, error: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        if error is None:
            following = [s for s in self._replay.calls if s >= self.core.next_seq]
            if following:
                seq = min(following)
                jc = self._replay.calls[seq]
                self._diverge(seq, jc, None)
                raise NonDeterminismError(seq, jc.describe(), "no further call: the program ended")

    def _issue(self, procs: list | None = None, ranks: Iterable[int] = (), *, self_durable: bool = False) -> int:
        seq = self.core.issue()  # nothing is written: there is nothing to wait for
        self._ctx.progress(seq)
        return seq

    def _end_replay(self) -> None:
        pass

    def _journaled(self, seq: int, kind: str, actor: str = "", method: str = "", digest: bytes = b"",
                   points: Any = None) -> JournaledCall | None:
        jc = self._replay.calls.get(seq)
        new = {"kind": kind, "actor": actor, "method": method, "digest": digest,
               "points": None if points is None else list(points)}
        if jc is None:
            if self._replay.ended:
                self._diverge(seq, None, new)
                raise NonDeterminismError(seq, f"no call: the recorded run ended after seq {self._replay.max_seq}",
                                          describe(kind, actor, method, digest, points or ()))
            raise AuditComplete(seq)
        try:
            found = self._replay.check(seq, kind, actor, method, digest, points)
        except NonDeterminismError:
            self._diverge(seq, jc, new)
            raise
        self._ctx.checked += 1
        return found

    def _diverge(self, seq: int, jc: JournaledCall | None, new: dict | None) -> None:
        old = None if jc is None else {"kind": jc.kind, "actor": jc.actor, "method": jc.method,
                                       "digest": jc.digest, "points": jc.points}
        self._ctx.divergence = {"seq": seq, "journaled": old, "new": new}

    def this_host(self) -> Any:
        if not self._hosts:
            self._hosts.append(self._value("this_host", _no_host))
        return HostMesh(self, list(self._hosts))

    def _send(self, call: Any, proc: Any, rank: int, msg: list) -> None:
        reason = f"seq {call.seq} {call.actor}[{rank}].{call.method}: no result in the journal"
        res = self._replay.calls[call.seq].results.get(rank)
        if res is not None and res.get("big"):
            reason += f" (a {res['big'][1]}-byte result, kept by the worker until the next checkpoint)"
        self._ctx.gaps.append(reason)
        if isinstance(call.sink, StreamSink):
            raise AuditGap(reason)

    def resume(self, default: Any) -> Any:
        if self._resumed:
            raise RuntimeError("resume() may be called once per session")
        self._resumed = True
        seq = self._issue()
        self._journaled(seq, "resume", "resume", "resume")
        with self.runtime.lock:
            self.core.finished(seq)
        ckpt = self._ctx.checkpoint
        data = ckpt["data"] if ckpt else None
        if not data or data.get("run") != self.run_id or data["seq"] <= seq:
            return default
        if all(s in self._replay.calls for s in range(seq + 1, data["seq"] + 1)):
            # Nothing compacted: check every call, and the checkpointed state on the way.
            self._ctx.mode = "from the start of the run (nothing compacted)"
            return default
        self._ctx.mode = f"from the checkpoint at seq {data['seq']} (earlier calls were compacted)"
        with self.runtime.lock:
            for s in range(self.core.next_seq, data["seq"] + 1):
                self.core.finished(s)
            self.core.next_seq = data["seq"] + 1
        return pickle.loads(data["state"])

    def checkpoint(self, state: Any) -> None:
        seq = self.core.next_seq
        super().checkpoint(state)
        ckpt = self._ctx.checkpoint
        data = ckpt["data"] if ckpt else None
        if data and data.get("run") == self.run_id and data["seq"] == seq:
            recorded = pickle.loads(data["state"])
            if recorded != state:
                self._ctx.divergence = {"seq": seq, "journaled": {"state": recorded}, "new": {"state": state}}
                raise NonDeterminismError(seq, f"checkpoint(state) with state {_short(recorded)}",
                                          f"checkpoint(state) with state {_short(state)}")


def _no_host() -> str:
    raise AuditGap("the program asked for this host, and the journal does not say which it was")


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
    global _active
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
    old_argv = sys.argv
    sys.argv = [program, *argv]
    _active = ctx
    error: BaseException | None = None
    try:
        runpy.run_path(program, run_name="__main__")
        ok, outcome = True, f"the program made every call the journal records, in order, through seq {index.max_seq}"
    except AuditComplete as e:
        ok, outcome = True, (f"the program matched every recorded call (seq 0..{e.seq - 1}) and went on past the "
                             "end of the journal: this run has not ended")
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
        _active = None
        sys.argv = old_argv
        ctx.bar.close()
    return AuditReport(session, program, ok, outcome, ctx.checked, ctx.mode, ctx.divergence, ctx.gaps, error)


def _no_bar(progress: bool | None) -> bool | None:
    return None if progress is None else not progress


# --- export: Chrome trace events (ui.perfetto.dev) and JSON lines ---------------------


def export_jsonl(records: Iterable) -> Iterator[str]:
    """One JSON object per record: lsn, epoch, ts, kind and the record's fields (bytes as
    {"bytes": n, "hex": first 32 bytes}). CALLS and RESULTS records are unpacked (replay.expand)."""
    for rec in expand(records):
        yield json.dumps({"lsn": rec.lsn, "epoch": rec.epoch, "ts": rec.ts, "kind": rec.kind,
                          **{k: _plain(v) for k, v in rec.data.items()}}, sort_keys=False)


def _plain(v: Any) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        b = bytes(v)
        return {"bytes": len(b), "hex": b[:32].hex()}
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def export_perfetto(records: Iterable, session: str = "") -> dict:
    """The session as Chrome trace events: a process per actor mesh with a thread (track)
    per actor, a span per call from its call record to its result record, and instant
    markers for failovers (epoch changes), supervision events and checkpoints.

    A span starts no earlier than the end of the previous one on its track: an actor runs
    one message at a time, and the trace format wants the slices of a track to nest.
    """
    events: list[dict] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[int, str], int] = {}
    open_calls: dict[int, dict] = {}
    track_end: dict[tuple[int, int], float] = {}
    t0: float | None = None
    epoch: int | None = None
    last_ts = 0.0

    def us(ts: float) -> float:
        return round((ts - t0) * 1e6, 3)

    def track(mesh: str, name: str) -> tuple[int, int]:
        if mesh not in pids:
            pids[mesh] = len(pids) + 1
            events.append({"ph": "M", "name": "process_name", "pid": pids[mesh], "tid": 0,
                           "args": {"name": mesh}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pids[mesh], "tid": 0,
                           "args": {"sort_index": pids[mesh]}})
        pid = pids[mesh]
        if (pid, name) not in tids:
            tids[(pid, name)] = len([k for k in tids if k[0] == pid]) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[(pid, name)],
                           "args": {"name": name}})
        return pid, tids[(pid, name)]

    ctl = track("controller", "program")
    markers = track("controller", "failovers, restarts, checkpoints")
    for rec in expand(records):
        d = rec.data
        if t0 is None:
            t0 = rec.ts
        last_ts = max(last_ts, rec.ts)
        if epoch is not None and rec.epoch != epoch:
            events.append({"ph": "i", "s": "g", "name": f"failover: epoch {epoch} -> {rec.epoch}",
                           "cat": "failover", "ts": us(rec.ts), "pid": markers[0], "tid": markers[1],
                           "args": {"from_epoch": epoch, "to_epoch": rec.epoch, "lsn": rec.lsn}})
        epoch = rec.epoch
        if rec.kind == START:
            events.append({"ph": "i", "s": "g", "name": f"run {d.get('run')} starts", "cat": "run",
                           "ts": us(rec.ts), "pid": markers[0], "tid": markers[1], "args": {"lsn": rec.lsn}})
        elif rec.kind == CALL:
            kind = d.get("k")
            if kind == "checkpoint":
                events.append({"ph": "i", "s": "g", "name": f"checkpoint (seq {d['s']})", "cat": "checkpoint",
                               "ts": us(rec.ts), "pid": markers[0], "tid": markers[1],
                               "args": {"seq": d["s"], "lsn": rec.lsn}})
            elif kind in VALUE_KINDS or not d.get("a"):
                events.append({"ph": "i", "s": "t", "name": f"{kind}()" if kind in VALUE_KINDS else kind,
                               "cat": "value", "ts": us(rec.ts), "pid": ctl[0], "tid": ctl[1],
                               "args": {"seq": d["s"]}})
            else:
                open_calls[d["s"]] = {"ts": rec.ts, "a": d["a"], "m": d.get("m"), "k": kind,
                                      "pts": d.get("pts") or [], "epoch": rec.epoch}
        elif rec.kind == RESULT:
            call = open_calls.get(d["s"])
            if call is None:
                continue
            pid, tid = track(call["a"], f"{call['a']}[{d['pt']}]")
            _span(events, track_end, pid, tid, call, d["s"], us(call["ts"]), us(rec.ts), d.get("st"),
                  (d.get("x") or {}).get("em"))
            call.setdefault("done", set()).add(d["pt"])
        elif rec.kind == SUPERVISION:
            where = f"{d.get('mesh')}[{d.get('rank')}]" if d.get("mesh") is not None else None
            pid, tid = track(d["mesh"], where) if where else markers
            events.append({"ph": "i", "s": "t" if where else "g", "name": f"supervision: {d.get('ev')}",
                           "cat": "restart", "ts": us(rec.ts), "pid": pid, "tid": tid,
                           "args": {k: _plain(v) for k, v in d.items()}})
        elif rec.kind == END:
            events.append({"ph": "i", "s": "g", "name": "run ends" + (" with an error" if d.get("error") else ""),
                           "cat": "run", "ts": us(rec.ts), "pid": markers[0], "tid": markers[1],
                           "args": {"error": d.get("error")}})
    # Calls with points that never answered (in flight at the end) run to the end of the trace.
    for seq, call in open_calls.items():
        for pt in call["pts"]:
            if pt not in call.get("done", ()):
                pid, tid = track(call["a"], f"{call['a']}[{pt}]")
                _span(events, track_end, pid, tid, call, seq, us(call["ts"]), us(last_ts), "no result", None)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"session": session, "exported_by": "regent journal export"}}


def _span(events: list, track_end: dict, pid: int, tid: int, call: dict, seq: int, start: float, end: float,
          status: str | None, error: str | None) -> None:
    begin = max(start, track_end.get((pid, tid), start))
    end = max(end, begin)
    track_end[(pid, tid)] = end
    args = {"seq": seq, "adverb": call["k"], "status": status, "issued_at_us": start, "epoch": call["epoch"]}
    if error:
        args["error"] = error
    events.append({"ph": "X", "name": call["m"], "cat": "call", "ts": begin, "dur": round(end - begin, 3),
                   "pid": pid, "tid": tid, "args": args})
