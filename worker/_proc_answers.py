"""How a call's outcome becomes its answer: an endpoint's value, its error, a port it answered
through, or a send's port; each recorded by the proc's core (kept for repeats) and sent to
everyone waiting on it."""

from __future__ import annotations

from typing import Any

import structlog

from regent import wire
from regent.wire import Kind
from regent.wire.transport import refuse_oversized
from regent.worker._slot import _Slot
from regent.worker.errors import (
    GROUP_FAILED,
    error_fields,
    group_failure,
)
from regent.worker.ports import PORT_ACTOR, Port, ProcPorts
from regent.worker.proccore import ProcCore

log = structlog.get_logger("regent.proc")


class _Answers:
    """Mixed into ProcRuntime, whose core, ports and sending these methods use."""

    core: ProcCore
    ports: ProcPorts
    _max_message: int

    def _on_port_send(self, seq: int, point: int, o: str, payload: list) -> None:
        """A value for one of our ports, sent from another proc (worker/ports.py); deduped like a call."""
        try:
            (pid, item, *order), _ = wire.loads(payload)
            refused = self.ports.deliver(pid, item, *order)
        except Exception as e:
            self._finish_error(seq, PORT_ACTOR, point, e, o=o)
            return
        if refused:
            self._finish(seq, PORT_ACTOR, point, "err", o=o, et="ValueError", em=refused, tb="")
        else:
            self._finish(seq, PORT_ACTOR, point, "ok", o=o)

    def _response_port(self, slot: _Slot, seq: int, point: int, o: str) -> Any:
        """The port an explicit-response endpoint answers its call through."""
        def answer(item: tuple) -> None:
            kind, body = item
            if kind == "v":
                self._finish_value(seq, slot.name, point, body, o=o)
            elif kind == "e":
                et, em, tb = body
                self._finish(seq, slot.name, point, "err", o=o, et=et, em=em, tb=tb)
            else:  # the actor is gone
                self._finish(seq, slot.name, point, "dead", o=o, em=f"{body} before answering this call")

        return self.ports.response(seq, slot.name, point, o, answer)

    def _returned(self, slot: _Slot, seq: int, point: int, o: str, port: Any, answer_to: Port | None,
                  explicit: bool, value: Any) -> None:
        """An endpoint returned: its value answers the call, or goes to the send's port; an
        endpoint given a response port answered through it already."""
        if answer_to is not None:
            self._answer_port(seq, slot.name, point, o, answer_to, None if explicit else (value,))
        elif port is None:
            self._finish_value(seq, slot.name, point, value, o=o)

    def _raised(self, slot: _Slot, seq: int, point: int, method: str, e: Exception, o: str, port: Any,
                answer_to: Port | None, how: str) -> bool:
        """An endpoint raised an Exception: its caller, or the send's port, gets it. A broadcast
        has no reader, so the actor fails instead (True: it is gone)."""
        if how == "bc":
            self._fail(slot, seq, point, method, e, o=o)
            return True
        if answer_to is not None:
            self._answer_port(seq, slot.name, point, o, answer_to, error=e)
        else:
            self._answer_error(seq, slot.name, point, e, o, port)
        return False

    def _answer_port(self, seq: int, actor: str, point: int, o: str, answer_to: Port,
                     value: tuple | None = None, error: Exception | None = None) -> None:
        """Monarch's send(..., port=): the endpoint's value (`(v,)`; None: an explicit-port
        endpoint answered the port itself) or its error goes to that port, from this call's
        site, so a re-run sends it under the same id. The call itself is answered with None."""
        try:
            if error is not None:
                answer_to.exception(error)
            elif value is not None:
                answer_to.send(value[0])
        except Exception as e:  # the port refused it (closed, or not of this session)
            self._finish_error(seq, actor, point, e, o=o)
            return
        self._finish(seq, actor, point, "ok", o=o)

    def _answer_error(self, seq: int, actor: str, point: int, e: Exception, o: str, port: Any) -> None:
        """An endpoint raised: its caller gets the error, unless it was answered through its port already."""
        if port is None or self.ports.close(port.id):
            status = GROUP_FAILED if group_failure(e) else "err"
            self._finish(seq, actor, point, status, o=o, **error_fields(e))
        else:
            log.warning("an endpoint raised after answering through its port", actor=actor, error=repr(e))

    def _finish_value(self, seq: int, actor: str, point: int, value: Any, o: str = "") -> None:
        if value is None:  # no payload at all: the controller reads an empty result as None
            self._finish(seq, actor, point, "ok", o=o)
            return
        try:
            frames = wire.dumps(value)
            if wire.payload_size(frames) > self._max_message - wire.MAX_META_BYTES:  # near the limit
                msg = wire.encode(Kind.RESULT, self.core.result_meta(seq, actor, point, "ok"), frames)
                refuse_oversized(msg, self._max_message, "the controller")
        except Exception as e:  # MessageTooLarge too: the caller hears why, rather than nothing
            self._finish_error(seq, actor, point, e, o=o)
            return
        self._finish(seq, actor, point, "ok", frames=frames, o=o)

    def _finish_error(self, seq: int, actor: str, point: int, e: BaseException, o: str = "") -> None:
        self._finish(seq, actor, point, "err", o=o, **error_fields(e))

    def _finish(self, seq: int, actor: str, point: int, status: str, frames: list | None = None, o: str = "",
                **extra: Any) -> None:
        replies = self.core.complete(seq, actor, point, status, frames, o, **extra)
        if replies:  # one encoding for every caller waiting on it
            msg = wire.encode(Kind.RESULT, replies[0].meta, replies[0].frames)
            for r in replies:
                self._send(r.rt, msg)
