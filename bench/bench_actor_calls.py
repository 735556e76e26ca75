"""Calls made by actors against the controller's calls, in one run (issue #21).

    .venv/bin/python bench/bench_actor_calls.py [--repeats N] [--calls N] [--json-out FILE]

One session, three procs: a no-op actor on proc 0, a caller actor on proc 1, and a
`PortServer` for the program's port. Each repeat measures, taking turns:

- call_one p50 of the no-op from the controller program (journaled, SQLite);
- call_one p50 of the no-op from the caller actor (`.get()` in a sync endpoint and `await` in an
  async one), timed inside the actor: the path docs/design.md, "Calls made by actors" describes;
- pipelined calls/s from the actor (N calls issued, then awaited in order);
- port sends/s from an actor into a channel another actor opened, and into the program's port
  (`s.open_port()`, each `recv` a journaled call);
- port sends/s from the program into an actor's channel (`port.send` in the program, each a
  journaled call), against the program's pipelined calls/s.

Ratios are actor / controller; medians over repeats. Asserts nothing.
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

from bench_async import sequential_latency, sequential_pipelined  # noqa: E402  (the controller's side)
from bench_core import collected_heap, latency_stats, note, private_regent_home, run_and_report  # noqa: E402

from regent.controller import Session  # noqa: E402
from regent.worker import Actor, ActorMeshRef, Channel, Port, endpoint  # noqa: E402


class Noop(Actor):
    @endpoint
    def noop(self, i: int = 0) -> int:
        return i


class Caller(Actor):
    def __init__(self, target: ActorMeshRef) -> None:
        self.one = target.slice(**dict.fromkeys(target.dims, 0))

    @endpoint
    def sync_latency(self, n: int) -> list[int]:
        out = []
        for i in range(n):
            t = time.perf_counter_ns()
            self.one.noop.call_one(i).get()
            out.append(time.perf_counter_ns() - t)
        return out

    @endpoint
    async def async_latency(self, n: int) -> list[int]:
        out = []
        for i in range(n):
            t = time.perf_counter_ns()
            await self.one.noop.call_one(i)
            out.append(time.perf_counter_ns() - t)
        return out

    @endpoint
    async def pipelined(self, n: int) -> float:
        t = time.perf_counter()
        futures = [self.one.noop.call_one(i) for i in range(n)]
        for f in futures:
            await f
        return n / (time.perf_counter() - t)

    @endpoint
    async def channel_rate(self, sender: ActorMeshRef, n: int) -> float:
        port, rx = Channel.open()
        t = time.perf_counter()
        sender.send_many.broadcast(port, n)
        for _ in range(n):
            await rx.recv()
        return n / (time.perf_counter() - t)


class Inbox(Actor):
    @endpoint
    def open(self) -> Port:
        self.port, self.rx = Channel.open()  # kept: a receiver is held weakly
        return self.port

    @endpoint
    async def take(self, n: int) -> int:
        for _ in range(n):
            await self.rx.recv()
        return n


def program_send_rate(inbox: Any, n: int) -> float:
    port = inbox.open.call_one().get()
    t = time.perf_counter()
    for i in range(n):
        port.send(i)
    inbox.take.call_one(n).get()
    return n / (time.perf_counter() - t)


class Sender(Actor):
    @endpoint
    def send_many(self, port: Port, n: int) -> None:
        for i in range(n):
            port.send(i)


def program_port_rate(s: Session, sender: Any, n: int) -> float:
    port, rx = s.open_port()
    t = time.perf_counter()
    sender.send_many.broadcast(port, n)
    for _ in range(n):
        rx.recv().get()
    return n / (time.perf_counter() - t)


def bench(journal: str, repeats: int, calls: int, pipelined: int, sends: int) -> dict[str, Any]:
    keys = ("ctl_p50", "sync_p50", "async_p50", "ctl_rate", "actor_rate", "channel_rate", "port_rate", "send_rate")
    figures: dict[str, list[float]] = {k: [] for k in keys}
    with Session("bench-actor-calls", journal=journal) as s:
        procs = s.spawn_procs(per_host={"procs": 3})
        noop = procs.slice(procs=0).spawn("noop", Noop)
        one = noop.slice(hosts=0)
        caller = procs.slice(procs=1).spawn("caller", Caller, noop).slice(hosts=0)
        sender = procs.slice(procs=2).spawn("sender", Sender)
        inbox = procs.slice(procs=2).spawn("inbox", Inbox).slice(hosts=0)
        sequential_latency(one, 300)  # warm-up, every path
        caller.sync_latency.call_one(300).get()
        caller.async_latency.call_one(300).get()
        for r in range(repeats):
            with collected_heap():
                figures["ctl_p50"].append(latency_stats(sequential_latency(one, calls))["p50"])
            figures["sync_p50"].append(latency_stats(caller.sync_latency.call_one(calls).get())["p50"])
            figures["async_p50"].append(latency_stats(caller.async_latency.call_one(calls).get())["p50"])
            with collected_heap():
                figures["ctl_rate"].append(sequential_pipelined(one, pipelined))
            figures["actor_rate"].append(caller.pipelined.call_one(pipelined).get())
            figures["channel_rate"].append(caller.channel_rate.call_one(sender, sends).get())
            with collected_heap():
                figures["port_rate"].append(program_port_rate(s, sender, sends // 10))
            with collected_heap():
                figures["send_rate"].append(program_send_rate(inbox, pipelined))
            note(f"  repeat {r}: p50 controller {figures['ctl_p50'][-1]} / actor sync {figures['sync_p50'][-1]} / "
                 f"async {figures['async_p50'][-1]} us; pipelined {figures['ctl_rate'][-1]:.0f} / "
                 f"{figures['actor_rate'][-1]:.0f} calls/s; channel {figures['channel_rate'][-1]:.0f}/s, "
                 f"program port {figures['port_rate'][-1]:.0f}/s; program sends {figures['send_rate'][-1]:.0f}/s")

    def med(k: str) -> float:
        return statistics.median(figures[k])

    def ratio(a: str, b: str) -> float:
        return round(statistics.median([x / y for x, y in zip(figures[a], figures[b], strict=True)]), 3)

    return {
        "call_one_p50_us": {"controller": med("ctl_p50"), "actor_sync": med("sync_p50"),
                            "actor_async": med("async_p50")},
        "pipelined_calls_per_s": {"controller": round(med("ctl_rate")), "actor": round(med("actor_rate"))},
        "port_values_per_s": {"actor_channel": round(med("channel_rate")), "program_port": round(med("port_rate")),
                              "program_sends": round(med("send_rate"))},
        "program_send_vs_pipelined_call_ratio": ratio("send_rate", "ctl_rate"),
        "actor_sync_p50_ratio": ratio("sync_p50", "ctl_p50"),
        "actor_async_p50_ratio": ratio("async_p50", "ctl_p50"),
        "actor_pipelined_ratio": ratio("actor_rate", "ctl_rate"),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=2000, help="call_one round trips per repeat and path")
    p.add_argument("--pipelined", type=int, default=5000, help="calls per pipelined repeat")
    p.add_argument("--sends", type=int, default=5000, help="values per channel repeat (a tenth to the program)")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args(argv)

    def run() -> dict[str, Any]:
        report: dict[str, Any] = {"bench": "actor_calls", "journal": "sqlite", "repeats": args.repeats}
        with private_regent_home():
            report.update(bench(f"sqlite://{tempfile.mkdtemp()}/journal.db", args.repeats, args.calls,
                                args.pipelined, args.sends))
        return report

    def summary(report: dict[str, Any]) -> None:
        note(f"actor / controller call_one p50: sync {report['actor_sync_p50_ratio']}, "
             f"async {report['actor_async_p50_ratio']}; pipelined {report['actor_pipelined_ratio']}")

    run_and_report(run, summary, args.json_out)


if __name__ == "__main__":
    main()
