"""A bare wire-level peer for tests: sends hand-made messages to a proc or host agent
and reads what comes back, the way a second (or deposed) controller would."""

from __future__ import annotations

import collections
import time

import zmq

from regent import wire
from regent.wire import Kind
from regent.wire.security import (
    Credentials,
    load_credentials,
    secure_client,
    secure_server,
    stop_authenticator,
)


class RawPeer:
    def __init__(self, creds: Credentials | None = None):
        self.ctx = zmq.Context()
        self.creds = creds or load_credentials()
        self.inbox = self.ctx.socket(zmq.PULL)
        secure_server(self.inbox, self.creds, "127.0.0.1")
        port = self.inbox.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self._out: dict[str, zmq.Socket] = {}
        self._unread: collections.deque = collections.deque()  # the rest of a batch

    def out(self, address: str, secure: bool = True) -> zmq.Socket:
        sock = self._out.get(address)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.linger = 0
            if secure:
                secure_client(sock, self.creds)
            sock.connect(address)
            self._out[address] = sock
        return sock

    def send(self, address: str, frames: list) -> None:
        self.out(address).send_multipart(frames)

    def call(self, address: str, sid: str, epoch: int, seq: int, actor: str, method: str,
             args: tuple = (), kwargs: dict | None = None, point: int = 0) -> None:
        frames = wire.dumps((args, kwargs or {}))
        meta = {"sid": sid, "e": epoch, "s": seq, "a": actor, "m": method,
                "d": wire.digest(frames), "rt": self.address, "pt": point}
        self.send(address, wire.encode(Kind.CALL, meta, frames))

    def recv(self, timeout: float = 5.0) -> tuple[Kind, dict, object]:
        """The next message, batches unpacked: (kind, meta, decoded payload or None). A proc's
        forwarded output (LOG) is skipped: it goes to whoever last reached the proc, this peer
        included, whenever the proc writes a line."""
        deadline = time.monotonic() + timeout
        while True:
            if not self._unread:
                if not self.inbox.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                    raise TimeoutError(f"no message within {timeout} s")
                kind, meta, payload = wire.decode(self.inbox.recv_multipart(copy=False))
                if kind is Kind.BATCH:
                    self._unread.extend(wire.decode_one(sub) for sub in wire.split_batch(meta, payload))
                else:
                    self._unread.append((kind, meta, payload))
            kind, meta, payload = self._unread.popleft()
            if kind is not Kind.LOG:
                return kind, meta, wire.loads(payload) if payload else None

    def ask_host(self, host: str, sid: str, epoch: int, op: str, **fields) -> dict:
        meta = {"sid": sid, "e": epoch, "op": op, "n": 7, "rt": self.address, **fields}
        self.send(host, wire.encode(Kind.HOST_REQ, meta))
        while True:
            kind, reply, _ = self.recv()
            if kind is Kind.HOST_REP and reply.get("n") == 7:
                return reply

    def close(self) -> None:
        stop_authenticator(self.ctx)  # its thread polls the context's sockets: stopped first
        self.ctx.destroy(linger=0)
