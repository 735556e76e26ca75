"""What waking a sleeping reader costs on this machine: a bare pyzmq PUSH/PULL round trip
between two processes, with a little Python work on each side, when both readers sleep in
recv, when both busy-poll and yield the CPU between looks (what regent's readers do for up
to REGENT_SPIN_US), and when both busy-poll without yielding.

    .venv/bin/python bench/bench_wakeups.py [--calls N] [--work-us US]

One JSON object goes to stdout. It asserts nothing; it explains why regent spins.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time

import zmq

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
MODES = {"sleep": (False, False), "spin_yield": (True, True), "spin_no_yield": (True, False)}


def _busy(us: float) -> None:
    """Stand-in for the Python a real reader runs per message."""
    until = time.perf_counter() + us / 1e6
    while time.perf_counter() < until:
        pass


def _wait(sock: zmq.Socket, spin: bool, yield_cpu: bool, budget_s: float) -> None:
    if spin:
        until = time.perf_counter() + budget_s
        while not sock.get(_EVENTS) & _POLLIN and time.perf_counter() < until:
            if yield_cpu:
                os.sched_yield()


def _server(port_out: int, ready: mp.Queue, spin: bool, yield_cpu: bool, work_us: float, budget_s: float) -> None:
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    port_in = inbox.bind_to_random_port("tcp://127.0.0.1")
    out = ctx.socket(zmq.PUSH)
    out.connect(f"tcp://127.0.0.1:{port_out}")
    ready.put(port_in)
    while True:
        _wait(inbox, spin, yield_cpu, budget_s)
        msg = inbox.recv()
        if msg == b"stop":
            break
        _busy(work_us)
        out.send(msg)
    ctx.destroy(linger=0)


def round_trips(mode: str, calls: int, work_us: float, budget_s: float = 0.0002) -> dict[str, float]:
    spin, yield_cpu = MODES[mode]
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    port_out = inbox.bind_to_random_port("tcp://127.0.0.1")
    ready: mp.Queue = mp.Queue()
    server = mp.Process(target=_server, args=(port_out, ready, spin, yield_cpu, work_us, budget_s))
    server.start()
    out = ctx.socket(zmq.PUSH)
    out.connect(f"tcp://127.0.0.1:{ready.get(timeout=30)}")
    samples = []
    warmup = min(300, calls)
    for i in range(calls + warmup):
        _busy(work_us)
        t = time.perf_counter_ns()
        out.send(b"x" * 64)
        _wait(inbox, spin, yield_cpu, budget_s)
        inbox.recv()
        if i >= warmup:
            samples.append(time.perf_counter_ns() - t)
    out.send(b"stop")
    server.join(timeout=10)
    ctx.destroy(linger=0)
    samples.sort()
    pick = lambda q: round(samples[min(len(samples) - 1, int(len(samples) * q))] / 1e3, 1)  # noqa: E731
    return {"p50_us": pick(0.5), "p90_us": pick(0.9), "p99_us": pick(0.99), "n": len(samples)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--work-us", type=float, default=30.0, help="Python work per message on each side")
    args = ap.parse_args()
    report = {"bench": "wakeups", "work_us_per_side": args.work_us, "spin_budget_us": 200,
              "cpus": os.cpu_count(),
              "round_trip": {m: round_trips(m, args.calls, args.work_us) for m in MODES}}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
