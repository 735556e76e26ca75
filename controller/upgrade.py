"""A hand-over asked for through the store (`regent upgrade`): the new program, standing by,
writes a request naming the epoch it wants handed over; the primary of that epoch, watching
for it, steps down at its next safe point as a SIGTERM would make it (controller/edge.py,
Handoff), wherever it runs. The request lives among the store's cluster values, in a space of
the session's own ("session:<name>", which no cluster name can be), one per epoch.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("regent.upgrade")

# Set by `regent upgrade` for the program it runs: the session it upgrades (its primary, whatever
# its epoch when this program stands by, is asked to hand over).
UPGRADE_ENV = "REGENT_UPGRADE"
WATCH_INTERVAL_S = 0.05


def _space(session: str) -> str:
    return f"session:{session}"


def _name(epoch: int) -> str:
    return f"handover-{epoch}"


def upgrading(session: str) -> bool:
    """Whether this process was started by `regent upgrade` to take `session` over."""
    return os.environ.get(UPGRADE_ENV) == session


def request_handover(backend: Any, session: str, epoch: int, by: str) -> float:
    """Ask the primary of `epoch` to hand `session` over; when the request was made (time.time())."""
    at = time.time()
    backend.claim_cluster_value(_space(session), _name(epoch), json.dumps({"by": by, "at": at}).encode())
    return at


def handover_request(backend: Any, session: str, epoch: int) -> dict | None:
    """The request to hand over `epoch`, if one was made: {"by": holder, "at": time}. The store's
    value is untrusted: anything but that shape is taken for no request (and logged)."""
    raw = backend.cluster_value(_space(session), _name(epoch))
    if raw is None:
        return None
    try:
        value = json.loads(raw)
        if isinstance(value, dict) and isinstance(value.get("by"), str) and isinstance(value.get("at"), int | float):
            return {"by": value["by"][:200], "at": float(value["at"])}
    except ValueError:
        pass
    log.warning("ignoring a malformed hand-over request in the store", session=session, epoch=epoch,
                value=raw[:200])
    return None


class HandoverWatch:
    """The primary's side: polls the store every WATCH_INTERVAL_S until a request for its epoch
    appears, then calls `on_request(request)` once. Store errors are retried (a transient
    outage must not end the run); `close` stops it."""

    def __init__(self, backend: Any, session: str, epoch: int, on_request: Callable[[dict], None]):
        self._backend, self._session, self._epoch = backend, session, epoch
        self._on_request = on_request
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"regent-handover-{session}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(WATCH_INTERVAL_S):
            try:
                request = handover_request(self._backend, self._session, self._epoch)
                failing = False
            except Exception as e:  # the store is down or closing: look again later
                if not failing and not self._stop.is_set():
                    log.warning("cannot read hand-over requests from the store; retrying", session=self._session,
                                error=str(e))
                failing = True
                continue
            if request is not None:
                self._on_request(request)
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
