"""SQLite leases expire on the machine's monotonic clock: wall-clock steps move neither a live
lease nor a dead one, and a file written by an older version (wall-clock leases) stays safe.

The wall clock cannot be stepped in a test; a step is the same, seen from the lease row, as
its wall-clock expiry moving by the step the other way, which is what these tests write."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from regent.journal.batching import Batch
from regent.journal.codec import encode_batch, encode_record
from regent.journal.sqlite_store import SqliteStore, monotonic_clock_id

pytestmark = pytest.mark.skipif(
    monotonic_clock_id() is None, reason="no boot id (/proc/sys/kernel/random/boot_id): not Linux"
)

_HOUR = 3600.0

# The leader table as versions before monotonic leases created it.
_OLD_LEADER_TABLE = """
CREATE TABLE leader (
    session TEXT PRIMARY KEY, holder TEXT NOT NULL, epoch INTEGER NOT NULL,
    expires_at REAL NOT NULL);
CREATE TABLE epochs (session TEXT PRIMARY KEY, last_epoch INTEGER NOT NULL);
"""


def _raw(path: Path, sql: str, *args: object) -> list:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _batch(lsn: int, epoch: int) -> list[Batch]:
    return [Batch(lsn, 1, encode_batch([encode_record(lsn, epoch, "call", {}, 0.0)]))]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


def test_a_lease_renewed_just_before_the_wall_clock_steps_back_runs_out_after_its_ttl(db: Path):
    primary, standby = SqliteStore(db), SqliteStore(db)
    assert primary.try_acquire("s", "primary", 0.3) is not None
    _raw(db, "UPDATE leader SET expires_at = expires_at + ?", _HOUR)  # the clock went back 1 h
    assert standby.try_acquire("s", "standby", 0.3) is None  # still within its ttl
    time.sleep(0.4)
    # The primary stopped renewing: its lease is over after 0.3 s, not an hour later.
    assert standby.incumbent("s") is None
    assert standby.try_acquire("s", "standby", 0.3) is not None
    primary.close()
    standby.close()


def test_a_live_lease_survives_the_wall_clock_stepping_forward(db: Path):
    primary, standby = SqliteStore(db), SqliteStore(db)
    grant = primary.try_acquire("s", "primary", 5.0)
    assert grant is not None
    _raw(db, "UPDATE leader SET expires_at = expires_at - ?", _HOUR)  # the clock jumped 1 h
    assert standby.try_acquire("s", "standby", 5.0) is None
    assert standby.leader("s") == ("primary", grant.epoch)
    primary.put_batches(grant, _batch(0, grant.epoch))  # its writes still pass the fence
    assert primary.refresh(grant)
    primary.close()
    standby.close()


def test_the_wall_clock_expiry_is_kept_for_older_versions_reading_the_file(db: Path):
    store = SqliteStore(db)
    before = time.time()
    assert store.try_acquire("s", "primary", 5.0) is not None
    ((wall, clock),) = _raw(db, "SELECT expires_at, clock FROM leader")
    assert before + 5.0 <= wall <= time.time() + 5.0
    assert clock == monotonic_clock_id()
    store.close()


def test_a_lease_written_in_another_boot_is_taken_over_at_once(db: Path):
    primary, standby = SqliteStore(db), SqliteStore(db)
    assert primary.try_acquire("s", "primary", 5.0) is not None
    # What the row looks like after a reboot: the clock it was judged on has restarted.
    _raw(db, "UPDATE leader SET clock = 'monotonic:another-boot', mono_expires_at = 1e12")
    assert standby.incumbent("s") is None
    assert standby.try_acquire("s", "standby", 5.0) is not None
    primary.close()
    standby.close()


def test_a_file_from_an_older_version_keeps_its_wall_clock_leases_until_they_run_out(db: Path):
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(_OLD_LEADER_TABLE)
    # An older version's live leader, and one whose lease ran out a minute ago.
    conn.execute("INSERT INTO leader VALUES ('live', 'old-primary', 3, ?)", (time.time() + _HOUR,))
    conn.execute("INSERT INTO leader VALUES ('dead', 'old-primary', 4, ?)", (time.time() - 60,))
    conn.execute("INSERT INTO epochs VALUES ('live', 3), ('dead', 4)")
    conn.close()

    store = SqliteStore(db)
    columns = {row[1] for row in _raw(db, "PRAGMA table_info(leader)")}
    assert {"mono_expires_at", "clock"} <= columns
    assert store.leader("live") == ("old-primary", 3)
    assert store.try_acquire("live", "new", 5.0) is None
    grant = store.try_acquire("dead", "new", 5.0)
    assert grant is not None and grant.epoch == 5
    store.put_batches(grant, _batch(0, grant.epoch))
    store.close()
    # A second open finds the columns there and changes nothing.
    SqliteStore(db).close()
