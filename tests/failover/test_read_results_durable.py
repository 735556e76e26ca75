"""A call issued after the program read a result waits until that result is durable.

Plain results are journaled off the latency path. If the primary and the proc holding a
result both die before the result reaches the journal, a standby sees a SupervisionError
where the program saw a value; calls the primary issued after reading it would then part
ways with the standby's. So nothing is issued past a read result until it is durable."""

from __future__ import annotations

import os
import threading
import time

from controller import Session
from worker import Actor, endpoint


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


def test_a_call_after_a_read_result_waits_for_that_result_to_be_durable(tmp_path):
    with Session(f"read-durable-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("c", Counter)
        assert mesh.incr.call_one().get(timeout=10) == 1
        gate = _gate_appends(s)
        # Read at once, though the journal holds its record back: off the latency path.
        t0 = time.monotonic()
        assert mesh.incr.call_one().get(timeout=10) == 2
        assert time.monotonic() - t0 < 5
        issued = s.core.next_seq
        got: list[int] = []
        follower = threading.Thread(target=lambda: got.append(mesh.incr.call_one().get(timeout=20)))
        follower.start()
        time.sleep(0.5)
        # The next call has not been issued: no seq taken, nothing sent, the actor untouched.
        assert follower.is_alive() and s.core.next_seq == issued and got == []
        gate.set()
        follower.join(20)
        assert got == [3]
        assert s.writer.durable_lsn >= 0


def test_calls_issued_without_reading_a_result_do_not_wait(tmp_path):
    with Session(f"read-durable-burst-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("c", Counter)
        mesh.incr.call_one().get(timeout=10)
        gate = _gate_appends(s)
        # A pipelined burst reads nothing between calls: none of them waits for the journal.
        futures = [mesh.incr.call_one() for _ in range(50)]
        assert [f.get(timeout=10) for f in futures] == list(range(2, 52))
        gate.set()
