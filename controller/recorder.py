"""The reply side of the journal: each outcome recorded before the program sees it.

The runtime hands every outcome it accepts to a `Recorder` (its `OutcomePort`), on whichever
thread drives the session (controller/drive.py); the engine says which record it gets, and the
recorder submits it and tells the engine where it went, so the release watermark never runs
ahead of the journal (invariant 11).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from regent import wire
from regent.controller.core import Outcome, PendingCall
from regent.controller.engine import NEVER_DURABLE, Append, Collect, Engine
from regent.controller.replay import CALLS, RESULTS
from regent.journal.errors import LeadershipLost

log = structlog.get_logger("regent.session")


class OutcomePort(Protocol):
    """What the runtime calls as it drives (controller._runtime.Runtime's `outcomes`)."""

    def record(self, call: PendingCall, point: int, outcome: Outcome) -> None: ...
    def record_batch(self, frames: list, replies: list[tuple[wire.Kind, dict, list]]) -> list[int | None] | None: ...
    def release_through(self) -> int: ...


class Recorder:
    """Journals outcomes as the engine decides (an OutcomePort)."""

    def __init__(self, engine: Engine, on_gone: Callable[[PendingCall, int, Outcome], None]):
        self.engine = engine
        self._on_gone = on_gone  # an actor exited, or was not there: supervision may act on it
        self._warned_big = False
        self.writer: Any = None
        self.collect: Callable[[Any], None] = _not_started

    def use(self, writer: Any) -> None:
        """Start recording through `writer`: each call's record and each lone plain value go
        to one CALLS collector, so a value always follows its call."""
        self.writer = writer
        self.collect = writer.collector(CALLS)

    def record(self, call: PendingCall, point: int, outcome: Outcome) -> None:
        if outcome.status in ("exit", "noactor"):
            self._on_gone(call, point, outcome)
        if not self.engine.journaled:
            return
        size = wire.payload_size(outcome.frames) if outcome.status == "ok" else 0
        effect = self.engine.outcome_record(call, point, outcome, size, time.time())
        if effect is None:
            return
        if isinstance(effect, Collect):
            self.collect(effect.item)
            return
        if "big" in effect.data:
            self._warn_big(call, point, size)
        try:
            lsn = self.writer.submit(effect.kind, effect.data, lazy=effect.lazy)
            outcome.lsn = lsn
            if effect.durable:
                self.writer.wait_durable(lsn, timeout=30)
        except Exception as e:  # noqa: BLE001 - deposed or journal down: the next call raises it
            log.warning("could not journal a result", seq=call.seq, error=str(e))
            # Never durable: the watermark stays below it, or workers would release a result
            # that a standby could find neither in the journal nor on the worker.
            self.engine.journaled_at(call.seq, NEVER_DURABLE)
            if effect.durable:
                _withhold(outcome, point, e)
            return
        self.engine.journaled_at(call.seq, lsn)

    def record_batch(self, frames: list, replies: list[tuple[wire.Kind, dict, list]]) -> list[int | None] | None:
        """A batch of plain values journaled as the worker sent it: one record, not one each.
        Returns, per reply, the record's lsn if the record covers it, else None."""
        if len(replies) < 2 or not self.engine.journaled:
            return None
        plan = self.engine.batch_record(replies, wire.payload_size(frames))
        if plan is None:
            return None
        low, marked = plan
        try:
            lsn = self.writer.submit(RESULTS, {"b": wire.frame_bytes(frames)}, lazy=True)
        except Exception:  # noqa: BLE001 - each reply then tries its own record, and says why
            return None
        # One mark for the batch, before any of its calls completes.
        self.engine.journaled_at(low, lsn)
        lsns: list[int | None] = [None] * len(replies)
        for i in marked:
            lsns[i] = lsn
        return lsns

    def release_through(self) -> int:
        releasable = self.engine.core.releasable_through
        return self.engine.releases.through(releasable, self.writer.durable_lsn, self.writer.seal)

    def _warn_big(self, call: PendingCall, point: int, size: int) -> None:
        """Tell the program, before it reads one, that a digest-only value binds a takeover to
        the proc that holds it (once a session: a program returning bulk data does it often)."""
        if self._warned_big:
            return
        self._warned_big = True
        log.warning("a result is journaled as a digest only: a standby can replay it only while "
                    "the proc holding it lives; move bulk data through RDMA buffers, or raise "
                    "REGENT_JOURNAL_VALUE_BYTES", seq=call.seq, endpoint=f"{call.actor}.{call.method}",
                    point=point, bytes=size, limit=self.engine.value_limit)


def _withhold(outcome: Outcome, point: int, error: Exception) -> None:
    """An outcome that had to be durable before the program saw it, and is not: the program
    sees why instead, since a standby would see something else (invariant 4). A supervision
    failure it acted on (say, by calling again) would be a call no journal holds."""
    what = f"its {outcome.status} outcome could not be journaled ({error})"
    if isinstance(error, LeadershipLost):
        outcome.status, outcome.meta = "fenced", {"pt": point, "em": f"{what}; another controller leads now"}
    else:
        outcome.status, outcome.meta = "unjournaled", {"pt": point, "em": f"{what}; check the journal's store, "
                                                       "then start the program again to replay it"}
    outcome.frames = []


def _not_started(item: Any) -> None:
    raise RuntimeError("the recorder has no writer yet (Recorder.use)")


def append(writer: Any, effect: Append) -> int:
    """Carry out an Append on the program's thread."""
    lsn = writer.submit(effect.kind, effect.data)
    if effect.durable:
        writer.wait_durable(lsn)
    return lsn
