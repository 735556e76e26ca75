"""Core runtime benchmark (issue #2): call latency, pipelined and broadcast throughput and
tensor echo bandwidth of regent, next to the bare pyzmq floor measured in the same run.

    .venv/bin/python bench/bench_core.py [--quick] [--peers] [--json-out FILE]

One JSON object goes to stdout, human notes to stderr. It prints figures and the issue's
targets beside them; it asserts nothing (tests assert behaviour, not speed). `--peers`
runs the same workloads on Ray and Monarch (bench/_peers.py), each in its own process.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import pickle
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from regent.worker import Actor, endpoint

HERE = Path(__file__).resolve().parent
MIB = 1 << 20

# The issue's targets: (figure, comparison, bound). Each is checked on the figure named
# in the JSON, so a reader can find it.
TARGETS: list[tuple[str, str, float]] = [
    ("call_one_us.p50", "<=", 150.0),
    ("call_one_us.p99", "<=", 400.0),
    ("pipelined_calls_per_s.median", ">=", 25_000.0),
    ("broadcast_deliveries_per_s.median", ">=", 60_000.0),
]


@dataclass(frozen=True)
class Sizes:
    """How much of each workload to run; the same sizes drive regent and its peers."""

    warmup: int = 200
    round_trips: int = 2_000
    pipelined: int = 10_000
    broadcasts: int = 10_000
    repeats: int = 3  # throughput workloads run this many times; the median is the figure
    echo_small_iters: int = 20
    echo_large_iters: int = 5
    mesh_size: int = 4
    # bench_scale.py's Monarch figures: proc counts, call() rounds and broadcasts per count
    scale_procs: tuple[int, ...] = (4, 16, 64)
    scale_calls: int = 50
    scale_broadcasts: int = 200

    @staticmethod
    def quick() -> Sizes:
        return Sizes(
            warmup=50,
            round_trips=500,
            pipelined=2_000,
            broadcasts=2_000,
            repeats=1,
            echo_small_iters=5,
            echo_large_iters=2,
        )


ECHO_SIZES = {"1MiB": 1 * MIB, "64MiB": 64 * MIB}


def cpu_seconds() -> float:
    """CPU time this process has used, user and system, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_target(out: list[dict[str, Any]], figure: str, value: float | None, op: str, bound: float) -> None:
    """Append a figure beside its target ("<=" or ">=" `bound`); printed, never asserted."""
    met = value is not None and (value <= bound if op == "<=" else value >= bound)
    out.append({"figure": figure, "value": value, "op": op, "bound": bound, "met": met})


def note_targets(report: dict[str, Any]) -> None:
    for t in report.get("targets", []):
        note(f"{t['figure']}: {t['value']} (target {t['op']} {t['bound']}: {'met' if t['met'] else 'NOT met'})")


# --- the workloads, written once against a Target ------------------------------------------


@dataclass
class Target:
    """A runtime under test, as plain callables, so every runtime runs the same loops.

    issue() starts a no-op call on one actor and returns a handle; wait(handle) blocks for
    its result; wait_all(handles) for many, the runtime's idiomatic way; broadcast() sends
    a fire-and-forget no-op to every actor of the mesh; barrier() calls every actor and
    waits, which under per-sender FIFO means every earlier broadcast was delivered;
    echo(x) sends x to one actor and returns what the actor returned. pid: the process
    that serves the calls, where there is one, for reading its CPU.
    """

    issue: Callable[[], Any]
    wait: Callable[[Any], Any]
    wait_all: Callable[[list], Any]
    broadcast: Callable[[], None]
    barrier: Callable[[], Any]
    echo: Callable[[Any], Any]
    pid: int | None = None


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of the population `values` were drawn
    from: the order statistics (k, n+1-k) with the largest k that still covers the median
    with at least `confidence` (the binomial sign-test interval). None when too few values
    allow one (fewer than 6 for 95%)."""
    xs = sorted(values)
    n = len(xs)
    k = 0  # the largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2, if any
    below = 0.0
    for j in range(n // 2 + 1):
        below += math.comb(n, j) / 2**n  # P(B <= j)
        if below > (1 - confidence) / 2:
            break
        k = j + 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def latency_stats(samples_ns: list[int]) -> dict[str, float]:
    us = sorted(s / 1_000 for s in samples_ns)
    return {
        "p50": round(_percentile(us, 50), 1),
        "p99": round(_percentile(us, 99), 1),
        "mean": round(statistics.fmean(us), 1),
        "min": round(us[0], 1),
        "max": round(us[-1], 1),
        "n": len(us),
    }


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation), the usual definition for latencies."""
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[int(rank) - 1]


def rate_stats(rates: list[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(rates)),
        "best": round(max(rates)),
        "runs": [round(r) for r in rates],
    }


@contextmanager
def collected_heap() -> Iterator[None]:
    """Start each timed loop from a collected heap, so one loop does not pay for the last."""
    gc.collect()
    yield


def run_round_trips(t: Target, sizes: Sizes) -> dict[str, float]:
    issue, wait, clock = t.issue, t.wait, time.perf_counter_ns
    for _ in range(sizes.warmup):
        wait(issue())
    samples = []
    with collected_heap():
        for _ in range(sizes.round_trips):
            t0 = clock()
            wait(issue())
            samples.append(clock() - t0)
    return latency_stats(samples)


def run_pipelined(t: Target, sizes: Sizes) -> dict[str, Any]:
    rates = []
    for _ in range(sizes.repeats):
        with collected_heap():
            t0 = time.perf_counter()
            handles = [t.issue() for _ in range(sizes.pipelined)]
            t.wait_all(handles)
            rates.append(sizes.pipelined / (time.perf_counter() - t0))
        del handles
    return rate_stats(rates)


def run_broadcasts(t: Target, sizes: Sizes) -> dict[str, Any]:
    rates = []
    for _ in range(sizes.repeats):
        with collected_heap():
            t0 = time.perf_counter()
            for _ in range(sizes.broadcasts):
                t.broadcast()
            t.barrier()
            rates.append(sizes.broadcasts * sizes.mesh_size / (time.perf_counter() - t0))
    return rate_stats(rates)


def memcpy_rate(x: Any, repeats: int = 9) -> float:
    """This machine's copy of `x`'s bytes, MB/s: the floor a local data path is read against."""
    import torch

    dst = torch.empty_like(x)
    dst.copy_(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(x)
        times.append(time.perf_counter() - t0)
    return round(x.numel() * x.element_size() / statistics.median(times) / 1e6, 1)


def run_echo(t: Target, sizes: Sizes) -> dict[str, Any]:
    """MB/s = 2 x tensor bytes / round-trip time (argument out plus result back), MB = 1e6 B."""
    import torch

    out: dict[str, Any] = {}
    for label, nbytes in ECHO_SIZES.items():
        x = torch.randn(nbytes // 4)  # float32
        iters = sizes.echo_small_iters if nbytes <= MIB else sizes.echo_large_iters
        got = t.echo(x)  # warm-up, and proof that the bytes came back intact
        if not (isinstance(got, torch.Tensor) and torch.equal(got, x)):
            raise RuntimeError(
                f"echo of a {label} tensor came back different: {type(got).__name__}"
            )
        del got
        times = []
        for _ in range(iters):
            with collected_heap():
                t0 = time.perf_counter()
                t.echo(x)
                times.append(time.perf_counter() - t0)
        mid = statistics.median(times)
        out[label] = {
            "MB_per_s": round(2 * nbytes / mid / 1e6, 1),
            "median_ms": round(mid * 1e3, 2),
            "best_ms": round(min(times) * 1e3, 2),
            "iters": iters,
            "memcpy_MB_per_s": memcpy_rate(x),
        }
        out[label]["over_memcpy"] = round(out[label]["MB_per_s"] / out[label]["memcpy_MB_per_s"], 3)
    out["definition"] = (
        "MB/s = 2 x tensor bytes (argument + returned value) / median round trip; MB = 1e6 bytes; "
        "memcpy: the tensor's bytes / median time of one copy into a tensor allocated and touched before"
    )
    return out


def run_workloads(t: Target, sizes: Sizes) -> dict[str, Any]:
    """The four workloads of issue #2, in a fixed order, with progress on stderr."""
    res: dict[str, Any] = {}
    res["call_one_us"] = run_round_trips(t, sizes)
    note(f"  call_one round trip: {res['call_one_us']}")
    res["pipelined_calls_per_s"] = run_pipelined(t, sizes)
    note(f"  pipelined calls/s: {res['pipelined_calls_per_s']}")
    res["broadcast_deliveries_per_s"] = run_broadcasts(t, sizes)
    note(f"  broadcast deliveries/s: {res['broadcast_deliveries_per_s']}")
    res["tensor_echo"] = run_echo(t, sizes)
    note(f"  tensor echo: { {k: v for k, v in res['tensor_echo'].items() if k != 'definition'} }")
    return res


# --- the floor: bare pyzmq DEALER -> ROUTER between two processes, with pickle --------------


def floor_server() -> None:
    """Echo server for the floor: ROUTER, unpickle the request, pickle a reply."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.sndhwm = sock.rcvhwm = 0  # unbounded: a ROUTER drops at the high-water mark
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(port, flush=True)
    while True:
        ident, body = sock.recv_multipart()
        request = pickle.loads(body)
        if request is None:
            break
        sock.send_multipart([ident, pickle.dumps(("ok", request[1], None), protocol=5)])
    sock.close(linger=0)
    ctx.term()


@contextmanager
def floor_target() -> Iterator[Target]:
    """The floor as a Target: a DEALER here, the echo server (floor_server) in a process of
    its own, for as long as the block runs. Only issue and wait do anything."""
    import zmq

    server = subprocess.Popen(
        [sys.executable, __file__, "--floor-server"], stdout=subprocess.PIPE, text=True
    )
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        sock.sndhwm = sock.rcvhwm = 0
        sock.connect(f"tcp://127.0.0.1:{port}")
        seq = iter(range(1 << 62))

        def issue() -> None:
            sock.send(pickle.dumps(("noop", next(seq), (), {}), protocol=5))

        def wait(_: Any) -> Any:
            return pickle.loads(sock.recv())

        yield Target(
            issue=issue,
            wait=wait,
            wait_all=lambda hs: [wait(h) for h in hs],
            broadcast=lambda: None,
            barrier=lambda: None,
            echo=lambda x: x,
            pid=server.pid,
        )
        sock.send(pickle.dumps(None))
        server.wait(timeout=10)
    finally:
        sock.close(linger=0)
        ctx.term()
        if server.poll() is None:
            server.kill()
            server.wait()


FLOOR_WHAT = ("pyzmq DEALER->ROUTER round trip between two Python processes over TCP loopback, "
              "pickle on both sides, no auth")


def run_floor(sizes: Sizes) -> dict[str, Any]:
    with floor_target() as t:
        rt = run_round_trips(t, sizes)
        pipelined = run_pipelined(t, sizes)
    note(f"  round trip us {rt}, pipelined msgs/s {pipelined}")
    return {
        "what": FLOOR_WHAT,
        "round_trip_us": rt,
        "pipelined_msgs_per_s": pipelined,
    }


# --- regent ----------------------------------------------------------------------------------


class Noop(Actor):
    @endpoint
    def noop(self) -> None:
        return None

    @endpoint
    def echo(self, x: Any) -> Any:
        return x


@contextmanager
def private_regent_home() -> Iterator[Path]:
    """A REGENT_HOME of our own: its own host agent, stopped (SIGTERM) and removed at the end."""
    home = Path(tempfile.mkdtemp(prefix="regent-bench-"))
    saved = {k: os.environ.get(k) for k in ("REGENT_HOME", "REGENT_HOST_IDLE_EXIT_S")}
    os.environ["REGENT_HOME"] = str(home)
    os.environ["REGENT_HOST_IDLE_EXIT_S"] = "30"  # a crashed bench still leaves nothing behind
    try:
        yield home
    finally:
        _stop_host_agent(home)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(home, ignore_errors=True)


def _stop_host_agent(home: Path) -> None:
    try:
        pid = int(json.loads((home / "host.json").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    note(f"host agent pid {pid} still running 10 s after SIGTERM (REGENT_HOME={home})")


def run_regent(sizes: Sizes, journal: str | None) -> dict[str, Any]:
    from regent.controller import Session

    with private_regent_home():
        t0 = time.perf_counter()
        with Session("bench", journal=journal) as s:
            t1 = time.perf_counter()
            host = s.this_host()  # starts this REGENT_HOME's host agent
            t2 = time.perf_counter()
            procs = host.spawn_procs(per_host={"procs": sizes.mesh_size})
            t3 = time.perf_counter()
            mesh = procs.spawn("noop", Noop)
            t4 = time.perf_counter()
            one = mesh.slice(procs=0)
            target = Target(
                issue=one.noop.call_one,
                wait=lambda f: f.get(),
                wait_all=lambda fs: [f.get() for f in fs],
                broadcast=mesh.noop.broadcast,
                barrier=lambda: mesh.noop.call().get(),
                echo=lambda x: one.echo.call_one(x).get(),
            )
            res: dict[str, Any] = {
                "journal": getattr(s, "journal_url", journal),
                "setup_s": {
                    "session": round(t1 - t0, 3),
                    "host_agent": round(t2 - t1, 3),
                    "spawn_procs": round(t3 - t2, 3),
                    "spawn_actors": round(t4 - t3, 3),
                },
            }
            note(f"  journal {res['journal']}, setup {res['setup_s']}")
            res.update(run_workloads(target, sizes))
            return res


# --- peers (Ray, Monarch), each in a process of its own -------------------------------------


def run_peer(name: str, sizes: Sizes, timeout_s: float) -> dict[str, Any]:
    """Run bench/_peers.py for one peer; any failure becomes {"unavailable": reason}."""
    cmd = [sys.executable, str(HERE / "_peers.py"), name, "--sizes", json.dumps(asdict(sizes))]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group of our own peer process: its workers too
        proc.communicate()
        return {"unavailable": f"{name} did not finish within {timeout_s:.0f} s"}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the peer left behind in its group
        except ProcessLookupError:
            pass
    for line in err.splitlines():
        if line.startswith("  "):
            note(f"  [{name}]{line}")
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " | ".join(err.strip().splitlines()[-3:])
        return {"unavailable": f"{name} bench exited with status {proc.returncode}: {tail[-500:]}"}


def _figure(res: dict[str, Any], path: str) -> float | None:
    cur: Any = res
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur if isinstance(cur, int | float) else None


RATIO_FIGURES = [
    "call_one_us.p50",
    "call_one_us.p99",
    "call_one_us.mean",
    "pipelined_calls_per_s.median",
    "broadcast_deliveries_per_s.median",
    "tensor_echo.1MiB.MB_per_s",
    "tensor_echo.64MiB.MB_per_s",
]


def ratios(regent: dict[str, Any], other: dict[str, Any]) -> dict[str, float]:
    out = {}
    for path in RATIO_FIGURES:
        a, b = _figure(regent, path), _figure(other, path)
        if a is not None and b:
            out[path] = round(a / b, 3)
    return out


def check_targets(regent: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for path, op, bound in TARGETS:
        value = _figure(regent, path)
        met = value is not None and (value <= bound if op == "<=" else value >= bound)
        rows.append({"figure": path, "target": f"{op} {bound:g}", "value": value, "met": met})
    return rows


def machine() -> dict[str, Any]:
    import torch
    import zmq

    return {
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "torch": torch.__version__,
    }


def summary(report: dict[str, Any]) -> None:
    note("")
    for when, f in report["floor"].items():
        note(
            f"floor ({when:<6}) zmq round trip p50 {f['round_trip_us']['p50']} us, "
            f"pipelined {f['pipelined_msgs_per_s']['median']} msgs/s"
        )
    for row in report["targets"]:
        mark = "ok  " if row["met"] else "MISS"
        note(f"{mark}  {row['figure']:<36} {row['value']!s:>10}   target {row['target']}")
    for figure, ratio in report["regent_vs_floor"].items():
        note(f"      regent/floor {figure:<29} {ratio}")
    peers = report.get("peers", {})
    for name, r in peers.get("ratios", {}).items():
        note(f"regent/{name}: " + ", ".join(f"{k} {v}" for k, v in r.items()))
    for name in ("ray", "monarch"):
        if "unavailable" in peers.get(name, {}):
            note(f"{name}: unavailable: {peers[name]['unavailable']}")


def vs_floor(regent: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    """Regent over the cleaner of the two floor runs (lower latency, higher rate)."""
    rt = min(f["round_trip_us"]["p50"] for f in floor.values())
    rate = max(f["pipelined_msgs_per_s"]["median"] for f in floor.values())
    return {
        "call_one_p50 / floor rt_p50": round(regent["call_one_us"]["p50"] / rt, 2),
        "pipelined calls / floor msgs": round(regent["pipelined_calls_per_s"]["median"] / rate, 3),
    }


def bench(
    quick: bool, with_peers: bool, peer_timeout: float, journal: str | None
) -> dict[str, Any]:
    sizes = Sizes.quick() if quick else Sizes()
    started = time.perf_counter()
    report: dict[str, Any] = {
        "bench": "core",
        "quick": quick,
        "machine": machine(),
        "sizes": asdict(sizes),
    }
    floor = report["floor"] = {}
    note("floor: bare pyzmq, before regent")
    floor["before"] = run_floor(sizes)
    note(f"regent: {sizes.mesh_size} procs on this host")
    regent = report["regent"] = run_regent(sizes, journal)
    note("floor: bare pyzmq, after regent")
    floor["after"] = run_floor(sizes)
    report["targets"] = check_targets(regent)
    report["regent_vs_floor"] = vs_floor(regent, floor)
    if with_peers:
        peers: dict[str, Any] = {}
        for name in ("ray", "monarch"):
            note(f"{name}: same workloads, in a process of its own")
            peers[name] = run_peer(name, sizes, peer_timeout)
        peers["ratios"] = {n: ratios(regent, r) for n, r in peers.items() if "unavailable" not in r}
        peers["ratios_read_as"] = (
            "regent / peer: below 1 is better for latencies (us), "
            "above 1 is better for throughputs (per s, MB/s)"
        )
        report["peers"] = peers
    report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["wall_s"] = round(time.perf_counter() - started, 1)
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run, ~15 s)")
    p.add_argument("--peers", action="store_true", help="also run the workloads on Ray and Monarch")
    p.add_argument("--peer-timeout", type=float, default=300.0, help="seconds allowed per peer run")
    p.add_argument(
        "--journal",
        default=None,
        help="journal URL for the regent session (etcd://..., sqlite:///...); "
        "default: the embedded SQLite store in a temporary REGENT_HOME",
    )
    p.add_argument("--json-out", type=Path, help="also write the JSON report to this file")
    p.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.floor_server:
        floor_server()
        return
    run_and_report(lambda: bench(a.quick, a.peers, a.peer_timeout, a.journal), summary, a.json_out)


def run_and_report(run: Callable[[], dict], summary: Callable[[dict], None], json_out: Path | None) -> None:
    """Run a bench with fd 1 pointed at stderr, then print its JSON (and write json_out).

    stdout carries the JSON and nothing else: whatever the runtime, a library or a child
    process writes to fd 1 during the run lands on stderr instead.
    """
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        report = run()
    finally:
        sys.stdout.flush()
        os.dup2(json_fd, 1)
        os.close(json_fd)
    summary(report)
    text = json.dumps(report)
    if json_out:
        json_out.write_text(text + "\n")
    print(text, flush=True)


if __name__ == "__main__":
    main()
