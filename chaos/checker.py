"""The chaos verdict: did the run keep regent's promises, whatever was done to it?

From the journal (what the program issued and what it was told) and the actors' own
execution ledger (chaos.ledger: what actually ran), the checker proves for every
journaled endpoint call and every point it targeted that it ran exactly once, or at
most once where the journal says the actor's process died (invariant 3) or the
program gave up on it after its deadline. It also verifies the journal (invariant 7)
and compares the program's results with a fault-free run's. Pure: it reads records
and files, and drives nothing.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from regent.chaos.faults import FaultEvent
from regent.chaos.ledger import Execution
from regent.chaos.linearizability import LinearizabilityVerdict
from regent.chaos.packets import PACKET_KINDS
from regent.controller.replay import END, PROCS, START, SUPERVISION, expand

__all__ = ["CALL_KINDS", "ChaosReport", "FaultEffect", "check_run", "percentile"]

CALL_KINDS = ("call", "call_one", "choose", "stream", "broadcast")
FAILED = ("dead", "exit", "noactor", "grp")  # the actor's process (or the actor, or a peer of its collective) was gone
CONTROLLER_FAULTS = ("controller", "controller->etcd")


@dataclass
class FaultEffect:
    """One injected fault, when it happened (seconds from the run's start), and what it did."""

    t_s: float
    kind: str
    target: str
    detail: dict
    effect: str

    def line(self) -> str:
        what = {k: v for k, v in self.detail.items() if k not in ("fault", "offset_s", "proxy", "toxic")}
        extra = " ".join(f"{k}={v}" for k, v in what.items())
        return f"{self.t_s:8.2f}s  {self.kind:<12} {self.target:<22} {extra[:60]:<60}  {self.effect}"


@dataclass
class ChaosReport:
    session: str
    points: int = 0  # (call, targeted actor) pairs checked
    ran_once: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unjournaled: list[str] = field(default_factory=list)  # executions no journaled call explains
    failed_points: int = 0  # the actor's process died: at most once, and it did
    rerun_after_crash: list[str] = field(default_factory=list)  # ran again after its actor died (invariant 3)
    timed_out_points: int = 0  # the program gave up after its deadline: at most once, and it did
    timed_out_unexecuted: int = 0  # ... of which never ran
    timeout_waits_s: list[float] = field(default_factory=list)  # issue to deadline, per timed-out call
    journal_ok: bool = False
    journal_problems: list[str] = field(default_factory=list)
    results_equal: bool = False
    results_diff: str = ""
    program_error: str = ""
    earlier_runs: list[str] = field(default_factory=list)  # runs of the session before the checked one
    retries: dict = field(default_factory=dict)
    faults: list[FaultEffect] = field(default_factory=list)
    failovers_s: list[float] = field(default_factory=list)
    duration_s: float = 0.0
    linearizability: LinearizabilityVerdict | None = None  # Porcupine on the register's history

    @property
    def injected(self) -> int:
        """Faults injected: every kill, pause, partition, toxic and packet fault (not their undoing)."""
        return sum(1 for f in self.faults if f.kind in ("kill", "kill_host", "pause", "down", "toxic_add",
                                                         *PACKET_KINDS))

    @property
    def ok(self) -> bool:
        return (not self.lost and not self.duplicated and not self.unjournaled and self.journal_ok
                and self.results_equal and not self.program_error
                and not (self.linearizability is not None and self.linearizability.failed))

    def text(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        lines = [
            f"chaos run of session {self.session!r}: {verdict} ({self.duration_s:.1f} s, "
            f"{self.injected} faults injected)",
            f"  calls checked:   {self.points} (call, actor) points; {self.ran_once} ran exactly once",
            f"  lost:            {len(self.lost)}",
            f"  duplicated:      {len(self.duplicated)}",
            f"  re-run:          {len(self.rerun_after_crash)} points ran again after the actor that ran them "
            f"died or its process was replaced (at-least-once across a crash, once per process and incarnation)",
            f"  unjournaled:     {len(self.unjournaled)}",
            f"  proc died:       {self.failed_points} points failed with SupervisionError (at most once each)",
            f"  timed out:       {self.timed_out_points} points past their deadline "
            f"({self.timed_out_unexecuted} never ran); the program issued them again"
            + (f"; told {max(self.timeout_waits_s):.2f} s after the issue at the latest" if self.timeout_waits_s else ""),
            f"  retries:         {self.retries}",
            f"  journal verify:  {'ok' if self.journal_ok else '; '.join(self.journal_problems)}",
            f"  results:         {'equal to the fault-free run' if self.results_equal else 'DIFFER: ' + self.results_diff}",
        ]
        if self.linearizability is not None:
            lines.append(f"  linearizable (porcupine): {self.linearizability.summary()}")
        if self.program_error:
            lines.append(f"  program:         {self.program_error}")
        for item in self.earlier_runs:
            lines.append(f"  earlier run:     {item}")
        if self.failovers_s:
            lines.append(f"  failovers:       {len(self.failovers_s)}, p50 {percentile(self.failovers_s, 50):.2f} s, "
                         f"p95 {percentile(self.failovers_s, 95):.2f} s, max {max(self.failovers_s):.2f} s")
        for title, items in (("lost", self.lost), ("duplicated", self.duplicated), ("unjournaled", self.unjournaled),
                             ("re-run", self.rerun_after_crash)):
            for item in items[:20]:
                lines.append(f"  {title}: {item}")
        if self.faults:
            lines.append("  faults:")
            lines += ["    " + f.line() for f in self.faults]
        return "\n".join(lines)


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(sorted(values), n=100, method="inclusive")[max(0, min(98, int(p) - 1))]


def runs(records: Iterable[Any]) -> list[tuple[str | None, list[Any]]]:
    """The session's runs in journal order, each with its records (CALLS and RESULTS records
    unpacked into the calls and results they hold). A standby may start a new run after one ends."""
    out: list[tuple[str | None, list[Any]]] = []
    for rec in expand(records):
        if rec.kind == START:
            out.append((rec.data.get("run"), []))
        elif not out:
            out.append((None, [rec]))  # records before any start: an old journal's only run
        else:
            out[-1][1].append(rec)
    return out


def run_records(records: Iterable[Any], run: str | None) -> list[Any]:
    """The records of one run of the session (all of them for run None)."""
    return _split(runs(records), run)[0]


def _split(every: list[tuple[str | None, list[Any]]], run: str | None) -> tuple[list[Any], list[tuple]]:
    """The checked run's records, and the other runs (none when run is None: all are checked)."""
    if run is None:
        return [rec for _, recs in every for rec in recs], []
    return [rec for rid, recs in every if rid == run for rec in recs], [(rid, rs) for rid, rs in every if rid != run]


def check_run(
    session: str,
    records: Sequence[Any],
    executions: Sequence[Execution],
    *,
    result: dict | None,
    expected: dict | None,
    verify: Any = None,
    events: Sequence[FaultEvent] = (),
    leaders: Sequence[tuple[int, float]] = (),
    t0: float | None = None,
    t_end: float | None = None,
    deadline_s: float = 5.0,
) -> ChaosReport:
    """Check one chaos run. `records`: the journal (all runs; the run is taken from
    result["sid"]); `executions`: the ledger; `result`/`expected`: the program's final
    JSON in this run and in a fault-free one; `verify`: journal.verify's report;
    `events`: the FaultLog; `leaders`: (pid, time it became leader)."""
    rep = ChaosReport(session)
    run = None
    if result is None or "out" not in result:
        rep.program_error = f"the program did not finish: {result}"
    else:
        run = str(result.get("sid", "")).rsplit(".", 1)[-1] or None
        rep.retries = dict(result.get("retries") or {})
    recs, earlier = _split(runs(records), run)
    pids, theirs = _earlier_runs(rep, earlier)
    executions = [e for e in executions if e.pid not in pids]
    killed = {int(e.detail["pid"]) for e in events
              if e.kind == "kill" and e.target.startswith("proc") and isinstance(e.detail.get("pid"), int)}
    killed |= {p for e in events if e.kind == "kill_host" for p in e.detail.get("procs") or ()
               if isinstance(p, int)}  # a host's procs die with it
    _check_calls(rep, recs, executions, killed, theirs)
    if verify is not None:
        rep.journal_ok = bool(verify.ok)
        rep.journal_problems = list(getattr(verify, "problems", []))[:10]
    if result is not None and expected is not None and "out" in result:
        rep.results_equal = result["out"] == expected.get("out") and result.get("kv") == expected.get("kv")
        if result["out"] != expected.get("out"):
            rep.results_diff = _first_difference(result["out"], expected.get("out"))
        elif not rep.results_equal:
            rep.results_diff = "register: " + _first_difference(result.get("kv") or [], expected.get("kv"))
    times = [e.t for e in events] + [t for _, t in leaders]
    start = t0 if t0 is not None else (min(times) if times else 0.0)
    rep.duration_s = (t_end or max(times, default=start)) - start
    rep.faults, rep.failovers_s = _effects(events, leaders, recs, start, deadline_s)
    return rep


def _earlier_runs(rep: ChaosReport, earlier: Sequence[tuple[str | None, list[Any]]]) -> tuple[set[int], set[tuple]]:
    """Runs of the session before the checked one. One that ended on an error is the program's
    failure, whatever the later run did: the run it failed in did not survive the faults. Their
    executions are theirs, not the checked run's: returns the processes they started (whose
    executions are left out) and the calls they journaled (which explain an execution)."""
    theirs: set[tuple] = set()
    pids: set[int] = set()
    failed: list[str] = []
    for rid, recs in earlier:
        ended = None
        for rec in recs:
            d = rec.data if isinstance(rec.data, dict) else {}
            if rec.kind == END:
                ended = d
            elif rec.kind == PROCS:
                pids |= {p["pid"] for p in d.get("procs") or [] if isinstance(p, dict) and isinstance(p.get("pid"), int)}
            elif rec.kind == "call" and d.get("k") in CALL_KINDS:
                theirs.update(key for _, key in _point_keys(d))
        if ended is None:
            line = f"run {rid}: never ended (a later run started without replaying it)"
        elif ended.get("error"):
            line = f"run {rid}: ended on the program's error {str(ended['error'])[:300]}"
        else:
            line = f"run {rid}: ended"
        rep.earlier_runs.append(line)
        if ended is None or ended.get("error"):
            failed.append(line)
    if failed and not rep.program_error:
        rep.program_error = "an earlier run of the session did not finish cleanly; the checked run started over: " \
                            + "; ".join(failed)
    return pids, theirs


def _point_keys(d: dict) -> list[tuple[int, tuple]]:
    """Each point of a journaled call with its ledger key (mesh, method, digest hex, point)."""
    digest = d["d"].hex() if isinstance(d["d"], bytes | bytearray) else str(d["d"])
    return [(pt, (d["a"], d["m"], digest, pt)) for pt in d.get("pts") or []]


def _superseded(recs: Sequence[Any], pids: set[int]) -> set[int]:
    """Proc processes the run's journal shows the session moved away from: those a
    `proc_replaced` event replaced, and those it never names at all (a leader deposed before
    it journaled starting them; the ranks went to the processes the journal does name).
    A call run again on the next process of its rank is at-least-once across that change."""
    pid_of: dict[str, int] = {}
    replaced: set[str] = set()
    for rec in recs:
        d = rec.data if isinstance(rec.data, dict) else {}
        if rec.kind == PROCS:
            for p in d.get("procs") or []:
                if isinstance(p, dict) and isinstance(p.get("id"), str) and isinstance(p.get("pid"), int):
                    pid_of[p["id"]] = p["pid"]
        elif rec.kind == SUPERVISION and d.get("ev") == "proc_replaced":
            if isinstance(d.get("new"), str) and isinstance(d.get("pid"), int):
                pid_of[d["new"]] = d["pid"]
            if isinstance(d.get("old"), str):
                replaced.add(d["old"])
    if not pid_of:
        return set()  # a journal without proc records says nothing either way
    known = set(pid_of.values())
    return {pid_of[i] for i in replaced if i in pid_of} | {p for p in pids if p not in known}


def _check_calls(rep: ChaosReport, recs: Sequence[Any], executions: Sequence[Execution],
                 killed_pids: set[int] = frozenset(), explained_before: set[tuple] = frozenset()) -> None:
    calls: dict[int, dict] = {}
    results: dict[tuple[int, int], dict] = {}
    timeouts: set[int] = set()
    issued: dict[int, float] = {}
    for rec in recs:
        d = rec.data
        if rec.kind == "call" and d.get("k") in CALL_KINDS:
            calls[d["s"]] = d
            issued.setdefault(d["s"], rec.ts)
        elif rec.kind == "result":
            results[(d["s"], d["pt"])] = d
        elif rec.kind == "obs" and d.get("w") == "timeout":
            # A call waited for again times out again: only its first deadline counts from the issue.
            if d["s"] not in timeouts and d["s"] in issued:
                rep.timeout_waits_s.append(rec.ts - issued[d["s"]])
            timeouts.add(d["s"])
    ended_pids = set(killed_pids) | _superseded(recs, {e.pid for e in executions})
    ran = Counter((e.mesh, e.method, e.digest, e.rank) for e in executions)
    where: dict[tuple, list[tuple[int, int]]] = {}
    newest: dict[tuple[str, int], int] = {}
    for e in executions:
        where.setdefault((e.mesh, e.method, e.digest, e.rank), []).append((e.pid, e.incarnation))
        newest[(e.mesh, e.rank)] = max(newest.get((e.mesh, e.rank), 0), e.incarnation)

    def rerun_after_crash(key: tuple) -> bool:
        """Each execution in its own incarnation, and every incarnation but one ended (its
        process was killed or replaced, or the actor was rebuilt later): at-least-once, as promised."""
        runs = where[key]
        if len(set(runs)) != len(runs):
            return False  # twice in one incarnation: a real duplicate
        ended = [r for r in runs if r[0] in ended_pids or r[1] < newest[(key[0], key[3])]]
        return len(ended) >= len(runs) - 1
    explained: set[tuple] = set()
    for seq in sorted(calls):
        d = calls[seq]
        for pt, key in _point_keys(d):
            explained.add(key)
            n = ran.get(key, 0)
            rep.points += 1
            res = results.get((seq, pt))
            what = f"seq {seq} {d['k']} {d['a']}.{d['m']} on point {pt}"
            if n > 1 and rerun_after_crash(key):
                rep.rerun_after_crash.append(f"{what}: ran {n} times, in incarnations {sorted(where[key])}")
            elif n > 1:
                rep.duplicated.append(f"{what}: ran {n} times")
            elif res is not None and res.get("st") in FAILED:
                rep.failed_points += 1
                rep.ran_once += n
            elif res is None and seq in timeouts:
                rep.timed_out_points += 1
                rep.timed_out_unexecuted += n == 0
                rep.ran_once += n
            elif n == 0:
                rep.lost.append(f"{what}: never ran (journaled result: {res.get('st') if res else 'none'})")
            else:
                rep.ran_once += 1
    for key, n in ran.items():
        if key not in explained and key not in explained_before:
            rep.unjournaled.append(f"{key[0]}.{key[1]} digest {key[2][:12]} on point {key[3]} ran {n} time(s)")


def _first_difference(got: list, want: list | None) -> str:
    if want is None:
        return "no fault-free result to compare with"
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"step {i}: got {a!r}, fault-free run got {b!r}"
    return f"{len(got)} results, fault-free run has {len(want)}"


def _effects(events: Sequence[FaultEvent], leaders: Sequence[tuple[int, float]], recs: Sequence[Any],
             t0: float, deadline_s: float) -> tuple[list[FaultEffect], list[float]]:
    """What each fault did, read from the leader changes and the journal around it."""
    changes = [t for _, t in leaders[1:]]
    sup = [(r.data.get("t") or r.ts, r.data) for r in recs if r.kind == "sup"]
    fails = defaultdict(int)
    for r in recs:
        if r.kind == "result" and r.data.get("st") in FAILED:
            fails[round(r.ts, 1)] += 1
    timeouts = [r.ts for r in recs if r.kind == "obs" and r.data.get("w") == "timeout"]
    ends: dict[tuple[str, str], float] = {}
    for e in events:  # when each toxic / partition / pause ended
        if e.kind in ("toxic_remove", "up", "resume", "heal"):
            ends.setdefault((e.target, str(e.detail.get("fault"))), e.t)
    out: list[FaultEffect] = []
    failovers: list[float] = []
    claimed: set[float] = set()
    for e in sorted(events, key=lambda e: e.t):
        effect = ""
        role = e.target.split("/")[0]
        if e.kind in ("kill", "pause", "down") and e.target in CONTROLLER_FAULTS or \
                e.kind == "toxic_add" and e.target == "controller->etcd":
            nxt = next((t for t in changes if t > e.t and t not in claimed), None)
            later = [x.t for x in events if x.t > e.t and x.target in CONTROLLER_FAULTS
                     and x.kind in ("kill", "pause", "down")]
            if nxt is not None and (not later or nxt <= min(later) or e.kind != "toxic_add"):
                claimed.add(nxt)
                failovers.append(nxt - e.t)
                effect = f"failover: new leader after {nxt - e.t:.2f} s"
            else:
                effect = "no failover (the leader kept its lease)"
        elif e.kind == "kill" and role == "proc":
            after = [(t, d) for t, d in sup if t >= e.t - 0.05]
            restart = next((t for t, d in after if d.get("ev") == "restart"), None)
            n_fail = sum(v for k, v in fails.items() if e.t - 0.1 <= k <= e.t + 5)
            effect = (f"proc restarted after {restart - e.t:.2f} s" if restart else "no restart journaled")
            if n_fail:
                effect += f"; {n_fail} call points failed (SupervisionError seen, calls retried)"
        elif e.kind == "kill" and e.target == "etcd":
            effect = "etcd SIGKILLed; the session waits for it"
        elif e.kind == "kill" and role.startswith("etcd"):
            effect = "etcd member SIGKILLed; the others elect a leader if it led, and the client moves on"
        elif e.kind == "restart":
            effect = "etcd started again on the same data"
        elif e.kind == "kill_host":
            n_fail = sum(v for k, v in fails.items() if e.t - 0.1 <= k <= e.t + 5)
            effect = (f"host killed with its {len(e.detail.get('procs') or ())} procs; "
                      + (f"{n_fail} call points failed (SupervisionError seen)" if n_fail else "no call failed"))
            after = [(t, d) for t, d in sup if t >= e.t - 0.05]
            moved = next(((t, d) for t, d in after if d.get("ev") in ("host_replaced", "shrink")), None)
            rebuilt = next((t for t, d in after if d.get("ev") == "restart" and moved and t >= moved[0]), None)
            if moved is not None:
                what = (f"replaced by spare {(moved[1].get('new') or {}).get('id')}" if moved[1]["ev"] == "host_replaced"
                        else "its points left the mesh (shrink)")
                effect += f"; {what} after {moved[0] - e.t:.2f} s"
                if rebuilt is not None:
                    effect += f", actors rebuilt after {rebuilt - e.t:.2f} s"
        elif e.kind == "kill" and e.target == "host":
            effect = "host agent SIGKILLed; its procs keep running, start a new agent at its address and are adopted"
        elif e.kind in ("toxic_add", "down", "pause"):
            end = ends.get((e.target, str(e.detail.get("fault"))), e.t)
            n = sum(1 for t in timeouts if e.t <= t <= end + deadline_s + 0.5)
            effect = f"{n} calls timed out and were issued again" if n else "calls slowed or cut; none failed"
        elif e.kind in PACKET_KINDS:
            end = ends.get((e.target, str(e.detail.get("fault"))), e.t)
            n = sum(1 for t in timeouts if e.t <= t <= end + deadline_s + 0.5)
            nxt = next((t for t in changes if e.t < t <= end + deadline_s + 0.5 and t not in claimed), None)
            effect = f"{n} calls timed out and were issued again" if n else "packets cut or lost; no call failed"
            if nxt is not None:
                claimed.add(nxt)
                failovers.append(nxt - e.t)
                effect = f"failover: new leader after {nxt - e.t:.2f} s; " + effect
        elif e.kind == "error":
            effect = f"not applied: {e.detail.get('error', '')}"[:100]
        out.append(FaultEffect(e.t - t0, e.kind, e.target, dict(e.detail), effect))
    return out, failovers
