"""A standby's replay keeps its index out of the cyclic GC's scans until it goes live."""

from __future__ import annotations

import gc
import os

from regent.controller import Session
from regent.controller.session import Handoff
from regent.worker import Actor, endpoint


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x + 1


def _program(s: Session) -> list[int]:
    one = s.spawn_procs(per_host={"procs": 1}).spawn("e", Echo).slice(procs=0)
    return [one.echo.call_one(i).get(timeout=30) for i in range(20)]


def _record(url: str, name: str) -> list[int]:
    s = Session(name, journal=url)
    values = _program(s)
    s.close(error=Handoff("test hand-off"))  # as on SIGTERM: the run stays open for a standby
    return values


def test_the_replay_index_is_frozen_out_of_the_gc_until_the_program_goes_live(tmp_path):
    url, name = f"sqlite://{tmp_path / 'j.db'}", f"gc-{os.getpid()}"
    values = _record(url, name)
    assert gc.get_freeze_count() == 0
    with Session(name, journal=url) as s:
        assert s.replaying and gc.get_freeze_count() > 0
        assert _program(s) == values
        assert s.stats["replayed"] > 0 and gc.get_freeze_count() > 0  # still replaying
        s.now()  # past the journal's end: live, and the GC sees everything again
        assert not s.replaying and gc.get_freeze_count() == 0


def test_a_program_that_froze_objects_itself_keeps_them_frozen(tmp_path):
    url, name = f"sqlite://{tmp_path / 'j.db'}", f"gc-own-{os.getpid()}"
    _record(url, name)
    gc.freeze()
    mine = gc.get_freeze_count()
    try:
        with Session(name, journal=url) as s:
            assert s.replaying
            _program(s)
            s.now()
            # Its freeze, not undone by the session (gc.unfreeze() would leave next to none);
            # frozen objects freed meanwhile may lower the count a little.
            assert gc.get_freeze_count() >= mine * 0.9
    finally:
        gc.unfreeze()
