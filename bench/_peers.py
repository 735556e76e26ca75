"""The core workloads on regent's peers, Ray and Monarch, for `bench_core.py --peers`.

    .venv/bin/python bench/_peers.py {ray,monarch} [--sizes JSON]

Each peer runs in a process of its own (bench_core starts one per peer), so a peer that
hangs or crashes costs only its own figures. Prints one JSON object on stdout: the
figures, or {"unavailable": reason} when the peer cannot be imported or started here.
The loops are bench_core's, so every runtime runs exactly the same workloads.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench_core import Sizes, Target, cpu_seconds, latency_stats, note, run_workloads

PACKAGES = {"ray": "ray", "monarch": "torchmonarch", "monarch-scale": "torchmonarch"}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def run_ray(sizes: Sizes) -> dict[str, Any]:
    import ray

    @ray.remote
    class Noop:
        def noop(self) -> None:
            return None

        def echo(self, x: Any) -> Any:
            return x

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=1 << 30)
    try:
        t1 = time.perf_counter()
        # num_cpus=0: four actors on a two-CPU node, as regent runs four procs here.
        actors = [Noop.options(num_cpus=0).remote() for _ in range(sizes.mesh_size)]
        ray.get([a.noop.remote() for a in actors])
        t2 = time.perf_counter()
        one = actors[0]

        def broadcast() -> None:
            for a in actors:
                a.noop.remote()  # the ref is dropped: fire and forget

        target = Target(
            issue=one.noop.remote,
            wait=ray.get,
            wait_all=ray.get,  # Ray's own way to wait for many refs
            broadcast=broadcast,
            # Ray runs one caller's calls to a (sync) actor in submission order.
            barrier=lambda: ray.get([a.noop.remote() for a in actors]),
            echo=lambda x: ray.get(one.echo.remote(x)),
        )
        res: dict[str, Any] = {
            "setup_s": {"init": round(t1 - t0, 3), "spawn_actors": round(t2 - t1, 3)}
        }
        res.update(run_workloads(target, sizes))
        return res
    finally:
        ray.shutdown()


def run_monarch(sizes: Sizes) -> dict[str, Any]:
    from monarch.actor import Actor, endpoint, shutdown_context, this_host

    class Noop(Actor):
        @endpoint
        def noop(self) -> None:
            return None

        @endpoint
        def echo(self, x: Any) -> Any:
            return x

    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": sizes.mesh_size})
    try:
        t1 = time.perf_counter()
        mesh = procs.spawn("noop", Noop)
        mesh.noop.call().get()
        t2 = time.perf_counter()
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
            "setup_s": {"spawn_procs": round(t1 - t0, 3), "spawn_actors": round(t2 - t1, 3)}
        }
        res.update(run_workloads(target, sizes))
        return res
    finally:
        procs.stop().get()
        shutdown_context().get()


def run_monarch_scale(sizes: Sizes) -> dict[str, Any]:
    """bench_scale's per-shape figures on Monarch, on this one host: for each proc count in
    sizes.scale_procs, spawn time, call() p50, broadcast deliveries/s, this process's CPU per
    delivery and RSS per proc."""
    import statistics

    import psutil
    from monarch.actor import Actor, endpoint, shutdown_context, this_host

    class Noop(Actor):
        @endpoint
        def noop(self, i: int = 0) -> int:
            return i

        @endpoint
        def pid(self) -> int:
            return os.getpid()

    shapes = []
    try:
        for n in sizes.scale_procs:
            t0 = time.perf_counter()
            procs = this_host().spawn_procs(per_host={"procs": n})
            mesh = procs.spawn("noop", Noop)
            mesh.noop.call().get()
            spawn_s = time.perf_counter() - t0
            lat = []
            for i in range(sizes.scale_calls):
                t = time.perf_counter_ns()
                mesh.noop.call(i).get()
                lat.append(time.perf_counter_ns() - t)
            c0, t1 = cpu_seconds(), time.perf_counter()
            for i in range(sizes.scale_broadcasts):
                mesh.noop.broadcast(i)
            mesh.noop.call().get()
            wall, used = time.perf_counter() - t1, cpu_seconds() - c0
            deliveries = (sizes.scale_broadcasts + 1) * n
            rss = [psutil.Process(p).memory_info().rss for _, p in mesh.pid.call().get().items()]
            shapes.append({"procs": n, "hosts": 1, "spawn_s": round(spawn_s, 2), "call_all": latency_stats(lat),
                           "broadcast_deliveries_per_s": round(deliveries / wall),
                           "cpu_us_per_delivery": round(used / deliveries * 1e6, 1),
                           "rss_mib_per_proc": round(statistics.fmean(rss) / 2**20, 1)})
            procs.stop().get()
    finally:
        shutdown_context().get()
    return {"shapes_measured": shapes}


RUNNERS: dict[str, Callable[[Sizes], dict[str, Any]]] = {"ray": run_ray, "monarch": run_monarch,
                                                        "monarch-scale": run_monarch_scale}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="regent's core workloads on a peer runtime")
    p.add_argument("peer", choices=sorted(RUNNERS))
    p.add_argument("--sizes", default="{}", help="bench_core.Sizes fields as JSON")
    a = p.parse_args(argv)
    sizes = Sizes(**json.loads(a.sizes))
    package = PACKAGES[a.peer]
    # Only the JSON goes to stdout; the peer's own chatter goes to stderr.
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        result = {"version": _version(package), **RUNNERS[a.peer](sizes)}
    except ImportError as e:
        result = {
            "unavailable": f"{a.peer} is not importable ({e}); install the 'peers' extra: "
            f"pip install -e '.[peers]'"
        }
    except Exception as e:  # noqa: BLE001 - any failure to start or run is reported, not raised
        note(traceback.format_exc())
        result = {
            "unavailable": f"{a.peer} {_version(package)} failed here: {type(e).__name__}: {e}"[
                :1000
            ]
        }
    sys.stdout.flush()
    with os.fdopen(json_fd, "w") as out:
        out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
