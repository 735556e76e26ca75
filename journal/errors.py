"""Errors raised by the journal.

Each one says what failed, for which session, and what the caller can do about it.
"""

from __future__ import annotations


class JournalError(Exception):
    """Base class for every error the journal raises on purpose."""


class JournalUnavailable(JournalError):
    """The journal's store (etcd or the SQLite file) cannot be reached or opened."""


class LeadershipLost(JournalError):
    """This holder no longer leads the session: its lease expired or another holder took over.

    A controller that sees this must stop writing and stop driving workers at once.
    """


class CorruptRecord(JournalError):
    """A stored record failed its checksum, is torn, or is missing from the sequence."""

    def __init__(self, session: str, lsn: int | None, problem: str) -> None:
        self.session = session
        self.lsn = lsn
        self.problem = problem
        where = f"session {session!r}" if lsn is None else f"session {session!r} lsn {lsn}"
        super().__init__(
            f"{where}: {problem} (run `regent journal verify {session}` for a full report)"
        )


class RecordTooLarge(JournalError, ValueError):
    """A single record is larger than the journal accepts; big values belong outside it."""


class UntrustedJournal(JournalError, PermissionError):
    """A journal file (or its directory) is owned by another user or writable by others.

    Replay unpickles values from the journal, so such a file could run code in the
    controller: it is refused before anything is read from it.
    """
