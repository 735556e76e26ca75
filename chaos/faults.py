"""Process faults (SIGKILL, SIGSTOP/SIGCONT) and the timeline that records every fault.

Each fault returns a FaultEvent, and appends it to a FaultLog when one is given, so
a chaos run can report exactly what was done to what and when. Processes are
addressed by pid from outside; nothing here knows what the process runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil
import structlog
import tenacity

__all__ = [
    "FaultEvent",
    "FaultLog",
    "ProcessFaultError",
    "host_processes",
    "kill",
    "kill_host",
    "pause",
    "paused",
    "process_state",
    "release",
    "resume",
]

log = structlog.get_logger("chaos.faults")


class ProcessFaultError(RuntimeError):
    """A process fault could not be applied (no such process, or it did not take)."""


@dataclass(frozen=True)
class FaultEvent:
    """One thing chaos did: ``t`` is wall-clock seconds (time.time()) when it took effect.

    ``kind`` is one of: kill, pause, resume (processes); down, up, toxic_add,
    toxic_remove, clear (links); error (a scheduled fault that could not be applied).
    """

    t: float
    kind: str
    target: str
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["detail"] = dict(self.detail)
        return data


class FaultLog:
    """A thread-safe, append-only timeline of FaultEvents."""

    def __init__(self) -> None:
        self._events: list[FaultEvent] = []
        self._lock = threading.Lock()

    def record(self, kind: str, target: str, detail: Mapping[str, Any] | None = None) -> FaultEvent:
        event = FaultEvent(time.time(), kind, target, dict(detail or {}))
        with self._lock:
            self._events.append(event)
        log.info("fault", kind=kind, target=target, **dict(detail or {}))
        return event

    def events(self) -> list[FaultEvent]:
        with self._lock:
            return list(self._events)

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def to_json(self) -> str:
        return json.dumps([e.to_dict() for e in self.events()], indent=2, default=str)


STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
GONE = (None, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)  # exited: reaped, or a zombie


def process_state(pid: int) -> str | None:
    """The process's state as psutil names it ("running", "sleeping", "disk-sleep",
    "stopped", "tracing-stop", "zombie", ...); None if there is no such process."""
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return None


def release(pid: int) -> None:
    """SIGCONT ``pid`` if it is stopped, recording no fault: a stopped process cannot act on
    SIGTERM, and one left stopped blocks whoever waits on it. Quiet if it is gone."""
    if process_state(pid) in STOPPED:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)


def kill(
    pid: int,
    *,
    target: str | None = None,
    log_to: FaultLog | None = None,
    note: Mapping[str, Any] | None = None,
    wait_s: float = 5.0,
) -> FaultEvent:
    """SIGKILL ``pid`` and wait (up to ``wait_s``) until it is dead or a zombie."""
    _signal(pid, signal.SIGKILL, "kill")
    event = _event(log_to, "kill", target or f"pid:{pid}", _detail(pid, "SIGKILL", note))
    # A SIGSTOPped process still dies of SIGKILL; waiting makes "killed" mean killed.
    _await_state(pid, lambda s: s in GONE, wait_s, "die after SIGKILL")
    return event


def host_processes(agent_pid: int) -> list[int]:
    """The live processes host agent `agent_pid` started, read from outside: every process whose
    command line names the agent's pid as its `--host-pid`, or one of the agent's listening TCP
    addresses as its `--host-inbox` (its procs, and procs their actors spawned). An agent
    listening on every address is matched by port."""
    try:
        conns = psutil.Process(agent_pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        raise ProcessFaultError(f"cannot find the procs of host agent pid {agent_pid}: no such process") from None
    listening = [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]

    def started_by_agent(inbox: str) -> bool:
        host, _, port = inbox.removeprefix("tcp://").rpartition(":")
        return any(str(p) == port and ip in (host.strip("[]"), "0.0.0.0", "::") for ip, p in listening)

    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info.get("cmdline") or []
        inboxes = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--host-inbox"]
        # The agent's pid on its procs' command lines as well: psutil reads listening sockets in
        # this process's network namespace, not the agent's (a namespace host's agent shows none).
        started = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--host-pid"]
        if proc.info["pid"] != agent_pid and (str(agent_pid) in started or any(started_by_agent(a) for a in inboxes)):
            out.append(proc.info["pid"])
    return sorted(out)


def kill_host(
    agent_pid: int,
    *,
    target: str | None = None,
    log_to: FaultLog | None = None,
    note: Mapping[str, Any] | None = None,
    wait_s: float = 5.0,
) -> FaultEvent:
    """A machine's death: SIGKILL host agent `agent_pid` and every process it started, together.
    All are SIGSTOPped first, so that none sees another die (a proc would start a new agent,
    an agent would report its procs' deaths); then all are SIGKILLed and awaited."""
    pids = [agent_pid, *host_processes(agent_pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    event = _event(log_to, "kill_host", target or f"pid:{agent_pid}",
                   {**_detail(agent_pid, "SIGKILL", note), "procs": pids[1:]})
    for pid in pids:
        _await_state(pid, lambda s: s in GONE, wait_s, "die after SIGKILL")
    return event


def pause(
    pid: int,
    *,
    target: str | None = None,
    log_to: FaultLog | None = None,
    note: Mapping[str, Any] | None = None,
    wait_s: float = 5.0,
) -> FaultEvent:
    """SIGSTOP ``pid`` and wait until the kernel reports it stopped."""
    _signal(pid, signal.SIGSTOP, "pause")
    _await_state(pid, lambda s: s in STOPPED or s in GONE, wait_s, "stop after SIGSTOP")
    return _event(log_to, "pause", target or f"pid:{pid}", _detail(pid, "SIGSTOP", note))


def resume(
    pid: int,
    *,
    target: str | None = None,
    log_to: FaultLog | None = None,
    note: Mapping[str, Any] | None = None,
    wait_s: float = 5.0,
) -> FaultEvent:
    """SIGCONT ``pid`` and wait until it is no longer stopped."""
    _signal(pid, signal.SIGCONT, "resume")
    _await_state(pid, lambda s: s not in STOPPED, wait_s, "continue after SIGCONT")
    return _event(log_to, "resume", target or f"pid:{pid}", _detail(pid, "SIGCONT", note))


@contextlib.contextmanager
def paused(
    pid: int,
    seconds: float | None = None,
    *,
    target: str | None = None,
    log_to: FaultLog | None = None,
    note: Mapping[str, Any] | None = None,
) -> Iterator[FaultEvent]:
    """Keep ``pid`` stopped for the block, and for at least ``seconds`` if given.

    The process is resumed on leaving the block even if the block raised; if it
    died meanwhile, leaving is quiet.
    """
    event = pause(pid, target=target, log_to=log_to, note=note)
    started = time.monotonic()
    try:
        yield event
        if seconds is not None:
            remaining = seconds - (time.monotonic() - started)
            if remaining > 0:
                time.sleep(remaining)
    finally:
        if process_state(pid) not in GONE:
            resume(pid, target=target, log_to=log_to, note=note)


def _signal(pid: int, sig: signal.Signals, what: str) -> None:
    if pid <= 0:
        raise ProcessFaultError(f"cannot {what} pid {pid}: a pid must be a positive integer")
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise ProcessFaultError(
            f"cannot {what} pid {pid}: no such process (it has already exited)"
        ) from None
    except PermissionError:
        raise ProcessFaultError(
            f"cannot {what} pid {pid}: permission denied (is it owned by another user?)"
        ) from None


def _await_state(pid: int, done: Callable[[str | None], bool], wait_s: float, what: str) -> None:
    poll = tenacity.Retrying(
        retry=tenacity.retry_if_result(lambda ok: not ok),
        wait=tenacity.wait_exponential(multiplier=0.0005, max=0.05),
        stop=tenacity.stop_after_delay(wait_s),
    )
    try:
        poll(lambda: done(process_state(pid)))
    except tenacity.RetryError:
        raise ProcessFaultError(
            f"pid {pid} did not {what} within {wait_s}s "
            f"(its state is {process_state(pid)!r})"
        ) from None


def _detail(pid: int, sig: str, note: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"pid": pid, "signal": sig, **dict(note or {})}


def _event(
    log_to: FaultLog | None, kind: str, target: str, detail: Mapping[str, Any]
) -> FaultEvent:
    if log_to is not None:
        return log_to.record(kind, target, detail)
    log.info("fault", kind=kind, target=target, **detail)
    return FaultEvent(time.time(), kind, target, dict(detail))
