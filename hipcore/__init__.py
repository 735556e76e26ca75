"""hipcore: regent's GPU runtime layer (ROCm/HIP, CUDA, and a CPU emulation).

Devices, streams, events, memory, cross-process synchronisation and RDMA
buffers behind one interface; see docs/hipcore.md. It knows nothing of actors
or the controller.
"""

from regent.hipcore import binding, distributed, rdma
from regent.hipcore.backend import BackendInfo, backend, detect_backend, reset_backend
from regent.hipcore.device import Device, Event, Stream, current_device, device_count
from regent.hipcore.errors import (
    BackendUnavailableError,
    BrokenBarrierError,
    EventError,
    HipcoreError,
    IpcError,
    PeerGoneError,
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerGoneError,
    RDMASizeError,
    RDMATimeoutError,
    StreamError,
)
from regent.hipcore.ipc import Barrier, IpcEvent
from regent.hipcore.rdma import RDMABuffer, RDMAFuture, shared_array, shared_tensor

__all__ = [
    "BackendInfo",
    "BackendUnavailableError",
    "Barrier",
    "BrokenBarrierError",
    "Device",
    "Event",
    "EventError",
    "HipcoreError",
    "IpcError",
    "IpcEvent",
    "PeerGoneError",
    "RDMABuffer",
    "RDMABufferDroppedError",
    "RDMAError",
    "RDMAFuture",
    "RDMAOwnerGoneError",
    "RDMASizeError",
    "RDMATimeoutError",
    "Stream",
    "StreamError",
    "backend",
    "binding",
    "current_device",
    "detect_backend",
    "device_count",
    "distributed",
    "rdma",
    "reset_backend",
    "shared_array",
    "shared_tensor",
]
