"""SIGKILL and SIGSTOP/SIGCONT of a real process, checked through the kernel's process state."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from regent.chaos import (
    FaultLog,
    ProcessFaultError,
    host_processes,
    kill,
    kill_host,
    pause,
    paused,
    process_state,
    resume,
)

RUNNING = ("running", "sleeping", "disk-sleep")  # disk-sleep: a brief uninterruptible wait


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    proc.wait()


def test_pause_stops_the_process_and_resume_continues_it(sleeper: subprocess.Popen) -> None:
    faults = FaultLog()
    pause_event = pause(sleeper.pid, target="sleeper", log_to=faults)
    assert process_state(sleeper.pid) == "stopped"
    resume_event = resume(sleeper.pid, target="sleeper", log_to=faults)
    assert process_state(sleeper.pid) in RUNNING
    assert [(e.kind, e.target) for e in faults.events()] == [
        ("pause", "sleeper"),
        ("resume", "sleeper"),
    ]
    assert faults.events() == [pause_event, resume_event]
    assert pause_event.t <= resume_event.t
    assert pause_event.detail == {"pid": sleeper.pid, "signal": "SIGSTOP"}


def test_paused_holds_the_process_stopped_for_at_least_the_given_seconds(
    sleeper: subprocess.Popen,
) -> None:
    start = time.monotonic()
    with paused(sleeper.pid, 0.3) as event:
        assert event.kind == "pause"
        assert process_state(sleeper.pid) == "stopped"
    assert time.monotonic() - start >= 0.3
    assert process_state(sleeper.pid) in RUNNING


def test_paused_resumes_the_process_when_the_block_raises(sleeper: subprocess.Popen) -> None:
    with pytest.raises(RuntimeError, match="boom"), paused(sleeper.pid):
        raise RuntimeError("boom")
    assert process_state(sleeper.pid) in RUNNING


def test_kill_sigkills_even_a_paused_process(sleeper: subprocess.Popen) -> None:
    pause(sleeper.pid)
    event = kill(sleeper.pid, target="victim", note={"why": "test"})
    assert sleeper.wait(5) == -signal.SIGKILL
    assert (event.kind, event.target) == ("kill", "victim")
    assert event.detail == {"pid": sleeper.pid, "signal": "SIGKILL", "why": "test"}


def test_faults_on_a_gone_process_say_so(sleeper: subprocess.Popen) -> None:
    sleeper.kill()
    sleeper.wait()
    assert process_state(sleeper.pid) is None
    for fault in (kill, pause, resume):
        with pytest.raises(ProcessFaultError, match=f"pid {sleeper.pid}: no such process"):
            fault(sleeper.pid)


def test_fault_log_serialises_the_timeline() -> None:
    faults = FaultLog()
    faults.record("down", "controller->etcd", {"fault": 0})
    faults.record("up", "controller->etcd", {"fault": 0})
    text = faults.to_json()
    assert '"kind": "down"' in text and '"target": "controller->etcd"' in text
    assert len(faults) == 2


def test_a_chaos_etcd_whose_port_was_taken_since_it_was_chosen_starts_on_another_and_restarts_there():
    from regent.chaos.etcd import LocalEtcd, etcd_binary
    from tests.support.etcd import held_port

    if etcd_binary() is None:
        pytest.skip("etcd is not on PATH (scripts/install_etcd.sh, or set REGENT_ETCD)")
    server = LocalEtcd()
    taken = server.client_port
    with held_port(taken), server:
        moved = server.client_port
        assert moved != taken
        kill(server.proc.pid)
        server.proc.wait()
        server.reap()
        server.start()  # a restart keeps the port its clients know
        assert server.client_port == moved and server.running


AGENT = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


def _agent() -> tuple[subprocess.Popen, int]:
    agent = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True)
    return agent, int(agent.stdout.readline())


def _proc_of(port: int) -> subprocess.Popen:
    # What the command line of a proc an agent started says of it (worker.proc's flags).
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--id", "p",
                             "--host-inbox", f"tcp://127.0.0.1:{port}"])


def test_kill_host_kills_the_agent_and_every_proc_it_started_and_nothing_else() -> None:
    (agent, port), (other, other_port) = _agent(), _agent()
    procs, bystander = [_proc_of(port), _proc_of(port)], _proc_of(other_port)
    try:
        deadline = time.monotonic() + 10
        while host_processes(agent.pid) != sorted(p.pid for p in procs):
            assert time.monotonic() < deadline, host_processes(agent.pid)
            time.sleep(0.05)
        log = FaultLog()
        event = kill_host(agent.pid, target="host/a", log_to=log)
        assert event.kind == "kill_host" and event.detail["procs"] == sorted(p.pid for p in procs)
        for p in [agent, *procs]:
            assert p.wait(5) == -signal.SIGKILL
        assert other.poll() is None and bystander.poll() is None
        assert [e.kind for e in log.events()] == ["kill_host"]
    finally:
        for p in [agent, other, *procs, bystander]:
            if p.poll() is None:
                p.kill()
            p.wait()
    with pytest.raises(ProcessFaultError, match="no such process"):
        host_processes(agent.pid)
