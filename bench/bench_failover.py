"""Failover benchmark (issue #3): how long a standby takes to carry on after the primary dies
or hands over, what journaling every call costs, and how fast a journal is replayed.

    .venv/bin/python bench/bench_failover.py [--quick] [--runs N] [--json-out FILE]

One JSON object goes to stdout, human notes to stderr; the issue's targets are printed beside
the figures. Controllers run as real processes (bench/programs/failover_loop.py) against a
private etcd and an SQLite file; the bench kills them and reads the timestamped marks they
leave. It asserts nothing: tests assert behaviour, benches report figures.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench_core import (  # noqa: E402
    FLOOR_WHAT,
    collected_heap,
    floor_target,
    latency_stats,
    median_interval,
    private_regent_home,
    rate_stats,
    run_and_report,
)

from regent.controller.futures import Future  # noqa: E402
from regent.worker import Actor, endpoint  # noqa: E402
from tests.support.etcd import EtcdServer, etcd_available  # noqa: E402

PROGRAM = HERE / "programs" / "failover_loop.py"
T = TypeVar("T")

# The issue's targets: (figure path in the JSON, comparison, bound).
TARGETS: list[tuple[str, str, float]] = [
    ("failover_sigkill.etcd_ttl2.total_s.p50", "<=", 2.0),
    ("failover_sigkill.etcd_ttl2_async.total_s.p50", "<=", 2.0),
    ("handoff_sigterm.etcd.total_ms.p50", "<=", 100.0),
    ("handoff_sigterm.sqlite.total_ms.p50", "<=", 100.0),
    ("journal_overhead.pipelined_ratio.etcd_over_off", ">=", 0.9),
    ("journal_overhead.pipelined_ratio.sqlite_over_off", ">=", 0.9),
    ("journal_overhead.call_one_us.etcd.p50", "<=", 150.0),
    ("replay.etcd.read_and_match.records_per_s", ">=", 100_000.0),
    ("replay.sqlite.read_and_match.records_per_s", ">=", 100_000.0),
    ("replay.etcd.standby.records_per_s", ">=", 100_000.0),
    ("replay.sqlite.standby.records_per_s", ">=", 100_000.0),
]


@dataclass(frozen=True)
class Sizes:
    runs: int = 5  # failovers per scenario; the p50 is over these
    pace_s: float = 0.01  # the looping program's sleep between live calls
    settle_s: float = 0.5  # primary live and standby waiting, then this (+ jitter) before the kill
    jitter_s: float = 0.5  # random phase against the lease keepalive (ttl/4 period)
    round_trips: int = 1_000  # per repeat
    pipelined: int = 10_000
    overhead_repeats: int = 15  # the ratio's 95% interval runs from the 4th to the 12th
    warmup: int = 500
    replay_calls: int = 50_000  # read-and-match figure
    replay_repeats: int = 3
    standby_calls: tuple[int, ...] = (5_000, 20_000)  # real standby replays

    @staticmethod
    def quick() -> Sizes:
        return Sizes(runs=3, round_trips=500, pipelined=3_000, overhead_repeats=3, warmup=200,
                     replay_calls=10_000, replay_repeats=2, standby_calls=(2_000, 5_000))


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    """p50 (median), min, max and mean of a handful of runs, plus the runs themselves."""
    if not values:
        return {"n": 0}
    return {
        "p50": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "mean": round(statistics.fmean(values), digits),
        "n": len(values),
        "runs": [round(v, digits) for v in values],
    }


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g} s")
        time.sleep(0.01)


# --- controller processes ---------------------------------------------------------------------


def read_marks(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    marks = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):  # a line still being written
            marks.append(json.loads(line))
    return marks


def find_mark(path: Path, ev: str, pid: int | None = None, **match: Any) -> dict | None:
    for m in read_marks(path):
        if m["ev"] == ev and (pid is None or m["pid"] == pid) and all(
                m.get(k) == v for k, v in match.items()):
            return m
    return None


def log_time(log: Path, event: str) -> float | None:
    """Wall time of the first structlog line of `event` in a controller's stderr."""
    try:
        lines = log.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        stamp, _, rest = line.partition(" ")
        if event in rest:
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(stamp).timestamp()
    return None


def log_field(log: Path, event: str, field: str) -> str | None:
    try:
        lines = log.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        if event in line:
            for word in line.split():
                if word.startswith(field + "="):
                    return word.split("=", 1)[1]
    return None


class Programs:
    """Starts failover_loop.py processes and makes sure none outlives the bench."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.started: list[subprocess.Popen] = []

    def start(self, env: dict[str, str], log: Path) -> subprocess.Popen:
        with open(log, "w") as err:
            p = subprocess.Popen([sys.executable, str(PROGRAM)], env=env, stdout=subprocess.DEVNULL,
                                 stderr=err, cwd=ROOT)
        self.started.append(p)
        return p

    def reap(self, procs: list[subprocess.Popen]) -> None:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    def close(self) -> None:
        self.reap(self.started)


def program_env(session: str, journal: str, ttl: float, marks: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "BENCH_SESSION": session,
        "BENCH_JOURNAL": journal,
        "BENCH_TTL": str(ttl),
        "BENCH_MARKS": str(marks),
        "PYTHONUNBUFFERED": "1",
        "REGENT_LOG_LEVEL": "INFO",  # the bench reads "standing by" and "resigned" lines
        **extra,
    })
    return env


# --- figures 1 and 2: SIGKILL failover and SIGTERM hand-off -------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    journal: str
    ttl: float
    sig: signal.Signals
    asyncio: bool = False  # the program runs as an asyncio program on s.run


def one_failover(programs: Programs, scn: Scenario, index: int, sizes: Sizes,
                 rng: random.Random) -> dict[str, Any]:
    """Primary and standby of a fresh session; the primary gets scn.sig once in steady state."""
    session = f"{scn.name}-{index}-{secrets.token_hex(3)}"
    work = programs.work
    marks = work / f"{session}.marks"
    env = program_env(session, scn.journal, scn.ttl, marks, BENCH_PACE_S=str(sizes.pace_s),
                      BENCH_ASYNC="1" if scn.asyncio else "0")
    logs = [work / f"{session}.{k}.log" for k in range(2)]
    procs = [programs.start(env, log) for log in logs]
    try:
        first = wait_for(lambda: find_mark(marks, "live", standby=False), 60, "no primary went live")
        primary = next(p for p in procs if p.pid == first["pid"])
        standby = next(p for p in procs if p is not primary)
        standby_log = logs[procs.index(standby)]
        primary_log = logs[procs.index(primary)]
        wait_for(lambda: "standing by" in standby_log.read_text() or None, 60,
                 "the second controller did not stand by")
        time.sleep(sizes.settle_s + rng.uniform(0, sizes.jitter_s))
        killed_at = time.time()
        os.kill(primary.pid, scn.sig)
        live = wait_for(lambda: find_mark(marks, "live", standby.pid), 60,
                        "the standby did not complete a live call")
        lead = find_mark(marks, "lead", standby.pid)
        assert lead is not None
        standby_rc = standby.wait(60)
        primary_rc = primary.wait(30)
    finally:
        programs.reap(procs)
    run: dict[str, Any] = {
        "session": session,
        "total_s": live["at"] - killed_at,
        "lease_wait_s": lead["leader_at"] - killed_at,
        "takeover_s": live["at"] - lead["leader_at"],
        "open_s": lead["returned_at"] - lead["leader_at"],
        "replay_s": live["replay_done_at"] - lead["returned_at"],
        "first_call_s": live["at"] - live["replay_done_at"],
        "calls_replayed": live["stats"]["replayed"] + live["stats"]["resent"],
        "calls_resent": live["stats"]["resent"],
        "primary_exit": primary_rc,
        "standby_exit": standby_rc,
    }
    if scn.sig == signal.SIGTERM:
        flushed = log_time(primary_log, "handing the session over")
        resigned = log_time(primary_log, "resigned")
        if flushed is not None and resigned is not None:
            run["signal_to_flushed_s"] = flushed - killed_at
            run["flushed_to_resigned_s"] = resigned - flushed
            run["resigned_to_leader_s"] = lead["leader_at"] - resigned
    return run


PARTS_S = ["total_s", "lease_wait_s", "takeover_s", "open_s", "replay_s", "first_call_s"]
HANDOFF_PARTS_S = ["signal_to_flushed_s", "flushed_to_resigned_s", "resigned_to_leader_s"]


def summarise_failovers(scn: Scenario, runs: list[dict], errors: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"journal": scn.journal.split("://")[0], "lease_ttl_s": scn.ttl,
                           "signal": scn.sig.name, "program": "asyncio (s.run)" if scn.asyncio else "sequential"}
    graceful = scn.sig == signal.SIGTERM
    for key in PARTS_S + (HANDOFF_PARTS_S if graceful else []):
        values = [r[key] for r in runs if key in r]
        if graceful:  # milliseconds read better at this scale
            out[key.removesuffix("_s") + "_ms"] = spread([v * 1e3 for v in values], 1)
        else:
            out[key] = spread(values)
    out["calls_replayed"] = spread([float(r["calls_replayed"]) for r in runs], 0)
    out["exits"] = sorted({(r["primary_exit"], r["standby_exit"]) for r in runs})
    if errors:
        out["errors"] = errors
    return out


def run_failovers(programs: Programs, scenarios: list[Scenario], sizes: Sizes,
                  rng: random.Random) -> dict[str, Any]:
    """Scenarios take turns, run by run, so that machine noise falls on all of them alike."""
    runs: dict[str, list[dict]] = {s.name: [] for s in scenarios}
    errors: dict[str, list[str]] = {s.name: [] for s in scenarios}
    for i in range(sizes.runs):
        for scn in scenarios:
            try:
                r = one_failover(programs, scn, i, sizes, rng)
            except (TimeoutError, OSError, KeyError, AssertionError) as e:
                errors[scn.name].append(f"run {i}: {type(e).__name__}: {e}")
                note(f"  {scn.name} run {i}: FAILED {e} (logs in {programs.work})")
                continue
            runs[scn.name].append(r)
            note(f"  {scn.name} run {i}: total {r['total_s'] * 1e3:.0f} ms = lease wait "
                 f"{r['lease_wait_s'] * 1e3:.0f} + open {r['open_s'] * 1e3:.0f} + replay "
                 f"{r['replay_s'] * 1e3:.0f} ({r['calls_replayed']} calls) + first call "
                 f"{r['first_call_s'] * 1e3:.1f} ms")
    return {s.name: summarise_failovers(s, runs[s.name], errors[s.name]) for s in scenarios}


# --- figure 3: journal overhead on the call path ------------------------------------------------


class Noop(Actor):
    @endpoint
    def noop(self, i: int = 0) -> int:
        return i


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0.0 if it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


FLOOR = "floor"  # the overhead bench's mode that is no session: a bare pyzmq round trip


def overhead_child(url: str, warmup: int) -> None:
    """One session in a process of its own, measured on request (run_overhead drives it);
    url FLOOR: the bare pyzmq floor (bench_core.floor_target) in its place.

    Reads one JSON command per line on stdin and answers one JSON line on stdout:
    {"op": "pipelined", "n": N} -> rate and the process's CPU; {"op": "round_trips", "n": N}
    -> latencies in ns. Everything else this process writes goes to stderr."""
    from regent.controller import Session

    answer = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    with contextlib.ExitStack() as stack:
        if url == FLOOR:
            t = stack.enter_context(floor_target())
            issue, wait, flush, server_pid = t.issue, t.wait, (lambda: None), t.pid
        else:
            s = stack.enter_context(Session(f"overhead-{secrets.token_hex(3)}", journal=url))
            issue = s.spawn_procs(per_host={"procs": 1}).spawn("noop", Noop).slice(procs=0).noop.call_one
            wait, flush = Future.get, (lambda: s.writer.flush(timeout=60))
            server_pid = next(iter(s.runtime.procs.values())).pid
        for _ in range(warmup):
            wait(issue())
        answer.write(json.dumps({"worker_pid": server_pid}) + "\n")
        serve_overhead(answer, issue, wait, flush)


def serve_overhead(
    answer: Any, issue: Callable[[], Any], wait: Callable[[Any], Any], flush: Callable[[], Any]
) -> None:
    """overhead_child's command loop, on any issue/wait pair."""
    clock = time.perf_counter_ns
    for line in sys.stdin:
        cmd = json.loads(line)
        n = cmd["n"]
        if cmd["op"] == "pipelined":
            with collected_heap():
                c0 = time.process_time()
                t0 = time.perf_counter()
                handles = [issue() for _ in range(n)]
                for h in handles:
                    wait(h)
                out = {"rate": n / (time.perf_counter() - t0), "cpu_s": time.process_time() - c0}
            del handles
        else:
            # Not in the wake of the pipelined burst: its records are written first (a
            # no-op with no journal), or the loop would time the writer's backlog.
            flush()
            samples = []
            with collected_heap():
                for _ in range(n):
                    t = clock()
                    wait(issue())
                    samples.append(clock() - t)
            out = {"samples": samples}
        answer.write(json.dumps(out) + "\n")


class OverheadChild:
    """A running overhead_child: its process, its worker's pid, a request at a time."""

    def __init__(self, url: str, warmup: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--overhead-child", url, "--warmup", str(warmup)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        hello = self.proc.stdout.readline()
        if not hello:
            raise RuntimeError(f"the overhead session on {url} exited before it was ready "
                               f"(exit status {self.proc.wait()}); its stderr above says why")
        self.worker_pid = json.loads(hello)["worker_pid"]

    def ask(self, op: str, n: int) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps({"op": op, "n": n}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the overhead session exited during {op} (status {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_overhead(journals: dict[str, str], sizes: Sizes, etcd_pid: int | None) -> dict[str, Any]:
    """One session per journal mode, each in a process of its own, all open at once, and the
    bare pyzmq floor beside them; measurements take turns by repeat.

    Own processes: sessions sharing one interpreter would share its GIL and collector, and
    each mode's figures would carry the other sessions' threads. Besides rates, the CPU each
    pipelined batch costs the controller process, the worker proc and the etcd server: on a
    shared 2-core machine that is steadier than wall time, and it says where a journal's cost
    lands. The floor takes its turn with the modes, so each repeat reads every call_one next
    to what a bare round trip took at that moment."""
    modes = [*journals, FLOOR]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    samples: dict[str, list[int]] = {m: [] for m in modes}
    p50s: dict[str, list[float]] = {m: [] for m in modes}  # call_one p50 of each repeat
    cpu: dict[str, dict[str, list[float]]] = {m: {} for m in journals}
    with contextlib.ExitStack() as stack:
        children: dict[str, OverheadChild] = {}
        for mode in modes:
            children[mode] = OverheadChild(journals.get(mode, FLOOR), sizes.warmup)
            stack.callback(children[mode].close)
        for rep in range(sizes.overhead_repeats):
            for mode in modes[rep % len(modes):] + modes[:rep % len(modes)]:
                child = children[mode]
                pids = {"worker": child.worker_pid}
                if etcd_pid is not None:
                    pids["etcd"] = etcd_pid
                before = {k: cpu_seconds(pid) for k, pid in pids.items()}
                got = child.ask("pipelined", sizes.pipelined)
                used = {k: cpu_seconds(pid) - before[k] for k, pid in pids.items()}
                rates[mode].append(got["rate"])
                used["controller"] = got["cpu_s"]
                if mode in cpu:  # not the floor's
                    for k, v in used.items():
                        cpu[mode].setdefault(k, []).append(v * 1e6 / sizes.pipelined)
                batch = child.ask("round_trips", sizes.round_trips)["samples"]
                samples[mode] += batch
                p50s[mode].append(latency_stats(batch)["p50"])
                note(f"  repeat {rep} {mode:>6}: pipelined {rates[mode][-1]:,.0f} calls/s, "
                     f"call_one p50 {p50s[mode][-1]} us")
    floor_rates, floor_samples, floor_p50s = rates.pop(FLOOR), samples.pop(FLOOR), p50s.pop(FLOOR)
    out: dict[str, Any] = {
        "pipelined_calls_per_s": {m: rate_stats(r) for m, r in rates.items()},
        "call_one_us": {m: latency_stats(s) for m, s in samples.items()},
        # The mean over repeats, i.e. all CPU over all calls: /proc counts in 10 ms ticks, a
        # tenth of a repeat's etcd CPU, so one repeat's figure is too coarse to take a median of.
        "pipelined_cpu_us_per_call": {
            m: {k: round(statistics.fmean(v), 2) for k, v in by.items()} for m, by in cpu.items()},
        "floor": {
            "what": f"{FLOOR_WHAT}; measured in turn with the modes",
            "round_trip_us": latency_stats(floor_samples),
            "pipelined_msgs_per_s": rate_stats(floor_rates),
        },
    }
    # A call_one p50 of a repeat, less the floor's p50 in the same repeat: what regent adds to
    # a bare round trip, with the machine's moment-to-moment speed taken out.
    above = {m: [p - f for p, f in zip(v, floor_p50s, strict=True)] for m, v in p50s.items()}
    out["call_one_p50_over_floor_us"] = {m: _median_and_interval(v, 1) for m, v in above.items()}
    if "off" in rates:
        # Each repeat runs the modes back to back, so a ratio within a repeat sees the same
        # machine load; the figure is the median of those paired ratios.
        paired = {f"{m}_over_off": [a / b for a, b in zip(r, rates["off"], strict=True)]
                  for m, r in rates.items() if m != "off"}
        ratios = {k: _median_and_interval(v, 3) for k, v in paired.items()}
        out["pipelined_ratio"] = {k: r["median"] for k, r in ratios.items()}
        out["pipelined_ratio_ci95"] = {k: r["ci95"] for k, r in ratios.items()}
        out["pipelined_ratio_per_repeat"] = {k: [round(x, 3) for x in v] for k, v in paired.items()}
        off = statistics.median(rates["off"])
        out["pipelined_ratio_of_medians"] = {
            f"{m}_over_off": round(statistics.median(r) / off, 3) for m, r in rates.items() if m != "off"}
        out["call_one_p50_over_off"] = {
            m: round(out["call_one_us"][m]["p50"] / out["call_one_us"]["off"]["p50"], 3)
            for m in rates if m != "off"}
        out["call_one_p50_added_over_off_us"] = {
            m: _median_and_interval([a - b for a, b in zip(p50s[m], p50s["off"], strict=True)], 1)
            for m in rates if m != "off"}
    out["definition"] = (f"{sizes.pipelined} call_one futures to one no-op actor, then get() each; "
                         f"{sizes.round_trips} sequential call_one round trips per repeat "
                         f"(latency over all repeats); {sizes.overhead_repeats} repeats, modes "
                         "and the floor taking turns, each in a process of its own; "
                         "pipelined_ratio = median over repeats of journaled/off; ci95 = the "
                         "distribution-free 95% interval of that median (sign test); "
                         "*_over_floor_us and *_added_over_off_us = median over repeats of the "
                         "difference of per-repeat call_one p50s")
    return out


def _median_and_interval(values: list[float], digits: int) -> dict[str, Any]:
    """The median, and its 95% interval (bench_core.median_interval; None: too few repeats)."""
    interval = median_interval(values)
    return {"median": round(statistics.median(values), digits),
            "ci95": None if interval is None else [round(x, digits) for x in interval]}


# --- figure 4: replay -------------------------------------------------------------------------


def read_and_match(journal_url: str, session: str, repeats: int) -> dict[str, Any]:
    """What a standby does before and during replay, without the program around it: read the
    journal (decode and checksums), index it, and check every journaled call against it."""
    from regent.controller.replay import ReplayIndex, expand
    from regent.journal import open_journal

    journal = open_journal(journal_url)
    try:
        index = ReplayIndex(journal.read(session))
        # The calls a replaying program presents, in seq order (built outside the timing).
        expected = [(jc.seq, jc.kind, jc.actor, jc.method, jc.digest,
                     None if jc.kind == "choose" else tuple(jc.points))
                    for jc in sorted(index.calls.values(), key=lambda c: c.seq)]
        times: list[tuple[float, float, float]] = []
        gc_off: list[float] = []
        records = 0
        for _ in range(repeats):
            with collected_heap():
                t0 = time.perf_counter()
                recs = list(journal.read(session))
                t1 = time.perf_counter()
                idx = ReplayIndex(recs)
                t2 = time.perf_counter()
                check = idx.check
                for seq, kind, actor, method, digest, points in expected:
                    check(seq, kind, actor, method, digest, points)
                t3 = time.perf_counter()
            stored = len(recs)
            # Counted as the call and result records they hold (CALLS and RESULTS records pack
            # many), so the rate reads the same whatever the stored form.
            records = sum(1 for _ in expand(recs))
            times.append((t1 - t0, t2 - t1, t3 - t2))
            del recs, idx
            # Diagnostic, right after: the same read and index with the cyclic GC off.
            with collected_heap():
                gc.disable()
                try:
                    t0 = time.perf_counter()
                    ReplayIndex(list(journal.read(session)))
                    gc_off.append(time.perf_counter() - t0)
                finally:
                    gc.enable()
    finally:
        journal.close()
    read_s = statistics.median(t[0] for t in times)
    index_s = statistics.median(t[1] for t in times)
    match_s = statistics.median(t[2] for t in times)
    total = statistics.median(sum(t) for t in times)
    return {
        "records": records,
        "stored_records": stored,
        "calls": len(expected),
        "records_per_s": round(records / total),
        "read_records_per_s": round(records / read_s),
        "index_records_per_s": round(records / index_s),
        "match_calls_per_s": round(len(expected) / match_s),
        "read_and_index_records_per_s": round(records / (read_s + index_s)),
        "read_and_index_records_per_s_gc_off": round(records / statistics.median(gc_off)),
        "seconds": {"read": round(read_s, 4), "index": round(index_s, 4),
                    "match": round(match_s, 4), "total": round(total, 4)},
        "repeats": repeats,
    }


@dataclass(frozen=True)
class Recorded:
    """A run of `calls` pipelined calls, handed over with nobody standing by: open for replay."""

    session: str
    env: dict[str, str]
    marks: Path
    calls: int
    calls_per_s: float
    primary_exit: int


def record(programs: Programs, backend: str, journal_url: str, calls: int) -> Recorded:
    session = f"replay-{backend}-{calls}-{secrets.token_hex(3)}"
    marks = programs.work / f"{session}.marks"
    env = program_env(session, journal_url, 2.0, marks, BENCH_CALLS=str(calls))
    primary = programs.start(env, programs.work / f"{session}.0.log")
    try:
        done = wait_for(lambda: find_mark(marks, "recorded", primary.pid), 600,
                        f"the primary did not record {calls} calls")
        lead = find_mark(marks, "lead", primary.pid)
        assert lead is not None
        primary.send_signal(signal.SIGTERM)  # hand over: the run stays open for a standby
        rc = primary.wait(60)
    finally:
        programs.reap([primary])
    rate = calls / (done["at"] - lead["returned_at"])
    note(f"  {backend}: recorded {calls} calls at {rate:,.0f} calls/s (pipelined, spawn included)")
    return Recorded(session, env, marks, calls, rate, rc)


def standby_replay(programs: Programs, rec: Recorded, records: int) -> dict[str, Any]:
    """A standby takes the recorded run over at once and replays it: leader -> replay done."""
    log = programs.work / f"{rec.session}.1.log"
    standby = programs.start(rec.env, log)
    try:
        live = wait_for(lambda: find_mark(rec.marks, "live", standby.pid), 600,
                        "the standby did not finish replaying")
        lead = find_mark(rec.marks, "lead", standby.pid)
        assert lead is not None
        rc = standby.wait(60)
    finally:
        programs.reap([standby])
    replay_s = live["replay_done_at"] - lead["leader_at"]
    logged = log_field(log, "replay complete; now live", "takeover_s")
    return {
        "calls": rec.calls,
        "records": records,
        "calls_replayed": live["stats"]["replayed"] + live["stats"]["resent"],
        "calls_resent": live["stats"]["resent"],
        "records_per_s": round(records / replay_s),
        "calls_per_s": round(rec.calls / replay_s),
        "seconds": {
            "leader_to_replay_done": round(replay_s, 3),
            "open": round(lead["returned_at"] - lead["leader_at"], 3),
            "program_replay": round(live["replay_done_at"] - lead["returned_at"], 3),
            "first_live_call": round(live["at"] - live["replay_done_at"], 4),
            "logged_takeover_s": float(logged) if logged else None,
        },
        "exits": [rec.primary_exit, rc],
    }


def run_replay(programs: Programs, backend: str, journal_url: str, sizes: Sizes) -> dict[str, Any]:
    """Read-and-match on a long recorded run; real standby replays on shorter ones, at two
    lengths, since the per-call cost of a standby's replay depends on the journal's length."""
    big = record(programs, backend, journal_url, sizes.replay_calls)
    offline = read_and_match(journal_url, big.session, sizes.replay_repeats)
    note(f"  {backend}: read+index+match {offline['records']} records: "
         f"{offline['records_per_s']:,} records/s ({offline['seconds']})")
    by_size = []
    for calls in sizes.standby_calls:
        rec = record(programs, backend, journal_url, calls)
        records = read_and_match(journal_url, rec.session, 1)["records"]
        st = standby_replay(programs, rec, records)
        note(f"  {backend}: standby replay of {calls} calls: {st['records_per_s']:,} records/s, "
             f"{st['calls_per_s']:,} calls/s ({st['seconds']})")
        by_size.append(st)
    return {
        "calls_recorded": sizes.replay_calls,
        "record_calls_per_s": round(big.calls_per_s),
        "read_and_match": offline,
        "standby": by_size[-1] if by_size else {},
        "standby_by_size": by_size,
    }


# --- the report ---------------------------------------------------------------------------------


def _figure(res: dict[str, Any], path: str) -> float | None:
    cur: Any = res
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur if isinstance(cur, int | float) else None


# Which part of the bench measures each figure (a part left out with --only is not a miss).
_PART_OF = {"failover_sigkill": "failover", "handoff_sigterm": "failover",
            "journal_overhead": "overhead", "replay": "replay"}


def check_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for path, op, bound in TARGETS:
        if _PART_OF[path.split(".")[0]] not in report.get("parts", PARTS):
            continue
        value = _figure(report, path)
        if value is None and report.get("scenarios") and path.startswith(("failover_sigkill.", "handoff_sigterm.")):
            continue  # a scenario --scenario left out
        met = value is not None and (value <= bound if op == "<=" else value >= bound)
        rows.append({"figure": path, "target": f"{op} {bound:g}", "value": value, "met": met})
    return rows


def summary(report: dict[str, Any]) -> None:
    note("")
    for name, f in report.get("failover_sigkill", {}).items():
        if "total_s" in f and f["total_s"].get("n"):
            note(f"SIGKILL {name:<12} total p50 {f['total_s']['p50']:.3f} s "
                 f"[{f['total_s']['min']:.3f}..{f['total_s']['max']:.3f}] = lease wait "
                 f"{f['lease_wait_s']['p50']:.3f} + takeover {f['takeover_s']['p50']:.3f} "
                 f"(open {f['open_s']['p50']:.3f}, replay {f['replay_s']['p50']:.3f}, "
                 f"first call {f['first_call_s']['p50']:.4f})")
    for name, f in report.get("handoff_sigterm", {}).items():
        if "total_ms" in f and f["total_ms"].get("n"):
            parts = ", ".join(f"{k.removesuffix('_ms')} {f[k]['p50']}" for k in (
                "signal_to_flushed_ms", "flushed_to_resigned_ms", "resigned_to_leader_ms",
                "takeover_ms") if f.get(k, {}).get("n"))
            note(f"SIGTERM {name:<12} total p50 {f['total_ms']['p50']} ms "
                 f"[{f['total_ms']['min']}..{f['total_ms']['max']}] ({parts})")
    for name, c in report.get("campaign", {}).items():
        note(f"campaign {name:<11} p50 {c['campaign_ms']['p50']} ms, resign p50 "
             f"{c['resign_ms']['p50']} ms")
    ov = report.get("journal_overhead", {})
    for mode, rate in ov.get("pipelined_calls_per_s", {}).items():
        ratio = f"{mode}_over_off"
        interval = ov.get("pipelined_ratio_ci95", {}).get(ratio)
        note(f"journal {mode:<6} pipelined {rate['median']:>7,} calls/s (ratio to off "
             f"{ov.get('pipelined_ratio', {}).get(ratio, 1.0)}"
             f"{f', 95% {interval}' if interval else ''}), call_one p50 "
             f"{ov['call_one_us'][mode]['p50']} us ({ov['call_one_p50_over_floor_us'][mode]['median']:+} "
             f"over the floor); CPU us/call {ov['pipelined_cpu_us_per_call'][mode]}")
    if "floor" in ov:
        note(f"floor   zmq round trip p50 {ov['floor']['round_trip_us']['p50']} us, in turn with the modes")
    for backend, r in report.get("replay", {}).items():
        rm = r["read_and_match"]
        note(f"replay  {backend:<6} read+index+match {rm['records']} records: "
             f"{rm['records_per_s']:,}/s (read+index {rm['read_and_index_records_per_s']:,}/s, "
             f"with gc off {rm['read_and_index_records_per_s_gc_off']:,}/s)")
        for st in r["standby_by_size"]:
            note(f"        {backend:<6} standby replay of {st['calls']:>6} calls: "
                 f"{st['records_per_s']:>7,} records/s, {st['calls_per_s']:>6,} calls/s")
    for row in report["targets"]:
        mark = "ok  " if row["met"] else "MISS"
        note(f"{mark}  {row['figure']:<52} {row['value']!s:>10}   target {row['target']}")


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def source_tree() -> dict[str, Any]:
    """The commit measured, and the paths that differed from it when the bench started."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
    return {"commit": git("rev-parse", "HEAD").strip(),
            "changed": [line[3:] for line in git("status", "--porcelain").splitlines()]}


def fast_election_etcd() -> EtcdServer:
    """etcd with a 600 ms election timeout, whose minimum lease is then 1 s rather than 2 s
    (etcd's minimum lease ttl is 1.5 x the election timeout, rounded up to a second)."""
    return EtcdServer(extra_args=["--heartbeat-interval", "100", "--election-timeout", "600"])


@contextlib.contextmanager
def etcd_server(kind: Callable[[], EtcdServer] = EtcdServer) -> Iterator[EtcdServer | None]:
    if not etcd_available():
        note("etcd is not installed: the etcd figures are skipped")
        yield None
        return
    with kind() as server:
        yield server


def run_campaigns(journals: dict[str, str], repeats: int) -> dict[str, Any]:
    """What winning a free session costs, the last step of every takeover after the leader key
    is gone (campaign returns once the next lsn is known), and what resigning costs."""
    from regent.journal import open_journal
    from regent.worker.logsetup import configure_logging

    configure_logging(only_if_unconfigured=True)
    out: dict[str, Any] = {}
    for backend, url in journals.items():
        journal = open_journal(url)
        won: list[float] = []
        resigned: list[float] = []
        try:
            for i in range(repeats):
                t0 = time.perf_counter()
                lead = journal.campaign(f"campaign-{secrets.token_hex(3)}-{i}", "bench", ttl_s=2.0)
                t1 = time.perf_counter()
                lead.resign()
                resigned.append((time.perf_counter() - t1) * 1e3)
                won.append((t1 - t0) * 1e3)
        finally:
            journal.close()
        out[backend] = {"campaign_ms": spread(won, 2), "resign_ms": spread(resigned, 2)}
        note(f"  {backend}: campaign p50 {out[backend]['campaign_ms']['p50']} ms, "
             f"resign p50 {out[backend]['resign_ms']['p50']} ms")
    return out


PARTS = ("failover", "overhead", "replay")


def bench(sizes: Sizes, quick: bool, seed: int, keep_workdir: bool,
          parts: tuple[str, ...] = PARTS, scenarios: tuple[str, ...] = ()) -> dict[str, Any]:
    started = time.perf_counter()
    rng = random.Random(seed)
    report: dict[str, Any] = {"bench": "failover", "quick": quick, "machine": machine(),
                              "tree": source_tree(), "sizes": asdict(sizes), "seed": seed,
                              "parts": list(parts), "scenarios": list(scenarios)}
    work = Path(tempfile.mkdtemp(prefix="regent-bench-failover-"))
    programs = Programs(work)
    with (private_regent_home(), etcd_server() as etcd,
          etcd_server(fast_election_etcd) as fast_etcd):
        sqlite_url = f"sqlite://{work / 'journal.db'}"
        try:
            kill: list[Scenario] = []
            term: list[Scenario] = []
            if etcd is not None and fast_etcd is not None:
                kill.append(Scenario("etcd_ttl2", etcd.url, 2.0, signal.SIGKILL))
                kill.append(Scenario("etcd_ttl1_fast_election", fast_etcd.url, 1.0, signal.SIGKILL))
                kill.append(Scenario("etcd_ttl2_async", etcd.url, 2.0, signal.SIGKILL, asyncio=True))
                term.append(Scenario("etcd", etcd.url, 2.0, signal.SIGTERM))
            kill += [Scenario("sqlite_ttl1", sqlite_url, 1.0, signal.SIGKILL),
                     Scenario("sqlite_ttl2", sqlite_url, 2.0, signal.SIGKILL),
                     Scenario("sqlite_ttl2_async", sqlite_url, 2.0, signal.SIGKILL, asyncio=True)]
            term.append(Scenario("sqlite", sqlite_url, 2.0, signal.SIGTERM))
            if scenarios:  # --scenario: only those
                kill = [scn for scn in kill if scn.name in scenarios]
                term = [scn for scn in term if scn.name in scenarios]
            if "failover" in parts:
                note(f"failover after SIGKILL: {sizes.runs} runs of {[s.name for s in kill]}")
                report["failover_sigkill"] = run_failovers(programs, kill, sizes, rng)
                note(f"hand-off after SIGTERM: {sizes.runs} runs of {[s.name for s in term]}")
                report["handoff_sigterm"] = run_failovers(programs, term, sizes, rng)
                note("campaign for a free session, and resign, in this process")
                report["campaign"] = run_campaigns({s.name: s.journal for s in term}, 10)
            if "overhead" in parts:
                journals = {"off": "off", "sqlite": f"sqlite://{work / 'overhead.db'}"}
                if etcd is not None:
                    journals["etcd"] = etcd.url
                note(f"journal overhead: {list(journals)}")
                etcd_pid = etcd.proc.pid if etcd is not None and etcd.proc is not None else None
                report["journal_overhead"] = run_overhead(journals, sizes, etcd_pid)
            if "replay" in parts:
                replay_on = {"sqlite": f"sqlite://{work / 'replay.db'}"}
                if etcd is not None:
                    replay_on["etcd"] = etcd.url
                report["replay"] = {}
                for backend, url in replay_on.items():
                    note(f"replay on {backend}: read-and-match {sizes.replay_calls} calls, "
                         f"standby replays of {list(sizes.standby_calls)} calls")
                    report["replay"][backend] = run_replay(programs, backend, url, sizes)
        finally:
            programs.close()
    failed = any("errors" in f for part in ("failover_sigkill", "handoff_sigterm")
                 for f in report.get(part, {}).values())
    if keep_workdir or failed:
        report["workdir"] = str(work)  # the controllers' logs and marks
        note(f"controller logs and marks kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    report["targets"] = check_targets(report)
    report["notes"] = [
        "total = SIGKILL/SIGTERM of the primary -> first call completed live by the standby; "
        "lease_wait = signal -> standby won the campaign; takeover = won -> first live call "
        "(open: journal read + index + fencing workers inside Session(); replay: the program "
        "re-run through the journal; first_call: one live round trip)",
        "etcd grants at least 2 s leases with its default 1 s election timeout (minimum = "
        "1.5 x election timeout, rounded up to a second), so lease_ttl_s=1.0 runs as 2.0 there; "
        "etcd_ttl1_fast_election runs etcd with --election-timeout 600 ms, where 1 s leases hold",
    ]
    report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["wall_s"] = round(time.perf_counter() - started, 1)
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer runs and calls (~1.5 min)")
    p.add_argument("--runs", type=int, help="failovers per scenario (default 5, quick 3)")
    p.add_argument("--replay-calls", type=int, help="calls recorded for the replay figure")
    p.add_argument("--standby-calls", help="comma-separated lengths of the real standby replays")
    p.add_argument("--seed", type=int, default=3, help="seed of the kill-time jitter")
    p.add_argument("--keep-workdir", action="store_true",
                   help="keep the controllers' logs and marks (kept anyway when a run failed)")
    p.add_argument("--only", choices=PARTS, action="append",
                   help="run only this part (repeatable): failover (SIGKILL and SIGTERM), overhead "
                        "(the journal on the call path), replay")
    p.add_argument("--scenario", action="append", default=[],
                   help="with the failover part, run only this scenario (repeatable), e.g. sqlite_ttl2_async")
    p.add_argument("--json-out", type=Path, help="also write the JSON report to this file")
    p.add_argument("--overhead-child", metavar="JOURNAL", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=Sizes.warmup, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.overhead_child:
        os.environ.setdefault("REGENT_LOG_LEVEL", "WARNING")
        overhead_child(a.overhead_child, a.warmup)
        return
    sizes = Sizes.quick() if a.quick else Sizes()
    if a.runs:
        sizes = Sizes(**{**asdict(sizes), "runs": a.runs})
    if a.replay_calls:
        sizes = Sizes(**{**asdict(sizes), "replay_calls": a.replay_calls})
    if a.standby_calls:
        calls = tuple(int(x) for x in a.standby_calls.split(","))
        sizes = Sizes(**{**asdict(sizes), "standby_calls": calls})
    # In-process sessions (the overhead figure) log at WARNING; the programs keep INFO.
    os.environ.setdefault("REGENT_LOG_LEVEL", "WARNING")
    parts = tuple(a.only) if a.only else PARTS
    run_and_report(lambda: bench(sizes, a.quick, a.seed, a.keep_workdir, parts, tuple(a.scenario)), summary,
                   a.json_out)


if __name__ == "__main__":
    main()
