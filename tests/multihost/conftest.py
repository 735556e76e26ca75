"""Fixtures for the multi-host suite: namespace hosts with etcd and cluster agents (as root)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from regent.chaos.netcluster import HOST_TTL_S, MultiHost  # noqa: E402
from tests.support.etcd import skip_unless_namespace_hosts_and_etcd  # noqa: E402


@pytest.fixture
def multihost(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MultiHost]:
    """Three agent hosts (h1-h3) and two controller hosts (c1, c2), each a namespace. The hosts'
    lease TTL is HOST_TTL_S, or the parameter of an indirect parametrization."""
    skip_unless_namespace_hosts_and_etcd()
    ttl = getattr(request, "param", HOST_TTL_S)
    cluster = MultiHost(tmp_path, ["h1", "h2", "h3"], ["c1", "c2"], host_ttl_s=ttl).start()
    try:
        yield cluster
    finally:
        cluster.close()
