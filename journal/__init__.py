"""regent's journal: the durable, fenced record of every call a controller makes.

Storage only (etcd or SQLite): it knows records, sessions, leaders and epochs, never actors
or transports. See docs/design.md, "Journal storage in etcd".
"""

from .codec import MAX_RECORD_BYTES
from .election import Leadership
from .errors import (
    CorruptRecord,
    JournalAccessDenied,
    JournalError,
    JournalUnavailable,
    LeadershipLost,
    RecordTooLarge,
    UntrustedJournal,
)
from .group_commit import GroupCommitWriter
from .journal import Journal, default_url, open_journal
from .records import Record, SessionInfo, VerifyReport

__all__ = [
    "MAX_RECORD_BYTES",
    "CorruptRecord",
    "GroupCommitWriter",
    "Journal",
    "JournalAccessDenied",
    "JournalError",
    "JournalUnavailable",
    "Leadership",
    "LeadershipLost",
    "Record",
    "RecordTooLarge",
    "SessionInfo",
    "UntrustedJournal",
    "VerifyReport",
    "default_url",
    "open_journal",
]
