"""What a proc decides about the messages it is sent, without IO: whether it admits one (its
session, the epoch fence, a reply address it can answer), whether a call runs or was seen
before (the dedupe cache, DESIGN invariant 2), which results it keeps and when it releases them
(the controller's watermarks), and which controller hears its output.

The edge (worker/proc.py) decodes each message, hands it to `receive`, and performs what comes
back: `Reply`s to send and `Deliver`s to act on (run a call, build or stop an actor). When a
call it ran has its outcome, `complete` records it and returns the replies for everyone waiting
on it. Nothing here reads a socket, a clock or a thread: tests/runtime/test_proc_core.py drives
it with tables of messages, as test_engine.py drives the controller's engine.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from regent import wire
from regent.wire import Kind, ProtocolError
from regent.wire.schema import valid_address
from regent.worker.dedupe import CallIdentity, DedupeCache
from regent.worker.errors import DivergenceError
from regent.worker.fencing import EpochFence

NO_FRAMES: tuple = ()  # a result without a payload (the controller reads None)


@dataclass(frozen=True)
class Reply:
    """Send `kind` with `meta` and `frames` to `rt`."""

    rt: str
    kind: Kind
    meta: dict
    frames: list | tuple = ()


@dataclass(frozen=True)
class Deliver:
    """An admitted message for the edge to act on: a CALL to run at `actor`, a SPAWN to build
    it (`restart`: a supervisor's rebuild, which the dedupe cache does not see), a STOP."""

    kind: Kind
    actor: str
    seq: int
    point: int
    method: str
    origin: str  # "": the controller's; else the call path of the actor that made it
    meta: dict
    payload: list
    restart: bool = False


Effect = Reply | Deliver


@dataclass
class Mailbox:
    """One actor's messages, taken one at a time in the order they arrived: each sender's
    order, as the transport keeps it per sender. `busy` while one is being handled (a sync
    endpoint inline, an async one until it returns, a concurrent one until its first await)."""

    items: collections.deque = field(default_factory=collections.deque)
    busy: bool = False

    def put(self, item: Any) -> bool:
        """Queue `item`; True if the actor is idle, so the edge starts on it now."""
        self.items.append(item)
        return not self.busy

    def take(self) -> Any:
        """The next message, which the actor is now busy with; None when there is none (idle)."""
        if self.items:
            self.busy = True
            return self.items.popleft()
        self.busy = False
        return None

    def clear(self) -> list:
        """The actor is gone: what was still queued (to be failed); nothing is handled any more."""
        items, self.items = list(self.items), collections.deque()
        self.busy = False
        return items

    def __len__(self) -> int:
        return len(self.items)


class ProcCore:
    """One proc's admission and results. `epoch`: the highest its session had seen at the
    agent when the proc started; `pid` answers pings."""

    def __init__(self, session: str, proc_id: str, epoch: int = 0, pid: int = 0):
        self.session = session
        self.proc_id = proc_id
        self.pid = pid
        self.fence = EpochFence(epoch)
        self.dedupe = DedupeCache()
        self.log_to: str | None = None  # the newest controller: where output is forwarded
        self._rt_checked = ""  # the last reply address found valid

    def receive(self, kind: Kind, meta: dict, payload: list) -> list[Effect]:
        """A decoded CALL, SPAWN, STOP, FENCE, WATERMARK or PING (wire.schema.PROC). A message
        for another session, or with a reply address no socket can take, is a ProtocolError."""
        if kind is Kind.PING:
            rt = meta.get("rt")
            if not valid_address(rt):
                return []
            return [Reply(rt, Kind.PONG, {"id": self.proc_id, "pid": self.pid, "n": meta.get("n"),
                                          "cached": len(self.dedupe), "epoch": self.fence.epoch})]
        if meta["sid"] != self.session:  # wire.schema: CALL, SPAWN, STOP, FENCE, WATERMARK carry both
            raise ProtocolError(f"message for session {meta['sid']!r}, this proc serves {self.session!r}")
        epoch = meta["e"]
        rt = meta.get("rt")
        if rt is not None and rt != self._rt_checked:
            if not valid_address(rt):
                raise ProtocolError(f"bad reply address {rt!r}")
            self._rt_checked = rt  # the controller's address, in almost every message
        if not self.fence.admit(epoch):
            if not rt:
                return []
            refused = {"sid": self.session, "s": meta.get("s", -1), "a": meta.get("a", ""),
                       "pt": meta.get("pt", 0), "st": "fenced", "e": self.fence.epoch,
                       "em": f"epoch {epoch} is below {self.fence.epoch}: this controller was deposed"}
            if meta.get("o"):
                refused["o"] = meta["o"]  # an actor's call: its proc takes the newer epoch and resends
            return [Reply(rt, Kind.RESULT, refused)]
        if rt and not meta.get("o") and not meta.get("fo"):
            self.log_to = rt  # an admitted epoch: the newest controller, which gets our output
        if kind is Kind.FENCE:
            return [Reply(rt, Kind.PONG, {"id": self.proc_id, "e": self.fence.epoch, "n": meta.get("n")})] if rt else []
        if kind is Kind.WATERMARK:
            self.dedupe.watermark(meta["dw"], meta["cw"])
            return []
        if kind is Kind.SPAWN and meta.get("restart"):
            return [Deliver(kind, meta["a"], -1, meta["pt"], "__init__", "", meta, payload, restart=True)]
        if kind in (Kind.CALL, Kind.SPAWN, Kind.STOP):
            return self._admit(kind, meta, payload, rt)
        raise ProtocolError(f"a proc does not accept {kind.name}")

    def _admit(self, kind: Kind, meta: dict, payload: list, rt: str | None) -> list[Effect]:
        """The dedupe gate shared by calls, spawns and stops. A message reusing an id for
        anything else is refused as a divergence; one seen before is answered from the cache,
        or joins the run in flight."""
        seq, actor, point, method = meta["s"], meta["a"], meta["pt"], meta["m"]  # wire.schema.Call
        origin = meta.get("o", "")
        identity = CallIdentity(kind, method, point, meta["d"])
        try:
            verdict, cached = self.dedupe.admit(seq, actor, identity, rt, origin)
        except DivergenceError as e:
            return [Reply(rt, Kind.RESULT, self.result_meta(seq, actor, point, "divergence", o=origin, em=str(e)))] \
                if rt else []
        if verdict == "cached":
            return [Reply(rt, Kind.RESULT, cached[0], cached[1])] if rt else []
        if verdict == "joined":
            return []
        return [Deliver(kind, actor, seq, point, method, origin, meta, payload)]

    def result_meta(self, seq: int, actor: str, point: int, status: str, o: str = "", **extra: Any) -> dict:
        meta = {"sid": self.session, "s": seq, "a": actor, "pt": point, "st": status}
        if extra:
            meta.update(extra)
        if o:
            meta["o"] = o
        return meta

    def complete(self, seq: int, actor: str, point: int, status: str, frames: list | tuple | None = None, o: str = "",
                 **extra: Any) -> list[Reply]:
        """Call `seq` at `actor` has its outcome: kept for whoever asks again (until a
        watermark releases it), and sent to everyone who waits for it now."""
        meta = self.result_meta(seq, actor, point, status, o=o, **extra)
        frames = frames or NO_FRAMES
        waiters = self.dedupe.complete(seq, actor, (meta, frames), wire.payload_size(frames), o)
        return [Reply(rt, Kind.RESULT, meta, frames) for rt in waiters if rt]
