"""Fixtures for the replicated-journal suite: a 3-member etcd, one member per namespace host."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from regent.chaos.etcd_cluster import EtcdCluster  # noqa: E402
from regent.chaos.netns import NamespaceHosts  # noqa: E402
from tests.support.etcd import skip_unless_namespace_hosts_and_etcd  # noqa: E402


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    skip_unless_namespace_hosts_and_etcd()
    net = NamespaceHosts(["e1", "e2", "e3"]).create()
    cluster = EtcdCluster(net, ["e1", "e2", "e3"], tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        net.close()
