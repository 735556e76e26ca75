"""The two ends of an Accumulator folded on its hosts, without sockets: a folder's Folds
(worker/_folding.py) and the controller's expand and fold (controller/folding.py)."""

from __future__ import annotations

import operator

import pytest

from regent import wire
from regent.controller.core import Outcome, PendingCall
from regent.controller.engine import COLLECTED, Collect, Engine
from regent.controller.folding import expand, fold_metas, folded, groups, pickled_reducer
from regent.controller.refs import ProcRef, Wire
from regent.controller.replay import CALLS, CorruptRecord, ReplayIndex
from regent.controller.replay import expand as expand_records
from regent.journal import Record
from regent.wire import Kind
from regent.worker._folding import MAX_GROUPS, Folds

CTRL = "tcp://127.0.0.1:5000"
FN = pickled_reducer(0, operator.add)


def _folds() -> tuple[Folds, list]:
    sent: list = []
    return Folds(lambda rt, msg: sent.append((rt, wire.decode(msg))), lambda rt: sent.append(("agent", rt))), sent


def _call(seq: int, pts: list[int], epoch: int = 1, to: str = CTRL) -> dict:
    return {"s": seq, "e": epoch, "pt": pts[0], "sid": "s", "fg": {"to": to, "pts": pts, "fn": FN}}


def _result(seq: int, pt: int, value: object = None, st: str = "ok") -> tuple[dict, list]:
    return {"sid": "s", "s": seq, "a": "c", "pt": pt, "st": st}, wire.dumps(value) if value is not None else []


def test_a_folder_answers_once_every_point_is_in_even_those_that_came_before_its_call() -> None:
    folds, sent = _folds()
    folds.result(*_result(7, 2, 5))  # a member's result before the folder's own call
    folds.expect(_call(7, [0, 1, 2]), fence=1)
    folds.result(*_result(7, 0, 1))
    assert sent == []
    folds.result(*_result(7, 1, 2))
    folds.result(*_result(7, 1, 99))  # a repeat: ignored
    [(rt, (kind, meta, payload))] = sent
    assert rt == CTRL and kind is Kind.RESULT and meta["pt"] == 0 and meta["fp"] == [1, 2]
    assert wire.loads(payload) == 8 and folds.folded == 1
    folds.expect(_call(7, [0, 1, 2], epoch=2, to="tcp://127.0.0.1:6000"), fence=2)  # a new controller asks again
    assert sent[-1][0] == "tcp://127.0.0.1:6000" and sent[-1][1][1]["fp"] == [1, 2]
    folds.release(7)
    folds.expect(_call(7, [0, 1, 2], epoch=3), fence=3)
    assert len(sent) == 2  # forgotten: a fresh fold waits for its points again


def test_an_error_or_a_failing_reducer_goes_on_unfolded_point_by_point() -> None:
    folds, sent = _folds()
    folds.expect(_call(1, [0, 1]), fence=1)
    folds.result(*_result(1, 1, st="err"))
    folds.result(*_result(1, 0, 3))
    assert [(m["pt"], m["st"], "fp" in m) for _, (_, m, _) in sent] == [(0, "ok", False), (1, "err", False)]
    sent.clear()
    bad = _call(2, [0, 1])
    bad["fg"]["fn"] = pickled_reducer(0, operator.truediv)
    folds.expect(bad, fence=1)
    folds.result(*_result(2, 0, 1))
    folds.result(*_result(2, 1, 2))  # 0 / 1 / 2 is fine; but a ZeroDivisionError below is not
    assert "fp" in sent[0][1][1]
    sent.clear()
    zero = _call(3, [0, 1])
    zero["fg"]["fn"] = pickled_reducer(1, operator.floordiv)
    folds.expect(zero, fence=1)
    folds.result(*_result(3, 0, 0))
    folds.result(*_result(3, 1, 5))  # 1 // 0 raises: the controller folds and raises it
    assert [m["pt"] for _, (_, m, _) in sent] == [0, 1] and not any("fp" in m for _, (_, m, _) in sent)


def test_a_deposed_controllers_fold_and_a_malformed_group_are_ignored_and_folds_are_bounded() -> None:
    folds, sent = _folds()
    folds.expect(_call(1, [0, 1], epoch=1), fence=2)
    folds.expect({**_call(2, [1, 0]), "pt": 0}, fence=1)  # not led by the folder's own point
    folds.expect(_call(3, [0, 1, 1]), fence=1)
    for seq in (1, 2, 3):
        folds.result(*_result(seq, 0, 1))
        folds.result(*_result(seq, 1, 1))
    assert sent == []
    for seq in range(10, 10 + MAX_GROUPS + 5):
        folds.expect(_call(seq, [0, 1]), fence=1)
    folds.result(*_result(10, 0, 1))
    folds.result(*_result(10, 1, 1))
    assert sent == []  # the oldest was given up: its controller sends the call again unfolded


def _procs() -> list[ProcRef]:
    return [ProcRef(f"p{i}", i, f"tcp://127.0.0.1:{7000 + i}", 100 + i, host=f"h{i // 3}") for i in range(7)]


def test_the_controller_folds_each_host_with_two_points_or_more_and_sends_unfolded_once_one_dies() -> None:
    procs = _procs()
    folds = groups(procs, range(7))
    assert folds == {0: (0, 1, 2), 3: (3, 4, 5)}  # host h2 has one point: it answers as for call()
    metas = fold_metas(procs, folds, FN, CTRL, relay=True)
    assert metas[6] == {} and metas[1] == {"rt": procs[0].address, "fo": True, "rv": False}
    assert metas[3]["fg"] == {"to": CTRL, "pts": [3, 4, 5], "fn": FN, "rv": True}
    w = Wire(Kind.CALL, {"sid": "s", "rt": CTRL}, wire.dumps(None), metas, procs, 0.0, 3.0, many=True, folds=folds)
    assert wire.decode(w.message(4))[1]["rt"] == procs[3].address
    procs[3].alive = False
    assert wire.decode(w.message(4))[1]["rt"] == CTRL and "fo" not in wire.decode(w.message(4))[1]
    w.unfolded.add(0)
    assert wire.decode(w.message(1))[1]["rt"] == CTRL


def test_expand_gives_each_folded_point_an_outcome_or_drops_a_fold_that_does_not_match() -> None:
    procs = _procs()
    folds = groups(procs, range(6))
    call = PendingCall(9, "call", "c", "m", {r: procs[r].id for r in range(6)})
    call.wire = Wire(Kind.CALL, {}, [], None, procs, 0.0, 3.0, folds=folds)
    fold = (Kind.RESULT, {"sid": "s", "s": 9, "a": "c", "pt": 0, "st": "ok", "fp": [1, 2]}, [b"x"])
    out = expand({9: call}, [fold])
    assert [(m["pt"], m.get("fp"), m.get("fd"), p) for _, m, p in out] == [
        (0, [1, 2], None, [b"x"]), (1, None, 0, []), (2, None, 0, [])]
    wrong = (Kind.RESULT, {**fold[1], "fp": [1]}, [b"x"])  # not the group sent
    assert expand({9: call}, [wrong]) == [] and expand({}, [fold]) == []
    call.results[2] = object()  # answered unfolded already
    assert expand({9: call}, [fold, (Kind.PONG, {}, [])]) == [(Kind.PONG, {}, [])]


def test_a_fold_of_host_folds_and_plain_values_is_the_fold_of_every_value() -> None:
    values = {0: 5, 1: 7, 2: None, 3: 1}  # point 0 holds its host's fold of itself and point 2
    assert folded(values, {2}, [0, 1, 2, 3], 0, operator.add) == 13
    assert pickled_reducer(0, lambda a, v: a + v) is not None  # cloudpickle takes a lambda


def test_a_hosts_fold_is_one_journal_item_read_back_as_an_outcome_per_point() -> None:
    engine = Engine("s", None)
    call = PendingCall(4, "call", "c", "m", {0: "p0", 1: "p1", 2: "p2"})
    folder = Outcome("ok", {"s": 4, "pt": 0, "st": "ok", "fp": [1, 2]}, [b"v"])
    member = Outcome("ok", {"s": 4, "pt": 1, "st": "ok", "fd": 0}, [])
    item = engine.outcome_record(call, 0, folder, 1, 9.0)
    assert isinstance(item, Collect) and item.item == (4, 0, [b"v"], 9.0, [1, 2])
    assert engine.outcome_record(call, 1, member, 0, 9.0) is None and member.lsn == COLLECTED
    rec = Record(3, 1, CALLS, {"items": [[4, "call", "c", "m", b"", [0, 1, 2], 8.0], list(item.item)]}, 9.0)
    results = ReplayIndex([rec]).calls[4].results
    assert {p: r["v"] for p, r in results.items()} == {0: (b"v",), 1: (), 2: ()}
    assert results[0]["x"] == {"fp": [1, 2]}  # what the sink reads the folded points from
    assert [r.data["pt"] for r in expand_records([rec]) if r.kind == "result"] == [0, 1, 2]
    bad = Record(3, 1, CALLS, {"items": [[4, 0, [b"v"], 9.0, ["x"]]]}, 9.0)
    with pytest.raises(CorruptRecord, match="neither a call nor a value"):
        ReplayIndex([bad])
