"""Whether a SQLite journal file may be trusted: it and its directory must be safe from
other users before a single record is read, because replay unpickles what the journal holds.

Plain os/stat checks, no SQLite: `SqliteStore` runs them before it connects. An etcd journal
is trusted as far as the store authenticates its clients (see README, Security).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog

from .errors import UntrustedJournal

log = structlog.get_logger("journal.trust")

# SQLite's companion files: the write-ahead log is replayed into the database on open.
COMPANIONS = ("-wal", "-shm", "-journal")


def _mode(st: os.stat_result) -> str:
    return oct(stat.S_IMODE(st.st_mode))


def _check_directory(directory: Path, journal: Path) -> None:
    """Others must not be able to put another file in the journal's place."""
    st = os.stat(directory)
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UntrustedJournal(
            f"the journal's directory {directory} belongs to uid {st.st_uid}, not to you "
            f"(uid {me}) or root: its owner could replace {journal.name}. Keep the journal "
            "in a directory of your own (e.g. the default $REGENT_HOME)")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UntrustedJournal(
            f"the journal's directory {directory} is writable by group or others (mode "
            f"{_mode(st)}): they could replace {journal.name}. Fix it with `chmod go-w "
            f"{directory}` (`chmod 700 {directory}` for a regent home), or keep the journal "
            "in a directory of your own")


def _check_file(path: Path, st: os.stat_result) -> None:
    me = os.geteuid()
    if st.st_uid != me:
        raise UntrustedJournal(
            f"journal file {path} belongs to uid {st.st_uid}, not to you (uid {me}): replay "
            "unpickles what it holds, so it could run its owner's code in this controller. "
            f"Use a journal of your own, or, if you trust it, `chown {me} {path}` and "
            f"`chmod 600 {path}`")
    if st.st_mode & 0o022:
        raise UntrustedJournal(
            f"journal file {path} is writable by group or others (mode {_mode(st)}): replay "
            "unpickles what it holds, so anyone who can write it can run code in this "
            f"controller. Fix it with `chmod 600 {path}` once you trust its contents")
    if st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
        log.warning("made the journal file private (it was readable by others)", path=str(path),
                    was=_mode(st), now="0o600")


def prepare_journal_file(path: Path) -> Path:
    """Check (or create, mode 0600, in a directory made 0700) the journal file at `path`
    and its SQLite companions; raise UntrustedJournal, saying how to fix it, if another
    user owns any of them or others can write them. Returns the file's resolved path."""
    me = os.geteuid()
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        link = None
    if link is not None and stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise UntrustedJournal(
            f"journal path {path} is a symbolic link owned by uid {link.st_uid}: its owner "
            "chooses which file is read. Give the journal's real path")
    real = path.resolve()
    real.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _check_directory(real.parent, real)
    try:
        fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)  # a new file: SQLite gives its companions the same mode
    except FileExistsError:
        pass
    _check_file(real, os.stat(real))
    for suffix in COMPANIONS:
        companion = real.with_name(real.name + suffix)
        try:
            st = os.stat(companion)
        except FileNotFoundError:
            continue
        _check_file(companion, st)
    return real
