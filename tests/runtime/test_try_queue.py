"""Peer.try_queue: a message the next one supersedes (the controller's release watermark to a
relaying agent) joins the peer's batch, keeps its order among the peer's other messages, and is
given up (False) rather than waited for where the batch would have to go to a full peer."""

from __future__ import annotations

import time

import zmq

from regent.wire import Kind, decode, encode, split_batch
from regent.wire.security import init_keys, load_credentials
from regent.wire.transport import Inbox, Outbox, context, wait_until


def _received(inbox: Inbox, want: int) -> tuple[int, list[int]]:
    """(messages on the wire, the "i" of every message they carry), once `want` are in."""
    wires, seen = 0, []

    def more() -> bool:
        nonlocal wires
        for frames in inbox.pending():
            wires += 1
            kind, meta, payload = decode(frames)
            for sub in split_batch(meta, payload) if kind is Kind.BATCH else [frames]:
                seen.append(decode(sub)[1]["i"])
        return len(seen) >= want

    assert wait_until(more, 10.0), seen
    return wires, seen


def _msg(i: int) -> list:
    return encode(Kind.WATERMARK, {"sid": "s", "e": 1, "dw": i, "cw": i, "i": i})


def test_try_queued_messages_go_in_one_batch_in_order_with_the_rest(own_home) -> None:
    own_home()
    init_keys()
    creds = load_credentials()
    ctx = context()
    inbox = Inbox(ctx, creds, "127.0.0.1")
    out = Outbox(ctx, creds)
    added = []
    out.dirty.on_add = lambda: added.append(1)
    try:
        peer = out.peer(inbox.address)
        peer.queue(_msg(0))
        assert all(peer.try_queue(_msg(i)) for i in range(1, 8))
        assert len(added) == 1  # one batch begun, one wake-up for whoever flushes it
        peer.send(_msg(8))  # goes after what is queued
        assert _received(inbox, 9) == (2, list(range(9)))
        assert not out.dirty
    finally:
        out.close()
        inbox.close()
        ctx.destroy(linger=0)


def test_try_queue_gives_up_on_a_full_peer_without_waiting(own_home) -> None:
    own_home()
    init_keys()
    creds = load_credentials()
    ctx = context()
    with zmq.Context() as probe:  # a port with nobody behind it: zmq queues up to the HWM
        s = probe.socket(zmq.PULL)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        s.close(linger=0)
    out = Outbox(ctx, creds)
    try:
        peer = out.peer(f"tcp://127.0.0.1:{port}")
        filled = 0
        while peer.try_send(_msg(filled)) and filled < 1_000_000:  # up to the HWM
            filled += 1
        assert filled < 1_000_000
        t0 = time.monotonic()
        results = [peer.try_queue(_msg(i)) for i in range(5000)]
        assert time.monotonic() - t0 < 5.0
        assert not all(results)  # once the batch had to go, nothing more was taken
        assert len(peer._queued) < 5000
    finally:
        out.close()
        ctx.destroy(linger=0)
