"""The sshd fixture is real OpenSSH: `ssh -F config HOST CMD` runs CMD in that host's namespace,
a stopped sshd refuses connections, and close() leaves no sshd or session running."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from regent.chaos.netns import NamespaceHosts
from tests.support.sshd import SshHosts, sshd_unavailable_reason


def _names(pids: list[int]) -> list[str]:
    names = []
    for pid in pids:
        try:
            names.append(psutil.Process(pid).name())
        except psutil.Error:
            pass
    return names


def test_ssh_runs_the_command_in_each_hosts_namespace(ssh_hosts: SshHosts) -> None:
    for host in ["h1", "h2", "h3"]:
        done = ssh_hosts.ssh(host, "hostname -I; readlink /proc/self/ns/net")
        assert done.returncode == 0, done.stderr
        address, netns = done.stdout.split()
        assert address == ssh_hosts.net.address(host)
        assert netns == f"net:[{os.stat(f'/run/netns/{ssh_hosts.net.netns(host)}').st_ino}]"


def test_the_client_config_alone_reaches_a_host(ssh_hosts: SshHosts) -> None:
    done = subprocess.run(["ssh", "-F", str(ssh_hosts.config_path), "h2", "echo", "$((6 * 7))"],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr


def test_a_stopped_sshd_refuses_the_connection_and_a_restarted_one_serves(ssh_hosts: SshHosts) -> None:
    ssh_hosts.stop_sshd("h2")
    refused = ssh_hosts.ssh("h2", "true", timeout_s=10)
    assert refused.returncode == 255
    assert "Connection refused" in refused.stderr
    assert ssh_hosts.ssh("h1", "true").returncode == 0
    ssh_hosts.start_sshd("h2")
    assert ssh_hosts.ssh("h2", "true").returncode == 0


def test_close_stops_every_sshd_and_session_and_leaves_the_callers_hosts(tmp_path: Path) -> None:
    reason = sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with NamespaceHosts(["h1", "h2"]) as net:
        hosts = SshHosts(tmp_path / "ssh", net=net).start()
        sshds = hosts.sshd_pids()
        client = subprocess.Popen(hosts.ssh_command("h1", "sleep 600"), stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while "sleep" not in _names(net.pids("h1")):
                assert time.monotonic() < deadline, "the session's sleep did not start"
                time.sleep(0.05)
            hosts.close()
            assert [p for p in sshds if psutil.pid_exists(p)] == []
            assert net.pids("h1") == [] and net.pids("h2") == []
            assert client.wait(10) != 0  # its session ended under it
        finally:
            client.kill()
            client.wait()
        assert os.path.exists(f"/run/netns/{net.netns('h1')}")
    assert [p.pid for p in psutil.process_iter(["cmdline"])
            if str(tmp_path) in " ".join(p.info["cmdline"] or [])] == []
