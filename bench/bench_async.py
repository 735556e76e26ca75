"""The session's event loop against the sequential call path, in one run (issue #17).

    .venv/bin/python bench/bench_async.py [--repeats N] [--journal sqlite|etcd|off] [--json-out FILE]

One session, one actor on one proc. Each repeat measures, taking turns: call_one p50 in a
sequential loop (`.get()`) and in an asyncio loop on `s.run` (`await`), and pipelined calls/s
both ways (N futures issued, then read in order with `.get()` / `await`). Figures are medians
over repeats with the per-repeat ratios async / sequential; the targets (async p50 at most
1.15x the sequential p50, pipelined ratio at least 0.9) are printed beside them. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench_core import (  # noqa: E402
    collected_heap,
    latency_stats,
    note,
    note_targets,
    private_regent_home,
    run_and_report,
)

from regent.controller import Session  # noqa: E402
from regent.worker import Actor, endpoint  # noqa: E402
from tests.support.etcd import EtcdServer, etcd_available  # noqa: E402

TARGETS = [("call_one_p50_ratio", "<=", 1.15), ("pipelined_ratio", ">=", 0.9)]


class Noop(Actor):
    @endpoint
    def noop(self, i: int = 0) -> int:
        return i


def sequential_latency(one: Any, n: int) -> list[int]:
    out = []
    for i in range(n):
        t = time.perf_counter_ns()
        one.noop.call_one(i).get()
        out.append(time.perf_counter_ns() - t)
    return out


async def async_latency(one: Any, n: int) -> list[int]:
    out = []
    for i in range(n):
        t = time.perf_counter_ns()
        await one.noop.call_one(i)
        out.append(time.perf_counter_ns() - t)
    return out


def sequential_pipelined(one: Any, n: int) -> float:
    t = time.perf_counter()
    futures = [one.noop.call_one(i) for i in range(n)]
    for f in futures:
        f.get()
    return n / (time.perf_counter() - t)


async def async_pipelined(one: Any, n: int) -> float:
    t = time.perf_counter()
    futures = [one.noop.call_one(i) for i in range(n)]
    for f in futures:
        await f
    return n / (time.perf_counter() - t)


def bench(journal: str, repeats: int, calls: int, pipelined: int) -> dict[str, Any]:
    figures: dict[str, list[float]] = {k: [] for k in ("seq_p50", "async_p50", "seq_rate", "async_rate")}
    with Session("bench-async", journal=journal) as s:
        one = s.spawn_procs(per_host={"procs": 1}).spawn("noop", Noop).slice(procs=0)
        sequential_latency(one, 500)  # warm-up, both paths
        s.run(async_latency(one, 500))
        for r in range(repeats):
            with collected_heap():
                figures["seq_p50"].append(latency_stats(sequential_latency(one, calls))["p50"])
            with collected_heap():
                figures["async_p50"].append(latency_stats(s.run(async_latency(one, calls)))["p50"])
            with collected_heap():
                figures["seq_rate"].append(sequential_pipelined(one, pipelined))
            with collected_heap():
                figures["async_rate"].append(s.run(async_pipelined(one, pipelined)))
            note(f"  repeat {r}: p50 {figures['seq_p50'][-1]} / {figures['async_p50'][-1]} us, "
                 f"pipelined {figures['seq_rate'][-1]:.0f} / {figures['async_rate'][-1]:.0f} calls/s")
    p50_ratios = [a / q for a, q in zip(figures["async_p50"], figures["seq_p50"], strict=True)]
    rate_ratios = [a / q for a, q in zip(figures["async_rate"], figures["seq_rate"], strict=True)]
    return {
        "call_one_p50_us": {"sequential": statistics.median(figures["seq_p50"]),
                            "async": statistics.median(figures["async_p50"])},
        "pipelined_calls_per_s": {"sequential": round(statistics.median(figures["seq_rate"])),
                                  "async": round(statistics.median(figures["async_rate"]))},
        "call_one_p50_ratio": round(statistics.median(p50_ratios), 3),
        "pipelined_ratio": round(statistics.median(rate_ratios), 3),
        "per_repeat": {"call_one_p50_ratio": [round(x, 3) for x in p50_ratios],
                       "pipelined_ratio": [round(x, 3) for x in rate_ratios]},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=2000, help="call_one round trips per repeat and path")
    p.add_argument("--pipelined", type=int, default=10_000, help="futures per pipelined repeat")
    p.add_argument("--journal", choices=["sqlite", "etcd", "off"], default="sqlite")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args(argv)

    def run() -> dict[str, Any]:
        report: dict[str, Any] = {"bench": "async", "journal": args.journal, "repeats": args.repeats}
        with private_regent_home():
            if args.journal == "etcd":
                if not etcd_available():
                    return {**report, "unavailable": "etcd is not installed (scripts/install_etcd.sh)"}
                with EtcdServer() as etcd:
                    report.update(bench(etcd.url, args.repeats, args.calls, args.pipelined))
            elif args.journal == "sqlite":
                report.update(bench(f"sqlite://{tempfile.mkdtemp()}/journal.db", args.repeats, args.calls,
                                    args.pipelined))
            else:
                report.update(bench("off", args.repeats, args.calls, args.pipelined))
        report["targets"] = [{"figure": f, "op": op, "bound": b, "value": report.get(f),
                              "met": report.get(f) is not None and (report[f] <= b if op == "<=" else report[f] >= b)}
                             for f, op, b in TARGETS]
        return report

    run_and_report(run, note_targets, args.json_out)


if __name__ == "__main__":
    main()
