"""RDMA buffers: one-sided reads and writes of memory another process owns.

``RDMABuffer(data)`` is created in the owner process and registers ``data``
(a torch tensor, numpy array or buffer), which the owner then keeps alive
until ``drop()``. Pickling the buffer yields a small handle; another process
unpickles it and calls ``read_into(dst)`` / ``write_from(src)``, which return
futures. The transport is chosen per operation: CUDA IPC or shared memory on
the same host, TCP otherwise; ``Transport`` is the slot for ibverbs/UCX.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Generator
from typing import Any, Protocol

import numpy as np
import structlog

from regent.hipcore import _copy, _shm, stats
from regent.hipcore._rdma_cuda_ipc import CudaIpcTransport
from regent.hipcore._rdma_registry import Entry, RDMAHandle, Region, registry
from regent.hipcore._rdma_shm import ShmTransport, check_live, dropped
from regent.hipcore._rdma_tcp import TcpTransport, stop_server
from regent.hipcore.backend import require_torch
from regent.hipcore.errors import RDMAError, RDMASizeError

log = structlog.get_logger("hipcore.rdma")

TRANSPORT_ENV = "REGENT_HIPCORE_RDMA_TRANSPORT"
# Transfers up to this size over a transport that copies memory itself (shm) run on the
# caller's thread and return a completed future.
INLINE_COPY_BYTES = 4 << 20

__all__ = [
    "RDMABuffer",
    "RDMAFuture",
    "RDMAHandle",
    "Transport",
    "register_transport",
    "shared_array",
    "shared_tensor",
    "shutdown",
    "transports",
]


class Transport(Protocol):
    """How bytes reach a registered buffer. Owner side: ``endpoint`` describes the region
    (None: cannot serve it). Reader side: ``reachable``, then blocking ``read_into``/``write_from``
    (run on hipcore's RDMA threads; raise ``RDMAError`` subclasses). A transport whose copies
    never wait on a peer may set ``copies_locally = True`` so short ones run on the caller's thread."""

    name: str

    def endpoint(self, region: Region) -> Any | None: ...

    def reachable(self, handle: RDMAHandle, info: Any) -> bool: ...

    def read_into(
        self, handle: RDMAHandle, info: Any, dst: Any, offset: int, timeout: float | None
    ) -> None: ...

    def write_from(
        self, handle: RDMAHandle, info: Any, src: Any, offset: int, timeout: float | None
    ) -> None: ...


_tcp = TcpTransport()
# In preference order: the first reachable one wins.
_transports: list[Transport] = [CudaIpcTransport(), ShmTransport(), _tcp]


def register_transport(transport: Transport, *, first: bool = True) -> None:
    """Add a transport (e.g. ibverbs, UCX); ``first`` makes it preferred over the built-in ones."""
    if any(t.name == transport.name for t in _transports):
        raise ValueError(f"a transport named {transport.name!r} is already registered")
    _transports.insert(0 if first else len(_transports), transport)


def transports() -> list[str]:
    """Names of the registered transports, most preferred first."""
    return [t.name for t in _transports]


class RDMAFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` that is also awaitable and has ``get(timeout)``."""

    def get(self, timeout: float | None = None) -> Any:
        return self.result(timeout)

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.wrap_future(self).__await__()


_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _submit(fn: Callable[[], Any]) -> RDMAFuture:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=8, thread_name_prefix="hipcore-rdma"
            )
        executor = _executor
    future = RDMAFuture()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - delivered to the caller's future
            future.set_exception(exc)

    executor.submit(run)
    return future


def _run_inline(fn: Callable[[], Any]) -> RDMAFuture:
    """Run a short memory copy on the caller's thread: a thread hop costs more than the copy."""
    future = RDMAFuture()
    future.set_running_or_notify_cancel()
    try:
        future.set_result(fn())
    except Exception as exc:  # noqa: BLE001 - delivered to the caller's future
        future.set_exception(exc)
    return future


def shutdown() -> None:
    """Stop this process's RDMA server and worker threads (registrations stay; a new handle restarts them)."""
    global _executor
    stop_server()
    from regent.hipcore._rdma_tcp import _pool

    _pool.clear()
    with _executor_lock:
        executor, _executor = _executor, None
    if executor is not None:
        executor.shutdown(wait=True)


class RDMABuffer:
    """Memory that other processes can read and write one-sidedly.

    Create it in the owner (the memory stays alive until ``drop()``); pickle it
    (send it in an actor message or return it from an endpoint); in the receiving
    process call ``read_into(dst)`` / ``write_from(src)``. For zero-copy same-host
    access allocate the memory with ``shared_tensor``/``shared_array``; other host
    memory is served over TCP, GPU memory over CUDA/HIP IPC or TCP.
    """

    def __init__(self, data: Any) -> None:
        entry = registry().register(data)
        self._entry: Entry | None = entry
        self._handle = entry.handle
        self._published = False
        self._lock = threading.Lock()

    @classmethod
    def from_handle(cls, handle: RDMAHandle) -> RDMABuffer:
        """The buffer a handle refers to (what unpickling does)."""
        self = cls.__new__(cls)
        self._handle = handle
        self._published = True
        self._lock = threading.Lock()
        self._entry = None
        if (handle.owner_pid, handle.owner_start) == _shm.my_identity():
            self._entry = registry().lookup(handle.buffer_id)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (RDMABuffer.from_handle, (self.handle,))

    @property
    def handle(self) -> RDMAHandle:
        """The picklable handle; describing the transports starts the owner's TCP server once."""
        with self._lock:
            if not self._published:
                entry = self._entry
                if entry is None:
                    raise dropped(self._handle)
                endpoints = []
                for transport in _transports:
                    info = transport.endpoint(entry.region)
                    if info is not None:
                        endpoints.append((transport.name, info))
                self._handle = RDMAHandle(**{**vars(self._handle), "endpoints": tuple(endpoints)})
                registry().set_handle(self._handle.buffer_id, self._handle)
                self._published = True
            return self._handle

    @property
    def size(self) -> int:
        """Size of the registered memory in bytes."""
        return self._handle.nbytes

    @property
    def is_owner(self) -> bool:
        return (self._handle.owner_pid, self._handle.owner_start) == _shm.my_identity()

    def _range(self, user: Any, offset: int | None, what: str) -> tuple[int, int]:
        try:
            n = _copy.nbytes_of(user)
        except TypeError:
            raise TypeError(
                f"{what} must be a torch tensor, numpy array or writable buffer, not {type(user).__name__}"
            ) from None
        if offset is None:
            if n != self.size:
                raise RDMASizeError(
                    f"{what} has {n} bytes but the RDMABuffer has {self.size}; pass a {self.size}-byte "
                    f"{what}, or offset= to transfer a sub-range"
                )
            return 0, n
        if offset < 0 or offset + n > self.size:
            raise RDMASizeError(
                f"{what} of {n} bytes at offset {offset} overruns the {self.size}-byte RDMABuffer"
            )
        return offset, n

    def _pick(self, transport: str | None) -> tuple[Transport, Any]:
        handle = self.handle
        forced = transport or os.environ.get(TRANSPORT_ENV) or None
        if forced is not None and forced != "auto":
            for t in _transports:
                if t.name == forced:
                    info = handle.endpoint(t.name)
                    if info is None or not t.reachable(handle, info):
                        if handle.host == _shm.host_id():
                            check_live(handle)  # a dropped buffer or a dead owner says so
                        raise RDMAError(
                            f"transport {forced!r} cannot reach this RDMABuffer from here "
                            f"(its endpoints: {[name for name, _ in handle.endpoints]}; "
                            "shm needs memory from shared_tensor/shared_array and the same host)"
                        )
                    return t, info
            raise RDMAError(f"unknown RDMA transport {forced!r}; registered: {transports()}")
        for t in _transports:
            info = handle.endpoint(t.name)
            if info is not None and t.reachable(handle, info):
                return t, info
        raise RDMAError(f"no transport can reach this RDMABuffer (endpoints {handle.endpoints})")

    def _local_entry(self) -> Entry | None:
        if not self.is_owner:
            return None
        entry = registry().lookup(self._handle.buffer_id)
        if entry is None:
            raise dropped(self._handle)
        return entry

    def read_into(
        self,
        dst: Any,
        *,
        offset: int | None = None,
        timeout: float | None = None,
        transport: str | None = None,
    ) -> RDMAFuture:
        """Copy the buffer's bytes (or ``[offset, offset+len(dst))``) into ``dst``; a future of None.

        Size mismatches raise ``RDMASizeError`` at once; a dropped buffer, a dead owner or
        a stall beyond ``timeout`` seconds fail the future (``RDMABufferDroppedError``,
        ``RDMAOwnerGoneError``, ``RDMATimeoutError``).
        """
        start, _ = self._range(dst, offset, "destination")
        if not _copy.is_device_tensor(dst):
            _copy.host_bytes(dst, writable=True, what="destination")
        return self._start(dst, start, timeout, transport, read=True)

    def write_from(
        self,
        src: Any,
        *,
        offset: int | None = None,
        timeout: float | None = None,
        transport: str | None = None,
    ) -> RDMAFuture:
        """Copy ``src`` into the buffer (at ``offset``); a future of None. Errors as ``read_into``."""
        start, _ = self._range(src, offset, "source")
        if not self._handle.writable:
            raise RDMAError("this RDMABuffer was registered from read-only memory; it cannot be written")
        return self._start(src, start, timeout, transport, read=False)

    def _start(
        self, user: Any, offset: int, timeout: float | None, transport: str | None, read: bool
    ) -> RDMAFuture:
        n = _copy.nbytes_of(user)
        inline = n <= INLINE_COPY_BYTES and not _copy.is_device_tensor(user)
        if self.is_owner and transport is None and not os.environ.get(TRANSPORT_ENV):
            def local() -> None:
                entry = self._local_entry()
                assert entry is not None
                region = entry.region
                n = _copy.nbytes_of(user)
                window: Any = (region.host if region.host is not None else region.tensor)[offset : offset + n]
                if read:
                    _copy.copy_bytes(user, window)
                else:
                    _copy.copy_bytes(window, user)
                stats.count(read, n)

            return _run_inline(local) if inline and self._handle.device == "cpu" else _submit(local)
        try:
            chosen, info = self._pick(transport)
        except RDMAError as exc:
            future = RDMAFuture()
            future.set_exception(exc)
            return future
        transfer = chosen.read_into if read else chosen.write_from

        def op() -> None:
            transfer(self._handle, info, user, offset, timeout)
            stats.count(read, n)

        if inline and getattr(chosen, "copies_locally", False):
            return _run_inline(op)
        return _submit(op)

    def drop(self, timeout: float | None = None) -> None:
        """Release the buffer everywhere: later reads and writes through any handle fail with
        ``RDMABufferDroppedError``. In the owner the memory is no longer kept alive; from
        another process the owner is asked over TCP. Dropping twice is a no-op."""
        if self.is_owner:
            registry().drop(self._handle.buffer_id)
            self._entry = None
            return
        info = self._handle.endpoint("tcp")
        if info is None:
            raise RDMAError("this handle has no TCP endpoint, so only its owner can drop it")
        try:
            _tcp.drop(self._handle, info, timeout)
        except RDMAError as exc:
            if "released with drop()" not in str(exc):
                raise

    def __repr__(self) -> str:
        where = "owner" if self.is_owner else f"owner pid {self._handle.owner_pid}"
        return f"RDMABuffer({self.size} bytes, {self._handle.device}, {where})"


def shared_array(shape: int | tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray:
    """A zeroed numpy array in shared memory: an ``RDMABuffer`` over it is read and written
    by same-host processes with no copy through the owner."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    nbytes = count * dt.itemsize
    _name, mm = _shm.create_data(nbytes)
    return np.frombuffer(mm, dtype=np.uint8, count=nbytes).view(dt).reshape(shape)


def shared_tensor(shape: int | tuple[int, ...], dtype: Any = None) -> Any:
    """A zeroed CPU torch tensor in shared memory (see ``shared_array``)."""
    torch = require_torch("shared_tensor")
    dtype = torch.float32 if dtype is None else dtype
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    count = 1
    for dim in shape:
        count *= int(dim)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    _name, mm = _shm.create_data(nbytes)
    raw = torch.frombuffer(mm, dtype=torch.uint8, count=max(nbytes, 1))
    return raw[:nbytes].view(dtype).reshape(shape)
