"""Receiver-side dedupe of calls by call id (DESIGN invariant 2).

A call id seen before is never run again: the cached result is returned, or the
caller joins the execution in flight. Results are dropped once the controller's
watermark says no replay can need them. Pure bookkeeping: no sockets, no threads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from regent.wire import Kind
from regent.worker.errors import DivergenceError

# Results larger than this are kept until the checkpoint watermark, smaller ones
# until the durable watermark (the journal holds small results, not large ones).
LARGE_RESULT_BYTES = 64 * 1024
# A call an actor made is kept this long after it finished and its root call was released: its
# caller resends it until answered, and a resend must find it (docs/design.md, "Calls made by actors").
DERIVED_HOLD_S = 60.0


class CallIdentity(NamedTuple):
    """What a call id stands for at one actor: a message carrying the same id must carry all
    of it, or it is another call (DESIGN invariant 2). The epoch is not part of it: a new
    leader resends the same call under a higher one."""

    kind: Kind  # CALL, SPAWN or STOP
    method: str  # the endpoint ("__init__" for a spawn, "__stop__" for a stop)
    point: int  # the actor's rank in its mesh
    digest: bytes  # of the arguments

    def describe(self) -> str:
        return (f"{self.kind.name} {self.method[:100]!r} at point {self.point} with argument digest "
                f"{self.digest.hex()}")


@dataclass(slots=True)
class _Entry:
    identity: CallIdentity
    waiters: list = field(default_factory=list)  # reply-to targets while in flight
    result: Any = None  # (meta, frames) once done
    size: int = 0
    done: bool = False
    done_at: float = 0.0


class DedupeCache:
    """Keyed by (seq, actor): one call id reaches each actor of a mesh once."""

    def __init__(self) -> None:
        # Insertion order is seq order while `_ordered` holds (one controller sends its
        # calls in seq order), so a watermark stops at the first entry above it.
        self._entries: dict[tuple[int, str], _Entry] = {}
        self._ordered = True
        self._last_seq = -1
        self.durable_seq = -1  # results at or below may go if small
        self.checkpoint_seq = -1  # results at or below may go whatever their size
        self.hits = 0
        # Calls made by actors, keyed (root seq, actor, origin): not in seq order, and not refused
        # below the watermark (a broadcast's handler may call on after its seq was released).
        self._derived: dict[tuple[int, str, str], _Entry] = {}

    def admit(self, seq: int, actor: str, identity: CallIdentity, reply_to: Any,
              origin: str = "") -> tuple[str, Any]:
        """Decide what to do with an incoming call.

        Returns ("run", None) for a new call, ("cached", result) for a finished one,
        ("joined", None) when the caller was added to the waiters of one in flight.
        Raises DivergenceError for the same id with any other part of its identity
        (kind, endpoint, point, arguments), finished or in flight alike.
        """
        if origin:
            return self._admit_derived((seq, actor, origin), identity, reply_to)
        key = (seq, actor)
        entry = self._entries.get(key)
        if entry is None:
            if seq <= max(self.durable_seq, self.checkpoint_seq):
                raise DivergenceError(
                    f"call seq {seq} to {actor} is at or below the released watermark "
                    f"{max(self.durable_seq, self.checkpoint_seq)}: its result was already "
                    "released, so it is not run again; answer it from the journal"
                )
            self._entries[key] = _Entry(identity, [reply_to])
            if seq < self._last_seq:
                self._ordered = False  # e.g. a new leader resending older calls
            else:
                self._last_seq = seq
            return "run", None
        return self._repeat(entry, identity, f"call seq {seq} to {actor}", reply_to)

    def _admit_derived(self, key: tuple[int, str, str], identity: CallIdentity, reply_to: Any) -> tuple[str, Any]:
        entry = self._derived.get(key)
        if entry is None:
            self._derived[key] = _Entry(identity, [reply_to])
            return "run", None
        return self._repeat(entry, identity, f"call {key[2]!r} (root seq {key[0]}) to {key[1]}", reply_to)

    def _repeat(self, entry: _Entry, identity: CallIdentity, what: str, reply_to: Any) -> tuple[str, Any]:
        if entry.identity != identity:
            raise DivergenceError(
                f"{what} was first sent as {entry.identity.describe()} and now as "
                f"{identity.describe()}: the controller program is not deterministic (or two "
                "controllers disagree); it was not run again"
            )
        self.hits += 1
        if entry.done:
            return "cached", entry.result
        entry.waiters.append(reply_to)
        return "joined", None

    def complete(self, seq: int, actor: str, result: Any, size: int, origin: str = "") -> list:
        """Store a finished call's result; returns the waiters to answer."""
        if origin:
            entry = self._derived.get((seq, actor, origin))
            if entry is None or entry.done:
                return []
            entry.result, entry.size, entry.done, entry.done_at = result, size, True, time.monotonic()
            waiters, entry.waiters = entry.waiters, []
            return waiters
        entry = self._entries.get((seq, actor))
        if entry is None or entry.done:  # answered already: the first answer stands
            return []
        entry.result, entry.size, entry.done = result, size, True
        waiters, entry.waiters = entry.waiters, []
        if seq <= self.checkpoint_seq or (seq <= self.durable_seq and size < LARGE_RESULT_BYTES):
            del self._entries[(seq, actor)]
        return waiters

    def watermark(self, durable_seq: int, checkpoint_seq: int) -> int:
        """Release results no replay can need; returns how many were dropped.

        Looks only at entries up to the watermark while they are in seq order (so its
        cost follows what is released, not what is cached); after out-of-order calls it
        looks at every entry once and puts them back in order."""
        self.durable_seq = max(self.durable_seq, durable_seq)
        self.checkpoint_seq = max(self.checkpoint_seq, checkpoint_seq)
        mark = max(self.durable_seq, self.checkpoint_seq)
        ordered = self._ordered
        drop = []
        for k, e in self._entries.items():
            if k[0] > mark:
                if ordered:
                    break
                continue
            if e.done and (k[0] <= self.checkpoint_seq or e.size < LARGE_RESULT_BYTES):
                drop.append(k)
        for k in drop:
            del self._entries[k]
        if self._derived:
            old = time.monotonic() - DERIVED_HOLD_S
            gone = [k for k, e in self._derived.items() if e.done and k[0] <= mark and e.done_at < old]
            for k in gone:
                del self._derived[k]
        if not ordered:
            self._entries = dict(sorted(self._entries.items(), key=lambda kv: kv[0][0]))
            self._ordered = True
            self._last_seq = max((k[0] for k in self._entries), default=self._last_seq)
        return len(drop)

    def __len__(self) -> int:
        return len(self._entries) + len(self._derived)
