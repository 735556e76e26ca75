"""A real Slurm cluster on one machine (as root), for the tests of `regent launch slurm`: each node
is a network namespace host (chaos.netns) with a UTS namespace of its own, so its slurmd and the
job steps it forks see the node's hostname and address; slurmctld runs in the root namespace on
the bridge address. The cluster has its own munged (key, socket), config, ports and state, all in
the work directory: nothing system-wide is read or changed, and close() leaves nothing running.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from regent.chaos.netns import NamespaceHosts
from regent.chaos.netns import unavailable_reason as netns_unavailable_reason
from regent.hipcore.ports import listen_port

__all__ = ["SlurmCluster", "SlurmError", "SlurmUnavailable", "parse_record", "slurm_unavailable_reason"]

# Slurm's and MUNGE's daemons live in /usr/sbin, which a PATH need not hold.
_SBIN = ("/usr/sbin", "/sbin")
_PROGRAMS = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo",
             "munged", "mungekey", "unshare")
_NOT_ENDED = {"", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
              "SIGNALING", "STAGE_OUT"}
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_:/.]*")
# A unix socket's path must fit sockaddr_un's 108 bytes.
_MAX_SOCKET_PATH = 100


class SlurmUnavailable(RuntimeError):
    """A Slurm cluster cannot be made here (not root, Slurm or MUNGE missing, no namespaces)."""


class SlurmError(RuntimeError):
    """The cluster did not come up, or a client command failed; the message holds the logs' tails."""


def _which(program: str) -> str | None:
    return shutil.which(program, path=os.pathsep.join([os.environ.get("PATH", ""), *_SBIN]))


def slurm_unavailable_reason() -> str | None:
    """Why a SlurmCluster cannot be made here, or None if it can."""
    if os.geteuid() != 0:
        return "a Slurm cluster on namespace hosts needs root"
    missing = [p for p in _PROGRAMS if _which(p) is None]
    if missing:
        return f"Slurm or MUNGE is not installed ({', '.join(missing)} missing): run scripts/install_slurm.sh"
    return netns_unavailable_reason()


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` has a TCP socket listening on `port`."""
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in psutil.Process(pid).net_connections(kind="tcp"))
    except psutil.Error:
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"  ({path.name}: none)"
    return "\n".join(f"  {path.name}: {line}" for line in text)


def parse_record(line: str) -> dict[str, str]:
    """`scontrol show ... -o` output (`Key=Value Key=Value ...`) as a dict; a value holding
    spaces (a command line, a reason) keeps them up to the next `Key=`."""
    record: dict[str, str] = {}
    key = None
    for word in line.split():
        name, eq, value = word.partition("=")
        if eq and _KEY.fullmatch(name):
            key = name
            record[key] = value
        elif key is not None:
            record[key] += " " + word
    return record


class SlurmCluster:
    """Slurm on `nodes` namespace hosts with `cpus_per_node` CPUs each, one partition holding them."""

    def __init__(self, workdir: Path, nodes: Sequence[str] = ("n1", "n2"), cpus_per_node: int = 2,
                 partition: str = "debug", memory_mb: int = 1000):
        self.workdir = Path(workdir)
        self.nodes = list(nodes)
        self.cpus_per_node = cpus_per_node
        self.partition = partition
        self.memory_mb = memory_mb
        self.net = NamespaceHosts(self.nodes)
        self.conf_path = self.workdir / "slurm.conf"
        self.munge_socket = self.workdir / "munge" / "munge.sock"
        self._munged: subprocess.Popen | None = None
        self._slurmctld: subprocess.Popen | None = None
        self._slurmd: dict[str, subprocess.Popen] = {}

    @property
    def cluster_name(self) -> str:
        """The namespaces' tag: unique on this machine once they are made."""
        return self.net.tag

    # --- making and removing ----------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> SlurmCluster:
        reason = slurm_unavailable_reason()
        if reason:
            raise SlurmUnavailable(reason)
        if len(str(self.munge_socket)) > _MAX_SOCKET_PATH:
            raise ValueError(f"the work directory {self.workdir} is too deep for MUNGE's socket "
                             f"({self.munge_socket} is over {_MAX_SOCKET_PATH} bytes): use a shorter one")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.net.create()
            self._start_munged(timeout_s)
            self._start_slurmctld(timeout_s)
            for node in self.nodes:
                self._slurmd[node] = self._start_slurmd(node)
            self._wait_idle(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Cancel every job, stop the daemons, remove the namespaces and the bridge."""
        if self._slurmctld is not None and self._slurmctld.poll() is None:
            try:
                self.run(["scancel", "--user", "root"], check=False, timeout_s=10)
            except subprocess.TimeoutExpired:
                pass  # the daemons are stopped, and what the jobs run killed, below
        for p in [*self._slurmd.values(), self._slurmctld]:
            _stop(p)
        self._slurmd.clear()
        self._slurmctld = None
        self.net.close()  # kills what job steps left in the nodes
        _stop(self._munged)
        self._munged = None

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _daemon(self, argv: list[str], log_name: str) -> subprocess.Popen:
        with open(self.workdir / log_name, "ab") as out:
            return subprocess.Popen([_which(argv[0]) or argv[0], *argv[1:]], stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=self._daemon_env())

    def _daemon_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["PATH"] = os.pathsep.join([env.get("PATH", ""), *_SBIN])
        return env

    def _start_munged(self, timeout_s: float) -> None:
        # Everything under our own directory, and --force because munged (as root) wants every
        # directory above its socket world-searchable, which pytest's 0700 tmp dirs are not.
        d = self.munge_socket.parent
        d.mkdir(mode=0o755)
        key = d / "munge.key"
        subprocess.run([_which("mungekey") or "mungekey", "--create", "--keyfile", str(key)], check=True,
                       capture_output=True)
        self._munged = self._daemon(["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                                     f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
                                     f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"],
                                    "munged.out")
        deadline = time.monotonic() + timeout_s
        while not self.munge_socket.exists():
            if self._munged.poll() is not None or time.monotonic() > deadline:
                raise SlurmError(f"munged did not start (exit {self._munged.poll()}):\n"
                                 f"{_tail(self.workdir / 'munged.out')}")
            time.sleep(0.05)

    def _start_slurmctld(self, timeout_s: float, tries: int = 3) -> None:
        """slurmctld on a port found free, and on another if something took that one before
        slurmctld bound it (seen in a fresh-clone run: "Address already in use" beside the
        other workers' agents, proxies and daemons)."""
        for attempt in range(tries):
            port = self._write_conf()
            self._slurmctld = self._daemon(["slurmctld", "-D", "-f", str(self.conf_path)], "slurmctld.out")
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self._slurmctld.poll() is None:
                if _listens(self._slurmctld.pid, port):  # its own socket, not whoever took the port
                    return
                time.sleep(0.05)
            taken = "Address already in use" in _tail(self.workdir / "slurmctld.log")
            if self._slurmctld.poll() is None or not taken or attempt == tries - 1:
                return  # listening late, or failing for another reason: _wait_idle says which
            self._slurmctld = None

    def _write_conf(self) -> int:
        """slurm.conf with a slurmctld port found free now: the port."""
        w = self.workdir
        (w / "state").mkdir(exist_ok=True)
        port = listen_port(self.controller_address)
        ctld = self.controller_address
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({ctld})",
            f"SlurmctldPort={port}",
            # Each node has a namespace (and so a port space) of its own.
            "SlurmdPort=6818",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={w / 'state'}",
            f"SlurmdSpoolDir={w / 'spool-%n'}",
            f"SlurmctldPidFile={w / 'slurmctld.pid'}",
            f"SlurmdPidFile={w / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={w / 'slurmctld.log'}",
            f"SlurmdLogFile={w / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "MailProg=/bin/true",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            # The configured CPUs and memory, not the machine's: nodes may claim more than it has.
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "KillWait=2",
            "InactiveLimit=0",
            "MinJobAge=600",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
        ]
        lines += [f"NodeName={n} NodeAddr={self.net.address(n)} NodeHostname={n} CPUs={self.cpus_per_node} "
                  f"RealMemory={self.memory_mb} State=UNKNOWN" for n in self.nodes]
        lines.append(f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        self.conf_path.write_text("\n".join(lines) + "\n")
        return port

    def _start_slurmd(self, node: str) -> subprocess.Popen:
        """slurmd in the node's namespace and a UTS namespace with the node's hostname.

        `ip netns exec` mounts a fresh /sys, hiding the cgroup tree slurmd insists on finding. So a
        mount namespace of the node's own binds the tree to a directory first and, once in the
        network namespace, back onto /sys/fs/cgroup. Those mounts live only in that mount
        namespace (a slave of the machine's, as `ip netns exec`'s are, so namespaces deleted
        outside are released inside too), which ends with the node's last process: nothing is
        left mounted outside.
        """
        (self.workdir / f"spool-{node}").mkdir()
        cg = self.workdir / f"cgroup-{node}"
        cg.mkdir()
        inner = (f"mount --rbind {shlex.quote(str(cg))} /sys/fs/cgroup && "
                 f"exec slurmd -D -N {shlex.quote(node)} -f {shlex.quote(str(self.conf_path))}")
        outer = (f"mount --rbind /sys/fs/cgroup {shlex.quote(str(cg))} && "
                 f"hostname {shlex.quote(node)} && "
                 f"exec {shlex.join(self.net.command(node, ['sh', '-c', inner]))}")
        return self._daemon(["unshare", "--mount", "--propagation", "slave", "--uts", "sh", "-c", outer],
                            f"slurmd-{node}.out")

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, p in [("slurmctld", self._slurmctld), *((f"slurmd-{n}", q) for n, q in self._slurmd.items())]:
                if p is not None and p.poll() is not None:
                    raise SlurmError(f"{name} exited ({p.returncode}) while the cluster started:\n{self._logs()}")
            out = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], check=False)
            states = dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line)
            if all(states.get(n, "").rstrip("*") == "idle" for n in self.nodes):
                return
            time.sleep(0.2)
        raise SlurmError(f"the nodes did not become idle in {timeout_s:.0f} s (sinfo: {states or 'no answer'}):\n"
                         f"{self._logs()}")

    def _logs(self) -> str:
        names = ["slurmctld.log", "slurmctld.out", *(f"slurmd-{n}.log" for n in self.nodes),
                 *(f"slurmd-{n}.out" for n in self.nodes)]
        return "\n".join(_tail(self.workdir / name) for name in names)

    # --- using it ---------------------------------------------------------------------------

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a client command (sbatch, srun, squeue, ...) of this cluster: its
        slurm.conf, which names the MUNGE socket, and none of the caller's own SLURM_ variables."""
        env = self._daemon_env()
        env["SLURM_CONF"] = str(self.conf_path)
        env.update(extra or {})
        return env

    def node_address(self, name: str) -> str:
        return self.net.address(name)

    @property
    def controller_address(self) -> str:
        """Where slurmctld listens: the root namespace's address on the nodes' bridge."""
        return self.net.bridge_address

    def run(self, argv: Sequence[str], *, check: bool = True, timeout_s: float = 60.0,
            env: Mapping[str, str] | None = None, **kwargs: object) -> subprocess.CompletedProcess:
        """Run client command `argv` in the root namespace (in the work directory, where
        sbatch's output lands by default)."""
        argv = [_which(argv[0]) or argv[0], *argv[1:]]
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        done = subprocess.run(argv, env=self.env(env), cwd=self.workdir, timeout=timeout_s, check=False, **kwargs)
        if check and done.returncode != 0:
            raise SlurmError(f"{shlex.join(argv)} exited {done.returncode}: {(done.stderr or '').strip()}")
        return done

    def sbatch(self, script: str | Path, *args: str) -> int:
        """Submit a batch job (a script's text, or a path to one) with sbatch `args`; its id."""
        if isinstance(script, Path):
            argv = ["sbatch", "--parsable", *args, str(script)]
            done = self.run(argv)
        else:
            done = self.run(["sbatch", "--parsable", *args], input=script)
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` of `job_id` as a dict (JobState, ExitCode, NodeList, ...)."""
        out = self.run(["scontrol", "show", "job", "--oneliner", str(job_id)]).stdout
        return parse_record(out.strip())

    def wait_job(self, job_id: int, timeout_s: float = 30.0) -> dict[str, str]:
        """Wait until `job_id` has ended; its record (ExitCode "3:0" is exit status 3, signal 0)."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.job(job_id)
            state = record.get("JobState", "")
            if state not in _NOT_ENDED:
                return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {state} after {timeout_s:.0f} s: {record}")
            time.sleep(0.2)

    def daemon_pids(self) -> list[int]:
        """The pids of this cluster's munged, slurmctld and slurmds (for checking nothing is left)."""
        procs = [self._munged, self._slurmctld, *self._slurmd.values()]
        return [p.pid for p in procs if p is not None]


def _stop(p: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    if p is None or p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)

