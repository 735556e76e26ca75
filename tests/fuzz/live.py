"""Fuzzing a live proc and a live host agent over their real, authenticated sockets, shared by
tests/fuzz/test_live.py and bench/bench_fuzz.py: messages mutated from valid ones of every kind
the receiver accepts (and some from nothing) are sent from a RawPeer; what the receiver must
drop is worked out here with the same schema, so its log can be held to it. Messages that would
legitimately disrupt the session they were sent to are not sent (see `_disrupts`).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regent import wire
from regent.wire import Kind, schema
from tests.fuzz.targets import host_seeds, live_messages, proc_seeds, verdicts
from tests.runtime.rawpeer import RawPeer

DROPPED = "dropped malformed message"
FAILED = "failed to dispatch"  # a non-ProtocolError out of a receiver's dispatch: a missing check
SEQ = 1 << 40  # the fuzzed calls' ids, far from the session's own
OTHER_SESSION = "fuzz-other-session"


@dataclass
class LiveRun:
    """What was sent to a live receiver: messages sent, held back, and drops it owes."""

    sent: int = 0
    skipped: int = 0
    drops: int = 0
    seconds: float = 0.0


def _disrupts(sid: str, epoch: int, actor: str, kind: Kind, meta: dict) -> bool:
    """Whether a valid message would, as it should, disrupt the real session at a proc: raise
    its fence, release its results, take its call ids, stop or replace its actor."""
    if meta.get("sid") != sid:
        return False
    if meta.get("e", 0) > epoch or kind is Kind.WATERMARK:
        return True
    if kind in (Kind.CALL, Kind.STOP, Kind.SPAWN):
        return meta["s"] < SEQ // 2 or kind is not Kind.CALL and meta["a"] == actor
    return False


def _send(peer: RawPeer, address: str, receiver: Any, seeds: Any, n: int, seed: int,
          held_back: Callable[[Kind, dict], bool]) -> LiveRun:
    """Send `n` messages mutated from `seeds` to `address`, but those whose valid parts
    `held_back` names; count what `receiver` should drop."""
    run = LiveRun()
    started = time.perf_counter()
    for frames in live_messages(random.Random(seed), seeds, n):
        drops, valid = verdicts(receiver, frames)
        if any(held_back(k, m) for k, m in valid):
            run.skipped += 1
            continue
        peer.send(address, frames)
        run.drops += drops
        run.sent += 1
    run.seconds = time.perf_counter() - started
    return run


def fuzz_proc(peer: RawPeer, address: str, sid: str, epoch: int, actor: str, method: str, n: int,
              seed: int) -> LiveRun:
    """Send `n` fuzzed messages (fewer the disruptive ones) to the proc at `address`, which
    serves session `sid` at `epoch` and hosts `actor` (an echo endpoint `method`)."""
    seeds = proc_seeds(sid, epoch, peer.address, actor=actor, method=method, seq=SEQ)
    return _send(peer, address, schema.PROC, seeds, n, seed,
                 lambda k, m: _disrupts(sid, epoch, actor, k, m))


def fuzz_host(peer: RawPeer, address: str, sid: str, epoch: int, n: int, seed: int) -> LiveRun:
    """Send `n` fuzzed messages to the host agent at `address`, as another session than `sid`
    (a valid request for that one could stop its procs); spawn and respawn requests that would
    start procs are held back."""
    return _send(peer, address, schema.HOST, host_seeds(OTHER_SESSION, epoch, peer.address), n, seed,
                 lambda k, m: k is Kind.HOST_REQ and (m["op"] in ("spawn_procs", "respawn_proc")
                                                      or m["sid"] == sid))


def ping(peer: RawPeer, address: str, n: int, timeout: float = 30.0) -> dict:
    """A ping sent after everything else on the same connection, so answered after it all."""
    peer.send(address, wire.encode(Kind.PING, {"rt": peer.address, "n": n}))
    deadline = time.monotonic() + timeout
    while True:
        kind, meta, _ = peer.recv(timeout=max(0.1, deadline - time.monotonic()))
        if kind is Kind.PONG and meta.get("n") == n:
            return meta


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def log_lines(path: Path, needle: str, within: str | None = None, without: str | None = None) -> list[str]:
    """Lines of a log holding `needle` (and `within`, and not `without`)."""
    return [line for line in path.read_text(errors="replace").splitlines()
            if needle in line and (within is None or within in line) and (without is None or without not in line)]


def wait_for_lines(path: Path, needle: str, count: int, within: str | None = None, without: str | None = None,
                   timeout: float = 30.0) -> list[str]:
    """log_lines once there are `count` of them, or at the timeout (the receiver logs as it goes)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = log_lines(path, needle, within, without)
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)
