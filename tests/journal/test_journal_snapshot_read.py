"""A read of a session's log is one snapshot: a compaction between two of its pages (what a
`regent journal compact` racing a takeover does) is seen entirely or not at all."""

from __future__ import annotations

import pyetcd
import pytest

from regent.journal import Journal, JournalError, open_journal
from regent.journal.etcd_store import EtcdStore
from regent.journal.etcd_target import parse_etcd_url
from regent.journal.sqlite_store import SqliteStore

# More batches than the first page of either store holds (SQLite 512, etcd 64 then more).
_BATCHES = 600
_CHECKPOINT = 580


def _many_batches(journal: Journal, session: str):
    lead = journal.campaign(session, "primary")
    for lsn in range(_BATCHES):
        lead.append([("call", {"lsn": lsn})])
    lead.checkpoint({"state": _CHECKPOINT}, lsn=_CHECKPOINT)
    return lead


def test_a_compaction_between_two_pages_of_a_read_does_not_tear_it(
    journal: Journal, journal_url: str, session: str
):
    lead = _many_batches(journal, session)
    reading = journal.read(session)
    head = [next(reading).lsn for _ in range(10)]  # the first page is read
    with open_journal(journal_url) as other:
        assert other.compact(session, keep_before_lsn=1) == _CHECKPOINT - 1
    # The read goes on in the snapshot it began in: every record, no gap.
    assert head + [r.lsn for r in reading] == list(range(_BATCHES))
    # A read begun after the compaction sees it whole.
    assert [r.lsn for r in journal.read(session)] == [0, *range(_CHECKPOINT, _BATCHES)]
    assert journal.verify(session).ok
    lead.close()


def _etcd_revision(client: pyetcd.Etcd3Client) -> int:
    return client.get_response(b"/regent/").header.revision


@pytest.fixture
def own_etcd(fresh_etcd):
    """An etcd of this test's own: it compacts etcd's history, which others may still read."""
    host, port = fresh_etcd.address.split(":")
    client = pyetcd.client(host=host, port=int(port), timeout=5)
    yield fresh_etcd, client
    client.close()


@pytest.mark.slow
def test_an_etcd_read_goes_on_after_etcd_compacts_the_revision_it_was_reading_at(
    own_etcd, session: str
):
    server, client = own_etcd
    with open_journal(server.url) as journal:
        lead = _many_batches(journal, session)
        reading = journal.read(session)
        head = [next(reading).lsn for _ in range(10)]
        lead.append([("call", {"lsn": _BATCHES})])  # something newer for the read to find
        client.compact(_etcd_revision(client))
        assert head + [r.lsn for r in reading] == list(range(_BATCHES + 1))
        lead.close()


@pytest.mark.slow
def test_an_etcd_read_that_loses_its_revision_to_etcd_and_its_log_to_a_compaction_says_so(
    own_etcd, session: str
):
    server, client = own_etcd
    with open_journal(server.url) as journal:
        lead = _many_batches(journal, session)
        reading = journal.read(session)
        [next(reading) for _ in range(10)]
        with open_journal(server.url) as other:
            other.compact(session, keep_before_lsn=1)
        client.compact(_etcd_revision(client))
        with pytest.raises(JournalError, match="compacted while it was being read.*read it again"):
            list(reading)
        assert [r.lsn for r in journal.read(session)] == [0, *range(_CHECKPOINT, _BATCHES)]
        lead.close()


def _small_pages(url: str) -> Journal:
    """The store at `url` reading 4 batches per page: many page boundaries in a short log."""
    if url.startswith("sqlite://"):
        return Journal(SqliteStore(url.removeprefix("sqlite://"), read_page=4))
    return Journal(EtcdStore(parse_etcd_url(url), read_page=4))


def test_compactions_between_small_pages_never_tear_a_read(journal_url: str, session: str):
    with _small_pages(journal_url) as journal:
        lead = journal.campaign(session, "primary")
        for lsn in range(40):
            lead.append([("call", {"lsn": lsn})])
        for checkpoint in (10, 20, 30):
            lead.checkpoint({}, lsn=checkpoint)
            reading = journal.read(session, start_lsn=2)
            head = [next(reading).lsn for _ in range(5)]
            before = [r.lsn for r in journal.read(session, start_lsn=2)]
            with open_journal(journal_url) as other:
                assert other.compact(session, keep_before_lsn=1) > 0
            assert head + [r.lsn for r in reading] == before
        assert [r.lsn for r in journal.read(session)] == [0, *range(30, 40)]
        lead.close()
