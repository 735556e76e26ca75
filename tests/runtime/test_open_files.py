"""A spawn the controller has not the open files for is refused up front, saying what to do
(controller/_files.py): out of descriptors, zmq retries accepting the procs' connections in a
loop, a core busy, and the session hangs (4,096 direct procs against a limit of 20,000)."""

from __future__ import annotations

import resource

import pytest

from regent.controller import Session, _files
from regent.controller._files import FILES_KEPT, FILES_PER_DIRECT_PROC, check_room
from regent.worker.errors import SupervisionError
from tests.runtime.test_watermark_rate import Echo

INF = resource.RLIM_INFINITY


@pytest.mark.parametrize(("procs", "files", "refused"), [
    (0, (19_990, 20_000, 20_000), False),  # nothing to link
    (100, (1_000, 20_000, 20_000), False),
    (4_000, (1_000, 20_000, 20_000), True),  # 20,256 more past 20,000
    (4_000, (1_000, 20_000, INF), False),  # raised to unlimited
    (4_096, (6_000, 20_000, 20_000), True),  # the bench's hang, refused
])
def test_the_room_a_spawn_needs(procs: int, files: tuple[int, int, int], refused: bool, monkeypatch) -> None:
    raised: list = []
    monkeypatch.setattr(_files.resource, "setrlimit", lambda what, limits: raised.append(limits))
    if refused:
        with pytest.raises(SupervisionError, match=r"ulimit -n.*REGENT_RELAY=1"):
            check_room(procs, files)
    else:
        check_room(procs, files)


def test_a_soft_limit_below_the_hard_one_is_raised_when_that_suffices(monkeypatch) -> None:
    raised: list = []
    monkeypatch.setattr(_files.resource, "setrlimit", lambda what, limits: raised.append(limits))
    need = 100 * FILES_PER_DIRECT_PROC + FILES_KEPT
    check_room(100, (500, 500 + need - 1, 100_000))
    assert raised == [(100_000, 100_000)]
    raised.clear()
    check_room(100, (500, 500 + need, 100_000))  # room under the soft limit: left as it is
    assert raised == []


def test_a_spawn_past_the_limit_is_refused_and_the_session_goes_on(own_home, monkeypatch) -> None:
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    with Session("open-files", journal="off") as s:
        ok = s.spawn_procs(per_host={"procs": 1}).spawn("ok", Echo)
        now, soft, hard = _files.open_files()
        # Room for one more proc's links, not for 100.
        limit = now + FILES_KEPT + 2 * FILES_PER_DIRECT_PROC
        monkeypatch.setattr(_files, "open_files", lambda: (now, limit, limit))
        with pytest.raises(SupervisionError, match=r"spawning 100 procs .* open files"):
            s.spawn_procs(per_host={"procs": 100})
        assert ok.echo.call(1).get(timeout=30).values() == [1]
        more = s.spawn_procs(per_host={"procs": 1}).spawn("more", Echo)
        assert more.echo.call(2).get(timeout=30).values() == [2]
