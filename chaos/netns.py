"""Hosts as Linux network namespaces on a private bridge (as root), for tests and chaos runs.

Each host is a namespace with its own loopback and one veth whose peer is on a bridge in the
root namespace; the bridge has the subnet's first address, so the store can run in the root
namespace on it. Everything is named with a random tag and removed by `close()`, including
every process still running in the namespaces. Only the private subnet chosen here is ever
addressed. Cutting a host's link (`link_down`) is a partition of that host from all others.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
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


def netem_unavailable_reason() -> str | None:
    """Why `NamespaceHosts.netem` cannot work here (no tc, or a kernel built without
    sch_netem, as some VM kernels are), or None."""
    if shutil.which("tc") is None:
        return "tc (iproute2) is not installed"
    probe = f"rgnetem{os.getpid()}"
    if _ip("netns", "add", probe, check=False).returncode != 0:
        return "cannot make a namespace to try netem in"
    try:
        r = subprocess.run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return f"this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM; tc says: {r.stderr.strip()})"
        return None
    finally:
        _ip("netns", "del", probe, check=False)


def nft_unavailable_reason() -> str | None:
    """Why blocks and partitions cannot be made here (they use nftables), or None."""
    if shutil.which("nft") is None:
        return "nftables' nft is not installed (apt-get install nftables; scripts/install_netns_tools.sh)"
    return None


def _check_pct(pct: float) -> None:
    if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 <= pct <= 100:
        raise ValueError(f"{pct!r} is not a percentage (0-100)")


def _combined(pcts: list[float]) -> float:
    """The % of packets hit when independent faults each hit `pcts` %."""
    miss = 1.0
    for p in pcts:
        miss *= 1 - p / 100
    return 100 * (1 - miss)


def _used_subnets() -> set[str]:
    out = _ip("-4", "-o", "addr", "show", check=False).stdout
    return {".".join(word.split("/")[0].split(".")[:3]) for line in out.splitlines()
            for word in line.split() if word.count(".") == 3 and "/" in word}


_LOCK = "/run/lock/regent-netns.lock"


def _free_prefix() -> str:
    """A private /24 (as its first three octets) that no interface here has an address in."""
    used = _used_subnets()
    while (prefix := f"10.{random.randrange(200, 250)}.{random.randrange(1, 255)}") in used:
        pass
    return prefix


def _tag_taken(tag: str) -> bool:
    if _ip("link", "show", f"{tag}br", check=False).returncode == 0:
        return True
    return any(p.name.startswith(f"{tag}-") for p in Path("/run/netns").glob("*"))


class NamespaceHosts:
    """Hosts `names` as namespaces on a private /24 bridge: host i gets address .(10+i)."""

    def __init__(self, names: Sequence[str]):
        if not names or len(names) > 200 or len(set(names)) != len(names):
            raise ValueError(f"host names must be 1-200 distinct names, got {list(names)}")
        self.names = list(names)
        # Drawn again in create(), under a machine-wide lock, should another run have taken them.
        self.tag = f"rg{random.randrange(16**4):04x}"
        self.prefix = _free_prefix()
        self.bridge = f"{self.tag}br"
        self._made: list[str] = []  # namespaces made so far
        self._bridge_made = False
        self._procs: list[subprocess.Popen] = []
        self._blocked: Counter[tuple[str, str]] = Counter()  # (src, dst) -> faults dropping src's packets at dst
        self._loss: dict[str, list[float]] = {}  # host -> the % of arriving packets each fault drops
        self._dup: dict[str, list[float]] = {}  # host -> the % of sent packets each fault duplicates

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
            # Parallel test workers and chaos runs make hosts at once: choosing a tag and a subnet
            # and taking them (the bridge, its address) is one step under a lock.
            with open(_LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                while _tag_taken(self.tag):
                    self.tag = f"rg{random.randrange(16**4):04x}"
                if self.prefix in _used_subnets():
                    self.prefix = _free_prefix()
                self.bridge = f"{self.tag}br"
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

    # --- packet-level faults (tc netem; nftables drops and duplicates), inside the namespaces -

    def netem(self, name: str, *, delay_ms: float = 0, jitter_ms: float = 0, loss_pct: float = 0,
              duplicate_pct: float = 0, reorder_pct: float = 0, corrupt_pct: float = 0) -> None:
        """Shape every packet host `name` sends with the kernel's netem (replacing what was
        set): delay with jitter, loss, duplication, reordering (of delayed packets) and
        corruption, as percentages of packets."""
        args: list[str] = []
        if delay_ms or jitter_ms or reorder_pct:
            args += ["delay", f"{delay_ms or 1}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
        for key, pct in (("loss", loss_pct), ("duplicate", duplicate_pct), ("reorder", reorder_pct),
                         ("corrupt", corrupt_pct)):
            if not 0 <= pct <= 100:
                raise ValueError(f"{key} {pct}% is not a percentage")
            if pct:
                args += [key, f"{pct}%"]
        if not args:
            raise ValueError("netem needs at least one of delay, jitter, loss, duplicate, reorder, corrupt")
        r = subprocess.run(["tc", "-n", self.netns(name), "qdisc", "replace", "dev", "eth0", "root", "netem", *args],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise NetnsUnavailable(f"tc netem on host {name} failed: {r.stderr.strip()} "
                                   f"({netem_unavailable_reason() or 'check the arguments'})")

    def clear_netem(self, name: str) -> None:
        subprocess.run(["tc", "-n", self.netns(name), "qdisc", "del", "dev", "eth0", "root"],
                       check=False, capture_output=True)

    # Faults that overlap are counted: a pair blocked by two partitions is unblocked when the
    # second ends, and loss or duplication from several faults on one host adds up.

    def block(self, src: str, dst: str) -> None:
        """Silently drop what `src` sends to `dst` (nftables at `dst`'s input): one way, so
        `dst` still reaches `src`, though a TCP connection either way stalls, its answers lost."""
        self.block_pairs([(src, dst)])

    def unblock(self, src: str, dst: str) -> None:
        self.unblock_pairs([(src, dst)])

    def block_pairs(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Drop what each `src` sends to its `dst`; each pair stays blocked until unblocked as
        many times as it was blocked."""
        for src, dst in pairs:
            self._check(src, dst)
            self._blocked[(src, dst)] += 1
        self._refilter({dst for _, dst in pairs})

    def unblock_pairs(self, pairs: Sequence[tuple[str, str]]) -> None:
        for pair in pairs:
            if self._blocked[pair] > 0:
                self._blocked[pair] -= 1
            if self._blocked[pair] == 0:
                del self._blocked[pair]
        self._refilter({dst for _, dst in pairs})

    @staticmethod
    def partition_pairs(*groups: Sequence[str]) -> list[tuple[str, str]]:
        """The (src, dst) pairs a partition into `groups` blocks: every pair across groups, both ways."""
        pairs = []
        for i, a in enumerate(groups):
            for b in groups[i + 1:]:
                pairs += [(x, y) for x in a for y in b if x != y] + [(y, x) for x in a for y in b if x != y]
        return pairs

    def partition(self, *groups: Sequence[str]) -> list[tuple[str, str]]:
        """Split the hosts into `groups` that reach each other within a group only (both ways);
        hosts named in no group keep reaching everyone. Returns the pairs it blocked, which
        `unblock_pairs` undoes."""
        pairs = self.partition_pairs(*groups)
        self.block_pairs(pairs)
        return pairs

    def drop(self, name: str, pct: float) -> None:
        """Drop `pct`% of the packets arriving at host `name`, at random, replacing what
        `add_loss` set there (0 stops it): loss without netem, for kernels that lack it."""
        _check_pct(pct)
        self._check(name)
        self._loss[name] = [pct] if pct else []
        self._refilter({name})

    def add_loss(self, name: str, pct: float) -> None:
        """Drop `pct`% more of the packets arriving at `name` (until `remove_loss`)."""
        _check_pct(pct)
        self._check(name)
        self._loss.setdefault(name, []).append(pct)
        self._refilter({name})

    def remove_loss(self, name: str, pct: float) -> None:
        if pct in self._loss.get(name, []):
            self._loss[name].remove(pct)
        self._refilter({name})

    def add_duplicate(self, name: str, pct: float) -> None:
        """Send a second copy of `pct`% of the packets host `name` sends to the other hosts
        (nftables `dup`, at its output), until `remove_duplicate`."""
        _check_pct(pct)
        self._check(name)
        self._dup.setdefault(name, []).append(pct)
        self._refilter({name})

    def remove_duplicate(self, name: str, pct: float) -> None:
        if pct in self._dup.get(name, []):
            self._dup[name].remove(pct)
        self._refilter({name})

    def heal(self) -> None:
        """Remove every block, partition, loss, duplication and netem setting."""
        touched = {dst for _, dst in self._blocked} | set(self._loss) | set(self._dup)
        self._blocked.clear()
        self._loss.clear()
        self._dup.clear()
        self._refilter(touched)
        for name in self.names:
            self.clear_netem(name)

    def _check(self, *names: str) -> None:
        for name in names:
            if name not in self.names:
                raise ValueError(f"no namespace host named {name!r}; hosts: {', '.join(self.names)}")

    def _refilter(self, names: set[str]) -> None:
        for name in sorted(names):
            self._filter(name)

    def _filter(self, name: str) -> None:
        """Rewrite host `name`'s filter from what is blocked, dropped and duplicated there."""
        reason = nft_unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        rules = [f"input ip saddr {self.address(src)} drop"
                 for src in sorted(s for s, d in self._blocked if d == name)]
        loss = _combined(self._loss.get(name, []))
        if loss >= 100:
            rules.append("input iifname \"eth0\" drop")
        elif loss:
            rules.append(f"input iifname \"eth0\" numgen random mod 1000 < {round(loss * 10)} drop")
        dup = _combined(self._dup.get(name, []))
        if dup:
            rules += [f"output ip daddr {self.address(other)} "
                      + (f"numgen random mod 1000 < {round(dup * 10)} " if dup < 100 else "")
                      + f"dup to {self.address(other)} device eth0" for other in self.names if other != name]
        script = ("table ip regent {\n"
                  " chain input {\n  type filter hook input priority 0; policy accept;\n }\n"
                  " chain output {\n  type filter hook output priority 0; policy accept;\n }\n}\n"
                  "flush chain ip regent input\nflush chain ip regent output\n"
                  + "".join(f"add rule ip regent {r}\n" for r in rules))
        r = subprocess.run(self.command(name, ["nft", "-f", "-"]), input=script, capture_output=True, text=True)
        if r.returncode != 0:
            raise NetnsUnavailable(f"nft on host {name} failed: {r.stderr.strip()}")

    def link_down(self, name: str) -> None:
        """Cut host `name` off from every other (its cable pulled); processes keep running."""
        _ip("link", "set", self._veth(name), "down")

    def link_up(self, name: str) -> None:
        _ip("link", "set", self._veth(name), "up")
