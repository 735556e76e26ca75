"""A call to a supervised mesh waits for members that restart, against one deadline, and goes
to all of one restart's members or to none of them: a collective sent to only some would wait
for the others for ever (found under load: a restart ended the instant one member's wait ran
out, and the step went to the other member alone)."""

from __future__ import annotations

import threading

from regent.controller.supervisor import MeshState
from regent.worker.supervision import MeshSupervisor, RestartPolicy


class _EndsRestart(threading.Event):
    """A member's ready event whose wait sees the restart end, setting `members` (in order)."""

    def __init__(self, members: list[threading.Event]):
        super().__init__()
        self.members = members

    def wait(self, timeout: float | None = None) -> bool:
        for ev in self.members:
            ev.set()
        return super().wait(0)


def _mesh(size: int, timeout_s: float = 0.2) -> MeshState:
    sup = MeshSupervisor("m", size, RestartPolicy(strategy="one_for_all", restart_timeout_s=timeout_s))
    state = MeshState("m", [], {"procs": size}, [], sup)
    state.ready = {r: threading.Event() for r in range(size)}
    return state


def test_members_that_stay_down_past_the_deadline_are_all_left_out() -> None:
    state = _mesh(2)
    out = state.wait_all_ready([0, 1])
    assert sorted(out) == [0, 1] and "did not come back from a restart within 0.2 s" in out[0]


def test_a_restart_that_ends_while_the_last_member_is_waited_for_admits_every_member() -> None:
    state = _mesh(2)
    state.ready[1] = _EndsRestart([state.ready[0]])
    state.ready[1].members.append(state.ready[1])
    assert state.wait_all_ready([0, 1]) == {}  # member 0's wait ran out, but it is back too


def test_members_seen_back_only_in_part_are_all_left_out() -> None:
    state = _mesh(3)
    state.ready[2] = _EndsRestart([state.ready[0]])  # member 1 (and 2) not back yet
    assert sorted(state.wait_all_ready([0, 1, 2])) == [0, 1, 2]


def test_ready_members_are_not_waited_for() -> None:
    state = _mesh(2, timeout_s=30.0)
    for ev in state.ready.values():
        ev.set()
    assert state.wait_all_ready([0, 1]) == {}
