"""TCP ports for servers that must be told theirs before they bind: etcd, Toxiproxy, a process
group's rendezvous. A port found free stays free only until someone else binds it. Where several
runs share a machine (parallel test workers), REGENT_PORT_RANGE="LO-HI" gives each run a range
of its own below the kernel's ephemeral range, so that neither another run nor an outgoing
connection's local port can take a port between its choice and its bind.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from pathlib import Path

__all__ = ["ENV_PORT_RANGE", "free_port", "listen_port", "port_range"]

ENV_PORT_RANGE = "REGENT_PORT_RANGE"
_HOLD_S = 60.0  # a port handed out is not handed out again by this process for this long
_LOWEST = 10000  # listen_port's floor without REGENT_PORT_RANGE (well-known and registered ports below)
_given: dict[int, float] = {}
_lock = threading.Lock()


def port_range() -> range | None:
    """The ports REGENT_PORT_RANGE ("LO-HI", both included) allows, or None where it is unset."""
    text = os.environ.get(ENV_PORT_RANGE, "").strip()
    if not text:
        return None
    lo, sep, hi = text.partition("-")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit() or not 0 < int(lo) <= int(hi) < 65536:
        raise ValueError(f"{ENV_PORT_RANGE}={text!r} is not a port range: write LO-HI, e.g. 20000-20999")
    return range(int(lo), int(hi) + 1)


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, from REGENT_PORT_RANGE when it is set (never one this
    process handed out in the last minute), else one the kernel picks."""
    ports = port_range()
    if ports is None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    return _pick(host, ports, f"{ENV_PORT_RANGE}={os.environ[ENV_PORT_RANGE]}")


def listen_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now for a listener that closes and opens again on it (a proxy
    taken down and brought back, a daemon restarted): from REGENT_PORT_RANGE when it is set, else
    below the kernel's ephemeral range. A port from that range can become the local port of any
    outgoing connection while the listener is closed (a client reconnecting to it can even
    connect to itself), and the listener cannot open again."""
    ports = port_range()
    if ports is not None:
        return free_port(host)
    top = _ephemeral_low()
    if top is None or top <= _LOWEST + 1000:
        return free_port(host)
    return _pick(host, range(_LOWEST, top), f"ports {_LOWEST}-{top - 1} (below the ephemeral range)")


def _ephemeral_low() -> int | None:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _pick(host: str, ports: range, where: str) -> int:
    """A port of `ports` bindable on `host` now, not handed out by this process in the last minute."""
    with _lock:
        now = time.monotonic()
        for port in [p for p, at in _given.items() if now - at > _HOLD_S]:
            del _given[port]
        start = random.randrange(len(ports))
        for k in range(len(ports)):
            port = ports[(start + k) % len(ports)]
            if port not in _given and _bindable(host, port):
                _given[port] = now
                return port
    raise OSError(f"no free TCP port on {host} in {where}: widen REGENT_PORT_RANGE, or unset it "
                  "to let the kernel choose")
