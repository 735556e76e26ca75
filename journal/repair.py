"""Find a session's torn tail: the damaged batches `regent journal repair` may drop.

A torn tail is the run of stored batches from the first one whose bytes fail to decode
(unknown format byte, unreadable header, a compressed body that will not inflate, a checksum
mismatch, a record that will not unpack or names another lsn) to the end of the log, with no
batch in that run that decodes. Repair drops it only if what stays verifies clean (no gap,
no deposed-epoch write, no checkpoint ahead of it): damage anywhere else is refused.

Pure, like verify: it walks (first lsn, value) pairs handed to it and never reads storage.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from . import codec
from .errors import CorruptRecord
from .verify import verify_batches


@dataclass(frozen=True, slots=True)
class TornBatch:
    """One stored batch of a torn tail, described as far as its bytes can be read."""

    first_lsn: int
    value: bytes
    # How many records its header claims; None if the header itself is unreadable.
    count: int | None
    # (lsn, kind) of each record its bytes still show; kind None where that record is damaged.
    records: list[tuple[int, str | None]]
    problem: str

    @property
    def nbytes(self) -> int:
        return len(self.value)

    def describe(self) -> str:
        if self.count is None:
            span = f"lsn {self.first_lsn}.. (header unreadable: record count unknown)"
        else:
            last = self.first_lsn + self.count - 1
            span = f"lsn {self.first_lsn}..{last} ({self.count} records)"
        kinds = ", ".join(f"{lsn}:{kind or '?'}" for lsn, kind in self.records) or "none readable"
        return f"{span}, {self.nbytes} bytes; kinds {kinds}; {self.problem}"


@dataclass(slots=True)
class RepairPlan:
    """What repair would drop from a session, or why it refuses to drop anything."""

    session: str
    tail: list[TornBatch] = field(default_factory=list)
    # Set when repair must not touch the session: what is wrong, and what to do.
    refused: str | None = None
    # The last lsn that stays, None if nothing stays.
    kept_last_lsn: int | None = None

    @property
    def ok(self) -> bool:
        """True when there is a torn tail and dropping it leaves a clean log."""
        return self.refused is None and bool(self.tail)

    def lines(self, *, dry_run: bool = False) -> list[str]:
        """The report `regent journal repair` prints."""
        out: list[str] = []
        if self.tail:
            kept = "nothing" if self.kept_last_lsn is None else f"lsn ..{self.kept_last_lsn}"
            verb = "would drop" if dry_run else ("dropped" if self.refused is None else "found")
            out.append(
                f"session {self.session!r}: {verb} its torn tail, {len(self.tail)} batch(es), "
                f"{sum(b.nbytes for b in self.tail)} bytes; {kept} stays"
            )
            out.extend(f"  {b.describe()}" for b in self.tail)
        if self.refused is not None:
            out.append(f"session {self.session!r}: repair refused, nothing dropped: {self.refused}")
        elif not self.tail:
            out.append(f"session {self.session!r}: no torn tail, nothing to drop")
        return out


def _torn(value: bytes, session: str, first: int) -> str | None:
    """Why the batch fails to decode, or None if it decodes."""
    try:
        codec.decode_batch(value, session, first)
    except CorruptRecord as exc:
        return exc.problem
    return None


def _describe(first: int, value: bytes, session: str, problem: str) -> TornBatch:
    try:
        count: int | None = codec.batch_count(value, session, first)
    except CorruptRecord:
        count = None
    entries, _ = codec.inspect_batch(value, session, first)
    return TornBatch(first, value, count, [(lsn, kind) for lsn, _e, kind in entries], problem)


def plan_repair(
    session: str,
    batches: Iterable[tuple[int, bytes]],
    *,
    compacted: list[tuple[int, int]] | None = None,
    checkpoint: bytes | None = None,
) -> RepairPlan:
    """Find the torn tail of a session's batches (in lsn order) and check that what stays
    verifies clean; see the module docstring for the exact rule."""
    plan = RepairPlan(session)
    tail: list[TornBatch] = []
    valid_after: list[int] = []

    def kept() -> Iterator[tuple[int, bytes]]:
        for first, value in batches:
            problem = _torn(value, session, first)
            if problem is not None:
                tail.append(_describe(first, value, session, problem))
            elif tail:
                valid_after.append(first)
                return
            else:
                yield first, value

    report = verify_batches(session, kept(), compacted=compacted, checkpoint=checkpoint)
    if valid_after:
        damaged = ", ".join(str(b.first_lsn) for b in tail)
        plan.refused = (
            f"the batch at lsn {valid_after[0]} reads fine after damaged batch(es) at lsn "
            f"{damaged}: that is damage inside the log, not a torn tail, and dropping it would "
            f"lose good records; run `regent journal verify {session}` and restore the store "
            "from a backup"
        )
        return plan
    if not report.ok:
        found = "; ".join(report.problems)
        if tail:
            plan.refused = (
                f"besides its torn tail (lsn {tail[0].first_lsn}..), the log has other "
                f"problems that dropping the tail would not fix: {found}"
            )
        else:
            plan.refused = (
                f"it has no torn tail, but other problems repair does not fix: {found}"
            )
        return plan
    plan.tail = tail
    plan.kept_last_lsn = report.last_lsn
    return plan
