"""One chaos run end to end: the program fault-free, then under a schedule, then the checker.

Used by `regent chaos run SCENARIO` and by the chaos suite (tests/chaos).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regent.chaos.checker import ChaosReport, check_run
from regent.chaos.cluster import ChaosCluster
from regent.chaos.hostcluster import HostChaosCluster
from regent.chaos.ledger import read_ledger
from regent.chaos.linearizability import check_history
from regent.chaos.netcluster import MultiHost
from regent.chaos.schedule import Schedule
from regent.chaos.toxiproxy import ToxiproxyServer

__all__ = ["ChaosRun", "fault_free", "fault_free_on_hosts", "play", "run_on_hosts", "run_schedule"]


@dataclass
class ChaosRun:
    report: ChaosReport
    result: dict | None
    cluster: ChaosCluster
    runner_errors: list[str]


def _journal_view(etcd_url: str, session: str) -> tuple[list, Any]:
    from regent.journal import open_journal

    j = open_journal(etcd_url)
    try:
        return list(j.read(session)), j.verify(session)
    finally:
        j.close()


def fault_free(server: ToxiproxyServer, etcd: Any, workdir: Path, session: str, *,
               timeout_s: float = 120.0, **cluster_kw: Any) -> dict:
    """The program's result with no faults (its standby never takes over)."""
    c = ChaosCluster(server, etcd, Path(workdir), session, standbys=0, **cluster_kw)
    try:
        c.start()
        return c.wait(timeout_s)
    finally:
        c.stop()


def fault_free_on_hosts(hosts: MultiHost, workdir: Path, session: str, *, timeout_s: float = 120.0,
                        **cluster_kw: Any) -> dict:
    """The program's result across namespace hosts with no faults (see fault_free)."""
    c = HostChaosCluster(None, None, Path(workdir), session, standbys=0, hosts=hosts, **cluster_kw)
    try:
        c.start()
        return c.wait(timeout_s)
    finally:
        c.stop()


def run_on_hosts(hosts: MultiHost, workdir: Path, session: str, schedule: Schedule, *, expected: dict | None,
                 start_after_step: int = 0, timeout_s: float = 180.0, driver: Any = None,
                 **cluster_kw: Any) -> ChaosRun:
    """run_schedule across namespace hosts (chaos.hostcluster): packet and process faults."""
    return play(HostChaosCluster(None, None, Path(workdir), session, hosts=hosts, **cluster_kw), schedule,
                expected=expected, start_after_step=start_after_step, timeout_s=timeout_s, driver=driver)


def run_schedule(server: ToxiproxyServer, etcd: Any, workdir: Path, session: str, schedule: Schedule, *,
                 expected: dict | None, start_after_step: int = 0, timeout_s: float = 180.0,
                 driver: Any = None, **cluster_kw: Any) -> ChaosRun:
    """Run the program as primary + standbys, play `schedule` once step `start_after_step`
    has run (so procs and links exist), wait for the result, and check it.
    `driver(cluster)`, if given, runs in this thread while the schedule plays (extra
    faults a schedule cannot express, e.g. "kill whoever leads, 20 times")."""
    return play(ChaosCluster(server, etcd, Path(workdir), session, **cluster_kw), schedule, expected=expected,
                start_after_step=start_after_step, timeout_s=timeout_s, driver=driver)


def play(c: ChaosCluster, schedule: Schedule, *, expected: dict | None, start_after_step: int = 0,
         timeout_s: float = 180.0, driver: Any = None) -> ChaosRun:
    """Run cluster `c` (not started yet) under `schedule` and check it (see run_schedule)."""
    t0 = time.time()
    result: dict | None = None
    runner = None
    try:
        c.start()
        c.wait_step(start_after_step, timeout_s=timeout_s)
        runner = c.schedule_runner(schedule)
        c.runner = runner
        with runner:
            if driver is not None:
                driver(c)
            try:
                result = c.wait(timeout_s)
            except (TimeoutError, RuntimeError) as e:
                result = {"error": str(e)}
    finally:
        c.stop()
    t_end = time.time()
    c.restore_store()
    records, verify = _journal_view(c.journal_url, c.session)
    report = check_run(c.session, records, read_ledger(c.ledger_dir), result=result, expected=expected,
                       verify=verify, events=c.faults.events(), leaders=c.leaders(), t0=t0, t_end=t_end,
                       deadline_s=float(c.env.get("REGENT_CHAOS_CALL_TIMEOUT_S", 5.0)))
    report.linearizability = check_history(c.history_dir, run=(result or {}).get("sid"),
                                           html=c.workdir / f"{c.session}.porcupine.html")
    return ChaosRun(report, result, c, list(runner.errors) if runner else [])
