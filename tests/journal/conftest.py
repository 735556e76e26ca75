"""Fixtures for the journal suite: both backends, a real etcd, raw access to stored bytes."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from regent.journal import Journal, open_journal  # noqa: E402
from tests.support.etcd import MISSING_REASON, EtcdServer, etcd_available  # noqa: E402
from tests.support.rawstore import RawStore  # noqa: E402


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    if not etcd_available():
        pytest.skip(MISSING_REASON)
    with EtcdServer() as server:
        yield server


@pytest.fixture
def fresh_etcd() -> Iterator[EtcdServer]:
    """An etcd of the test's own, for tests that stop or restart it."""
    if not etcd_available():
        pytest.skip(MISSING_REASON)
    with EtcdServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "etcd"])
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'journal.db'}"
    return request.getfixturevalue("etcd_server").url


@pytest.fixture
def journal(journal_url: str) -> Iterator[Journal]:
    j = open_journal(journal_url)
    yield j
    j.close()


@pytest.fixture
def session() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def raw(journal_url: str) -> Iterator[RawStore]:
    store = RawStore(journal_url)
    yield store
    store.close()
