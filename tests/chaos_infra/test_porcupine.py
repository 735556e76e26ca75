"""The independent linearizability checker: regent-porcupine (Porcupine, in Go) on hand-written
key-value histories, the merge of several controller processes' records into one history, and
the workload's register, whose writes survive its proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from regent.chaos.linearizability import (
    HistoryEvent,
    HistoryLog,
    Operation,
    check_history,
    check_operations,
    merge_history,
    read_history,
)
from tests.support.porcupine import porcupine_binary


@pytest.fixture(scope="module")
def porcupine() -> Path:
    return porcupine_binary()


def put(id: str, call: int, ret: int | None, key: str, value, client: str = "a") -> Operation:
    return Operation(id, client, call, ret, {"op": "put", "key": key, "value": value})


def append(id: str, call: int, ret: int | None, key: str, value: str, client: str = "a") -> Operation:
    return Operation(id, client, call, ret, {"op": "append", "key": key, "value": value})


def get(id: str, call: int, ret: int | None, key: str, output, client: str = "a") -> Operation:
    return Operation(id, client, call, ret, {"op": "get", "key": key}, output)


# --- the Go checker --------------------------------------------------------------------------------

def test_a_linearizable_history_with_concurrent_calls_on_two_keys_is_ok(porcupine):
    ops = [
        put("w1", 0, 10, "x", 1),
        get("r1", 5, 15, "x", None, client="b"),  # overlaps the put: may read before it
        put("w2", 20, 30, "x", 2),
        get("r2", 25, 35, "x", 1, client="b"),  # overlaps the second put: may read before it
        get("r3", 40, 50, "x", 2),
        put("y1", 0, 1, "y", "a"),
        get("y2", 2, 3, "y", "a"),
    ]
    v = check_operations(ops, binary=porcupine)
    assert v.result == "ok" and v.ok, v
    assert v.operations == 7 and v.pending == 0
    assert v.keys["x"]["operations"] == 5 and v.keys["y"]["operations"] == 2
    assert "porcupine v1." in v.checker


def test_a_stale_read_after_a_newer_write_returned_is_illegal(porcupine):
    ops = [put("w1", 0, 10, "x", 1), put("w2", 20, 30, "x", 2), get("r", 40, 50, "x", 1),
           put("y1", 0, 10, "y", 7), get("y2", 40, 50, "y", 7)]
    v = check_operations(ops, binary=porcupine)
    assert v.result == "illegal" and not v.ok and v.failed
    assert v.illegal_keys == ["x"], v  # y, checked apart, is fine
    assert v.keys["x"]["linearizable"] is False and v.keys["y"]["linearizable"] is True


def test_a_lost_write_is_illegal(porcupine):
    ops = [put("w1", 0, 10, "x", 1), get("r", 20, 30, "x", None)]
    assert check_operations(ops, binary=porcupine).result == "illegal"


def test_an_append_applied_twice_is_illegal_and_once_is_ok(porcupine):
    once = [append("a1", 0, 10, "log", "a;"), append("a2", 20, 30, "log", "b;"), get("r", 40, 50, "log", "a;b;")]
    twice = [*once[:2], get("r", 40, 50, "log", "a;a;b;")]
    reordered = [*once[:2], get("r", 40, 50, "log", "b;a;")]
    assert check_operations(once, binary=porcupine).result == "ok"
    assert check_operations(twice, binary=porcupine).result == "illegal"
    assert check_operations(reordered, binary=porcupine).result == "illegal"


def test_a_call_that_never_returned_may_take_effect_or_not_but_not_before_it_was_issued(porcupine):
    pending = put("w", 20, None, "x", 1)
    took_effect = [pending, get("r", 30, 40, "x", 1)]
    did_not = [pending, get("r", 30, 40, "x", None), get("r2", 50, 60, "x", None)]
    too_early = [pending, get("r", 0, 10, "x", 1)]
    flip_flop = [pending, get("r", 30, 40, "x", 1), get("r2", 50, 60, "x", None)]
    for ops, want in ((took_effect, "ok"), (did_not, "ok"), (too_early, "illegal"), (flip_flop, "illegal")):
        v = check_operations(ops, binary=porcupine)
        assert v.result == want, (ops, v)
        assert v.pending == 1
    # A read that never returned says nothing.
    assert check_operations([put("w", 0, 1, "x", 1), get("r", 2, None, "x", None)], binary=porcupine).ok


def test_the_checker_writes_porcupines_visualization_and_refuses_bad_input(porcupine, tmp_path):
    html = tmp_path / "x.html"
    v = check_operations([put("w", 0, 1, "x", 1), get("r", 2, 3, "x", 2)], binary=porcupine, html=html)
    assert v.result == "illegal" and v.visualization == str(html)
    assert "<html" in html.read_text()[:2000].lower()
    bad = '{"id": "c", "call": 1, "return": 2, "input": {"op": "cas", "key": "x"}}\n'
    done = subprocess.run([str(porcupine)], input=bad, capture_output=True, text=True, timeout=30)
    assert done.returncode == 3 and 'unknown op "cas"' in done.stderr, done
    backwards = '{"id": "b", "call": 5, "return": 2, "input": {"op": "get", "key": "x"}, "output": {}}'
    done = subprocess.run([str(porcupine)], input=backwards, capture_output=True, text=True, timeout=30)
    assert done.returncode == 3 and "before its call" in done.stderr, done


def test_the_checker_reads_json_lines_and_exits_with_its_verdict(porcupine, tmp_path):
    lines = [
        {"id": "w", "client": 0, "call": 1, "return": 2, "input": {"op": "put", "key": "k", "value": "1"}},
        {"id": "r", "client": 0, "call": 3, "return": 4, "input": {"op": "get", "key": "k"}, "output": {"value": "1"}},
    ]
    path = tmp_path / "h.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = subprocess.run([str(porcupine), str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == "ok", done
    lines[1]["output"] = {"value": "2"}
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = subprocess.run([str(porcupine), str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and json.loads(done.stdout)["illegal_keys"] == ["k"], done


# --- merging what several controller processes saw -----------------------------------------------

def _event(t: int, kind: str, op: str, input: dict, output=None, pid: int = 1, run: str = "s.r1") -> HistoryEvent:
    return HistoryEvent(t, kind, op, run, "program", pid, False, input, output)


def test_merge_keeps_the_earliest_invocation_and_the_earliest_answer_across_processes():
    w = {"op": "put", "key": "x", "value": 1}
    r = {"op": "get", "key": "x"}
    events = [
        _event(10, "invoke", "p0.0", w, pid=1),  # the primary issues it and dies
        _event(50, "invoke", "p0.0", w, pid=2),  # the standby, replaying, issues it again
        _event(51, "ok", "p0.0", w, None, pid=2),
        _event(52, "invoke", "g1.0", r, pid=2),
        _event(53, "ok", "g1.0", r, 1, pid=2),
        _event(54, "invoke", "p2.0", w | {"value": 2}, pid=2),
        _event(55, "unknown", "p2.0", w | {"value": 2}, pid=2),  # SupervisionError: may have run
        _event(5, "invoke", "p0.0", w, pid=3, run="s.other"),  # another run of the session
    ]
    hist = merge_history(events, run="s.r1")
    by_id = {op.id: op for op in hist.operations}
    assert (by_id["p0.0"].call_ns, by_id["p0.0"].return_ns) == (10, 51)
    assert (by_id["g1.0"].call_ns, by_id["g1.0"].return_ns, by_id["g1.0"].output) == (52, 53, 1)
    assert by_id["p2.0"].return_ns is None  # never returned
    assert hist.unknown_outcomes == 1 and hist.processes == 2 and not hist.conflicts
    # The primary's answer, when it has one, is the earlier: it wins.
    hist = merge_history([*events, _event(20, "ok", "p0.0", w, None, pid=1)], run="s.r1")
    assert {op.id: op for op in hist.operations}["p0.0"].return_ns == 20


def test_the_earliest_invocation_is_what_makes_a_takeover_history_linearizable(porcupine):
    """Another client read x=1 while the standby had not yet issued the put again: only the
    primary's earlier invocation explains it. Narrowing the interval to the standby's would make
    a correct history look illegal; the merge widens instead."""
    w = {"op": "put", "key": "x", "value": 1}
    events = [_event(10, "invoke", "p0.0", w, pid=1), _event(50, "invoke", "p0.0", w, pid=2),
              _event(51, "ok", "p0.0", w, None, pid=2)]
    reader = get("other", 20, 30, "x", 1, client="other")
    merged = merge_history(events).operations
    assert check_operations([*merged, reader], binary=porcupine).result == "ok"
    narrowed = [Operation("p0.0", "program", 50, 51, w)]
    assert check_operations([*narrowed, reader], binary=porcupine).result == "illegal"


def test_two_different_answers_to_one_call_are_a_conflict():
    r = {"op": "get", "key": "x"}
    hist = merge_history([_event(1, "invoke", "g", r), _event(2, "ok", "g", r, 1, pid=1),
                          _event(3, "ok", "g", r, 2, pid=2)])
    assert len(hist.conflicts) == 1 and "answered differently" in hist.conflicts[0]
    hist = merge_history([_event(1, "invoke", "g", r), _event(2, "invoke", "g", {"op": "get", "key": "y"})])
    assert "different inputs" in hist.conflicts[0]


def test_history_logs_of_two_processes_merge_into_one_checked_history(porcupine, tmp_path):
    """Two HistoryLog files as two controllers write them: the primary's last put never got its
    answer (it died), the standby replays it and sees the answer; a torn last line is dropped."""
    primary, standby = HistoryLog(tmp_path, "s.r1"), HistoryLog(tmp_path, "s.r1")
    w, r = {"op": "put", "key": "k0", "value": 0}, {"op": "get", "key": "k0"}
    primary.invoke("p0.0", w)
    primary.ok("p0.0", w, None)
    primary.invoke("p2.0", w | {"value": 2})
    standby.invoke("p0.0", w, replaying=True)
    standby.ok("p0.0", w, None, replaying=True)
    standby.invoke("p2.0", w | {"value": 2}, replaying=True)
    standby.ok("p2.0", w | {"value": 2}, None, replaying=True)
    standby.invoke("g3.0", r)
    standby.ok("g3.0", r, 2)
    primary.close()
    standby.close()
    with open(primary.path, "a") as f:
        f.write('{"t": 1, "ev": "ok", "op": "p2.0"')  # the write the primary died in
    events, bad = read_history(tmp_path)
    assert len(events) == 9 and bad == []
    v = check_history(tmp_path, run="s.r1")
    assert v.ok and v.operations == 3 and v.pending == 0 and v.processes == 2, v.summary()
    assert v.summary().startswith("ok, 3 ops")
    # The same two files, but the standby read an older value after the write returned.
    stale = HistoryLog(tmp_path, "s.r1")
    stale.invoke("g4.0", r)
    stale.ok("g4.0", r, 0)
    stale.close()
    v = check_history(tmp_path, run="s.r1")
    assert v.result == "illegal" and v.failed and v.illegal_keys == ["k0"], v.summary()


def test_an_unreadable_line_inside_a_history_file_fails_the_verdict(porcupine, tmp_path):
    log = HistoryLog(tmp_path, "s.r1")
    log.invoke("p0.0", {"op": "put", "key": "k", "value": 1})
    log.close()
    with open(log.path, "a") as f:
        f.write("not json\n")
    v = check_history(tmp_path)
    assert v.result == "ok" and v.failed and "unreadable" in v.conflicts[0]


def test_no_history_at_all_is_not_checked_rather_than_passed(tmp_path):
    v = check_history(tmp_path / "none")
    assert v.result == "unchecked" and not v.failed and "no register history" in v.summary()


# --- the workload's register ---------------------------------------------------------------------

def test_the_register_keeps_its_writes_across_a_sigkill_of_its_proc(tmp_path):
    from regent.chaos.ledger import read_ledger
    from regent.chaos.programs.workload import Register
    from regent.controller import Session, SupervisionError
    from regent.worker.supervision import RestartPolicy

    ledger, state = tmp_path / "ledger", tmp_path / "state"
    with Session("register-restart") as s:
        kv = s.spawn_procs(per_host={"procs": 1}).spawn(
            "kv", Register, str(ledger), str(state), restart=RestartPolicy(restart="permanent"))
        kv.put.call_one("p0", "x", 1).get(timeout=10)
        kv.append.call_one("a1", "y", "a;").get(timeout=10)
        kv.append.call_one("a2", "y", "b;").get(timeout=10)
        (pid,) = {e.pid for e in read_ledger(ledger)}
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        for n in range(1000):
            try:
                got = (kv.get.call_one(f"g{n}", "x").get(timeout=10), kv.get.call_one(f"h{n}", "y").get(timeout=10))
                break
            except SupervisionError:
                assert time.monotonic() < deadline, "the register's proc was not restarted"
                time.sleep(0.05)
    assert got == (1, "a;b;")
    runs = read_ledger(ledger)
    assert {e.incarnation for e in runs if e.method == "get"} == {1} and {e.pid for e in runs} - {pid}


def test_a_register_call_past_its_deadline_is_waited_for_not_issued_again(porcupine, tmp_path):
    """A second put issued while the first is still outstanding could land after later writes;
    the workload waits for the same call instead, and the history holds one operation."""
    import threading

    from regent.chaos.faults import pause, resume
    from regent.chaos.ledger import read_ledger
    from regent.chaos.programs.workload import Register, Registers
    from regent.controller import Session

    ledger = tmp_path / "ledger"
    with Session("register-deadline") as s:
        kv = s.spawn_procs(per_host={"procs": 1}).spawn("kv", Register, str(ledger), str(tmp_path / "state"))
        retries = {"supervision": 0, "timeout": 0}
        regs = Registers(s, kv, 1, 0.3, HistoryLog(tmp_path / "history", s.sid), retries)
        regs.call("p0", "put", "k0", 0)
        (pid,) = {e.pid for e in read_ledger(ledger)}
        pause(pid)
        threading.Timer(1.2, resume, args=(pid,)).start()
        regs.call("p1", "put", "k0", 1)
        assert regs.call("g2", "get", "k0") == 1
    assert retries["waited_again"] >= 2 and retries["supervision"] == 0
    events, _ = read_history(tmp_path / "history")
    assert sorted({e.op for e in events}) == ["g2.0", "p0.0", "p1.0"]  # one token each: never issued again
    assert [e.kind for e in events if e.op == "p1.0"][0] == "invoke"
    assert {e.kind for e in events if e.op == "p1.0"} == {"invoke", "timeout", "ok"}
    v = check_history(tmp_path / "history", run=s.sid)
    assert v.ok and v.operations == 3 and v.pending == 0, v.summary()
