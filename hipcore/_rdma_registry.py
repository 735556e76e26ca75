"""Owner-side bookkeeping for RDMA buffers: registered memory regions and their liveness slots.

Each registered buffer owns a slot in a per-process shared-memory table. The slot
holds the buffer's generation while it is live and 0 once dropped, so a reader on
the same host can tell "dropped" from "live" without asking the owner.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from regent.hipcore import _copy, _shm
from regent.hipcore.errors import RDMAError

SLOTS = 65536
HEADER_WORDS = 4  # magic, pid, start, slots
_MAGIC = 0x52474E5452444D41  # "RGNTRDMA"


@dataclass(frozen=True)
class RDMAHandle:
    """Everything another process needs to reach a registered buffer; small and picklable."""

    buffer_id: bytes
    token: bytes
    nbytes: int
    writable: bool
    device: str  # "cpu" or "cuda"
    owner_pid: int
    owner_start: int
    host: str
    registry: str
    slot: int
    generation: int
    endpoints: tuple[tuple[str, Any], ...] = field(default=())

    def endpoint(self, transport: str) -> Any | None:
        for name, info in self.endpoints:
            if name == transport:
                return info
        return None

    @property
    def owner(self) -> tuple[int, int]:
        return (self.owner_pid, self.owner_start)


class Region:
    """Registered memory kept alive by its owner: host bytes (numpy uint8) or a device tensor."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.nbytes = _copy.nbytes_of(obj)
        if _copy.is_device_tensor(obj):
            self.device = "cuda"
            self.tensor = _copy.device_bytes(obj, what="RDMABuffer memory")
            self.host: np.ndarray | None = None
            self.writable = True
            self.address = int(obj.data_ptr())
        else:
            self.device = "cpu"
            self.tensor = None
            try:
                self.host = _copy.host_bytes(obj, writable=True, what="RDMABuffer memory")
                self.writable = True
            except ValueError as exc:
                if "read-only" not in str(exc):
                    raise
                self.host = _copy.host_bytes(obj, writable=False, what="RDMABuffer memory")
                self.writable = False
            self.address = (
                int(self.host.__array_interface__["data"][0]) if self.host.size else 0
            )

    def device_index(self) -> int:
        return int(self.obj.device.index or 0) if self.device == "cuda" else 0


@dataclass
class Entry:
    region: Region
    handle: RDMAHandle


class Registry:
    """This process's registered buffers (one per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[bytes, Entry] = {}
        self._free = list(range(SLOTS - 1, 0, -1))  # slot 0 is never handed out
        self._generations = itertools.count(1)
        self._segment: str | None = None
        self._mm: Any = None
        self._slots: np.ndarray | None = None

    def _table(self) -> tuple[str, np.ndarray]:
        if self._segment is None or self._slots is None:
            name, mm = _shm.create("rdmareg", 8 * (HEADER_WORDS + SLOTS))
            words = np.frombuffer(mm, dtype=np.int64)
            pid, start = _shm.my_identity()
            words[:HEADER_WORDS] = (_MAGIC, pid, start, SLOTS)
            self._segment, self._mm = name, mm
            self._slots = words[HEADER_WORDS:]
        return self._segment, self._slots

    def register(self, obj: Any) -> Entry:
        region = Region(obj)
        with self._lock:
            segment, slots = self._table()
            if not self._free:
                raise RDMAError(
                    f"this process already has {SLOTS - 1} live RDMABuffers; drop() unused ones"
                )
            slot = self._free.pop()
            generation = next(self._generations)
            pid, start = _shm.my_identity()
            handle = RDMAHandle(
                buffer_id=secrets.token_bytes(16),
                token=secrets.token_bytes(16),
                nbytes=region.nbytes,
                writable=region.writable,
                device=region.device,
                owner_pid=pid,
                owner_start=start,
                host=_shm.host_id(),
                registry=segment,
                slot=slot,
                generation=generation,
            )
            slots[slot] = generation
            entry = Entry(region, handle)
            self._entries[handle.buffer_id] = entry
            return entry

    def lookup(self, buffer_id: bytes) -> Entry | None:
        return self._entries.get(buffer_id)

    def set_handle(self, buffer_id: bytes, handle: RDMAHandle) -> None:
        with self._lock:
            entry = self._entries.get(buffer_id)
            if entry is not None:
                entry.handle = handle

    def drop(self, buffer_id: bytes) -> bool:
        with self._lock:
            entry = self._entries.pop(buffer_id, None)
            if entry is None:
                return False
            assert self._slots is not None
            self._slots[entry.handle.slot] = 0
            self._free.append(entry.handle.slot)
            return True

    def __len__(self) -> int:
        return len(self._entries)


_registry: Registry | None = None
_registry_pid = 0
_registry_lock = threading.Lock()


def registry() -> Registry:
    """This process's registry (a fresh one after fork: registrations do not cross processes)."""
    global _registry, _registry_pid
    import os

    with _registry_lock:
        if _registry is None or _registry_pid != os.getpid():
            _registry, _registry_pid = Registry(), os.getpid()
        return _registry
