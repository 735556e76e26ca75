"""The controller's bookkeeping, driven by events and free of IO.

It numbers the program's side effects (invariant 1), tracks which points of each
call are still outstanding, and derives the watermark below which every call is
complete. The session's edge (sockets, threads, journal) feeds it events:
"program issued call", "reply arrived", "proc died". Tests drive it directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from regent import wire


class Outcome:
    """What one point of a call ended with: status, wire metadata and payload frames.
    (A plain slotted class: one is made per reply, on the IO thread.)

    `lsn`: where the outcome sits in the journal (-1: nowhere yet, or read from it, so durable).
    `journaled`: nothing is left to write for it (read from the journal, or in its batch's
    record). Both are the controller's own: never fields of the worker's metadata, which
    comes from the network."""

    __slots__ = ("status", "meta", "frames", "lsn", "journaled", "holder")

    def __init__(self, status: str, meta: dict, frames: Sequence[Any], lsn: int = -1,
                 journaled: bool = False):
        self.status = status  # ok | err | fenced | divergence | noactor | dead | exit | lost | unjournaled
        self.meta = meta
        self.frames = frames
        self.lsn = lsn
        self.journaled = journaled
        # The proc process (ProcRef.id, which a replacement changes) whose result cache holds
        # it until it is durable: "" for none.
        self.holder = ""

    def __repr__(self) -> str:
        return f"Outcome({self.status!r}, {self.meta!r}, <{len(self.frames)} frames>)"


@dataclass(slots=True)
class PendingCall:
    seq: int
    kind: str
    actor: str
    method: str
    targets: dict[int, str]  # point rank -> proc id
    sink: Any = None  # owned by the edge: how outcomes reach the program
    results: dict[int, Outcome] = field(default_factory=dict)
    wire: Any = None  # owned by the edge: enough to send the call again
    # Points whose journaled result is a digest only (too large for the journal): rank ->
    # (digest, size, what the standby must say if it cannot get that value back).
    expected: dict[int, tuple[bytes, int]] | None = None

    @property
    def complete(self) -> bool:
        return len(self.results) == len(self.targets)


class ControllerCore:
    def __init__(self, session: str, first_seq: int = 0):
        self.session = session
        self.next_seq = first_seq
        self.calls: dict[int, PendingCall] = {}
        self._finished: set[int] = set()
        self.completed_through = first_seq - 1  # every seq <= this has completed
        # Outcomes accepted but not yet handed to the journal, per seq: a watermark must not
        # cover them, or a worker could drop a result that no journal holds (invariant 11).
        self._recording: dict[int, int] = {}

    def issue(self) -> int:
        """The call id of the program's next side effect."""
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def expect(self, seq: int, kind: str, actor: str, method: str, targets: dict[int, str], sink: Any) -> PendingCall:
        """A call the program issued; the core keeps `targets` (the caller hands it over)."""
        call = PendingCall(seq, kind, actor, method, targets, sink)
        if not targets:
            self.finished(seq)
        else:
            self.calls[seq] = call
        return call

    def on_result(self, seq: int, point: int, outcome: Outcome) -> PendingCall | None:
        """Record one point's outcome; returns the call, or None for a stale/duplicate reply."""
        call = self.calls.get(seq)
        if call is None or point not in call.targets or point in call.results:
            return None
        if call.expected is not None and point in call.expected:
            outcome = _as_journaled(call, point, outcome)
        call.results[point] = outcome
        if not outcome.journaled:
            self._recording[seq] = self._recording.get(seq, 0) + 1
        if call.complete:
            del self.calls[seq]
            self.finished(seq)
        return call

    def recorded(self, seq: int) -> None:
        """The edge has journaled (or queued, with its mark) one outcome of `seq` it accepted."""
        left = self._recording.get(seq, 0) - 1
        if left > 0:
            self._recording[seq] = left
        else:
            self._recording.pop(seq, None)

    @property
    def releasable_through(self) -> int:
        """Highest seq whose calls are complete with every outcome handed to the journal."""
        if not self._recording:
            return self.completed_through
        return min(self.completed_through, min(self._recording) - 1)

    def on_proc_died(self, proc_id: str, reason: str) -> list[tuple[PendingCall, int]]:
        """Fail every outstanding point on a dead proc; returns (call, point) pairs affected."""
        hit = []
        for call in list(self.calls.values()):
            for point, pid in call.targets.items():
                if pid == proc_id and point not in call.results:
                    hit.append((call, point))
        for call, point in hit:
            self.on_result(call.seq, point, Outcome("dead", {"em": reason, "pt": point}, []))
        return hit

    def finished(self, seq: int) -> None:
        """A seq needs nothing more from workers; advance the completion watermark."""
        self._finished.add(seq)
        while self.completed_through + 1 in self._finished:
            self.completed_through += 1
            self._finished.discard(self.completed_through)


def _as_journaled(call: PendingCall, point: int, outcome: Outcome) -> Outcome:
    """A replayed point whose journal holds a digest only: the outcome, if it is the value
    the primary saw, else a `lost` outcome saying why the standby cannot see it again."""
    digest, size = call.expected[point]
    if outcome.status == "ok":
        got = wire.digest(outcome.frames)
        if got == digest:
            return outcome
        why = (f"the call, sent again, returned a different value (digest {got.hex()[:12]}, "
               f"the journal's {digest.hex()[:12]}): its proc was restarted and ran it again")
    else:
        why = f"the call, sent again, failed ({outcome.status}: {outcome.meta.get('em', '')})"
    em = (f"seq {call.seq} ({call.actor}.{call.method} point {point}): the journal keeps its "
          f"{size}-byte result as a digest only, and {why}. No standby "
          "can take this session over from here. Move bulk data between actors through RDMA "
          "buffers (regent.hipcore) rather than returning it to the controller, or journal "
          "such values in full with REGENT_JOURNAL_VALUE_BYTES.")
    lost = Outcome("lost", {"pt": point, "em": em}, [])
    lost.lsn = -1
    return lost
