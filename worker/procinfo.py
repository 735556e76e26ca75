"""What the kernel says about a process, read through psutil: whether it runs, when it
started, and which regent proc it is by its command line.

Read-only inspection by pid; nothing here signals or waits on a process (the host
agent does that through pidfds, which cannot be fooled by pid reuse).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import psutil

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def running(pid: int) -> bool:
    """Alive and not a zombie (a dead process nobody reaped still answers kill(pid, 0))."""
    try:
        return psutil.Process(pid).status() not in _GONE
    except psutil.Error:
        return False


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (the kernel's own count): with the pid,
    it names one process. None if there is no such process.

    psutil's create_time() is that count plus the boot time on the wall clock, which moves
    when the clock is stepped; taking the boot time back out, read on both sides so that
    no step fell in between, gives a value a clock step cannot change."""
    for _ in range(3):
        boot = psutil.boot_time()
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            return None
        if psutil.boot_time() == boot:
            break
    return round((created - boot) * _CLOCK_TICKS)


def host_agent_of(pid: int) -> int | None:
    """The pid of the host agent that started process `pid`: its parent, or the parent of the
    zygote it was forked from (worker/zygote.py). None if either is gone."""
    try:
        parent = psutil.Process(pid).parent()
        if parent is not None and "regent.worker.zygote" in parent.cmdline():
            parent = parent.parent()
        return None if parent is None else parent.pid
    except psutil.Error:
        return None


@dataclass(frozen=True)
class ProcInfo:
    """A running regent proc (`python -m regent.worker.proc`) of this user, from its command line."""

    pid: int
    session: str
    id: str
    index: int


def proc_info(pid: int) -> ProcInfo | None:
    """The proc `pid` is, if it is a running regent proc of this user; None otherwise."""
    try:
        proc = psutil.Process(pid)
        info = _parse(pid, proc.cmdline())  # first: it rules out almost every process
        if info is None or proc.uids().effective != os.getuid() or proc.status() in _GONE:
            return None
        return info
    except psutil.Error:
        return None


def running_procs() -> Iterator[ProcInfo]:
    """Every running regent proc of this user on this machine."""
    for pid in psutil.pids():
        info = proc_info(pid)
        if info is not None:
            yield info


def _parse(pid: int, args: list[str]) -> ProcInfo | None:
    if "regent.worker.proc" not in args:
        return None

    def arg(name: str) -> str | None:
        return args[args.index(name) + 1] if name in args[:-1] else None

    session, proc_id, index = arg("--session"), arg("--id"), arg("--index")
    if session is None or proc_id is None or index is None or not index.isdigit():
        return None
    return ProcInfo(pid, session, proc_id, int(index))
