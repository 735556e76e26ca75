"""GroupCommitWriter: lsn order is submit order, durability is waited for, failures reach everyone."""

from __future__ import annotations

import threading
import time

import pytest

from journal import GroupCommitWriter, Journal, JournalError, LeadershipLost, RecordTooLarge


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

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
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


class _Recording:
    """A Leadership stand-in that records which thread ran each append (and can stall one)."""

    session = "recording"
    epoch = 1
    next_lsn = 0

    def __init__(self) -> None:
        self.appends: list[tuple[str, int, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.next = 0

    def append_frames(self, first: int, frames: list[bytes]) -> int:
        self.gate.wait()
        with self.lock:
            assert first == self.next, f"append at {first}, expected {self.next}: two appends raced"
            self.next = first + len(frames)
            self.appends.append((threading.current_thread().name, first, len(frames)))
        return first + len(frames) - 1


def test_a_waiter_appends_pending_records_itself_when_no_append_is_under_way():
    lead = _Recording()
    # A long linger: only a waiter can make these durable before close.
    with GroupCommitWriter(lead, max_delay_s=30.0) as writer:  # type: ignore[arg-type]
        writer.submit("call", {"i": 0})
        lsn = writer.submit("call", {"i": 1})
        writer.wait_durable(lsn)
        assert lead.appends == [(threading.current_thread().name, 0, 2)]
        # With a deadline, the waiter leaves the append to the writer's thread.
        lsn = writer.submit("call", {"i": 2})
        writer.wait_durable(lsn, timeout=5)
        assert lead.appends[-1][0].startswith("journal-group-commit")


def test_a_waiter_waits_for_an_append_under_way_then_finishes_what_is_left():
    lead = _Recording()
    with GroupCommitWriter(lead, max_batch=4, max_delay_s=0.0) as writer:  # type: ignore[arg-type]
        lead.gate.clear()  # the thread's next append stalls
        writer.submit("call", {"i": 0})
        deadline = time.monotonic() + 5
        while writer._claim is None and time.monotonic() < deadline:  # the thread has claimed it
            time.sleep(0.001)
        lsns = [writer.submit("call", {"i": i}) for i in range(1, 10)]
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (writer.wait_durable(lsns[-1]), done.set()))
        waiter.start()
        assert not done.wait(0.2), "durable while the append before it was stalled"
        lead.gate.set()
        assert done.wait(5)
        waiter.join()
    assert [(first, n) for _, first, n in lead.appends][0] == (0, 1)
    assert sum(n for _, _, n in lead.appends) == 10


def test_many_threads_submitting_and_waiting_keep_lsn_order(journal: Journal, session: str):
    lead = journal.campaign(session, "a")
    with GroupCommitWriter(lead, max_batch=8) as writer:

        def produce(t: int) -> None:
            for i in range(200):
                writer.wait_durable(writer.submit("call", {"t": t, "i": i}))

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    records = list(journal.read(session))
    assert [r.lsn for r in records] == list(range(800))
    for t in range(4):
        assert [r.data["i"] for r in records if r.data["t"] == t] == list(range(200))
    lead.close()


class _Signal(BaseException):
    """What a signal handler raises in the main thread (like KeyboardInterrupt, or the
    controller's Handoff on SIGTERM)."""


class _Interrupting(_Recording):
    """Writes `writes` of the next batch's records, then raises what a signal handler would."""

    def __init__(self, writes: int) -> None:
        super().__init__()
        self.writes = writes
        self.next_lsn = 0
        self.stored: dict[int, bytes] = {}

    def append_frames(self, first: int, frames: list[bytes]) -> int:
        if self.writes >= 0:
            n, self.writes = self.writes, -1
            for i, f in enumerate(frames[:n]):
                self.stored[first + i] = f
            self.next_lsn = first + n
            raise _Signal
        for i, f in enumerate(frames):
            assert self.stored.setdefault(first + i, f) == f, "a record rewritten with other bytes"
        self.next_lsn = first + len(frames)
        return first + len(frames) - 1


@pytest.mark.parametrize("written", [0, 2, 5])
def test_an_append_interrupted_in_a_waiter_keeps_its_unwritten_records_pending(written):
    lead = _Interrupting(written)
    writer = GroupCommitWriter(lead, max_delay_s=30.0)  # type: ignore[arg-type]
    lsns = [writer.submit("call", {"i": i}) for i in range(5)]
    with pytest.raises(_Signal):
        writer.wait_durable(lsns[-1])  # the waiter appends, and a "signal" cuts it short
    assert writer.durable_lsn == written - 1
    # The session ends as a hand-off would: the writer's thread writes what is left.
    assert writer.flush(timeout=5) == 4
    writer.close()
    assert sorted(lead.stored) == [0, 1, 2, 3, 4]


def test_a_waiter_cut_short_right_after_claiming_leaves_the_writer_able_to_flush(monkeypatch):
    lead = _Recording()
    writer = GroupCommitWriter(lead, max_delay_s=30.0)  # type: ignore[arg-type]
    lsns = [writer.submit("call", {"i": i}) for i in range(3)]

    def cut_short() -> None:
        raise _Signal  # as if SIGTERM's handler ran between the claim and the write

    monkeypatch.setattr(writer, "_append_claim", cut_short)
    with pytest.raises(_Signal):
        writer.wait_durable(lsns[-1])
    monkeypatch.undo()
    assert writer._claim is None and writer.durable_lsn == -1
    assert writer.flush(timeout=5) == 2  # the thread writes them: nothing lost, nothing stuck
    writer.close()
    assert [(first, n) for _, first, n in lead.appends] == [(0, 3)]
