"""What serving Prometheus metrics costs the call path, in one run (issue #34).

    .venv/bin/python bench/bench_metrics.py [--repeats N] [--journal sqlite|etcd] [--json-out FILE]

One session with one actor on one proc, its metrics turned off and on in turns (the call
path's hooks detached or attached, the /metrics server closed or serving and scraped every
second, far more often than Prometheus's usual 15 s): call_one p50 of a no-op (`.get()` in a
loop) and pipelined calls/s (N futures, then read in order) in each phase. Medians over repeats
and the per-pair ratios on / off; the target (within 3% on both) is printed beside them.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench_async import Noop, sequential_latency, sequential_pipelined  # noqa: E402
from bench_core import (  # noqa: E402
    add_target,
    collected_heap,
    latency_stats,
    note,
    note_targets,
    private_regent_home,
    run_and_report,
)

from regent.controller import Session  # noqa: E402
from tests.support.etcd import EtcdServer, etcd_available  # noqa: E402


def _scraper(url: str, stop: threading.Event) -> threading.Thread:
    def scrape() -> None:
        while not stop.wait(1.0):
            urllib.request.urlopen(url, timeout=5).read()
    t = threading.Thread(target=scrape, daemon=True)
    t.start()
    return t


class Toggle:
    """Metrics on and off within one session: the call path's hooks attached or not, the /metrics
    server up (scraped every second) or closed. Sessions taking turns differ by up to 10% in
    pipelined calls/s among themselves (where their procs land on the 2 cores), more than
    the 3% to be measured, so the phases take turns inside one session instead."""

    def __init__(self, s: Session):
        self.s, self.metrics = s, s._metrics  # the bench reaches in: no public switch is wanted
        self.stop: threading.Event | None = None

    def on(self) -> None:
        self.metrics.serve("127.0.0.1:0")
        self.s._metrics = self.s.runtime.metrics = self.metrics
        self.stop = threading.Event()
        _scraper(self.metrics.url, self.stop)

    def off(self) -> None:
        if self.stop is not None:
            self.stop.set()
        self.metrics.close()
        self.s._metrics = self.s.runtime.metrics = None


def bench(journal: str, repeats: int, calls: int, pipelined: int) -> dict[str, Any]:
    fig: dict[str, list[float]] = {k: [] for k in ("off_p50", "on_p50", "off_rate", "on_rate")}
    with Session("bench-metrics", journal=journal, metrics="127.0.0.1:0") as s:
        one = s.spawn_procs(per_host={"procs": 1}).spawn("noop", Noop).slice(procs=0)
        sequential_latency(one, 500)  # warm-up
        toggle = Toggle(s)
        size = len(urllib.request.urlopen(s.metrics_url, timeout=5).read())
        for r in range(repeats):
            for on in ((False, True) if r % 2 == 0 else (True, False)):  # either order: no drift favoured
                toggle.on() if on else toggle.off()
                sequential_pipelined(one, 1000)  # settle after the switch
                with collected_heap():
                    fig["on_p50" if on else "off_p50"].append(latency_stats(sequential_latency(one, calls))["p50"])
                with collected_heap():
                    fig["on_rate" if on else "off_rate"].append(sequential_pipelined(one, pipelined))
            note(f"  repeat {r}: p50 {fig['off_p50'][-1]} / {fig['on_p50'][-1]} us, pipelined "
                 f"{fig['off_rate'][-1]:.0f} / {fig['on_rate'][-1]:.0f} calls/s (off / on)")
        toggle.off()
    p50_ratios = [a / b for a, b in zip(fig["on_p50"], fig["off_p50"], strict=True)]
    rate_ratios = [a / b for a, b in zip(fig["on_rate"], fig["off_rate"], strict=True)]
    report = {
        "call_one_p50_us": {"off": statistics.median(fig["off_p50"]), "on": statistics.median(fig["on_p50"])},
        "pipelined_calls_per_s": {"off": round(statistics.median(fig["off_rate"])),
                                  "on": round(statistics.median(fig["on_rate"]))},
        "call_one_p50_ratio": round(statistics.median(p50_ratios), 3),
        "pipelined_ratio": round(statistics.median(rate_ratios), 3),
        "per_repeat": {"call_one_p50_ratio": [round(x, 3) for x in p50_ratios],
                       "pipelined_ratio": [round(x, 3) for x in rate_ratios]},
        "scrape_bytes": size,
    }
    targets: list[dict[str, Any]] = []
    add_target(targets, "call_one_p50_ratio", report["call_one_p50_ratio"], "<=", 1.03)
    add_target(targets, "pipelined_ratio", report["pipelined_ratio"], ">=", 0.97)
    report["targets"] = targets
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--calls", type=int, default=2000, help="call_one round trips per session")
    p.add_argument("--pipelined", type=int, default=10_000, help="futures per session's pipelined run")
    p.add_argument("--journal", choices=["sqlite", "etcd"], default="sqlite")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args(argv)

    def run() -> dict[str, Any]:
        report: dict[str, Any] = {"bench": "metrics", "journal": args.journal, "repeats": args.repeats}
        with private_regent_home():
            if args.journal == "etcd":
                if not etcd_available():
                    return {**report, "unavailable": "etcd is not installed (scripts/install_etcd.sh)"}
                with EtcdServer() as etcd:
                    report.update(bench(etcd.url, args.repeats, args.calls, args.pipelined))
            else:
                report.update(bench(f"sqlite://{tempfile.mkdtemp()}/journal.db", args.repeats, args.calls,
                                    args.pipelined))
        return report

    run_and_report(run, note_targets, args.json_out)


if __name__ == "__main__":
    main()
