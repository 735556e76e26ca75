"""`regent host --cluster`: a host agent that joins a cluster through the store, and
`regent hosts ls`, what the store says of a cluster's hosts.

The agent itself is worker.host's; what this adds is its registration (journal.hosts): a
record under a lease it keeps alive, joined again as a new incarnation after an outage.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import sys
import time

from regent.journal.hosts import (
    DEFAULT_HOST_TTL_S,
    HostMembership,
    HostNameInUse,
    HostRecord,
    check_name,
    registered_hosts,
)

AUTO = "auto"


def _literal_ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a literal IP address: advertise the address peers reach this node at "
            "(e.g. `--advertise $(hostname -I | cut -d' ' -f1)`), not a name that may resolve "
            "differently on other nodes") from None


def _cluster_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="regent host", description="Run this machine's host agent; with --cluster it joins that "
        "cluster through the store, so controllers anywhere find it with s.host_mesh(hosts=N).")
    p.add_argument("--cluster", required=True, type=lambda v: check_name(v, "cluster name"),
                   help="the cluster to join (controllers name it, or read $REGENT_CLUSTER)")
    p.add_argument("--store", default=os.environ.get("REGENT_JOURNAL"),
                   help="the store hosts register in: etcd://a:2379[,b:2379...] or sqlite:///path "
                        "(default $REGENT_JOURNAL)")
    p.add_argument("--advertise", required=True, type=lambda v: v if v == AUTO else _literal_ip(v),
                   help="this node's literal IP address, as the controller and the other hosts reach it; "
                        "'auto': the address this node reaches the store from (launchers use it)")
    p.add_argument("--bind", default=None, type=_literal_ip,
                   help="the address to listen on (default: --advertise; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=0, help="the agent's port (default: any free one)")
    p.add_argument("--name", default=None, type=lambda v: check_name(v, "host name"),
                   help="this host's name in the cluster, unique there (default: the hostname)")
    p.add_argument("--ttl", type=float, default=float(os.environ.get("REGENT_HOST_TTL_S", DEFAULT_HOST_TTL_S)),
                   help=f"lease TTL in seconds: a host silent this long is dead (default {DEFAULT_HOST_TTL_S:g})")
    p.add_argument("--hollow", type=int, default=0, metavar="K",
                   help="serve spawns with at most K hollow procs inside this agent (real proc logic, no "
                        "process, torch or GPU of their own): to measure a controller at scale")
    p.add_argument("--fleet", type=int, default=0, metavar="M",
                   help="with --hollow: start M hollow agents named NAME-0 .. NAME-(M-1), each its own "
                        "process forked from this one (sharing its imported code); stopping this "
                        "command stops them all")
    p.add_argument("--metrics", default=None, metavar="ADDR",
                   help="serve Prometheus /metrics at PORT (loopback) or HOST:PORT (default: off)")
    p.add_argument("--daemonize", action="store_true", help="fork into the background and return at once")
    p.add_argument("--log", default=None, help="log file (with --daemonize)")
    return p


def cluster_agent(argv: list[str]) -> int:
    from regent.journal import open_journal
    from regent.wire.security import is_loopback, load_credentials, regent_home
    from regent.worker import discovery
    from regent.worker.host import daemonize, serve_agent

    a = _cluster_parser().parse_args(argv)
    if not a.store:
        print("regent host: --cluster needs a store: --store etcd://HOST:2379 (or set REGENT_JOURNAL)",
              file=sys.stderr)
        return 2
    if not 0.5 <= a.ttl <= 60:
        print(f"regent host: --ttl {a.ttl:g} must lie between 0.5 and 60 seconds", file=sys.stderr)
        return 2
    if a.metrics is not None:
        from regent.worker.metrics import parse_address

        try:
            parse_address(a.metrics)
        except ValueError as e:
            print(f"regent host: --metrics: {e}", file=sys.stderr)
            return 2
    if a.hollow < 0:
        print(f"regent host: --hollow {a.hollow}: give the most hollow procs this agent serves (K >= 1)",
              file=sys.stderr)
        return 2
    name = a.name or check_name(socket.gethostname().split(".")[0], "hostname (pass --name)")
    if a.fleet:
        return _start_fleet(a, argv, name)
    if a.advertise == AUTO:
        a.advertise = _address_toward_store(a.store)
        if a.advertise is None:
            print(f"regent host: --advertise auto: no address of this node routes to the store {a.store} "
                  "off loopback; give --advertise IP", file=sys.stderr)
            return 2
    bind = a.bind or a.advertise
    if not is_loopback(bind) and os.environ.get("REGENT_SECURE") != "1":
        os.environ["REGENT_SECURE"] = "1"  # off loopback every socket is CURVE: this agent's and its procs'
    try:
        load_credentials()  # before daemonizing, so missing keys are said on the terminal
    except RuntimeError as e:
        print(f"regent host: {e}", file=sys.stderr)
        return 2
    # The agent's own files (host record, lock, log) are per cluster and name, so several
    # agents can share a machine; its procs restart it, should it die, with this command.
    host_file = regent_home() / f"host-{a.cluster}-{name}.json"
    os.environ[discovery.HOST_FILE_ENV] = str(host_file)
    live = discovery.live_host_record()
    if live is not None:
        print(f"regent host: an agent of cluster {a.cluster!r} named {name!r} already runs on this machine "
              f"(pid {live['pid']}, at {live['address']}): stop it first, or give this one another --name",
              file=sys.stderr)
        return 2
    predecessor = discovery.host_record()  # not live (above): the dead agent this one succeeds
    os.environ["REGENT_HOST_NAME"] = name  # its procs' output is prefixed with it
    _pin_interfaces(a.advertise)
    again = [x for x in argv if x != "--daemonize"]
    if "--log" in again:
        i = again.index("--log")
        del again[i:i + 2]
    os.environ[discovery.HOST_CMD_ENV] = json.dumps([sys.executable, "-m", "regent.cli", "host", *again])
    if a.daemonize:
        daemonize(a.log or str(host_file.with_suffix(".log")))

    def join(agent: object) -> object:
        journal = open_journal(a.store)  # after the fork: gRPC channels do not survive one

        def describe(incarnation: str) -> HostRecord:
            return _describe(name, agent.inbox.address, incarnation, hollow=a.hollow > 0)

        try:
            membership = HostMembership(journal.backend, a.cluster, name, describe, a.ttl,
                                        predecessor=predecessor).start()
        except BaseException:
            journal.close()
            raise

        def leave() -> None:
            try:
                membership.stop()
            finally:
                journal.close()
        return leave

    try:
        serve_agent(bind, a.port, float("inf"), advertise=a.advertise, on_serving=join, hollow=a.hollow,
                    metrics=a.metrics)
    except HostNameInUse as e:
        print(f"regent host: {e}", file=sys.stderr)
        return 2
    return 0


def _start_fleet(a: argparse.Namespace, argv: list[str], name: str) -> int:
    from regent.cli._fleet import MAX_FLEET, fleet_names, run_fleet

    if not a.hollow:
        print(f"regent host: --fleet {a.fleet} starts hollow agents: give --hollow K too (a real host "
              "runs one agent)", file=sys.stderr)
        return 2
    if not 1 <= a.fleet <= MAX_FLEET:
        print(f"regent host: --fleet {a.fleet} must lie between 1 and {MAX_FLEET}", file=sys.stderr)
        return 2
    if a.daemonize or a.metrics is not None or a.port:
        print("regent host: --fleet runs in the foreground, each agent on a free port and without "
              "/metrics: drop --daemonize, --port and --metrics", file=sys.stderr)
        return 2
    try:
        check_name(fleet_names(name, a.fleet)[-1], "the fleet's last host name (give a shorter --name)")
    except ValueError as e:
        print(f"regent host: {e}", file=sys.stderr)
        return 2
    return run_fleet(argv, name, a.fleet, cluster_agent)


def _address_toward_store(store: str) -> str | None:
    from regent.journal.etcd_target import local_address_toward

    if not store.startswith(("etcd://", "etcds://")):
        return None
    return local_address_toward(store)


def _pin_interfaces(advertise: str) -> None:
    """Have this agent's procs use the advertised address for their own traffic too: RDMA
    buffers' TCP server, and gloo / NCCL sockets (which otherwise pick an interface by
    resolving the hostname, which may name another address, or none, on this node)."""
    import psutil

    os.environ.setdefault("REGENT_HIPCORE_RDMA_ADDR", advertise)
    iface = next((name for name, addrs in psutil.net_if_addrs().items()
                  if any(a.address == advertise for a in addrs)), None)
    if iface is None:
        print(f"regent host: warning: no interface of this node has the address {advertise}; "
              "is --advertise right?", file=sys.stderr)
        return
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        os.environ.setdefault(var, iface)


def _describe(name: str, address: str, incarnation: str, hollow: bool = False) -> HostRecord:
    import psutil

    from regent.hipcore import backend

    info = None if hollow else backend()  # a hollow host has no devices (and may not import torch)
    return HostRecord(id=name, address=address, hostname=socket.gethostname(), incarnation=incarnation,
                      pid=os.getpid(), cores=os.cpu_count() or 1, memory_bytes=psutil.virtual_memory().total,
                      backend="hollow" if info is None else info.name,
                      devices=[f"{info.name}:{i}" for i in range(info.device_count)]
                      if info is not None and info.is_gpu else [], since=time.time())


def hosts_ls(cluster: str, store: str | None, as_json: bool = False) -> int:
    from regent.journal import open_journal

    if not store:
        print("regent hosts ls: name the store with --store etcd://HOST:2379 (or set REGENT_JOURNAL)",
              file=sys.stderr)
        return 2
    journal = open_journal(store)
    try:
        hosts = registered_hosts(journal.backend, cluster)
    finally:
        journal.close()
    if as_json:
        print(json.dumps([{**h.__dict__, "age_s": round(h.age_s(), 1)} for h in hosts], indent=1))
        return 0
    if not hosts:
        print(f"no hosts registered in cluster {cluster!r} at {journal.url}: start agents with "
              f"`regent host --cluster {cluster} --store {journal.url} --advertise <node IP>`")
        return 0
    print(f"{'HOST':<16} {'STATE':<6} {'ADDRESS':<28} {'HOSTNAME':<16} {'CORES':>5} {'MEMORY':>8} "
          f"{'BACKEND':<8} {'AGE':>8}  INCARNATION")
    for h in hosts:
        print(f"{h.id:<16} {'up':<6} {h.address:<28} {h.hostname[:16]:<16} {h.cores:>5} "
              f"{h.memory_bytes / 2**30:>6.1f}Gi {h.backend:<8} {_age(h.age_s()):>8}  {h.incarnation}")
    return 0


def _age(s: float) -> str:
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


