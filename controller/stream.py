"""Reading a `stream` call: its values in completion order, the same order on every replay.

Which point answered first may differ between runs, so the order the program saw is journaled
durably before each value is seen; a replay yields the journal's order. A deadline that passed
is journaled too, and a replay raises it where the program saw it.
"""

from __future__ import annotations

import functools
import queue
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from regent.controller.futures import Point
from regent.worker.shape import point_of

if TYPE_CHECKING:
    from regent.controller.mesh import StreamSink
    from regent.controller.session import Session


def stream_results(s: Session, sink: StreamSink, timeout: float | None = None) -> Iterator[tuple[Point, Any]]:
    """The (point, value) pairs of the stream `sink` collects, for session `s`."""
    call, engine, drive = sink.call, s._engine, s._drive.lock
    index = {r: i for i, r in enumerate(sink.view.ranks)}
    buffered: dict[int, None] = {}  # arrived but not yet yielded, in arrival order
    deadline = None if timeout is None else time.monotonic() + timeout
    for i in range(len(sink.view.ranks)):
        s.runtime.flush()
        if s._catchup is not None:  # the journal's pick (or timeout) and its result, or it leads
            s._catchup.await_journal(functools.partial(_journaled_pick, s, call, i))
        with drive:
            rank = engine.stream_pick(call.seq, i)
            replayed_timeout = rank is None and engine.replayed_timeout(call.seq)
        if replayed_timeout:
            raise TimeoutError(f"stream seq {call.seq} not complete after {timeout} s (replayed)")
        if rank is not None:
            while rank not in buffered:
                buffered[sink.queue.get()[1]] = None
        else:
            if not buffered:
                try:
                    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                    buffered[sink.queue.get(timeout=wait)[1]] = None
                except queue.Empty:
                    with drive:
                        effect = engine.timed_out(call.seq, timeout)
                    s._do(effect)
                    raise TimeoutError(f"stream seq {call.seq} not complete after {timeout} s") from None
            rank = next(iter(buffered))
            s._do(engine.stream_yielded(call.seq, i, rank))
        del buffered[rank]
        outcome = call.results[rank]
        s._observed(outcome.lsn, engine.read_holders((outcome.holder,), timeout))
        with drive:
            value = engine.decode(call, outcome)  # an error outcome raises it here
        yield point_of(sink.view.dims, index[rank]), value


def _journaled_pick(s: Session, call: Any, i: int) -> bool:
    """Whether the journal holds the stream's i-th pick with its result, or its next timeout."""
    engine = s._engine
    rank = engine.stream_pick(call.seq, i)
    if rank is None:
        return (call.seq, "timeout", engine.timeouts.get(call.seq, 0)) in engine.replay.obs
    return rank in call.results
