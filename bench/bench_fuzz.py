"""Fuzzing bench: every wire and journal decoder against generated inputs, then a live proc and
a live host agent against fuzzed messages on their real sockets.

    .venv/bin/python bench/bench_fuzz.py [--inputs N] [--hypothesis M] [--live K] [--only NAME ...]
                                         [--seed S] [--json-out FILE]

Per target (tests/fuzz/targets.py): N inputs (default 100,000) from the targets' mutation loop
over valid encodings, driven by a Random seeded with S, so a run repeats exactly; then M
examples (default 2,000) from the Hypothesis strategies the tests use (tests/fuzz/strategies.py,
derandomized, no example database). A crash is an exception the decoder does not document or a
value that breaks its contract; an input slower than HANG_S counts as a hang. While the
decoders run, the address space is capped (--memory-gib), so a runaway allocation is a
MemoryError, counted, not the machine's OOM killer. The live part (tests/fuzz/live.py) sends K
messages (default 100,000) to each of a proc and a host agent in a temporary REGENT_HOME, then
checks they answer and counts their drop lines. One JSON object on stdout, notes on stderr; it
asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hypothesis  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

from regent.worker import Actor, endpoint  # noqa: E402
from tests.fuzz.strategies import inputs  # noqa: E402
from tests.fuzz.targets import TARGETS, Crash, Target  # noqa: E402

HANG_S = 1.0


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def address_space_cap(gib: float) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = int(gib * (1 << 30))
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def mutation_loop(target: Target, n: int, seed: int) -> dict[str, Any]:
    """n inputs from the target's own generator; outcomes counted, crashes kept (the first
    of each kind, input and error, for a regression test)."""
    rnd = random.Random(seed)
    outcomes: collections.Counter = collections.Counter()
    crashes: dict[str, dict] = {}
    crash_count = hangs = 0
    slowest = 0.0
    clock = time.perf_counter
    started = clock()
    for _ in range(n):
        data = target.generate(rnd)
        t = clock()
        try:
            outcomes[target.run(data)] += 1
        except Crash as c:
            crash_count += 1
            error = c.error if isinstance(c.error, str) else f"{type(c.error).__name__}: {c.error}"
            crashes.setdefault(error[:80], {"error": error[:400], "input": c.shown[:400]})
        took = clock() - t
        slowest = max(slowest, took)
        hangs += took > HANG_S
    seconds = clock() - started
    return {"inputs": n, "crashes": crash_count, "hangs": hangs, "outcomes": dict(outcomes),
            "error_types": sorted(k for k in outcomes if k not in ("ok", "refused", "problems")),
            "seconds": round(seconds, 2), "inputs_per_s": round(n / seconds) if seconds else None,
            "slowest_ms": round(slowest * 1000, 2), "first_crashes": list(crashes.values())[:5]}


def hypothesis_run(target: Target, examples: int) -> dict[str, Any]:
    """`examples` inputs from the tests' strategies; a crash stops the run, shrunk."""
    ran = 0

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(inputs(target))
    def run(data: Any) -> None:
        nonlocal ran
        ran += 1
        target.run(data)

    started = time.perf_counter()
    crash = None
    try:
        run()
    except Crash as c:
        crash = {"error": str(c)[:600]}
    return {"examples": ran, "crashes": int(crash is not None), "seconds": round(time.perf_counter() - started, 2),
            **({"crash": crash} if crash else {})}


def fuzz_decoders(names: list[str], n: int, examples: int, seed: int) -> dict[str, Any]:
    out = {}
    for name in names:
        target = TARGETS[name]
        result = {"what": target.what, **mutation_loop(target, n, seed)}
        if examples:
            result["hypothesis"] = hypothesis_run(target, examples)
        out[name] = result
        hyp = result.get("hypothesis", {})
        note(f"{name:26s} {result['inputs']:>8} inputs  {result['crashes']} crashes  {result['hangs']} hangs  "
             f"{result['seconds']:7.2f} s  slowest {result['slowest_ms']:.1f} ms  {result['outcomes']}"
             + (f"  | hypothesis {hyp['examples']} examples, {hyp['crashes']} crashes, {hyp['seconds']} s"
                if hyp else ""))
    return out


class Echo(Actor):
    @endpoint
    def echo(self, x: Any) -> Any:
        return x


@contextmanager
def private_regent_home() -> Iterator[Path]:
    """A REGENT_HOME of our own: its own host agent (and its log), stopped at the end."""
    home = Path(tempfile.mkdtemp(prefix="regent-bench-fuzz-"))
    saved = {k: os.environ.get(k) for k in ("REGENT_HOME", "REGENT_HOST_IDLE_EXIT_S", "REGENT_FORWARD_OUTPUT")}
    os.environ["REGENT_HOME"] = str(home)
    os.environ["REGENT_HOST_IDLE_EXIT_S"] = "30"
    os.environ["REGENT_FORWARD_OUTPUT"] = "0"  # the proc's 100,000 drop lines: host.log has them
    try:
        yield home
    finally:
        try:
            os.kill(int(json.loads((home / "host.json").read_text())["pid"]), signal.SIGTERM)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        time.sleep(1.0)
        shutil.rmtree(home, ignore_errors=True)


def fuzz_live(messages: int, seed: int) -> dict[str, Any]:
    """`messages` fuzzed messages to a live proc, then as many to a live host agent."""
    from regent.controller import Session
    from regent.wire.security import init_keys
    from regent.worker.discovery import ensure_local_host, live_host_record
    from tests.fuzz.live import (
        DROPPED,
        FAILED,
        alive,
        fuzz_host,
        fuzz_proc,
        log_lines,
        ping,
        wait_for_lines,
    )
    from tests.runtime.rawpeer import RawPeer

    out: dict[str, Any] = {}
    with private_regent_home() as home:
        init_keys()
        with Session("bench-fuzz") as s:
            mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
            proc = mesh._procs[0]
            host = ensure_local_host()
            agent = live_host_record() or {}
            log = home / "host.log"
            peer = RawPeer()
            try:
                for name, pid, address, fuzz, within, without in (
                    ("proc", proc.pid, proc.address,
                     lambda: fuzz_proc(peer, proc.address, s.sid, s.epoch, "echo", "echo", messages, seed),
                     proc.id, None),
                    ("host agent", agent.get("pid"), host,
                     lambda: fuzz_host(peer, host, s.sid, s.epoch, messages, seed + 1), None, "proc="),
                ):
                    run = fuzz()
                    started = time.perf_counter()
                    answered = ping(peer, address, 10**9, timeout=120)["pid"] == pid
                    drained = time.perf_counter() - started
                    call_ok = mesh.echo.call_one("alive").get(timeout=60) == "alive"
                    logged = len(wait_for_lines(log, DROPPED, run.drops, within=within, without=without,
                                                timeout=60))
                    out[name] = {
                        "messages": messages, "sent": run.sent, "held_back": run.skipped,
                        "drops_owed": run.drops, "drop_lines": logged, "send_s": round(run.seconds, 2),
                        "drain_s": round(drained, 2), "alive": alive(pid), "answered_ping": answered,
                        "session_call_ok": call_ok, "crashes": int(not (alive(pid) and answered and call_ok)),
                    }
                    note(f"live {name}: {out[name]}")
                out["failed_to_dispatch_lines"] = len(log_lines(log, FAILED))
                out["traceback_lines"] = len(log_lines(log, "Traceback"))
            finally:
                peer.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=100_000, help="mutation-loop inputs per target")
    p.add_argument("--hypothesis", type=int, default=2_000, help="Hypothesis examples per target (0: none)")
    p.add_argument("--live", type=int, default=100_000, help="messages to the live proc and agent each (0: none)")
    p.add_argument("--only", nargs="*", default=None, help="targets whose name contains one of these")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--memory-gib", type=float, default=4.0, help="address-space cap while decoders run")
    p.add_argument("--json-out", type=Path, help="also write the JSON report to this file")
    a = p.parse_args(argv)
    names = [n for n in TARGETS if a.only is None or any(o in n for o in a.only)]
    started = time.perf_counter()
    with address_space_cap(a.memory_gib):
        decoders = fuzz_decoders(names, a.inputs, a.hypothesis, a.seed)
    report: dict[str, Any] = {
        "bench": "fuzz", "python": platform.python_version(), "hypothesis": hypothesis.__version__,
        "cpus": os.cpu_count(), "seed": a.seed, "inputs_per_target": a.inputs,
        "hypothesis_examples_per_target": a.hypothesis, "targets": decoders,
        "totals": {"targets": len(decoders), "inputs": sum(r["inputs"] for r in decoders.values()),
                   "hypothesis_examples": sum(r.get("hypothesis", {}).get("examples", 0) for r in decoders.values()),
                   "crashes": sum(r["crashes"] + r.get("hypothesis", {}).get("crashes", 0) for r in decoders.values()),
                   "hangs": sum(r["hangs"] for r in decoders.values()),
                   "seconds": round(sum(r["seconds"] for r in decoders.values()), 1)},
    }
    if a.live and a.only is None:
        report["live"] = fuzz_live(a.live, a.seed)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report)
    if a.json_out:
        a.json_out.write_text(text + "\n")
    print(text, flush=True)


if __name__ == "__main__":
    main()
