"""A session keeps what exists when it starts (the program's imports, a standby's replay index)
out of the cyclic GC's scans until it closes, unless the program manages the collector itself."""

from __future__ import annotations

import gc
import os

import pytest

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


@pytest.fixture(autouse=True)
def unfrozen() -> None:
    """A collector as a fresh program has it: an earlier test in this worker may have left a
    session open (its freeze with it), which would make the session here not own the collector."""
    gc.unfreeze()


def _scanned(obj: object) -> bool:
    """Whether a full collection would look at `obj` (frozen objects are not listed)."""
    return any(o is obj for o in gc.get_objects())


def test_what_exists_at_the_start_is_out_of_full_scans_until_the_session_closes(tmp_path):
    before = [object()]  # a container the collector tracks, made before the session
    assert gc.get_freeze_count() == 0 and _scanned(before)
    with Session(f"gc-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        assert gc.get_freeze_count() > 0 and not _scanned(before)
        _program(s)
        during = [object()]
        assert _scanned(during)  # made since: the collector still sees it
        assert not _scanned(before)
    assert gc.get_freeze_count() == 0 and _scanned(before) and _scanned(during)


def test_the_replay_index_stays_frozen_when_the_program_goes_live(tmp_path):
    url, name = f"sqlite://{tmp_path / 'j.db'}", f"gc-replay-{os.getpid()}"
    values = _record(url, name)
    assert gc.get_freeze_count() == 0
    with Session(name, journal=url) as s:
        assert s.replaying and gc.get_freeze_count() > 0
        assert _program(s) == values
        frozen = gc.get_freeze_count()
        s.now()  # past the journal's end: live
        assert not s.replaying and gc.get_freeze_count() >= frozen * 0.9
    assert gc.get_freeze_count() == 0


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


def test_a_program_that_disabled_the_collector_gets_nothing_frozen(tmp_path):
    gc.disable()
    try:
        with Session(f"gc-off-{os.getpid()}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
            _program(s)
            assert gc.get_freeze_count() == 0
        assert not gc.isenabled()
    finally:
        gc.enable()
