"""`regent launch slurm|ssh|k8s PROGRAM.py [options] [-- program arguments]`: start a job on
the engine a cluster already runs (docs/launch.md). Each launcher starts one host agent per
machine joined to a cluster through the journal's store, the program as primary controller,
and, where asked, a standby on another machine; agents and programs get REGENT_CLUSTER and
REGENT_JOURNAL, so an unmodified program finds its hosts with `s.host_mesh(hosts=N)`.

`regent launch wait` is what the launchers' scripts wait with: until the store answers and,
given --hosts, that many agents have joined the cluster.
"""

from __future__ import annotations

import argparse
import sys
import time

from regent.cli.launch import k8s, slurm, ssh
from regent.cli.launch.common import LaunchError, check_journal

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("launch", help="start a job on Slurm, over SSH or on Kubernetes (docs/launch.md)")
    engines = p.add_subparsers(dest="engine", required=True)
    slurm.add_arguments(engines.add_parser(
        "slurm", help="an sbatch script: an agent per node, the primary in the batch step, a standby on node 2"))
    ssh.add_arguments(engines.add_parser(
        "ssh", help="agents on hosts over ssh, the program here, a standby on one of them"))
    k8s.add_arguments(engines.add_parser(
        "k8s", help="manifests: agents as a StatefulSet, the controller as a 2-replica Deployment, etcd"))
    w = engines.add_parser("wait", help="wait until the store answers and N hosts joined the cluster")
    w.add_argument("--store", required=True)
    w.add_argument("--cluster", default=None)
    w.add_argument("--hosts", type=int, default=0)
    w.add_argument("--timeout", type=float, default=60.0)
    o = engines.add_parser("once", help="run a controller once per cluster under a scheduler that restarts "
                                        "what exits (what the k8s Deployment runs)")
    o.add_argument("--cluster", required=True)
    o.add_argument("--store", required=True)
    o.add_argument("--exit", action="store_true", help="exit with the run's status instead of idling after it")


def run(args: argparse.Namespace, rest: list[str]) -> int:
    if args.engine == "wait":
        return wait(args.store, args.cluster, args.hosts, args.timeout)
    if args.engine == "once":
        from regent.cli.launch.once import once

        return once(args.cluster, args.store, rest, idle=not args.exit)
    return {"slurm": slurm.run, "ssh": ssh.run, "k8s": k8s.run}[args.engine](args, rest)


def wait(store: str, cluster: str | None, hosts: int, timeout_s: float) -> int:
    from regent.journal import open_journal
    from regent.journal.hosts import registered_hosts

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check_journal(store, timeout_s=min(2.0, timeout_s))
            break
        except LaunchError as e:
            if time.monotonic() > deadline:
                print(f"regent launch wait: {e}", file=sys.stderr)
                return 1
            time.sleep(0.2)
    if not hosts:
        return 0
    journal = open_journal(store)
    try:
        while True:
            found = registered_hosts(journal.backend, cluster or "")
            if len(found) >= hosts:
                print(f"regent: {len(found)} hosts in cluster {cluster}: "
                      + ", ".join(f"{h.id} ({h.address})" for h in found), file=sys.stderr)
                return 0
            if time.monotonic() > deadline:
                print(f"regent launch wait: {len(found)} of {hosts} hosts joined cluster {cluster} in "
                      f"{timeout_s:g} s ({', '.join(h.id for h in found) or 'none'}); see the agents' output",
                      file=sys.stderr)
                return 1
            time.sleep(0.2)
    finally:
        journal.close()
