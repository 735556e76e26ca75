"""The shape of a proc mesh as the program sees it, and its changes: a lost host's points
leaving (`on_host_lost="shrink"`).

A shrink is decided on the supervisor's thread, which rebuilds the remaining actors at once;
the program's handles change shape later, at a point of the program's own: its next use of a
mesh handle (an endpoint adverb, `dims`, `size()`, `slice`, `spawn`). Like an unhandled fault
(controller/faults.py), the change is journaled durably with the seq it came before
(`{"ev": "shrink_seen", "at": seq, ...}`) and a standby replaying the program applies it at
the same seq, so a program that reads `size()` after a shrink takes the same branch on replay.
"""

from __future__ import annotations

import collections
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from regent.controller.replay import SUPERVISION

if TYPE_CHECKING:
    from regent.controller.refs import ProcRef
    from regent.controller.replay import ReplayIndex
    from regent.controller.session import Session

log = structlog.get_logger("regent.supervisor")

DECIDED = "shrink"  # the `ev` of supervision's decision: {shape, host, keep}
SEEN = "shrink_seen"  # the `ev` of the record journaled when the program's handles change


@dataclass
class Shape:
    """The procs of one proc mesh spawned on a host mesh, row-major over {"hosts": H, dim: k}:
    as the program sees them (`procs`, `dims`, and the full handles on it: the proc mesh, its
    actor meshes) and as supervision has made them (`sup_procs`, `sup_dims`), which the program's
    view follows at its next use of a handle."""

    seq: int  # the spawn_procs call that made it
    procs: list[ProcRef]
    dims: dict[str, int]
    sup_procs: list[ProcRef] = field(default_factory=list)
    sup_dims: dict[str, int] = field(default_factory=dict)
    handles: weakref.WeakSet = field(default_factory=weakref.WeakSet)

    def __post_init__(self) -> None:
        self.sup_procs, self.sup_dims = list(self.procs), dict(self.dims)

    def keep_without(self, host: str) -> list[int] | None:
        """The indices of supervision's points not on `host`, if those on it are whole hosts rows."""
        keep = [i for i, p in enumerate(self.sup_procs) if p.host != host]
        if "hosts" not in self.sup_dims or (len(self.sup_procs) - len(keep)) % _per_host(self.sup_procs,
                                                                                          self.sup_dims):
            return None
        return keep

    def sup_apply(self, keep: list[int]) -> None:
        self.sup_procs, self.sup_dims = _kept(self.sup_procs, self.sup_dims, keep)

    def sup_grow(self, added: list[ProcRef]) -> None:
        self.sup_procs, self.sup_dims = _grown(self.sup_procs, self.sup_dims, added)

    def grow(self, added: list[ProcRef]) -> None:
        """New points at the end (the program's view; it grows on the program's thread)."""
        self.procs, self.dims = _grown(self.procs, self.dims, added)
        for handle in list(self.handles):
            handle._reshape(self.procs, self.dims)

    def apply(self, keep: list[int]) -> None:
        self.procs, self.dims = _kept(self.procs, self.dims, keep)
        for handle in list(self.handles):
            handle._reshape(self.procs, self.dims)


def _per_host(procs: list, dims: dict[str, int]) -> int:
    return max(1, len(procs) // max(1, dims.get("hosts", 1)))


def _grown(procs: list, dims: dict[str, int], added: list) -> tuple[list, dict[str, int]]:
    per_host = _per_host(procs, dims)
    return procs + list(added), {**dims, "hosts": dims["hosts"] + len(added) // per_host}


def _kept(procs: list, dims: dict[str, int], keep: list[int]) -> tuple[list, dict[str, int]]:
    per_host = _per_host(procs, dims)
    return [procs[i] for i in keep], {**dims, "hosts": len(keep) // per_host}


class Shapes:
    """The proc meshes' shapes of one session (Session._shapes)."""

    def __init__(self, replay: ReplayIndex | None):
        self.by_seq: dict[int, Shape] = {}
        self._lock = threading.Lock()
        self.live: collections.deque[dict] = collections.deque()  # decided, not seen by the program yet
        self.replayed: collections.deque[dict] = collections.deque()
        self._seen: set[tuple[int, str]] = set()
        self._journaled: list[dict] = []  # shrinks previous leaders decided, in journal order
        if replay is not None:
            records = [d for d in replay.supervision if isinstance(d, dict)]
            seen = [d for d in records if d.get("ev") == SEEN and _valid(d, "at")]
            self.replayed.extend(sorted(seen, key=lambda d: d["at"]))
            self._seen = {(d["shape"], d["host"]) for d in seen}
            self._journaled = [d for d in records if d.get("ev") == DECIDED and _valid(d)]

    def made(self, seq: int, procs: list[ProcRef], dims: dict[str, int]) -> Shape:
        """A proc mesh spawned (live, or replayed: supervision's view takes the shrinks that
        previous leaders decided, and the program's follows at the journaled points)."""
        shape = self.by_seq[seq] = Shape(seq, list(procs), dict(dims))
        for d in self._journaled:
            if d["shape"] == seq and max(d["keep"], default=-1) < len(shape.sup_procs):
                shape.sup_apply(d["keep"])
                self.decided(shape, d["host"], d["keep"])
        return shape

    def decided(self, shape: Shape, host: str, keep: list[int]) -> None:
        """The supervisor shrank `shape` by `host` (journaled): the program's handles follow at
        its next use of one (any thread)."""
        with self._lock:
            if (shape.seq, host) in self._seen:
                return
            self._seen.add((shape.seq, host))
        self.live.append({"shape": shape.seq, "host": host, "keep": keep})

    def adopt(self, s: Session) -> None:
        """On the program's thread, before it uses a handle: apply what is due at its next seq."""
        if not self.live and not self.replayed:
            return
        next_seq = s.core.next_seq
        while self.replayed and self.replayed[0]["at"] <= next_seq:
            self._apply(self.replayed.popleft())
        replay = s._engine.replay
        if replay is not None and next_seq <= replay.max_seq:
            return  # replaying: a shrink decided now is seen where the replay ends
        while self.live:
            d = self.live.popleft()
            s._check_live()
            s._append(SUPERVISION, {"ev": SEEN, "at": next_seq, **d}, durable=True)
            self._apply(d)

    def _apply(self, d: dict) -> None:
        shape = self.by_seq.get(d["shape"])
        if shape is None or max(d["keep"], default=-1) >= len(shape.procs):
            log.warning("a journaled shrink names a proc mesh this program has not made; skipped", record=str(d))
            return
        shape.apply(d["keep"])
        log.info("a proc mesh shrank: its lost host's points left", spawn=d["shape"], dims=shape.dims)


def _valid(d: Any, *also: str) -> bool:
    """A journaled shrink record, checked as the untrusted input it is."""
    return (all(isinstance(d.get(k), int) for k in also) and isinstance(d.get("shape"), int)
            and isinstance(d.get("host"), str) and isinstance(d.get("keep"), list)
            and all(isinstance(i, int) and i >= 0 for i in d["keep"]))
