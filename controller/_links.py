"""Watching the controller's links to its workers, mixed into Runtime (controller/_runtime.py),
whose sockets, procs and calls these methods use: a link that broke and came back has its
outstanding calls sent again, a call unanswered for its wait is sent again under the same id
(workers dedupe), and a peer whose authentication handshake fails is named once."""

from __future__ import annotations

import functools
import operator
import time
from typing import Any

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from regent.wire.transport import Peer, PeerGone, readable

log = structlog.get_logger("regent.controller")

# A call unanswered this long is sent again under the same id (workers dedupe: a repeat
# joins the execution in flight or gets the cached result); the wait then doubles.
RESEND_FIRST_S = 3.0
RESEND_MAX_S = 60.0
# An overdue call to a proc that has answered anything since it was sent (or whose host's agent
# relayed any answer since: it keeps each proc's order) is queued or running there, not lost (a
# reconnect, which can lose messages, resends on its own): it waits until this old. Resending it
# sooner only doubles the work of a proc and a controller that are behind already (thousands of
# broadcasts queued behind each other, say). A proc that answered nothing since, or whose
# overdue calls are older than this, is sent its oldest overdue call alone in each pass (calls to
# a proc are run in order): if that one is answered, the proc was behind and the rest wait; had
# its messages been lost, the oldest was among them, and the next pass sends the next. (Every
# call past this age sent again made a backlog at 4,096 procs worse: 400k resends in one run.)
# Relayed, the route is the host's agent: one call of one of its procs goes again a pass, and
# any answer it relays is progress for all.
PROGRESS_PATIENCE_S = 20.0
_HANDSHAKE_FAILED = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "no detail",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "a protocol error, e.g. a server key other than the expected one",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the server refused our key",
}
_HANDSHAKE_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | functools.reduce(operator.or_, _HANDSHAKE_FAILED)


def _readable(sock: zmq.Socket) -> bool:
    """Whether a monitor holds an event. Most have none: asking costs a flag read, where a recv
    finding nothing raises (14k of those were a second of a takeover's time at 1,024 procs)."""
    try:
        return not sock.closed and readable(sock)
    except zmq.ZMQError:
        return False


def link_monitor(peer: Peer) -> tuple[zmq.Socket, Peer]:
    """A monitor of `peer`'s link: its connects and handshakes (made before it connects, so
    the first connect is seen and a later one is known to be a reconnect)."""
    return peer.sock.get_monitor_socket(zmq.EVENT_CONNECTED | _HANDSHAKE_EVENTS), peer


class _Links:
    """Link monitors and resends. Uses the Runtime's `core`, `outbox`, `_relay_host` and
    `try_send_to_proc`, and the bookkeeping its __init__ sets up."""

    _monitors: list
    _unproven: dict[str, str]
    _reconnects: dict[int, int]
    _resend_all: bool
    _resent_all_at: float
    _next_overdue_scan: float
    resends: dict[str, int]  # calls sent again, by reason ("link", "overdue"), and "deferred"
    heard: dict[str, float]  # proc id (and relaying agent) -> when it last answered a call
    core: Any
    outbox: Any
    transport: Any  # controller/_standby.Transport: the sockets, and every peer's monitor in `_monitors`

    def let_go(self, keep: set[str]) -> int:
        """Close every link but those to `keep` (addresses): a standby's links to workers the
        journal named that the takeover found gone. How many closed. Caller holds the drive."""
        gone = [a for a in self.outbox.addresses() if a not in keep]
        self.transport.drop(gone)
        return len(gone)

    def _check_links(self) -> None:
        """Resend outstanding calls over links that broke and came back."""
        peers: set[str] = set()
        for mon, peer in list(self._monitors):
            while _readable(mon):
                try:
                    event = recv_monitor_message(mon, zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    break
                if peer is None:  # a worker's reply link to our inbox broke
                    self._resend_all = True
                    continue
                kind = event.get("event")
                if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._unproven.pop(peer.address, None)
                    continue
                if kind in _HANDSHAKE_FAILED:
                    why = f"its authentication handshake failed ({_HANDSHAKE_FAILED[kind]})"
                    if self._unproven.get(peer.address) != why:  # once, not on every reconnect
                        log.warning("a peer failed the authentication handshake", peer=peer.address,
                                    detail=_HANDSHAKE_FAILED[kind])
                    self._unproven[peer.address] = why
                    continue
                self._unproven.setdefault(peer.address, "it accepted the connection but has not "
                                                        "completed the authentication handshake")
                seen = self._reconnects.get(id(peer), 0) + 1
                self._reconnects[id(peer)] = seen
                if seen > 1:
                    peers.add(peer.address)
                    log.info("link to a worker came back; resending its outstanding calls", peer=peer.address,
                             zmq_event=str(event.get("event")))
        now = time.monotonic()
        everything, self._resend_all = self._resend_all, False
        if everything and now - self._resent_all_at < RESEND_FIRST_S:
            # A disconnect from the inbox names no peer: anything that connects and goes (a
            # stale proc of another session retrying a reused port, a scanner) would have every
            # outstanding call sent again each time. Once per RESEND_FIRST_S at most.
            self._resend_all, everything = True, False
        elif everything:
            self._resent_all_at = now
        overdue: dict[int, float] = {}  # seq -> when it was last sent
        if now >= self._next_overdue_scan:
            self._next_overdue_scan = now + 1.0
            for call in self.core.calls.values():
                if call.wire is None:
                    continue
                w = call.wire
                if now - w.sent_at >= w.wait:
                    # Whatever was lost without a visible disconnect is recovered here.
                    overdue[call.seq] = w.sent_at
                    w.sent_at, w.wait = now, min(w.wait * 2, RESEND_MAX_S)
        if not peers and not everything:
            overdue = self._defer_whole(overdue, now)
            if not overdue:
                return
        calls = self.core.calls.values() if peers or everything else (self.core.calls[q] for q in overdue)
        pending = [(c, r) for c in calls if c.wire is not None for r in c.targets if r not in c.results]
        probed: set[str] = set()  # silent procs (or relaying agents) sent their oldest overdue call again
        for call, rank in pending:
            proc = call.wire.procs[rank]
            if not proc.alive:
                continue
            if everything or self.outbox.route_of(self._relay_host(proc) or proc.address) in peers:
                reason = "link"
            elif call.seq in overdue:
                if self._last_heard(proc) > overdue[call.seq] and now - call.wire.issued_at < PROGRESS_PATIENCE_S:
                    self.resends["deferred"] += 1  # it answers: this one is queued or running there
                    continue
                # Silent, or answering but this call past its patience: its oldest call goes again.
                if (route := self._relay_host(proc) or proc.id) in probed:
                    self.resends["deferred"] += 1  # its answer says whether the rest were lost
                    continue
                probed.add(route)
                reason = "overdue"
            else:
                continue
            try:
                if self.try_send_to_proc(proc, call.wire.message(rank)):
                    self.resends[reason] += 1
            except PeerGone:
                pass

    def _defer_whole(self, overdue: dict[int, float], now: float) -> dict[int, float]:
        """Defer at once each overdue call that every one of its procs has answered something
        since it was last sent, younger than PROGRESS_PATIENCE_S: the pass over its points
        would defer them one by one (a backlog of broadcasts to 4,096 procs is some 200k points
        a second). The calls left to that pass are returned."""
        floors: dict[int, float | None] = {}  # a mesh's calls share its list of procs
        rest: dict[int, float] = {}
        for seq, sent_at in overdue.items():
            call = self.core.calls[seq]
            procs = call.wire.procs
            key = id(procs)
            if key not in floors:
                floors[key] = self._heard_since(procs)
            floor = floors[key]
            if floor is not None and floor > sent_at and now - call.wire.issued_at < PROGRESS_PATIENCE_S:
                self.resends["deferred"] += len(call.targets) - len(call.results)
            else:
                rest[seq] = sent_at
        return rest

    def _heard_since(self, procs: list) -> float | None:
        """When the longest silent of `procs` last answered; None if one is dead (its points
        are skipped, not deferred: the pass over points decides)."""
        floor = float("inf")
        for proc in procs:
            if not proc.alive:
                return None
            floor = min(floor, self._last_heard(proc))
        return floor

    def _last_heard(self, proc: Any) -> float:
        """When `proc`, or the agent relaying its answers (which keeps each proc's order), last
        answered a call."""
        last = self.heard.get(proc.id, 0.0)
        host = self._relay_host(proc)
        return max(last, self.heard.get(host, 0.0)) if host is not None else last
