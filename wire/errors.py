"""Errors of the wire itself: a frame that cannot be parsed, a message too large to send.

RegentError, the base of every error regent raises on purpose, lives here because `wire`
sits below both `controller` and `worker`; `worker.errors` re-exports all three.
"""

from __future__ import annotations


class RegentError(Exception):
    """Base class of every error regent raises on purpose."""


class ProtocolError(RegentError):
    """A frame could not be parsed (garbage, truncated, oversized, wrong version)."""


class MessageTooLarge(RegentError, ValueError):
    """A message is above REGENT_MAX_MESSAGE_BYTES (all its frames together), so it was not
    sent: its receiver would drop it."""


class BulkError(Exception):
    """A BULK envelope this process cannot take (wire.bulk): its segment gone or not one it may
    map, or its frames not fetched whole and intact from its sender's data port (wire.bulk_tcp)."""
