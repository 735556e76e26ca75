"""Who reads the controller's inbox, mixed into Runtime (controller/_runtime.py): a program
thread while it waits for a result (wait_until), else the IO thread, which also sends the
batches the program left and posts the timer's tick. One of them at a time, holding the drive
(controller/drive.py).
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
import zmq

from regent.controller.drive import Drive
from regent.controller.futures import Future
from regent.wire.transport import (
    BATCH_MAX_AGE_S,
    BUSY_BATCH_AGE_S,
    readable,
    spin_until_readable,
)

log = structlog.get_logger("regent.controller")

TICK_S = 0.2  # the IO thread's timer (Runtime._tick: watermarks, resends, hellos)
# After this long with nothing to send or read, and with no waiter or one waiting this long for a
# result (a mesh-wide call over many procs), the IO thread sleeps until its next tick rather than
# nap every 2 ms. While the program issues call after call, or waits briefly each time, it keeps
# napping: that costs less than being woken for each batch or at the end of each wait.
QUIET_S = 0.02


class _Reader:
    """The inbox's readers and the IO thread. Uses the Runtime's `inbox`, `outbox`, `drive`,
    `_handle` and `_tick`, and the bookkeeping its __init__ sets up."""

    inbox: Any
    outbox: Any
    drive: Drive
    io_passes: int
    _stop: threading.Event
    _want_lock: threading.Lock
    _wanted: int
    _wait_began: float
    _napping: bool
    _unread: bool
    _wake_r: int
    _wake_w: int
    _issued: int
    _spin_s: float
    _interrupt: Callable[[], None]
    _handle: Callable[[list], None]
    _tick: Callable[[], None]

    def _io_loop(self) -> None:
        """Drive the session while no program thread does (see wait_until).

        While a waiter reads the inbox itself, this thread only naps: every thread woken
        per reply costs tens of microseconds of CPU on a VM, more than the work itself.
        It also sends batches the program queued and then left (a broadcast, then a
        sleep): nothing waits for a later call to go out. Its timer (watermarks, resends,
        hellos) is an event posted to whoever drives.

        After QUIET_S with nothing to send or read and no waiter (or one waiting longer than
        QUIET_S), it sleeps until the next tick, woken by the inbox (no waiter), by
        `_wake_io` (a batch queued, messages left unread, a long wait ended, close); otherwise
        it naps 2 ms at a time. An idle controller thus wakes a few times a second, not 500.
        """
        poller = select.poll()  # not select(): a controller of a thousand procs has fds above 1024
        inbox_fd = self.inbox.sock.getsockopt(zmq.FD)
        poller.register(self._wake_r, select.POLLIN)
        watching_inbox = False
        next_tick = time.monotonic()
        dirty = self.outbox.dirty
        drive = self.drive
        issued = self._issued
        busy_at = next_tick
        while not self._stop.is_set():
            self.io_passes += 1
            try:
                now = time.monotonic()
                waiter = self._wanted > 0 or drive.wanted > 0
                if watching_inbox == waiter:  # the inbox is the waiter's to read, else ours
                    watching_inbox = not waiter
                    poller.register(inbox_fd, select.POLLIN if watching_inbox else 0)
                timeout_ms = 2
                if dirty or self._unread or drive.wanted or (waiter and now - self._wait_began < QUIET_S):
                    busy_at = now
                elif now - busy_at >= QUIET_S:
                    self._napping = True
                    # Looked at again after the flag is up: a waker changes its state first, then
                    # reads the flag, so one of the two sees the other.
                    if dirty or self._unread or (self._wanted > 0) != waiter or self._stop.is_set():
                        self._napping = False
                    else:
                        timeout_ms = max(1, int((next_tick - now) * 1000) + 1)
                events = poller.poll(timeout_ms)
                self._napping = False
                for fd, _ in events:
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                    else:
                        busy_at = now
                if watching_inbox and (events or self._unread) and drive.acquire(0):
                    try:
                        self._unread = not self._drain()
                    finally:
                        drive.release()
                now = time.monotonic()
                if dirty:
                    # Batches the program left (it issued nothing since the last pass) go after
                    # BATCH_MAX_AGE_S; while it issues, they gather up to BUSY_BATCH_AGE_S.
                    busy, issued = self._issued != issued, self._issued
                    self.outbox.flush(block=False, older_than=now - (BUSY_BATCH_AGE_S if busy else BATCH_MAX_AGE_S))
                if now >= next_tick:
                    next_tick = now + TICK_S
                    drive.post(self._tick)
            except (zmq.ContextTerminated, ValueError, OSError):
                self._napping = False
                if self._stop.is_set():
                    return
                log.exception("controller IO loop error (continuing)")
            except Exception:
                self._napping = False
                log.exception("controller IO loop error (continuing)")

    def _wake_io(self) -> None:
        """End the IO thread's long nap, if it is in one (one attribute read when it is not)."""
        if self._napping:
            self._napping = False
            try:
                os.write(self._wake_w, b"w")
            except OSError:  # the pipe is full (the thread is being woken already), or closed
                pass

    def _left_unread(self) -> None:
        """A reader stopped with messages still in the inbox (zmq's descriptor will not
        signal them again): the IO thread reads them unless a waiter does first."""
        self._unread = True
        self._wake_io()

    def _drain(self) -> bool:
        """Handle everything in the inbox, or less if another thread waits for the drive:
        True if the inbox was emptied. Caller holds the drive."""
        drive = self.drive
        for frames in self.inbox.pending():
            self._handle(frames)
            if drive.wanted:
                self._left_unread()
                return False
        return True

    def drain_ready(self, limit: int = 4) -> None:
        """Every eighth time: handle up to `limit` messages already in the inbox, without
        waiting (the program issuing many calls reads their replies as it goes). Caller holds
        the drive."""
        self._issued += 1
        inbox = self.inbox
        if self._issued & 7 or not readable(inbox.sock):
            return
        for n, frames in enumerate(inbox.pending(), 1):
            self._handle(frames)
            if n >= limit:
                self._left_unread()
                return

    def wait_for(self, fut: Future, timeout: float | None) -> bool:
        """Wait for a future (see wait_until)."""
        if fut.done():
            if self.outbox.dirty:
                self.outbox.flush()
            return True
        return self.wait_until(fut.done, timeout)

    def wait_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Drive the session on this thread until `done()` (asked by the driver), reading the
        inbox here: a reply is then handled where it is awaited, with no hand-off from the IO
        thread. False if `timeout` seconds pass first. The caller must not hold the drive."""
        if self.outbox.dirty:
            self.outbox.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        drive = self.drive
        with self._want_lock:
            if not self._wanted:
                self._wait_began = time.monotonic()
            self._wanted += 1
        try:
            while True:
                if not self._stop.is_set() and drive.acquire(0.002):
                    try:
                        if self._drive_until(done, deadline):
                            return True
                    finally:
                        self._drain()
                        drive.release()
                self._interrupt()
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                if drive.wanted or self._stop.is_set():
                    time.sleep(0.0005)  # another thread's turn to drive
        finally:
            with self._want_lock:
                self._wanted -= 1
            self._wake_io()  # the inbox is the IO thread's again, if no other waiter reads it

    def _drive_until(self, done: Callable[[], bool], deadline: float | None) -> bool:
        """wait_until's turn at the drive: True once done; False at the deadline, or to let a
        thread that waits for the drive have it."""
        drive, sock = self.drive, self.inbox.sock
        if drive.posted:
            drive.run_posted()
        self._spin(done, deadline)
        while not done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if (remaining is not None and remaining <= 0) or drive.wanted:
                return False
            ms = 50 if remaining is None else max(0, min(50, int(remaining * 1000)))
            if sock.poll(ms):
                self._drain()
            if drive.posted:
                drive.run_posted()
            self._interrupt()
        return True

    def _spin(self, done: Callable[[], bool], deadline: float | None) -> None:
        """Busy-poll the inbox for the result, up to the spin budget (transport.spin_budget_s)
        and the caller's deadline, before wait_until sleeps in poll. Caller holds the drive."""
        budget = self._spin_s
        if deadline is not None:
            budget = min(budget, deadline - time.monotonic())
        until = time.perf_counter() + budget
        while not done() and budget > 0 and spin_until_readable(self.inbox.sock, budget):
            self._drain()
            budget = until - time.perf_counter()


__all__ = ["TICK_S", "QUIET_S"]
