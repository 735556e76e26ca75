"""Sockets: every regent process binds one authenticated PULL inbox and talks to
others through PUSH outboxes. One-way flows keep sends off the receiving thread
and make backpressure explicit: a full peer delays the sender, never drops.
A peer can also queue messages and send them as one BATCH: each zmq send costs far
more than the Python that encodes a call, so a burst of calls pays for few sends.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import structlog
import zmq

from regent.wire import bulk, bulk_tcp, protocol
from regent.wire.errors import MessageTooLarge, ProtocolError
from regent.wire.schema import valid_address  # noqa: F401  (where the rest of regent finds it)
from regent.wire.security import Credentials, secure_client, secure_server

log = structlog.get_logger("regent.transport")

HWM = 100_000
RECONNECT_MAX_MS = 1000
_EVENTS = int(zmq.EVENTS)  # plain ints: the enum operators cost a microsecond per look
_POLLIN = int(zmq.POLLIN)
DEFAULT_SPIN_US = 200.0


def spin_budget_s() -> float:
    """How long a reader busy-polls its inbox before it sleeps (REGENT_SPIN_US, default
    200; 0 turns spinning off). Both ends of a call spin: the controller while it waits
    for a result, a proc after it has answered, for the next call.

    Waking a thread asleep in poll costs tens of microseconds on a VM, and a round trip
    has such a wake-up on each side. On the 2-core bench machine (bench/bench_wakeups.py)
    a bare pyzmq round trip with 30 us of work per side takes 123 us p50 / 211 us p99 with
    sleeping readers and 94 / 126 us with readers that spin and yield the CPU between
    looks; without yielding, the spinners at times starve zmq's IO threads (p90 up to
    333 us). The budget bounds the CPU a reader burns before it sleeps: a long call costs
    its waiter at most that much."""
    raw = os.environ.get("REGENT_SPIN_US", "")
    try:
        us = float(raw) if raw else DEFAULT_SPIN_US
    except ValueError:
        us = DEFAULT_SPIN_US
    return max(0.0, min(us, 100_000.0)) / 1e6


def readable(sock: zmq.Socket) -> bool:
    """A message is waiting on sock (also re-arms zmq's edge-triggered FD for a poller)."""
    return bool(sock.get(_EVENTS) & _POLLIN)


def spin_until_readable(sock: zmq.Socket, budget_s: float) -> bool:
    """Busy-poll sock for up to budget_s, yielding the CPU between looks; True once a
    message is waiting. The last look re-arms the FD, so a poller may sleep on it after."""
    clock = time.perf_counter
    until = clock() + budget_s
    get, yield_cpu = sock.get, os.sched_yield
    while not get(_EVENTS) & _POLLIN:
        if clock() >= until:
            return False
        yield_cpu()
    return True


def max_message_bytes() -> int:
    """Largest message a regent process accepts, all its frames together
    (REGENT_MAX_MESSAGE_BYTES, default 4 GiB).

    zmq's ZMQ_MAXMSGSIZE, set to the same value on every inbox, bounds each frame: a peer
    sending a larger frame is disconnected before the frame is read. A message of many
    frames each under it still arrives whole (zmq delivers all of a message or none of it),
    so the receiver holds it, up to MAX_BUFFERS + 2 frames of that size, until
    `Inbox.accept` drops it for its total."""
    return int(os.environ.get("REGENT_MAX_MESSAGE_BYTES", str(4 << 30)))


def message_size(frames: list) -> int:
    """Bytes of a message, every frame counted."""
    n = 0
    for f in frames:
        n += len(f)  # bytes, 'B'-format memoryviews (PickleBuffer.raw) and zmq Frames
    return n


def peer_of(frame: object) -> str:
    """Who sent a received frame, as the transport authenticated it (address and user)."""
    try:
        address = frame.get("Peer-Address")  # type: ignore[attr-defined]
    except Exception:
        return "?"
    try:
        user = frame.get("User-Id")  # type: ignore[attr-defined]
    except Exception:
        user = ""
    return f"{address} (user {user})" if user else address


def _kind_name(frames: list) -> str:
    head = frames[0] if frames else b""
    try:
        return protocol.Kind(head[3]).name if len(head) > 3 else "malformed"
    except ValueError:
        return "malformed"


def too_large(what: str, size: int, limit: int) -> MessageTooLarge:
    """The error for a message (`what`, sized `size`) above the message limit."""
    return MessageTooLarge(
        f"{what} is {size} bytes, above the {limit}-byte message limit (REGENT_MAX_MESSAGE_BYTES), "
        "so it was not sent: its receiver would drop it. Send less at a time (split the data, or "
        "pass a reference to where it is stored), or raise REGENT_MAX_MESSAGE_BYTES on every "
        "process of the cluster.")


def refuse_oversized_call(actor: str, method: str, frames: Sequence[Any], limit: int, *names: str) -> None:
    """MessageTooLarge if a call of actor.method with these argument frames would be above
    `limit` bytes. Its metadata is bounded from above: header, keys and ints (128 bytes) and
    the strings in it (actor, method and `names`: session id, reply address)."""
    size = protocol.payload_size(frames)
    if size + 4096 > limit:  # a call with less payload always fits (see Runtime.refuse_oversized_call)
        size += 128 + sum(len(x.encode()) for x in (actor, method, *names))
        if size > limit:
            raise too_large(f"a call of {actor}.{method} with these arguments", size, limit)


def refuse_oversized(frames: list, limit: int, to: str) -> None:
    """MessageTooLarge if the message is above `limit` bytes: its receiver would drop it."""
    size = message_size(frames)
    if size > limit:
        raise too_large(f"a {_kind_name(frames)} message to {to}", size, limit)


class Inbox:
    """The one bound, authenticated PULL socket of a process."""

    def __init__(self, ctx: zmq.Context, creds: Credentials, host: str = "127.0.0.1", port: int = 0,
                 advertise: str | None = None):
        """Bind `host` (an interface's literal address, or 0.0.0.0); peers are told
        `advertise` (default: `host`), the address they reach this one at."""
        self.sock = ctx.socket(zmq.PULL)
        secure_server(self.sock, creds, host)
        self.sock.rcvhwm = HWM
        self.max_message = max_message_bytes()
        self.sock.maxmsgsize = self.max_message  # per frame: see max_message_bytes
        self.sock.linger = 0
        if port:
            self.sock.bind(f"tcp://{host}:{port}")
        else:
            port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{advertise or host}:{port}"

    def pending(self) -> Iterator[list]:
        """Every message already waiting and within the size limit, without blocking (the
        caller owns the socket)."""
        sock = self.sock
        while readable(sock):  # cheaper than a zmq.Again per drain
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = self.admit(frames)
            if frames is not None:
                yield frames

    def admit(self, frames: list) -> list | None:
        """A received message as its handler takes it: None (logged with its peer) if it is
        above the size limit, all frames together, or is a BULK envelope (wire.bulk) that
        cannot be taken; a BULK envelope's message with its frames mapped, or fetched.

        A fetch from another host runs here, on the thread that owns the socket, so that a
        sender's messages keep their order (an actor takes them in arrival order): it takes
        the time the bytes take at line rate, and REGENT_BULK_TIMEOUT_S at most without progress."""
        size = 0
        for f in frames:  # message_size, inline: once per message received
            size += len(f)
        if size > self.max_message:
            log.warning("dropped oversized message", peer=peer_of(frames[0]), bytes=size, frames=len(frames),
                        limit=self.max_message, setting="REGENT_MAX_MESSAGE_BYTES")
            return None
        if len(frames) < 3 or protocol.kind_byte(frames[0]) != protocol.Kind.BULK:
            return frames
        try:
            _, meta, inner = protocol.decode(frames)
            return bulk.take(inner, meta, self.max_message)
        except (ProtocolError, bulk.BulkError) as e:
            log.warning("dropped a message whose large frames could not be taken; its sender sends it again",
                        peer=peer_of(frames[0]), error=str(e))
            return None

    def close(self) -> None:
        self.sock.close(linger=0)


class PeerGone(Exception):
    """The peer is known to be dead, so a blocked send was abandoned."""


# A queued message waits at most this long for company before the queueing thread sends
# its batch; an owner that queues must also flush before it blocks, and flush peers whose
# batch is older than this from a thread of its own (nothing may wait for a later call).
BATCH_MAX_AGE_S = 0.001
# A controller issuing call after call (broadcasts back to back, say) lets each peer's batch
# gather this long instead: at 64 procs a broadcast takes about a batch window to queue, so
# at 1 ms every peer got one message a batch (bench/README.md, "Batches while a program issues").
BUSY_BATCH_AGE_S = 0.004


class Peer:
    """A PUSH socket to one inbox. Sends are serialised by a lock so any thread may send.
    An address zmq cannot connect to raises ProtocolError (it came from a message).

    `queue` adds a message to the peer's next batch; `send`, `try_send` and `flush` send
    what is queued first, so messages to one peer leave in the order they were given."""

    def __init__(self, ctx: zmq.Context, creds: Credentials, address: str,
                 before_connect: Callable[[Peer], None] | None = None,
                 dirty: set[Peer] | None = None, batch_age_s: float = BATCH_MAX_AGE_S):
        self.address = address
        self.batch_age_s = batch_age_s  # the oldest a batch gets before `queue` sends it
        self._queued: list[list] = []
        self._queued_bytes = 0
        self.queued_since = 0.0
        self._alive: Callable[[], bool] | None = None
        self._dirty = dirty  # the owner's set of peers with something queued
        self.max_message = max_message_bytes()  # what the peer accepts, as far as we know
        self._batch_bytes = protocol.batch_bytes(self.max_message)
        # Frames this large go out of band: through shared memory to a peer on this host, from
        # this process's data port (encrypted) to one on another (wire.bulk, wire.bulk_tcp).
        path = bulk.route(address)
        self._bulk = bulk.bulk_bytes(path)
        self._export = bulk.export if path == "shm" else bulk_tcp.export
        self.sock = ctx.socket(zmq.PUSH)
        secure_client(self.sock, creds)
        self.sock.sndhwm = HWM
        self.sock.linger = 0
        self.sock.immediate = False
        # A peer that is gone is retried at 0.1 s, then less and less often, up to once a second:
        # an agent or proc outlives many controllers, and without a bound every dead one cost
        # ten connection attempts a second, forever.
        self.sock.reconnect_ivl_max = RECONNECT_MAX_MS
        if before_connect is not None:  # e.g. a monitor that must see the first connect too
            before_connect(self)
        try:
            self.sock.connect(address)
        except zmq.ZMQError as e:
            self.sock.close(linger=0)
            raise ProtocolError(f"cannot connect to {address!r}: {e}") from None
        self.lock = threading.Lock()

    def send(self, frames: list, alive: Callable[[], bool] | None = None) -> None:
        """Send, waiting while the peer's queue is full; PeerGone if alive() turns false,
        MessageTooLarge (nothing sent) if the message is above the peer's limit."""
        self._refuse_oversized(frames)
        with self.lock:
            if self._queued:
                self._flush_locked(True)
            self._send_locked(frames, alive)

    def _send_locked(self, frames: list, alive: Callable[[], bool] | None) -> None:
        out = self._out(frames)
        while True:
            try:
                self.sock.send_multipart(out, flags=zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                if alive is not None and not alive():
                    if out is not frames:
                        bulk.discard(out)
                    raise PeerGone(f"peer {self.address} is gone") from None
                self.sock.poll(50, zmq.POLLOUT)

    def _out(self, frames: list) -> list:
        """The frames to send: `frames`, or their BULK envelope (wire.bulk)."""
        if not self._bulk or len(frames) < 2:
            return frames
        for f in frames:
            if len(f) >= self._bulk:
                return self._export(frames, self._bulk, self.address)
        return frames

    def try_send(self, frames: list) -> bool:
        """Send without waiting; False if the peer's queue is full. MessageTooLarge as `send`."""
        self._refuse_oversized(frames)
        with self.lock:
            if self._queued and not self._flush_locked(False):
                return False
            out = self._out(frames)
            try:
                self.sock.send_multipart(out, flags=zmq.NOBLOCK, copy=False)
                return True
            except zmq.Again:
                if out is not frames:
                    bulk.discard(out)
                return False

    def _refuse_oversized(self, frames: list) -> None:
        size = 0
        for f in frames:  # message_size, inline: once per message sent
            size += len(f)
        if size > self.max_message:
            refuse_oversized(frames, self.max_message, self.address)

    def queue(self, msg: list, alive: Callable[[], bool] | None = None) -> None:
        """Add a message to the next batch. The batch goes out when it is full or older
        than `batch_age_s` (checked here), or on `flush`; PeerGone if alive() turns
        false while a full peer makes this wait; MessageTooLarge as `send`."""
        size = protocol.message_bytes(msg)
        if size + len(msg[0]) > self.max_message:
            refuse_oversized(msg, self.max_message, self.address)
        with self.lock:
            if not protocol.batchable(msg, size):
                if self._queued:
                    self._flush_locked(True)
                self._send_locked(msg, alive)
                return
            if self._queued and self._queued_bytes + size + len(msg[0]) > self._batch_bytes:
                self._flush_locked(True)
            now = time.monotonic()
            if not self._queued:
                self.queued_since = now
                if self._dirty is not None:
                    self._dirty.add(self)
            self._queued.append(msg)
            self._queued_bytes += size + len(msg[0])  # the header too: a batch is one message
            self._alive = alive
            if (len(self._queued) >= protocol.BATCH_MESSAGES
                    or self._queued_bytes >= self._batch_bytes
                    or now - self.queued_since >= self.batch_age_s):
                self._flush_locked(True)

    def try_queue(self, msg: list, alive: Callable[[], bool] | None = None) -> bool:
        """`queue` for a message the next one supersedes (a release watermark), without
        waiting: False, with nothing queued, if the batch had to go out first and could not
        (the peer is full, or another thread is sending to it)."""
        size = protocol.message_bytes(msg)
        if not protocol.batchable(msg, size):
            return self.try_send(msg)
        size += len(msg[0])
        if not self.lock.acquire(False):
            return False
        try:
            queued = self._queued
            if queued and (len(queued) + 1 >= protocol.BATCH_MESSAGES or self._queued_bytes + size >= self._batch_bytes):
                if not self._flush_locked(False):
                    return False
            if not self._queued:
                self.queued_since = time.monotonic()
                if self._dirty is not None:
                    self._dirty.add(self)
            self._queued.append(msg)
            self._queued_bytes += size
            self._alive = alive
            return True
        finally:
            self.lock.release()

    def flush(self, block: bool = True) -> bool:
        """Send what is queued. block=False gives up (False) if the peer is full or
        another thread is sending to it. PeerGone (blocking only) drops the batch."""
        if not self._queued:
            return True
        if not self.lock.acquire(blocking=block):
            return False
        try:
            return self._flush_locked(block)
        finally:
            self.lock.release()

    def _flush_locked(self, block: bool) -> bool:
        msgs = self._queued
        if not msgs:
            return True
        frames = msgs[0] if len(msgs) == 1 else protocol.encode_batch(msgs)
        if block:
            try:
                self._send_locked(frames, self._alive)
            except PeerGone:
                self._clear_queue()  # the owner fails whatever waited on a peer that is gone
                raise
        else:
            try:
                self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
        self._clear_queue()
        return True

    def _clear_queue(self) -> None:
        self._queued = []
        self._queued_bytes = 0
        if self._dirty is not None:
            self._dirty.discard(self)

    def close(self) -> None:
        with self.lock:
            self._clear_queue()
            self.sock.close(linger=0)
        if self._bulk:
            bulk.forget(self.address)  # what it never took will not be taken


def context(sockets: int = 0) -> zmq.Context:
    """A zmq context for a process that may hold `sockets` sockets at once (0: zmq's default
    of 1023), a controller's to a thousand procs or a hollow host's. The process's open-file
    limit is raised to its hard limit as well: every socket holds descriptors."""
    ctx = zmq.Context()
    if sockets > ctx.get(zmq.MAX_SOCKETS):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            except (ValueError, OSError) as e:
                log.warning("cannot raise the open-file limit", soft=soft, hard=hard, error=str(e))
        ctx.set(zmq.MAX_SOCKETS, sockets)
    return ctx


# The peers a receiver (a proc, a host agent) keeps. It answers whatever reply address a
# message names, so without a bound, messages naming ever new addresses would use up its zmq
# context's sockets (1023) and it could answer no new controller, a standby taking over say.
RECEIVER_MAX_PEERS = 256


class DirtyPeers(set):
    """The peers with a batch queued and not yet sent. `on_add`, if set, runs after each peer
    is added (at the start of its batch, not per message): the owner's flushing thread may be
    asleep and must be woken to send the batch within its age."""

    __slots__ = ("on_add",)

    def __init__(self) -> None:
        super().__init__()
        self.on_add: Callable[[], None] | None = None

    def add(self, peer: Peer) -> None:
        set.add(self, peer)
        if self.on_add is not None:
            self.on_add()


class Outbox:
    """Peers by address, created on first use. `route` may redirect a connection (a chaos
    proxy in front of a peer, say) while callers keep using the peer's own address.
    `max_peers`: the most kept; to make room, the least recently used one with nothing queued
    is closed (what its socket still held for a peer gone that long is dropped)."""

    def __init__(self, ctx: zmq.Context, creds: Credentials, route: Callable[[str], str] | None = None,
                 on_new: Callable[[Peer], None] | None = None, max_peers: int | None = None,
                 batch_age_s: float = BATCH_MAX_AGE_S):
        self.ctx = ctx
        self.batch_age_s = batch_age_s
        self.creds = creds
        self.route = route
        self.on_new = on_new
        self.max_peers = max_peers
        self._peers: dict[str, Peer] = {}  # with max_peers: least recently used first
        self.dirty = DirtyPeers()  # peers with queued messages not yet sent
        self._lock = threading.Lock()

    def peer(self, address: str) -> Peer:
        p = self._peers.get(address)
        if p is None:
            with self._lock:
                p = self._peers.get(address)
                if p is None:
                    if self.max_peers is not None and len(self._peers) >= self.max_peers:
                        self._evict_locked()
                    target = self.route(address) if self.route else address
                    p = self._peers[address] = Peer(self.ctx, self.creds, target, self.on_new,
                                                    self.dirty, self.batch_age_s)
        elif self.max_peers is not None:
            with self._lock:
                if self._peers.get(address) is p:
                    self._peers[address] = self._peers.pop(address)  # the most recently used, last
        return p

    def _evict_locked(self) -> None:
        """Close the least recently used peer with nothing queued, else the least recently used
        one: when one drain of the inbox names more new peers than `max_peers`, every peer holds
        a reply not yet flushed, and the cap must hold all the same (what it held is dropped, as
        for any peer closed; a controller sends an unanswered call again)."""
        if not self._peers:
            return
        address = next((a for a, p in self._peers.items() if not p._queued), next(iter(self._peers)))
        self._peers.pop(address).close()
        log.debug("closed the least recently used peer", peer=address, kept=self.max_peers)

    def addresses(self) -> list[str]:
        """The addresses of the peers held now."""
        with self._lock:
            return list(self._peers)

    def route_of(self, address: str) -> str:
        """The address a connection to `address` actually goes to."""
        return self.route(address) if self.route else address

    def flush(self, block: bool = True, older_than: float | None = None) -> None:
        """Send every peer's queued batch (only those queued before `older_than`, a
        time.monotonic() value, if given). Blocking, PeerGone from a peer that is gone
        is swallowed: its owner fails what waited on it."""
        for p in list(self.dirty):
            if older_than is not None and p.queued_since > older_than:
                continue
            try:
                if not p.flush(block):
                    continue
            except PeerGone:
                continue

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
