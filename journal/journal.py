"""The journal as the controller sees it: open a store by url, campaign, read, verify, compact.

Backend-neutral: everything here runs unchanged over etcd and SQLite.
"""

from __future__ import annotations

import os
import socket
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from . import codec
from .backend import Backend
from .election import Leadership, campaign
from .errors import CorruptRecord, repair_hint
from .records import Record, SessionInfo, VerifyReport
from .repair import RepairPlan, plan_repair
from .verify import verify_batches

log = structlog.get_logger("journal")

_FORBIDDEN_IN_NAMES = ("/", "\0")


def default_url() -> str:
    """$REGENT_JOURNAL when set (a launcher's way to configure a program without editing it),
    else sqlite at $REGENT_HOME/journal.db (default ~/.regent/journal.db)."""
    if os.environ.get("REGENT_JOURNAL"):
        return os.environ["REGENT_JOURNAL"]
    home = os.environ.get("REGENT_HOME") or str(Path.home() / ".regent")
    return f"sqlite://{Path(home).expanduser().resolve() / 'journal.db'}"


def _check_session(session: str) -> None:
    if not isinstance(session, str) or not session:
        raise ValueError(f"a session name must be a non-empty str, got {session!r}")
    if session == "clusters":  # etcd keeps host registrations under /regent/clusters/
        raise ValueError("the session name 'clusters' is reserved for host registrations: choose another")
    if any(c in session for c in _FORBIDDEN_IN_NAMES) or len(session) > 200:
        raise ValueError(
            f"session name {session!r} may not contain '/' or NUL and must be at most 200 "
            "characters"
        )


def open_journal(url: str | None = None) -> Journal:
    """Open the journal at `url`: "etcd://host:port[,host:port...]", the same with TLS as
    "etcds://host:port[,...]?ca=PATH&cert=PATH&key=PATH", or "sqlite:///abs/path.db".

    etcd urls may add `user=NAME` (password from $REGENT_ETCD_PASSWORD, never the url); a
    plain etcd:// url uses TLS when $REGENT_ETCD_CA, _CERT or _KEY is set (see etcd_target.py).
    None opens $REGENT_JOURNAL if set, else the embedded default, SQLite at
    $REGENT_HOME/journal.db (~/.regent/journal.db).
    Raises JournalUnavailable, naming the address and what to do, if the store is unreachable,
    JournalAccessDenied if it refuses this client's certificate, user or password, and
    UntrustedJournal if a SQLite file (or its -wal, -shm or directory) is another user's
    or others can write it: replay unpickles what a journal holds. An etcd journal is
    trusted as far as etcd authenticates its clients.
    """
    url = url or default_url()
    scheme, _, rest = url.partition("://")
    if scheme in ("etcd", "etcds"):
        from .etcd_store import EtcdStore
        from .etcd_target import parse_etcd_url

        return Journal(EtcdStore(parse_etcd_url(url)))
    if scheme == "sqlite":
        if not rest.startswith("/"):
            raise ValueError(
                f"sqlite journal url {url!r} needs an absolute path: sqlite:///abs/path.db"
            )
        from .sqlite_store import SqliteStore

        return Journal(SqliteStore(rest))
    from .etcd_target import USAGE, redact

    raise ValueError(f"unknown journal url {redact(url)!r}: use {USAGE} or sqlite:///abs/path.db")


def _torn_tail_or(
    exc: CorruptRecord, session: str, rest: Iterator[tuple[int, bytes]]
) -> CorruptRecord:
    """The error for a batch that failed to decode: one naming `regent journal repair` when
    it starts a torn tail (no batch after it decodes), else `exc` as it was."""
    for first, value in rest:
        try:
            codec.decode_batch(value, session, first)
        except CorruptRecord:
            continue
        return exc
    return CorruptRecord(
        session, exc.lsn, f"{exc.problem}; the log ends in this torn batch", hint=repair_hint(session)
    )


def _led_by(current: tuple[str, int], session: str) -> str:
    return (
        f"{current[0]!r} leads it (epoch {current[1]}); stop that controller, or wait for its "
        "lease to run out, then run repair again"
    )


class Journal:
    """A journal store holding many sessions."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        # Leaderships own keepalive threads; closing the journal stops them.
        self._leaderships: weakref.WeakSet[Leadership] = weakref.WeakSet()

    @property
    def url(self) -> str:
        return self._backend.url

    @property
    def backend(self) -> Backend:
        return self._backend

    def campaign(
        self,
        session: str,
        holder: str,
        *,
        ttl_s: float = 2.0,
        timeout: float | None = None,
        on_waiting: Callable[[], None] | None = None,
        beacon_host: str | None = None,
        poll_s: Callable[[], float] | None = None,
    ) -> Leadership:
        """Block until `holder` leads `session` and return its Leadership.

        A standby waits here; `on_waiting` is called once if it has to wait. It takes over
        when the leader resigns, when its lease runs out, or at once when the leader's
        liveness beacon shows its process gone (journal/beacon.py; REGENT_BEACON=0 turns
        that off). The beacon listens on `beacon_host` (default $REGENT_BEACON_HOST, else
        loopback): standbys on other machines must reach it. Raises TimeoutError after
        `timeout` seconds. `poll_s()`: how long to wait before looking again (default the
        store's interval; a standby that asked for a hand-over looks more often).
        """
        _check_session(session)
        lead = campaign(
            self._backend, session, holder, ttl_s=ttl_s, timeout=timeout, on_waiting=on_waiting,
            beacon_host=beacon_host, poll_s=poll_s,
        )
        self._leaderships.add(lead)
        return lead

    def _compacted(self, session: str) -> list[tuple[int, int]]:
        return codec.merge_ranges(codec.decode_ranges(self._backend.get_compacted(session), session))

    def read(self, session: str, start_lsn: int = 0) -> Iterator[Record]:
        """Yield the session's records from `start_lsn` on, checksums verified.

        The records, and the compaction note that explains their gaps, come from one
        snapshot of the store: a compaction running meanwhile is seen entirely or not at all.
        Raises CorruptRecord naming the lsn on a checksum failure, a torn record, or a gap
        that no compaction accounts for; on a torn tail it names `regent journal repair`.
        """
        _check_session(session)
        expected = start_lsn
        decode = codec.decode_batch
        with self._backend.read_log(session, start_lsn) as snapshot:
            ranges: list[tuple[int, int]] | None = None
            batches = iter(snapshot)
            for first, value in batches:
                try:
                    records = decode(value, session, first)
                except CorruptRecord as exc:
                    raise _torn_tail_or(exc, session, batches) from exc.__cause__
                if first > expected:
                    if ranges is None:
                        ranges = codec.merge_ranges(codec.decode_ranges(snapshot.compacted, session))
                    if not codec.covered(ranges, expected, first):
                        raise CorruptRecord(
                            session, expected, f"gap: lsn {expected}..{first - 1} missing"
                        )
                if first < start_lsn:
                    records = records[start_lsn - first :]
                elif first < expected:
                    raise CorruptRecord(session, first, f"lsn {first}..{expected - 1} stored twice")
                if records:
                    expected = records[-1].lsn + 1
                yield from records

    def read_checkpoint(self, session: str) -> dict[str, Any] | None:
        """The latest checkpoint as {"lsn", "epoch", "ts", "data"}, or None.

        `lsn` is the first record the checkpoint does not cover: replay restores `data`,
        then reads from `lsn` (after any prologue kept before it).
        """
        _check_session(session)
        raw = self._backend.get_checkpoint(session)
        return None if raw is None else codec.decode_checkpoint(raw, session)

    def sessions(self) -> list[SessionInfo]:
        """A summary of every session in this store."""
        return [self.session_info(name) for name in self._backend.session_names()]

    def session_info(self, session: str) -> SessionInfo:
        _check_session(session)
        backend = self._backend
        leader = backend.leader(session)
        first = backend.first_batch(session)
        last = backend.last_batch(session)
        raw_ckpt = backend.get_checkpoint(session)
        ckpt_lsn = None
        if raw_ckpt is not None:
            try:
                ckpt_lsn = int(codec.decode_checkpoint(raw_ckpt, session)["lsn"])
            except CorruptRecord:
                ckpt_lsn = None
        if first is None or last is None:
            return SessionInfo(
                session,
                0,
                None,
                None,
                leader and leader[0],
                leader and leader[1],
                None,
                False,
                ckpt_lsn,
            )
        problem = None
        last_write = None
        ended = False
        try:
            tail = codec.decode_batch(last[1], session, last[0])[-1]
            last_lsn, last_write, ended = tail.lsn, tail.ts, tail.kind == "session_end"
        except CorruptRecord as exc:
            # One damaged session must not hide the others from a listing.
            problem = str(exc)
            try:
                last_lsn = last[0] + codec.batch_count(last[1], session, last[0]) - 1
            except CorruptRecord:
                last_lsn = last[0]
        records = last_lsn + 1 - first[0]
        for lo, hi in self._compacted(session):
            records -= max(0, min(hi, last_lsn + 1) - max(lo, first[0]))
        return SessionInfo(
            name=session,
            records=records,
            first_lsn=first[0],
            last_lsn=last_lsn,
            leader=leader[0] if leader else None,
            epoch=leader[1] if leader else None,
            last_write=last_write,
            ended=ended,
            checkpoint_lsn=ckpt_lsn,
            problem=problem,
        )

    def verify(self, session: str) -> VerifyReport:
        """Check checksums, lsn contiguity and epoch order of a whole session."""
        _check_session(session)
        return self._judge_log(session, verify_batches)

    def compact(self, session: str, keep_before_lsn: int | None = None) -> int:
        """Delete records covered by the checkpoint, keeping those below `keep_before_lsn`.

        Only whole stored batches are removed, so a few covered records may stay. The removed
        range is noted so that `verify` accepts the gap. Returns the number removed. Safe
        beside a live leader and a takeover: every read of the log is one snapshot.
        """
        _check_session(session)
        with self._backend.read_log(session, keep_before_lsn or 0) as snapshot:
            raw = snapshot.checkpoint
            if raw is None:
                return 0
            ckpt_lsn = int(codec.decode_checkpoint(raw, session)["lsn"])
            keep = keep_before_lsn or 0
            lo = hi = None
            removed = 0
            for first, value in snapshot:
                if first < keep:
                    continue
                end = first + codec.batch_count(value, session, first)
                if end > ckpt_lsn:
                    break
                lo = first if lo is None else lo
                hi = end
                removed += end - first
        if lo is None or hi is None:
            return 0
        # Note first, delete second: a crash in between leaves records inside a noted range,
        # which verify accepts, never an unexplained gap.
        ranges = codec.merge_ranges([*self._compacted(session), (lo, hi)])
        self._backend.put_compacted(session, codec.encode_ranges(ranges))
        self._backend.delete_batches(session, lo, hi)
        log.info("compacted", session=session, lsns=f"{lo}..{hi - 1}", records=removed)
        return removed

    def repair(self, session: str, *, dry_run: bool = False, ttl_s: float = 10.0) -> RepairPlan:
        """Drop the session's torn tail (see journal/repair.py for the exact rule).

        Refused (nothing dropped, `plan.refused` says why) while a live leader holds the
        session, or when the log holds damage other than a torn tail. Otherwise it leads the
        session for the moment it takes, deletes exactly the inspected batches under that
        lease, and resigns. `dry_run` reports what it would drop and changes nothing.
        """
        _check_session(session)
        backend = self._backend
        if dry_run:
            plan = self._plan_repair(session)
            current = backend.leader(session)
            if plan.ok and current is not None:
                plan.refused = _led_by(current, session)
            return plan
        holder = f"regent-journal-repair:{socket.gethostname()}:{os.getpid()}"
        grant = backend.try_acquire(session, holder, ttl_s)
        if grant is None:
            current = backend.leader(session)
            return RepairPlan(
                session, refused=_led_by(current, session) if current else "its leader changed "
                "while repair started; run it again"
            )
        try:
            plan = self._plan_repair(session)
            if plan.ok:
                backend.drop_tail(grant, [(b.first_lsn, b.value) for b in plan.tail])
                log.warning(
                    "dropped a torn tail",
                    session=session,
                    batches=[b.describe() for b in plan.tail],
                    epoch=grant.epoch,
                )
        finally:
            backend.release(grant)
        return plan

    def _plan_repair(self, session: str) -> RepairPlan:
        return self._judge_log(session, plan_repair)

    def _judge_log(self, session: str, judge: Any) -> Any:
        """`judge(session, batches, compacted=, checkpoint=)` over one snapshot of the log."""
        with self._backend.read_log(session, 0) as snapshot:
            return judge(
                session,
                snapshot,
                compacted=codec.merge_ranges(codec.decode_ranges(snapshot.compacted, session)),
                checkpoint=snapshot.checkpoint,
            )

    def delete_session(self, session: str) -> None:
        """Remove every trace of a session except its epoch history (tests and tools)."""
        _check_session(session)
        self._backend.delete_session(session)

    def close(self) -> None:
        """Resign every leadership still held through this journal, then close the store."""
        for lead in list(self._leaderships):
            try:
                lead.close()
            except Exception as exc:
                log.warning("could not resign on close", session=lead.session, error=str(exc))
        self._backend.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
