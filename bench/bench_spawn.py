"""Spawn of real procs on one host: fresh interpreters against forks of the host's zygote
(the default, worker/zygote.py; REGENT_FORK=0 is the fresh case), with and without torch in the controller (issue #30's
"torch is imported once per host"). No root.

    .venv/bin/python bench/bench_spawn.py [--procs 8] [--rounds 2] [--json-out FILE]

Each case runs a controller program in a child process with a REGENT_HOME of its own (so its
own host agent, started cold; with torch, each actor imports it as it starts) and measures: the first mesh (spawn_procs + one actor per proc +
a `call()` on every actor, wall seconds: what a job's start waits for, a zygote's imports
included), a second mesh of the same size on the warm agent, and the CPU seconds the host
spent (agent, zygote and procs, each process's own user+system time), a full collection of
the cyclic GC in every proc (its median time) and then the procs' proportional memory (PSS:
pages shared with a zygote are counted once between them). Cases
take turns, --rounds times; figures are medians.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench_core import note, run_and_report  # noqa: E402

CHILD = r"""
import json, os, sys, time
import psutil
if sys.argv[2] == "1":
    import torch  # noqa: F401  the controller uses torch: its hosts' procs will
from regent.controller import Session
from regent.worker import Actor, endpoint
from regent.worker.discovery import host_record

class Noop(Actor):
    def __init__(self, use_torch: bool) -> None:
        if use_torch:  # what a training actor does first
            import torch  # noqa: F401

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def collect_ms(self) -> float:
        import gc
        t = time.perf_counter()
        gc.collect()
        return (time.perf_counter() - t) * 1e3

n = int(sys.argv[1])
with Session("bench-spawn", journal="off") as s:
    t0 = time.monotonic()
    first = s.spawn_procs(per_host={"procs": n}).spawn("a", Noop, sys.argv[2] == "1")
    pids = list(first.pid.call().get(timeout=300).values())
    t1 = time.monotonic()
    second = s.spawn_procs(per_host={"procs": n}).spawn("b", Noop, sys.argv[2] == "1")
    pids += list(second.pid.call().get(timeout=300).values())
    t2 = time.monotonic()
    # A full collection in every proc, as one that has run a while has had: its time, and the
    # pages it copied out of the zygote's show in the PSS below.
    collect = [first.collect_ms.call().get(timeout=300).values(), second.collect_ms.call().get(timeout=300).values()]
    collect = sorted(ms for values in collect for ms in values)
    agent = psutil.Process(host_record()["pid"])
    host = [agent, *agent.children(recursive=True)]
    host += [psutil.Process(p) for p in pids if p not in {q.pid for q in host}]
    cpu = sum(sum(p.cpu_times()[:2]) for p in host)
    pss = [psutil.Process(p).memory_full_info().pss for p in pids]
    print(json.dumps({"first_s": t1 - t0, "second_s": t2 - t1, "host_cpu_s": cpu,
                      "pss_mib_per_proc": sum(pss) / len(pss) / 2**20, "processes": len(host),
                      "full_collection_ms": collect[len(collect) // 2]}))
"""


def one(procs: int, torch: bool, fork: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-spawn-") as home:
        env = {**os.environ, "REGENT_HOME": home, "REGENT_FORK": "1" if fork else "0",
               "REGENT_HOST_IDLE_EXIT_S": "5"}
        env.pop("REGENT_PROC_START_TIMEOUT_S", None)
        out = subprocess.run([sys.executable, "-c", CHILD, str(procs), "1" if torch else "0"], env=env,
                             capture_output=True, text=True, timeout=900, cwd=HERE.parent)
        if out.returncode != 0:
            raise RuntimeError(f"the spawn child failed ({out.returncode}): {out.stderr[-2000:]}")
        figures = json.loads(out.stdout.strip().splitlines()[-1])
        time.sleep(1.0)  # the agent stops its procs as the session ends
        return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    cases = [(torch, fork) for torch in (False, True) for fork in (False, True)]
    got: dict[tuple[bool, bool], list[dict]] = {c: [] for c in cases}
    for r in range(args.rounds):
        for case in cases if r % 2 == 0 else reversed(cases):
            figures = one(args.procs, *case)
            note(f"round {r} torch={case[0]} fork={case[1]}: {figures}")
            got[case].append(figures)
    out: dict[str, Any] = {"procs": args.procs, "rounds": args.rounds, "cases": []}
    for (torch, fork), runs in got.items():
        out["cases"].append({"torch": torch, "fork": fork, **{
            k: round(statistics.median(r[k] for r in runs), 3)
            for k in ("first_s", "second_s", "host_cpu_s", "pss_mib_per_proc", "full_collection_ms")}})
    by = {(c["torch"], c["fork"]): c for c in out["cases"]}
    for torch in (False, True):
        fresh, forked = by[(torch, False)], by[(torch, True)]
        out[f"{'torch' if torch else 'plain'}_fork_over_fresh"] = {
            k: round(forked[k] / fresh[k], 3) for k in ("first_s", "second_s", "host_cpu_s", "pss_mib_per_proc")}
    return out


def summary(report: dict[str, Any]) -> None:
    for c in report["cases"]:
        note(f"torch={c['torch']!s:5} fork={c['fork']!s:5} first {c['first_s']:.2f} s, second {c['second_s']:.2f} s, "
             f"host CPU {c['host_cpu_s']:.1f} s, PSS {c['pss_mib_per_proc']:.0f} MiB/proc, "
             f"a full collection {c['full_collection_ms']:.1f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    run_and_report(lambda: run(args), summary, args.json_out)


if __name__ == "__main__":
    main()
