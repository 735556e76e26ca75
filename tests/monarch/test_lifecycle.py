"""Actors and meshes ending as Monarch's do: `__cleanup__(exc)` told why (and awaited when
async), names free again once a mesh is stopped, host and proc meshes as context managers."""

from __future__ import annotations

import asyncio

import pytest

from regent.controller import Session, SupervisionError
from regent.worker import Actor, endpoint
from regent.worker.errors import ActorExit


class Fatal(BaseException):
    """Not an Exception: it fails the actor."""


class Noted(Actor):
    """Writes what its __cleanup__ was given to a file: the actor is gone by then."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _write(self, text: str) -> None:
        with open(self.path, "a") as f:
            f.write(text + "\n")

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def quit(self, normal: bool) -> None:
        raise ActorExit("asked to", normal=normal)

    @endpoint
    async def fatal(self) -> None:
        raise Fatal("gone")

    def __cleanup__(self, exc: BaseException | None) -> None:
        self._write(repr(exc))


class AsyncNoted(Noted):
    async def __cleanup__(self, exc: BaseException | None) -> None:  # type: ignore[override]
        await asyncio.sleep(0.05)
        self._write(f"async {exc!r}")


class OldStyle(Noted):
    def __cleanup__(self) -> None:  # type: ignore[override]
        self._write("no argument")


class Other(Actor):
    @endpoint
    def kind(self) -> str:
        return "other"


@pytest.fixture(scope="module")
def session():
    with Session("monarch-lifecycle") as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 1})


@pytest.fixture()
def noted(tmp_path):
    return tmp_path / "cleanup"


def test_cleanup_gets_none_when_the_actor_is_stopped(procs, noted):
    mesh = procs.spawn("stopped", Noted, str(noted))
    mesh.stop()
    assert noted.read_text() == "None\n"


def test_cleanup_gets_none_when_the_actor_exits_normally(procs, noted):
    mesh = procs.spawn("exits-normally", Noted, str(noted))
    with pytest.raises(SupervisionError, match="normal"):
        mesh.quit.call_one(True).get(timeout=5)
    assert noted.read_text() == "None\n"


def test_cleanup_gets_the_actor_exit_that_failed_the_actor(procs, noted):
    mesh = procs.spawn("exits-abnormally", Noted, str(noted))
    with pytest.raises(SupervisionError, match="abnormal"):
        mesh.quit.call_one(False).get(timeout=5)
    assert noted.read_text() == "ActorExit('asked to')\n"


def test_cleanup_gets_the_base_exception_that_failed_the_actor(procs, noted):
    mesh = procs.spawn("fails", Noted, str(noted))
    with pytest.raises(SupervisionError, match="raised Fatal"):
        mesh.fatal.call_one().get(timeout=5)
    assert noted.read_text() == "Fatal('gone')\n"


def test_an_async_cleanup_is_awaited_before_the_stop_returns(procs, noted):
    mesh = procs.spawn("async-cleanup", AsyncNoted, str(noted))
    mesh.stop()
    assert noted.read_text() == "async None\n"


def test_a_cleanup_that_takes_no_exception_is_still_called(procs, noted):
    mesh = procs.spawn("old-style", OldStyle, str(noted))
    mesh.stop()
    assert noted.read_text() == "no argument\n"


def test_an_actor_name_is_free_again_once_its_mesh_is_stopped(procs, noted):
    first = procs.spawn("reused", Noted, str(noted))
    assert first.ping.call_one().get(timeout=5) == "pong"
    with pytest.raises(ValueError, match="already exists"):
        procs.spawn("reused", Other)
    first.stop()
    again = procs.spawn("reused", Other)
    assert again.kind.call_one().get(timeout=5) == "other"


def test_stopping_part_of_a_mesh_keeps_its_name(session, noted):
    two = session.spawn_procs(per_host={"procs": 2})
    mesh = two.spawn("half-stopped", Noted, str(noted))
    mesh.slice(procs=0).stop()
    with pytest.raises(ValueError, match="already exists"):
        two.spawn("half-stopped", Other)
    assert mesh.slice(procs=1).ping.call_one().get(timeout=5) == "pong"
    two.stop()


def test_a_proc_mesh_used_as_a_context_manager_is_stopped_on_exit(session):
    with session.spawn_procs(per_host={"procs": 1}) as procs:
        mesh = procs.spawn("in-proc-block", Other)
        assert mesh.kind.call_one().get(timeout=5) == "other"
    assert all(p.stopped for p in procs.procs())
    with pytest.raises(SupervisionError, match="stopped by the program"):
        mesh.kind.call_one().get(timeout=5)


def test_a_host_mesh_used_as_a_context_manager_shuts_down_the_sessions_procs_on_it():
    with Session("monarch-host-shutdown") as s:
        before = s.spawn_procs(per_host={"procs": 1}).spawn("before", Other)
        with s.this_host() as host:
            mesh = host.spawn_procs(per_host={"procs": 2}).spawn("inside", Other)
            assert mesh.kind.call().get(timeout=5).values() == ["other", "other"]
        for m in (mesh, before):
            with pytest.raises(SupervisionError, match="stopped by the program"):
                m.kind.call().get(timeout=5)
        with pytest.raises(RuntimeError, match="shut down"):
            host.spawn_procs(per_host={"procs": 1})
        assert s.this_host().spawn_procs(per_host={"procs": 1}).spawn("after", Other).kind.call_one().get(
            timeout=5) == "other"


def _boot() -> None:
    import os

    os.environ["REGENT_TEST_BOOTED"] = f"booted {os.getpid()}"


def _broken_boot() -> None:
    raise RuntimeError("no GPU here")


class Env(Actor):
    @endpoint
    def booted(self) -> tuple[str, bool]:
        import os

        return os.environ.get("REGENT_TEST_BOOTED", ""), os.environ["REGENT_TEST_BOOTED"].endswith(str(os.getpid()))


def test_spawn_procs_runs_bootstrap_once_in_each_proc_before_its_actors(session):
    procs = session.spawn_procs(per_host={"procs": 2}, bootstrap=_boot)
    try:
        got = procs.spawn("env", Env).booted.call().get(timeout=30).values()
        assert [ok for _, ok in got] == [True, True] and got[0][0] != got[1][0]
    finally:
        procs.stop()


def test_a_bootstrap_that_raises_fails_spawn_procs_naming_the_error(session):
    with pytest.raises(Exception, match="no GPU here"):
        session.spawn_procs(per_host={"procs": 1}, bootstrap=_broken_boot)
    with pytest.raises(TypeError, match="plain function"):
        session.spawn_procs(per_host={"procs": 1}, bootstrap=asyncio.sleep)


class Pid(Actor):
    @endpoint
    def where(self) -> tuple[int, str]:
        import os
        import socket

        return os.getpid(), socket.gethostname()


def test_this_proc_in_the_program_is_one_proc_of_its_own_on_this_machine(session):
    """Monarch's test_this_proc_on_root_client, with regent's difference: the proc is not the
    controller's process (it outlives it, for a standby to adopt), but it is on its machine."""
    import os
    import socket

    from regent.worker import this_host, this_proc

    mine = this_proc()  # the one session open in this process: the module's
    assert mine is this_proc() is session.this_proc() and mine.dims == {"hosts": 1, "procs": 1}
    pid, host = mine.spawn("pid", Pid).where.call_one().get(timeout=30)
    assert pid != os.getpid() and host == socket.gethostname()
    assert this_host().dims == {"hosts": 1}
    with Session("monarch-this-proc-2"), pytest.raises(RuntimeError, match="2 sessions open"):
        this_proc()
