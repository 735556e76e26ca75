"""A standby's links, made while it waits. A standby that takes over a session with a thousand
procs must reach every one of them: a connection each way, each with its CURVE handshake, ~4,000
handshakes on the takeover's critical path. While it stands by, this reads the journal's
placements and spawns as the primary writes them, opens a link to every host agent and proc
they name, and pings each, so the worker opens its link back to this standby's inbox. Once the
standby leads, its Runtime takes these sockets over (`take`) and the fence, greetings and first
calls go over links that are up.

Best effort, and it decides nothing: PINGs carry no epoch, a worker it did not reach is
connected on demand as before, and the takeover closes the links to workers its agents no
longer list (`Runtime.let_go`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

import structlog
import zmq

from regent import wire
from regent.controller._links import link_monitor
from regent.controller.membership import journaled_spare_addresses
from regent.controller.replay import CALL, PROCS, START, SUPERVISION, placed_hosts
from regent.wire import Kind
from regent.wire.schema import valid_address
from regent.wire.security import Credentials, load_credentials, stop_authenticator
from regent.wire.transport import BUSY_BATCH_AGE_S, Inbox, Outbox, Peer, context

log = structlog.get_logger("regent.session")

STANDBY_LINKS_ENV = "REGENT_STANDBY_LINKS"  # "0": a standby opens its links only once it leads
POLL_S = 0.5  # how often a standing-by controller reads the journal's tail for new workers
LINKS_PER_POLL = 256  # new links a poll opens, at most
JOIN_S = 1.0  # the most a takeover waits for the reader to let go of the sockets
CONTROLLER_SOCKETS = 1 << 16  # a socket (and a monitor) per proc and host it talks to: zmq's 1023 is 500 procs


def links_while_standing_by() -> bool:
    """Whether a standby opens its links to the journal's workers while it waits (the default)."""
    return os.environ.get(STANDBY_LINKS_ENV, "1") != "0"


@dataclass
class Transport:
    """A controller's sockets: what a Runtime makes, or takes from a standby (`StandbyLinks.take`)."""

    ctx: zmq.Context
    creds: Credentials
    inbox: Inbox
    outbox: Outbox
    reply_address: str  # where workers reach the inbox
    monitors: list[tuple[zmq.Socket, Peer | None]] = field(default_factory=list)  # every peer's link monitor

    @staticmethod
    def make(bind_host: str, links: Any) -> Transport:
        """`links` (chaos testing): `.connect(addr)` routes our connections, `.advertise(addr)` the
        address workers reply to; None: the direct path."""
        ctx = context(CONTROLLER_SOCKETS)
        creds = load_credentials()
        # Batches may gather for BUSY_BATCH_AGE_S while the program issues; the IO thread sends
        # those it leaves after BATCH_MAX_AGE_S (controller/_runtime.py).
        outbox = Outbox(ctx, creds, links.connect if links else None, batch_age_s=BUSY_BATCH_AGE_S)
        inbox = Inbox(ctx, creds, bind_host)
        t = Transport(ctx, creds, inbox, outbox, links.advertise(inbox.address) if links else inbox.address)
        t.outbox.on_new = lambda peer: t.monitors.append(link_monitor(peer))
        return t

    def drop(self, addresses: list[str]) -> None:
        """Close the links to `addresses` (those it holds), their monitors with them."""
        held = set(self.outbox.addresses())
        gone = [a for a in addresses if a in held]
        peers = {id(self.outbox.peer(a)) for a in gone}
        kept = []
        for mon, peer in self.monitors:
            if peer is not None and id(peer) in peers:
                mon.close(linger=0)
            else:
                kept.append((mon, peer))
        self.monitors[:] = kept
        for a in gone:
            self.outbox.drop(a)

    def close(self) -> None:
        for mon, _ in self.monitors:
            mon.close(linger=0)
        self.outbox.close()
        self.inbox.close()
        stop_authenticator(self.ctx)
        self.ctx.destroy(linger=0)


class StandbyLinks:
    """Links to the workers a session's journal names, opened while this controller stands by."""

    def __init__(self, journal: Any, name: str, bind_host: str, links: Any = None):
        self.journal, self.name = journal, name
        self.transport = Transport.make(bind_host, links)
        self.reply_address = self.transport.reply_address
        self._ping = wire.encode(Kind.PING, {"rt": self.reply_address, "n": 0})
        # Relayed (REGENT_RELAY=1), procs are reached through their host's agent both ways.
        self._procs_too = os.environ.get("REGENT_RELAY", "0") != "1"
        self._next_lsn = 0
        self._hosts: set[str] = set()
        self._procs: dict[str, str] = {}  # proc id -> address, of the run the journal is in
        self._supervision: list[dict] = []
        self._warmed: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._done = self._abandoned = False
        self._thread = threading.Thread(target=self._run, name=f"regent-standby-links-{name}", daemon=True)
        self._thread.start()

    def take(self) -> Transport | None:
        """Stop reading; the sockets, for the Runtime of the controller that now leads (None if
        the reader would not let go in time: it closes them itself)."""
        if not self._stopped():
            log.warning("the standby's journal reader did not stop in time; the takeover opens its own links",
                        session=self.name)
            return None
        self._drain()
        log.info("took over the standby's links", session=self.name, workers=len(self._warmed))
        return self.transport

    def close(self) -> None:
        """Never led: stop and close everything."""
        if self._stopped():
            self.transport.close()

    def _stopped(self) -> bool:
        """Stop the reader: whether it let go of the sockets (else it closes them as it ends)."""
        self._stop.set()
        self._thread.join(JOIN_S)
        with self._lock:
            if not self._done:
                self._abandoned = True
            return not self._abandoned

    def _run(self) -> None:
        try:
            while True:
                try:
                    self._read_tail()
                    self._warm()
                    self._drain()
                except Exception as e:  # noqa: BLE001 - best effort; the takeover connects on demand
                    log.debug("standby links: journal tail not read", session=self.name, error=str(e))
                if self._stop.wait(POLL_S):
                    return
        finally:
            with self._lock:
                self._done = True
                if self._abandoned:  # take() gave up waiting: nobody else will close them
                    self.transport.close()

    def _read_tail(self) -> None:
        for rec in self.journal.read(self.name, self._next_lsn):
            if self._stop.is_set():
                return
            self._next_lsn = rec.lsn + 1
            kind, d = rec.kind, rec.data
            if kind == START:  # a new run: the previous run's workers are not this one's
                self._hosts.clear()
                self._procs.clear()
                self._supervision.clear()
            elif kind == CALL and isinstance(d, dict):
                self._hosts.update(placed_hosts(d.get("k"), d.get("v")))
            elif kind == PROCS and isinstance(d, dict) and isinstance(d.get("procs"), list):
                for p in d["procs"]:
                    if isinstance(p, dict) and isinstance(p.get("id"), str) and isinstance(p.get("addr"), str):
                        self._procs[p["id"]] = p["addr"]
            elif kind == SUPERVISION and isinstance(d, dict):
                self._supervision.append(d)
                if d.get("ev") == "proc_replaced" and isinstance(d.get("old"), str):
                    self._procs.pop(d["old"], None)  # its replacement's address is the agent's to say

    def _warm(self) -> None:
        hosts = self._hosts | set(journaled_spare_addresses(self._supervision))
        procs = set(self._procs.values()) if self._procs_too else set()
        wanted = hosts | procs
        outbox = self.transport.outbox
        # The agents first; a bounded number a poll, so that linking a thousand procs (their
        # handshakes) does not all land at once on machines the primary is using.
        new = sorted(hosts - self._warmed) + sorted(procs - hosts - self._warmed)
        for addr in new[:LINKS_PER_POLL]:
            self._warmed.add(addr)  # looked at once, linked or not
            if not valid_address(addr):
                log.debug("standby links: the journal names a worker at an address no link can take",
                          session=self.name, addr=addr[:200])
                continue
            try:
                outbox.peer(addr).try_send(self._ping)
            except Exception as e:  # noqa: BLE001 - an address the journal holds but zmq refuses
                log.debug("standby links: no link to a journaled worker", session=self.name, addr=addr, error=str(e))
        for addr in self._warmed - wanted:  # replaced, or of an earlier run
            self._drop(addr)

    def _drop(self, addr: str) -> None:
        self._warmed.discard(addr)
        self.transport.drop([addr])

    def _drain(self) -> None:
        """The pongs: nothing to do with them (the workers' links back are what was wanted)."""
        for _ in self.transport.inbox.pending():
            pass
