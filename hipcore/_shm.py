"""Named shared-memory segments in /dev/shm, owner liveness, and a cross-process lock.

Segments are plain files mapped with mmap (not multiprocessing.shared_memory,
whose resource tracker unlinks segments that other processes merely attached
to). A segment's name carries its creator's pid and start time, so segments
left by a SIGKILLed process can be recognised and swept.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import mmap
import os
import re
import secrets
import select
import socket
import tempfile
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import structlog

log = structlog.get_logger("hipcore.shm")

PREFIX = "regent-"
# A hipcore segment's whole name: creator pid, its start time, a kind, 12 hex digits. wire.bulk's
# frames share the prefix (regent-UID-PID-N-8HEX) and must never be taken for one of these.
_NAME = re.compile(r"regent-(\d+)-(\d+)-([a-z]+)-[0-9a-f]{12}")
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def _start_ticks(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot (the kernel's own count).

    psutil's create_time() adds the boot time on the wall clock, which moves when the
    clock is stepped; taking it back out, read on both sides so that no step fell in
    between, gives the count a clock step cannot change (a segment name must keep naming
    its live creator). Raises psutil.Error if there is no such process."""
    for _ in range(3):
        boot = psutil.boot_time()
        created = psutil.Process(pid).create_time()
        if psutil.boot_time() == boot:
            break
    return round((created - boot) * _CLOCK_TICKS)


def process_start_time(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot (0 if it cannot be read); with the pid,
    it names one process, which guards against pid reuse."""
    try:
        return _start_ticks(pid)
    except psutil.Error:
        return 0


_me: tuple[int, int] | None = None


def my_identity() -> tuple[int, int]:
    """(pid, start time) of this process, recomputed after a fork."""
    global _me
    pid = os.getpid()
    if _me is None or _me[0] != pid:
        _me = (pid, process_start_time(pid))
    return _me


def is_alive(pid: int, start_time: int) -> bool:
    """True while process ``pid`` (started at ``start_time``) exists and is not a zombie."""
    try:
        if psutil.Process(pid).status() in _GONE:
            return False
        return start_time == 0 or _start_ticks(pid) == start_time
    except psutil.NoSuchProcess:  # ZombieProcess included
        return False
    except psutil.AccessDenied:
        return True


class _PidWatch:
    """pidfds of processes we check often: a poll on a pidfd costs a microsecond and, unlike a
    pid, cannot be fooled by pid reuse; it also reports a zombie as exited."""

    LIMIT = 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: dict[tuple[int, int], int] = {}

    def alive(self, pid: int, start_time: int) -> bool:
        key = (pid, start_time)
        with self._lock:
            fd = self._fds.get(key)
        if fd is None:
            if not is_alive(pid, start_time) or not hasattr(os, "pidfd_open"):
                return is_alive(pid, start_time)
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                return is_alive(pid, start_time)
            if not is_alive(pid, start_time):  # the pid was reused between the two checks
                os.close(fd)
                return False
            with self._lock:
                if len(self._fds) >= self.LIMIT:
                    _, old = self._fds.popitem()
                    os.close(old)
                self._fds[key] = fd
        readable, _, _ = select.select([fd], [], [], 0)
        if readable:
            with self._lock:
                if self._fds.pop(key, None) is not None:
                    os.close(fd)
            return False
        return True


_watch = _PidWatch()


def owner_alive(pid: int, start_time: int) -> bool:
    """Fast liveness check for a process we ask about repeatedly (see ``_PidWatch``)."""
    return _watch.alive(pid, start_time)


@functools.cache
def host_id() -> str:
    """Identifies this host: its kernel (boot) and its network namespace. Processes with the
    same host id share /dev/shm; a container or a namespace host of its own is another host,
    reached over TCP, as its peers reach it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "noboot"
    try:
        net = f"/net{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        net = ""
    return f"{socket.gethostname()}/{boot}{net}"


def _path(name: str) -> str:
    if "/" in name or not name.startswith(PREFIX):
        raise ValueError(f"{name!r} is not a hipcore shared-memory segment name")
    return os.path.join(SHM_DIR, name)


@dataclass(frozen=True)
class SegmentInfo:
    name: str
    address: int
    nbytes: int


# Data segments this process created and still maps, for zero-copy registration lookups.
_owned: dict[str, tuple[SegmentInfo, weakref.ref[mmap.mmap]]] = {}
_owned_lock = threading.Lock()
_swept = False


def _unlink(name: str) -> None:
    with _owned_lock:
        _owned.pop(name, None)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_path(name))


def create(kind: str, nbytes: int) -> tuple[str, mmap.mmap]:
    """Create and map a new segment; it is unlinked when the returned mmap is collected."""
    global _swept
    if not _swept:
        _swept = True
        sweep_orphans()
    pid, start = my_identity()
    name = f"{PREFIX}{pid}-{start}-{kind}-{secrets.token_hex(6)}"
    path = _path(name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(nbytes, 1))
        mm = mmap.mmap(fd, max(nbytes, 1))
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    weakref.finalize(mm, _unlink, name)
    return name, mm


def create_data(nbytes: int) -> tuple[str, mmap.mmap]:
    """A segment for user data, remembered so ``find_owned`` can map an address back to it."""
    import numpy as np

    name, mm = create("data", nbytes)
    address = int(np.frombuffer(mm, dtype=np.uint8).__array_interface__["data"][0])
    with _owned_lock:
        _owned[name] = (SegmentInfo(name, address, nbytes), weakref.ref(mm))
    return name, mm


def find_owned(address: int, nbytes: int) -> tuple[SegmentInfo, mmap.mmap] | None:
    """The data segment of this process that holds ``[address, address+nbytes)``, if any."""
    with _owned_lock:
        for info, ref in list(_owned.values()):
            mm = ref()
            if mm is None:
                continue
            if info.address <= address and address + nbytes <= info.address + info.nbytes:
                return info, mm
    return None


def attach(name: str) -> mmap.mmap:
    """Map an existing segment read-write (FileNotFoundError if it is gone)."""
    fd = os.open(_path(name), os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def owner_of(name: str) -> tuple[int, int]:
    """(pid, start time) encoded in a hipcore segment name; ValueError for any other name."""
    match = _NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not a hipcore shared-memory segment name")
    return int(match.group(1)), int(match.group(2))


def sweep_orphans() -> list[str]:
    """Remove segments whose creator has died (e.g. SIGKILLed before it could unlink them)."""
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        try:
            pid, start = owner_of(name)
        except (ValueError, IndexError):
            continue
        if not is_alive(pid, start):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
    if removed:
        log.info("removed shared-memory segments of dead processes", count=len(removed))
    return removed


class SegmentLock:
    """An exclusive lock on a segment across processes (flock, released by the kernel if the
    holder dies) and across threads of this process (flock alone is per open file)."""

    def __init__(self, name: str) -> None:
        self._fd = os.open(_path(name), os.O_RDWR)
        self._thread_lock = threading.Lock()
        weakref.finalize(self, os.close, self._fd)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
