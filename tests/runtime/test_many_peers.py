"""A controller of a thousand procs holds a socket (and a monitor) per proc and host: more than
zmq's default of 1,023 sockets per context, and descriptors above select's 1,024. The
transport's `context(sockets)` is sized for them; this is the limit hit without it."""

from __future__ import annotations

import resource

import zmq

from regent.wire.security import init_keys, load_credentials
from regent.wire.transport import Inbox, Outbox, context


def test_a_context_sized_for_a_thousand_peers_takes_more_than_zmqs_default(own_home) -> None:
    own_home()
    init_keys()
    creds = load_credentials()
    server = context(3000)
    assert server.get(zmq.MAX_SOCKETS) == 3000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard  # raised for the descriptors the sockets take
    inboxes = [Inbox(server, creds, "127.0.0.1") for _ in range(1100)]
    client = context(3000)
    out = Outbox(client, creds)
    try:
        # 1,100 peers: past zmq's default 1,023 sockets in one context
        assert len({id(out.peer(inbox.address)) for inbox in inboxes}) == 1100
    finally:
        out.close()
        for inbox in inboxes:
            inbox.close()
        client.destroy(linger=0)
        server.destroy(linger=0)


def test_a_default_context_keeps_zmqs_limit() -> None:
    ctx, plain = context(), zmq.Context()
    try:
        assert ctx.get(zmq.MAX_SOCKETS) == plain.get(zmq.MAX_SOCKETS)
    finally:
        ctx.destroy(linger=0)
        plain.destroy(linger=0)


def test_a_capped_outbox_stays_capped_when_every_peer_holds_an_unflushed_message(own_home) -> None:
    # Found in a fresh-clone run: an agent draining a burst of pings, each naming a new reply
    # address, queued a reply to every new peer before flushing any, so none could be closed to
    # make room and it held 500 peers past its cap of 256.
    own_home()
    init_keys()
    ctx = context()
    out = Outbox(ctx, load_credentials(), max_peers=4)
    try:
        for i in range(10):
            out.peer(f"tcp://127.0.0.1:{20000 + i}").queue([b"reply"])
            assert len(out.addresses()) <= 4
        assert out.addresses() == [f"tcp://127.0.0.1:{20000 + i}" for i in range(6, 10)]  # the most recent
        assert len(out.dirty) <= 4  # what was queued for a closed peer went with it
    finally:
        out.close()
        ctx.destroy(linger=0)
