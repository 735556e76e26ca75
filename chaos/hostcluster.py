"""A controller program run as primary + standbys on namespace hosts, under packet faults.

`HostChaosCluster` is ChaosCluster's counterpart across machines: the hosts are network
namespaces on one bridge (chaos.netcluster.MultiHost, with a replicated etcd of one member
per host), the controllers run on controller hosts of their own, the actors on one proc per
agent host, and every byte between them crosses the hosts' links, where the schedule's
packet faults (chaos.packets) act. Process faults act on the processes of those hosts.

Fault targets, resolved when each fault fires:
hosts and roles "primary", "standby", "controllers", "workers", "etcd", "etcd-leader",
"etcd-follower" (one follower), "etcd-followers", "all", and each host by name;
processes "controller", "standby", "etcd-leader", "etcd-follower", "etcd/<member>",
"agent/<host>" and "proc/<host>".
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from regent.chaos import faults as process_faults
from regent.chaos.cluster import REPO, ChaosCluster, Controller
from regent.chaos.etcd_cluster import EtcdCluster
from regent.chaos.netcluster import MultiHost
from regent.chaos.packets import HostFaults
from regent.chaos.runner import ScheduleRunner
from regent.chaos.schedule import Schedule
from regent.worker import procinfo

__all__ = ["HOST_ROLES", "HostChaosCluster", "make_hosts"]

log = structlog.get_logger("chaos.hostcluster")

HOST_ROLES = ("primary", "standby", "controllers", "workers", "etcd", "etcd-leader", "etcd-follower",
              "etcd-followers", "all")


def make_hosts(workdir: Path, agents: int = 3, controllers: int = 2, members: int = 3) -> MultiHost:
    """The hosts of a chaos run: agents h1.., controller hosts c1.., etcd members e1.. (started)."""
    Path(workdir).mkdir(parents=True, exist_ok=True)
    return MultiHost(Path(workdir), [f"h{i + 1}" for i in range(agents)], [f"c{i + 1}" for i in range(controllers)],
                     cluster="chaos", etcd_members=[f"e{i + 1}" for i in range(members)]).start()


@dataclass
class HostChaosCluster(ChaosCluster):
    """One session of a program across namespace hosts; `hosts` is started and outlives it."""

    hosts: MultiHost | None = None
    step_times: list[float] = field(default_factory=list)  # when each live step was first seen

    def __post_init__(self) -> None:
        assert self.hosts is not None and isinstance(self.hosts.etcd, EtcdCluster), "needs a MultiHost with etcd members"
        self.etcd = self.hosts.etcd
        self.n_procs = len(self.hosts.agents)
        self.proxied_workers = False
        super().__post_init__()
        self.net = None  # no Toxiproxy links: faults act on the hosts' links
        self._host_of: dict[int, str] = {}
        self._terms: list[int] = []  # etcd's raft term when the run started and when it stopped
        self.host_faults = HostFaults(self.hosts.net, self.resolve_hosts, HOST_ROLES, faults=self.faults)

    # --- controllers on controller hosts ---------------------------------------------------

    def _place(self) -> str:
        """A controller host with no live controller (the first, when all are taken)."""
        busy = {self._host_of.get(c.pid) for c in self.live()}
        return next((h for h in self.hosts.controllers if h not in busy), self.hosts.controllers[0])

    def start_controller(self) -> Controller:
        mh = self.hosts
        k = len(self.controllers)
        where = self._place()
        env = {**self._env(), **mh.env(where, REGENT_ADVERTISE=mh.address(where)),
               "REGENT_CHAOS_JOURNAL": mh.url, "REGENT_CHAOS_HOSTS": str(len(mh.agents))}
        env.update({k: str(v) for k, v in self.env.items()})
        log_path = self.workdir / f"{self.session}.ctl{k}.log"
        out_path = self.workdir / f"{self.session}.ctl{k}.out"
        with open(log_path, "w") as err, open(out_path, "w") as out:
            popen = mh.popen(where, [sys.executable, str(self.program)], env=env, stdout=out, stderr=err,
                             cwd=str(REPO))
        c = Controller(k, popen, "", log_path, out_path, time.time())
        with self._lock:
            self._host_of[c.pid] = where
            self.controllers.append(c)
        return c

    def start(self) -> HostChaosCluster:
        self._terms = [self.etcd.term()]
        for _ in range(1 + self.standbys):
            self.start_controller()
        self._monitor = threading.Thread(target=self._watch, name=f"chaos-hosts-{self.session}", daemon=True)
        self._monitor.start()
        return self

    def schedule_runner(self, schedule: Schedule) -> ScheduleRunner:
        return ScheduleRunner(schedule, None, self.processes(), hosts=self.host_faults, faults=self.faults,
                              in_flight=self.runs_a_call)

    def _count_steps(self) -> None:
        before = self._steps_seen
        super()._count_steps()
        self.step_times += [time.time()] * (self._steps_seen - before)

    def longest_stall_s(self) -> float:
        """The longest time the run made no live step (from its first step to its result)."""
        times = self.step_times
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    def stop(self, exit_wait_s: float = 30.0) -> None:
        self._stop.set()
        self._stop_controllers(exit_wait_s)
        mh = self.hosts
        for pid in [*(mh.agent_pid(h) for h in mh.agents), *(self._proc_on(h) for h in mh.agents),
                    *(self.etcd.pid(m) for m in self.etcd.members)]:
            if pid is not None:
                process_faults.release(pid)
        mh.net.heal()
        self.restore_store()
        self._terms.append(self.etcd.term())
        mh.ensure_agents()

    def figures(self) -> dict:
        """What the checker does not see: the longest stall, and etcd elections during the run."""
        return {"longest_stall_s": round(self.longest_stall_s(), 2),
                "etcd_elections": self._terms[-1] - self._terms[0] if len(self._terms) == 2 else None}

    def restore_store(self) -> None:
        """Every etcd member running again (a kill the run did not undo)."""
        self.etcd.start()

    def _restart_etcd(self) -> None:
        # Only the members that died: waiting for all to be healthy would wait out a partition.
        time.sleep(self.etcd_restart_s or 0)
        for m in self.etcd.members:
            if self.etcd.pid(m) is None:
                self.etcd.start_member(m, wait=False)
                self.etcd_restarts.append(time.time())
                self.faults.record("restart", f"etcd/{m}", {"pid": self.etcd.pid(m)})

    @property
    def journal_url(self) -> str:
        return self.hosts.url

    # --- fault targets -------------------------------------------------------------------

    def resolve_hosts(self, role: str) -> list[str]:
        mh = self.hosts
        if role in ("primary", "standby"):
            c = self.leader() if role == "primary" else self.standby()
            if c is None or c.popen.poll() is not None:
                raise LookupError(f"no live {role} controller right now")
            return [self._host_of[c.pid]]
        if role == "controllers":
            return list(mh.controllers)
        if role == "workers":
            return list(mh.agents)
        if role == "etcd":
            return list(self.etcd.members)
        if role == "all":
            return list(mh.net.names)
        if role.startswith("etcd-"):
            return self._etcd_role(role)
        raise LookupError(f"no role {role!r}")

    def _etcd_role(self, role: str) -> list[str]:
        leader = self.etcd.leader(timeout=1.0)
        followers = sorted(m for m in self.etcd.members if m != leader)
        return {"etcd-leader": [leader], "etcd-follower": followers[:1], "etcd-followers": followers}[role]

    def processes(self) -> dict:
        mh = self.hosts
        table: dict[str, Any] = {
            "controller": lambda: self._need(self.leader(), "controller"),
            "standby": lambda: self._need(self.standby(), "standby"),
            "etcd-leader": lambda: self._member_pid(self._etcd_role("etcd-leader")[0]),
            "etcd-follower": lambda: self._member_pid(self._etcd_role("etcd-follower")[0]),
        }
        for m in self.etcd.members:
            table[f"etcd/{m}"] = lambda m=m: self._member_pid(m)
        for h in mh.agents:
            table[f"agent/{h}"] = lambda h=h: self._need_pid(mh.agent_pid(h), f"agent/{h}")
            table[f"proc/{h}"] = lambda h=h: self._need_pid(self._proc_on(h), f"proc/{h}")
            table[f"host/{h}"] = table[f"agent/{h}"]  # kill_host: the agent and every proc it started
        return table

    def _member_pid(self, member: str) -> int:
        return self._need_pid(self.etcd.pid(member), f"etcd/{member}")

    def _proc_on(self, host: str) -> int | None:
        """The live proc of this session in host `host`."""
        here = set(self.hosts.net.pids(host))
        run = f"{self.session}."
        return next((p.pid for p in procinfo.running_procs() if p.pid in here and p.session.startswith(run)), None)

    def log_tail(self, n: int = 30) -> str:
        text = super().log_tail(n)
        for path in sorted(self.hosts.workdir.glob("agent-*.log")):
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            text += f"--- {path.name}\n" + "\n".join(lines[-5:]) + "\n"
        return text

