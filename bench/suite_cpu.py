"""Where a run's CPU goes, by kind of process (issue #28): sample every process on the machine
until stopped, then print one JSON object of CPU-seconds and process counts per kind.

    .venv/bin/python bench/suite_cpu.py --out FILE &   # then run the suite; kill -INT it after

Kinds come from the command line (a regent proc, a host agent, a pytest worker, etcd, ...).
Each process counts the CPU it used while sampled, so one that lives less than --interval is
missed, and one already running counts only what it used since the start. FILE is rewritten
every 30 s, so a killed census still leaves its figures.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path

import psutil

KINDS = (
    ("regent.worker.proc", "proc"),
    ("regent.cli host", "host agent"),
    ("sys.stdin.readline", "pytest worker"),  # xdist starts its workers as python -c "...exec(eval(sys.stdin.readline()))"
    ("pytest", "pytest"),
    ("chaos/programs", "chaos program"),
    ("failover/programs", "failover program"),
    ("regent.cli", "regent cli"),
    ("etcd", "etcd"),
    ("toxiproxy", "toxiproxy"),
    ("slurm", "slurm"),
    ("sshd", "sshd"),
    ("/go/pkg/tool/", "go toolchain"),
)


def kind_of(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    for marker, kind in KINDS:
        if marker in text:
            return kind
    return "python other" if "python" in text else "other"


def census(out: Path, interval_s: float) -> None:
    start: dict[tuple[int, float], float] = {}  # what a process had used when first seen
    seen: dict[tuple[int, float], list] = {}  # kind, CPU used since then
    first = True
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    began = last = time.monotonic()
    while not stop:
        for p in psutil.process_iter(["pid", "create_time", "cmdline", "cpu_times"]):
            ct = p.info["cpu_times"]
            if ct is None:
                continue
            key, used = (p.info["pid"], p.info["create_time"]), ct.user + ct.system
            if key not in seen:
                start[key] = used if first else 0.0
                seen[key] = [kind_of(p.info["cmdline"] or []), 0.0]
            seen[key][1] = used - start[key]
        first = False
        time.sleep(interval_s)
        if stop or time.monotonic() - last > 30:
            last = time.monotonic()
            write(out, seen, time.monotonic() - began)


def write(out: Path, seen: dict, wall_s: float) -> None:
    cpu: dict[str, float] = {}
    count: dict[str, int] = {}
    for kind, used in seen.values():
        cpu[kind] = cpu.get(kind, 0.0) + used
        count[kind] = count.get(kind, 0) + (used > 0)
    rows = sorted(cpu, key=lambda k: -cpu[k])
    out.write_text(json.dumps({"wall_s": round(wall_s), "cpus": psutil.cpu_count(),
                               "cpu_s": {k: round(cpu[k], 1) for k in rows},
                               "processes": {k: count[k] for k in rows}}, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    a = p.parse_args()
    census(a.out, a.interval)
    print(a.out.read_text(), end="")


if __name__ == "__main__":
    main()
