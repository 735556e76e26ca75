"""Fixtures the failover tests share: a private etcd per module, and each test run once per
journal backend."""

from __future__ import annotations

import pytest

from tests.support.etcd import MISSING_REASON, EtcdServer, etcd_available


@pytest.fixture(scope="module")
def etcd():
    if not etcd_available():
        pytest.skip(MISSING_REASON)
    with EtcdServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "etcd"])
def journal_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'journal.db'}"
    return request.getfixturevalue("etcd").url
