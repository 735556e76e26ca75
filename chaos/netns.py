"""Hosts as Linux network namespaces on a private bridge (as root), for tests and chaos runs.

Each host is a namespace with its own loopback and one veth whose peer is on a bridge in the
root namespace; the bridge has the subnet's first address, so the store can run in the root
namespace on it. Everything is named with a random tag and removed by `close()`, including
every process still running in the namespaces. Only the private subnet chosen here is ever
addressed. Cutting a host's link (`link_down`) is a partition of that host from all others.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

log = structlog.get_logger("regent.chaos.netns")


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no iproute2, or the kernel refuses)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable_reason() -> str | None:
    """Why namespace hosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network-namespace hosts need root (ip netns add)"
    if shutil.which("ip") is None:
        return "network-namespace hosts need iproute2's `ip` (apt-get install iproute2)"
    probe = f"rgprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _used_subnets() -> set[str]:
    out = _ip("-4", "-o", "addr", "show", check=False).stdout
    return {".".join(word.split("/")[0].split(".")[:3]) for line in out.splitlines()
            for word in line.split() if word.count(".") == 3 and "/" in word}


class NamespaceHosts:
    """Hosts `names` as namespaces on a private /24 bridge: host i gets address .(10+i)."""

    def __init__(self, names: Sequence[str]):
        if not names or len(names) > 200 or len(set(names)) != len(names):
            raise ValueError(f"host names must be 1-200 distinct names, got {list(names)}")
        self.names = list(names)
        self.tag = f"rg{random.randrange(16**4):04x}"
        used = _used_subnets()
        while (prefix := f"10.{random.randrange(200, 250)}.{random.randrange(1, 255)}") in used:
            pass
        self.prefix = prefix
        self.bridge = f"{self.tag}br"
        self._made: list[str] = []  # namespaces made so far
        self._bridge_made = False
        self._procs: list[subprocess.Popen] = []

    # --- addresses --------------------------------------------------------------------------

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the bridge (where the store listens)."""
        return f"{self.prefix}.1"

    def address(self, name: str) -> str:
        return f"{self.prefix}.{10 + self.names.index(name)}"

    def netns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def _veth(self, name: str) -> str:
        return f"{self.tag}v{self.names.index(name)}"

    # --- making and removing ----------------------------------------------------------------

    def create(self) -> NamespaceHosts:
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._bridge_made = True
            _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name in self.names:
                ns, veth = self.netns(name), self._veth(name)
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", veth, "master", self.bridge, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except subprocess.CalledProcessError as e:
            self.close()
            raise NetnsUnavailable(f"could not make namespace hosts: {' '.join(e.cmd)}: {e.stderr.strip()}") from e
        log.info("namespace hosts made", hosts=self.names, subnet=f"{self.prefix}.0/24", bridge=self.bridge)
        return self

    def close(self) -> None:
        """Kill what runs in the namespaces, remove them and the bridge."""
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for ns in self._made:
            self._kill_in(ns, signal.SIGKILL)
        for p in self._procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                log.warning("a process in a namespace host did not exit", pid=p.pid)
        for ns in self._made:
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        if self._bridge_made:
            _ip("link", "del", self.bridge, check=False)
            self._bridge_made = False

    def __enter__(self) -> NamespaceHosts:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- running things there ---------------------------------------------------------------

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns(name), *argv]

    def popen(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              log_path: Path | None = None, **kwargs: object) -> subprocess.Popen:
        """Start `argv` in host `name` (its output to `log_path` if given); it is killed by close()."""
        out = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
        kwargs.setdefault("stdout", out)
        kwargs.setdefault("stderr", subprocess.STDOUT if log_path is not None else subprocess.DEVNULL)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        try:
            p = subprocess.Popen(self.command(name, argv), env=dict(env) if env is not None else None, **kwargs)
        finally:
            if log_path is not None:
                out.close()
        self._procs.append(p)
        return p

    def pids(self, name: str) -> list[int]:
        return self._pids_in(self.netns(name))

    @staticmethod
    def _pids_in(ns: str) -> list[int]:
        out = _ip("netns", "pids", ns, check=False).stdout
        return [int(w) for w in out.split() if w.isdigit()]

    def _kill_in(self, ns: str, sig: int) -> list[int]:
        pids = self._pids_in(ns)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def kill_host(self, name: str, sig: int = signal.SIGKILL, settle_s: float = 5.0) -> list[int]:
        """Send `sig` to every process in host `name` (SIGKILL: the machine dies); the pids."""
        pids = self._kill_in(self.netns(name), sig)
        deadline = time.monotonic() + settle_s
        while sig == signal.SIGKILL and self.pids(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        return pids

    def link_down(self, name: str) -> None:
        """Cut host `name` off from every other (its cable pulled); processes keep running."""
        _ip("link", "set", self._veth(name), "down")

    def link_up(self, name: str) -> None:
        _ip("link", "set", self._veth(name), "up")
