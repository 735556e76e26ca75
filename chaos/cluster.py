"""A controller program run as primary + standbys under chaos, from outside.

`ChaosCluster` starts the program (default: chaos/programs/workload.py) in real
processes, each controller with its own proxied link to etcd ("controller<k>->etcd")
and its worker links proxied by chaos.links. A monitor thread keeps the standbys
topped up (a killed primary is replaced, as an operator's supervisor would), starts
etcd again after a scheduled kill, counts the leader's steps for `after_calls`
faults, and stops the standbys once a controller has finished the run.

Fault targets, resolved when each fault fires (a role moves between processes):
links "controller->etcd" (the leader's), "standby->etcd", "controller->proc/<i>",
"proc->controller" (the leader's reply link), "controller->host"; processes
"controller", "standby", "host", "proc/<i>", "etcd".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import structlog

from regent.chaos import faults as process_faults
from regent.chaos.faults import FaultLog
from regent.chaos.ledger import in_flight_marker
from regent.chaos.linearizability import ENV_HISTORY
from regent.chaos.links import ENV_TOXIPROXY, proxy_name
from regent.chaos.net import ChaosNet
from regent.chaos.runner import ScheduleRunner
from regent.chaos.schedule import Schedule
from regent.chaos.toxiproxy import Proxy, ToxiproxyError, ToxiproxyServer, ToxiproxyWatchdog
from regent.controller.session import DEPOSED_EXIT_STATUS
from regent.worker import discovery, procinfo

__all__ = ["ChaosCluster", "Controller", "RoleNet", "WORKLOAD"]

ETCD_START_TRIES = 20  # restarts of a killed etcd that a fault killed again while it started

log = structlog.get_logger("chaos.cluster")

WORKLOAD = Path(__file__).parent / "programs" / "workload.py"
REPO = Path(__file__).resolve().parent.parent
ROLE_LINKS = ("controller->etcd", "standby->etcd", "proc->controller", "controller->host")


def _failed(status: int | None) -> bool:
    """Whether a controller's exit status is a failure. These are not: still running (None),
    done (0), killed by a fault (-9), deposed (3, or the session's deposed status), and a
    standby whose run had ended (4)."""
    return status not in (None, 0, -9, 3, 4, DEPOSED_EXIT_STATUS)


@dataclass
class Controller:
    k: int
    popen: subprocess.Popen
    link: str  # its etcd link
    log_path: Path
    out_path: Path
    started: float

    @property
    def pid(self) -> int:
        return self.popen.pid


class RoleNet(ChaosNet):
    """A ChaosNet whose role links ("controller->etcd", "controller->proc/1") resolve to a
    proxy when a fault is applied; undoing it acts on that same proxy."""

    def __init__(self, server: Any, cluster: ChaosCluster, faults: FaultLog) -> None:
        super().__init__(server, faults=faults)
        self.cluster = cluster
        self._bound: dict[tuple[str, str], Proxy] = {}

    def __iter__(self):
        procs = [f"controller->proc/{i}" for i in range(self.cluster.n_procs)]
        return iter([*self._links, *ROLE_LINKS, *procs])

    def __contains__(self, name: object) -> bool:
        return name in set(self)

    def __getitem__(self, name: str) -> Proxy:
        if name in self._links:
            return self._links[name]
        pname = self.cluster.resolve_link(name)
        if pname is None:
            raise KeyError(f"link {name!r} has no proxy right now (its process is not up)")
        return self._api.proxy(pname)

    def partition(self, name: str, *, note: Any = None) -> None:
        proxy = self._bound[(name, "down")] = self[name]
        proxy.disable()
        self.faults.record("down", name, {"proxy": proxy.name, **dict(note or {})})

    def heal(self, name: str, *, note: Any = None) -> None:
        proxy = self._bound.pop((name, "down"), None) or self[name]
        proxy.enable()
        self.faults.record("up", name, {"proxy": proxy.name, **dict(note or {})})

    def add_toxic(self, name: str, kind: str, stream: str = "downstream", toxicity: float = 1.0, *,
                  toxic_name: str | None = None, note: Any = None, **attributes: int):
        proxy = self[name]
        toxic = proxy.add_toxic(kind, stream, toxicity, name=toxic_name, **attributes)
        self._bound[(name, toxic.name)] = proxy
        self.faults.record("toxic_add", name, {"toxic": toxic.name, "type": kind, "stream": stream,
                                               "toxicity": toxicity, "proxy": proxy.name,
                                               **attributes, **dict(note or {})})
        return toxic

    def remove_toxic(self, name: str, toxic_name: str, *, note: Any = None) -> None:
        proxy = self._bound.pop((name, toxic_name), None) or self[name]
        proxy.remove_toxic(toxic_name)
        self.faults.record("toxic_remove", name, {"toxic": toxic_name, "proxy": proxy.name,
                                                  **dict(note or {})})

    def close(self) -> None:
        super().close()
        self.cluster.delete_worker_proxies()


@dataclass
class ChaosCluster:
    """One session of a program, run by controllers in real processes, under chaos."""

    server: ToxiproxyServer
    etcd: Any  # chaos.etcd.LocalEtcd (or anything with url, address, pid, start(), reap())
    workdir: Path
    session: str
    program: Path = WORKLOAD
    steps: int = 60
    n_procs: int = 3
    ttl_s: float = 1.0
    standbys: int = 1
    proxied_workers: bool = True
    etcd_restart_s: float | None = 0.5  # after a kill, start etcd again after this long; None: never
    target_wait_s: float = 0.0  # how long a process fault waits for a target being restarted (runner)
    env: dict = field(default_factory=dict)
    faults: FaultLog = field(default_factory=FaultLog)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ledger_dir = self.workdir / f"{self.session}.ledger"
        self.leader_file = self.workdir / f"{self.session}.leaders"
        self.history_dir = self.workdir / f"{self.session}.history"  # what each controller saw of the register
        self.controllers: list[Controller] = []
        self.net = RoleNet(self.server, self, self.faults)
        self.winner: Controller | None = None
        self._toxiproxy_watch: ToxiproxyWatchdog | None = None  # replaces a stuck Toxiproxy server
        self.stopped_at_end: list[Controller] = []  # still running when the run finished
        self.result: dict | None = None
        self.etcd_restarts: list[float] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._monitor: threading.Thread | None = None
        self._steps_seen = 0
        self.runner: Any = None  # a ScheduleRunner to tell of steps (after_calls faults)

    # --- controllers -------------------------------------------------------------------

    def _env(self) -> dict:
        env = dict(os.environ)
        env.update({
            "REGENT_CHAOS_SESSION": self.session,
            "REGENT_CHAOS_STEPS": str(self.steps),
            "REGENT_CHAOS_PROCS": str(self.n_procs),
            "REGENT_CHAOS_TTL": str(self.ttl_s),
            "REGENT_CHAOS_LEDGER": str(self.ledger_dir),
            "REGENT_CHAOS_LEADERS": str(self.leader_file),
            ENV_HISTORY: str(self.history_dir),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        })
        if self.proxied_workers:
            env[ENV_TOXIPROXY] = self.server.url
        env.update({k: str(v) for k, v in self.env.items()})
        return env

    def start_controller(self) -> Controller:
        k = len(self.controllers)
        link = f"controller{k}->etcd"
        listen = self.net.link(link, self.etcd.address)
        env = self._env()
        env["REGENT_CHAOS_JOURNAL"] = f"etcd://{listen}"
        log_path = self.workdir / f"{self.session}.ctl{k}.log"
        out_path = self.workdir / f"{self.session}.ctl{k}.out"
        with open(log_path, "w") as err, open(out_path, "w") as out:
            popen = subprocess.Popen([sys.executable, str(self.program)], env=env, stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL, cwd=str(REPO))
        c = Controller(k, popen, link, log_path, out_path, time.time())
        with self._lock:
            self.controllers.append(c)
        return c

    def start(self) -> ChaosCluster:
        for _ in range(1 + self.standbys):
            self.start_controller()
        self._monitor = threading.Thread(target=self._watch, name=f"chaos-cluster-{self.session}", daemon=True)
        self._monitor.start()
        self._toxiproxy_watch = ToxiproxyWatchdog(self.server).start()
        return self

    def schedule_runner(self, schedule: Schedule) -> ScheduleRunner:
        """A runner that plays `schedule` on this cluster's links and processes."""
        return ScheduleRunner(schedule, self.net, self.processes(), faults=self.faults,
                              target_wait_s=self.target_wait_s,
                              in_flight=self.runs_a_call)

    def runs_a_call(self, pid: int) -> bool:
        """Whether process `pid` runs a call the program waits for (the workload marks them)."""
        return in_flight_marker(self.ledger_dir, pid).exists()

    def restore_store(self) -> None:
        """etcd running again, should the run have ended with it killed."""
        if not self.etcd.running:
            self.etcd.start()

    @property
    def journal_url(self) -> str:
        return self.etcd.url

    def leaders(self) -> list[tuple[int, float]]:
        try:
            lines = self.leader_file.read_text().split("\n")
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            parts = line.split()
            if len(parts) == 2:
                out.append((int(parts[0]), float(parts[1])))
        return out

    def leader(self) -> Controller | None:
        pids = self.leaders()
        if not pids:
            return None
        return self._by_pid(pids[-1][0])

    def _by_pid(self, pid: int) -> Controller | None:
        return next((c for c in self.controllers if c.pid == pid), None)

    def live(self) -> list[Controller]:
        return [c for c in self.controllers if c.popen.poll() is None]

    def standby(self) -> Controller | None:
        lead = self.leader()
        return next((c for c in self.live() if c is not lead), None)

    def wait_step(self, step: int, timeout_s: float = 60.0) -> None:
        """Until some controller has reported running `step` live."""
        deadline = time.monotonic() + timeout_s
        while self._steps_seen <= step:
            if self.result is not None:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.session}: step {step} not reached in {timeout_s} s\n{self.log_tail()}")
            time.sleep(0.01)

    def wait(self, timeout_s: float = 120.0) -> dict:
        """The program's result, once a controller has finished the run."""
        deadline = time.monotonic() + timeout_s
        while self.result is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.session}: no controller finished within {timeout_s} s\n{self.log_tail()}")
            if self._monitor is not None and not self._monitor.is_alive() and self.result is None:
                raise RuntimeError(f"{self.session}: the run failed\n{self.log_tail()}")
            time.sleep(0.02)
        return self.result

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                if self._tick():
                    return
            except Exception:
                log.exception("chaos cluster monitor error (continuing)")
            time.sleep(0.01)

    def _tick(self) -> bool:
        # Done once a controller has printed the result (it may be killed before it exits).
        done, result = None, None
        for c in self.controllers:
            result = _final_line(c.out_path)
            if result is not None:
                done = c
                break
        if done is not None:
            for c in self.live():
                if c is not done:
                    self.stopped_at_end.append(c)
                    c.popen.kill()
                    c.popen.wait()
            self.winner, self.result = done, result
            return True
        failed = [c for c in self.controllers if _failed(c.popen.poll())]
        if len(failed) > 8 * (1 + self.standbys):
            self.result = {"error": f"{len(failed)} controllers failed"}
            return True
        self._count_steps()
        if self.etcd_restart_s is not None and self.etcd.reap():
            threading.Thread(target=self._restart_etcd, daemon=True).start()
        if len(self.live()) < 1 + self.standbys:
            self.start_controller()
        return False

    def _restart_etcd(self) -> None:
        time.sleep(self.etcd_restart_s or 0)
        for attempt in range(1, ETCD_START_TRIES + 1):
            try:
                self.etcd.start()
                break
            except RuntimeError as e:
                # Killed again while starting (a fault found the new process): that start has
                # reaped it, so the monitor will not see it die. Start it again from here.
                log.warning("etcd did not come back; trying again", error=str(e), attempt=attempt)
                time.sleep(0.2)
        else:
            log.error("etcd did not come back; the run goes on without it", tries=ETCD_START_TRIES)
            return
        self.etcd_restarts.append(time.time())
        self.faults.record("restart", "etcd", {"pid": self.etcd.pid})

    def _count_steps(self) -> None:
        lead = self.leader()
        if lead is None:
            return
        try:
            text = lead.log_path.read_text()
        except OSError:
            return
        last = text.rfind("step ")
        if last < 0:
            return
        line = text[last:].split("\n", 1)[0]
        try:
            n = int(line.split()[1]) + 1
        except (IndexError, ValueError):
            return
        if n > self._steps_seen:
            if self.runner is not None:
                self.runner.note_calls(n - self._steps_seen)
            self._steps_seen = n

    def stop(self, exit_wait_s: float = 30.0) -> None:
        """Stop the run. The controller that printed the result is still closing its session
        (settling broadcasts it never waited for, flushing the journal): it is given
        `exit_wait_s` to exit on its own before anything is killed."""
        self._stop.set()
        if self._toxiproxy_watch is not None:
            self._toxiproxy_watch.stop()
        self._stop_controllers(exit_wait_s)
        # The host agent and procs outlive the controllers; one left stopped would block
        # Toxiproxy calls on its links (and the next test's calls to it).
        for pid in [_host_pid_or_none(), *(_proc_pid(self.session, i) for i in range(self.n_procs))]:
            if pid is not None:
                process_faults.release(pid)
        self.net.close()

    def _stop_controllers(self, exit_wait_s: float) -> None:
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        if self.winner is not None:
            try:
                self.winner.popen.wait(exit_wait_s)
            except subprocess.TimeoutExpired:
                log.warning("the controller that finished the run did not exit; killing it",
                            session=self.session, pid=self.winner.pid, waited_s=exit_wait_s)
        for c in self.controllers:
            if c.popen.poll() is None:
                c.popen.kill()  # SIGKILL ends a paused controller too
                c.popen.wait()

    def log_tail(self, n: int = 30) -> str:
        text = ""
        for c in self.controllers:
            try:
                lines = c.log_path.read_text().splitlines()
            except OSError:
                continue
            status = c.popen.poll()
            text += f"--- controller {c.k} (pid {c.pid}, exit {status})\n"
            if _failed(status):
                # A program that failed: what went wrong on the way, not only its traceback.
                notable = [ln for ln in lines[:-n] if "[warning" in ln or "[error" in ln or "failed" in ln]
                if notable:
                    text += "  (its warnings and failures before the end)\n" + "\n".join(notable[-2 * n:]) + "\n  ...\n"
            text += "\n".join(lines[-n:]) + "\n"
        return text

    # --- fault targets -------------------------------------------------------------------

    def processes(self) -> dict:
        table: dict[str, Any] = {
            "controller": lambda: self._need(self.leader(), "controller"),
            "standby": lambda: self._need(self.standby(), "standby"),
            "host": _host_pid,
            "etcd": lambda: self._need_pid(self.etcd.pid, "etcd"),
        }
        for i in range(self.n_procs):
            table[f"proc/{i}"] = lambda i=i: self._need_pid(_proc_pid(self.session, i), f"proc/{i}")
        return table

    @staticmethod
    def _need(c: Controller | None, what: str) -> int:
        if c is None or c.popen.poll() is not None:
            raise ProcessLookupError(f"no live {what} right now")
        return c.pid

    @staticmethod
    def _need_pid(pid: int | None, what: str) -> int:
        if pid is None:
            raise ProcessLookupError(f"no live {what} right now")
        return pid

    def resolve_link(self, name: str) -> str | None:
        """The Toxiproxy proxy a role link names at this moment (None: nobody plays the role)."""
        if name == "controller->etcd":
            c = self.leader()
            return self.net._links[c.link].name if c and c.popen.poll() is None else None
        if name == "standby->etcd":
            c = self.standby()
            return self.net._links[c.link].name if c else None
        if name == "proc->controller":
            c = self.leader()
            ports = _listen_ports(c.pid) if c and c.popen.poll() is None else set()
            return self._existing(f"proc->controller/{p}" for p in ports)
        if name == "controller->host":
            pid = _host_pid_or_none()
            return self._existing(f"controller->host/{p}" for p in (_listen_ports(pid) if pid else ()))
        if name.startswith("controller->proc/"):
            pid = _proc_pid(self.session, int(name.rsplit("/", 1)[1]))
            return self._existing(f"controller->proc/{p}" for p in (_listen_ports(pid) if pid else ()))
        return None

    def _existing(self, links) -> str | None:
        # One proxy at a time, not GET /proxies: that waits on every proxy's toxics, so a
        # single link stuck behind a stopped peer would stall every lookup.
        for link in links:
            try:
                return self.server.client.proxy(proxy_name(link)).name
            except ToxiproxyError as e:
                if e.status != 404:
                    raise
        return None

    def delete_worker_proxies(self) -> None:
        """Worker links are created by the controllers; this run's are deleted at its end."""
        try:
            proxies = self.server.client.proxies()
        except ToxiproxyError as exc:  # cleanup must not hide the run's verdict
            log.warning("worker links not deleted", session=self.session, error=str(exc))
            return
        for name, proxy in proxies.items():
            if name.startswith(("controller-_proc_", "proc-_controller_", "controller-_host_")):
                try:
                    proxy.delete()
                except Exception:  # another cluster on the server may have deleted it
                    pass


def _final_line(path: Path) -> dict | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    if not text.endswith("\n"):
        return None
    try:
        data = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return data if isinstance(data, dict) and "out" in data else None


def _host_pid_or_none() -> int | None:
    info = discovery.live_host_record()
    return info["pid"] if info else None


def _host_pid() -> int:
    pid = _host_pid_or_none()
    if pid is None:
        raise ProcessLookupError("no host agent is running ($REGENT_HOME/host.json)")
    return pid


def _proc_pid(session: str, index: int) -> int | None:
    """The live proc of `session` with this index (restarts get new pids)."""
    run = f"{session}."  # a proc's --session is the session id, "<name>.<run id>"
    return next((p.pid for p in procinfo.running_procs()
                 if p.session.startswith(run) and p.index == index), None)


def _listen_ports(pid: int) -> set[int]:
    """TCP ports this process listens on."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
