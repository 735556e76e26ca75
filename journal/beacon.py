"""Liveness beacon: a leader's listening socket, and a standby's watch on it.

A leader serves a plain TCP listener and publishes its address with its leadership; each
standby keeps a connection to it open. When that connection closes and the port then refuses
every new connection, the leader's process is gone (the kernel closed its sockets), so the
standby may evict it rather than wait out its lease. The beacon carries no data and never
decides safety on its own: see `BeaconWatch`.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass

import structlog

from .backend import Incumbent

log = structlog.get_logger("journal.beacon")

# After the watched connection closes, connect again this many times, this far apart; only a
# refusal every time counts as the leader's process being gone (about 100 ms in all).
PROBE_ATTEMPTS = 3
PROBE_SPACING_S = 0.05
# A connect that gets no answer within this is no proof of anything: the lease decides.
CONNECT_TIMEOUT_S = 0.5
# How often a blocked watch looks up from its socket to see whether it should stop.
_RECV_TIMEOUT_S = 0.25
# How long a watch that could not tell waits before it tries again.
_RETRY_S = 0.5
# A beacon keeps at most this many standbys' connections; it closes any more at once (those
# standbys reconnect, find the beacon alive, and keep trying: they only lose speed).
_MAX_PEERS = 64

_OFF = {"0", "off", "false", "no"}


def beacon_enabled() -> bool:
    """False when REGENT_BEACON=0: leaders serve no beacon and standbys watch none."""
    return os.environ.get("REGENT_BEACON", "1").strip().lower() not in _OFF


def beacon_host() -> str:
    """The address a leader's beacon listens on: $REGENT_BEACON_HOST, default 127.0.0.1."""
    return os.environ.get("REGENT_BEACON_HOST", "").strip() or "127.0.0.1"


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of "host:port" or "[v6 host]:port"; ValueError if it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad beacon address {address!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class Beacon:
    """A leader's beacon: accepts standbys' connections and holds them open until closed.

    It sends nothing and discards whatever it receives. `close()` closes the listener before
    the connections, so that a standby that sees its connection close finds the port shut.
    """

    def __init__(self, host: str | None = None) -> None:
        host = host or beacon_host()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.bind((host, 0))
            listener.listen(16)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.address = format_address(host, listener.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._serve, name=f"journal-beacon-{self.address}", daemon=True
        )
        self._thread.start()

    @classmethod
    def open(cls, host: str | None = None) -> Beacon | None:
        """A beacon on `host` (default `beacon_host()`), or None (with a warning) if it
        cannot listen there."""
        host = host or beacon_host()
        try:
            return cls(host)
        except OSError as exc:
            log.warning(
                "cannot serve a liveness beacon; standbys will wait for this leader's lease "
                "to run out if it dies (set REGENT_BEACON_HOST to an address of this host, "
                "or REGENT_BEACON=0 to silence this)",
                host=host,
                error=f"{type(exc).__name__}: {exc}",
            )
            return None

    def __repr__(self) -> str:
        return f"Beacon({self.address!r}{', closed' if self._closed else ''})"

    def close(self) -> None:
        """Stop serving: the port refuses connections and every standby's connection ends."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._wake_w.close()
        self._wake_r.close()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        peers: set[socket.socket] = set()
        try:
            while True:
                for key, _ in sel.select():
                    sock = key.fileobj
                    if sock is self._wake_r:
                        return
                    if sock is self._listener:
                        self._accept(sel, peers)
                        continue
                    assert isinstance(sock, socket.socket)
                    try:
                        data = sock.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(sock)
                        peers.discard(sock)
                        sock.close()
        except Exception:
            log.exception("liveness beacon failed; standbys will rely on the lease", beacon=self)
        finally:
            self._listener.close()
            for sock in peers:
                sock.close()
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, peers: set[socket.socket]) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return  # the peer gave up before we got to it
        if len(peers) >= _MAX_PEERS:
            conn.close()
            return
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ)
        peers.add(conn)


@dataclass(frozen=True, slots=True)
class Gone:
    """A leader whose beacon proved its process gone, and how."""

    leader: Incumbent
    reason: str


class BeaconWatch:
    """A standby's watch on the current leader's beacon, on a thread of its own.

    The campaign tells it which leader to watch (`follow`). It sets `wake` whenever that
    leader's beacon connection closes (a resigning leader closes it right after releasing
    its lease); when the port then refuses every connection for about 100 ms, it also
    records `Gone`. Nothing else counts: a connect that times out, a reset
    route or a successful reconnect leave the leader to its lease. A SIGSTOPped leader's
    kernel keeps its sockets open, so a paused leader is never reported.

    Why acting on it is safe: eviction only shortens the wait for a lease that nobody would
    renew. A live leader evicted by mistake (its port refused connections while it ran)
    loses its lease; its appends are then refused by the store's fencing (every write is
    conditioned on the leader key's holder and epoch) and its messages by the workers' epoch
    check, so a wrong eviction costs availability, never correctness.
    """

    def __init__(self, session: str, wake: threading.Event) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._target: Incumbent | None = None
        self._changed = threading.Event()
        self._closed = threading.Event()
        self._gone: Gone | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"journal-beacon-watch-{session}", daemon=True
        )
        self._thread.start()

    def follow(self, leader: Incumbent | None) -> None:
        """Watch `leader`'s beacon from now on (nothing if it is None or serves none)."""
        if leader is not None and leader.beacon is None:
            leader = None
        with self._lock:
            if leader == self._target:
                return
            self._target = leader
        self._changed.set()

    def take_gone(self) -> Gone | None:
        """The leader found gone since the last call, if any."""
        with self._lock:
            gone, self._gone = self._gone, None
        return gone

    def close(self) -> None:
        self._closed.set()
        self._changed.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _current(self, leader: Incumbent) -> bool:
        return self._target is leader and not self._closed.is_set()

    def _run(self) -> None:
        while not self._closed.is_set():
            self._changed.clear()
            with self._lock:
                leader = self._target
            if leader is None:
                self._changed.wait()
                continue
            try:
                reason = self._watch(leader)
            except Exception:
                log.exception("beacon watch failed; waiting for the lease", leader=leader.holder)
                reason = None
            if reason is None:
                if self._current(leader):
                    self._changed.wait()  # could not watch it: leave it to the lease
                continue
            with self._lock:
                if self._target is not leader:
                    continue
                self._gone = Gone(leader, reason)
                self._target = None  # the campaign decides what to watch next
            self._wake.set()

    def _watch(self, leader: Incumbent) -> str | None:
        """Hold a connection to `leader`'s beacon; a reason once its process is shown gone.

        None when told to stop or to watch another leader, or if the address is unusable.
        """
        assert leader.beacon is not None
        try:
            address = parse_address(leader.beacon)
        except ValueError as exc:
            log.warning("not watching the leader's beacon", leader=leader.holder, error=str(exc))
            return None
        conn: socket.socket | None = None
        had_connection = False
        closed_quickly = False
        try:
            while self._current(leader):
                if conn is None:
                    outcome = self._probe(address, leader)
                    if outcome is True:
                        how = "after its connection closed" if had_connection else "every time"
                        return f"its beacon at {leader.beacon} refused connections {how}"
                    if outcome is False:
                        self._changed.wait(_RETRY_S)
                        continue
                    conn, opened = outcome, time.monotonic()
                    had_connection = True
                    if closed_quickly:
                        # A live leader that keeps closing connections: don't spin on it.
                        self._changed.wait(_RETRY_S)
                try:
                    data = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    data = b""
                if data:
                    continue
                # Closed by the leader's side. A leader that resigned has released its lease
                # by now: campaign again at once. Then probe: its process may be gone.
                self._wake.set()
                conn.close()
                conn = None
                closed_quickly = time.monotonic() - opened < _RETRY_S
            return None
        finally:
            if conn is not None:
                conn.close()

    def _probe(self, address: tuple[str, int], leader: Incumbent) -> socket.socket | bool:
        """Connect: the connection, True if refused every time, False if no clear answer."""
        for attempt in range(PROBE_ATTEMPTS):
            if attempt and self._changed.wait(PROBE_SPACING_S):
                return False  # told to stop or to watch another leader
            try:
                conn = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
            except ConnectionRefusedError:
                continue
            except OSError as exc:
                log.debug(
                    "leader's beacon gave no clear answer; its lease decides",
                    leader=leader.holder,
                    beacon=leader.beacon,
                    error=f"{type(exc).__name__}: {exc}",
                )
                return False
            conn.settimeout(_RECV_TIMEOUT_S)
            return conn
        return True
