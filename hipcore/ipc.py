"""Synchronisation across processes on one host: ``IpcEvent`` and ``Barrier``.

Both are small picklable handles: create in one process, send (pickle) to
others, use everywhere. GPU backends use CUDA/HIP IPC event handles for events;
the CPU backend and barriers use a shared-memory word polled with a short
spin-then-sleep, with the creator's liveness checked so a dead peer raises
instead of hanging.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from regent.hipcore import _shm
from regent.hipcore.backend import backend
from regent.hipcore.errors import BrokenBarrierError, IpcError, PeerGoneError

log = structlog.get_logger("hipcore.ipc")

_MAGIC_EVENT = 0x52474E5445564E54  # "RGNTEVNT"
_MAGIC_BARRIER = 0x52474E5442415252  # "RGNTBARR"
_LIVENESS_EVERY_S = 0.01


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout: float | None,
    owner: tuple[int, int] | None,
    what: str,
) -> None:
    """Poll ``predicate``: spin briefly, then sleep with backoff (max 1 ms).

    Raises ``PeerGoneError`` if ``owner`` (pid, start time) dies first and
    ``IpcError`` on timeout.
    """
    start = time.monotonic()
    next_check = start + _LIVENESS_EVERY_S
    spins = 0
    sleep = 20e-6
    while not predicate():
        spins += 1
        if spins < 200:
            continue
        now = time.monotonic()
        if now >= next_check:
            next_check = now + _LIVENESS_EVERY_S
            if owner is not None and not _shm.is_alive(*owner):
                if predicate():
                    return
                raise PeerGoneError(
                    f"{what}: the owning process (pid {owner[0]}) died before it completed"
                )
        if timeout is not None and now - start >= timeout:
            raise IpcError(f"{what}: not complete after {timeout}s")
        time.sleep(sleep)
        sleep = min(sleep * 2, 1e-3)


@dataclass(frozen=True)
class IpcEventHandle:
    """What crosses the process boundary for an ``IpcEvent``."""

    kind: str  # "cpu" | "cuda" | "hip"
    segment: str
    owner_pid: int
    owner_start: int
    device_index: int = 0
    gpu_handle: bytes = b""


class IpcEvent:
    """An event that other processes on the host can wait on.

    Only the creating process records it (``record``); every process holding
    the handle may ``wait`` (a stream waits), ``query`` and ``synchronize``.
    Like a CUDA event, a wait targets the latest record at the time of the call.
    """

    _WORDS = 8  # magic, pid, start, recorded, completed

    def __init__(self, device_index: int | None = None) -> None:
        info = backend()
        self.kind = info.name
        pid, start = _shm.my_identity()
        # The shm word exists on every backend: it carries the owner's liveness, and the
        # record count for the CPU backend.
        name, mm = _shm.create("event", self._WORDS * 8)
        self._mm = mm
        self._words = np.frombuffer(mm, dtype=np.int64, count=self._WORDS)
        self._words[:5] = (_MAGIC_EVENT, pid, start, 0, 0)
        self._gpu: Any = None
        gpu_handle = b""
        if info.is_gpu:
            from regent.hipcore.device import current_device
            from regent.hipcore.gpu import GpuEvent

            device_index = current_device().index if device_index is None else device_index
            self._gpu = GpuEvent(interprocess=True)
            gpu_handle = bytes(self._gpu.torch_event.ipc_handle())
        self.handle = IpcEventHandle(
            self.kind, name, pid, start, device_index or 0, gpu_handle
        )
        self.is_owner = True

    @classmethod
    def open(cls, handle: IpcEventHandle) -> IpcEvent:
        """Attach to an event created in another process."""
        self = cls.__new__(cls)
        self.kind = handle.kind
        self.handle = handle
        self.is_owner = (handle.owner_pid, handle.owner_start) == _shm.my_identity()
        try:
            self._mm = _shm.attach(handle.segment)
        except FileNotFoundError:
            if not _shm.is_alive(handle.owner_pid, handle.owner_start):
                raise PeerGoneError(
                    f"IpcEvent of pid {handle.owner_pid} is gone: its owner exited"
                ) from None
            raise IpcError(
                f"IpcEvent segment {handle.segment} not found; it must be opened on the host "
                "that created it"
            ) from None
        self._words = np.frombuffer(self._mm, dtype=np.int64, count=cls._WORDS)
        if int(self._words[0]) != _MAGIC_EVENT:
            raise IpcError(f"{handle.segment} is not an IpcEvent segment")
        self._gpu = None
        if handle.kind != "cpu":
            from regent.hipcore.backend import require_torch

            torch = require_torch("opening a GPU IpcEvent")
            event = torch.cuda.Event.from_ipc_handle(handle.device_index, handle.gpu_handle)
            from regent.hipcore.gpu import GpuEvent

            gpu = GpuEvent.__new__(GpuEvent)
            gpu.enable_timing = False
            gpu.torch_event = event
            gpu.recorded = True
            self._gpu = gpu
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (IpcEvent.open, (self.handle,))

    @property
    def _owner(self) -> tuple[int, int]:
        return (self.handle.owner_pid, self.handle.owner_start)

    def record(self, stream: Any = None) -> None:
        """Record on ``stream`` (default stream if None). Owner process only."""
        if not self.is_owner:
            raise IpcError(
                "IpcEvent.record is only allowed in the process that created the event "
                f"(pid {self.handle.owner_pid}); other processes wait on it"
            )
        from regent.hipcore.device import current_device

        stream = stream if stream is not None else current_device().default_stream()
        if self._gpu is not None:
            self._gpu.record(stream._impl)
            return
        words = self._words
        generation = int(words[3]) + 1
        words[3] = generation

        def complete() -> None:
            words[4] = generation

        stream._impl.enqueue(complete)

    def wait(self, stream: Any = None) -> None:
        """Make ``stream``'s later work wait for the latest record (returns at once)."""
        from regent.hipcore.device import current_device

        stream = stream if stream is not None else current_device().default_stream()
        if self._gpu is not None:
            self._gpu.wait(stream._impl)
            return
        target = int(self._words[3])
        if int(self._words[4]) >= target:
            return
        words, owner = self._words, self._owner
        stream._impl.enqueue(
            lambda: wait_until(
                lambda: int(words[4]) >= target,
                timeout=None,
                owner=owner,
                what=f"stream wait on IpcEvent of pid {owner[0]}",
            )
        )

    def query(self) -> bool:
        """True when the latest record has completed."""
        if self._gpu is not None:
            return self._gpu.query()
        return int(self._words[4]) >= int(self._words[3])

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until the latest record completes; ``PeerGoneError`` if the owner dies first."""
        if self._gpu is not None:
            gpu, owner = self._gpu, self._owner

            def done() -> bool:
                try:
                    return gpu.query()
                except RuntimeError as exc:  # the driver reports a dead owner's event as an error
                    if not _shm.is_alive(*owner):
                        raise PeerGoneError(
                            f"IpcEvent.synchronize: the owning process (pid {owner[0]}) died"
                        ) from exc
                    raise IpcError(f"IpcEvent.synchronize failed: {exc}") from exc

            wait_until(done, timeout=timeout, owner=self._owner, what="IpcEvent.synchronize")
            return
        target = int(self._words[3])
        words = self._words
        wait_until(
            lambda: int(words[4]) >= target,
            timeout=timeout,
            owner=None if self.is_owner else self._owner,
            what=f"IpcEvent.synchronize (pid {self.handle.owner_pid})",
        )


@dataclass(frozen=True)
class BarrierHandle:
    segment: str
    parties: int
    owner_pid: int
    owner_start: int


class Barrier:
    """A reusable barrier for ``parties`` processes on one host.

    Create it in one process (which must outlive the barrier's use), pickle it to
    the others; every party calls ``wait()``. A timeout or ``abort()`` in one
    party breaks the barrier for all of them (``BrokenBarrierError``), as with
    ``threading.Barrier``.
    """

    _WORDS = 8  # magic, parties, count, generation, broken

    def __init__(self, parties: int) -> None:
        if parties < 1:
            raise ValueError(f"a barrier needs at least one party, got {parties}")
        pid, start = _shm.my_identity()
        name, mm = _shm.create("barrier", self._WORDS * 8)
        self._attach(BarrierHandle(name, parties, pid, start), mm)
        self._words[:5] = (_MAGIC_BARRIER, parties, 0, 0, 0)

    def _attach(self, handle: BarrierHandle, mm: Any) -> None:
        self.handle = handle
        self.parties = handle.parties
        self._mm = mm
        self._words = np.frombuffer(mm, dtype=np.int64, count=self._WORDS)
        self._lock = _shm.SegmentLock(handle.segment)

    @classmethod
    def open(cls, handle: BarrierHandle) -> Barrier:
        self = cls.__new__(cls)
        try:
            mm = _shm.attach(handle.segment)
        except FileNotFoundError:
            raise PeerGoneError(
                f"barrier {handle.segment} is gone: its creator (pid {handle.owner_pid}) "
                "exited; the creating process must outlive the barrier's use"
            ) from None
        self._attach(handle, mm)
        if int(self._words[0]) != _MAGIC_BARRIER:
            raise IpcError(f"{handle.segment} is not a barrier segment")
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (Barrier.open, (self.handle,))

    @property
    def broken(self) -> bool:
        return bool(self._words[4])

    def abort(self) -> None:
        """Break the barrier: current and future waiters raise ``BrokenBarrierError``."""
        with self._lock.held():
            self._words[4] = 1

    def wait(self, timeout: float | None = None) -> int:
        """Block until all parties have called ``wait``; returns this party's arrival index (0..parties-1)."""
        words = self._words
        with self._lock.held():
            if words[4]:
                raise BrokenBarrierError(f"barrier {self.handle.segment} is broken")
            generation = int(words[3])
            arrival = int(words[2])
            if arrival + 1 == self.parties:
                words[2] = 0
                words[3] = generation + 1
                return arrival
            words[2] = arrival + 1
        try:
            wait_until(
                lambda: int(words[3]) != generation or bool(words[4]),
                timeout=timeout,
                owner=None,
                what=f"barrier of {self.parties} parties",
            )
        except IpcError:
            self.abort()
            raise BrokenBarrierError(
                f"barrier of {self.parties} parties timed out after {timeout}s with "
                f"{arrival + 1} arrived; it is now broken for every party"
            ) from None
        if int(words[3]) == generation:
            raise BrokenBarrierError(f"barrier {self.handle.segment} was broken while waiting")
        return arrival
