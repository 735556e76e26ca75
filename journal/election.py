"""Leader election and fencing for one session: campaign, keep the lease alive, write fenced.

A `Leadership` is the only way to write a session's journal. Its keepalive thread renews the
lease every ttl/3 and declares the leadership lost once a full ttl has passed without a
successful renewal; the store refuses writes from a deposed leader regardless. A leader also
serves a liveness beacon (journal/beacon.py), so that a standby can evict a leader whose
process is gone instead of waiting out its lease; the lease stays the only authority.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from . import codec
from .backend import Backend, Grant, Incumbent, parse_stored_holder
from .batching import pack
from .beacon import Beacon, BeaconWatch, Gone, beacon_enabled
from .errors import CorruptRecord, JournalError, JournalUnavailable, LeadershipLost, repair_hint

log = structlog.get_logger("journal.election")


def next_lsn_of(backend: Backend, session: str) -> int:
    """The first lsn a new leader of `session` will write."""
    nxt = 0
    last = backend.last_batch(session)
    if last is not None:
        first, value = last
        try:
            nxt = first + codec.batch_count(value, session, first)
        except CorruptRecord as exc:
            # A new leader cannot tell where to write: the session waits for a repair.
            raise CorruptRecord(
                session,
                first,
                f"the log's last batch is unreadable ({exc.problem})",
                hint=repair_hint(session),
            ) from exc
    raw = backend.get_checkpoint(session)
    if raw is not None:
        # Compaction may have removed everything the checkpoint covers.
        nxt = max(nxt, int(codec.decode_checkpoint(raw, session)["lsn"]))
    return nxt


def _describe_leader(backend: Backend, session: str) -> str:
    try:
        current = backend.leader(session)
    except JournalUnavailable:
        return f"the store at {backend.url} is unavailable"
    if current is None:
        return "it is free now"
    return f"{current[0]!r} holds it in epoch {current[1]}"


# How often a waiting standby reads who leads, to watch the right beacon.
_LOOK_INTERVAL_S = 1.0


def _evict(backend: Backend, session: str, holder: str, gone: Gone) -> None:
    try:
        evicted = backend.evict(session, gone.leader)
    except JournalUnavailable as exc:
        log.warning(
            "could not evict a leader whose process is gone; waiting for its lease instead",
            session=session,
            leader=gone.leader.holder,
            epoch=gone.leader.epoch,
            error=str(exc),
        )
        return
    if evicted:
        log.info(
            "evicted a dead leader",
            session=session,
            evicted=gone.leader.holder,
            epoch=gone.leader.epoch,
            by=holder,
            reason=gone.reason,
        )


def _incumbent(backend: Backend, session: str) -> Incumbent | None:
    try:
        return backend.incumbent(session)
    except JournalUnavailable:
        return None


def campaign(
    backend: Backend,
    session: str,
    holder: str,
    *,
    ttl_s: float = 2.0,
    timeout: float | None = None,
    on_waiting: Callable[[], None] | None = None,
    beacon_host: str | None = None,
    poll_s: Callable[[], float] | None = None,
) -> Leadership:
    """Block until `holder` leads `session`; see `Journal.campaign`.

    While it waits, it watches the current leader's beacon (unless REGENT_BEACON=0) and
    evicts that exact leader (same holder, same epoch) once its process is shown gone: see
    `BeaconWatch` for when that is, and why it is safe.
    """
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s}")
    if parse_stored_holder(holder)[1] is not None:
        raise ValueError(f"holder {holder!r} may not contain ' beacon=' (the store uses it)")
    deadline = None if timeout is None else time.monotonic() + timeout
    watching = beacon_enabled()
    beacon = Beacon.open(beacon_host) if watching else None
    watch: BeaconWatch | None = None
    wake = threading.Event()
    next_look = 0.0
    waited = False
    try:
        while True:
            try:
                grant = backend.try_acquire(
                    session, holder, ttl_s, beacon=None if beacon is None else beacon.address
                )
            except JournalUnavailable as exc:
                # A standby outlives store outages: it keeps waiting, within its own timeout.
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                log.warning("store unavailable while campaigning", session=session, error=str(exc))
                grant = None
            if grant is not None:
                break
            if not waited:
                waited = True
                log.info(
                    "waiting as standby",
                    session=session,
                    holder=holder,
                    leader=_describe_leader(backend, session),
                )
                if on_waiting is not None:
                    on_waiting()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{holder!r} did not become leader of session {session!r} within "
                    f"{timeout:g}s ({_describe_leader(backend, session)})"
                )
            if watching:
                if watch is None:
                    watch = BeaconWatch(session, wake)
                gone = watch.take_gone()
                if gone is not None:
                    _evict(backend, session, holder, gone)
                if gone is not None or time.monotonic() >= next_look:
                    watch.follow(_incumbent(backend, session))
                    next_look = time.monotonic() + _LOOK_INTERVAL_S
                if gone is not None:
                    continue  # campaign again at once
            if wake.wait(backend.poll_interval_s if poll_s is None else poll_s()):
                wake.clear()
    except BaseException:
        if beacon is not None:
            beacon.close()
        raise
    finally:
        if watch is not None:
            watch.close()
    lead = Leadership(backend, grant, beacon)
    try:
        lead._next_lsn = next_lsn_of(backend, session)
    except BaseException:
        lead.close()
        raise
    log.info(
        "leading session",
        session=session,
        holder=holder,
        epoch=grant.epoch,
        next_lsn=lead._next_lsn,
    )
    return lead


class Leadership:
    """Proof that one holder leads one session, and the fenced writer of its journal."""

    def __init__(self, backend: Backend, grant: Grant, beacon: Beacon | None = None) -> None:
        self._backend = backend
        self._grant = grant
        # Served while this leadership is held; closed when it is resigned or lost.
        self._beacon = beacon
        self._next_lsn = 0
        self._append_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._callbacks: list[Callable[[str], None]] = []
        self._lost_reason: str | None = None
        self._released = False
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._keepalive_paused = threading.Event()
        self._last_renewed = grant.requested_at
        self._thread = threading.Thread(
            target=self._keepalive, name=f"journal-keepalive-{grant.session}", daemon=True
        )
        self._thread.start()

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "released" if self._released else "held"
        return (
            f"Leadership(session={self.session!r}, holder={self.holder!r}, epoch={self.epoch}, "
            f"next_lsn={self._next_lsn}, {state})"
        )

    @property
    def session(self) -> str:
        return self._grant.session

    @property
    def holder(self) -> str:
        return self._grant.holder

    @property
    def epoch(self) -> int:
        return self._grant.epoch

    @property
    def ttl_s(self) -> float:
        return self._grant.ttl_s

    @property
    def beacon(self) -> str | None:
        """host:port of this leader's liveness beacon, or None if it serves none."""
        return self._grant.beacon

    @property
    def next_lsn(self) -> int:
        return self._next_lsn

    def on_lost(self, cb: Callable[[str], None]) -> None:
        """Call `cb(reason)` once when leadership is lost (at once if it already is)."""
        with self._state_lock:
            reason = self._lost_reason
            if reason is None:
                self._callbacks.append(cb)
                return
        cb(reason)

    def _mark_lost(self, reason: str) -> None:
        with self._state_lock:
            if self._lost_reason is not None:
                return
            self._lost_reason = reason
            callbacks, self._callbacks = self._callbacks, []
        self.lost.set()
        self._stop.set()
        self._close_beacon()
        log.warning(
            "leadership lost",
            session=self.session,
            holder=self.holder,
            epoch=self.epoch,
            reason=reason,
        )
        for cb in callbacks:
            try:
                cb(reason)
            except Exception:
                log.exception("on_lost callback failed", session=self.session)

    def _check_writable(self, what: str) -> None:
        if self._lost_reason is not None:
            raise LeadershipLost(
                f"{what} refused: {self.holder!r} lost leadership of session "
                f"{self.session!r} (epoch {self.epoch}): {self._lost_reason}"
            )
        if self._released:
            raise LeadershipLost(
                f"{what} refused: {self.holder!r} resigned from session {self.session!r}"
            )

    def append(self, records: list[tuple[str, dict[str, Any]]]) -> int:
        """Durably write (kind, data) records with contiguous lsns; return the last lsn.

        Raises LeadershipLost if this holder no longer leads the session; records already
        committed by earlier transactions of the same call stay (lsns remain contiguous).
        """
        if not records:
            return self._next_lsn - 1
        with self._append_lock:
            self._check_writable("append")
            ts = time.time()
            epoch = self.epoch
            first = self._next_lsn
            frames = [
                codec.encode_record(first + i, epoch, kind, data, ts)
                for i, (kind, data) in enumerate(records)
            ]
            return self._write_frames_locked(first, frames)

    def append_frames(self, first_lsn: int, frames: list[bytes]) -> int:
        """Write records already framed by `codec.encode_record` for lsns from first_lsn."""
        with self._append_lock:
            self._check_writable("append")
            if first_lsn != self._next_lsn:
                raise JournalError(
                    f"session {self.session!r}: frames start at lsn {first_lsn} but the next "
                    f"lsn is {self._next_lsn}; only one writer may append at a time"
                )
            return self._write_frames_locked(first_lsn, frames)

    def _write_frames_locked(self, first: int, frames: list[bytes]) -> int:
        try:
            for txn in pack(frames, first):
                started = time.monotonic()
                self._backend.put_batches(self._grant, txn)
                if getattr(self._backend, "renews_on_write", False):
                    self._last_renewed = max(self._last_renewed, started)
                last = txn[-1]
                self._next_lsn = last.first_lsn + last.count
        except LeadershipLost as exc:
            self._mark_lost(str(exc))
            raise
        return self._next_lsn - 1

    def checkpoint(self, data: dict[str, Any], *, lsn: int | None = None) -> None:
        """Durably store the session's checkpoint, covering every record below `lsn`.

        `lsn` defaults to the next lsn this leader will write (the checkpoint covers all
        records appended so far).
        """
        at = self._next_lsn if lsn is None else lsn
        if at > self._next_lsn:
            raise ValueError(
                f"checkpoint at lsn {at} would cover records not yet appended "
                f"(next lsn is {self._next_lsn}); flush the writer first"
            )
        value = codec.encode_checkpoint(at, self.epoch, time.time(), data)
        self._check_writable("checkpoint")
        try:
            self._backend.put_checkpoint(self._grant, value)
        except LeadershipLost as exc:
            self._mark_lost(str(exc))
            raise

    def resign(self) -> None:
        """Give leadership up now, so a standby can take over without waiting for the ttl."""
        self._stop.set()
        self._keepalive_paused.clear()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._state_lock:
            if self._released:
                return
            self._released = True
            still_held = self._lost_reason is None
        try:
            if still_held:
                self._backend.release(self._grant)
                log.info("resigned", session=self.session, holder=self.holder, epoch=self.epoch)
        finally:
            # After the release: a standby that sees the beacon close finds the leader gone.
            self._close_beacon()

    def _close_beacon(self) -> None:
        if self._beacon is not None:
            self._beacon.close()

    def close(self) -> None:
        """Stop the keepalive and release leadership if still held."""
        self.resign()

    def __enter__(self) -> Leadership:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pause_keepalive(self) -> None:
        """Stop renewing the lease and stop noticing its loss, as a SIGSTOPped process would.

        For fault-injection tests: the lease then expires, a standby takes over, and the
        store must refuse this leader's next write.
        """
        self._keepalive_paused.set()

    def resume_keepalive(self) -> None:
        self._keepalive_paused.clear()

    def _release_quietly(self) -> None:
        # The store may still hold our lease (etcd keeps leases across its restarts); give it
        # up so that a standby does not wait out a lease nobody renews.
        try:
            self._backend.release(self._grant, within_s=0)
        except Exception as exc:
            log.debug("could not release the lease after losing it", error=str(exc))

    def _keepalive(self) -> None:
        ttl = self._grant.ttl_s
        # Renewing every ttl/3 leaves three chances per ttl, and a dead leader's lease
        # then runs out ttl*5/6 after its death on average (ttl*7/8 at ttl/4): takeover
        # time is mostly this wait.
        interval = ttl / 3
        failures = 0
        while not self._stop.wait(interval):
            if self._keepalive_paused.is_set():
                continue
            sent = time.monotonic()
            try:
                held = self._backend.refresh(self._grant)
            except Exception as exc:
                if self._keepalive_paused.is_set():
                    continue
                silent = time.monotonic() - self._last_renewed
                if silent >= ttl:
                    self._mark_lost(
                        f"could not renew the lease for {silent:.1f}s (ttl {ttl:g}s): "
                        f"{type(exc).__name__}: {exc}"
                    )
                    self._release_quietly()
                    return
                failures += 1
                (log.warning if failures == 1 else log.debug)(
                    "lease renewal failed, retrying until the ttl runs out",
                    session=self.session,
                    error=f"{type(exc).__name__}: {exc}",
                )
                interval = min(ttl / 4, 0.1)
                continue
            if self._keepalive_paused.is_set() or self._stop.is_set():
                continue
            if not held:
                self._mark_lost("the lease expired before it could be renewed")
                return
            if failures:
                log.info("lease renewed again", session=self.session, failures=failures)
            self._last_renewed = sent
            failures = 0
            interval = ttl / 3
