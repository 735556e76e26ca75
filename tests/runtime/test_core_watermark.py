"""The core's release watermark, driven by events with no processes (invariant 11)."""

from regent.controller.core import ControllerCore, Outcome


def _ok() -> Outcome:
    return Outcome("ok", {}, [])


def test_a_complete_call_is_not_releasable_until_its_outcome_is_handed_to_the_journal() -> None:
    core = ControllerCore("s")
    for _ in range(3):
        core.expect(core.issue(), "call", "a", "m", {0: "p0", 1: "p1"}, None)
    core.on_result(0, 0, _ok())
    core.on_result(0, 1, _ok())
    core.recorded(0)
    core.recorded(0)
    core.on_result(1, 0, _ok())
    core.on_result(1, 1, _ok())  # seq 1 complete, one outcome not yet recorded
    core.recorded(1)
    assert core.completed_through == 1
    assert core.releasable_through == 0
    core.recorded(1)
    assert core.releasable_through == 1


def test_an_outcome_read_from_the_journal_needs_no_recording() -> None:
    core = ControllerCore("s")
    core.expect(core.issue(), "call", "a", "m", {0: "p0"}, None)
    core.on_result(0, 0, Outcome("ok", {}, [], journaled=True))
    assert core.releasable_through == 0


def test_a_dead_proc_fails_its_points_and_they_wait_for_recording_too() -> None:
    core = ControllerCore("s")
    core.expect(core.issue(), "call", "a", "m", {0: "p0"}, None)
    hit = core.on_proc_died("p0", "gone")
    assert [(c.seq, p) for c, p in hit] == [(0, 0)]
    assert core.completed_through == 0 and core.releasable_through == -1
    core.recorded(0)
    assert core.releasable_through == 0
