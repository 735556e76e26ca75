"""CPU backend: streams as ordered work queues, events as completion markers.

Each stream owns one worker thread that runs its work strictly in submission
order; an event marks a point in a stream and completes when the worker reaches
it. The ordering guarantees are those of a GPU stream, so code written against
hipcore behaves the same with no GPU. Nothing here imports torch eagerly.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import structlog

from regent.hipcore.errors import EventError, StreamError

log = structlog.get_logger("hipcore.cpu")

_stream_ids = itertools.count()


class _Marker:
    """One recording of an event: set when the recording stream reaches it."""

    __slots__ = ("done", "time_ns")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.time_ns: int | None = None

    def complete(self) -> None:
        self.time_ns = time.perf_counter_ns()
        self.done.set()


class _StreamState:
    """What the worker thread shares with its stream (never the stream itself, so it can be collected)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self.submitted = 0
        self.completed = 0
        self.error: BaseException | None = None
        self.error_tb = ""


def _run_stream(state: _StreamState, name: str) -> None:
    while True:
        op = state.queue.get()
        if op is None:
            return
        try:
            op()
        except BaseException as exc:  # noqa: BLE001 - deferred to synchronize(), as on a GPU
            if state.error is None:
                state.error = exc
                state.error_tb = traceback.format_exc()
            log.warning("stream work failed", stream=name, error=repr(exc))
        finally:
            state.completed += 1


def _stop(state: _StreamState) -> None:
    state.queue.put(None)


class CpuStream:
    """An ordered work queue executed by one thread; the CPU stand-in for a GPU stream."""

    def __init__(self, device_index: int = 0, name: str | None = None) -> None:
        self.device_index = device_index
        self.name = name or f"cpu-stream-{next(_stream_ids)}"
        self._state = _StreamState()
        self._lock = threading.Lock()
        thread = threading.Thread(
            target=_run_stream, args=(self._state, self.name), name=self.name, daemon=True
        )
        thread.start()
        self._thread = thread
        self._finalizer = weakref.finalize(self, _stop, self._state)

    def enqueue(self, op: Callable[[], Any]) -> None:
        if not self._finalizer.alive:
            raise StreamError(f"{self.name} is closed; create a new Stream")
        with self._lock:
            self._state.submitted += 1
            self._state.queue.put(op)

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.enqueue(lambda: fn(*args, **kwargs))

    def delay(self, seconds: float) -> None:
        self.enqueue(lambda: time.sleep(seconds))

    def copy_async(self, dst: Any, src: Any) -> None:
        from regent.hipcore._copy import copy_bytes

        self.enqueue(lambda: copy_bytes(dst, src))

    def query(self) -> bool:
        state = self._state
        return state.completed >= state.submitted

    def synchronize(self, timeout: float | None = None) -> None:
        marker = _Marker()
        self.enqueue(marker.complete)
        if not marker.done.wait(timeout):
            raise StreamError(f"{self.name} did not drain within {timeout}s")
        self.raise_pending_error()

    def raise_pending_error(self) -> None:
        state = self._state
        if state.error is not None:
            exc, tb = state.error, state.error_tb
            state.error, state.error_tb = None, ""
            raise StreamError(
                f"work queued on {self.name} failed: {exc!r} (remote traceback follows)\n{tb}"
            ) from exc

    def close(self) -> None:
        """Stop the worker thread after the work already queued."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"CpuStream({self.name}, device={self.device_index})"


class CpuEvent:
    """A completion marker with CUDA event semantics.

    ``record`` captures the stream's work so far; ``wait`` makes a stream wait for
    the most recent record at the time of the call; an event never recorded counts
    as complete, as ``cudaEventQuery`` does.
    """

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self._marker: _Marker | None = None

    @property
    def recorded(self) -> bool:
        return self._marker is not None

    def record(self, stream: CpuStream) -> None:
        marker = _Marker()
        self._marker = marker
        stream.enqueue(marker.complete)

    def wait(self, stream: CpuStream) -> None:
        marker = self._marker
        if marker is not None:
            stream.enqueue(marker.done.wait)

    def query(self) -> bool:
        marker = self._marker
        return marker is None or marker.done.is_set()

    def synchronize(self, timeout: float | None = None) -> None:
        marker = self._marker
        if marker is not None and not marker.done.wait(timeout):
            raise EventError(f"event not complete within {timeout}s")

    def elapsed_time(self, end: CpuEvent) -> float:
        check_elapsed_preconditions(self, end)
        assert self._marker is not None and end._marker is not None
        assert self._marker.time_ns is not None and end._marker.time_ns is not None
        return (end._marker.time_ns - self._marker.time_ns) / 1e6


def check_elapsed_preconditions(start: Any, end: Any) -> None:
    """The checks a GPU runtime makes before timing two events, with errors a person can act on."""
    if not (start.enable_timing and end.enable_timing):
        raise EventError(
            "elapsed_time needs both events created with Event(enable_timing=True)"
        )
    if not (start.recorded and end.recorded):
        which = "start" if not start.recorded else "end"
        raise EventError(
            f"elapsed_time: the {which} event was never recorded; call event.record(stream) first"
        )
    if not (start.query() and end.query()):
        raise EventError(
            "elapsed_time: an event has not completed yet; call end.synchronize() first"
        )


class CpuMemory:
    """Allocation bookkeeping for the CPU backend, so memory statistics move as on a GPU."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.allocated = 0
        self.peak = 0
        self.live_allocations = 0
        self.total_allocations = 0
        self.pinned = 0

    def track(self, owner: Any, nbytes: int, pinned: bool = False) -> None:
        with self._lock:
            if pinned:
                self.pinned += nbytes
            else:
                self.allocated += nbytes
                self.peak = max(self.peak, self.allocated)
                self.live_allocations += 1
                self.total_allocations += 1
        weakref.finalize(owner, self._release, nbytes, pinned)

    def _release(self, nbytes: int, pinned: bool) -> None:
        with self._lock:
            if pinned:
                self.pinned -= nbytes
            else:
                self.allocated -= nbytes
                self.live_allocations -= 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "allocated_bytes": self.allocated,
                "peak_allocated_bytes": self.peak,
                "reserved_bytes": self.allocated,
                "allocations": self.live_allocations,
                "total_allocations": self.total_allocations,
                "pinned_bytes": self.pinned,
            }

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.allocated


def empty_tensor(memory: CpuMemory, shape: tuple[int, ...], dtype: Any, pinned: bool) -> Any:
    """A CPU tensor whose bytes are tracked until the last view of them is gone."""
    import numpy as np

    from regent.hipcore.backend import require_torch

    torch = require_torch("allocating tensors")
    count = 1
    for dim in shape:
        count *= int(dim)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = np.empty(max(count * itemsize, 1), dtype=np.uint8)
    memory.track(raw, raw.nbytes, pinned=pinned)
    return torch.from_numpy(raw)[: count * itemsize].view(dtype).reshape(shape)
