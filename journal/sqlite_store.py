"""The embedded journal backend: one SQLite file in WAL mode, shared by every process on a host.

Leadership is a row with an expiry time refreshed by the leader's keepalive; the epoch is a
per-session counter that only grows. Every write checks the leader row inside the same
`BEGIN IMMEDIATE` transaction, which is what fences a deposed leader.

Lease expiry is judged on CLOCK_MONOTONIC (`time.monotonic()` on Linux), which every process
on the machine reads alike and which wall-clock steps do not move; the row names the boot it
was written in, since that clock restarts at each boot. A row without one (written by a
version before these leases) is judged on the wall clock, as that version judged it.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import structlog
import tenacity

from .backend import Grant, HostLease, Incumbent, LogSnapshot, parse_stored_holder, stored_holder
from .batching import Batch
from .errors import HostTaken, JournalError, JournalUnavailable, LeadershipLost, UntrustedJournal
from .trust import prepare_journal_file

log = structlog.get_logger("journal.sqlite")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leader (
    session TEXT PRIMARY KEY, holder TEXT NOT NULL, epoch INTEGER NOT NULL,
    expires_at REAL NOT NULL, mono_expires_at REAL, clock TEXT);
CREATE TABLE IF NOT EXISTS epochs (session TEXT PRIMARY KEY, last_epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log (
    session TEXT NOT NULL, first_lsn INTEGER NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (session, first_lsn));
CREATE TABLE IF NOT EXISTS checkpoint (session TEXT PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS compacted (session TEXT PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS hosts (
    cluster TEXT NOT NULL, id TEXT NOT NULL, body BLOB NOT NULL, token TEXT NOT NULL,
    ttl REAL NOT NULL, expires_at REAL NOT NULL, mono_expires_at REAL, clock TEXT,
    PRIMARY KEY (cluster, id));
CREATE TABLE IF NOT EXISTS cluster_values (
    cluster TEXT NOT NULL, name TEXT NOT NULL, body BLOB NOT NULL, PRIMARY KEY (cluster, name));
"""

# Columns added to `leader` since the first version: the monotonic expiry and its clock.
# expires_at stays a wall-clock expiry, maintained for processes of older versions.
_LEASE_COLUMNS = (("mono_expires_at", "REAL"), ("clock", "TEXT"))

_PAGE = 512
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def monotonic_clock_id() -> str | None:
    """Names this boot's CLOCK_MONOTONIC, which restarts at each boot; None where the kernel
    gives no boot id (not Linux): leases then fall back to the wall clock."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        return None
    return f"monotonic:{boot}" if boot else None


def _locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


class SqliteStore:
    """Backend over one SQLite file; a connection per thread, since sqlite3 objects are not shared."""

    poll_interval_s = 0.02

    def __init__(
        self, path: str | Path, *, busy_timeout_s: float = 10.0, read_page: int = _PAGE
    ) -> None:
        if read_page < 1:
            raise ValueError(f"read_page must be at least 1, got {read_page}")
        self.path = Path(path)
        self._page = read_page
        self._clock = monotonic_clock_id()
        self.url = f"sqlite://{self.path}"
        self._busy_ms = int(busy_timeout_s * 1000)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        try:
            # Replay unpickles what the journal holds: refuse a file others could have written
            # (UntrustedJournal), before anything is read from it.
            prepare_journal_file(self.path)
        except UntrustedJournal:
            raise
        except OSError as exc:
            raise JournalUnavailable(
                f"cannot open the SQLite journal at {self.path}: {exc} "
                "(check that its directory can be created and written, or pass another "
                "journal url such as sqlite:///tmp/regent.db)"
            ) from exc
        try:
            # Two controllers opening one new file at once can get "database is locked" at
            # once (SQLite skips its busy handler where waiting could deadlock): try again.
            for attempt in tenacity.Retrying(
                retry=tenacity.retry_if_exception(_locked),
                wait=tenacity.wait_random_exponential(multiplier=0.01, max=0.2),
                stop=tenacity.stop_after_delay(busy_timeout_s),
                reraise=True,
            ):
                with attempt:
                    self._conn().executescript(_SCHEMA)
                    self._add_lease_columns()
        except (OSError, sqlite3.Error) as exc:
            raise JournalUnavailable(
                f"cannot open the SQLite journal at {self.path}: {exc} "
                "(check that the directory exists and is writable, or pass another "
                "journal url such as sqlite:///tmp/regent.db)"
            ) from exc

    def _add_lease_columns(self) -> None:
        """Bring a file written by an older version up to the current leader table; its rows
        keep a NULL clock and are judged on the wall clock until their holder goes."""
        conn = self._conn()
        have = {row[1] for row in conn.execute("PRAGMA table_info(leader)")}
        if all(name in have for name, _ in _LEASE_COLUMNS):
            return
        with self._write() as conn:
            have = {row[1] for row in conn.execute("PRAGMA table_info(leader)")}
            for name, kind in _LEASE_COLUMNS:
                if name not in have:
                    conn.execute(f"ALTER TABLE leader ADD COLUMN {name} {kind}")
        log.info("added monotonic lease columns to an older journal file", path=str(self.path))

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            # WAL + NORMAL: a commit survives the process being killed (it is in the OS page
            # cache) but not a power cut; REGENT_SQLITE_SYNC=FULL adds an fsync per commit.
            # Short commits matter here: a writer paused (SIGSTOP) inside a transaction holds
            # the file's write lock, and every standby waits until it resumes or dies.
            sync = os.environ.get("REGENT_SQLITE_SYNC", "NORMAL").upper()
            conn.execute(f"PRAGMA synchronous = {'FULL' if sync == 'FULL' else 'NORMAL'}")
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise JournalError(f"journal {self.url} is closed")
        conn = self._open()
        self._local.conn = conn
        with self._lock:
            self._all.append(conn)
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise JournalUnavailable(
                f"SQLite journal {self.path} stayed locked for {self._busy_ms} ms ({exc}); "
                "another process holds a long write transaction"
            ) from exc
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # leadership

    def _live(self, wall_expiry: float, mono_expiry: float | None, clock: str | None) -> bool:
        """Whether a leader row's lease still runs, on the clock it was written with."""
        if clock is None:
            # Written by a version before monotonic leases (or where there is no boot id).
            return wall_expiry > time.time()
        if clock != self._clock or mono_expiry is None:
            # Another boot's clock: the machine restarted since, and no process of that boot
            # still runs. (One file shared by two machines is outside SQLite's scope.)
            return False
        return mono_expiry > time.monotonic()

    def _expiries(self, ttl_s: float) -> tuple[float, float | None]:
        """(wall-clock expiry, monotonic expiry or None) of a lease granted or renewed now."""
        return time.time() + ttl_s, (None if self._clock is None else time.monotonic() + ttl_s)

    def _renew(self, conn: sqlite3.Connection, grant: Grant) -> bool:
        """Extend `grant`'s lease if it is still ours and still runs; the fence of every write."""
        wall, mono = self._expiries(grant.ttl_s)
        if self._clock is None:
            live, args = "clock IS NULL AND expires_at > ?", (time.time(),)
        else:
            live, args = "clock = ? AND mono_expires_at > ?", (self._clock, time.monotonic())
        cur = conn.execute(
            "UPDATE leader SET expires_at = ?, mono_expires_at = ? WHERE session = ? "
            f"AND holder = ? AND epoch = ? AND {live}",
            (wall, mono, grant.session, grant.stored_holder, grant.epoch, *args),
        )
        return cur.rowcount == 1

    def _leader_row(self, conn: sqlite3.Connection, session: str) -> tuple | None:
        """(holder, epoch, live) of the session's leader row, or None."""
        row = conn.execute(
            "SELECT holder, epoch, expires_at, mono_expires_at, clock FROM leader "
            "WHERE session = ?",
            (session,),
        ).fetchone()
        return None if row is None else (row[0], row[1], self._live(row[2], row[3], row[4]))

    def try_acquire(
        self, session: str, holder: str, ttl_s: float, *, beacon: str | None = None
    ) -> Grant | None:
        row = self._leader_row(self._conn(), session)
        if row is not None and row[2]:
            return None
        requested_at = time.monotonic()
        with self._write() as conn:
            row = self._leader_row(conn, session)
            if row is not None and row[2]:
                return None
            last = conn.execute(
                "SELECT last_epoch FROM epochs WHERE session = ?", (session,)
            ).fetchone()
            epoch = (last[0] if last else 0) + 1
            conn.execute(
                "INSERT INTO epochs (session, last_epoch) VALUES (?, ?) "
                "ON CONFLICT (session) DO UPDATE SET last_epoch = excluded.last_epoch",
                (session, epoch),
            )
            wall, mono = self._expiries(ttl_s)
            conn.execute(
                "INSERT OR REPLACE INTO leader "
                "(session, holder, epoch, expires_at, mono_expires_at, clock) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (session, stored_holder(holder, beacon), epoch, wall, mono, self._clock),
            )
        return Grant(session, holder, epoch, epoch, ttl_s, requested_at, beacon)

    def refresh(self, grant: Grant) -> bool:
        with self._write() as conn:
            return self._renew(conn, grant)

    def release(self, grant: Grant, *, within_s: float = 3.0) -> None:
        with self._write() as conn:
            conn.execute(
                "DELETE FROM leader WHERE session = ? AND holder = ? AND epoch = ?",
                (grant.session, grant.stored_holder, grant.epoch),
            )

    def incumbent(self, session: str) -> Incumbent | None:
        row = self._leader_row(self._conn(), session)
        if row is None or not row[2]:
            return None
        return Incumbent.from_stored(row[0], row[1])

    def leader(self, session: str) -> tuple[str, int] | None:
        current = self.incumbent(session)
        return None if current is None else (current.holder, current.epoch)

    def evict(self, session: str, leader: Incumbent) -> bool:
        with self._write() as conn:
            cur = conn.execute(
                "DELETE FROM leader WHERE session = ? AND holder = ? AND epoch = ?",
                (session, leader.stored_holder, leader.epoch),
            )
            return cur.rowcount == 1

    def _check_leader(self, conn: sqlite3.Connection, grant: Grant, what: str) -> None:
        row = self._leader_row(conn, grant.session)
        if row is not None and (row[0], row[1]) == (grant.stored_holder, grant.epoch) and row[2]:
            return
        if row is None or not row[2]:
            now_held = "nobody holds it now"
        else:
            now_held = f"{parse_stored_holder(row[0])[0]!r} holds it in epoch {row[1]}"
        raise LeadershipLost(
            f"{what} refused: {grant.holder!r} no longer leads session {grant.session!r} "
            f"(its epoch {grant.epoch} lease expired or was taken over; {now_held})"
        )

    # log

    # An append proves the leader alive as well as a keepalive does, and under a busy
    # writer the keepalive's own transaction can lose every race for the file lock.
    renews_on_write = True

    def put_batches(self, grant: Grant, batches: list[Batch]) -> None:
        with self._write() as conn:
            # The fence and the lease renewal in one statement: only a live lease of ours
            # matches (the SELECT that explains a refusal runs only then).
            if not self._renew(conn, grant):
                self._check_leader(conn, grant, "append")
            for batch in batches:
                try:
                    conn.execute(
                        "INSERT INTO log (session, first_lsn, body) VALUES (?, ?, ?)",
                        (grant.session, batch.first_lsn, batch.value),
                    )
                except sqlite3.IntegrityError:
                    row = conn.execute(
                        "SELECT body FROM log WHERE session = ? AND first_lsn = ?",
                        (grant.session, batch.first_lsn),
                    ).fetchone()
                    if row is None or bytes(row[0]) != batch.value:
                        raise JournalError(
                            f"session {grant.session!r}: lsn {batch.first_lsn} is already "
                            f"written with other content; two writers share epoch {grant.epoch}"
                        ) from None

    def put_checkpoint(self, grant: Grant, value: bytes) -> None:
        with self._write() as conn:
            self._check_leader(conn, grant, "checkpoint")
            conn.execute(
                "INSERT OR REPLACE INTO checkpoint (session, body) VALUES (?, ?)",
                (grant.session, value),
            )

    def get_checkpoint(self, session: str) -> bytes | None:
        row = (
            self._conn()
            .execute("SELECT body FROM checkpoint WHERE session = ?", (session,))
            .fetchone()
        )
        return None if row is None else bytes(row[0])

    def iter_batches(self, session: str, start_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        return self._pages(self._conn(), session, start_lsn)

    def _pages(
        self, conn: sqlite3.Connection, session: str, start_lsn: int
    ) -> Iterator[tuple[int, bytes]]:
        row = conn.execute(
            "SELECT MAX(first_lsn) FROM log WHERE session = ? AND first_lsn <= ?",
            (session, start_lsn),
        ).fetchone()
        cursor_lsn = start_lsn if row[0] is None else row[0]
        while True:
            rows = conn.execute(
                "SELECT first_lsn, body FROM log WHERE session = ? AND first_lsn >= ? "
                "ORDER BY first_lsn LIMIT ?",
                (session, cursor_lsn, self._page),
            ).fetchall()
            yield from rows
            if len(rows) < self._page:
                return
            cursor_lsn = rows[-1][0] + 1

    def read_log(self, session: str, start_lsn: int = 0) -> LogSnapshot:
        # A connection of its own, in one read transaction: in WAL mode every page then reads
        # the snapshot the first SELECT saw, whatever commits meanwhile, and the thread's own
        # connection stays free for writes while the read is under way.
        if self._closed:
            raise JournalError(f"journal {self.url} is closed")
        conn = self._open()
        try:
            conn.execute("BEGIN")
            row = conn.execute(
                "SELECT body FROM compacted WHERE session = ?", (session,)
            ).fetchone()
            compacted = None if row is None else bytes(row[0])
            row = conn.execute(
                "SELECT body FROM checkpoint WHERE session = ?", (session,)
            ).fetchone()
            checkpoint = None if row is None else bytes(row[0])
        except BaseException:
            conn.close()
            raise

        def end() -> None:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            conn.close()

        def batches() -> Iterator[tuple[int, bytes]]:
            try:
                for first, body in self._pages(conn, session, start_lsn):
                    yield first, bytes(body)
            finally:
                snapshot.close()

        snapshot = LogSnapshot(compacted, checkpoint, batches(), end)
        return snapshot

    def first_batch(self, session: str) -> tuple[int, bytes] | None:
        row = (
            self._conn()
            .execute(
                "SELECT first_lsn, body FROM log WHERE session = ? ORDER BY first_lsn LIMIT 1",
                (session,),
            )
            .fetchone()
        )
        return None if row is None else (row[0], bytes(row[1]))

    def last_batch(self, session: str) -> tuple[int, bytes] | None:
        row = (
            self._conn()
            .execute(
                "SELECT first_lsn, body FROM log WHERE session = ? ORDER BY first_lsn DESC LIMIT 1",
                (session,),
            )
            .fetchone()
        )
        return None if row is None else (row[0], bytes(row[1]))

    def delete_batches(self, session: str, lo_lsn: int, hi_lsn: int) -> None:
        with self._write() as conn:
            conn.execute(
                "DELETE FROM log WHERE session = ? AND first_lsn >= ? AND first_lsn < ?",
                (session, lo_lsn, hi_lsn),
            )

    def drop_tail(self, grant: Grant, batches: Sequence[tuple[int, bytes]]) -> None:
        if not batches:
            return
        with self._write() as conn:
            self._check_leader(conn, grant, "repair")
            for first, value in batches:
                gone = conn.execute(
                    "DELETE FROM log WHERE session = ? AND first_lsn = ? AND body = ?",
                    (grant.session, first, value),
                ).rowcount
                if gone != 1:
                    raise JournalError(
                        f"repair of session {grant.session!r} refused: the batch at lsn {first} "
                        "changed while it was inspected; nothing was dropped, run it again"
                    )
            after = conn.execute(
                "SELECT first_lsn FROM log WHERE session = ? AND first_lsn > ? LIMIT 1",
                (grant.session, batches[-1][0]),
            ).fetchone()
            if after is not None:
                raise JournalError(
                    f"repair of session {grant.session!r} refused: a batch at lsn {after[0]} "
                    "follows what was inspected as the tail; nothing was dropped, run it again"
                )

    def get_compacted(self, session: str) -> bytes | None:
        row = (
            self._conn()
            .execute("SELECT body FROM compacted WHERE session = ?", (session,))
            .fetchone()
        )
        return None if row is None else bytes(row[0])

    def put_compacted(self, session: str, value: bytes) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO compacted (session, body) VALUES (?, ?)", (session, value)
            )

    def session_names(self) -> list[str]:
        rows = (
            self._conn()
            .execute(
                "SELECT session FROM log UNION SELECT session FROM leader "
                "UNION SELECT session FROM checkpoint ORDER BY 1"
            )
            .fetchall()
        )
        return [r[0] for r in rows]

    # host registration: rows with a lease of their own, judged as leader rows are

    def join_cluster(self, cluster: str, host_id: str, value: bytes, ttl_s: float,
                     replace: bytes | None = None) -> HostLease:
        token = secrets.token_hex(8)
        wall, mono = self._expiries(ttl_s)
        with self._write() as conn:
            row = conn.execute(
                "SELECT body, expires_at, mono_expires_at, clock FROM hosts WHERE cluster = ? AND id = ?",
                (cluster, host_id),
            ).fetchone()
            if row is not None and self._live(row[1], row[2], row[3]) and bytes(row[0]) != replace:
                raise HostTaken(cluster, host_id, bytes(row[0]))
            conn.execute(
                "INSERT OR REPLACE INTO hosts (cluster, id, body, token, ttl, expires_at, "
                "mono_expires_at, clock) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (cluster, host_id, value, token, ttl_s, wall, mono, self._clock),
            )
        return HostLease(cluster, host_id, token, ttl_s)

    def renew_host(self, lease: HostLease) -> bool:
        with self._write() as conn:
            row = conn.execute(
                "SELECT token, expires_at, mono_expires_at, clock FROM hosts WHERE cluster = ? AND id = ?",
                (lease.cluster, lease.host_id),
            ).fetchone()
            if row is None or row[0] != lease.lease_id or not self._live(row[1], row[2], row[3]):
                return False
            wall, mono = self._expiries(lease.ttl_s)
            conn.execute(
                "UPDATE hosts SET expires_at = ?, mono_expires_at = ?, clock = ? "
                "WHERE cluster = ? AND id = ? AND token = ?",
                (wall, mono, self._clock, lease.cluster, lease.host_id, lease.lease_id),
            )
        return True

    def leave_cluster(self, lease: HostLease) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM hosts WHERE cluster = ? AND id = ? AND token = ?",
                         (lease.cluster, lease.host_id, lease.lease_id))

    def cluster_hosts(self, cluster: str) -> list[tuple[str, bytes]]:
        rows = self._conn().execute(
            "SELECT id, body, expires_at, mono_expires_at, clock FROM hosts WHERE cluster = ? ORDER BY id",
            (cluster,),
        ).fetchall()
        return [(r[0], bytes(r[1])) for r in rows if self._live(r[2], r[3], r[4])]

    def cluster_version(self, cluster: str) -> tuple[int, int] | None:
        return None  # records expire by the clock as they are read, not by a write: list them

    def watch_cluster(self, cluster: str, changed: Callable[[bool], None]) -> Callable[[], None] | None:
        return None  # no notifications between processes sharing the file: callers look

    def claim_cluster_value(self, cluster: str, name: str, value: bytes) -> bytes:
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO cluster_values (cluster, name, body) VALUES (?, ?, ?)",
                         (cluster, name, value))
            row = conn.execute("SELECT body FROM cluster_values WHERE cluster = ? AND name = ?",
                               (cluster, name)).fetchone()
        return bytes(row[0])

    def cluster_value(self, cluster: str, name: str) -> bytes | None:
        row = self._conn().execute("SELECT body FROM cluster_values WHERE cluster = ? AND name = ?",
                                   (cluster, name)).fetchone()
        return None if row is None else bytes(row[0])

    def delete_session(self, session: str) -> None:
        # The epoch counter stays: a recreated session must still never reuse an epoch.
        with self._write() as conn:
            for table in ("log", "leader", "checkpoint", "compacted"):
                conn.execute(f"DELETE FROM {table} WHERE session = ?", (session,))

    def close(self) -> None:
        self._closed = True
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()
