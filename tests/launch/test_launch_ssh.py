"""`regent launch ssh` over real sshds on three namespace hosts: it copies the CURVE keys
where missing, starts an agent on each host, runs the program here with a standby on h2, and
the standby finishes the run after the primary's SIGKILL (every call once); Ctrl-C leaves no
agent or proc anywhere; hosts with other keys or no sshd fail with one line, starting nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from regent.controller.edge import STANDING_BY
from tests.failover.harness import check_exactly_once
from tests.support.leftovers import left_running
from tests.support.sshd import SshHosts

REPO = Path(__file__).resolve().parents[2]
MIXED = REPO / "tests" / "failover" / "programs" / "mixed.py"
STEPS = 150


def _marks(tmp_path: Path) -> list[str]:
    """What names this test's processes: its session, its cluster, its launcher's environment."""
    return [f"ssh-{tmp_path.name}", f"c-{tmp_path.name}", str(tmp_path / "home")]


def _argv(ssh_hosts: SshHosts, tmp_path: Path, *extra: str) -> list[str]:
    leaders = tmp_path / "leaders"
    env = [f"REGENT_TEST_SESSION=ssh-{tmp_path.name}", "REGENT_TEST_HOSTS=3",
           f"REGENT_TEST_STEPS={STEPS}", f"REGENT_TEST_LEADER_FILE={leaders}",
           "REGENT_TEST_TTL=3.0",  # a lease a loaded machine keeps
           "REGENT_TEST_STEP_S=0.05",
           f"REGENT_TEST_HOLD_FILE={tmp_path / 'hold'}"]  # held at step 3 while the file exists
    return [sys.executable, "-m", "regent.cli", "launch", "ssh", str(MIXED), "--hosts", "h1,h2,h3",
            "--ssh-config", str(ssh_hosts.config_path), "--cluster", f"c-{tmp_path.name}", "--remote-home", str(tmp_path / "homes" / "{host}"),
            *(x for e in env for x in ("--env", e)), *extra]


def _start(argv: list[str], home: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                env={**os.environ, "REGENT_HOME": str(home), "PYTHONPATH": str(REPO)})


def _wait_step(log: Path, step: int, launcher: subprocess.Popen, timeout_s: float = 180.0) -> None:
    # Waits on the job, not the clock: beside five other workers, the launch's own etcd and
    # three agents took 35 s to register before the first proc started (fresh-clone run 2).
    deadline = time.monotonic() + timeout_s
    while not re.search(rf"^(\[standby h2\] )?step {step}$", log.read_text(), re.M):
        assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def _wait_standing_by(log: Path, launcher: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until the other controller stands by: one still starting when the primary dies would
    lead as a fresh primary (a loaded machine), and this test is about a takeover."""
    deadline = time.monotonic() + timeout
    while STANDING_BY not in log.read_text():
        assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def test_a_run_over_ssh_hosts_survives_the_primarys_sigkill(ssh_hosts: SshHosts, home: Path, tmp_path: Path) -> None:
    log = tmp_path / "launch.log"
    hold = tmp_path / "hold"  # the primary waits at step 3 until the kill: it cannot finish first
    hold.touch()
    launcher = _start(_argv(ssh_hosts, tmp_path, "--standby-on", "h2"), home, log)
    try:
        _wait_step(log, 3, launcher)
        primary = int((tmp_path / "leaders").read_text().split()[0])
        _wait_standing_by(log, launcher)
        # The controller here and the standby on h2 start at once; the election decides who
        # leads first (here, unless the machine is loaded), and the other takes over.
        here = psutil.Process(primary).ppid() == launcher.pid
        os.kill(primary, signal.SIGKILL)
        hold.unlink()
        assert launcher.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if launcher.poll() is None:
            launcher.kill()
    text = log.read_text()
    prefix = "[standby h2] " if here else ""
    line = next(x for x in text.splitlines() if x.startswith(prefix + "{"))
    result = json.loads(line.removeprefix(prefix))
    assert result["role"] == "standby-took-over"
    check_exactly_once(result, STEPS)
    for host in ("h1", "h2", "h3"):
        assert f"copied the cluster's CURVE keys to {host}:" in text
        keys = tmp_path / "homes" / host / "keys"
        assert (keys / "regent.key_secret").read_bytes() == (home / "keys" / "regent.key_secret").read_bytes()
        assert (keys / "regent.key_secret").stat().st_mode & 0o077 == 0
    assert "one etcd member on this machine that lives as long as this launch" in text
    assert "stopped the host agents on h1, h2, h3" in text
    assert left_running(_marks(tmp_path)) == []


def test_ctrl_c_leaves_no_agent_or_proc_anywhere(ssh_hosts: SshHosts, home: Path, tmp_path: Path) -> None:
    log = tmp_path / "launch.log"
    launcher = _start(_argv(ssh_hosts, tmp_path, "--standby-on", "h2"), home, log)
    try:
        _wait_step(log, 3, launcher)
        launcher.send_signal(signal.SIGINT)
        launcher.wait(60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    deadline = time.monotonic() + 10
    while left_running(_marks(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left_running(_marks(tmp_path)) == [], log.read_text()[-3000:]


def test_bad_hosts_fail_with_one_line_and_start_nothing(ssh_hosts: SshHosts, home: Path, tmp_path: Path) -> None:
    # Other keys on h3: refused, not overwritten.
    other = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "regent.cli", "keys", "init"], check=True, capture_output=True,
                   env={**os.environ, "REGENT_HOME": str(other)})
    (tmp_path / "homes" / "h3").mkdir(parents=True)
    import shutil

    shutil.copytree(other / "keys", tmp_path / "homes" / "h3" / "keys")
    env = {**os.environ, "REGENT_HOME": str(home), "PYTHONPATH": str(REPO)}
    done = subprocess.run(_argv(ssh_hosts, tmp_path), capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "host h3 holds other CURVE keys" in done.stderr, done.stderr
    assert (tmp_path / "homes" / "h3" / "keys" / "regent.key_secret").read_bytes() == \
        (other / "keys" / "regent.key_secret").read_bytes()
    # No sshd on h2: said, and nothing started.
    shutil.rmtree(tmp_path / "homes" / "h3")
    ssh_hosts.stop_sshd("h2")
    done = subprocess.run(_argv(ssh_hosts, tmp_path), capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "cannot reach host h2 over ssh" in done.stderr, done.stderr
    assert "Connection refused" in done.stderr
    done = subprocess.run(_argv(ssh_hosts, tmp_path, "--journal", "etcd://127.0.0.1:1"), capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2 and "does not answer" in done.stderr, done.stderr
    done = subprocess.run(_argv(ssh_hosts, tmp_path, "--standby-on", "h9"), capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 2 and "is not one of --hosts" in done.stderr
    for d in (done,):
        assert len(d.stderr.strip().splitlines()) == 1, d.stderr
    assert left_running(_marks(tmp_path)) == []
