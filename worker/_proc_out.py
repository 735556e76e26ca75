"""The proc's replies on their way out: collected per return address while a message (often a
batch) is handled, sent as few batches, and held briefly for a peer that is not reading (a
controller that stops reading for 30 s is taken for gone: a successor asks again by call id)."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import structlog

from regent import wire
from regent.wire import Kind, MessageTooLarge, ProtocolError
from regent.wire.transport import Outbox, refuse_oversized

log = structlog.get_logger("regent.proc")

RELAYED_KEPT = 64  # controllers (and actor callers) answered through the agent, the latest


class _Outbound:
    """Mixed into ProcRuntime, whose loop, outbox and limits these methods use."""

    loop: asyncio.AbstractEventLoop
    outbox: Outbox
    proc_id: str
    _max_message: int  # what a controller accepts, as far as the proc knows
    _out: dict[str, list]  # replies not yet sent, per return address
    _reading: bool  # the inbox's reader runs: it sends what was collected when it is done
    pending: dict[str, collections.deque]  # replies a peer did not take yet, with when they were queued
    host_inbox: str
    _relayed: dict[str, bytes]
    _adoption: asyncio.Task | None
    own_address: str
    folds: Any  # worker/_folding.Folds

    def _answer_through_agent(self, rt: object) -> None:
        """A call came through this host's agent: answers to `rt` go back through it too."""
        if type(rt) is str and rt not in self._relayed and rt != self.host_inbox:
            if len(self._relayed) >= RELAYED_KEPT:
                del self._relayed[next(iter(self._relayed))]
            self._relayed[rt] = wire.relay_header(rt)

    def _reply(self, rt: str, kind: Kind, meta: dict, frames: list | None = None) -> None:
        self._send(rt, wire.encode(kind, meta, frames or []))

    def _send(self, rt: str, msg: list) -> None:
        """Collect a reply; `_flush_out` sends each address's replies as few batches. A fold's
        folder is its own point's `rt`: that answer stays here (an answer to a call one of its
        actors made to another of them goes through the inbox, as any)."""
        if rt == self.own_address:
            kind, meta, payload = wire.decode(msg)
            if kind is Kind.RESULT and "o" not in meta:
                self.folds.result(meta, payload)
                return
        out = self._out.get(rt)
        if out is None:
            if not self._out and not self._reading:  # from a task: send once this step is done
                self.loop.call_soon(self._flush_out)
            self._out[rt] = [msg]
        else:
            out.append(msg)

    def _flush_out(self) -> None:
        if not self._out:
            return
        out, self._out = self._out, {}
        for rt, msgs in out.items():
            to = rt
            head = self._relayed.get(rt) if self._adoption is None else None  # direct while agentless
            if head is not None:
                # Many-buffer answers go on their own, directly: a batch would copy them anyway.
                for m in msgs:
                    if len(m) > wire.BATCH_MESSAGE_FRAMES:
                        self._transmit(rt, m)
                to, msgs = self.host_inbox, [[head, *m] for m in msgs if len(m) <= wire.BATCH_MESSAGE_FRAMES]
            try:
                for frames in wire.pack(msgs, self._max_message):
                    self._transmit(to, frames)
            except Exception:  # one peer's replies lost, not every peer's, nor the inbox's reader
                log.exception("replies not sent", proc=self.proc_id, peer=rt, count=len(msgs))

    def _transmit(self, rt: str, msg: list) -> None:
        """Send without blocking the loop; a full peer gets a backlog retried shortly."""
        try:
            backlog = self.pending.get(rt)
            if backlog:
                refuse_oversized(msg, self._max_message, rt)
                backlog.append((time.monotonic(), msg))
                return
            sent = self.outbox.peer(rt).try_send(msg)
        except MessageTooLarge as e:  # a result too large was refused in _finish_value: not this
            log.error("reply not sent", proc=self.proc_id, error=str(e))
            return
        except ProtocolError as e:  # an address zmq will not connect to, though it looked valid
            log.warning("reply not sent", proc=self.proc_id, peer=rt, error=str(e))
            return
        if not sent:
            self.pending[rt] = collections.deque([(time.monotonic(), msg)])
            self.loop.call_later(0.001, self._flush, rt)

    def _flush(self, rt: str) -> None:
        backlog = self.pending.get(rt)
        if not backlog:
            self.pending.pop(rt, None)
            return
        peer = self.outbox.peer(rt)
        while backlog and peer.try_send(backlog[0][1]):
            backlog.popleft()
        if not backlog:
            del self.pending[rt]
            return
        if time.monotonic() - backlog[0][0] > 30.0:
            # The controller stopped reading for 30 s: it is gone. A successor will
            # re-request by call id and get the results from the dedupe cache.
            log.warning("dropping replies to an unresponsive controller", peer=rt, count=len(backlog))
            del self.pending[rt]
            self.outbox.drop(rt)
            return
        self.loop.call_later(0.002, self._flush, rt)
