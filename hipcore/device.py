"""The runtime interface: ``Device``, ``Stream`` and ``Event``, whatever the backend.

These classes pick the CPU or GPU implementation from ``backend()`` and give
both the same semantics (see docs/hipcore.md). They never talk to actors or the
controller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from regent.hipcore import cpu
from regent.hipcore.backend import BackendName, backend, require_torch
from regent.hipcore.binding import bound_cpu_device, bound_physical_devices
from regent.hipcore.errors import HipcoreError


class _DeviceState:
    """Per-device shared state: memory accounting and the lazily created default stream."""

    def __init__(self, kind: BackendName, index: int) -> None:
        self.kind = kind
        self.index = index
        self.lock = threading.Lock()
        self.default_stream: Stream | None = None
        if kind == "cpu":
            self.memory: Any = cpu.CpuMemory()
        else:
            from regent.hipcore.gpu import GpuMemory

            self.memory = GpuMemory(index)


_states: dict[tuple[str, int], _DeviceState] = {}
_states_lock = threading.Lock()


def _state(kind: BackendName, index: int) -> _DeviceState:
    with _states_lock:
        st = _states.get((kind, index))
        if st is None:
            st = _states[(kind, index)] = _DeviceState(kind, index)
        return st


class Device:
    """One device of the current backend: a GPU (CUDA or HIP) or a logical CPU device."""

    def __init__(self, index: int | None = None) -> None:
        info = backend()
        self.kind: BackendName = info.name
        if index is None:
            index = current_device().index
        if info.is_gpu and not 0 <= index < info.device_count:
            raise HipcoreError(
                f"{info.name} device {index} does not exist: this proc sees "
                f"{info.device_count} device(s) (check the proc's visible-devices binding)"
            )
        self.index = index

    @property
    def torch_device(self) -> Any:
        torch = require_torch("Device.torch_device")
        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", self.index)

    @property
    def physical_ids(self) -> list[str]:
        """Host-level device ids this proc was bound to, from the proc binding (may be empty)."""
        return bound_physical_devices()

    @property
    def name(self) -> str:
        if self.kind == "cpu":
            return f"cpu:{self.index} (emulated)"
        from regent.hipcore.gpu import device_name

        return device_name(self.index)

    def _st(self) -> _DeviceState:
        return _state(self.kind, self.index)

    def stream(self, priority: int = 0) -> Stream:
        """A new stream on this device."""
        return Stream(self, priority=priority)

    def default_stream(self) -> Stream:
        """The device's default stream (one per device per process)."""
        st = self._st()
        with st.lock:
            if st.default_stream is None:
                if self.kind == "cpu":
                    st.default_stream = Stream(self)
                else:
                    from regent.hipcore.gpu import GpuStream

                    torch = require_torch("the GPU backend")
                    impl = GpuStream(self.index, torch_stream=torch.cuda.default_stream(self.index))
                    st.default_stream = Stream._wrap(self, impl)
            return st.default_stream

    def synchronize(self) -> None:
        """Wait for all work on this device (CPU: on streams created through this process)."""
        if self.kind == "cpu":
            for s in list(_live_cpu_streams.get(self.index, {}).values()):
                s.synchronize()
        else:
            from regent.hipcore.gpu import synchronize_device

            synchronize_device(self.index)

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = None) -> Any:
        """An uninitialised device tensor (torch) counted in ``memory_stats``."""
        torch = require_torch("Device.empty")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = torch.float32 if dtype is None else dtype
        if self.kind == "cpu":
            return cpu.empty_tensor(self._st().memory, shape, dtype, pinned=False)
        return self._st().memory.empty(shape, dtype)

    def pinned_empty(self, shape: tuple[int, ...] | int, dtype: Any = None) -> Any:
        """An uninitialised page-locked host tensor for fast asynchronous copies (plain host memory on CPU)."""
        torch = require_torch("Device.pinned_empty")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = torch.float32 if dtype is None else dtype
        if self.kind == "cpu":
            return cpu.empty_tensor(self._st().memory, shape, dtype, pinned=True)
        return self._st().memory.pinned_empty(shape, dtype)

    def memory_stats(self) -> dict[str, int]:
        """``allocated_bytes``, ``peak_allocated_bytes``, ``reserved_bytes``, ``allocations``,
        ``total_allocations``, ``pinned_bytes``: the same keys on every backend."""
        return dict(self._st().memory.stats())

    def reset_peak_memory_stats(self) -> None:
        self._st().memory.reset_peak()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self) -> int:
        return hash((self.kind, self.index))

    def __repr__(self) -> str:
        return f"Device({self.kind}:{self.index})"


_live_cpu_streams: dict[int, Any] = {}


def _register_cpu_stream(index: int, stream: Stream) -> None:
    import weakref

    table = _live_cpu_streams.setdefault(index, weakref.WeakValueDictionary())
    table[id(stream)] = stream


class Stream:
    """An ordered queue of device work. Work on one stream runs in order; streams
    run concurrently unless ordered with events (``wait_event``/``wait_stream``)."""

    def __init__(self, device: Device | int | None = None, *, priority: int = 0) -> None:
        dev = device if isinstance(device, Device) else Device(device)
        self.device = dev
        if dev.kind == "cpu":
            self._impl: Any = cpu.CpuStream(dev.index)
            _register_cpu_stream(dev.index, self)
        else:
            from regent.hipcore.gpu import GpuStream

            self._impl = GpuStream(dev.index, priority=priority)

    @classmethod
    def _wrap(cls, device: Device, impl: Any) -> Stream:
        s = cls.__new__(cls)
        s.device = device
        s._impl = impl
        return s

    @property
    def torch_stream(self) -> Any:
        """The underlying ``torch.cuda.Stream`` (GPU backends only)."""
        if self.device.kind == "cpu":
            raise HipcoreError("a CPU-backend stream has no torch stream; use Stream.launch")
        return self._impl.torch_stream

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``fn(*args, **kwargs)`` on this stream.

        GPU: ``fn`` runs now on the calling thread with this stream current, so the
        kernels it launches are queued on the stream. CPU: ``fn`` runs later on the
        stream's worker, after all earlier work; an exception is raised by the next
        ``synchronize()`` as ``StreamError`` (as GPU faults are).
        """
        self._impl.launch(fn, *args, **kwargs)

    def delay(self, seconds: float) -> None:
        """Queue work that keeps the stream busy for about ``seconds`` (tests and benchmarks)."""
        self._impl.delay(seconds)

    def copy_async(self, dst: Any, src: Any) -> None:
        """Queue a copy of ``src`` into ``dst`` (same byte size); returns at once.
        Do not touch either buffer until an event recorded after it completes."""
        self._impl.copy_async(dst, src)

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) at the current end of this stream."""
        event = event if event is not None else Event()
        event.record(self)
        return event

    def wait_event(self, event: Any) -> None:
        """Later work on this stream waits until ``event``'s latest record completes (host returns at once).
        ``event`` may be an ``Event`` or an ``IpcEvent``."""
        event.wait(self)

    def wait_stream(self, other: Stream) -> None:
        """Later work on this stream waits for everything queued on ``other`` so far."""
        self.wait_event(other.record_event())

    def query(self) -> bool:
        """True when all queued work has completed."""
        return self._impl.query()

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until all queued work has completed; raises ``StreamError`` if any of it failed."""
        self._impl.synchronize(timeout)

    def close(self) -> None:
        self._impl.close()

    def __repr__(self) -> str:
        return f"Stream({self._impl!r})"


class Event:
    """A marker in a stream: ``record`` / ``wait`` / ``query`` / ``synchronize`` / ``elapsed_time``."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.kind: BackendName = backend().name
        if self.kind == "cpu":
            self._impl: Any = cpu.CpuEvent(enable_timing=enable_timing)
        else:
            from regent.hipcore.gpu import GpuEvent

            self._impl = GpuEvent(enable_timing=enable_timing)

    @property
    def enable_timing(self) -> bool:
        return self._impl.enable_timing

    @property
    def recorded(self) -> bool:
        return self._impl.recorded

    def record(self, stream: Stream | None = None) -> None:
        """Capture all work queued on ``stream`` (default: the current device's default stream) so far."""
        stream = stream if stream is not None else current_device().default_stream()
        self._impl.record(stream._impl)

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream``'s later work wait for this event's latest record (no-op if never recorded)."""
        stream = stream if stream is not None else current_device().default_stream()
        self._impl.wait(stream._impl)

    def query(self) -> bool:
        """True when the recorded work has completed (or the event was never recorded)."""
        return self._impl.query()

    def synchronize(self, timeout: float | None = None) -> None:
        """Block the host until the recorded work has completed."""
        self._impl.synchronize(timeout)

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds between this event and ``end``. Both need ``enable_timing=True``,
        must have been recorded and must have completed; otherwise ``EventError``."""
        return self._impl.elapsed_time(end._impl)


def current_device() -> Device:
    """The device this proc is bound to (see ``hipcore.binding``): GPU 0 of the visible set,
    or logical CPU device ``$REGENT_CPU_DEVICE``."""
    info = backend()
    if info.name == "cpu":
        index = bound_cpu_device()
    else:
        torch = require_torch("the GPU backend")
        index = int(torch.cuda.current_device())
    dev = Device.__new__(Device)
    dev.kind = info.name
    dev.index = index
    return dev


def device_count() -> int:
    return backend().device_count
