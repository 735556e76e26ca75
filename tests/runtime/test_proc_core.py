"""The proc's core without IO (worker/proccore.py), driven by tables of messages: each row is
what arrives (or what a run the edge finished completes) and what the core must answer with.
No sockets, processes or clocks: the decisions alone, as test_engine.py checks the
controller's."""

from __future__ import annotations

import pytest

from regent.wire import Kind, ProtocolError
from regent.worker.proccore import Deliver, Mailbox, ProcCore, Reply

SID = "s1"
CTL = "tcp://127.0.0.1:5000"  # the controller
NEW = "tcp://127.0.0.1:5001"  # a newer controller
PEER = "tcp://127.0.0.1:6000"  # another proc, whose actor makes calls


def msg(kind: Kind, seq: int = 1, actor: str = "a", point: int = 0, method: str = "f", digest: bytes = b"d",
        epoch: int = 1, rt: str | None = CTL, origin: str = "", **extra) -> tuple[Kind, dict, list]:
    meta = {"sid": SID, "e": epoch, "s": seq, "a": actor, "pt": point, "m": method, "d": digest, **extra}
    if rt is not None:
        meta["rt"] = rt
    if origin:
        meta["o"] = origin
    return kind, meta, [b"args"]


def summary(effects: list) -> list[tuple]:
    """What each effect amounts to, for the tables."""
    out = []
    for e in effects:
        if isinstance(e, Reply):
            out.append(("reply", e.rt, e.kind.name, e.meta.get("st"), e.meta.get("s"), e.meta.get("o", "")))
        else:
            assert isinstance(e, Deliver)
            out.append(("deliver", e.kind.name, e.actor, e.seq, e.origin, e.restart))
    return out


def run(core: ProcCore, rows: list[tuple]) -> None:
    """rows: (what happens, expected summary). What happens is a message (kind, meta,
    payload) or ("complete", seq, actor, status[, origin])."""
    for i, (event, expected) in enumerate(rows):
        if event[0] == "complete":
            _, seq, actor, status, *origin = event
            got = core.complete(seq, actor, 0, status, [b"result"], o=origin[0] if origin else "")
        else:
            got = core.receive(*event)
        assert summary(got) == expected, f"row {i}: {event[:2]}"


def test_a_call_runs_once_its_repeats_join_it_and_later_ones_get_the_result_kept():
    run(ProcCore(SID, "p0"), [
        (msg(Kind.CALL, 1), [("deliver", "CALL", "a", 1, "", False)]),
        (msg(Kind.CALL, 1, rt=NEW), []),  # while it runs: a second caller waits for the same run
        (("complete", 1, "a", "ok"), [("reply", CTL, "RESULT", "ok", 1, ""), ("reply", NEW, "RESULT", "ok", 1, "")]),
        (msg(Kind.CALL, 1), [("reply", CTL, "RESULT", "ok", 1, "")]),  # a replaying controller: the kept result
        (msg(Kind.CALL, 1, actor="b"), [("deliver", "CALL", "b", 1, "", False)]),  # the same id at another actor
    ])


def test_an_id_reused_for_another_call_is_refused_as_a_divergence_and_nothing_runs():
    run(ProcCore(SID, "p0"), [
        (msg(Kind.CALL, 1, digest=b"x"), [("deliver", "CALL", "a", 1, "", False)]),
        (msg(Kind.CALL, 1, digest=b"y"), [("reply", CTL, "RESULT", "divergence", 1, "")]),
        (msg(Kind.CALL, 1, method="g", digest=b"x"), [("reply", CTL, "RESULT", "divergence", 1, "")]),
        (msg(Kind.STOP, 1, method="__stop__"), [("reply", CTL, "RESULT", "divergence", 1, "")]),
    ])


def test_a_deposed_controller_is_fenced_and_an_actors_call_refused_carries_its_origin():
    core = ProcCore(SID, "p0", epoch=1)
    run(core, [
        (msg(Kind.CALL, 1, epoch=2, rt=NEW), [("deliver", "CALL", "a", 1, "", False)]),
        (msg(Kind.CALL, 2, epoch=1), [("reply", CTL, "RESULT", "fenced", 2, "")]),
        (msg(Kind.CALL, 0, epoch=1, rt=PEER, origin="b.0.1"), [("reply", PEER, "RESULT", "fenced", 0, "b.0.1")]),
        (msg(Kind.SPAWN, 3, epoch=1, restart=True, inc=2), [("reply", CTL, "RESULT", "fenced", 3, "")]),
        (msg(Kind.CALL, 3, epoch=1, rt=None), []),  # nobody to tell
    ])
    assert core.fence.epoch == 2 and core.fence.rejected == 4


def test_output_goes_to_the_newest_controller_admitted_never_to_an_actor_that_calls():
    core = ProcCore(SID, "p0")
    core.receive(*msg(Kind.CALL, 1))
    assert core.log_to == CTL
    core.receive(*msg(Kind.CALL, 1, rt=PEER, origin="b.0.1"))
    assert core.log_to == CTL
    core.receive(*msg(Kind.WATERMARK, epoch=2, rt=NEW, dw=-1, cw=-1))
    assert core.log_to == NEW
    core.receive(*msg(Kind.CALL, 5, epoch=1))  # deposed: refused, and not where output goes
    assert core.log_to == NEW


def test_an_actors_calls_are_kept_apart_from_the_controllers_under_the_same_seq():
    run(ProcCore(SID, "p0"), [
        (msg(Kind.CALL, 4), [("deliver", "CALL", "a", 4, "", False)]),
        (msg(Kind.CALL, 4, rt=PEER, origin="b.0.1"), [("deliver", "CALL", "a", 4, "b.0.1", False)]),
        (("complete", 4, "a", "ok", "b.0.1"), [("reply", PEER, "RESULT", "ok", 4, "b.0.1")]),
        (msg(Kind.CALL, 4, rt=PEER, origin="b.0.1"), [("reply", PEER, "RESULT", "ok", 4, "b.0.1")]),
        (("complete", 4, "a", "err"), [("reply", CTL, "RESULT", "err", 4, "")]),
    ])


def test_spawns_and_stops_are_deduped_and_a_supervisors_restart_is_not():
    run(ProcCore(SID, "p0"), [
        (msg(Kind.SPAWN, 1, method="__init__"), [("deliver", "SPAWN", "a", 1, "", False)]),
        (("complete", 1, "a", "ok"), [("reply", CTL, "RESULT", "ok", 1, "")]),
        (msg(Kind.SPAWN, 1, method="__init__"), [("reply", CTL, "RESULT", "ok", 1, "")]),
        (msg(Kind.SPAWN, -1, method="__init__", restart=True, inc=1), [("deliver", "SPAWN", "a", -1, "", True)]),
        (msg(Kind.SPAWN, -1, method="__init__", restart=True, inc=1), [("deliver", "SPAWN", "a", -1, "", True)]),
        (msg(Kind.STOP, 2, method="__stop__"), [("deliver", "STOP", "a", 2, "", False)]),
        (msg(Kind.STOP, 2, method="__stop__"), []),
    ])


def test_a_watermark_releases_the_results_no_replay_can_need():
    core = ProcCore(SID, "p0")
    for seq in (1, 2, 3):
        core.receive(*msg(Kind.CALL, seq))
        core.complete(seq, "a", 0, "ok", [b"r"])
    assert len(core.dedupe) == 3
    assert core.receive(*msg(Kind.WATERMARK, dw=2, cw=-1)) == []
    assert len(core.dedupe) == 1
    pong = core.receive(Kind.PING, {"rt": CTL, "n": 7}, [])
    assert [(r.kind, r.meta["cached"], r.meta["n"]) for r in pong] == [(Kind.PONG, 1, 7)]


def test_a_fence_probe_is_answered_with_the_epoch_the_proc_holds():
    core = ProcCore(SID, "p0", epoch=3)
    (reply,) = core.receive(*msg(Kind.FENCE, epoch=5, n=9))
    assert (reply.kind, reply.meta["e"], reply.meta["n"]) == (Kind.PONG, 5, 9)
    (refused,) = core.receive(*msg(Kind.FENCE, epoch=4))
    assert refused.meta["st"] == "fenced" and refused.meta["e"] == 5


@pytest.mark.parametrize("kind, meta, error", [
    (Kind.CALL, {"sid": "other", "e": 1, "s": 1, "a": "a", "pt": 0, "m": "f", "d": b""}, "for session 'other'"),
    (Kind.CALL, {"sid": SID, "e": 1, "s": 1, "a": "a", "pt": 0, "m": "f", "d": b"", "rt": "not an address"},
     "bad reply address"),
    (Kind.RESULT, {"sid": SID, "e": 1}, "does not accept RESULT"),
])
def test_what_a_proc_cannot_take_is_a_protocol_error(kind, meta, error):
    with pytest.raises(ProtocolError, match=error):
        ProcCore(SID, "p0").receive(kind, meta, [])


def test_a_ping_without_a_valid_reply_address_is_dropped():
    assert ProcCore(SID, "p0").receive(Kind.PING, {"rt": "nowhere", "n": 1}, []) == []


def test_a_mailbox_hands_out_one_message_at_a_time_in_arrival_order():
    box = Mailbox()
    assert box.put("a1") is True  # idle: start on it
    assert box.take() == "a1" and box.busy
    assert box.put("b1") is False and box.put("a2") is False  # busy: queued behind it, in order
    assert [box.take(), box.take()] == ["b1", "a2"]
    assert box.take() is None and not box.busy  # drained: idle again
    assert box.put("c1") is True
    box.take()  # an async endpoint runs: the box stays busy (parked) until it is taken from again
    assert box.put("c2") is False
    assert box.clear() == ["c2"] and not box.busy and len(box) == 0
