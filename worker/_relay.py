"""A host agent's relay: messages a controller casts to the procs of this host, and the procs'
answers on their way back, pass through the agent (Kind.RELAY), so a mesh-wide call costs the
controller one send per host and its answers come back gathered, one batch per host.

The agent passes each message on untouched; its receiver validates it as if it had come
directly. What arrives in one drain of the inbox goes out as few batches per destination, in
the order it came (zmq keeps a pipe's order: a sender's messages to one proc stay in order).
A destination that is not reading keeps a backlog, retried by the agent's loop and dropped
after BACKLOG_S: what was lost is sent again by its sender (a controller resends a call that
stays unanswered; a proc answers it again from its result cache), never run twice.

Answers are gathered: a proc's answer to a relayed call (RESULT) is held until every call the
agent relayed has been answered, or for GATHER_S at most, so a host's answers to one mesh-wide
call reach the controller as one batch, not one per drain (the procs answer a few hundred µs
apart). Whatever else goes to a destination holding answers joins them, in order.
"""

from __future__ import annotations

import collections
import time

import structlog

from regent import wire
from regent.wire import Kind, MessageTooLarge, ProtocolError
from regent.wire.transport import Outbox

log = structlog.get_logger("regent.host")

BACKLOG_S = 30.0
# The longest an answer is held for the others of its host (a straggler's cost to the rest).
GATHER_S = 0.002
_ASKS = frozenset({int(Kind.CALL), int(Kind.SPAWN), int(Kind.STOP)})  # each answered by a RESULT
_RESULT = int(Kind.RESULT)


class Relay:
    """Forwarding through one agent's outbox. `take` during a drain, `flush` after it, `retry`
    from the loop while `backlogged`."""

    def __init__(self, outbox: Outbox, max_message: int):
        self.outbox = outbox
        self.max_message = max_message
        self._out: dict[str, list[list]] = {}
        self._held: dict[str, list[list]] = {}  # answers gathered, per destination
        self._held_since = 0.0  # when the oldest held answer came
        self._awaiting = 0  # relayed calls not yet answered (as far as counting tells)
        self._backlog: dict[str, collections.deque] = {}
        self.relayed = 0  # messages passed on
        self.dropped = 0  # messages given up on (their destination did not read for BACKLOG_S)

    @property
    def backlogged(self) -> bool:
        return bool(self._backlog)

    def take(self, to: str, frames: list) -> None:
        """A message to pass on to `to` (its frames as received: zmq Frames or views)."""
        msg = [f.buffer if hasattr(f, "buffer") else f for f in frames]
        kind = wire.kind_byte(msg[0])
        if kind in _ASKS:
            self._awaiting += 1
        elif kind == _RESULT:
            # Answers the counting did not see asked (a resent call answered twice) leave it at
            # zero: released at once, as without gathering.
            self._awaiting = max(0, self._awaiting - 1)
            if not self._held:
                self._held_since = time.monotonic()
        held = self._held.get(to)
        if held is not None or kind == _RESULT:
            if held is None:
                self._held[to] = [msg]
            else:
                held.append(msg)
            return
        out = self._out.get(to)
        if out is None:
            self._out[to] = [msg]
        else:
            out.append(msg)

    def hold_s(self) -> float | None:
        """How long until the answers held now go out (None: none are held)."""
        if not self._held:
            return None
        return max(0.0, self._held_since + GATHER_S - time.monotonic())

    def flush(self) -> None:
        """Send what this drain collected, as few batches per destination; the answers held
        once every relayed call is answered, or the oldest is GATHER_S old."""
        out, self._out = self._out, {}
        self._send(out)
        if self._held and (self._awaiting == 0 or time.monotonic() - self._held_since >= GATHER_S):
            self.release()

    def release(self) -> None:
        """Send the answers held now (the agent sends a message of its own, or a proc ended:
        what its procs said before goes first)."""
        held, self._held = self._held, {}
        self._send(held)

    def _send(self, out: dict[str, list[list]]) -> None:
        for to, msgs in out.items():
            try:
                for frames in wire.pack(msgs, self.max_message):
                    self._transmit(to, frames)
            except (MessageTooLarge, ProtocolError) as e:
                log.warning("relayed messages not sent", peer=to, count=len(msgs), error=str(e))
            self.relayed += len(msgs)

    def _transmit(self, to: str, frames: list) -> None:
        backlog = self._backlog.get(to)
        if backlog:
            backlog.append((time.monotonic(), frames))
        elif not self.outbox.peer(to).try_send(frames):
            self._backlog[to] = collections.deque([(time.monotonic(), frames)])

    def retry(self) -> None:
        """Send what waits for destinations that were full; give up on one that did not read
        for BACKLOG_S (its sender sends it again)."""
        now = time.monotonic()
        for to, backlog in list(self._backlog.items()):
            try:
                peer = self.outbox.peer(to)
                while backlog and peer.try_send(backlog[0][1]):
                    backlog.popleft()
            except (MessageTooLarge, ProtocolError) as e:
                log.warning("relayed messages not sent", peer=to, error=str(e))
                backlog.clear()
            if backlog and now - backlog[0][0] > BACKLOG_S:
                log.warning("dropping relayed messages to an inbox that does not read", peer=to,
                            count=len(backlog))
                self.dropped += len(backlog)
                backlog.clear()
                self.outbox.drop(to)
            if not backlog:
                del self._backlog[to]

    def forget(self, to: str) -> None:
        """A proc of this host ended: nothing more goes to it, and the calls it was relayed
        are no longer counted on (which ones is not known: none are)."""
        self._out.pop(to, None)
        self._held.pop(to, None)  # an answer to one of its actors' calls: nobody to take it
        self._awaiting = 0
        backlog = self._backlog.pop(to, None)
        if backlog:
            self.dropped += len(backlog)
        self.outbox.drop(to)

