"""OTP-style supervision with real process deaths: restart types x strategies,
intensity and escalation, backoff, __init__ failures, orphaned sessions."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from regent import wire
from regent.controller import Session, SupervisionError
from regent.wire import Kind
from regent.worker import Actor, context, endpoint
from regent.worker.errors import ActorExit
from regent.worker.supervision import RestartPolicy


class Member(Actor):
    def __init__(self, flag: str = "") -> None:
        if flag and context().incarnation > 0 and Path(flag).exists():
            raise RuntimeError("cannot start: flag file present")
        self.calls = 0

    @endpoint
    def info(self) -> tuple[int, int]:
        self.calls += 1
        return os.getpid(), context().incarnation

    @endpoint
    def exit_process(self) -> None:
        os._exit(7)

    @endpoint
    def quit(self, normal: bool) -> None:
        raise ActorExit("asked to stop", normal=normal)


def _retry_info(mesh, rank: int, timeout: float = 10.0):
    """The first successful call after a failure (calls in flight at the crash may fail)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return mesh.slice(procs=rank).info.call_one().get(timeout=timeout)
        except SupervisionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _kill(mesh, rank: int) -> int:
    pid = mesh.slice(procs=rank).info.call_one().get()[0]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.parametrize("strategy", ["one_for_one", "one_for_all"])
@pytest.mark.parametrize("restart", ["permanent", "transient", "temporary"])
def test_a_sigkilled_proc_is_handled_per_restart_type_and_strategy(restart, strategy):
    with Session(f"kill-{restart}-{strategy}") as s:
        mesh = s.spawn_procs(per_host={"procs": 3}).spawn(
            "m", Member, restart=RestartPolicy(restart=restart, strategy=strategy))
        before = mesh.info.call().get().values()
        victim = _kill(mesh, 1)
        if restart == "temporary":
            time.sleep(0.5)
            with pytest.raises(SupervisionError):
                mesh.slice(procs=1).info.call_one().get(timeout=5)
            # The others are untouched whatever the strategy: nothing restarts.
            assert [mesh.slice(procs=r).info.call_one().get() for r in (0, 2)] == [before[0], before[2]]
            return
        pid, inc = _retry_info(mesh, 1)
        assert pid != victim and inc == 1
        time.sleep(0.2)
        after = mesh.info.call().get(timeout=10).values()
        if strategy == "one_for_all":
            # Every member is a fresh instance; the survivors' processes were kept.
            assert [i for _, i in after] == [1, 1, 1]
            assert [after[0][0], after[2][0]] == [before[0][0], before[2][0]]
        else:
            assert after[0] == before[0] and after[2] == before[2]
        events = [e["ev"] for e in s._supervisor.events]
        assert "failure" in events and "restart" in events


@pytest.mark.parametrize("restart", ["permanent", "transient", "temporary"])
def test_an_endpoint_calling_os_exit_fails_its_call_then_the_policy_applies(restart):
    with Session(f"exit-{restart}") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("m", Member, restart=restart)
        with pytest.raises(SupervisionError, match="exited with status 7"):
            mesh.slice(procs=0).exit_process.call_one().get(timeout=10)
        if restart == "temporary":
            time.sleep(0.3)
            with pytest.raises(SupervisionError):
                mesh.slice(procs=0).info.call_one().get(timeout=5)
        else:
            assert _retry_info(mesh, 0)[1] == 1


@pytest.mark.parametrize("normal", [True, False])
@pytest.mark.parametrize("restart", ["permanent", "transient"])
def test_an_actor_stopping_itself_restarts_unless_transient_and_normal(restart, normal):
    with Session(f"stop-{restart}-{normal}") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("m", Member, restart=restart)
        pid = mesh.info.call_one().get()[0]
        with pytest.raises(SupervisionError, match="stopped"):
            mesh.quit.call_one(normal).get(timeout=10)
        time.sleep(0.3)
        if restart == "transient" and normal:
            with pytest.raises(SupervisionError):
                mesh.info.call_one().get(timeout=5)
        else:
            # Actor-level restart inside the live proc: same process, new incarnation.
            assert _retry_info(mesh, 0) == (pid, 1)


def test_an_exception_in_init_on_restart_counts_as_a_failure_and_escalates(tmp_path):
    flag = tmp_path / "broken"
    with Session("init-fails") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn(
            "m", Member, str(flag), restart=RestartPolicy(max_restarts=2, window_s=30, backoff_initial_s=0.01))
        flag.touch()
        _kill(mesh, 0)
        deadline = time.monotonic() + 20
        while not s._supervisor.meshes["m"].supervisor.escalated:
            assert time.monotonic() < deadline, s._supervisor.events
            time.sleep(0.05)
        with pytest.raises(SupervisionError, match="exceeded its restart intensity") as info:
            mesh.slice(procs=1).info.call_one().get(timeout=5)
        assert "__init__ raised RuntimeError" in str(info.value)


class SlowToRestart(Actor):
    """Its first restart hangs in __init__ after writing its pid, for the test to kill."""

    def __init__(self, pid_file: str) -> None:
        if context().incarnation == 1:
            Path(pid_file).write_text(str(os.getpid()))
            time.sleep(120)

    @endpoint
    def info(self) -> tuple[int, int]:
        return os.getpid(), context().incarnation


def test_a_restart_whose_new_proc_dies_in_init_is_retried_at_once_not_after_its_timeout(tmp_path):
    """The supervisor waits on the restart's answer; the new proc's death ends that wait (its
    timeout is 120 s here), and the next restart replaces the proc again."""
    pid_file = tmp_path / "restarting.pid"
    with Session("restart-dies") as s:
        policy = RestartPolicy(max_restarts=5, window_s=60, backoff_initial_s=0.01, restart_timeout_s=120)
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("m", SlowToRestart, str(pid_file), restart=policy)
        first = _kill(mesh, 0)
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, s._supervisor.events
            time.sleep(0.05)
        hung = int(pid_file.read_text())
        os.kill(hung, signal.SIGKILL)
        killed_at = time.monotonic()
        pid, incarnation = _retry_info(mesh, 0, timeout=60)
        assert time.monotonic() - killed_at < 60  # not the restart's 120 s timeout
        assert incarnation == 2 and pid not in (first, hung)
        time.sleep(0.5)  # a second failure reported for the one death would restart it again by now
        failures = [e["reason"] for e in s._supervisor.events if e["ev"] == "failure"]
        assert [f"pid {first}" in failures[0], f"pid {hung}" in failures[1], len(failures)] == [True, True, 2], failures
        assert mesh.info.call_one().get(timeout=10) == (pid, 2)


def test_intensity_exceeded_escalates_to_the_program_without_a_restart_storm():
    with Session("storm") as s:
        policy = RestartPolicy(max_restarts=2, window_s=30)
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("m", Member, restart=policy)
        for _ in range(3):
            with pytest.raises(SupervisionError):
                mesh.slice(procs=0).exit_process.call_one().get(timeout=10)
            try:
                _retry_info(mesh, 0, timeout=3)
            except SupervisionError:
                break
        with pytest.raises(SupervisionError, match="exceeded its restart intensity") as info:
            mesh.info.call().get(timeout=5)
        report = str(info.value)
        assert report.count("exited with status 7") == 3  # what failed, when, how often
        time.sleep(0.5)
        restarts = [e for e in s._supervisor.events if e["ev"] == "restart"]
        assert len(restarts) == 2
        journaled = [r.data for r in s.journal.read(s.name) if r.kind == "sup"]
        assert [e["ev"] for e in journaled].count("escalation") == 1


def test_backoff_spaces_consecutive_restarts():
    with Session("backoff") as s:
        policy = RestartPolicy(max_restarts=5, window_s=60, backoff_initial_s=0.2, backoff_jitter_s=0.0)
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("m", Member, restart=policy)
        for _ in range(3):
            with pytest.raises(SupervisionError):
                mesh.quit.call_one(False).get(timeout=10)
            _retry_info(mesh, 0)
        delays = [e["delay_s"] for e in s._supervisor.events if e["ev"] == "restart"]
        assert delays == pytest.approx([0.2, 0.4, 0.8], rel=0.05)
        failures = [e["t"] for e in s._supervisor.events if e["ev"] == "failure"]
        restarts = [e["t"] for e in s._supervisor.events if e["ev"] == "restart"]
        for f, r, d in zip(failures, restarts, delays, strict=True):
            assert r - f >= d


def test_stopping_procs_stops_their_actors_and_supervision_leaves_them_stopped():
    with Session("stop-procs") as s:
        procs = s.spawn_procs(per_host={"procs": 2})
        mesh = procs.spawn("m", Member, restart="permanent")
        pids = [pid for pid, _ in mesh.info.call().get().values()]
        procs.slice(procs=0).stop()
        time.sleep(0.5)
        with pytest.raises(ProcessLookupError):
            os.kill(pids[0], 0)
        with pytest.raises(SupervisionError, match="stopped by the program"):
            mesh.slice(procs=0).info.call_one().get(timeout=5)
        assert mesh.slice(procs=1).info.call_one().get(timeout=5)[0] == pids[1]
        assert not [e for e in s._supervisor.events if e["ev"] == "restart"]


def _drop_behind_the_controllers_back(s: Session, mesh, rank: int) -> None:
    """Stop a member on its proc without the session knowing, as a leader deposed while it
    rebuilt a replaced proc leaves it: its successor believes the member is there. The call id
    is one the program never reaches."""
    meta = {"sid": s.sid, "e": s.epoch, "s": 10**9 + rank, "a": mesh.name, "m": "__stop__", "d": b"",
            "pt": rank, "rt": s.runtime.reply_address}
    s.runtime.send_to_proc(mesh._procs[rank], wire.encode(Kind.STOP, meta))
    deadline = time.monotonic() + 5
    while True:  # its calls keep being answered until the stop has reached the proc
        try:
            mesh.slice(procs=rank).info.call_one().get(timeout=5)
        except SupervisionError as e:
            assert "no actor" in str(e), e
            return
        assert time.monotonic() < deadline, "the member was never stopped"
        time.sleep(0.02)


@pytest.mark.parametrize("strategy", ["one_for_one", "one_for_all"])
def test_a_supervised_member_missing_from_its_proc_is_rebuilt_by_its_policy(strategy):
    """The call that finds the member gone fails (SupervisionError, journaled); the member is
    a failure like any other, which its policy restarts on the same proc."""
    with Session(f"missing-{strategy}") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("m", Member, restart=RestartPolicy(strategy=strategy))
        before = mesh.info.call().get().values()
        _drop_behind_the_controllers_back(s, mesh, 0)
        pid, incarnation = _retry_info(mesh, 0)
        assert (pid, incarnation) == (before[0][0], 1)
        assert mesh.slice(procs=1).info.call_one().get(timeout=5) == (before[1][0], 1 if strategy == "one_for_all" else 0)
        restarts = [e for e in s._supervisor.events if e["ev"] == "restart"]
        assert len(restarts) == 1, restarts


def test_a_missing_member_that_its_policy_leaves_down_or_the_program_stopped_stays_down():
    with Session("missing-stays-down") as s:
        procs = s.spawn_procs(per_host={"procs": 2})
        temporary = procs.spawn("t", Member, restart="temporary")
        _drop_behind_the_controllers_back(s, temporary, 0)
        stopped = procs.spawn("m", Member, restart="permanent")
        stopped.slice(procs=0).stop()
        exited = procs.spawn("x", Member, restart="transient")
        with pytest.raises(SupervisionError):
            exited.slice(procs=0).quit.call_one(True).get(timeout=5)  # a normal exit: left down
        for mesh in (temporary, stopped, exited):
            for _ in range(3):
                with pytest.raises(SupervisionError, match="no actor"):
                    mesh.slice(procs=0).info.call_one().get(timeout=5)
                time.sleep(0.1)
        assert not [e for e in s._supervisor.events if e["ev"] == "restart"]
        assert stopped.slice(procs=1).info.call_one().get(timeout=5)[1] == 0


class Fatal(BaseException):
    """Not an Exception: an endpoint raising it cannot be answered with an ActorError."""


class Raiser(Actor):
    def __init__(self) -> None:
        self.served = 0

    @endpoint
    async def fatal_async(self) -> None:
        raise Fatal("async")

    @endpoint
    def fatal_sync(self) -> None:
        raise Fatal("sync")

    @endpoint
    async def serve(self) -> tuple[int, int]:
        self.served += 1
        return context().incarnation, self.served


@pytest.mark.parametrize("endpoint_name", ["fatal_async", "fatal_sync"])
def test_a_base_exception_in_an_endpoint_fails_its_actor_and_the_policy_restarts_it(endpoint_name):
    """Before, an async endpoint raising one parked the actor's mailbox for good: that call and
    every later one hung. Now the actor fails as an abnormal exit (Monarch fails the actor too)."""
    with Session(f"base-exception-{endpoint_name}") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("r", Raiser, restart="permanent")
        assert mesh.serve.call_one().get(timeout=10) == (0, 1)
        with pytest.raises(SupervisionError, match=rf"{endpoint_name} raised Fatal"):
            getattr(mesh, endpoint_name).call_one().get(timeout=10)
        deadline = time.monotonic() + 20
        while True:  # the restart policy brings up a fresh instance, which answers
            try:
                assert mesh.serve.call_one().get(timeout=10) == (1, 1)
                break
            except SupervisionError:
                assert time.monotonic() < deadline, "the failed actor was not restarted"
                time.sleep(0.05)


def test_without_supervision_later_calls_to_an_actor_failed_that_way_are_answered_not_hung():
    with Session("base-exception-unsupervised") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("r", Raiser)
        queued = [mesh.fatal_async.call_one(), mesh.serve.call_one()]
        with pytest.raises(SupervisionError):
            queued[0].get(timeout=10)
        with pytest.raises(SupervisionError):
            queued[1].get(timeout=10)  # it waited in the mailbox behind the failed call
        with pytest.raises(SupervisionError):
            mesh.serve.call_one().get(timeout=10)  # the actor is gone: "no actor", at once
