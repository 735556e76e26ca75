"""The etcd tests run against: chaos's LocalEtcd (free loopback ports, a temporary data dir,
kill/stop/pause/restart, TLS and user auth), with what suites need around it: a skip reason
when etcd is not installed, and ports to find free or hold taken.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

from regent.chaos.etcd import LocalEtcd as EtcdServer
from regent.chaos.etcd import etcd_binary
from regent.hipcore import ports

__all__ = ["MISSING_REASON", "EtcdServer", "etcd_available", "free_port", "held_port",
           "skip_unless_namespace_hosts_and_etcd"]

MISSING_REASON = (
    "etcd is not on PATH; install it with scripts/install_etcd.sh (or set REGENT_ETCD to its path)"
)


def etcd_available() -> bool:
    return etcd_binary() is not None


def free_port() -> int:
    """A loopback port free now, from this test worker's own range (hipcore.ports)."""
    return ports.free_port("127.0.0.1")


@contextlib.contextmanager
def held_port(port: int) -> Iterator[None]:
    """Keep a loopback port bound and listening: what another process grabbing it looks like."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield


def skip_unless_namespace_hosts_and_etcd() -> None:
    """Skip the calling test, with the reason, where namespace hosts (root, iproute2) or etcd
    are missing."""
    import pytest

    from regent.chaos.netns import unavailable_reason

    reason = unavailable_reason() or (None if etcd_available() else MISSING_REASON)
    if reason:
        pytest.skip(reason)
