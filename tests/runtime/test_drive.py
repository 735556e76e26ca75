"""One driver at a time: the engine is stepped only by the thread holding the session's drive.

The unit tests pin the Drive's hand-over rules; the session test instruments every method of
the engine, its core and its durability and release state, runs a workload that makes both the
program's thread and the runtime's IO thread drive (replies read while the program waits and
while it sleeps, a proc SIGKILLed and restarted, deadlines, a stream, a checkpoint, leadership
lost from another thread), and checks that no method ran on a thread without the drive.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import pytest

from regent.controller import Session
from regent.controller.core import ControllerCore
from regent.controller.drive import Drive
from regent.controller.engine import Engine, Reads, Releases
from regent.journal import LeadershipLost
from regent.worker import Actor, endpoint
from regent.worker.errors import SupervisionError
from regent.worker.supervision import RestartPolicy

# --- the Drive itself ----------------------------------------------------------------------


class OwnedLock:
    """A lock that knows which thread holds it (the tests' stand-in for Drive.lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self.owner = threading.get_ident()
        return True

    def release(self) -> None:
        self.owner = None
        self._lock.release()

    def __enter__(self) -> OwnedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def held(self) -> bool:
        return self.owner == threading.get_ident()


def _owned() -> tuple[Drive, OwnedLock]:
    drive, lock = Drive(), OwnedLock()
    drive.lock = lock
    return drive, lock


def test_a_post_to_a_free_drive_runs_at_once_on_the_posting_thread():
    drive, lock = _owned()
    ran = []
    drive.post(lambda: ran.append((threading.get_ident(), lock.held())))
    assert ran == [(threading.get_ident(), True)]
    assert lock.owner is None


def test_a_post_to_a_held_drive_runs_when_the_holder_lets_go_on_the_holders_thread():
    drive, ran = Drive(), []
    with drive:
        poster = threading.Thread(target=drive.post, args=(lambda: ran.append(threading.get_ident()),))
        poster.start()
        poster.join()
        assert ran == []  # the poster did not wait for the drive, nor run the event
    assert ran == [threading.get_ident()]


def test_a_post_while_a_short_section_holds_the_lock_is_applied_by_the_next_driver():
    drive, ran = Drive(), []
    with drive.lock:  # the call path's bare section does not apply posted events
        drive.post(lambda: ran.append("event"))
    assert ran == []
    assert drive.acquire(0)
    drive.release()  # the IO thread's next turn
    assert ran == ["event"]


def test_a_holder_that_waits_applies_posted_events_as_it_polls():
    drive, ran = Drive(), []
    with drive:
        drive.post(lambda: ran.append("tick"))
        drive.run_posted()
        assert ran == ["tick"]


def test_a_thread_blocked_on_the_drive_is_counted_so_the_holder_can_yield():
    drive = Drive()
    entered = threading.Event()

    def take() -> None:
        with drive:
            entered.set()

    with drive:
        t = threading.Thread(target=take)
        t.start()
        deadline = time.monotonic() + 5
        while drive.wanted == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert drive.wanted == 1 and not entered.is_set()
    t.join(5)
    assert entered.is_set() and drive.wanted == 0


def test_a_failing_posted_event_does_not_stop_the_others():
    drive, ran = Drive(), []
    with drive:
        drive.post(lambda: 1 / 0)
        drive.post(lambda: ran.append("second"))
    assert ran == ["second"]


# --- the session never steps its engine without the drive ------------------------------------


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    def nap(self, s: float) -> float:
        time.sleep(s)
        return s


@pytest.fixture()
def watched(monkeypatch):
    """watch(session): from then on, every engine-state method records the thread it ran on
    and whether that thread held the session's drive."""
    steps: list[tuple[str, str, bool]] = []
    owners: dict[int, OwnedLock] = {}

    def guard(name: str, fn):
        @functools.wraps(fn)
        def wrapped(self, *args, **kwargs):
            lock = owners.get(id(self))
            if lock is not None:
                steps.append((name, threading.current_thread().name, lock.held()))
            return fn(self, *args, **kwargs)
        return wrapped

    for cls in (Engine, ControllerCore, Reads, Releases):
        for name, member in list(vars(cls).items()):
            if name.startswith("__"):
                continue
            if isinstance(member, property):
                monkeypatch.setattr(cls, name, property(guard(f"{cls.__name__}.{name}", member.fget)))
            elif callable(member) and not isinstance(member, (staticmethod, classmethod)):
                monkeypatch.setattr(cls, name, guard(f"{cls.__name__}.{name}", member))

    def watch(s: Session) -> list[tuple[str, str, bool]]:
        engine, drive = s._engine, s._drive
        lock = OwnedLock()
        with drive.lock:  # the IO thread only ever tries it without blocking
            old, drive.lock = drive.lock, lock
        assert not old.locked()
        for obj in (engine, engine.core, engine.reads, engine.releases):
            owners[id(obj)] = lock
        return steps

    return watch


@pytest.mark.slow
def test_only_the_drive_holder_steps_the_engine(watched):
    with Session("drive-discipline") as s:
        steps = watched(s)
        procs = s.spawn_procs(per_host={"procs": 2})
        plain = procs.spawn("w", Worker)
        supervised = procs.spawn("sup", Worker, restart=RestartPolicy(restart="permanent"))
        one = plain.slice(procs=0)
        assert one.add.call_one(1, 2).get() == 3
        assert plain.add.call(2, 3).get().values() == [5, 5]
        assert plain.add.choose(1, 1).get() == 2
        assert sorted(v for _, v in plain.add.stream(1, 1).iter(timeout=10)) == [2, 2]
        with pytest.raises(TimeoutError):
            plain.slice(procs=1).nap.call_one(1.0).get(timeout=0.05)
        # Replies that arrive while the program does not wait are the IO thread's to read.
        pending = [one.add.call_one(i, i) for i in range(20)]
        plain.add.broadcast(0, 0)
        time.sleep(0.5)
        assert [f.get() for f in pending] == [2 * i for i in range(20)]
        s.checkpoint({"step": 1})
        s.now()
        victim = supervised.slice(procs=1).pid.call_one().get()
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            try:
                if supervised.slice(procs=1).pid.call_one().get(timeout=10) != victim:
                    break
            except SupervisionError:
                pass
            assert time.monotonic() < deadline, "the supervised member was not restarted"
            time.sleep(0.05)
        # Leadership lost, told from a thread that must not wait for the drive.
        slow = plain.slice(procs=0).nap.call_one(2.0)
        time.sleep(0.1)
        teller = threading.Thread(target=s._on_leadership_lost, args=("lease expired (test)",))
        teller.start()
        teller.join()
        with pytest.raises(LeadershipLost):
            slow.get(timeout=5)
    offenders = sorted({(name, thread) for name, thread, held in steps if not held})
    assert offenders == []
    threads = {thread for _, thread, _ in steps}
    assert threading.main_thread().name in threads
    assert any(t.startswith("regent-io-") for t in threads), threads
    # The kinds of step the workload was meant to reach, on one driver at a time.
    names = {name for name, _, _ in steps}
    for step in ("ControllerCore.on_result", "ControllerCore.on_proc_died", "Engine.outcome_record",
                 "Releases.through", "Engine.dispatch", "Engine.timed_out", "Engine.stream_pick",
                 "Reads.observed"):
        assert step in names, step
