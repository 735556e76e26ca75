"""`regent chaos run SCENARIO`: the workload (or a given program) under a scenario file,
with its own Toxiproxy server and etcd, then the checker's report. With `--hosts`, across
namespace hosts made for the run (root only): controllers, workers and a 3-member etcd on
hosts of their own, for scenarios with packet faults (chaos.packets)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from regent.chaos.cluster import WORKLOAD
from regent.chaos.etcd import LocalEtcd
from regent.chaos.run import fault_free, run_schedule
from regent.chaos.schedule import load_schedule
from regent.chaos.toxiproxy import ToxiproxyServer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="a scenario file (TOML or JSON, see docs/chaos.md)")
    p.add_argument("--program", default=str(WORKLOAD), help="controller program (default: the chaos workload)")
    p.add_argument("--steps", type=int, default=200, help="workload steps (default 200)")
    p.add_argument("--step-s", type=float, default=0.02, help="pause after each live step (default 0.02)")
    p.add_argument("--call-timeout", type=float, default=5.0, help="deadline of every call, s (default 5)")
    p.add_argument("--ttl", type=float, default=1.0, help="leader lease ttl, s (default 1)")
    p.add_argument("--standbys", type=int, default=1)
    p.add_argument("--workdir", default=None, help="logs, ledger (default: a new temporary folder)")
    p.add_argument("--hosts", action="store_true",
                   help="run across namespace hosts (needs root, etcd, nftables): 2 controller hosts, "
                        "3 workers, 3 etcd members; packet faults target hosts and roles (docs/chaos.md)")
    p.add_argument("--spares", type=int, default=0,
                   help="with --hosts: leave this many worker hosts as spares and replace a lost host from "
                        "one (on_host_lost='replace'); for scenarios that kill hosts")


def run(args: argparse.Namespace) -> int:
    schedule = load_schedule(args.scenario)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="regent-chaos-"))
    os.environ.setdefault("REGENT_HOME", str(workdir / "home"))
    Path(os.environ["REGENT_HOME"]).mkdir(parents=True, exist_ok=True, mode=0o700)
    env = {"REGENT_CHAOS_STEP_S": str(args.step_s), "REGENT_CHAOS_CALL_TIMEOUT_S": str(args.call_timeout)}
    shape = {"steps": args.steps, "program": Path(args.program), "ttl_s": args.ttl}
    if args.spares and not args.hosts:
        raise SystemExit("regent chaos run: --spares needs --hosts (spares are hosts of a cluster)")
    name = f"chaos-{schedule.name or Path(args.scenario).stem}-{os.getpid()}"
    if args.hosts:
        result = _run_on_hosts(schedule, workdir, name, args, env, shape)
    else:
        result = _run_here(schedule, workdir, name, args, env, shape)
    print(result.report.text())
    for err in result.runner_errors:
        print(f"  not applied: {err}")
    figures = getattr(result.cluster, "figures", None)
    if figures is not None:
        print(f"  {figures()}")
    print(f"logs and ledger: {workdir}")
    return 0 if result.report.ok else 1


def _run_here(schedule, workdir: Path, name: str, args: argparse.Namespace, env: dict, shape: dict):
    with ToxiproxyServer() as server, LocalEtcd(workdir / "etcd") as etcd:
        expected = fault_free(server, etcd, workdir / "fault-free", f"{name}-ref", proxied_workers=False,
                              env={"REGENT_CHAOS_CALL_TIMEOUT_S": str(args.call_timeout)}, **shape)
        return run_schedule(server, etcd, workdir, name, schedule, expected=expected, env=env,
                            standbys=args.standbys, **shape)


def _run_on_hosts(schedule, workdir: Path, name: str, args: argparse.Namespace, env: dict, shape: dict):
    from regent.chaos.hostcluster import make_hosts
    from regent.chaos.netns import unavailable_reason
    from regent.chaos.run import fault_free_on_hosts, run_on_hosts

    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"regent chaos run --hosts: {reason}")
    hosts = make_hosts(workdir / "hosts")
    if args.spares:
        if not 0 < args.spares < len(hosts.agents):
            raise SystemExit(f"regent chaos run: --spares must leave at least one of the {len(hosts.agents)} workers")
        spare = {"REGENT_CHAOS_HOSTS": str(len(hosts.agents) - args.spares), "REGENT_CHAOS_ON_HOST_LOST": "replace"}
        env = {**env, **spare}
    else:
        spare = {}
    try:
        expected = fault_free_on_hosts(hosts, workdir / "fault-free", f"{name}-ref",
                                       env={"REGENT_CHAOS_CALL_TIMEOUT_S": str(args.call_timeout), **spare}, **shape)
        return run_on_hosts(hosts, workdir, name, schedule, expected=expected, env=env, standbys=args.standbys,
                            **shape)
    finally:
        hosts.close()
