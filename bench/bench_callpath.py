"""The small-call path against an older commit, in one run (issue #32): call_one p50/p99 of an
endpoint echoing a 64 B payload (one proc, no journal) next to the bare pyzmq round trip, for
this checkout and for a base commit, in child processes taking turns (ABBA), so both trees see
the same machine. `--profile` adds a cProfile of this checkout's controller and of its proc
over the same calls, each process's functions by own time.

    .venv/bin/python bench/bench_callpath.py [--base f609a6c] [--rounds 6] [--calls 3000] [--profile]

The base tree is `git archive`d into a temporary directory and imported through PYTHONPATH
(its regent/ holds the same symlinks as this checkout's), with the venv of this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
PAYLOAD = b"x" * 64


def child(calls: int, warmup: int, profile_dir: str | None) -> dict[str, Any]:
    """One session: the floor, then call_one echoing 64 B, then the floor again."""
    sys.path.insert(0, str(BENCH))
    import bench_core
    from bench_core import Noop, latency_stats, private_regent_home

    from regent.controller import Session

    def floor() -> float:
        with bench_core.floor_target() as t:
            for _ in range(warmup):
                t.wait(t.issue())
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                t.wait(t.issue())
                samples.append(time.perf_counter_ns() - t0)
        return latency_stats(samples)["p50"]

    before = floor()
    with private_regent_home():
        if profile_dir:  # the proc profiles itself (sitecustomize below, on the path the agent passes on)
            os.environ["REGENT_BENCH_PROFILE_DIR"] = profile_dir
            sys.path.insert(0, profile_dir)
        with Session("callpath", journal="off") as s:
            procs = s.this_host().spawn_procs(per_host={"procs": 1})
            one = procs.spawn("noop", Noop).slice(procs=0)
            for _ in range(warmup):
                one.echo.call_one(PAYLOAD).get()
            prof = None
            if profile_dir:
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                one.echo.call_one(PAYLOAD).get()
                samples.append(time.perf_counter_ns() - t0)
            if prof is not None:
                prof.disable()
                prof.dump_stats(os.path.join(profile_dir, "controller.prof"))
            procs.stop()
    after = floor()
    stats = latency_stats(samples)
    return {"call_one_p50_us": stats["p50"], "call_one_p99_us": stats["p99"], "floor_p50_us": (before + after) / 2}


# The proc's profile: a sitecustomize on the proc's PYTHONPATH starts cProfile in a process
# whose command is regent's proc and dumps it when the process exits.
SITECUSTOMIZE = '''
import os, sys
if os.environ.get("REGENT_BENCH_PROFILE_DIR") and "regent.worker.proc" in " ".join(sys.orig_argv):
    import atexit, cProfile, signal
    _p = cProfile.Profile()
    _p.enable()
    def _dump(*_):
        _p.disable()
        _p.dump_stats(os.path.join(os.environ["REGENT_BENCH_PROFILE_DIR"], f"proc-{os.getpid()}.prof"))
    atexit.register(_dump)
    _prev = signal.getsignal(signal.SIGTERM)
    def _term(signum, frame):
        _dump()
        if callable(_prev):
            _prev(signum, frame)
        else:
            os._exit(0)
    signal.signal(signal.SIGTERM, _term)
'''


def run_child(tree: Path | None, calls: int, warmup: int, profile_dir: str | None = None) -> dict[str, Any]:
    # Procs as fresh processes, as at the older commits compared (and as the profile's
    # sitecustomize needs: a proc forked from a zygote runs none).
    env = {**os.environ, "REGENT_FORK": "0"}
    if tree is not None:
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = [sys.executable, __file__, "--child", "--calls", str(calls), "--warmup", str(warmup)]
    if profile_dir:
        cmd += ["--profile-dir", profile_dir]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"the child for {tree or 'this checkout'} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def top(path: Path, n: int) -> list[str]:
    import pstats

    st = pstats.Stats(str(path))
    rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]  # type: ignore[attr-defined]
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    return [f"{tt / total:6.1%} {tt * 1e6 / max(cc, 1):8.2f} us/call {cc:7d}  {Path(f).name}:{line} {fn}"
            for (f, line, fn), (cc, _nc, tt, _ct, _callers) in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="f609a6c", help="the commit to compare with (default f609a6c, 2026-12-01)")
    ap.add_argument("--rounds", type=int, default=6, help="pairs of runs, ABBA order")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="also profile this checkout's controller and proc")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.calls, args.warmup, args.profile_dir)), flush=True)
        return

    with tempfile.TemporaryDirectory(prefix="regent-base-") as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        runs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
        for r in range(args.rounds):
            order = ("base", "head") if r % 2 == 0 else ("head", "base")
            for which in order:
                res = run_child(base if which == "base" else None, args.calls, args.warmup)
                runs[which].append(res)
                print(f"round {r} {which}: {res}", file=sys.stderr, flush=True)

        def med(which: str, key: str) -> float:
            return round(statistics.median(x[key] for x in runs[which]), 1)

        report: dict[str, Any] = {"base": args.base, "head": head, "rounds": args.rounds, "calls": args.calls}
        for which in ("base", "head"):
            report[which + "_figures"] = {
                "call_one_p50_us": med(which, "call_one_p50_us"),
                "call_one_p99_us": med(which, "call_one_p99_us"),
                "floor_p50_us": med(which, "floor_p50_us"),
                "p50_over_floor": round(statistics.median(x["call_one_p50_us"] / x["floor_p50_us"]
                                                          for x in runs[which]), 2),
            }
        report["paired_p50_head_minus_base_us"] = [
            round(h["call_one_p50_us"] - b["call_one_p50_us"], 1) for b, h in zip(runs["base"], runs["head"], strict=True)]
        report["target_p50_over_floor"] = "<= 1.5"
        if args.profile:
            prof = Path(tmp) / "profile"
            prof.mkdir()
            (prof / "sitecustomize.py").write_text(SITECUSTOMIZE)
            run_child(None, args.calls, args.warmup, str(prof))
            report["profile_controller"] = top(prof / "controller.prof", 25)
            procs = sorted(prof.glob("proc-*.prof"))
            report["profile_proc"] = top(procs[0], 25) if procs else ["no proc profile was written"]
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
