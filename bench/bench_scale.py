"""How a session's cost grows with its mesh, over namespace hosts (issue #18). As root.

    .venv/bin/python bench/bench_scale.py [--shapes 4x1,16x4,64x8] [--calls 50] [--json-out FILE]

Builds 8 namespace hosts on a private bridge with etcd and one cluster agent each
(regent.chaos.netcluster); the controller is this process, on the bridge. For each shape
PROCSxHOSTS it spawns PROCS/HOSTS procs per host and one actor per proc, then measures: spawn
time (procs and actors), `call()` on every actor (p50 over --calls rounds), broadcast
deliveries/s (--broadcasts broadcasts, then one call to be sure all ran; the median of --repeats), this process's CPU per
delivery over the broadcasts, and the RSS per proc. The CPU growth target is measured apart,
over 1, 4 and 8 hosts: a 64-proc and a small mesh in one session, their broadcast phases taking
turns, the median of the paired ratios. Then call_one p50 to a proc on a namespace host against
one on this process's own host (the root namespace's loopback agent), in turns. Then large
frames between hosts (issue #32): a 64 MiB tensor echoed to a proc on a namespace host (out of
band over its sender's data port, AES-GCM) against hipcore's TCP RDMA read of 64 MiB between
procs on two namespace hosts, in turns. `--parts` runs some of these only.
With --peers, Monarch runs the same per-shape loops at the same proc counts on this host
(bench/_peers.py monarch-scale), each figure given as [regent, Monarch]. Targets (printed,
never asserted): CPU per delivery at 64 procs within 1.5x that at 4; 64 procs
over 8 hosts spawned in under 15 s; cross-host call_one p50 within 1.2x of same-host; the
64 MiB echo at 0.8x hipcore's TCP read or better (MB/s: 2 x 64 MiB per echo, 64 MiB per read).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench_core import (  # noqa: E402
    Sizes,
    add_target,
    collected_heap,
    cpu_seconds,
    latency_stats,
    note,
    note_targets,
    private_regent_home,
    run_and_report,
    run_peer,
)

from regent.chaos.netcluster import MultiHost  # noqa: E402
from regent.chaos.netns import unavailable_reason  # noqa: E402
from regent.controller import Session  # noqa: E402
from regent.worker import Actor, endpoint  # noqa: E402

DEFAULT_SHAPES = "4x1,16x1,64x1,4x4,16x4,64x4,16x8,64x8"
HOSTS = 8
# 64 procs on 2 cores can starve etcd past the default 2 s lease: a deposed controller is not
# what this bench measures.
LEASE_TTL_S = 15.0


class Noop(Actor):
    @endpoint
    def noop(self, i: int = 0) -> int:
        return i

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def measure_shape(procs: int, hosts: int, calls: int, broadcasts: int, repeats: int) -> dict[str, Any]:
    if procs % hosts:
        raise ValueError(f"{procs} procs do not spread evenly over {hosts} hosts")
    with Session(f"scale-{procs}x{hosts}-{uuid.uuid4().hex[:6]}", lease_ttl_s=LEASE_TTL_S) as s:
        t0 = time.perf_counter()
        mesh = s.host_mesh(hosts=hosts).spawn_procs(per_host={"procs": procs // hosts})
        spawned_procs = time.perf_counter() - t0
        actors = mesh.spawn("n", Noop)
        spawn_s = time.perf_counter() - t0
        actors.noop.call().get()  # warm every link
        lat = []
        for i in range(calls):
            t = time.perf_counter_ns()
            actors.noop.call(i).get()
            lat.append(time.perf_counter_ns() - t)
        rates, cpus = zip(*(broadcast_phase(actors, procs, broadcasts) for _ in range(repeats)), strict=True)
        pids = actors.pid.call().get().values()
        rss = [psutil.Process(p).memory_info().rss for p in pids]
        return {"procs": procs, "hosts": hosts, "spawn_procs_s": round(spawned_procs, 2),
                "spawn_s": round(spawn_s, 2), "call_all": latency_stats(lat),
                "broadcast_deliveries_per_s": round(statistics.median(rates)),
                "cpu_us_per_delivery": round(statistics.median(cpus), 2),
                "cpu_us_per_delivery_runs": [round(c, 2) for c in cpus],
                "rss_mib_per_proc": round(statistics.fmean(rss) / 2**20, 1)}


def broadcast_phase(actors: Any, procs: int, broadcasts: int) -> tuple[float, float]:
    """(deliveries/s, this process's CPU µs per delivery) of `broadcasts` broadcasts and a call."""
    deliveries = (broadcasts + 1) * procs
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    for i in range(broadcasts):
        actors.noop.broadcast(i)
    actors.noop.call().get()
    return deliveries / (time.perf_counter() - t0), (cpu_seconds() - cpu0) / deliveries * 1e6


def cpu_growth(hosts: int, small: int, large: int, broadcasts: int, rounds: int) -> dict[str, Any]:
    """CPU per delivery of a `large` mesh over that of a `small` one, both over `hosts` hosts in
    one session, their broadcast phases taking turns: each turn gives a ratio of two phases a
    moment apart, which the machine's drift moves alike (the per-shape figures above are
    minutes apart)."""
    with Session(f"scale-growth-{hosts}-{uuid.uuid4().hex[:6]}", lease_ttl_s=LEASE_TTL_S) as s:
        host_mesh = s.host_mesh(hosts=hosts)
        meshes = {n: host_mesh.spawn_procs(per_host={"procs": n // hosts}).spawn(f"n{n}", Noop) for n in (small, large)}
        for m in meshes.values():
            m.noop.call().get()
        per: dict[int, list[float]] = {small: [], large: []}
        for _ in range(rounds):
            for n, m in meshes.items():
                per[n].append(broadcast_phase(m, n, broadcasts)[1])
        ratios = [b / a for a, b in zip(per[small], per[large], strict=True)]
        return {"hosts": hosts, "small": small, "large": large, "ratio": round(statistics.median(ratios), 3),
                "ratios": [round(r, 3) for r in ratios],
                "cpu_us_per_delivery": {str(n): round(statistics.median(v), 2) for n, v in per.items()}}


def cross_host(rounds: int, calls: int) -> dict[str, Any]:
    """call_one p50 to a proc on a namespace host vs one on this host, taking turns."""
    with Session(f"scale-cross-{uuid.uuid4().hex[:6]}", lease_ttl_s=LEASE_TTL_S) as s:
        remote = s.host_mesh(hosts=1).spawn_procs(per_host={"procs": 1}).spawn("r", Noop)
        local = s.spawn_procs(per_host={"procs": 1}).spawn("l", Noop)
        per: dict[str, list[float]] = {"remote": [], "local": []}
        for _ in range(rounds):
            for name, one in (("remote", remote), ("local", local)):
                one.noop.call_one().get()
                lat = []
                for i in range(calls):
                    t = time.perf_counter_ns()
                    one.noop.call_one(i).get()
                    lat.append(time.perf_counter_ns() - t)
                per[name].append(latency_stats(lat)["p50"])
    _stop_local_agent()
    ratios = [r / lo for r, lo in zip(per["remote"], per["local"], strict=True)]
    return {"remote_call_one_p50_us": statistics.median(per["remote"]),
            "local_call_one_p50_us": statistics.median(per["local"]),
            "ratio": round(statistics.median(ratios), 3), "ratios": [round(x, 3) for x in ratios]}


class Bulk(Actor):
    """Echoes a value; owns and reads RDMA buffers (hipcore's TCP path, the bulk figure's floor)."""

    def __init__(self) -> None:
        self.held: list[Any] = []

    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    def buffer(self, nbytes: int) -> Any:
        import torch

        from regent.hipcore import RDMABuffer

        t = torch.ones(nbytes, dtype=torch.uint8)
        self.held = [t, RDMABuffer(t)]
        return self.held[1]

    @endpoint
    async def read(self, buf: Any, reps: int) -> list[float]:
        """Seconds of each of `reps` reads of `buf` over TCP, after one to warm the connection."""
        import torch

        dst = torch.empty(buf.size, dtype=torch.uint8)
        times = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            await buf.read_into(dst, transport="tcp", timeout=120)
            times.append(time.perf_counter() - t0)
        return times[1:]


def bulk_xhost(rounds: int, reps: int, nbytes: int = 64 << 20) -> dict[str, Any]:
    """MB/s of a tensor echo to a proc on host 1 (2 x nbytes per round trip) against hipcore's TCP
    RDMA read of nbytes by a proc on host 2 from one on host 1, in turns, each the median of its
    `reps` in a round; the ratio is the median of the rounds' ratios."""
    import torch

    from regent.wire import bulk_tcp

    with Session(f"scale-bulk-{uuid.uuid4().hex[:6]}", lease_ttl_s=LEASE_TTL_S) as s:
        hosts = s.host_mesh(hosts=2)
        owner = hosts.slice(hosts=0).spawn_procs(per_host={"procs": 1}).spawn("owner", Bulk)
        reader = hosts.slice(hosts=1).spawn_procs(per_host={"procs": 1}).spawn("reader", Bulk)
        x = torch.randn(nbytes // 4)
        served = bulk_tcp.served()
        if not torch.equal(owner.echo.call_one(x).get(timeout=120), x):
            raise RuntimeError("the 64 MiB echo between hosts came back different")
        out_of_band = bulk_tcp.served() > served  # not with REGENT_BULK_BYTES=0: through the CURVE socket
        buf = owner.buffer.call_one(nbytes).get(timeout=120)
        per: dict[str, list[float]] = {"echo": [], "rdma_read": []}
        for _ in range(rounds):
            times = []
            for _ in range(reps):
                with collected_heap():
                    t0 = time.perf_counter()
                    owner.echo.call_one(x).get(timeout=120)
                    times.append(time.perf_counter() - t0)
            per["echo"].append(2 * nbytes / statistics.median(times) / 1e6)
            reads = reader.read.call_one(buf, reps).get(timeout=300)
            per["rdma_read"].append(nbytes / statistics.median(reads) / 1e6)
    ratios = [e / r for e, r in zip(per["echo"], per["rdma_read"], strict=True)]
    return {"bytes": nbytes, "out_of_band": out_of_band, "echo_MB_per_s": round(statistics.median(per["echo"]), 1),
            "rdma_tcp_read_MB_per_s": round(statistics.median(per["rdma_read"]), 1),
            "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
            "echo_runs": [round(v, 1) for v in per["echo"]], "read_runs": [round(v, 1) for v in per["rdma_read"]],
            "definition": "echo MB/s = 2 x bytes / median round trip (controller -> proc on host 1 -> back); "
                          "read MB/s = bytes / median read_into(transport='tcp') by a proc on host 2 from "
                          "one on host 1; MB = 1e6 bytes; rounds alternate the two"}


def _stop_local_agent() -> None:
    """The root namespace's own agent (started for the same-host figure) is nobody's child."""
    from regent.worker.discovery import live_host_record

    info = live_host_record()
    if info is not None:
        os.kill(info["pid"], 15)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="PROCSxHOSTS,... (hosts at most 8)")
    p.add_argument("--calls", type=int, default=50, help="call() rounds per shape")
    p.add_argument("--broadcasts", type=int, default=500, help="broadcasts per repeat")
    p.add_argument("--repeats", type=int, default=5, help="broadcast phases per shape (the median is the figure)")
    p.add_argument("--growth-rounds", type=int, default=7, help="paired broadcast phases for the CPU growth figure")
    p.add_argument("--cross-rounds", type=int, default=5)
    p.add_argument("--cross-calls", type=int, default=1000)
    p.add_argument("--bulk-rounds", type=int, default=5, help="alternating echo / RDMA read rounds (64 MiB)")
    p.add_argument("--bulk-reps", type=int, default=5, help="echoes and reads per round (the median is its figure)")
    p.add_argument("--parts", default="shapes,growth,cross,bulk",
                   help="which to run: shapes, growth (CPU growth), cross (call_one across hosts), bulk (64 MiB)")
    p.add_argument("--peers", action="store_true",
                   help="also Monarch at the same proc counts on one host (the 'peers' extra: torchmonarch)")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] if "shapes" in parts else []

    def run() -> dict[str, Any]:
        report: dict[str, Any] = {"bench": "scale", "shapes": [f"{a}x{b}" for a, b in shapes],
                                  "machine": {"cpus": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}}
        reason = unavailable_reason()
        if reason:
            return {**report, "unavailable": reason}
        with private_regent_home(), tempfile.TemporaryDirectory() as work:
            cluster = MultiHost(Path(work), [f"h{i}" for i in range(1, HOSTS + 1)], [], cluster="scale", host_ttl_s=3.0)
            cluster.start()
            try:
                with cluster.controller_env():
                    report["shapes_measured"] = []
                    for procs, hosts in shapes:
                        note(f"{procs} procs over {hosts} hosts")
                        try:
                            report["shapes_measured"].append(
                                measure_shape(procs, hosts, args.calls, args.broadcasts, args.repeats))
                        except Exception as e:  # say where it stops (memory, time), go on with the rest
                            report["shapes_measured"].append({"procs": procs, "hosts": hosts, "error": f"{type(e).__name__}: {e}"[:500]})
                    report["cpu_growth"] = []
                    for hosts in (1, 4, 8) if "growth" in parts else ():
                        note(f"CPU per delivery, 64 procs against {max(4, hosts)}, over {hosts} hosts")
                        try:
                            report["cpu_growth"].append(cpu_growth(hosts, max(4, hosts), 64, args.broadcasts,
                                                                   args.growth_rounds))
                        except Exception as e:
                            report["cpu_growth"].append({"hosts": hosts, "error": f"{type(e).__name__}: {e}"[:500]})
                    if "cross" in parts:
                        report["cross_host"] = cross_host(args.cross_rounds, args.cross_calls)
                    if "bulk" in parts:
                        note("64 MiB echo between hosts against hipcore's TCP RDMA read")
                        report["bulk_xhost"] = bulk_xhost(args.bulk_rounds, args.bulk_reps)
            finally:
                cluster.close()
        if args.peers:
            counts = sorted({procs for procs, _ in shapes})
            note(f"Monarch: {counts} procs on one host")
            report["monarch"] = run_peer("monarch-scale", Sizes(scale_procs=tuple(counts), scale_calls=args.calls,
                                                                scale_broadcasts=args.broadcasts), timeout_s=900)
            report["vs_monarch"] = versus(report)
        report["targets"] = targets(report)
        return report

    def summary(report: dict[str, Any]) -> None:
        for m in report.get("shapes_measured", []):
            note(str(m))
        note_targets(report)

    run_and_report(run, summary, args.json_out)


def versus(report: dict[str, Any]) -> list[dict[str, Any]]:
    """regent on one namespace host against Monarch on this host, at each proc count."""
    theirs = {m["procs"]: m for m in report["monarch"].get("shapes_measured", [])}
    out = []
    for m in report.get("shapes_measured", []):
        t = theirs.get(m["procs"])
        if m.get("hosts") != 1 or t is None or "error" in m:
            continue
        out.append({"procs": m["procs"],
                    "spawn_s": [m["spawn_s"], t["spawn_s"]],
                    "call_all_p50_us": [m["call_all"]["p50"], t["call_all"]["p50"]],
                    "broadcast_deliveries_per_s": [m["broadcast_deliveries_per_s"], t["broadcast_deliveries_per_s"]],
                    "cpu_us_per_delivery": [m["cpu_us_per_delivery"], t["cpu_us_per_delivery"]],
                    "rss_mib_per_proc": [m["rss_mib_per_proc"], t["rss_mib_per_proc"]]})
    return out


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    by = {(m["procs"], m["hosts"]): m for m in report.get("shapes_measured", []) if "error" not in m}
    out: list[dict[str, Any]] = []

    def add(figure: str, value: float | None, op: str, bound: float) -> None:
        add_target(out, figure, value, op, bound)

    for g in report.get("cpu_growth", []):
        if "error" in g:
            continue
        add(f"cpu_per_delivery_{g['large']}_over_{g['small']}_procs_at_{g['hosts']}_hosts", g["ratio"], "<=", 1.5)
    if (64, 8) in by:
        add("spawn_64_procs_over_8_hosts_s", by[(64, 8)]["spawn_s"], "<=", 15.0)
    if "cross_host" in report:
        add("cross_host_call_one_p50_ratio", report["cross_host"]["ratio"], "<=", 1.2)
    if "bulk_xhost" in report:
        add("echo_64MiB_between_hosts_over_rdma_tcp_read", report["bulk_xhost"]["ratio"], ">=", 0.8)
    return out


if __name__ == "__main__":
    main()
