"""Group commit: many submitted records, few fenced appends.

`submit` hands back a record's lsn at once; one background thread owned by the writer
appends whatever has accumulated in one go. Records that nobody waits for linger up to
`max_delay_s` to fill a batch; a waiter on durability makes the thread flush immediately.

Submitting is cheap because the controller submits on its call path: a short lock keeps lsn
order equal to queue order, and the writer thread is woken only when it may be waiting for
exactly this record. A `lazy` record is not even encoded by its submitter: the writer thread
encodes it with the rest of its batch, off the submitter's critical path. Cheaper still, a
`collector` takes items that become few records: for many small records of one kind that
nobody waits for (the controller's call records, and the plain values answering them one by
one). Adding an item is one C-level deque append, with no lock and no Python frame: it is on
every call's path. Who must know when an item is durable takes a `ticket` after adding it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from . import codec
from .election import Leadership
from .errors import JournalError

log = structlog.get_logger("journal.group_commit")


GROUP_ITEMS = 1024  # items per collected group record; small items keep it far below the limits


class GroupCommitWriter:
    """Append records for one leader in submission order, batching them into few writes.

    While a writer is open, append through it only. The lsn order equals the submit order.
    An append failure (LeadershipLost, JournalUnavailable) is raised to every waiter and to
    every later submit.
    """

    def __init__(self, lead: Leadership, max_batch: int = 512, max_delay_s: float = 0.002,
                 on_failure: Callable[[BaseException], None] | None = None,
                 on_commit: Callable[[int, float], None] | None = None) -> None:
        """`on_failure(exc)` is called once, on the writer's thread, when an append fails:
        a collector's items raise nothing, so their owner hears of a failure this way.
        `on_commit(records, seconds)`, on the same thread, after each append is durable
        (the controller's metrics)."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self._lead = lead
        self._epoch = lead.epoch
        self._max_batch = max_batch
        self._max_delay_s = max_delay_s
        # _lock orders submits (lsn, queue); _cond is where the writer thread and waiters sleep.
        # A submitter takes _cond only to wake the thread, never while it holds _lock.
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        # Each entry is a framed record (bytes) or, for a lazy one, (lsn, kind, data, ts).
        self._pending: list[bytes | tuple[int, str, dict[str, Any], float]] = []
        self._pending_first = lead.next_lsn
        self._next_lsn = lead.next_lsn
        self._durable = lead.next_lsn - 1
        self._urgent_upto = -1
        # Collected items by kind (collector): they take lsns, GROUP_ITEMS to a record, when
        # anything else takes an lsn or the writer thread takes a batch.
        self._collected: dict[str, collections.deque] = {}
        # Closes of the collected items (_close_groups_locked): how many have begun, and the
        # last to end with the lsn it left behind. See ticket() and bound().
        self._closes_begun = 0
        self._closed: tuple[int, int] = (0, self._next_lsn - 1)
        self._on_failure = on_failure
        self._on_commit = on_commit
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(
            target=self._run, name=f"journal-group-commit-{lead.session}", daemon=True
        )
        self._thread.start()

    @property
    def durable_lsn(self) -> int:
        """The highest lsn known to be durable (-1 if none yet)."""
        return self._durable

    @property
    def next_lsn(self) -> int:
        """The lsn the next submitted record will get."""
        return self._next_lsn

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise JournalError(f"group-commit writer of session {self._lead.session!r} is closed")

    def submit(self, kind: str, data: dict[str, Any], *, lazy: bool = False) -> int:
        """Queue one record and return its lsn; does not wait for it to be durable.

        The record is encoded here, so bad data (RecordTooLarge, a value msgpack cannot encode)
        is refused before it takes an lsn. `lazy=True` leaves the encoding to the writer
        thread, off the caller's critical path: for records whose data the caller builds from
        str, int, float, bool, bytes, lists and str-keyed dicts only, well under
        codec.MAX_RECORD_BYTES, and never touches again. A lazy record that fails to encode all
        the same fails the writer, like a failed append.
        """
        ts = time.time()
        with self._lock:
            if self._error is not None or self._closing:
                self._raise_if_failed()
            if self._collected:
                self._close_groups_locked()
            lsn = self._next_lsn
            pending = self._pending
            if lazy:
                pending.append((lsn, kind, data, ts))
            else:
                pending.append(codec.encode_record(lsn, self._epoch, kind, data, ts))
            self._next_lsn = lsn + 1
            queued = len(pending)
        # Wake the writer only when it may be waiting for exactly this: the first record, or
        # the one that fills a batch. Past that it is busy writing and looks again by itself,
        # and a notify per record would cost more than the record.
        if queued == 1 or queued == self._max_batch:
            with self._cond:
                self._cond.notify_all()
        return lsn

    def collector(self, kind: str) -> Callable[[Any], None]:
        """A function that adds an item to records `{"items": [...]}` of `kind`.

        Items take their lsns (and so their place in the log) when anything else takes one:
        a `submit`, the writer thread taking a batch (at the latest one linger after the
        item), or `flush`. So every item comes before any record submitted after it was
        added; items of one kind keep their order, items of different kinds need not. Nobody
        can wait for one item directly: `ticket` and `bound` say which lsn covers it once it
        has one, `seal` gives it one at once. Adding one raises nothing, not even after the
        writer failed (see `on_failure`). Items are encoded lazily (see `submit`): small, of
        plain types.
        """
        with self._lock:
            items = self._collected.get(kind)
            if items is None:
                items = self._collected[kind] = collections.deque()
        return items.append

    def ticket(self) -> int:
        """A claim on a place in the log for every item collected before this call: pass it
        to `bound`. No lock, no record: it may be taken for every item read.

        The count of closes begun: the next close begins after this call, so it takes every
        item added before it (unless an earlier close took it already)."""
        return self._closes_begun

    def bound(self, ticket: int) -> int | None:
        """An lsn no smaller than any collected item's that `ticket` was taken after (so that
        item is durable once this lsn is), or None while no close has taken them yet; a
        close comes at the latest with the writer's next batch, a linger on (see `seal`)."""
        closes, lsn = self._closed
        return lsn if closes > ticket else None

    def seal(self) -> int:
        """Give every item collected so far its lsn now; return an lsn no smaller than any of
        theirs. Raises the append error if the writer failed."""
        with self._lock:
            self._raise_if_failed()
            self._close_groups_locked()
            return self._next_lsn - 1

    def _close_groups_locked(self) -> None:
        """Give the collected items their lsns, as lazy records. Holds _lock.

        Items are only ever taken here, under _lock, and only appended elsewhere: popping as
        many as were counted takes each item once, however many are appended meanwhile."""
        # Begun before anything is counted: a ticket taken after an item was added and before
        # this point is served by this close (ticket()).
        self._closes_begun += 1
        begun = self._closes_begun
        pending = self._pending
        ts = time.time()
        for kind, items in self._collected.items():
            n = len(items)
            while n:
                take = min(n, GROUP_ITEMS)
                pending.append((self._next_lsn, kind, {"items": [items.popleft() for _ in range(take)]}, ts))
                self._next_lsn += 1
                n -= take
        self._closed = (begun, self._next_lsn - 1)

    def wait_durable(self, lsn: int, timeout: float | None = None) -> None:
        """Block until record `lsn` is durable; raise the append error if the write failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if lsn >= self._next_lsn:
                raise ValueError(f"lsn {lsn} was never submitted (next lsn is {self._next_lsn})")
            if lsn <= self._durable:
                return
            self._urgent_upto = max(self._urgent_upto, lsn)
            self._cond.notify_all()
            while lsn > self._durable:
                if self._error is not None:
                    raise self._error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"lsn {lsn} of session {self._lead.session!r} not durable after "
                        f"{timeout:g}s (durable up to {self._durable})"
                    )
                self._cond.wait(remaining)

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every submitted record is durable; return the last lsn (-1 if none)."""
        with self._lock:
            self._close_groups_locked()
            last = self._next_lsn - 1
        if last > self._durable:
            self.wait_durable(last, timeout)
        elif self._error is not None:
            raise self._error
        return last

    def checkpoint(self, data: dict[str, Any], timeout: float | None = None) -> int:
        """Flush, then store a checkpoint covering every record submitted so far.

        Returns the checkpoint's lsn: the first record it does not cover.
        """
        lsn = self.flush(timeout) + 1
        self._lead.checkpoint(data, lsn=lsn)
        return lsn

    def close(self) -> None:
        """Write what is pending, then stop the thread.

        Raises the append error if submitted records could not be written.
        """
        with self._cond:
            with self._lock:
                self._closing = True
            self._cond.notify_all()
        self._thread.join()
        if self._error is not None and self._durable < self._next_lsn - 1:
            raise self._error

    def __enter__(self) -> GroupCommitWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:
            # The exception already propagating explains more than a follow-on failure.
            log.debug("writer close failed while handling another error")

    def _queued(self) -> int:
        """How many records are waiting: those queued, and those the collected items will make."""
        n = len(self._pending)
        # A snapshot (list() runs in C): collector() may add a kind meanwhile, under _lock.
        for items in list(self._collected.values()):
            n += -(-len(items) // GROUP_ITEMS)
        return n

    def _take(self) -> tuple[int, list] | None:
        with self._cond:
            waited_since = time.monotonic()
            while not self._queued():
                if self._closing:
                    return None
                # A collected item wakes nobody: look again after a linger, and count the
                # linger of what this finds from when the look began.
                waited_since = time.monotonic()
                self._cond.wait(self._max_delay_s)
            due = waited_since + self._max_delay_s
            while (
                self._urgent_upto < self._pending_first
                and not self._closing
                and self._queued() < self._max_batch
            ):
                remaining = due - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            with self._lock:
                self._close_groups_locked()
                first = self._pending_first
                entries = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                self._pending_first = first + len(entries)
            return first, entries

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            first, entries = taken
            began = time.monotonic()
            try:
                frames = codec.encode_entries(self._epoch, entries)
                last = self._lead.append_frames(first, frames)
            except BaseException as exc:
                log.warning(
                    "group commit failed",
                    session=self._lead.session,
                    lsn=first,
                    error=f"{type(exc).__name__}: {exc}",
                )
                with self._cond:
                    with self._lock:
                        self._error = exc
                        self._pending.clear()
                        for items in self._collected.values():
                            items.clear()
                    self._cond.notify_all()
                if self._on_failure is not None:
                    try:
                        self._on_failure(exc)
                    except Exception:
                        log.exception("on_failure callback failed", session=self._lead.session)
                return
            with self._cond:
                self._durable = last
                self._cond.notify_all()
            if self._on_commit is not None:
                try:
                    self._on_commit(len(entries), time.monotonic() - began)
                except Exception:
                    log.exception("on_commit callback failed", session=self._lead.session)
