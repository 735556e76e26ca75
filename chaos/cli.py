"""`regent chaos run SCENARIO`: the workload (or a given program) under a scenario file,
with its own Toxiproxy server and etcd, then the checker's report."""

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


def run(args: argparse.Namespace) -> int:
    schedule = load_schedule(args.scenario)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="regent-chaos-"))
    os.environ.setdefault("REGENT_HOME", str(workdir / "home"))
    Path(os.environ["REGENT_HOME"]).mkdir(parents=True, exist_ok=True, mode=0o700)
    env = {"REGENT_CHAOS_STEP_S": str(args.step_s), "REGENT_CHAOS_CALL_TIMEOUT_S": str(args.call_timeout)}
    shape = {"steps": args.steps, "program": Path(args.program), "ttl_s": args.ttl}
    name = f"chaos-{schedule.name or Path(args.scenario).stem}-{os.getpid()}"
    with ToxiproxyServer() as server, LocalEtcd(workdir / "etcd") as etcd:
        expected = fault_free(server, etcd, workdir / "fault-free", f"{name}-ref", proxied_workers=False,
                              env={"REGENT_CHAOS_CALL_TIMEOUT_S": str(args.call_timeout)}, **shape)
        result = run_schedule(server, etcd, workdir, name, schedule, expected=expected, env=env,
                              standbys=args.standbys, **shape)
    print(result.report.text())
    for err in result.runner_errors:
        print(f"  not applied: {err}")
    print(f"logs and ledger: {workdir}")
    return 0 if result.report.ok else 1
