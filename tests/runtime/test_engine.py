"""The engine's decisions as tables: given events, expect decisions and effects. No processes,
sockets or stores: the durability rule, replay matching and each NonDeterminismError case,
observations on replay, outcome records and the release watermark."""

from __future__ import annotations

import pytest

from regent import wire
from regent.controller.core import Outcome
from regent.controller.engine import (
    COLLECTED,
    IN_TIME,
    NEVER_DURABLE,
    Append,
    AwaitReads,
    Collect,
    Engine,
    Reads,
    Releases,
)
from regent.controller.recorder import Recorder
from regent.controller.replay import CALL, OBS, RESULT, START, NonDeterminismError, ReplayIndex
from regent.journal import JournalUnavailable, LeadershipLost, Record
from regent.worker.dedupe import LARGE_RESULT_BYTES

# --- the durability rule ----------------------------------------------------------------

# (what was read: lsn, holders), durable lsn, the next call's targets, durable_first -> waits?
DURABILITY = [
    ("nothing read", None, 5, ["p0"], False, False),
    ("read and durable", (4, ["p0"]), 5, ["p1"], False, False),
    ("read, not durable, call to its holder", (7, ["p0"]), 5, ["p0"], False, False),
    ("read, not durable, call to another proc", (7, ["p0"]), 5, ["p1"], False, True),
    ("read, not durable, call reaching the holder and another", (7, ["p0"]), 5, ["p0", "p1"], False, True),
    ("read, not durable, a host agent or journal call", (7, ["p0"]), 5, None, False, True),
    ("read, not durable, a choose (its pick is durable first)", (7, ["p0"]), 5, ["p1"], True, False),
    ("read before a deadline, call to its proc", (7, [IN_TIME]), 5, ["p0"], False, True),
    ("a replaced proc (new id) is not its predecessor", (7, ["p0#1"]), 5, ["p0#2"], False, True),
]


@pytest.mark.parametrize(("case", "read", "durable", "targets", "durable_first", "waits"), DURABILITY,
                         ids=[c[0] for c in DURABILITY])
def test_the_durability_rule(case, read, durable, targets, durable_first, waits) -> None:
    reads = Reads()
    if read is not None:
        reads.observed(read[0], read[1], durable=durable, ticket=0, bound=None)
    wait = reads.wait_before(targets, durable, durable_first)
    assert (wait is not None) == waits, case
    if waits:
        assert wait == AwaitReads(read[0], 0)


def test_reads_from_two_procs_make_a_call_to_either_wait() -> None:
    reads = Reads()
    reads.observed(7, ["p0"], durable=5, ticket=0, bound=None)
    reads.observed(8, ["p1"], durable=5, ticket=0, bound=None)
    assert reads.wait_before(["p0"], 5, False) is not None
    assert reads.wait_before(["p1"], 5, False) is not None


def test_a_collected_read_waits_for_its_ticket_and_once_durable_holds_nothing() -> None:
    reads = Reads()
    reads.observed(COLLECTED, ["p0"], durable=5, ticket=3, bound=None)
    assert reads.wait_before(["p1"], 5, False) == AwaitReads(COLLECTED, 3)
    reads.durable(9)  # the driver resolved the ticket to lsn 9 and waited for it
    assert reads.wait_before(["p1"], 9, False) is None
    # A later read whose ticket was bound meanwhile starts from the bound lsn.
    reads.observed(COLLECTED, ["p1"], durable=9, ticket=4, bound=None)
    reads.observed(COLLECTED, ["p1"], durable=12, ticket=5, bound=11)
    assert reads.holders == {"p1"} and reads.ticket == 5


# --- replay matching --------------------------------------------------------------------


def _journal(*calls: dict, obs: tuple = ()) -> ReplayIndex:
    recs = [Record(0, 1, START, {"run": "r1", "ts": 0.0}, 0.0)]
    for i, d in enumerate(calls, start=1):
        recs.append(Record(i, 1, CALL, d, 0.0))
    for j, d in enumerate(obs, start=len(recs)):
        recs.append(Record(j, 1, OBS, d, 0.0))
    return ReplayIndex(recs)


CALL0 = {"s": 0, "k": "call", "a": "m", "m": "incr", "d": b"\x01", "pts": [0, 1]}

NONDETERMINISM = [
    ("another kind", ("broadcast", "m", "incr", b"\x01", (0, 1))),
    ("another actor mesh", ("call", "n", "incr", b"\x01", (0, 1))),
    ("another endpoint", ("call", "m", "decr", b"\x01", (0, 1))),
    ("other arguments", ("call", "m", "incr", b"\x02", (0, 1))),
    ("other points", ("call", "m", "incr", b"\x01", (1,))),
]


@pytest.mark.parametrize(("case", "call"), NONDETERMINISM, ids=[c[0] for c in NONDETERMINISM])
def test_a_call_that_differs_from_its_record_is_non_determinism_naming_the_seq(case, call) -> None:
    engine = Engine("s.r1", _journal(CALL0))
    seq, live = engine.issue()
    assert (seq, live) == (0, False) and engine.replaying
    with pytest.raises(NonDeterminismError, match="non-determinism at seq 0") as e:
        engine.match(seq, *call)
    assert "m.incr" in e.value.journaled


def test_the_same_call_matches_and_replay_ends_past_the_journal() -> None:
    engine = Engine("s.r1", _journal(CALL0))
    seq, _ = engine.issue()
    assert engine.match(seq, "call", "m", "incr", b"\x01", (0, 1)).seq == 0
    seq, live = engine.issue()
    assert (seq, live) == (1, True) and not engine.replaying
    assert engine.match(seq, "call", "m", "other", b"", (0,)) is None


def test_a_choose_replays_its_journaled_pick_and_a_live_one_is_journaled_durably() -> None:
    engine = Engine("s.r1", _journal({**CALL0, "k": "choose"}, obs=({"s": 0, "w": "choose", "i": 0, "v": 1},)))
    assert engine.choose(0, [0, 1], {0: 0, 1: 5}) == (1, None)
    rank, effect = engine.choose(1, [0, 1], {0: 2, 1: 0})
    assert rank == 1 and effect == Append(OBS, {"s": 1, "w": "choose", "i": 0, "v": 1}, durable=True)


def test_deadlines_replay_where_the_journal_says_and_never_from_the_clock_where_it_holds_the_outcome() -> None:
    replay = _journal(CALL0, obs=({"s": 0, "w": "timeout", "i": 0, "v": 2.0},))
    replay.calls[0].results[0] = {"s": 0, "pt": 0, "st": "ok", "big": [b"d", 1 << 20]}
    replay.calls[0].results[1] = {"s": 0, "pt": 1, "st": "ok", "v": (b"x",)}
    engine = Engine("s.r1", replay)
    assert engine.replayed_timeout(0) is True  # the first get(timeout) timed out
    assert engine.replayed_timeout(0) is False  # the next one did not
    engine.core.expect(0, "call", "m", "incr", {0: "p0", 1: "p1"}, None)
    assert engine.deadline(0, 2.0) is None  # the journal holds both points' outcomes
    assert engine.timed_out(5, 1.5) == Append(OBS, {"s": 5, "w": "timeout", "i": 0, "v": 1.5}, durable=True)
    assert Engine("s.r2", None).deadline(0, 2.0) == 2.0


# --- outcome records and the watermark ---------------------------------------------------


def _pending(engine: Engine, seq: int = 0):
    return engine.core.expect(seq, "call", "m", "incr", {0: "p0"}, None)


def test_each_outcome_gets_the_record_its_kind_needs() -> None:
    engine = Engine("s.r1", None, value_limit=4 * LARGE_RESULT_BYTES)
    call = _pending(engine)
    small = Outcome("ok", {}, [b"v"])
    assert isinstance(engine.outcome_record(call, 0, small, 1, 1.0), Collect) and small.lsn == COLLECTED
    medium = engine.outcome_record(call, 0, Outcome("ok", {}, [b"m"]), 2 * LARGE_RESULT_BYTES, 1.0)
    assert medium.kind == RESULT and "v" in medium.data and medium.lazy and not medium.durable
    big = engine.outcome_record(call, 0, Outcome("ok", {}, [b"b"]), 8 * LARGE_RESULT_BYTES, 1.0)
    assert big.data["big"][1] == 8 * LARGE_RESULT_BYTES and "v" not in big.data
    err = engine.outcome_record(call, 0, Outcome("err", {"et": "E", "em": "m", "zz": 1}, []), 0, 1.0)
    assert not err.durable and err.data["x"] == {"et": "E", "em": "m"}
    dead = engine.outcome_record(call, 0, Outcome("dead", {"em": "gone"}, []), 0, 1.0)
    assert dead.durable  # a supervision failure may differ between runs: durable first
    assert engine.outcome_record(call, 0, Outcome("fenced", {}, []), 0, 1.0) is None
    assert Engine("s", None, journaled=False).outcome_record(call, 0, small, 1, 1.0) is None


class _FailingWriter:
    """A writer that takes records but can never make them durable (deposed, or store down)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def collector(self, kind):
        return lambda item: None

    def submit(self, kind, data, lazy=False) -> int:
        return 7

    def wait_durable(self, lsn, timeout=None) -> None:
        raise self.error


@pytest.mark.parametrize("error, status, raises", [
    (LeadershipLost("another controller holds the lease"), "fenced", LeadershipLost),
    (JournalUnavailable("etcd at 127.0.0.1:2379 did not answer"), "unjournaled", JournalUnavailable),
])
def test_a_supervision_failure_that_cannot_be_made_durable_is_not_shown(error, status, raises) -> None:
    """The program would act on a failure a standby never sees (say, call again under a new
    seq): it sees why the journal failed instead (invariant 4)."""
    engine = Engine("s.r1", None)
    call = _pending(engine)
    recorder = Recorder(engine, on_gone=lambda *a: None)
    recorder.use(_FailingWriter(error))
    outcome = Outcome("dead", {"em": "proc p0 died"}, [])
    recorder.record(call, 0, outcome)
    assert outcome.status == status and "dead outcome could not be journaled" in outcome.meta["em"]
    with pytest.raises(raises, match="could not be journaled"):
        engine.decode(call, outcome)
    assert engine.releases.marks[-1] == (call.seq, NEVER_DURABLE)
    plain = Outcome("err", {"et": "E", "em": "m"}, [])  # a plain value may be journaled later
    recorder.record(call, 0, plain)
    assert plain.status == "err"


def test_the_watermark_stays_below_outcomes_not_yet_durable() -> None:
    releases = Releases()
    releases.marks.extend([(3, 10), (5, 12)])
    assert releases.through(releasable=7, durable=9, seal=lambda: 0) == 2
    assert releases.through(releasable=7, durable=10, seal=lambda: 0) == 4
    releases.collected.append(6)
    assert releases.through(releasable=7, durable=12, seal=lambda: 15) == 5  # item 6 bound to lsn 15
    assert releases.through(releasable=7, durable=15, seal=lambda: 15) == 7


def test_a_mark_that_can_never_be_durable_holds_the_watermark_below_it() -> None:
    releases = Releases()
    releases.marks.append((4, NEVER_DURABLE))

    def failed_seal() -> int:
        raise RuntimeError("writer down")

    releases.collected.append(9)
    assert releases.through(releasable=20, durable=100, seal=failed_seal) == 3


def test_a_replayed_digest_only_result_is_checked_against_the_journal() -> None:
    value = wire.dumps(b"x" * 10)
    replay = _journal(CALL0)
    replay.calls[0].results[0] = {"s": 0, "pt": 0, "st": "ok", "big": [wire.digest(value), 10]}
    engine = Engine("s.r1", replay)
    call = engine.expect(0, "call", "m", "incr", {0: "p0", 1: "p1"}, None, replay.calls[0])
    assert call.expected == {0: (wire.digest(value), 10)}
    engine.core.on_result(0, 0, Outcome("ok", {}, wire.dumps(b"y" * 10)))
    assert call.results[0].status == "lost" and "returned a different value" in call.results[0].meta["em"]
    with pytest.raises(Exception, match="digest only"):
        engine.decode(call, call.results[0])
    assert engine.lost is not None
