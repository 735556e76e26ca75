"""Plays a fault Schedule: a ScheduleRunner applies each fault when it is due, against a
ChaosNet and a table of named processes, in a thread it owns, records every fault in a
FaultLog, and undoes what is still active when it stops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
import tenacity

from regent.chaos import faults as process_faults
from regent.chaos.faults import FaultEvent, FaultLog
from regent.chaos.net import ChaosNet
from regent.chaos.packets import HostFaults
from regent.chaos.schedule import IN_FLIGHT, PROCESS_KINDS, Fault, Schedule
from regent.chaos.toxics import TOXICS

__all__ = ["ProcessRef", "ScheduleRunner"]

log = structlog.get_logger("chaos.runner")


ProcessRef = int | Callable[[], int]


@dataclass
class _Active:
    index: int
    fault: Fault
    ends_at: float | None
    undo: Callable[[], None]


class _LinkWorker:
    """Applies link faults in order, in a thread of their own.

    A Toxiproxy API call can block for as long as a process at either end of the link
    is SIGSTOPped (removing a toxic waits for the toxic's goroutine, which waits to
    write to a peer that does not read). Process faults therefore never queue behind
    link calls: the SIGCONT that unblocks a stuck call always goes out on time.
    """

    def __init__(self, name: str, on_error: Callable[[int, Fault, str, Exception], None]) -> None:
        self._on_error = on_error
        self._jobs: list[tuple[int, Fault, str, Callable[[], None]] | None] = []
        self._cond = threading.Condition()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=f"chaos-links:{name}", daemon=True)
        self._thread.start()

    def submit(self, index: int, fault: Fault, phase: str, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append((index, fault, phase, job))
            self._cond.notify_all()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted job has run; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._busy, timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Run what is queued, then end the thread; False if it is still stuck after ``timeout_s``."""
        with self._cond:
            self._jobs.append(None)
            self._cond.notify_all()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs))
                item = self._jobs.pop(0)
                if item is None:
                    self._cond.notify_all()
                    return
                self._busy = True
            index, fault, phase, job = item
            try:
                job()
            except Exception as exc:
                self._on_error(index, fault, phase, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class ScheduleRunner:
    """Plays a Schedule in a background thread it owns; ``stop()`` undoes what is still active.

    ``hosts`` applies packet faults between namespace hosts (chaos.packets).
    ``processes`` maps a process name to its pid, or to a callable returning the
    current pid (a process that is restarted gets a new one). Call ``note_calls()`` as
    calls are made to fire ``after_calls`` faults. Use as a context manager::

        with ScheduleRunner(schedule, net, {"controller": pid}) as runner:
            ...drive the workload...
        report = runner.faults.events()
    """

    def __init__(
        self,
        schedule: Schedule,
        net: ChaosNet | None = None,
        processes: Mapping[str, ProcessRef] | None = None,
        *,
        hosts: HostFaults | None = None,
        faults: FaultLog | None = None,
        target_wait_s: float = 0.0,
        in_flight: Callable[[int], bool] | None = None,
    ) -> None:
        self.schedule = schedule
        self.net = net
        self.hosts = hosts
        self.target_wait_s = target_wait_s  # a process fault's wait for a target being restarted
        self.in_flight = in_flight  # pid -> is it running a call the program waits for
        wanted = [f for f in schedule.faults if f.in_flight_of is not None]
        if wanted and in_flight is None:
            raise ValueError(f"{len(wanted)} fault(s) of this schedule wait for a call in flight "
                             "(in_flight_s), and this cluster cannot tell when a process runs one")
        self.processes = dict(processes or {})
        schedule.check_targets(list(net) if net is not None else [], self.processes,
                               list(hosts) if hosts is not None else [])
        if faults is not None:
            self.faults = faults
        else:
            self.faults = net.faults if net is not None else hosts.faults if hosts is not None else FaultLog()
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._calls = 0
        self._stopping = False
        self._all_done = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._down_count: dict[str, int] = {}
        self._pause_count: dict[int, int] = {}
        self._links: _LinkWorker | None = None

    def __enter__(self) -> ScheduleRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def calls(self) -> int:
        with self._cond:
            return self._calls

    def events(self) -> list[FaultEvent]:
        return self.faults.events()

    def start(self) -> ScheduleRunner:
        if self._thread is not None:
            raise RuntimeError("ScheduleRunner.start() called twice; create a new runner")
        self._t0 = time.monotonic()
        self._links = _LinkWorker(self.schedule.name or "unnamed", self._error)
        self._thread = threading.Thread(
            target=self._run, name=f"chaos-schedule:{self.schedule.name or 'unnamed'}", daemon=True
        )
        self._thread.start()
        return self

    def note_calls(self, n: int = 1) -> None:
        """Count ``n`` more calls; faults with ``after_calls`` fire once the count reaches it."""
        with self._cond:
            self._calls += n
            self._cond.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every fault has fired and every timed fault has ended."""
        return self._all_done.wait(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop firing faults, undo the active ones, and join the threads.

        Paused processes are resumed first, then links are restored. A link call still
        stuck after ``timeout_s`` (a peer stopped by something other than this schedule)
        is recorded in ``errors`` rather than raised, so the run can still be checked.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout_s
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError(f"ScheduleRunner thread did not stop within {timeout_s}s")
        assert self._links is not None
        if not self._links.close(max(0.0, deadline - time.monotonic())):
            message = f"link faults were still being undone {timeout_s}s after stop(); Toxiproxy is stuck"
            self.errors.append(message)
            log.warning("link undo stuck", schedule=self.schedule.name, timeout_s=timeout_s)

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _run(self) -> None:
        pending = list(enumerate(self.schedule.faults))
        active: list[_Active] = []
        try:
            while True:
                with self._cond:
                    if self._stopping:
                        break
                    calls = self._calls
                now = self._now()
                still: list[tuple[int, Fault]] = []
                for index, fault in pending:
                    due = (fault.at_s is not None and fault.at_s <= now) or (
                        fault.after_calls is not None and fault.after_calls <= calls
                    )
                    if not due:
                        still.append((index, fault))
                        continue
                    undo = self._apply(index, fault)
                    if undo is not None:
                        ends = None if fault.duration_s is None else self._now() + fault.duration_s
                        active.append(_Active(index, fault, ends, undo))
                pending = still
                now = self._now()
                for item in [a for a in active if a.ends_at is not None and a.ends_at <= now]:
                    active.remove(item)
                    self._undo(item)
                deadlines = [f.at_s for _, f in pending if f.at_s is not None]
                deadlines += [a.ends_at for a in active if a.ends_at is not None]
                if not pending and not deadlines and not self._all_done.is_set():
                    assert self._links is not None
                    # Done means applied: nothing is paused now, so link calls cannot stay stuck.
                    if self._links.drain(timeout_s=0.05):
                        self._all_done.set()
                    else:
                        deadlines.append(self._now() + 0.05)
                with self._cond:
                    if self._stopping:
                        break
                    if self._calls != calls:
                        continue
                    timeout = max(0.0, min(deadlines) - self._now()) if deadlines else None
                    self._cond.wait(timeout)
        finally:
            # Resume processes before restoring links: a stopped peer can block link calls.
            for item in reversed(active):
                if item.fault.kind in PROCESS_KINDS:
                    self._undo(item)
            for item in reversed(active):
                if item.fault.kind not in PROCESS_KINDS:
                    self._undo(item)
            self._all_done.set()

    def _note(self, index: int) -> dict[str, Any]:
        return {"fault": index, "offset_s": round(self._now(), 4)}

    def _apply(self, index: int, fault: Fault) -> Callable[[], None] | None:
        try:
            if fault.kind in TOXICS:
                return self._apply_toxic(index, fault)
            if fault.kind == "down":
                return self._apply_down(index, fault)
            if fault.on_hosts:
                # nftables and tc answer at once whatever the hosts' processes do: applied here.
                assert self.hosts is not None
                return self.hosts.apply(fault.kind, fault.target, fault.attributes, self._note(index))
            pid = self._pid(fault.target)
            if fault.kind == "kill":
                note = self._note(index)
                if fault.in_flight_of is not None:
                    pid, note["in_flight"] = self._await_call(fault)
                process_faults.kill(pid, target=fault.target, log_to=self.faults, note=note)
                return None
            if fault.kind == "kill_host":
                process_faults.kill_host(pid, target=fault.target, log_to=self.faults, note=self._note(index))
                return None
            return self._apply_pause(index, fault, pid)
        except Exception as exc:  # a fault that cannot be applied must not end the run
            self._error(index, fault, "apply", exc)
            return None

    def _apply_toxic(self, index: int, fault: Fault) -> Callable[[], None]:
        assert self.net is not None and self._links is not None
        net, links, name = self.net, self._links, f"chaos{index}_{fault.kind}_{fault.stream}"
        added_at: float | None = None

        def add() -> None:
            nonlocal added_at
            note = self._note(index)
            if fault.in_flight_of is not None:  # waited for here, in the link thread
                note["in_flight"] = self._await_call(fault)[1]
            net.add_toxic(
                fault.target,
                fault.kind,
                fault.stream,
                fault.toxicity,
                toxic_name=name,
                note=note,
                **{k: v for k, v in fault.attributes.items() if k != IN_FLIGHT},
            )
            added_at = self._now()

        def remove() -> None:
            if added_at is None:  # a toxic that could not be added has nothing to remove
                return
            self._hold(fault, added_at)
            net.remove_toxic(fault.target, name, note=self._note(index))

        links.submit(index, fault, "apply", add)
        return lambda: links.submit(index, fault, "undo", remove)

    def _apply_down(self, index: int, fault: Fault) -> Callable[[], None]:
        assert self.net is not None and self._links is not None
        net, links, link = self.net, self._links, fault.target

        # Overlapping partitions of one link: it comes back up when the last one ends.
        # The count lives in the link thread, which runs these jobs in order.
        applied_at: float | None = None

        def down() -> None:
            nonlocal applied_at
            if self._down_count.get(link, 0) == 0:
                net.partition(link, note=self._note(index))
            self._down_count[link] = self._down_count.get(link, 0) + 1
            applied_at = self._now()

        def up() -> None:
            if applied_at is None:  # a partition that could not be applied has nothing to heal
                return
            self._hold(fault, applied_at)
            self._down_count[link] -= 1
            if self._down_count[link] == 0:
                net.heal(link, note=self._note(index))

        links.submit(index, fault, "apply", down)
        return lambda: links.submit(index, fault, "undo", up)

    def _hold(self, fault: Fault, applied_at: float) -> None:
        """A link fault applied late (its call queued behind another) still lasts its full
        duration: the undo waits out the rest (unless the runner is stopping)."""
        if fault.duration_s is None:
            return
        rest = applied_at + fault.duration_s - self._now()
        if rest > 0:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping, rest)

    def _apply_pause(self, index: int, fault: Fault, pid: int) -> Callable[[], None]:
        if self._pause_count.get(pid, 0) == 0:
            process_faults.pause(
                pid, target=fault.target, log_to=self.faults, note=self._note(index)
            )
        self._pause_count[pid] = self._pause_count.get(pid, 0) + 1

        def undo() -> None:
            self._pause_count[pid] -= 1
            if self._pause_count[pid] == 0 and process_faults.process_state(pid) not in process_faults.GONE:
                process_faults.resume(
                    pid, target=fault.target, log_to=self.faults, note=self._note(index)
                )

        return undo

    def _undo(self, item: _Active) -> None:
        try:
            item.undo()
        except Exception as exc:
            self._error(item.index, item.fault, "undo", exc)

    def _pid(self, name: str) -> int:
        """The pid a process fault acts on now. A target that is not there (a proc being
        restarted, a standby still starting) is waited for up to `target_wait_s` (0: not at all)
        before the fault counts as not applied."""
        ref = self.processes[name]
        if not callable(ref):
            return ref
        if self.target_wait_s <= 0:
            return ref()
        for attempt in tenacity.Retrying(retry=tenacity.retry_if_exception_type(ProcessLookupError),
                                         stop=tenacity.stop_after_delay(self.target_wait_s),
                                         wait=tenacity.wait_fixed(0.05), reraise=True):
            with attempt:
                return ref()
        raise AssertionError("unreachable: tenacity reraises")

    def _await_call(self, fault: Fault) -> tuple[int, bool]:
        """The pid of the process the fault waits on once it runs a call the program waits for
        (True), or its pid when `in_flight_s` passed first (False). A process restarted
        meanwhile is followed."""
        assert self.in_flight is not None and fault.in_flight_of is not None
        deadline = time.monotonic() + float(fault.attributes[IN_FLIGHT])
        while True:
            pid = self._pid(fault.in_flight_of)
            if self.in_flight(pid):
                return pid, True
            if time.monotonic() >= deadline or self._stopping:
                return pid, False
            time.sleep(0.001)

    def _error(self, index: int, fault: Fault, phase: str, exc: Exception) -> None:
        message = f"faults[{index}] {fault.kind} on {fault.target!r}: {phase} failed: {exc}"
        self.errors.append(message)
        log.warning(
            "fault failed",
            fault=index,
            kind=fault.kind,
            target=fault.target,
            phase=phase,
            error=str(exc),
        )
        self.faults.record(
            "error", fault.target, {"fault": index, "phase": phase, "error": str(exc)}
        )
