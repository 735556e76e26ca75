"""Monarch's `unhandled_fault_hook`, regent's `Session(on_unhandled_fault=fn)`: an actor failure
nothing handles (an escalation, or a member of an unsupervised mesh failing) reaches the hook
on the program's thread at its next session call, journaled first, and a standby replaying the
journal calls it for the same faults at the same points (controller/faults.py)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from regent.controller import MeshFailure, RestartPolicy, Session, SupervisionError
from regent.journal import open_journal
from regent.worker import Actor, endpoint
from regent.worker.errors import ActorExit
from tests.failover.harness import Cluster

PROGRAM = str(Path(__file__).parent / "programs" / "unhandled_failover.py")


class Member(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def quit(self, normal: bool) -> None:
        raise ActorExit("asked to stop", normal=normal)


def _wait(predicate, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.02)


def _kill(mesh, rank: int) -> None:
    os.kill(mesh.slice(procs=rank).pid.call_one().get(timeout=10), signal.SIGKILL)
    _wait(lambda: not mesh._procs[rank].alive, what=f"the death of {mesh.name}[{rank}]")


def _unhandled_records(s: Session) -> list[dict]:
    return [r.data for r in s.journal.read(s.name) if r.kind == "sup" and r.data.get("ev") == "unhandled_fault"]


class _Seen:
    """A hook that records each failure and the thread it ran on."""

    def __init__(self) -> None:
        self.failures: list[MeshFailure] = []
        self.threads: list[int] = []

    def __call__(self, failure: MeshFailure) -> None:
        self.failures.append(failure)
        self.threads.append(threading.get_ident())


def test_an_escalation_reaches_the_hook_on_the_program_thread_at_its_next_call_journaled_first():
    seen = _Seen()
    with Session("uf-escalation", on_unhandled_fault=seen) as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("m", Member, restart=RestartPolicy(max_restarts=0))
        _kill(mesh, 1)
        _wait(lambda: s._supervisor.meshes["m"].supervisor.escalated, what="the escalation")
        time.sleep(0.3)
        assert seen.failures == []  # nothing runs it behind the program's back
        at = s.core.next_seq
        s.now()
        assert len(seen.failures) == 1 and seen.threads == [threading.get_ident()]
        (failure,) = seen.failures
        assert (failure.mesh, failure.rank, failure.kind, failure.escalation) == ("m", 1, "escalation", True)
        assert failure.point["procs"] == 1 and failure.point.rank == 1
        assert "exceeded its restart intensity" in failure.reason
        (record,) = _unhandled_records(s)
        assert record["at"] == at and record["kind"] == "escalation" and record["rank"] == 1
        assert s.writer.durable_lsn >= max(r.lsn for r in s.journal.read(s.name) if r.kind == "sup")
        s.now()
        assert len(seen.failures) == 1  # once
        with pytest.raises(SupervisionError, match="exceeded its restart intensity"):
            mesh.pid.call().get(timeout=5)


def test_a_sigkilled_proc_of_an_unsupervised_mesh_reaches_the_hook():
    seen = _Seen()
    with Session("uf-unsupervised-kill", on_unhandled_fault=seen) as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("u", Member)
        _kill(mesh, 0)
        assert seen.failures == []
        assert isinstance(mesh.slice(procs=1).pid.call_one().get(timeout=10), int)  # its call ran the hook
        (failure,) = seen.failures
        assert (failure.mesh, failure.rank, failure.kind, failure.escalation) == ("u", 0, "unsupervised", False)
        assert failure.point["procs"] == 0 and failure.reason
        assert seen.threads == [threading.get_ident()]
        assert [r["kind"] for r in _unhandled_records(s)] == ["unsupervised"]
        with pytest.raises(SupervisionError):
            mesh.slice(procs=0).pid.call_one().get(timeout=5)
        s.now()
        assert len(seen.failures) == 1


@pytest.mark.parametrize("normal", [False, True])
def test_an_unsupervised_actor_exiting_reaches_the_hook_only_if_abnormally(normal):
    seen = _Seen()
    with Session(f"uf-exit-{normal}", on_unhandled_fault=seen) as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("x", Member)
        with pytest.raises(SupervisionError):
            mesh.quit.call_one(normal).get(timeout=10)
        s.now()
        s.now()
        if normal:
            assert seen.failures == []
        else:
            assert [(f.mesh, f.rank, f.kind) for f in seen.failures] == [("x", 0, "unsupervised")]
            assert "asked to stop" in seen.failures[0].reason


def test_a_failure_the_restart_policy_handles_does_not_reach_the_hook():
    seen = _Seen()
    with Session("uf-handled", on_unhandled_fault=seen) as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("m", Member, restart="permanent")
        victim = mesh.slice(procs=1).pid.call_one().get(timeout=10)
        _kill(mesh, 1)
        _wait(lambda: any(e["ev"] == "restart" for e in s._supervisor.events), what="the restart")
        assert mesh.slice(procs=1).pid.call_one().get(timeout=10) != victim
        time.sleep(0.3)
        s.now()
        assert seen.failures == [] and _unhandled_records(s) == []


def test_the_hook_raising_is_logged_and_the_session_goes_on(monkeypatch):
    import regent.controller.faults as faults

    logged: list[tuple[str, dict]] = []

    class _Log:
        def exception(self, event: str, **kw) -> None:
            logged.append((event, kw))

        def warning(self, event: str, **kw) -> None:
            pass

    monkeypatch.setattr(faults, "log", _Log())
    calls: list[MeshFailure] = []

    def hook(failure: MeshFailure) -> None:
        calls.append(failure)
        raise RuntimeError("the hook broke")

    with Session("uf-hook-raises", on_unhandled_fault=hook) as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("u", Member)
        _kill(mesh, 0)
        assert isinstance(s.now(), float)  # the hook raised inside it; the call went on
        assert len(calls) == 1 and logged and "hook raised" in logged[0][0] and logged[0][1]["mesh"] == "u"
        assert isinstance(mesh.slice(procs=1).pid.call_one().get(timeout=10), int)
        _kill(mesh, 1)
        s.now()
        assert [f.rank for f in calls] == [0, 1]  # a later failure still reaches it


def test_without_a_hook_a_failure_is_only_logged():
    with Session("uf-no-hook") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("u", Member)
        _kill(mesh, 0)
        s.now()
        assert isinstance(mesh.slice(procs=1).pid.call_one().get(timeout=10), int)
        assert _unhandled_records(s) == []


@pytest.mark.parametrize("hold", ["after", "before"])
def test_a_standby_replaying_the_journal_calls_the_hook_for_the_same_faults_in_the_same_order(tmp_path, hold):
    """hold="after": the primary handed both faults to its hook, then was SIGKILLed; the standby's
    replay calls its hook for the same faults, in order, inside the same `s.now()` polls (the
    program's poll loops exit at the same count, or the replay would diverge), and never again
    for the faults it finds itself at takeover (the dead proc, the escalated mesh, which stays
    escalated). hold="before": the primary died before handing the first over; the standby
    finds it and hands it over once, at its first live call."""
    journal = f"sqlite://{tmp_path / 'journal.db'}"
    c = Cluster(f"uf-{hold}-{os.getpid()}", journal, tmp_path, program=PROGRAM)
    try:
        primary = c.start(REGENT_TEST_HOLD=hold)
        c.wait_leader(1)
        log = tmp_path / f"{c.session}.ctl0.log"
        deadline = time.monotonic() + 60
        while "holding" not in log.read_text():
            assert primary.poll() is None and time.monotonic() < deadline, c.log_tail()
            time.sleep(0.02)
        primary_saw = json.loads(next(line[4:] for line in log.read_text().splitlines() if line.startswith("saw ")))
        standby = c.start()
        c.wait_standby()
        os.kill(primary.pid, signal.SIGKILL)
        primary.wait()
        result = c.finish(standby, timeout=90)
        expected = [["u", 1, "unsupervised", 1], ["e", 0, "escalation", 0]]
        assert result["faults"] == expected, c.log_tail()
        assert result["role"] == "standby-took-over"
        assert result["e"] == "escalated"  # the standby did not restart what the primary gave up on
        j = open_journal(journal)
        try:
            sup = [r.data for r in j.read(c.session) if r.kind == "sup"]
        finally:
            j.close()
        records = [d for d in sup if d.get("ev") == "unhandled_fault"]
        # The standby neither restarted the mesh nor escalated it a second time.
        assert [d["ev"] for d in sup].count("escalation") == 1 and [d["ev"] for d in sup].count("restart") == 1
        assert [[d["mesh"], d["rank"], d["kind"]] for d in records] == [f[:3] for f in expected]  # once each
        if hold == "after":
            assert primary_saw["faults"] == expected
            assert result["polls"] == primary_saw["polls"]  # the same points of the program
            assert len({d["at"] for d in records}) == 2
    finally:
        c.stop_all()
