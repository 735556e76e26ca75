"""RDMA throughput: same-host read_into/write_from against a plain memcpy, and TCP loopback.

Prints one JSON object. Same-host figures use the shared-memory transport
(buffers from hipcore.shared_array); each size also times np.copyto of the same
size in this process, so the ratio says how close to memcpy a one-sided read is.

    .venv/bin/python bench/bench_rdma.py [--sizes-mib 1 64 1024] [--tcp-mib 64] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import platform
import statistics
import time
from typing import Any

import numpy as np

SAME_HOST_TARGET_GBPS = 5.0
TCP_TARGET_GBPS = 1.5
MONARCH_TCP_GBPS = 0.81


def _owner(sizes: list[int], plain_tcp: int, to_parent: Any, from_parent: Any) -> None:
    from regent.hipcore import rdma

    keep = []
    handles = {}
    for n in sizes:
        arr = rdma.shared_array(n)
        arr[:] = 1  # touch every page once, as a real owner's buffer would be
        keep.append(arr)
        handles[f"shm-{n}"] = rdma.RDMABuffer(arr)
    if plain_tcp:
        arr = np.ones(plain_tcp, dtype=np.uint8)
        keep.append(arr)
        handles["tcp"] = rdma.RDMABuffer(arr)
    to_parent.put(pickle.dumps(handles))
    from_parent.get()


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def _time(fn: Any, reps: int) -> float:
    fn()  # warm-up: maps segments, opens connections, faults pages in
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--tcp-mib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("REGENT_HIPCORE_RDMA_ADDR", "127.0.0.1")

    sizes = [m << 20 for m in args.sizes_mib]
    tcp_bytes = args.tcp_mib << 20
    ctx = multiprocessing.get_context("spawn")
    to_parent, from_parent = ctx.Queue(), ctx.Queue()
    owner = ctx.Process(target=_owner, args=(sizes, tcp_bytes, to_parent, from_parent))
    owner.start()
    try:
        handles = pickle.loads(to_parent.get(timeout=600))
        results: dict[str, Any] = {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "reps": args.reps,
            "statistic": "median",
            "same_host": [],
        }
        for n in sizes:
            buf = handles[f"shm-{n}"]
            dst = np.full(n, 2, dtype=np.uint8)
            src = np.full(n, 3, dtype=np.uint8)
            read_s = _time(lambda b=buf, d=dst: b.read_into(d, transport="shm").get(), args.reps)
            write_s = _time(lambda b=buf, s=src: b.write_from(s, transport="shm").get(), args.reps)
            memcpy_s = _time(lambda d=dst, s=src: np.copyto(d, s), args.reps)
            row = {
                "size_mib": n >> 20,
                "read_into_gbps": round(_gbps(n, read_s), 2),
                "write_from_gbps": round(_gbps(n, write_s), 2),
                "memcpy_gbps": round(_gbps(n, memcpy_s), 2),
                "read_vs_memcpy": round(memcpy_s / read_s, 3),
                "write_vs_memcpy": round(memcpy_s / write_s, 3),
            }
            if n >= 64 << 20:
                row["meets_target"] = min(row["read_into_gbps"], row["write_from_gbps"]) >= SAME_HOST_TARGET_GBPS
            results["same_host"].append(row)
            del dst, src
        if tcp_bytes:
            buf = handles["tcp"]
            dst = np.full(tcp_bytes, 2, dtype=np.uint8)
            src = np.full(tcp_bytes, 3, dtype=np.uint8)
            read_s = _time(lambda: buf.read_into(dst, transport="tcp").get(), args.reps)
            write_s = _time(lambda: buf.write_from(src, transport="tcp").get(), args.reps)
            results["tcp_loopback"] = {
                "size_mib": args.tcp_mib,
                "read_into_gbps": round(_gbps(tcp_bytes, read_s), 2),
                "write_from_gbps": round(_gbps(tcp_bytes, write_s), 2),
                "target_gbps": TCP_TARGET_GBPS,
                "monarch_0.7_tcp_gbps": MONARCH_TCP_GBPS,
                "meets_target": min(_gbps(tcp_bytes, read_s), _gbps(tcp_bytes, write_s)) >= TCP_TARGET_GBPS,
            }
        results["targets"] = {"same_host_gbps_at_64mib_and_above": SAME_HOST_TARGET_GBPS, "tcp_gbps": TCP_TARGET_GBPS}
        print(json.dumps(results, indent=2))
    finally:
        from_parent.put("stop")
        owner.join(60)
        if owner.is_alive():
            owner.kill()


if __name__ == "__main__":
    main()
