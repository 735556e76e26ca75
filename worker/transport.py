"""Sockets: every regent process binds one authenticated PULL inbox and talks to
others through PUSH outboxes. One-way flows keep sends off the receiving thread
and make backpressure explicit: a full peer delays the sender, never drops.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import zmq

from worker.security import Credentials, secure_client, secure_server

HWM = 100_000


def max_message_bytes() -> int:
    """Largest message a regent socket accepts (REGENT_MAX_MESSAGE_BYTES, default 4 GiB)."""
    return int(os.environ.get("REGENT_MAX_MESSAGE_BYTES", str(4 << 30)))


def valid_address(addr: object) -> bool:
    return isinstance(addr, str) and len(addr) < 256 and addr.startswith(("tcp://", "ipc://"))


class Inbox:
    """The one bound, authenticated PULL socket of a process."""

    def __init__(self, ctx: zmq.Context, creds: Credentials, host: str = "127.0.0.1", port: int = 0):
        self.sock = ctx.socket(zmq.PULL)
        secure_server(self.sock, creds, host)
        self.sock.rcvhwm = HWM
        self.sock.maxmsgsize = max_message_bytes()
        self.sock.linger = 0
        if port:
            self.sock.bind(f"tcp://{host}:{port}")
        else:
            port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"

    def pending(self) -> Iterator[list]:
        """Every message already waiting, without blocking (the caller owns the socket)."""
        while True:
            try:
                yield self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return

    def close(self) -> None:
        self.sock.close(linger=0)


class PeerGone(Exception):
    """The peer is known to be dead, so a blocked send was abandoned."""


class Peer:
    """A PUSH socket to one inbox. Sends are serialised by a lock so any thread may send."""

    def __init__(self, ctx: zmq.Context, creds: Credentials, address: str,
                 before_connect: Callable[[Peer], None] | None = None):
        self.address = address
        self.sock = ctx.socket(zmq.PUSH)
        secure_client(self.sock, creds)
        self.sock.sndhwm = HWM
        self.sock.linger = 0
        self.sock.immediate = False
        if before_connect is not None:  # e.g. a monitor that must see the first connect too
            before_connect(self)
        self.sock.connect(address)
        self.lock = threading.Lock()

    def send(self, frames: list, alive: Callable[[], bool] | None = None) -> None:
        """Send, waiting while the peer's queue is full; PeerGone if alive() turns false."""
        with self.lock:
            while True:
                try:
                    self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                    return
                except zmq.Again:
                    if alive is not None and not alive():
                        raise PeerGone(f"peer {self.address} is gone") from None
                    self.sock.poll(50, zmq.POLLOUT)

    def try_send(self, frames: list) -> bool:
        """Send without waiting; False if the peer's queue is full."""
        with self.lock:
            try:
                self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return True
            except zmq.Again:
                return False

    def close(self) -> None:
        with self.lock:
            self.sock.close(linger=0)


class Outbox:
    """Peers by address, created on first use. `route` may redirect a connection (a chaos
    proxy in front of a peer, say) while callers keep using the peer's own address."""

    def __init__(self, ctx: zmq.Context, creds: Credentials, route: Callable[[str], str] | None = None,
                 on_new: Callable[[Peer], None] | None = None):
        self.ctx = ctx
        self.creds = creds
        self.route = route
        self.on_new = on_new
        self._peers: dict[str, Peer] = {}
        self._lock = threading.Lock()

    def peer(self, address: str) -> Peer:
        p = self._peers.get(address)
        if p is None:
            with self._lock:
                p = self._peers.get(address)
                if p is None:
                    target = self.route(address) if self.route else address
                    p = self._peers[address] = Peer(self.ctx, self.creds, target, self.on_new)
        return p

    def route_of(self, address: str) -> str:
        """The address a connection to `address` actually goes to."""
        return self.route(address) if self.route else address

    def drop(self, address: str) -> None:
        with self._lock:
            p = self._peers.pop(address, None)
        if p is not None:
            p.close()

    def close(self) -> None:
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            p.close()


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True
