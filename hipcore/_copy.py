"""Byte-level views and copies over torch tensors, numpy arrays and buffer objects.

Used by streams (copy_async) and RDMA; it never copies through Python bytes.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def is_device_tensor(obj: Any) -> bool:
    """True for a torch tensor that lives in GPU memory."""
    return _is_torch_tensor(obj) and obj.device.type != "cpu"


def host_bytes(obj: Any, *, writable: bool, what: str = "buffer") -> np.ndarray:
    """A flat uint8 numpy view of host memory (no copy); errors if the memory is not contiguous."""
    if _is_torch_tensor(obj):
        if obj.device.type != "cpu":
            raise TypeError(f"{what} is on {obj.device}; a host view needs a CPU tensor")
        if not obj.is_contiguous():
            raise ValueError(f"{what} is not contiguous; call .contiguous() first")
        flat = obj.detach().reshape(-1)
        if flat.numel() == 0:
            return np.empty(0, dtype=np.uint8)
        arr = flat.view(_torch_uint8()).numpy()
    elif isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ValueError(f"{what} is not C-contiguous; use np.ascontiguousarray first")
        arr = obj.reshape(-1).view(np.uint8)
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise TypeError(
                f"{what} of type {type(obj).__name__} is not a tensor, numpy array or buffer"
            ) from None
        if not mv.contiguous:
            raise ValueError(f"{what} is not a contiguous buffer")
        arr = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what} is read-only; pass writable memory as the destination")
    return arr


def _torch_uint8() -> Any:
    return sys.modules["torch"].uint8


def nbytes_of(obj: Any) -> int:
    if _is_torch_tensor(obj):
        return int(obj.numel() * obj.element_size())
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    return memoryview(obj).nbytes


def device_bytes(obj: Any, *, what: str = "tensor") -> Any:
    """A flat uint8 torch view of a contiguous tensor on any device."""
    if not obj.is_contiguous():
        raise ValueError(f"{what} is not contiguous; call .contiguous() first")
    return obj.detach().reshape(-1).view(_torch_uint8())


def copy_bytes(dst: Any, src: Any) -> None:
    """Copy all bytes of ``src`` into ``dst`` (sizes must match); GPU tensors go through torch."""
    n_dst, n_src = nbytes_of(dst), nbytes_of(src)
    if n_dst != n_src:
        raise ValueError(f"copy of {n_src} bytes into a {n_dst}-byte destination")
    if is_device_tensor(dst) or is_device_tensor(src):
        torch = sys.modules["torch"]
        d = device_bytes(dst) if _is_torch_tensor(dst) else torch.from_numpy(host_bytes(dst, writable=True))
        s = device_bytes(src) if _is_torch_tensor(src) else torch.from_numpy(host_bytes(src, writable=False))
        d.copy_(s, non_blocking=True)
        return
    np.copyto(host_bytes(dst, writable=True), host_bytes(src, writable=False))
