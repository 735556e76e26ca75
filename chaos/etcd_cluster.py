"""A replicated etcd: one member per namespace host (chaos.netns), as root. The journal's
production store is a cluster of members, not one; this is the one its tests and chaos runs
use. Members listen on their hosts' addresses (client 2379, peer 2380: each host has its own
address, so the ports are free), keep their data in a directory of their own across restarts,
and are killed, restarted and partitioned one by one.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import structlog

from regent.chaos.etcd import etcd_binary
from regent.chaos.netns import NamespaceHosts

log = structlog.get_logger("regent.chaos.etcd")

CLIENT_PORT = 2379
PEER_PORT = 2380


class EtcdCluster:
    """Members `members` (host names of `net`), started together as a new cluster."""

    def __init__(self, net: NamespaceHosts, members: list[str], workdir: Path, startup_timeout_s: float = 30.0):
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not on PATH: install it with scripts/install_etcd.sh")
        self.binary = binary
        self.net = net
        self.members = list(members)
        self.workdir = workdir
        self.startup_timeout_s = startup_timeout_s
        self.procs: dict[str, subprocess.Popen] = {}
        self._reaped: set[str] = set()  # members seen dead and not started since
        # reap() runs on a monitor thread and start_member() on a restart thread: without the
        # lock, a reap between forgetting a member and starting it marks the new process dead
        # for good, and that member's next death goes unseen.
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The journal url naming every member."""
        return "etcd://" + ",".join(f"{self.net.address(m)}:{CLIENT_PORT}" for m in self.members)

    def _command(self, member: str) -> list[str]:
        ip = self.net.address(member)
        peers = ",".join(f"{m}=http://{self.net.address(m)}:{PEER_PORT}" for m in self.members)
        return [
            self.binary, "--name", member, "--data-dir", str(self.workdir / f"etcd-{member}"),
            "--listen-client-urls", f"http://{ip}:{CLIENT_PORT}", "--advertise-client-urls", f"http://{ip}:{CLIENT_PORT}",
            "--listen-peer-urls", f"http://{ip}:{PEER_PORT}", "--initial-advertise-peer-urls", f"http://{ip}:{PEER_PORT}",
            "--initial-cluster", peers, "--initial-cluster-state", "new", "--initial-cluster-token", self.net.tag,
            "--log-level", "warn", "--logger", "zap",
        ]  # fmt: skip

    def start(self) -> EtcdCluster:
        for m in self.members:
            self.start_member(m, wait=False)
        self.wait_healthy()
        return self

    def start_member(self, member: str, *, wait: bool = True) -> None:
        """Start (or restart, from its data directory) one member."""
        with self._lock:
            if member in self.procs and self.procs[member].poll() is None:
                return
            self.procs[member] = self.net.popen(member, self._command(member),
                                                log_path=self.workdir / f"etcd-{member}.log")
            self._reaped.discard(member)
        if wait:
            self.wait_healthy([member])

    def wait_healthy(self, members: list[str] | None = None) -> None:
        """Until each member answers /health with a leader elected."""
        deadline = time.monotonic() + self.startup_timeout_s
        for m in members or self.members:
            while not self._healthy(m):
                if self.procs[m].poll() is not None or time.monotonic() > deadline:
                    tail = (self.workdir / f"etcd-{m}.log").read_text()[-2000:]
                    raise RuntimeError(f"etcd member {m} is not healthy:\n{tail}")
                time.sleep(0.1)

    def _healthy(self, member: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.net.address(member)}:{CLIENT_PORT}/health", timeout=1) as r:
                return b'"health":"true"' in r.read()
        except OSError:
            return False

    def _status(self, member: str) -> dict | None:
        req = urllib.request.Request(f"http://{self.net.address(member)}:{CLIENT_PORT}/v3/maintenance/status",
                                     data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=1) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def leader(self, timeout: float = 10.0) -> str:
        """The member that leads now (as the members that answer agree)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = {}
            for m in self.members:
                st = self._status(m)
                if st and "header" in st:
                    ids[st["header"]["member_id"]] = m
                    if st.get("leader") == st["header"]["member_id"]:
                        return m
            time.sleep(0.1)
        raise TimeoutError(f"no etcd member leads after {timeout:g} s")

    def reap(self) -> bool:
        """True once for each member found dead since it was last started."""
        with self._lock:
            dead = {m for m, p in self.procs.items() if p.poll() is not None} - self._reaped
            self._reaped |= dead
        return bool(dead)

    def pid(self, member: str) -> int | None:
        p = self.procs.get(member)
        return p.pid if p is not None and p.poll() is None else None

    def term(self) -> int:
        """The highest raft term a member reports now (each election starts a new one)."""
        return max((int(st.get("raftTerm", 0)) for m in self.members if (st := self._status(m))), default=0)

    def kill(self, member: str) -> None:
        """SIGKILL one member (its data stays)."""
        p = self.procs.get(member)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        log.info("etcd member killed", member=member)

    def partition(self, member: str) -> None:
        """Cut one member off from every other host (the controller's included)."""
        self.net.link_down(member)

    def heal(self, member: str) -> None:
        self.net.link_up(member)

    def close(self) -> None:
        for m in self.members:
            self.kill(m)
            shutil.rmtree(self.workdir / f"etcd-{m}", ignore_errors=True)
