"""ReplayIndex: what a new leader learns from the journal's supervision records."""

from __future__ import annotations

from regent.controller.replay import SUPERVISION, ReplayIndex
from regent.journal import Record


def _sup(lsn: int, **data) -> Record:
    return Record(lsn, 1, SUPERVISION, data, 0.0)


def test_proc_replacements_and_restart_incarnations_are_indexed() -> None:
    index = ReplayIndex([
        Record(0, 1, "start", {"run": "r"}, 0.0),
        _sup(1, ev="proc_replaced", old="p1", new="p1b", pid=10),
        _sup(2, ev="restart", mesh="w", ranks=[1], incarnation=[1], delay_s=0.0),
        _sup(3, ev="proc_replaced", old="p1b", new="p1c", pid=11),
        _sup(4, ev="restart", mesh="w", ranks=[1, 2], incarnation=[2, 1], delay_s=0.0),
        _sup(5, ev="restart", mesh="w", ranks=[1], incarnation=["bad"], delay_s=0.0),
        _sup(6, ev="proc_replaced", old=None, new="x"),
    ])
    assert index.replaced == {"p1": "p1b", "p1b": "p1c"}
    assert index.incarnations == {("w", 1): 2, ("w", 2): 1}
