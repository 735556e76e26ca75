"""The chaos checker on synthetic journals and ledgers: what counts as lost, duplicated,
unjournaled, and as a re-run after a crash (at-least-once, invariant 3)."""

from __future__ import annotations

from types import SimpleNamespace

from regent.chaos.checker import check_run
from regent.chaos.faults import FaultEvent
from regent.chaos.ledger import Execution
from regent.journal import Record

DIGEST = "ab" * 16


def _journal(*results: tuple[int, int, str]) -> list[Record]:
    recs = [Record(0, 1, "start", {"run": "r1"}, 0.0),
            Record(1, 1, "call", {"s": 5, "k": "call", "a": "w", "m": "square", "d": bytes.fromhex(DIGEST),
                                  "pts": [0]}, 0.0)]
    recs += [Record(2 + i, 1, "result", {"s": s, "pt": pt, "st": st}, 0.0) for i, (s, pt, st) in enumerate(results)]
    return recs


def _ran(*where: tuple[int, int]) -> list[Execution]:
    return [Execution("w", 0, "square", DIGEST, pid, inc) for pid, inc in where]


def _check(executions: list[Execution], events=(), results=((5, 0, "ok"),)):
    out = {"out": [1], "sid": "s.r1"}
    return check_run("s", _journal(*results), executions, result=out, expected={"out": [1]}, events=events,
                     verify=SimpleNamespace(ok=True, problems=[]))


def test_once_is_exactly_once() -> None:
    rep = _check(_ran((100, 0)))
    assert rep.ok and rep.ran_once == 1 and not rep.rerun_after_crash


def test_twice_in_one_incarnation_is_a_duplicate() -> None:
    rep = _check(_ran((100, 0), (100, 0)))
    assert not rep.ok and len(rep.duplicated) == 1


def test_twice_in_two_live_procs_of_one_incarnation_is_a_duplicate() -> None:
    rep = _check(_ran((100, 0), (200, 0)))  # neither was killed nor replaced
    assert not rep.ok and len(rep.duplicated) == 1


def test_again_on_the_replacement_of_a_killed_proc_is_a_rerun_not_a_duplicate() -> None:
    kill = FaultEvent(1.0, "kill", "proc/0", {"pid": 100})
    rep = _check(_ran((100, 0), (200, 1)), events=[kill])
    assert rep.ok, rep.text()
    assert not rep.duplicated and len(rep.rerun_after_crash) == 1
    assert "re-run:          1" in rep.text()


def test_again_after_the_actor_was_rebuilt_is_a_rerun() -> None:
    rep = _check(_ran((100, 0), (100, 1)))  # actor-level restart inside the same proc
    assert rep.ok and len(rep.rerun_after_crash) == 1


def test_three_times_with_only_one_incarnation_ended_is_a_duplicate() -> None:
    kill = FaultEvent(1.0, "kill", "proc/0", {"pid": 100})
    rep = _check(_ran((100, 0), (200, 1), (300, 1)), events=[kill])
    assert not rep.ok and len(rep.duplicated) == 1


def test_a_journaled_ok_result_that_never_ran_is_lost_and_an_unjournaled_run_is_reported() -> None:
    rep = _check([Execution("w", 0, "square", "cd" * 16, 100, 0)])
    assert not rep.ok
    assert len(rep.lost) == 1 and len(rep.unjournaled) == 1


def _with_procs(*extra: Record, pids: tuple[int, ...] = (100,)) -> list[Record]:
    procs = [{"id": f"p{pid}", "idx": 0, "pid": pid, "addr": "tcp://127.0.0.1:1"} for pid in pids]
    return [*_journal((5, 0, "ok")), Record(9, 1, "procs", {"s": 1, "procs": procs}, 0.0), *extra]


def _check_journal(recs: list[Record], executions: list[Execution]):
    return check_run("s", recs, executions, result={"out": [1], "sid": "s.r1"}, expected={"out": [1]},
                     verify=SimpleNamespace(ok=True, problems=[]))


def test_again_on_the_process_that_replaced_one_is_a_rerun_even_at_the_same_incarnation() -> None:
    """Supervision replaced proc p100 with p200 (journaled); a restart event lost with a deposed
    leader may leave both at one incarnation number."""
    replaced = Record(10, 2, "sup", {"ev": "proc_replaced", "old": "p100", "new": "p200", "pid": 200}, 0.0)
    rep = _check_journal(_with_procs(replaced), _ran((100, 2), (200, 2)))
    assert rep.ok, rep.text()
    assert not rep.duplicated and len(rep.rerun_after_crash) == 1


def test_again_after_a_process_the_journal_never_names_is_a_rerun() -> None:
    """p150 was started by a leader deposed before it journaled doing so: the run moved on to
    the processes the journal names, which ran the call again."""
    rep = _check_journal(_with_procs(pids=(100,)), _ran((150, 1), (100, 1)))
    assert rep.ok, rep.text()
    assert len(rep.rerun_after_crash) == 1


def test_twice_in_two_processes_the_journal_names_and_never_replaced_is_a_duplicate() -> None:
    rep = _check_journal(_with_procs(pids=(100, 200)), _ran((100, 0), (200, 0)))
    assert not rep.ok and len(rep.duplicated) == 1


def _two_runs(first_end: dict) -> list[Record]:
    """Run r0 spawned p50 and called w.square with another digest, then ended; r1 is checked."""
    first = [Record(0, 1, "start", {"run": "r0"}, 0.0),
             Record(1, 1, "procs", {"s": 0, "procs": [{"id": "p50", "idx": 0, "pid": 50, "addr": "tcp://x:1"}]}, 0.0),
             Record(2, 1, "call", {"s": 5, "k": "call", "a": "w", "m": "square", "d": bytes.fromhex("cd" * 16),
                                   "pts": [0]}, 0.0),
             Record(3, 1, "session_end", first_end, 0.0)]
    return first + [Record(4 + r.lsn, r.epoch, r.kind, r.data, r.ts) for r in _with_procs()]


def test_an_earlier_run_that_failed_is_the_programs_error_and_its_executions_are_its_own() -> None:
    """A run whose program raised ended the session's run; a controller started later ran it
    again from the start. The failure is the verdict; what the first run ran is not unjournaled."""
    executions = [Execution("w", 0, "square", "cd" * 16, 50, 0), Execution("w", 0, "square", DIGEST, 50, 0),
                  *_ran((100, 0))]
    rep = _check_journal(_two_runs({"error": "RuntimeError('g11: no success after 40 attempts')"}), executions)
    assert not rep.ok
    assert "earlier run" in rep.program_error and "g11: no success" in rep.program_error
    assert not rep.unjournaled and not rep.duplicated and not rep.rerun_after_crash and rep.ran_once == 1
    assert "earlier run:     run r0: ended on the program's error" in rep.text()


def test_an_earlier_run_that_ended_cleanly_is_not_a_failure() -> None:
    rep = _check_journal(_two_runs({"error": None}), [Execution("w", 0, "square", "cd" * 16, 50, 0), *_ran((100, 0))])
    assert rep.ok, rep.text()
    assert rep.earlier_runs == ["run r0: ended"]


def test_an_execution_only_an_earlier_run_journaled_is_explained_by_it() -> None:
    """On a process the earlier run never journaled starting (pid 60), its call still explains it."""
    rep = _check_journal(_two_runs({"error": None}), [Execution("w", 0, "square", "cd" * 16, 60, 0), *_ran((100, 0))])
    assert rep.ok, rep.text()
    assert not rep.unjournaled
