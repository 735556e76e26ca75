"""The storage contract both backends (etcd, SQLite) implement for the journal.

A backend stores opaque batch values under (session, first lsn), holds one leader per session
with a lease, and makes every write conditional on still holding it. It knows nothing of
record contents beyond what it is handed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from .batching import Batch

# A leader's beacon address travels in the stored holder value, after this tag, so that one
# exact comparison of that value still fences every write.
_BEACON_TAG = " beacon="


def stored_holder(holder: str, beacon: str | None) -> str:
    """The holder value a backend stores for `holder` serving a beacon at `beacon`."""
    return holder if beacon is None else f"{holder}{_BEACON_TAG}{beacon}"


def parse_stored_holder(value: str) -> tuple[str, str | None]:
    """(holder, beacon address or None) of a stored holder value."""
    holder, tag, beacon = value.rpartition(_BEACON_TAG)
    if not tag or not holder or not beacon:
        return value, None
    return holder, beacon


@dataclass(frozen=True, slots=True)
class Grant:
    """Proof of leadership: who leads which session, in which epoch, under which lease."""

    session: str
    holder: str
    epoch: int
    lease_id: int
    ttl_s: float
    # time.monotonic() just before the lease was requested: the lease runs from no later.
    requested_at: float
    # host:port of the holder's liveness beacon (journal/beacon.py), if it serves one.
    beacon: str | None = None

    @property
    def stored_holder(self) -> str:
        """The exact holder value in the store, which every fenced write compares."""
        return stored_holder(self.holder, self.beacon)


@dataclass(frozen=True, slots=True)
class Incumbent:
    """A session's current leader as the store holds it: what a standby may watch or evict."""

    holder: str
    epoch: int
    beacon: str | None = None

    @classmethod
    def from_stored(cls, value: str, epoch: int) -> Incumbent:
        holder, beacon = parse_stored_holder(value)
        return cls(holder, epoch, beacon)

    @property
    def stored_holder(self) -> str:
        return stored_holder(self.holder, self.beacon)


class LogSnapshot:
    """A session's log as of one moment: its batches, its compaction note and its checkpoint
    all read from one store snapshot, so a compaction running meanwhile cannot tear the read.

    Iterate it once for (first lsn, value) in lsn order; close it (or exhaust it) to end the
    store's read transaction.
    """

    def __init__(
        self,
        compacted: bytes | None,
        checkpoint: bytes | None,
        batches: Iterator[tuple[int, bytes]],
        close: Callable[[], None] | None = None,
    ) -> None:
        self.compacted = compacted
        self.checkpoint = checkpoint
        # The store's reader; a backend may set it after building the snapshot it updates.
        self.batches = batches
        self._close = close

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return self.batches

    def close(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            close()

    def __enter__(self) -> LogSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class HostLease:
    """A host agent's registration in a cluster: its key lives while the lease is renewed."""

    cluster: str
    host_id: str
    lease_id: int | str  # etcd's lease id; SQLite's row token
    ttl_s: float


class Backend(Protocol):
    url: str
    # How often a standby polls for a free leader slot.
    poll_interval_s: float

    def try_acquire(
        self, session: str, holder: str, ttl_s: float, *, beacon: str | None = None
    ) -> Grant | None:
        """Become leader if nobody is; return None if someone else leads.

        `beacon` (host:port) is stored with the holder, for standbys to watch.
        """

    def refresh(self, grant: Grant) -> bool:
        """Renew the lease; False if it is gone. Raises on transient errors."""

    def release(self, grant: Grant, *, within_s: float = 3.0) -> None:
        """Give up leadership at once (a standby may take over immediately).

        Transient store errors are retried for `within_s` seconds.
        """

    def leader(self, session: str) -> tuple[str, int] | None:
        """Current (holder, epoch) of a session, or None."""

    def incumbent(self, session: str) -> Incumbent | None:
        """Current leader of a session with its beacon address, or None."""

    def evict(self, session: str, leader: Incumbent) -> bool:
        """End exactly `leader`'s leadership now, as if its lease had run out.

        Conditioned on the stored holder value and the epoch both matching, so a newer leader
        (even one with the same holder name) is never touched. True if it was evicted, False
        if it no longer led. Safe against a live leader: its next write is refused by the
        fencing every write carries, and it notices at its next lease renewal.
        """

    def put_batches(self, grant: Grant, batches: list[Batch]) -> None:
        """Store batches atomically, only if `grant` still leads; else raise LeadershipLost.

        Must be idempotent: storing batches that are already there with the same content
        (a retry after an ambiguous failure) succeeds.
        """

    def put_checkpoint(self, grant: Grant, value: bytes) -> None:
        """Store the session's checkpoint, only if `grant` still leads."""

    def get_checkpoint(self, session: str) -> bytes | None: ...

    def iter_batches(self, session: str, start_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        """(first lsn, value) of every batch holding lsns >= start_lsn, in lsn order."""

    def read_log(self, session: str, start_lsn: int = 0) -> LogSnapshot:
        """Every batch holding lsns >= start_lsn, with the compaction note and checkpoint, as
        of one snapshot of the store (see LogSnapshot)."""

    def first_batch(self, session: str) -> tuple[int, bytes] | None: ...

    def last_batch(self, session: str) -> tuple[int, bytes] | None: ...

    def delete_batches(self, session: str, lo_lsn: int, hi_lsn: int) -> None:
        """Delete the batches whose first lsn lies in [lo_lsn, hi_lsn)."""

    def drop_tail(self, grant: Grant, batches: list[tuple[int, bytes]]) -> None:
        """Delete exactly these stored batches (first lsn, value), the last of the log, only if
        `grant` still leads and each is still stored with that value; else raise
        LeadershipLost or JournalError and delete nothing. For `regent journal repair`."""

    def get_compacted(self, session: str) -> bytes | None: ...

    def put_compacted(self, session: str, value: bytes) -> None: ...

    def session_names(self) -> list[str]: ...

    def join_cluster(self, cluster: str, host_id: str, value: bytes, ttl_s: float,
                     replace: bytes | None = None) -> HostLease:
        """Register host `host_id` of `cluster` under a fresh lease of `ttl_s`: the entry
        vanishes when the lease is not renewed. A live entry of that id is replaced only when its
        value is exactly `replace`; otherwise HostTaken carries it. One atomic step."""

    def renew_host(self, lease: HostLease) -> bool:
        """Renew a host's lease; False once it has expired or the entry was replaced (the
        agent must join again, as a new incarnation). Raises on transient errors."""

    def leave_cluster(self, lease: HostLease) -> None:
        """Remove the registration now (best effort: it expires anyway)."""

    def cluster_hosts(self, cluster: str) -> list[tuple[str, bytes]]:
        """(host id, value) of every host of `cluster` whose lease still runs, by id."""

    def cluster_version(self, cluster: str) -> tuple[int, int] | None:
        """A value that differs between two looks whenever a host of `cluster` joined, joined
        again, left or expired in between, so a watcher lists the hosts only then; None where
        the store cannot tell cheaply (the watcher lists every time)."""

    def watch_cluster(self, cluster: str, changed: Callable[[bool], None]) -> Callable[[], None] | None:
        """Call `changed(True)`, on a thread of the store's, when a host record or value of
        `cluster` may have changed, and `changed(False)` once if the watch breaks (the store
        went away); returns what cancels it, or None where the store cannot watch."""

    def claim_cluster_value(self, cluster: str, name: str, value: bytes) -> bytes:
        """Store `value` as `cluster`'s `name` unless one is stored already; the stored one
        (first writer wins: a cluster-wide fact, such as its run having ended)."""

    def cluster_value(self, cluster: str, name: str) -> bytes | None:
        """`cluster`'s value `name`, or None."""

    def delete_session(self, session: str) -> None: ...

    def close(self) -> None: ...
