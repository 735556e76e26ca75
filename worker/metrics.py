"""Prometheus metrics: the `/metrics` endpoint a controller or a host agent serves, and what a
host agent reports (its procs, their memory and CPU, its backend and devices).

Off unless an address is given (`REGENT_METRICS_ADDR`, `Session(metrics=...)`, `regent host
--metrics`); a bare port binds loopback. Everything here reads at scrape time: serving metrics
adds no work to a call's path, and never writes the journal or messages a worker.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

import psutil
import structlog
from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from regent.hipcore.stats import read_counts

log = structlog.get_logger("regent.metrics")

METRICS_ENV = "REGENT_METRICS_ADDR"

# No `_created` series beside every counter and histogram: they double what a scrape carries
# and regent's dashboards do not use them.
disable_created_metrics()


def parse_address(text: str) -> tuple[str, int]:
    """`PORT`, `HOST:PORT` or `[V6]:PORT` as (host, port); a bare port is loopback's. Raises
    ValueError saying what is wrong."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics address {text!r}: give PORT or HOST:PORT (e.g. 127.0.0.1:9400; port 0 "
                         "takes a free one)")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"metrics address {text!r}: {host!r} is not a literal IP address") from None
    return host, int(port)


class MetricsServer:
    """`/metrics` of `registry` over HTTP at `address` (a thread of its own, stopped by close)."""

    def __init__(self, registry: CollectorRegistry, address: str):
        host, port = parse_address(address)
        server, thread = start_http_server(port, addr=host, registry=registry)
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        bound = server.server_address
        self.address = f"{host}:{bound[1]}"
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{bound[1]}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2.0)


def serve_metrics(registry: CollectorRegistry, address: str | None, what: str) -> MetricsServer | None:
    """Serve `registry` at `address` (None: $REGENT_METRICS_ADDR; unset or empty: off). A port
    that cannot be bound is logged and metrics stay off: observing never stops the job. A
    malformed address raises ValueError."""
    address = address if address is not None else os.environ.get(METRICS_ENV, "")
    if not address:
        return None
    parse_address(address)  # a malformed address is the caller's mistake: ValueError, said at once
    try:
        server = MetricsServer(registry, address)
    except OSError as e:
        log.error("metrics not served", what=what, address=address, error=str(e))
        return None
    log.info("serving metrics", what=what, url=server.url)
    return server


class ProcUsage:
    """RSS and CPU time of processes by pid, through psutil; a process handle is kept per pid
    so its CPU times are read cheaply, and forgotten once the pid is gone."""

    def __init__(self) -> None:
        self._handles: dict[int, psutil.Process] = {}

    def read(self, pids: Iterable[int]) -> dict[int, tuple[int, float]]:
        """pid -> (resident bytes, user+system CPU seconds), for the pids still running."""
        out: dict[int, tuple[int, float]] = {}
        keep: dict[int, psutil.Process] = {}
        for pid in pids:
            try:
                proc = self._handles.get(pid) or psutil.Process(pid)
                with proc.oneshot():
                    cpu = proc.cpu_times()
                    out[pid] = (proc.memory_info().rss, cpu.user + cpu.system)
                keep[pid] = proc
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self._handles = keep
        return out


class AgentCollector(Collector):
    """What a host agent reports, read from `snapshot()` at each scrape: a list of
    (session name, proc index, pid or None for a hollow proc) for its live procs. Labels
    are the session's name and the proc's index on this host, never a pid or call id."""

    def __init__(self, snapshot: Callable[[], list[tuple[str, int, int | None]]], info: Callable[[], dict]):
        self._snapshot = snapshot
        self._info = info
        self._usage = ProcUsage()

    def collect(self) -> Iterator[Any]:
        try:
            procs = self._snapshot()
        except RuntimeError:  # the agent's loop changed its tables under the snapshot: read again
            procs = self._snapshot()
        alive = GaugeMetricFamily("regent_agent_procs", "Live procs this host agent runs, by session",
                                  labels=["session"])
        counts: dict[str, int] = {}
        for session, _, _ in procs:
            counts[session] = counts.get(session, 0) + 1
        for session, n in sorted(counts.items()):
            alive.add_metric([session], n)
        yield alive
        usage = self._usage.read(pid for _, _, pid in procs if pid is not None)
        rss = GaugeMetricFamily("regent_proc_resident_memory_bytes", "Resident memory of each proc",
                                labels=["session", "index"])
        cpu = CounterMetricFamily("regent_proc_cpu_seconds", "User and system CPU time of each proc",
                                  labels=["session", "index"])
        for session, index, pid in procs:
            if pid in usage:
                mem, secs = usage[pid]
                rss.add_metric([session, str(index)], mem)
                cpu.add_metric([session, str(index)], secs)
        yield rss
        yield cpu
        moved = read_counts({pid for _, _, pid in procs if pid is not None})
        rdma = CounterMetricFamily("regent_rdma_bytes", "Bytes each proc moved through RDMA buffers, by "
                                   "direction (read: into the proc; write: out of it)",
                                   labels=["session", "index", "op"])
        transfers = CounterMetricFamily("regent_rdma_transfers", "RDMA reads and writes each proc made",
                                        labels=["session", "index", "op"])
        for session, index, pid in procs:
            if pid in moved:
                rb, wb, rn, wn = moved[pid]
                for op, nbytes, n in (("read", rb, rn), ("write", wb, wn)):
                    rdma.add_metric([session, str(index), op], nbytes)
                    transfers.add_metric([session, str(index), op], n)
        yield rdma
        yield transfers
        info = self._info()
        host = GaugeMetricFamily("regent_host_info", "This host agent: its id, backend (cuda, hip, cpu or "
                                 "hollow) and machine; always 1",
                                 labels=["host", "backend", "hostname"])
        host.add_metric([info["host"], info["backend"], info["hostname"]], 1)
        yield host
        devices = GaugeMetricFamily("regent_host_devices", "Accelerators of this host by backend and name",
                                    labels=["backend", "device"])
        for name, n in sorted(info["devices"].items()):
            devices.add_metric([info["backend"], name], n)
        yield devices


def host_description(hollow: bool) -> dict:
    """This host's backend and its devices by name, for `regent_host_info` and
    `regent_host_devices` (hipcore decides the backend; a hollow host has none)."""
    import socket

    if hollow:
        return {"backend": "hollow", "devices": {}, "hostname": socket.gethostname()}
    from regent.hipcore import backend
    from regent.hipcore.device import Device

    info = backend()
    devices: dict[str, int] = {}
    for i in range(info.device_count if info.is_gpu else 0):
        name = Device(i).name
        devices[name] = devices.get(name, 0) + 1
    return {"backend": info.name, "devices": devices, "hostname": socket.gethostname()}


def agent_registry(agent: Any, hollow: bool) -> CollectorRegistry:
    """The registry a host agent (worker.host.HostAgent) serves: its procs, read from its session
    tables at each scrape, its backend and devices (found on the first scrape: hipcore may
    import torch, which the agent itself never needs), and its own process's figures."""
    described: list[dict] = []

    def procs() -> list[tuple[str, int, int | None]]:
        out = []
        for sid, state in list(agent.sessions.items()):
            session = sid.rpartition(".")[0] or sid
            for p in list(state.procs.values()):
                if not p.exited:
                    out.append((session, p.index, None if hollow else p.pid))
        return out

    def info() -> dict:
        if not described:
            described.append(host_description(hollow))
        # A cluster agent's name in its cluster (what `regent hosts ls` shows), else its id.
        return {"host": os.environ.get("REGENT_HOST_NAME") or agent.host_id, **described[0]}

    registry = CollectorRegistry()
    registry.register(AgentCollector(procs, info))
    ProcessCollector(registry=registry)
    return registry
