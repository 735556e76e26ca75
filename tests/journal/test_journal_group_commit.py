"""GroupCommitWriter: lsn order is submit order, durability is waited for, failures reach everyone."""

from __future__ import annotations

import threading
import time

import pytest

from regent.journal import GroupCommitWriter, Journal, JournalError, LeadershipLost, RecordTooLarge
from regent.journal.group_commit import GROUP_ITEMS


def _in_threads(n: int, produce) -> None:
    threads = [threading.Thread(target=produce, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def test_lsns_follow_submit_order_and_everything_flushed_is_readable(
    journal: Journal, session: str
):
    lead = journal.campaign(session, "a")
    lead.append([("spawn", {})])
    with GroupCommitWriter(lead, max_batch=64) as writer:
        lsns = [writer.submit("call", {"i": i}) for i in range(3000)]
        assert lsns == list(range(1, 3001))
        assert writer.flush() == 3000
        assert writer.durable_lsn == 3000
    records = list(journal.read(session))
    assert [r.lsn for r in records] == list(range(3001))
    assert [r.data["i"] for r in records[1:]] == list(range(3000))
    assert lead.next_lsn == 3001
    lead.close()


def test_wait_durable_returns_once_the_record_can_be_read_back(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    # A long linger proves wait_durable cuts it short instead of waiting it out.
    with GroupCommitWriter(lead, max_delay_s=30.0) as writer:
        writer.submit("call", {"i": 0})
        lsn = writer.submit("observation", {"now": 1.5})
        writer.wait_durable(lsn, timeout=5)
        assert writer.durable_lsn >= lsn
        assert [r.kind for r in journal.read(session)] == ["call", "observation"]
        with pytest.raises(ValueError, match="never submitted"):
            writer.wait_durable(lsn + 10)
    lead.close()


def test_records_from_many_threads_get_unique_contiguous_lsns(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    got: dict[int, tuple[int, int]] = {}
    with GroupCommitWriter(lead) as writer:

        def produce(t: int) -> None:
            for i in range(500):
                got[writer.submit("call", {"t": t, "i": i})] = (t, i)

        _in_threads(4, produce)
        writer.flush()
    records = list(journal.read(session))
    assert [r.lsn for r in records] == list(range(2000))
    assert all((r.data["t"], r.data["i"]) == got[r.lsn] for r in records)
    lead.close()


def test_a_fenced_append_fails_waiters_and_later_submits(journal: Journal, session: str):
    old = journal.campaign(session, "old", ttl_s=1.0)
    writer = GroupCommitWriter(old)
    writer.submit("call", {"i": 0})
    writer.flush()
    old.pause_keepalive()
    new = journal.campaign(session, "new", ttl_s=1.0, timeout=10)

    lsn = writer.submit("call", {"i": 1})
    with pytest.raises(LeadershipLost):
        writer.wait_durable(lsn, timeout=10)
    with pytest.raises(LeadershipLost):
        writer.submit("call", {"i": 2})
    with pytest.raises(LeadershipLost):
        writer.flush()
    with pytest.raises(LeadershipLost):
        writer.close()
    assert old.lost.is_set()
    assert [r.data["i"] for r in journal.read(session)] == [0]
    old.close()
    new.close()


def test_an_oversized_record_is_refused_at_submit_without_using_an_lsn(
    journal: Journal, session: str
):
    lead = journal.campaign(session, "a")
    with GroupCommitWriter(lead) as writer:
        with pytest.raises(RecordTooLarge):
            writer.submit("result", {"value": b"x" * (2 << 20)})
        assert writer.submit("result", {"value": b"ok"}) == 0
        writer.flush()
        with pytest.raises(JournalError, match="closed"):
            writer.close()
            writer.submit("call", {})
    lead.close()


def test_a_writer_checkpoint_covers_everything_submitted_before_it(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    with GroupCommitWriter(lead, max_delay_s=1.0) as writer:
        for i in range(10):
            writer.submit("call", {"i": i})
        assert writer.checkpoint({"state": 10}) == 10
        writer.submit("call", {"i": 10})
    assert journal.read_checkpoint(session)["lsn"] == 10
    assert journal.compact(session) == 10
    assert [r.lsn for r in journal.read(session)] == [10]
    assert journal.verify(session).ok
    lead.close()


def test_many_threads_submitting_and_waiting_keep_lsn_order(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    with GroupCommitWriter(lead, max_batch=8) as writer:

        def produce(t: int) -> None:
            for i in range(200):
                writer.wait_durable(writer.submit("call", {"t": t, "i": i}))

        _in_threads(4, produce)
    records = list(journal.read(session))
    assert [r.lsn for r in records] == list(range(800))
    for t in range(4):
        assert [r.data["i"] for r in records if r.data["t"] == t] == list(range(200))
    lead.close()


def test_lazy_records_read_back_like_eager_ones_in_submit_order(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    got: dict[int, tuple[int, int]] = {}
    with GroupCommitWriter(lead, max_batch=16) as writer:

        def produce(t: int) -> None:
            for i in range(300):
                data = {"t": t, "i": i, "v": [memoryview(b"abc"), b"d"]}
                got[writer.submit("result", data, lazy=(i + t) % 2 == 0)] = (t, i)

        _in_threads(3, produce)
        writer.flush()
    records = list(journal.read(session))
    assert [r.lsn for r in records] == list(range(900))
    assert all((r.data["t"], r.data["i"]) == got[r.lsn] for r in records)
    assert all(r.data["v"] == [b"abc", b"d"] and r.kind == "result" for r in records)
    assert journal.verify(session).ok
    lead.close()


def test_a_lazy_record_that_cannot_be_encoded_fails_the_writer_and_names_it(
    journal: Journal, session: str
):
    lead = journal.campaign(session, "a")
    writer = GroupCommitWriter(lead)
    writer.wait_durable(writer.submit("call", {"i": 0}, lazy=True))
    lsn = writer.submit("result", {"v": object()}, lazy=True)
    with pytest.raises(JournalError, match=r"record 'result' \(lsn 1\).*msgpack cannot encode"):
        writer.wait_durable(lsn, timeout=10)
    with pytest.raises(JournalError):
        writer.submit("call", {"i": 2})
    with pytest.raises(JournalError):
        writer.close()
    assert [r.data["i"] for r in journal.read(session)] == [0]
    lead.close()


def test_collected_items_become_one_record_before_anything_submitted_after_them(
    journal: Journal, session: str
):
    lead = journal.campaign(session, "a")
    with GroupCommitWriter(lead, max_delay_s=30.0) as writer:
        collect = writer.collector("calls")
        for i in range(5):
            collect([i, "x"])
        lsn = writer.submit("observation", {"now": 1.0})
        collect([5, "x"])
        writer.wait_durable(lsn, timeout=5)  # the items took their lsn at the submit
        # The writer took the item added since as well: it takes whatever is there.
        assert [(r.lsn, r.kind, r.data) for r in journal.read(session)] == [
            (0, "calls", {"items": [[i, "x"] for i in range(5)]}), (1, "observation", {"now": 1.0}),
            (2, "calls", {"items": [[5, "x"]]})]
        collect([6, "x"])
        assert writer.flush() == 3  # a flush gives them their lsn too
    assert [r.data for r in journal.read(session)][3:] == [{"items": [[6, "x"]]}]
    lead.close()


def test_collected_items_are_written_with_nobody_waiting_and_a_record_holds_at_most_group_items(
    journal: Journal, session: str
):
    lead = journal.campaign(session, "a")
    with GroupCommitWriter(lead, max_delay_s=0.05) as writer:
        collect = writer.collector("calls")
        for i in range(GROUP_ITEMS + 3):
            collect([i])
        deadline = time.monotonic() + 10
        while len(_items(journal, session)) < GROUP_ITEMS + 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # nobody waits, nothing wakes the writer: it looks by itself
    # Two records when the loop outruns the writer's delay; more where a loaded machine let the
    # writer wake while it ran. Never more than GROUP_ITEMS in one, nothing lost or reordered.
    sizes = [len(r.data["items"]) for r in journal.read(session)]
    assert len(sizes) >= 2 and max(sizes) <= GROUP_ITEMS, sizes
    assert _items(journal, session) == [[i] for i in range(GROUP_ITEMS + 3)]
    lead.close()


def _items(journal: Journal, session: str) -> list:
    return [item for r in journal.read(session) for item in r.data["items"]]


def test_items_collected_from_many_threads_are_each_written_once_in_order_per_thread(
    journal: Journal, session: str
):
    lead = journal.campaign(session, "a")
    per_thread = 3000
    with GroupCommitWriter(lead, max_delay_s=0.002) as writer:
        collect = writer.collector("calls")

        def produce(t: int) -> None:
            for i in range(per_thread):
                collect((t, i))
                if i % 500 == 0:
                    writer.submit("mark", {"t": t, "i": i})  # drains while others append

        _in_threads(4, produce)
        writer.flush()
    items = [tuple(x) for r in journal.read(session) if r.kind == "calls" for x in r.data["items"]]
    assert len(items) == len(set(items)) == 4 * per_thread
    for t in range(4):
        assert [i for th, i in items if th == t] == list(range(per_thread))
    lead.close()


def test_a_ticket_is_bound_once_a_close_takes_the_items_before_it(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    with GroupCommitWriter(lead, max_delay_s=30.0) as writer:
        collect = writer.collector("calls")
        collect([0])
        ticket = writer.ticket()
        assert writer.bound(ticket) is None  # nothing has taken the item yet
        lsn = writer.submit("observation", {"now": 1.0})  # a submit closes the items first
        assert writer.bound(ticket) == lsn - 1 == 0
        collect([1])
        later = writer.ticket()
        assert writer.bound(later) is None
        assert writer.seal() == 2  # a seal gives the items their lsn at once ...
        assert writer.bound(later) == 2
        assert writer.seal() == 2  # ... and with nothing collected, names the last lsn
        writer.flush(timeout=5)
    assert [(r.lsn, r.kind) for r in journal.read(session)] == [(0, "calls"), (1, "observation"), (2, "calls")]
    lead.close()


@pytest.mark.slow
def test_a_bound_never_falls_below_an_item_collected_before_its_ticket(journal: Journal, session: str):
    """Items added, each with a ticket taken after it, while another thread closes the
    collected items as fast as it can: every bound is at or above its item's real lsn."""
    lead = journal.campaign(session, "a")
    n = 1000
    bounds: dict[int, int] = {}
    with GroupCommitWriter(lead, max_delay_s=0.002) as writer:
        collect = writer.collector("calls")
        done = threading.Event()

        def seal() -> None:
            while not done.is_set():
                writer.seal()

        sealer = threading.Thread(target=seal)
        sealer.start()
        try:
            for i in range(n):
                collect([i])
                ticket = writer.ticket()
                deadline = time.monotonic() + 10
                while (bound := writer.bound(ticket)) is None:
                    assert time.monotonic() < deadline, f"item {i} was never taken"
                    time.sleep(0)  # let the sealer run
                bounds[i] = bound
        finally:
            done.set()
            sealer.join()
        writer.flush(timeout=10)
    lsn_of = {item[0]: r.lsn for r in journal.read(session) for item in r.data["items"]}
    assert sorted(lsn_of) == list(range(n))
    assert all(bounds[i] >= lsn_of[i] for i in range(n))
    lead.close()


def test_a_failed_append_is_reported_to_on_failure_once(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    failures: list[BaseException] = []
    writer = GroupCommitWriter(lead, max_delay_s=0.002, on_failure=failures.append)
    writer.collector("calls")(["never written"])
    writer.submit("bad", {"x": object()}, lazy=True)  # fails the writer on its thread
    with pytest.raises(JournalError, match="could not be written"):
        writer.flush(timeout=5)
    assert len(failures) == 1 and isinstance(failures[0], JournalError)
    with pytest.raises(JournalError):
        writer.close()
    lead.close()
