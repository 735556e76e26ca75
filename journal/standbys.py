"""Standbys seen from the store: a controller waiting to take a session over keeps a record of
itself under a lease while it waits, so `regent status` and the dashboard can list a session's
standbys. The record is what the standby says of itself (untrusted when read back); it goes
when the standby leads, leaves, or dies (its lease runs out).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import structlog

from .backend import Backend, HostLease
from .errors import HostTaken

log = structlog.get_logger("journal.standbys")

STANDBY_TTL_S = 5.0


def _space(session: str) -> str:
    """The store's space for a session's own values (`regent upgrade` uses it too)."""
    return f"session:{session}"


class StandbyPresence:
    """One standby's record, renewed every third of its TTL from a thread until `stop`."""

    def __init__(self, backend: Backend, session: str, holder: str, info: dict, ttl_s: float = STANDBY_TTL_S):
        self._backend, self._session, self._holder = backend, session, holder
        self._value = json.dumps({"holder": holder, "since": time.time(), **info}).encode()
        self._ttl_s = ttl_s
        self._lease: HostLease | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"regent-standby-{session}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._lease is None or not self._backend.renew_host(self._lease):
                    self._lease = self._join()
            except Exception as e:  # noqa: BLE001 - the store is away: the record lapses, waiting goes on
                log.debug("cannot keep the standby's record in the store", session=self._session, error=str(e))
                self._lease = None
            self._stop.wait(self._ttl_s / 3)
        if self._lease is not None:  # withdrawn here, off the takeover's path
            try:
                self._backend.leave_cluster(self._lease)
            except Exception as e:  # noqa: BLE001 - it lapses with its lease anyway
                log.debug("could not withdraw the standby's record", session=self._session, error=str(e))
            self._lease = None

    def _join(self) -> HostLease:
        space = _space(self._session)
        try:
            return self._backend.join_cluster(space, self._holder, self._value, self._ttl_s)
        except HostTaken:  # its own record, whose renewal failed while it still lived: take it back
            return self._backend.join_cluster(space, self._holder, self._value, self._ttl_s, replace=self._value)

    def stop(self, wait_s: float = 0.0) -> None:
        """Withdraw the record (this controller leads now, or gave up); returns at once, or
        once it is withdrawn (at most `wait_s`): a process about to exit waits."""
        self._stop.set()
        if wait_s > 0:
            self._thread.join(wait_s)


def watch_standbys(backend: Backend, session: str, changed: Callable[[bool], None]) -> Callable[[], None] | None:
    """`backend.watch_cluster` of the session's own space: its standbys and hand-over requests."""
    return backend.watch_cluster(_space(session), changed)


def standbys(backend: Backend, session: str) -> list[dict]:
    """The standbys of `session` whose records are live: {holder, since, pid, hostname, metrics}
    each, as they said; a malformed record is skipped (and logged)."""
    found = []
    for holder, value in backend.cluster_hosts(_space(session)):
        try:
            rec = json.loads(value)
            if not isinstance(rec, dict) or rec.get("holder") != holder:
                raise ValueError("not a standby record")
        except ValueError:
            log.warning("ignoring a malformed standby record", session=session, holder=holder[:100])
            continue
        found.append({"holder": holder[:200], "since": rec.get("since") if isinstance(rec.get("since"), (int, float))
                      else None, "metrics": rec.get("metrics") if isinstance(rec.get("metrics"), str) else None})
    return found
