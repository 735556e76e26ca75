"""Errors raised by the journal.

Each one says what failed, for which session, and what the caller can do about it.
"""

from __future__ import annotations


class JournalError(Exception):
    """Base class for every error the journal raises on purpose."""


class JournalUnavailable(JournalError):
    """The journal's store (etcd or the SQLite file) cannot be reached or opened."""


class JournalAccessDenied(JournalError):
    """The store refused this client: its TLS certificate, its user or password, or the
    user's permissions. Retrying does not help; the configuration must change."""


class LeadershipLost(JournalError):
    """This holder no longer leads the session: its lease expired or another holder took over.

    A controller that sees this must stop writing and stop driving workers at once.
    """


class CorruptRecord(JournalError):
    """A stored record failed its checksum, is torn, or is missing from the sequence."""

    def __init__(
        self, session: str, lsn: int | None, problem: str, *, hint: str | None = None
    ) -> None:
        self.session = session
        self.lsn = lsn
        self.problem = problem
        where = f"session {session!r}" if lsn is None else f"session {session!r} lsn {lsn}"
        hint = hint or f"run `regent journal verify {session}` for a full report"
        super().__init__(f"{where}: {problem} ({hint})")


def repair_hint(session: str) -> str:
    """What to do about a torn tail: the command that drops it."""
    return (
        f"run `regent journal repair {session} --dry-run` to see what it would drop, then "
        f"`regent journal repair {session}` to drop it"
    )


class RecordTooLarge(JournalError, ValueError):
    """A single record is larger than the journal accepts; big values belong outside it."""


class UntrustedJournal(JournalError, PermissionError):
    """A journal file (or its directory) is owned by another user or writable by others.

    Replay unpickles values from the journal, so such a file could run code in the
    controller: it is refused before anything is read from it.
    """


class HostTaken(JournalError):
    """A live registration holds this host id (its lease has not run out): joining would take
    it from an agent that still renews it. `holder` is that registration's stored value."""

    def __init__(self, cluster: str, host_id: str, holder: bytes) -> None:
        self.cluster, self.host_id, self.holder = cluster, host_id, holder
        super().__init__(f"host {host_id!r} of cluster {cluster!r} is registered by a live agent")
