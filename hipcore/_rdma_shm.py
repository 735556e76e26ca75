"""Same-host RDMA transport: the reader maps the owner's shared-memory segment and copies itself.

One-sided: the owner does nothing per operation. Liveness comes from the owner's
pid/start time and the buffer's slot in the owner's registry table, checked
before, between chunks of, and after every copy.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

import numpy as np

from regent.hipcore import _copy, _shm
from regent.hipcore._rdma_registry import HEADER_WORDS, RDMAHandle, Region
from regent.hipcore.errors import RDMABufferDroppedError, RDMAError, RDMAOwnerGoneError

CHUNK = 64 << 20
_CACHE_SIZE = 64


class _Mappings:
    """Segments this reader has mapped, most recently used last (bounded so dead owners' pages are released)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: collections.OrderedDict[str, Any] = collections.OrderedDict()

    def get(self, name: str) -> Any:
        with self._lock:
            mm = self._maps.get(name)
            if mm is not None:
                self._maps.move_to_end(name)
                return mm
        mm = _shm.attach(name)
        with self._lock:
            self._maps[name] = mm
            while len(self._maps) > _CACHE_SIZE:
                self._maps.popitem(last=False)
        return mm

    def forget(self, name: str) -> None:
        with self._lock:
            self._maps.pop(name, None)


_mappings = _Mappings()


def owner_gone(handle: RDMAHandle, detail: str = "") -> RDMAOwnerGoneError:
    return RDMAOwnerGoneError(
        f"the owner of this RDMABuffer (pid {handle.owner_pid} on {handle.host.split('/')[0]}) "
        f"has exited{detail}; the buffer's memory is gone, recreate it in a live process"
    )


def dropped(handle: RDMAHandle) -> RDMABufferDroppedError:
    return RDMABufferDroppedError(
        f"this RDMABuffer ({handle.nbytes} bytes, owner pid {handle.owner_pid}) was released "
        "with drop(); ask the owner for a new handle"
    )


def check_live(handle: RDMAHandle, detail: str = "") -> None:
    """Raise if the owner died or the buffer was dropped (same-host check, no round trip)."""
    if not _shm.owner_alive(*handle.owner):
        _mappings.forget(handle.registry)
        raise owner_gone(handle, detail)
    try:
        mm = _mappings.get(handle.registry)
    except FileNotFoundError:
        raise owner_gone(handle, detail) from None
    slots = np.frombuffer(mm, dtype=np.int64, offset=8 * HEADER_WORDS)
    if int(slots[handle.slot]) != handle.generation:
        raise dropped(handle)


def finish_device_copies(*objs: Any) -> None:
    """Wait for copies into/out of device tensors so the future completes after the data moved."""
    for obj in objs:
        if _copy.is_device_tensor(obj):
            import torch

            torch.cuda.current_stream(obj.device).synchronize()


class ShmTransport:
    """Zero-copy mapping of memory the owner allocated in shared memory (``shared_tensor``/``shared_array``)."""

    name = "shm"
    copies_locally = True  # no waiting on a peer: short copies may run on the caller's thread

    def endpoint(self, region: Region) -> Any | None:
        if region.device != "cpu" or region.nbytes == 0:
            return None
        found = _shm.find_owned(region.address, region.nbytes)
        if found is None:
            return None
        info, _ = found
        return (info.name, region.address - info.address)

    def reachable(self, handle: RDMAHandle, info: Any) -> bool:
        return handle.host == _shm.host_id() and os.path.exists(
            os.path.join(_shm.SHM_DIR, info[0])
        )

    def _view(self, handle: RDMAHandle, info: Any, offset: int, n: int) -> np.ndarray:
        segment, base = info
        try:
            mm = _mappings.get(segment)
        except FileNotFoundError:
            check_live(handle)
            raise RDMAError(
                f"shared-memory segment {segment} of this RDMABuffer is gone although its "
                "owner is alive; it was freed after drop()"
            ) from None
        return np.frombuffer(mm, dtype=np.uint8, count=n, offset=base + offset)

    def _transfer(self, handle: RDMAHandle, info: Any, user: Any, offset: int, read: bool) -> None:
        n = _copy.nbytes_of(user)
        check_live(handle)
        remote = self._view(handle, info, offset, n)
        if _copy.is_device_tensor(user):
            flat = _copy.device_bytes(user)
            import torch

            remote_t = torch.from_numpy(remote)
            for start in range(0, n, CHUNK):
                end = min(start + CHUNK, n)
                if read:
                    flat[start:end].copy_(remote_t[start:end])
                else:
                    remote_t[start:end].copy_(flat[start:end])
                finish_device_copies(user)
                check_live(handle, " during the transfer")
        else:
            local = _copy.host_bytes(user, writable=read, what="destination" if read else "source")
            for start in range(0, n, CHUNK):
                end = min(start + CHUNK, n)
                if read:
                    np.copyto(local[start:end], remote[start:end])
                else:
                    np.copyto(remote[start:end], local[start:end])
                check_live(handle, " during the transfer")
        del remote

    def read_into(self, handle: RDMAHandle, info: Any, dst: Any, offset: int, timeout: float | None) -> None:
        self._transfer(handle, info, dst, offset, read=True)

    def write_from(self, handle: RDMAHandle, info: Any, src: Any, offset: int, timeout: float | None) -> None:
        self._transfer(handle, info, src, offset, read=False)
