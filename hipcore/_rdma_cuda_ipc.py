"""Same-host RDMA between GPUs: CUDA/HIP IPC memory handles via torch.multiprocessing's reductions.

The owner exports the allocation once per handle (``reduce_tensor``); a reader
on the same host opens it on its own device that has the same UUID and copies
device to device. Untested without a GPU (bench/gpu_check.sh exercises it). A
reader that cannot see the owner's GPU (one-GPU-per-proc binding hides it)
is not reachable by this transport and falls back to TCP.
"""

from __future__ import annotations

import threading
from typing import Any

from regent.hipcore import _copy, _shm
from regent.hipcore._rdma_registry import RDMAHandle, Region
from regent.hipcore._rdma_shm import check_live, finish_device_copies
from regent.hipcore.backend import backend


def _device_uuid(index: int) -> str:
    import torch

    props = torch.cuda.get_device_properties(index)
    return str(getattr(props, "uuid", "")) or f"{props.name}/{getattr(props, 'pci_bus_id', index)}"


def _local_index(uuid: str) -> int | None:
    import torch

    for i in range(torch.cuda.device_count()):
        if _device_uuid(i) == uuid:
            return i
    return None


class CudaIpcTransport:
    """Device-to-device copies through an IPC-mapped view of the owner's allocation."""

    name = "cuda_ipc"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._opened: dict[bytes, Any] = {}

    def endpoint(self, region: Region) -> Any | None:
        if region.device != "cuda" or region.nbytes == 0:
            return None
        from torch.multiprocessing.reductions import reduce_tensor

        _rebuild, args = reduce_tensor(region.tensor)
        return (_device_uuid(region.device_index()), args)

    def reachable(self, handle: RDMAHandle, info: Any) -> bool:
        if handle.host != _shm.host_id() or not backend().is_gpu:
            return False
        return _local_index(info[0]) is not None

    def _remote(self, handle: RDMAHandle, info: Any) -> Any:
        with self._lock:
            tensor = self._opened.get(handle.buffer_id)
            if tensor is not None:
                return tensor
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        uuid, args = info
        local = _local_index(uuid)
        args = list(args)
        args[6] = local  # storage_device: the owner's GPU as numbered in this process
        tensor = rebuild_cuda_tensor(*args)
        with self._lock:
            self._opened[handle.buffer_id] = tensor
        return tensor

    def forget(self, handle: RDMAHandle) -> None:
        with self._lock:
            self._opened.pop(handle.buffer_id, None)

    def _transfer(self, handle: RDMAHandle, info: Any, user: Any, offset: int, read: bool) -> None:
        import torch

        try:
            check_live(handle)
        except Exception:
            self.forget(handle)
            raise
        remote = self._remote(handle, info)
        n = _copy.nbytes_of(user)
        window = remote[offset : offset + n]
        with torch.cuda.device(remote.device):
            if read:
                _copy.copy_bytes(user, window)
            else:
                _copy.copy_bytes(window, user)
            torch.cuda.current_stream(remote.device).synchronize()
        finish_device_copies(user)
        check_live(handle, " during the transfer")

    def read_into(self, handle: RDMAHandle, info: Any, dst: Any, offset: int, timeout: float | None) -> None:
        self._transfer(handle, info, dst, offset, read=True)

    def write_from(self, handle: RDMAHandle, info: Any, src: Any, offset: int, timeout: float | None) -> None:
        self._transfer(handle, info, src, offset, read=False)
