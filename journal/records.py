"""The value types the journal hands to its callers: records, session summaries, reports.

Plain data only; no storage or IO here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Record(NamedTuple):
    """One journaled record, as read back: checksum already verified."""

    lsn: int
    epoch: int
    kind: str
    data: dict[str, Any]
    ts: float


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A summary of one session's journal, for tools and for the controller's start-up."""

    name: str
    records: int
    first_lsn: int | None
    last_lsn: int | None
    leader: str | None
    epoch: int | None
    last_write: float | None
    ended: bool
    checkpoint_lsn: int | None = None
    # Set when the tail of the log could not be decoded; run verify for details.
    problem: str | None = None


@dataclass(slots=True)
class VerifyReport:
    """What `Journal.verify` found. `ok` is true when `problems` is empty."""

    session: str
    records: int = 0
    epochs: list[int] = field(default_factory=list)
    first_lsn: int | None = None
    last_lsn: int | None = None
    compacted: list[tuple[int, int]] = field(default_factory=list)
    checkpoint_lsn: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        span = (
            "empty"
            if self.first_lsn is None
            else f"lsn {self.first_lsn}..{self.last_lsn}, {self.records} records"
        )
        head = f"session {self.session!r}: {span}, epochs {self.epochs}"
        if self.compacted:
            ranges = ", ".join(f"{lo}..{hi - 1}" for lo, hi in self.compacted)
            head += f", compacted {ranges}"
        if self.ok:
            return head + ": ok"
        return (
            head
            + f": {len(self.problems)} problem(s)\n"
            + "\n".join(f"  {p}" for p in self.problems)
        )
