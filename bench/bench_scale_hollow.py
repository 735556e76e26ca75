"""The controller at a thousand procs and beyond, on hollow hosts (issue #30). No root.

    .venv/bin/python bench/bench_scale_hollow.py [--sizes 64,256,1024] [--per-host 8]
        [--calibrate 64,128] [--json-out FILE]

Hollow hosts are `regent host --cluster C --hollow K` agents on loopback, registered in a
private etcd (--store sqlite: an SQLite file), which is the journal too: each serves its spawns with procs inside its own process (the real proc core,
actors and sockets, without a process, torch or GPU of their own), as kubemark's hollow nodes
run the real kubelet. The controller is this process. For each size (procs, PER_HOST per host)
one session measures: spawn time (procs, then one actor per proc), `call()` on every actor
(p50 over --calls rounds; and the hosts' CPU per call, summed over every agent and proc, with
the least time it takes this machine's cores: the p50 cannot be lower here, where the hosts
that stand for other machines share the controller's cores), broadcast deliveries/s and this process's CPU per delivery (median of
--repeats phases of --broadcasts broadcasts and one call), the controller's RSS (once spawned and
at the end), its CPU idle (cores, over IDLE_S with the mesh up and nothing called), and the journal
bytes of one mesh-wide `call()` (the store's log, before and after --calls calls), and the cyclic
collector's share of this process's CPU in the broadcast phases. Then, with --takeover N, SIGKILL
of a primary calling every actor of an N-proc mesh in a loop -> the first call() its standby
completes (bench/programs/failover_loop.py as both), --takeover-runs times, with the standby
linked to the workers while it waits or not (--standby-links on,off), over N / PER_HOST hosts
(agents the larger sizes started are stopped first).

Calibration, so the hollow figures mean something: at each --calibrate size the same loops run
on real procs (one `regent host --cluster` agent per host, procs as processes) and on hollow
ones, in one run; the controller's CPU per delivery of the two should lie within 1.3x.

Targets (printed, never asserted): CPU per delivery at the largest size within 1.5x that at
the smallest; call() p50 at 1,024 procs within 4x that at 64; broadcast deliveries/s at 1,024
at least 0.8x that at 64; 1,024 procs spawned in at most 20 s; controller RSS at 4,096 procs at
most 1 GiB; hollow and real CPU per delivery within 1.3x at each calibrated size; SIGKILL ->
first standby call at 1,024 procs within 2 s, p50.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import operator
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench_core import add_target, cpu_seconds, latency_stats, note, note_targets, run_and_report  # noqa: E402
from bench_failover import etcd_server, fast_election_etcd  # noqa: E402
from bench_scale import Noop, broadcast_phase  # noqa: E402

from regent.controller import Session  # noqa: E402
from regent.journal import open_journal  # noqa: E402
from regent.journal.hosts import registered_hosts  # noqa: E402
from regent.worker import Accumulator  # noqa: E402

# 128 real procs starting on 2 cores starve etcd past a 15 s lease: the bench measures the
# controller's costs, not a deposed controller. The hosts run at the lowest priority for the
# same reason: a hundred busy agents at nice 0 leave etcd a few percent of the CPU.
LEASE_TTL_S = 60.0
HOSTS_NICE = 19
# An agent renews its registration every third of its TTL, a few ms of CPU each (a gRPC
# stream): at 512 hollow agents on 2 cores that is the bench's, not the controller's, cost.
HOST_TTL_S = 60.0
IDLE_S = 5.0  # the idle controller's CPU is measured over this long


def low_autogroup(pid: int) -> None:
    """Give the session `pid` leads the lowest CPU weight where the kernel groups tasks by
    session (autogroup): otherwise its nice value counts only within the bench's own group, and
    hundreds of agent threads at nice 19 still outweigh etcd and the controller at nice 0 (etcd
    then times out while 4,096 procs start). The hosts stand for other machines' CPUs."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{HOSTS_NICE}\n")


class Hosts:
    """Cluster agents on loopback: `hollow` K > 0 makes hollow ones, started FLEET at a time
    by one `regent host --fleet` (each agent its own process, forked after the imports); real
    ones one process each, as on real machines."""

    FLEET = 32

    def __init__(self, work: Path, url: str, cluster: str, hollow: int) -> None:
        self.work, self.url, self.cluster, self.hollow = work, url, cluster, hollow
        self.agents: list[subprocess.Popen] = []  # a fleet's command (hollow) or an agent (real)
        self.sizes: list[int] = []  # agents each of those started
        self.count = 0

    def grow(self, count: int, timeout_s: float = 600.0) -> float:
        """Start agents until `count` are registered; the seconds it took."""
        t0 = time.perf_counter()
        while self.count < count:
            more = min(self.FLEET, count - self.count) if self.hollow else 1
            name = f"{'h' if self.hollow else 'r'}{len(self.agents):04d}"
            extra = ["--hollow", str(self.hollow), *(["--fleet", str(more)] if more > 1 else [])] if self.hollow else []
            self.agents.append(subprocess.Popen(
                ["nice", "-n", str(HOSTS_NICE), sys.executable, "-m", "regent.cli", "host", "--cluster", self.cluster,
                 "--store", self.url, "--advertise", "127.0.0.1", "--name", name, "--ttl", str(HOST_TTL_S), *extra],
                stdout=open(self.work / f"agent-{name}.log", "w"), stderr=subprocess.STDOUT, start_new_session=True))
            low_autogroup(self.agents[-1].pid)
            self.sizes.append(more)
            self.count += more
            if self.hollow:  # a fleet at a time
                self._registered(self.count, t0 + timeout_s - time.perf_counter())
        self._registered(count, t0 + timeout_s - time.perf_counter())
        return time.perf_counter() - t0

    def shrink(self, count: int, timeout_s: float = 120.0) -> None:
        """Stop the agents started last until `count` are left (as grown: whole fleets), and
        wait until only those are registered: a figure of N hosts is measured with N running."""
        while self.agents and self.count - self.sizes[-1] >= count:
            agent, size = self.agents.pop(), self.sizes.pop()
            agent.terminate()
            try:
                agent.wait(60)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
            self.count -= size
        self._registered(self.count, timeout_s, at_most=True)

    def _registered(self, count: int, timeout_s: float, at_most: bool = False) -> None:
        """Wait until `count` agents are registered (at least, or with `at_most` exactly): fleets
        start one after another, so the store is not asked to register hundreds at once on this
        machine's two cores."""
        j = open_journal(self.url)
        try:
            deadline = time.monotonic() + timeout_s
            while (n := len(registered_hosts(j.backend, self.cluster))) < count or (at_most and n > count):
                if time.monotonic() > deadline:
                    what = f"{n} agents of {self.cluster} registered, not {count}"
                    raise TimeoutError(f"{what} {'exactly' if at_most else 'at least'} in {timeout_s:.0f} s")
                time.sleep(0.5)
        finally:
            j.close()

    def _processes(self) -> Iterator[psutil.Process]:
        """Every agent process (a fleet's command and its agents) and every proc they started."""
        for a in self.agents:
            try:
                yield from [psutil.Process(a.pid), *psutil.Process(a.pid).children(recursive=True)]
            except psutil.Error:
                continue

    def memory_mib(self) -> dict[str, float]:
        """Every agent's and proc's memory: RSS summed (pages shared between them counted once
        per process) and PSS summed (each shared page split among its sharers: what they hold)."""
        rss = pss = 0
        for p in self._processes():
            with contextlib.suppress(psutil.Error):
                m = p.memory_full_info()
                rss, pss = rss + m.rss, pss + m.pss
        return {"hosts_rss_mib": round(rss / 2**20, 1), "hosts_pss_mib": round(pss / 2**20, 1)}

    def cpu_seconds(self) -> float:
        """Every agent's and proc's CPU time so far (user and system), summed."""
        total = 0.0
        for p in self._processes():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def close(self) -> None:
        for a in self.agents:
            a.terminate()
        for a in self.agents:
            try:
                a.wait(60)
            except subprocess.TimeoutExpired:
                a.kill()


class GcClock:
    """The CPU this process's cyclic collector takes (each collection timed on the thread that
    runs it, which holds the GIL meanwhile): its share of the controller's CPU per delivery."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started


GC_CLOCK = GcClock()


def journal_bytes(url: str, session: str) -> int:
    """What the session's log holds, in bytes, as the store keeps it."""
    j = open_journal(url)
    try:
        return sum(len(body) for _, body in j.backend.iter_batches(session))
    finally:
        j.close()


def accumulate_phase(s: Session, url: str, name: str, actors: Any, procs: int, rounds: int) -> dict[str, Any]:
    """An Accumulator's sum over every actor, folded in the controller and on the hosts, in turns:
    p50, the controller's CPU per accumulate and the journal's bytes per accumulate of each."""
    out: dict[str, Any] = {}
    for how, on_host in (("controller", False), ("on_host", True)):
        acc = Accumulator(actors.noop, 0, operator.add, on_host=on_host)
        s.now()
        before, lat, cpu0 = journal_bytes(url, name), [], cpu_seconds()
        for _ in range(rounds):
            t = time.perf_counter_ns()
            total = acc.accumulate(1).get(timeout=600)
            lat.append(time.perf_counter_ns() - t)
            if total != procs:
                raise AssertionError(f"accumulate folded {total}, not {procs}")
        cpu = (cpu_seconds() - cpu0) / rounds * 1e6
        s.now()
        out[how] = {"p50_ms": round(statistics.median(lat) / 1e6, 2), "cpu_us_per_accumulate": round(cpu),
                    "journal_bytes_per_accumulate": round((journal_bytes(url, name) - before) / rounds)}
    out["cpu_ratio_on_host"] = round(out["on_host"]["cpu_us_per_accumulate"]
                                     / out["controller"]["cpu_us_per_accumulate"], 3)
    return out


def measure(hosts: Hosts, procs: int, per_host: int, calls: int, broadcasts: int,
            repeats: int, route: str = "direct") -> dict[str, Any]:
    """One session's figures; `route`: "direct" (a message per proc from the controller) or
    "relay" (casts through the host agents, REGENT_RELAY=1)."""
    n_hosts = procs // per_host
    name = f"scale-{procs}-{uuid.uuid4().hex[:6]}"
    os.environ["REGENT_RELAY"] = "1" if route == "relay" else "0"
    with Session(name, journal=hosts.url, lease_ttl_s=LEASE_TTL_S) as s:
        t0 = time.perf_counter()
        mesh = s.host_mesh(hosts=n_hosts, cluster=hosts.cluster).spawn_procs(per_host={"procs": per_host})
        spawned_procs = time.perf_counter() - t0
        actors = mesh.spawn("n", Noop)
        spawn_s = time.perf_counter() - t0
        actors.noop.call().get(timeout=600)  # every link warm
        rss_spawned = psutil.Process().memory_info().rss / 2**20
        before = journal_bytes(hosts.url, name)
        lat = []
        hosts_cpu0, cpu0, received0 = hosts.cpu_seconds(), cpu_seconds(), s.runtime.answer_messages
        for i in range(calls):
            t = time.perf_counter_ns()
            actors.noop.call(i).get(timeout=600)
            lat.append(time.perf_counter_ns() - t)
        call_cpu = (cpu_seconds() - cpu0) / calls
        # Messages with answers the controller read per host per call(): gathered, one.
        per_host_call = (s.runtime.answer_messages - received0) / calls / n_hosts
        # The hosts stand for other machines' CPUs, here they share the controller's: a call()
        # cannot take less than their CPU over this machine's cores.
        hosts_call_cpu = (hosts.cpu_seconds() - hosts_cpu0) / calls
        s.now()  # what the calls journaled is durable, so counted below
        per_call = (journal_bytes(hosts.url, name) - before) / calls
        gc0, cpu0 = GC_CLOCK.seconds, cpu_seconds()
        rates, cpus = zip(*(broadcast_phase(actors, procs, broadcasts) for _ in range(repeats)), strict=True)
        gc_share = (GC_CLOCK.seconds - gc0) / max(cpu_seconds() - cpu0, 1e-9)
        folds = accumulate_phase(s, hosts.url, name, actors, procs, calls)
        rss = psutil.Process().memory_info().rss / 2**20
        # What the controller spends with nothing to do (its timer, hellos, watermarks, the
        # lease, the host watch): charged to every delivery of a slow phase.
        time.sleep(1.0)
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        time.sleep(IDLE_S)
        idle_cores = (cpu_seconds() - cpu0) / (time.perf_counter() - t0)
        return {"procs": procs, "hosts": n_hosts, "hollow": hosts.hollow > 0, "route": route,
                "spawn_procs_s": round(spawned_procs, 2), "spawn_s": round(spawn_s, 2),
                "call_all": latency_stats(lat), "call_all_cpu_ms": round(call_cpu * 1e3, 2),
                "call_all_cpu_us_per_proc": round(call_cpu * 1e6 / procs, 2),
                "call_all_hosts_cpu_ms": round(hosts_call_cpu * 1e3, 2),
                "call_all_answer_messages_per_host": round(per_host_call, 2),
                "call_all_hosts_bound_ms": round(hosts_call_cpu * 1e3 / (os.cpu_count() or 1), 2),
                "broadcast_deliveries_per_s": round(statistics.median(rates)),
                "cpu_us_per_delivery": round(statistics.median(cpus), 2),
                "cpu_us_per_delivery_runs": [round(c, 2) for c in cpus],
                "cpu_gc_share": round(gc_share, 3),  # of the broadcast phases' CPU, the cyclic collector's
                "controller_idle_cores": round(idle_cores, 4), "controller_rss_mib": round(rss, 1), "controller_rss_spawned_mib": round(rss_spawned, 1),
                "journal_bytes_per_call_all": round(per_call), "accumulate": folds,
                **hosts.memory_mib(),
                "resends": dict(s.runtime.resends)}  # calls sent again, by reason (controller/_links.py)


def takeover(hosts: Hosts, work: Path, procs: int, per_host: int, runs: int, ttl: float) -> dict[str, Any]:
    """SIGKILL of a primary calling every actor in a loop -> first call() its standby completes
    live (bench/programs/failover_loop.py as both), `runs` times."""
    from bench_failover import Programs, find_mark, program_env, wait_for

    programs = Programs(work)
    out: list[dict[str, float]] = []
    failed: list[str] = []
    try:
        for r in range(runs):
            session = f"takeover-{procs}-{r}-{uuid.uuid4().hex[:4]}"
            marks = work / f"{session}.marks"
            env = program_env(session, hosts.url, ttl, marks, BENCH_PACE_S="0.05", BENCH_LIVE_AFTER="3",
                              BENCH_CLUSTER=hosts.cluster, BENCH_HOSTS=str(procs // per_host),
                              BENCH_PER_HOST=str(per_host))
            logs = [work / f"{session}.{k}.log" for k in range(2)]
            started = [programs.start(env, log) for log in logs]
            try:
                first = wait_for(lambda m=marks: find_mark(m, "live", standby=False), 300, "no primary went live")
            except TimeoutError as e:  # e.g. the primary lost its short lease while 1,024 procs started
                for p in started:  # the one that took over ends the session, so its procs stop
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(120)
                programs.reap(started)
                failed.append(f"run {r}: {e}; see {logs[0].name}, {logs[1].name}")
                note(f"takeover {r}: void ({e})")
                continue
            primary = next(p for p in started if p.pid == first["pid"])
            standby = next(p for p in started if p is not primary)
            log = logs[started.index(standby)]
            wait_for(lambda g=log: "standing by" in g.read_text() or None, 120, "no standby")
            time.sleep(1.0)
            killed_at = time.time()
            os.kill(primary.pid, 9)
            live = wait_for(lambda m=marks, s=standby: find_mark(m, "live", s.pid), 300, "the standby never went live")
            lead = find_mark(marks, "lead", standby.pid)
            standby.wait(120)
            programs.reap(started)
            out.append({"total_s": round(live["at"] - killed_at, 3),
                        "lease_wait_s": round(lead["leader_at"] - killed_at, 3),
                        "takeover_s": round(live["at"] - lead["leader_at"], 3)})
            note(f"takeover {r}: {out[-1]}")
    finally:
        programs.close()
    return {"procs": procs, "hosts": procs // per_host, "lease_ttl_s": ttl, "runs": out, "void_runs": failed,
            "total_s_p50": round(statistics.median(o["total_s"] for o in out), 3) if out else None}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64,256,1024", help="proc counts, each a multiple of --per-host")
    p.add_argument("--per-host", type=int, default=8)
    p.add_argument("--calibrate", default="64,128", help="sizes measured on real procs too ('' for none)")
    p.add_argument("--calls", type=int, default=20, help="call() rounds per size")
    p.add_argument("--broadcasts", type=int, default=100, help="broadcasts per phase")
    p.add_argument("--repeats", type=int, default=3, help="broadcast phases per size (the median is the figure)")
    p.add_argument("--takeover", type=int, default=1024, help="procs of the takeover figure (0: none)")
    p.add_argument("--takeover-runs", type=int, default=5)
    p.add_argument("--takeover-ttl", type=float, default=1.0, help="the controllers' lease TTL there")
    p.add_argument("--standby-links", default="on",
                   help="on, off or on,off: whether the standby links to the workers while it waits "
                        "(REGENT_STANDBY_LINKS); off is reported as ROUTE_without_standby_links")
    p.add_argument("--store", choices=["etcd", "sqlite"], default="etcd",
                   help="the journal and host registry (etcd, as in production, when installed)")
    p.add_argument("--routes", default="direct,relay",
                   help="how casts reach procs, each measured at every size: direct, relay (through the agents)")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args(argv)
    routes = [r for r in args.routes.split(",") if r]
    if not routes or set(routes) - {"direct", "relay"}:
        p.error("--routes is a list of direct and relay")
    sizes = [int(x) for x in args.sizes.split(",") if x]
    calibrate = [int(x) for x in args.calibrate.split(",") if x]
    if any(n % args.per_host for n in sizes + calibrate):
        p.error(f"every size must be a multiple of --per-host {args.per_host}")

    def run() -> dict[str, Any]:
        report: dict[str, Any] = {"bench": "scale_hollow", "sizes": sizes, "per_host": args.per_host,
                                  "machine": {"cpus": os.cpu_count(),
                                              "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}}
        work = Path(tempfile.mkdtemp(prefix="regent-bench-hollow-"))
        home = work / "home"
        home.mkdir(mode=0o700)
        os.environ["REGENT_HOME"] = str(home)
        os.environ["REGENT_HIPCORE_BACKEND"] = "cpu"
        from regent.wire.security import init_keys

        init_keys()
        with contextlib.ExitStack() as stack:
            etcd = None if args.store == "sqlite" else stack.enter_context(etcd_server(fast_election_etcd))
            url = etcd.url if etcd is not None else f"sqlite://{work / 'journal.db'}"
            report["store"] = url.split(":", 1)[0]
            measure_all(report, work, url)
        report["targets"] = targets(report)
        return report

    def measure_all(report: dict[str, Any], work: Path, url: str) -> None:
        hollow = Hosts(work, url, "hollow", args.per_host)
        real = Hosts(work, url, "real", 0)
        try:
            report["calibration"] = []
            for n in calibrate:
                note(f"calibration: {n} procs, real and hollow")
                try:
                    real.grow(n // args.per_host)
                    hollow.grow(n // args.per_host)
                    pair = {kind: measure(h, n, args.per_host, args.calls, args.broadcasts, args.repeats)
                            for kind, h in (("real", real), ("hollow", hollow))}
                    pair["cpu_ratio_hollow_to_real"] = round(pair["hollow"]["cpu_us_per_delivery"]
                                                             / pair["real"]["cpu_us_per_delivery"], 3)
                    report["calibration"].append({"procs": n, **pair})
                    note(str(report["calibration"][-1]))
                except Exception as e:
                    report["calibration"].append({"procs": n, "error": f"{type(e).__name__}: {e}"[:500]})
            real.close()
            report["sizes_measured"] = []
            for n in sizes:
                note(f"{n} hollow procs over {n // args.per_host} hosts")
                for route in routes:
                    try:
                        start_s = hollow.grow(n // args.per_host)
                        m = measure(hollow, n, args.per_host, args.calls, args.broadcasts, args.repeats, route)
                        report["sizes_measured"].append({**m, "agents_started_s": round(start_s, 1)})
                    except Exception as e:  # say where it stops (memory, time), go on with the rest
                        report["sizes_measured"].append({"procs": n, "route": route,
                                                         "error": f"{type(e).__name__}: {e}"[:500]})
                    note(str(report["sizes_measured"][-1]))
            if args.takeover:
                note(f"takeover at {args.takeover} hollow procs")
                report["takeover"] = {}
                # The programs inherit the route and the standby's links from this environment.
                for route, links in itertools.product(routes, [m for m in args.standby_links.split(",") if m]):
                    os.environ["REGENT_RELAY"] = "1" if route == "relay" else "0"
                    os.environ["REGENT_STANDBY_LINKS"] = "0" if links == "off" else "1"
                    key = route if links != "off" else f"{route}_without_standby_links"
                    try:
                        hollow.grow(args.takeover // args.per_host)
                        hollow.shrink(args.takeover // args.per_host)  # the larger sizes' agents stop
                        report["takeover"][key] = takeover(hollow, work, args.takeover, args.per_host,
                                                           args.takeover_runs, args.takeover_ttl)
                    except Exception as e:
                        report["takeover"][key] = {"procs": args.takeover, "error": f"{type(e).__name__}: {e}"[:500]}
        finally:
            real.close()
            hollow.close()

    run_and_report(run, note_targets, args.json_out)


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(figure: str, value: float | None, op: str, bound: float) -> None:
        add_target(out, figure, value, op, bound)

    for c in report.get("calibration", []):
        if "error" in c:
            continue
        ratio = c["cpu_ratio_hollow_to_real"]
        add(f"cpu_per_delivery_hollow_over_real_at_{c['procs']}", ratio, "<=", 1.3)
        add(f"cpu_per_delivery_real_over_hollow_at_{c['procs']}", round(1 / ratio, 3), "<=", 1.3)
    measured = [m for m in report.get("sizes_measured", []) if "error" not in m]
    for route in dict.fromkeys(m.get("route", "direct") for m in measured):
        by = {m["procs"]: m for m in measured if m.get("route", "direct") == route}
        route_targets(by, route, add)
    for route, t in report.get("takeover", {}).items():
        if "total_s_p50" in t:
            add(f"{route}_sigkill_to_first_standby_call_{t['procs']}_procs_p50_s", t["total_s_p50"], "<=", 2.0)
    return out


def route_targets(by: dict[int, dict[str, Any]], route: str, add: Any) -> None:
    """The issue's targets over the sizes measured on one route."""
    if by:
        small, large = by[min(by)], by[max(by)]
        add(f"{route}_cpu_per_delivery_{large['procs']}_over_{small['procs']}",
            round(large["cpu_us_per_delivery"] / small["cpu_us_per_delivery"], 3), "<=", 1.5)
    if 64 in by and 1024 in by:
        add(f"{route}_call_all_p50_1024_over_64", round(by[1024]["call_all"]["p50"] / by[64]["call_all"]["p50"], 3),
            "<=", 4.0)
        add(f"{route}_broadcast_rate_1024_over_64", round(by[1024]["broadcast_deliveries_per_s"]
                                                          / by[64]["broadcast_deliveries_per_s"], 3), ">=", 0.8)
    if 1024 in by:
        add(f"{route}_spawn_1024_procs_s", by[1024]["spawn_procs_s"], "<=", 20.0)
    if 4096 in by:
        add(f"{route}_controller_rss_at_4096_mib", by[4096]["controller_rss_mib"], "<=", 1024.0)


if __name__ == "__main__":
    main()
