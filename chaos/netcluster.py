"""A multi-host cluster on one machine (as root), for tests, benchmarks and chaos runs:
namespace hosts on a private bridge (chaos.netns), etcd on the bridge address in the root
namespace (or a replicated etcd, one member per host of its own: chaos.etcd_cluster), and one
`regent host --cluster` agent per agent host. Every host has a REGENT_HOME
of its own holding a copy of the cluster's CURVE keys, as separate machines would.
Controllers run either in a namespace host of their own (`popen`) or in the calling process,
reaching the hosts through the bridge (`controller_env`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psutil

from regent.chaos.etcd import LocalEtcd
from regent.chaos.etcd_cluster import EtcdCluster
from regent.chaos.netns import NamespaceHosts
from regent.journal import open_journal
from regent.journal.hosts import HostRecord, registered_hosts

# The folder that holds regent/ (a checkout, or site-packages): every host's processes import it.
REPO = Path(str(sys.modules["regent"].__file__)).resolve().parents[1]
HOST_TTL_S = 2.0
_HOST_TUNING = ("REGENT_FORK", "REGENT_PRELOAD", "REGENT_BULK_BYTES")  # passed on to the hosts' agents


class MultiHost:
    """`agents` hosts running a cluster agent each, and `controllers` hosts with none."""

    def __init__(self, workdir: Path, agents: list[str], controllers: list[str], cluster: str = "mh",
                 host_ttl_s: float = HOST_TTL_S, etcd_members: list[str] | None = None):
        self.workdir = workdir
        self.agents = agents
        self.controllers = controllers
        self.etcd_members = list(etcd_members or [])
        self.cluster = cluster
        self.net = NamespaceHosts(agents + controllers + self.etcd_members)
        self.host_ttl_s = host_ttl_s
        self.etcd: LocalEtcd | EtcdCluster | None = None
        self.agent_procs: dict[str, subprocess.Popen] = {}
        self._journal = None

    # --- making it ---------------------------------------------------------------------------

    def start(self) -> MultiHost:
        self.net.create()
        try:
            if self.etcd_members:
                self.etcd = EtcdCluster(self.net, self.etcd_members, self.workdir).start()
            else:
                self.etcd = LocalEtcd(host=self.net.bridge_address).start()
            keys = self.workdir / "keys-home"
            keys.mkdir(mode=0o700)
            subprocess.run([sys.executable, "-m", "regent.cli", "keys", "init"], check=True, capture_output=True,
                           env={**os.environ, "REGENT_HOME": str(keys)})
            for name in self.agents + self.controllers + ["root"]:
                home = self.home(name)
                home.mkdir(mode=0o700)
                shutil.copytree(keys / "keys", home / "keys")
            self._journal = open_journal(self.url)
            for name in self.agents:
                self.start_agent(name)
            self.wait_registered(len(self.agents))
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
        if isinstance(self.etcd, EtcdCluster):
            self.etcd.close()  # its members run in the namespaces
        self.net.close()
        if isinstance(self.etcd, LocalEtcd):
            self.etcd.close()

    # --- where things are -------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self.etcd is not None
        return self.etcd.url

    def home(self, name: str) -> Path:
        return self.workdir / f"home-{name}"

    def address(self, name: str) -> str:
        return self.net.address(name)

    def env(self, name: str, **extra: str) -> dict[str, str]:
        """The environment of a process on host `name`."""
        # This process's regent settings stay here, but for how hosts start and feed their procs.
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGENT_") or k in _HOST_TUNING}
        env.update({
            "REGENT_HOME": str(self.home(name)), "REGENT_SECURE": "1", "REGENT_HIPCORE_BACKEND": "cpu",
            "REGENT_CLUSTER": self.cluster, "REGENT_JOURNAL": self.url, "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        })
        env.update(extra)
        return env

    @contextmanager
    def controller_env(self) -> Iterator[None]:
        """While active, Sessions made in this (root namespace) process are controllers on the
        bridge address, with the cluster's keys."""
        saved = dict(os.environ)
        os.environ.update(self.env("root", REGENT_ADVERTISE=self.net.bridge_address))
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)

    # --- agents -----------------------------------------------------------------------------

    def start_agent(self, name: str) -> subprocess.Popen:
        argv = [sys.executable, "-m", "regent.cli", "host", "--cluster", self.cluster, "--store", self.url,
                "--advertise", self.address(name), "--name", name, "--ttl", str(self.host_ttl_s)]
        p = self.net.popen(name, argv, env=self.env(name), log_path=self.workdir / f"agent-{name}.log")
        self.agent_procs[name] = p
        return p

    def agent_pid(self, name: str) -> int | None:
        """The agent running in host `name` now (its procs start a new one should it die)."""
        for pid in self.net.pids(name):
            try:
                argv = psutil.Process(pid).cmdline()
            except psutil.Error:
                continue
            if "host" in argv and "--cluster" in argv and "regent.cli" in argv:
                return pid
        return None

    def ensure_agents(self) -> None:
        """Start an agent on each agent host that has none (after a run that killed one)."""
        for name in self.agents:
            if self.agent_pid(name) is None:
                self.start_agent(name)
        self.wait_registered(len(self.agents))

    def hosts(self) -> list[HostRecord]:
        return registered_hosts(self._journal.backend, self.cluster)

    def wait_registered(self, n: int, timeout: float = 30.0, *, new_incarnation_of: HostRecord | None = None) -> list[HostRecord]:
        deadline = time.monotonic() + timeout
        while True:
            hosts = self.hosts()
            fresh = new_incarnation_of is None or any(
                h.id == new_incarnation_of.id and h.incarnation != new_incarnation_of.incarnation for h in hosts)
            if len(hosts) >= n and fresh:
                return hosts
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in self.workdir.glob("agent-*.log"))
                raise TimeoutError(f"{len(hosts)} of {n} hosts registered after {timeout:g} s\n{logs}")
            time.sleep(0.1)

    def popen(self, name: str, argv: list[str], env: Mapping[str, str] | None = None, **kwargs: object) -> subprocess.Popen:
        return self.net.popen(name, argv, env=env or self.env(name), **kwargs)

    def netns_inode(self, name: str) -> int:
        """What os.stat("/proc/self/ns/net").st_ino reads in host `name`."""
        return os.stat(f"/run/netns/{self.net.netns(name)}").st_ino
