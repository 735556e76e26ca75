"""What a call issued after the program read a result waits for.

Plain results are journaled off the latency path. If the primary and the proc holding a
result both die before the result reaches the journal, a standby sees a SupervisionError
(or a re-run) where the program saw a value. So nothing may run, on a proc that could
outlive both, past a read result that is not durable: a call to another proc waits for it.
A call to the proc that holds every such result does not wait: if that proc dies, the call
dies with it; if it lives, its cache replays the results (Session._held_by)."""

from __future__ import annotations

import os
import threading
import time

from regent.controller import Session
from regent.controller.replay import RESULT, expand
from regent.journal import open_journal
from regent.worker import Actor, endpoint


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def peek(self) -> int:
        return self.n

    @endpoint
    def die(self) -> None:
        os._exit(3)


def _gate_appends(s: Session) -> threading.Event:
    """Hold every journal append until the returned event is set."""
    s.writer.flush(timeout=10)  # what came before is durable
    gate = threading.Event()
    append = s.lead.append_frames

    def held(first: int, frames: list) -> int:
        gate.wait(10)
        return append(first, frames)

    s.lead.append_frames = held
    return gate


def _issue_in_thread(s: Session, call) -> tuple[threading.Thread, list]:
    got: list = []
    follower = threading.Thread(target=lambda: got.append(call().get(timeout=20)))
    follower.start()
    return follower, got


def _assert_waits_for_the_gate(s: Session, call, gate: threading.Event) -> list:
    """Issue `call` from a thread: it must take no seq and send nothing until the gate opens."""
    issued = s.core.next_seq
    follower, got = _issue_in_thread(s, call)
    time.sleep(0.5)
    assert follower.is_alive() and s.core.next_seq == issued and got == []
    gate.set()
    follower.join(20)
    return got


def _counters(s: Session):
    return s.spawn_procs(per_host={"procs": 2}).spawn("c", Counter)


def test_a_call_to_another_proc_after_a_read_result_waits_for_that_result_to_be_durable(tmp_path):
    with Session(f"read-durable-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = _counters(s)
        p0, p1 = mesh.slice(procs=0), mesh.slice(procs=1)
        assert p0.incr.call_one().get(timeout=10) == 1
        gate = _gate_appends(s)
        # Read at once, though the journal holds its record back: off the latency path.
        t0 = time.monotonic()
        assert p0.incr.call_one().get(timeout=10) == 2
        assert time.monotonic() - t0 < 5
        # The call to proc 1 is not issued until then: no seq taken, nothing sent.
        assert _assert_waits_for_the_gate(s, p1.incr.call_one, gate) == [1]
        assert s.writer.durable_lsn >= 0


def test_a_broadcast_after_a_read_result_waits_for_it(tmp_path):
    with Session(f"read-durable-bc-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = _counters(s)
        p0 = mesh.slice(procs=0)
        gate = _gate_appends(s)
        assert p0.incr.call_one().get(timeout=10) == 1
        # Proc 0 holds the result, but the broadcast reaches proc 1 as well.
        got = _assert_waits_for_the_gate(s, mesh.incr.call, gate)
        assert list(got[0].values()) == [2, 1]


def test_a_call_to_the_proc_holding_every_unjournaled_result_does_not_wait(tmp_path):
    with Session(f"read-durable-same-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = _counters(s)
        p0, p1 = mesh.slice(procs=0), mesh.slice(procs=1)
        gate = _gate_appends(s)
        # A read-then-call loop on one actor: nothing durable, nothing waited for.
        t0 = time.monotonic()
        assert [p0.incr.call_one().get() for _ in range(20)] == list(range(1, 21))
        assert p0.peek.call_one().get() == 20
        assert time.monotonic() - t0 < 5
        # Not durable, any of it: the gate holds the appends (seal gives the items their lsns).
        assert s.writer.durable_lsn < s.writer.seal()
        # Proc 1 holds none of them: a call to it waits.
        assert _assert_waits_for_the_gate(s, p1.incr.call_one, gate) == [1]


def test_reading_from_two_procs_makes_the_next_call_to_either_wait(tmp_path):
    with Session(f"read-durable-two-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = _counters(s)
        p0, p1 = mesh.slice(procs=0), mesh.slice(procs=1)
        gate = _gate_appends(s)
        f0, f1 = p0.incr.call_one(), p1.incr.call_one()  # issued before anything was read
        assert (f0.get(timeout=10), f1.get(timeout=10)) == (1, 1)
        # Proc 0 does not hold proc 1's result: if proc 1 and the primary died together, a
        # call that ran on proc 0 could rest on a value no standby can replay.
        assert _assert_waits_for_the_gate(s, p0.incr.call_one, gate) == [2]


def test_a_choose_after_a_read_result_is_covered_by_its_durable_pick(tmp_path):
    with Session(f"read-durable-choose-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = _counters(s)
        gate = _gate_appends(s)
        read = mesh.slice(procs=0).incr.call_one()
        assert read.get(timeout=10) == 1
        follower, got = _issue_in_thread(s, mesh.peek.choose)
        time.sleep(0.5)
        assert follower.is_alive() and got == []  # the pick waits to be durable ...
        gate.set()
        follower.join(20)
        assert got
        # ... and with it the result read before: in the journal, at or below the durable lsn.
        durable = s.writer.durable_lsn
        j = open_journal(s.journal_url)
        try:
            results = [r for r in expand(j.read(s.name)) if r.kind == RESULT and r.data["s"] == read.tag]
        finally:
            j.close()
        assert len(results) == 1 and results[0].lsn <= durable


def test_calls_issued_without_reading_a_result_do_not_wait(tmp_path):
    with Session(f"read-durable-burst-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = _counters(s)
        p0, p1 = mesh.slice(procs=0), mesh.slice(procs=1)
        p0.incr.call_one().get(timeout=10)
        p1.incr.call_one().get(timeout=10)
        gate = _gate_appends(s)
        # A pipelined burst reads nothing between calls: none of them waits for the journal.
        futures = [(p0 if i % 2 else p1).incr.call_one() for i in range(50)]
        got = [f.get(timeout=10) for f in futures]
        assert got == [2 + i // 2 for i in range(50)]
        gate.set()


def test_reading_results_does_not_make_the_journal_write_sooner(tmp_path):
    """A result the program read lingers like any record (JOURNAL_LINGER_S): a call that must
    not run before it is durable waits for it itself. Writing read results within 10 ms made
    a read-then-call loop append a hundred times a second, each append a millisecond of etcd
    CPU; the loop's records now go out about once a linger."""
    from regent.controller.edge import JOURNAL_LINGER_S

    with Session(f"read-linger-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        p0 = _counters(s).slice(procs=0)
        p0.incr.call_one().get(timeout=10)
        s.writer.flush(timeout=10)
        appends = []
        append = s.lead.append_frames

        def counted(first: int, frames: list) -> int:
            appends.append(first)
            return append(first, frames)

        s.lead.append_frames = counted
        t0 = time.monotonic()
        reads = 0
        # At least 10 lingers and 100 reads: a loaded machine makes fewer reads per linger.
        while time.monotonic() - t0 < 10 * JOURNAL_LINGER_S or reads < 100:
            p0.incr.call_one().get()
            reads += 1
        elapsed = time.monotonic() - t0
        # Each linger starts when the first record after a write is queued, and a collected
        # call record is looked for at most a linger later: at most one append per linger,
        # plus the one under way at the start.
        assert len(appends) <= elapsed / JOURNAL_LINGER_S + 2, (len(appends), reads, elapsed)


def test_a_watermark_never_covers_a_result_accepted_but_not_yet_journaled(tmp_path):
    """The timer's tick may come between the core accepting a reply (the call is then
    complete) and the session handing its value to the journal: the watermark it sends then
    must stay below the call, or the proc drops a result that no journal holds. (The tick is
    an event for whoever drives: the test drives it itself.)"""
    with Session(f"watermark-gap-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        p0 = _counters(s).slice(procs=0)
        first = p0.incr.call_one()
        first.get(timeout=10)
        deadline = time.monotonic() + 10
        while s.runtime._sent_watermark[0] < first.tag and time.monotonic() < deadline:
            s.writer.flush(timeout=10)  # everything so far durable and released
            with s._drive:
                s.runtime._tick()
            time.sleep(0.01)
        assert s.runtime._sent_watermark[0] >= first.tag
        gate = _gate_appends(s)
        record = s._recorder.record
        sent: list[int] = []

        def tick_in_the_gap(call, point, outcome) -> None:  # the recorder runs on the driver
            s.runtime._tick()
            sent.append(s.runtime._sent_watermark[0])
            record(call, point, outcome)

        s._recorder.record = tick_in_the_gap
        fut = p0.incr.call_one()
        assert fut.get() == 2
        del s._recorder.record
        assert sent and max(sent) < fut.tag, (sent, fut.tag)
        # Nor once the value is handed over, while the journal still holds it back.
        with s._drive:
            s.runtime._tick()
        assert s.runtime._sent_watermark[0] < fut.tag
        gate.set()
        s.writer.flush(timeout=10)
        with s._drive:
            s.runtime._tick()
        assert s.runtime._sent_watermark[0] >= fut.tag


def test_a_value_read_before_a_deadline_makes_even_a_call_to_its_proc_wait(tmp_path):
    """That a value came before `get(timeout=...)` gave up may differ in another run (the
    proc may be busy then): a call made after it, even to the proc holding it, waits until
    it is durable, so a standby answers the read from the journal, not against the clock."""
    with Session(f"read-deadline-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        p0 = _counters(s).slice(procs=0)
        gate = _gate_appends(s)
        assert p0.incr.call_one().get(timeout=10) == 1
        assert _assert_waits_for_the_gate(s, p0.incr.call_one, gate) == [2]


def test_a_replaced_proc_is_not_taken_for_the_holder_of_its_predecessors_results(tmp_path):
    """The holder of an unjournaled read is a proc process: after it dies and supervision
    replaces it (the same ProcRef.key), the replacement holds nothing, so a call to it waits."""
    with Session(f"read-replaced-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("r", Counter, restart="permanent")
        gate = _gate_appends(s)
        assert mesh.incr.call_one().get() == 1
        old = mesh._procs[0].id
        mesh.die.broadcast()  # the proc itself holds its result: nothing waits for the journal
        deadline = time.monotonic() + 60  # a new proc, on a loaded machine
        while (mesh._procs[0].id == old or not mesh._procs[0].alive) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mesh._procs[0].id != old, "supervision did not replace the proc"
        assert mesh._procs[0].key == old
        state = s._supervisor.meshes["r"]
        assert state.ready[0].wait(20)
        got = _assert_waits_for_the_gate(s, mesh.incr.call_one, gate)
        assert got == [1]  # a rebuilt actor
