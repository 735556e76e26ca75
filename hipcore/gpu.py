"""GPU backend (ROCm/HIP and CUDA alike) over PyTorch's ``torch.cuda`` device API.

ROCm builds of torch expose HIP through the same ``torch.cuda`` calls, so one
code path serves both. This is the only module (with ipc.py and rdma.py's IPC
path) that calls torch.cuda. It is not exercised on machines without a GPU;
bench/gpu_check.sh runs the test-suite against it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from regent.hipcore.backend import require_torch
from regent.hipcore.cpu import check_elapsed_preconditions
from regent.hipcore.errors import EventError, StreamError

_CALIBRATION_CYCLES = 20_000_000
_cycles_per_second: dict[int, float] = {}


def _torch() -> Any:
    return require_torch("the GPU backend")


class GpuStream:
    """A ``torch.cuda.Stream``; work is launched by running host code with the stream current."""

    def __init__(
        self, device_index: int = 0, priority: int = 0, torch_stream: Any | None = None
    ) -> None:
        torch = _torch()
        self.device_index = device_index
        self.torch_stream = (
            torch_stream
            if torch_stream is not None
            else torch.cuda.Stream(device=device_index, priority=priority)
        )
        self.name = f"cuda-stream-{self.torch_stream.cuda_stream:#x}"

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        torch = _torch()
        with torch.cuda.device(self.device_index), torch.cuda.stream(self.torch_stream):
            fn(*args, **kwargs)

    def delay(self, seconds: float) -> None:
        torch = _torch()
        cycles = int(seconds * _sleep_rate(self.device_index))
        with torch.cuda.device(self.device_index), torch.cuda.stream(self.torch_stream):
            torch.cuda._sleep(cycles)

    def copy_async(self, dst: Any, src: Any) -> None:
        from regent.hipcore._copy import copy_bytes, is_device_tensor

        torch = _torch()
        with torch.cuda.device(self.device_index), torch.cuda.stream(self.torch_stream):
            copy_bytes(dst, src)
            # The caching allocator must not reuse these blocks until this stream is done with them.
            for t in (dst, src):
                if is_device_tensor(t):
                    t.record_stream(self.torch_stream)

    def query(self) -> bool:
        return bool(self.torch_stream.query())

    def synchronize(self, timeout: float | None = None) -> None:
        try:
            self.torch_stream.synchronize()
        except RuntimeError as exc:
            raise StreamError(f"work queued on {self.name} failed: {exc}") from exc

    def raise_pending_error(self) -> None:
        """GPU faults surface on the next synchronising call; nothing is held host-side."""

    def close(self) -> None:
        """Streams are returned to torch's pool when collected; nothing to stop."""

    def __repr__(self) -> str:
        return f"GpuStream({self.name}, device={self.device_index})"


def _sleep_rate(device_index: int) -> float:
    """Cycles per second of ``torch.cuda._sleep`` on this device, measured once.

    The spin counter's rate differs between vendors (and with clocks), so a delay is
    calibrated with timing events rather than assumed from a nominal clock.
    """
    rate = _cycles_per_second.get(device_index)
    if rate is None:
        torch = _torch()
        with torch.cuda.device(device_index):
            stream = torch.cuda.Stream()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                torch.cuda._sleep(_CALIBRATION_CYCLES // 10)  # warm-up launch
                start.record(stream)
                torch.cuda._sleep(_CALIBRATION_CYCLES)
                end.record(stream)
            end.synchronize()
            seconds = max(start.elapsed_time(end) / 1e3, 1e-6)
        rate = _cycles_per_second[device_index] = _CALIBRATION_CYCLES / seconds
    return rate


class GpuEvent:
    """A ``torch.cuda.Event`` with the same preconditions as the CPU backend's events."""

    def __init__(self, enable_timing: bool = False, interprocess: bool = False) -> None:
        torch = _torch()
        if enable_timing and interprocess:
            raise EventError("an interprocess event cannot have enable_timing=True (CUDA/HIP rule)")
        self.enable_timing = enable_timing
        self.torch_event = torch.cuda.Event(
            enable_timing=enable_timing, blocking=False, interprocess=interprocess
        )
        self.recorded = False

    def record(self, stream: GpuStream) -> None:
        self.torch_event.record(stream.torch_stream)
        self.recorded = True

    def wait(self, stream: GpuStream) -> None:
        if self.recorded:
            self.torch_event.wait(stream.torch_stream)

    def query(self) -> bool:
        return bool(self.torch_event.query())

    def synchronize(self, timeout: float | None = None) -> None:
        self.torch_event.synchronize()

    def elapsed_time(self, end: GpuEvent) -> float:
        check_elapsed_preconditions(self, end)
        return float(self.torch_event.elapsed_time(end.torch_event))


class GpuMemory:
    """Memory statistics from torch's caching allocator, plus hipcore's own pinned-host count."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self.pinned = 0

    def stats(self) -> dict[str, int]:
        torch = _torch()
        s = torch.cuda.memory_stats(self.device_index)
        return {
            "allocated_bytes": int(s.get("allocated_bytes.all.current", 0)),
            "peak_allocated_bytes": int(s.get("allocated_bytes.all.peak", 0)),
            "reserved_bytes": int(s.get("reserved_bytes.all.current", 0)),
            "allocations": int(s.get("allocation.all.current", 0)),
            "total_allocations": int(s.get("allocation.all.allocated", 0)),
            "pinned_bytes": self.pinned,
        }

    def reset_peak(self) -> None:
        _torch().cuda.reset_peak_memory_stats(self.device_index)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        torch = _torch()
        return torch.empty(shape, dtype=dtype, device=torch.device("cuda", self.device_index))

    def pinned_empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        torch = _torch()
        t = torch.empty(shape, dtype=dtype, pin_memory=True)
        nbytes = t.numel() * t.element_size()
        self.pinned += nbytes
        weakref.finalize(t, self._unpin, nbytes)
        return t

    def _unpin(self, nbytes: int) -> None:
        self.pinned -= nbytes


def synchronize_device(device_index: int) -> None:
    _torch().cuda.synchronize(device_index)


def device_name(device_index: int) -> str:
    return str(_torch().cuda.get_device_name(device_index))
