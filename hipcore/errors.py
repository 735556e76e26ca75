"""Exceptions raised by hipcore.

Every error names what failed and what the caller can do about it; callers
catch ``HipcoreError`` to handle any of them.
"""

from __future__ import annotations


class HipcoreError(RuntimeError):
    """Base class of every error hipcore raises."""


class BackendUnavailableError(HipcoreError):
    """The requested backend (forced or detected) cannot run on this machine."""


class StreamError(HipcoreError):
    """Work queued on a stream failed; raised by the next synchronising call."""


class EventError(HipcoreError):
    """An event was used in a way its state does not allow (e.g. timing an unrecorded event)."""


class IpcError(HipcoreError):
    """Cross-process synchronisation failed (peer gone, bad handle, timeout)."""


class PeerGoneError(IpcError):
    """The process that owns a shared object died before the operation completed."""


class BrokenBarrierError(IpcError):
    """A barrier was broken by a timeout or an abort in one of its parties."""


class RDMAError(HipcoreError):
    """A one-sided read or write on an RDMABuffer failed."""


class RDMASizeError(RDMAError, ValueError):
    """Source/destination size does not match the remote buffer."""


class RDMABufferDroppedError(RDMAError):
    """The buffer was released with ``drop()``; its handle is no longer valid."""


class RDMAOwnerGoneError(RDMAError):
    """The process that owns the buffer died or became unreachable."""


class RDMATimeoutError(RDMAError, TimeoutError):
    """The owner did not answer within the timeout."""
