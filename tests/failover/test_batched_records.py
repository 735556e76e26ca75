"""Under a pipelined load the journal holds calls and results in compact records (CALLS: the
call records collected by the writer; RESULTS: a batch of replies as a worker sent it), and
every reader sees them call by call through replay.expand: the replay index, the timeline,
the exports and the chaos checker."""

from __future__ import annotations

import collections
import os
import time

from regent import wire
from regent.chaos.checker import run_records
from regent.controller import Session
from regent.controller.export import export_jsonl
from regent.controller.replay import CALL, CALLS, RESULT, RESULTS, ReplayIndex, expand
from regent.controller.timeline import timeline
from regent.journal import open_journal
from regent.worker import Actor, endpoint
from tests.runtime.rawpeer import RawPeer

BURST = 400
# These tests are about records, not leases: a lease that a loaded machine (six test workers on
# two cores) keeps renewing; the default 2 s lapsed once in a fresh-clone run.
LEASE_S = 10.0


class Echo(Actor):
    @endpoint
    def echo(self, i: int) -> int:
        return i * 10


def _burst(tmp_path) -> tuple[str, str, list[int], int]:
    url = f"sqlite://{tmp_path / 'j.db'}"
    name = f"batched-{os.getpid()}"
    with Session(name, journal=url, lease_ttl_s=LEASE_S) as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("e", Echo)
        first = s.core.next_seq
        futures = [mesh.slice(procs=i % 2).echo.call_one(i) for i in range(BURST)]
        values = [f.get(timeout=30) for f in futures]
    return url, name, values, first


def _verified_records(url: str, name: str) -> list:
    """The session's stored records, after `journal verify` found nothing wrong."""
    j = open_journal(url)
    try:
        assert j.verify(name).ok
        return list(j.read(name))
    finally:
        j.close()


def test_a_pipelined_burst_is_journaled_in_few_records_and_reads_back_call_by_call(tmp_path):
    url, name, values, first = _burst(tmp_path)
    assert values == [i * 10 for i in range(BURST)]
    raw = _verified_records(url, name)
    kinds = collections.Counter(r.kind for r in raw)
    assert kinds[CALLS] >= 1 and kinds[RESULTS] >= 1, kinds
    assert len(raw) < BURST, f"{len(raw)} records for {BURST} calls: {kinds}"

    records = list(expand(raw))
    calls = {r.data["s"]: r.data for r in records if r.kind == CALL and r.data["s"] >= first}
    results = {(r.data["s"], r.data["pt"]): r.data for r in records if r.kind == RESULT and r.data["s"] >= first}
    assert sorted(calls) == list(range(first, first + BURST))
    for i in range(BURST):
        d = calls[first + i]
        assert (d["k"], d["a"], d["m"], d["pts"]) == ("call_one", "e", "echo", [i % 2])
        assert wire.loads(results[(first + i, i % 2)]["v"]) == i * 10
    assert len(results) == BURST  # each reply once, though a batch record holds many

    index = ReplayIndex(raw)  # what a standby replays from
    for i in range(BURST):
        jc = index.calls[first + i]
        assert jc.method == "echo" and wire.loads(jc.results[i % 2]["v"]) == i * 10


def test_the_tools_read_batched_records_call_by_call(tmp_path):
    url, name, _, first = _burst(tmp_path)
    j = open_journal(url)
    try:
        raw = list(j.read(name))
    finally:
        j.close()
    lines = list(timeline(raw))
    assert sum(" call_one e.echo -> points" in line for line in lines) == BURST
    assert sum("e[" in line and "].echo ok" in line for line in lines) == BURST
    exported = list(export_jsonl(raw))
    assert sum('"kind": "call"' in line and '"echo"' in line for line in exported) == BURST
    checked = run_records(raw, None)
    assert sum(1 for r in checked if r.kind == RESULT and r.data["s"] >= first) == BURST


def test_a_results_record_that_holds_no_batch_of_replies_is_named_as_corrupt():
    import pytest

    from regent.journal import CorruptRecord, Record

    single = wire.encode(wire.Kind.RESULT, {"s": 1, "pt": 0, "st": "ok"}, [b"x"])
    for data in ({"b": [b"\x00garbage"]}, {"b": [bytes(f) for f in single]}, {}):
        with pytest.raises(CorruptRecord, match="lsn 7.*does not hold a batch of replies"):
            list(expand([Record(7, 1, RESULTS, data, 0.0)], "s"))


def test_values_answering_calls_one_by_one_are_items_of_the_calls_records_after_their_calls(tmp_path):
    """A read-then-call loop: each reply comes alone, and its value is journaled as an item of
    the CALLS stream (no record of its own), after its call's item, read back as a RESULT."""
    url = f"sqlite://{tmp_path / 'j.db'}"
    name = f"collected-{os.getpid()}"
    with Session(name, journal=url, lease_ttl_s=LEASE_S) as s:
        one = s.spawn_procs(per_host={"procs": 1}).spawn("e", Echo).slice(procs=0)
        first = s.core.next_seq
        values = [one.echo.call_one(i).get() for i in range(60)]  # no deadline: see test_read_results_durable
    assert values == [i * 10 for i in range(60)]
    raw = _verified_records(url, name)
    # Not a record per call or value (120 items): a value's item shares a group commit with the
    # next call's, so at most about one record per call, plus the session's few of its own. How
    # many the 60 make below that depends on how the machine's load spaces the group commits (16
    # under a loaded full suite, 40 and 42 in others), not on the design.
    assert len(raw) < 60 + 12, collections.Counter(r.kind for r in raw)
    assert not [r for r in raw if r.kind == RESULT and r.data["s"] >= first]
    # In stream order: each call's item, later its value's.
    order = [(r.kind, r.data["s"]) for r in expand(raw) if r.kind in (CALL, RESULT) and r.data["s"] >= first]
    assert order == [(kind, first + i) for i in range(60) for kind in (CALL, RESULT)]
    results = {r.data["s"]: r.data for r in expand(raw) if r.kind == RESULT and r.data["s"] >= first}
    assert [wire.loads(results[first + i]["v"]) for i in range(60)] == values
    index = ReplayIndex(raw)
    assert [wire.loads(index.calls[first + i].results[0]["v"]) for i in range(60)] == values


def test_a_calls_item_that_is_neither_a_call_nor_a_value_is_named_as_corrupt():
    import pytest

    from regent.journal import CorruptRecord, Record

    for item in ([1, 2], ["s", 0, [b"x"], 0.0], [1, 0, 5, 0.0]):
        with pytest.raises(CorruptRecord, match="lsn 7.*neither a call nor a value"):
            list(expand([Record(7, 1, CALLS, {"items": [item]}, 0.0)], "s"))
        with pytest.raises(CorruptRecord, match="lsn 7.*neither a call nor a value"):
            ReplayIndex([Record(7, 1, CALLS, {"items": [item]}, 0.0)])


class Gate(Actor):
    @endpoint
    def hold(self, i: int) -> str:
        time.sleep(3.0)  # long enough for the hand-made replies below to answer first
        return f"worker {i}"


def test_a_reply_that_carries_fields_named_like_the_controllers_own_is_journaled_all_the_same(tmp_path):
    """Reply metadata comes from the network: whatever keys it holds, it cannot tell the
    controller that a result is already journaled (alone, or in a batch)."""
    url = f"sqlite://{tmp_path / 'j.db'}"
    name = f"spoof-{os.getpid()}"
    spoof = {"_journaled": True, "_batch_lsn": 0, "_lsn": 0, "lsn": 0, "journaled": True}
    peer = RawPeer()
    try:
        with Session(name, journal=url, lease_ttl_s=LEASE_S) as s:
            one = s.spawn_procs(per_host={"procs": 1}).spawn("g", Gate).slice(procs=0)
            futures = [one.hold.call_one(i) for i in range(3)]
            seqs = [f.tag for f in futures]

            def reply(i: int) -> list:
                meta = {"sid": s.sid, "s": seqs[i], "a": "g", "pt": 0, "st": "ok", **spoof}
                return wire.encode(wire.Kind.RESULT, meta, wire.dumps(f"peer {i}"))

            peer.send(s.runtime.reply_address, reply(0))  # alone
            peer.send(s.runtime.reply_address, wire.encode_batch([reply(1), reply(2)]))  # a batch
            assert [f.get(timeout=10) for f in futures] == ["peer 0", "peer 1", "peer 2"]
            s.now()  # everything read before it is durable
    finally:
        peer.close()
    j = open_journal(url)
    try:
        records = list(expand(j.read(name)))
    finally:
        j.close()
    results = {r.data["s"]: wire.loads(r.data["v"]) for r in records if r.kind == RESULT and r.data["s"] in seqs}
    assert results == {seqs[i]: f"peer {i}" for i in range(3)}


def test_a_journal_that_fails_under_a_session_fails_the_programs_next_call(tmp_path):
    """Adding a call record raises nothing (a deque append): the writer's failure reaches the
    program through on_failure, and its next call raises it before anything is sent."""
    import contextlib

    import pytest

    from regent.journal import JournalError

    # Its procs outlive a session that could not end its run (a standby may need them):
    # the host agent stops them once no controller has spoken for 5 s (a loaded machine may be slower than 1 s).
    s = Session(f"fails-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}", orphan_timeout_s=5.0)
    try:
        one = s.spawn_procs(per_host={"procs": 1}).spawn("e", Echo).slice(procs=0)
        assert one.echo.call_one(1).get(timeout=10) == 10
        s.writer.submit("bad", {"x": object()}, lazy=True)  # the writer's thread fails on it
        deadline = time.monotonic() + 10
        while s._journal_failed is None and time.monotonic() < deadline:
            time.sleep(0.01)
        sent = s.stats["live"]
        with pytest.raises(JournalError, match="could not be written"):
            one.echo.call_one(2)  # journals nothing durably itself: only on_failure can tell it
        assert s.stats["live"] == sent
    finally:
        with contextlib.suppress(JournalError):
            s.close()
