"""Links of a running controller routed through Toxiproxy: the `links=` hook of Session.

A controller given `ProxiedLinks` dials every worker through a proxy named for the
link ("controller->proc/<port>", "controller->host/<port>") and has workers reply
through one of its own ("proc->controller/<port>"). Proxies are created on first use
and shared by every controller of a session, so a standby that takes over talks over
the same, already poisoned, link. The proxies are plain Toxiproxy state: the process
that runs the chaos schedule adopts them by name (`ChaosNet.adopt`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable

from regent.chaos.toxiproxy import ToxiproxyClient, ToxiproxyError

__all__ = ["ENV_TOXIPROXY", "ProxiedLinks", "links_from_env", "proxy_name"]

ENV_TOXIPROXY = "REGENT_CHAOS_TOXIPROXY"  # the Toxiproxy API url a controller should route through

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_TCP = re.compile(r"^tcp://127\.0\.0\.1:(\d+)$")


def proxy_name(link: str) -> str:
    """The Toxiproxy name of a link (Toxiproxy cannot route '/'), as ChaosNet maps it."""
    return _UNSAFE.sub("_", link)


def _local_host_address() -> str | None:
    """The host agent's inbox on this machine, from $REGENT_HOME/host.json."""
    from regent.wire.security import regent_home

    try:
        return json.loads((regent_home() / "host.json").read_text())["address"]
    except (OSError, ValueError, KeyError):
        return None


class ProxiedLinks:
    """connect(addr) / advertise(addr) for `Session(links=...)`, over one Toxiproxy server.

    Only loopback tcp addresses are proxied; anything else is returned unchanged.
    `host_address` says which address is the host agent's (default: this machine's).
    """

    def __init__(self, api: ToxiproxyClient | str,
                 host_address: Callable[[], str | None] = _local_host_address) -> None:
        self.api = ToxiproxyClient(api) if isinstance(api, str) else api
        self.host_address = host_address
        self.routes: dict[str, str] = {}  # link name -> proxied address

    def connect(self, addr: str) -> str:
        m = _TCP.match(addr)
        if not m:
            return addr
        role = "host" if addr == self.host_address() else "proc"
        return self._route(f"controller->{role}/{m.group(1)}", addr)

    def advertise(self, addr: str) -> str:
        m = _TCP.match(addr)
        if not m:
            return addr
        return self._route(f"proc->controller/{m.group(1)}", addr)

    def _route(self, link: str, addr: str) -> str:
        upstream = addr.removeprefix("tcp://")
        name = proxy_name(link)
        try:
            proxy = self.api.create_proxy(name, upstream)
        except ToxiproxyError as e:
            if e.status != 409:  # another controller of the session created it first
                raise
            proxy = self.api.proxy(name)
        routed = f"tcp://{proxy.listen}"
        self.routes[link] = routed
        return routed


def links_from_env() -> ProxiedLinks | None:
    """ProxiedLinks when $REGENT_CHAOS_TOXIPROXY names a Toxiproxy API, else None."""
    url = os.environ.get(ENV_TOXIPROXY)
    return ProxiedLinks(url) if url else None
