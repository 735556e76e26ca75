"""Real OpenSSH servers on namespace hosts (as root), for the tests of `regent launch ssh`: one
sshd per host listening on that host's address, port 22, with its own config, host key and
authorized keys in the work directory, and an ssh client config naming the hosts, so that
`ssh -F <config_path> h1 CMD` runs CMD in host h1's namespace. Nothing system-wide is read
(no /etc/ssh, no ~/.ssh) or changed, and close() leaves no sshd running.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from regent.chaos.netns import NamespaceHosts
from regent.chaos.netns import unavailable_reason as netns_unavailable_reason

__all__ = ["SshHosts", "SshdError", "SshdUnavailable", "sshd_unavailable_reason"]

_SBIN = ("/usr/sbin", "/sbin")
_PORT = 22

# sshd insists on its privilege-separation directory, /run/sshd (a path fixed when it was built).
# Where the machine has none, each sshd gets a mount namespace whose /run holds one: a tmpfs over
# /run in which every entry of the real /run is bound back (submounts too, so /run/netns still
# names the namespaces), plus an empty sshd/. The namespace is a slave of the machine's, as
# `ip netns exec`'s are: the machine's mounts and unmounts (namespaces made and deleted) reach it,
# its own never leave it, and they end with the sshd and its sessions.
_PRIVSEP_RUN = r"""
set -e
if [ ! -d /run/sshd ]; then
    mount --rbind /run "$REAL_RUN"
    mount -t tmpfs -o mode=0755 regent-run /run
    for entry in "$REAL_RUN"/* "$REAL_RUN"/.[!.]*; do
        name=${entry##*/}
        if [ -L "$entry" ]; then
            cp -P "$entry" "/run/$name"
        elif [ -d "$entry" ]; then
            mkdir "/run/$name" && mount --rbind "$entry" "/run/$name"
        elif [ -e "$entry" ]; then
            : > "/run/$name" && mount --bind "$entry" "/run/$name"
        fi
    done
    mkdir -m 0755 /run/sshd
fi
exec "$@"
"""


class SshdUnavailable(RuntimeError):
    """sshd hosts cannot be made here (not root, OpenSSH missing, no namespaces)."""


class SshdError(RuntimeError):
    """An sshd did not start; the message holds its log's tail."""


def _which(program: str) -> str | None:
    return shutil.which(program, path=os.pathsep.join([os.environ.get("PATH", ""), *_SBIN]))


def sshd_unavailable_reason() -> str | None:
    """Why SshHosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "sshd on namespace hosts needs root"
    missing = [p for p in ("sshd", "ssh", "ssh-keygen", "unshare") if _which(p) is None]
    if missing:
        return f"OpenSSH is not installed ({', '.join(missing)} missing): run scripts/install_sshd.sh"
    return netns_unavailable_reason()


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


class SshHosts:
    """An sshd on hosts `names` of `net` (a created NamespaceHosts, left to its owner to close;
    all its hosts when `names` is None), or, without `net`, on hosts `names` made here and
    removed by close()."""

    def __init__(self, workdir: Path, names: Sequence[str] | None = None, net: NamespaceHosts | None = None):
        if names is None and net is None:
            raise ValueError("give SshHosts the names of the hosts to make, or a NamespaceHosts to use")
        self.workdir = Path(workdir)
        self._owns_net = net is None
        self.net = net if net is not None else NamespaceHosts(list(names or []))
        self.names = list(names) if names is not None else list(self.net.names)
        unknown = [n for n in self.names if n not in self.net.names]
        if unknown:
            raise ValueError(f"no namespace host named {', '.join(unknown)}; hosts: {', '.join(self.net.names)}")
        self.config_path = self.workdir / "ssh_config"
        self.identity = self.workdir / "id_ed25519"
        self.authorized_keys = self.workdir / "authorized_keys"
        self.known_hosts = self.workdir / "known_hosts"
        self._sshd: dict[str, subprocess.Popen] = {}

    # --- making and removing ----------------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> SshHosts:
        reason = sshd_unavailable_reason()
        if reason:
            raise SshdUnavailable(reason)
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            if self._owns_net:
                self.net.create()
            self._keygen(self.identity)
            shutil.copyfile(self.identity.with_suffix(".pub"), self.authorized_keys)
            self._write_client_config()
            for name in self.names:
                self._keygen(self._path(name, "host_key"))
                self._write_server_config(name)
            for name in self.names:
                self.start_sshd(name, timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every sshd and what its sessions still run; remove the hosts if made here."""
        for name in list(self._sshd):
            self.stop_sshd(name)
        if self._owns_net:
            self.net.close()

    def __enter__(self) -> SshHosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _path(self, name: str, what: str) -> Path:
        return self.workdir / f"{what}-{name}"

    @staticmethod
    def _keygen(path: Path) -> None:
        subprocess.run([_which("ssh-keygen") or "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name,
                        "-f", str(path)], check=True, capture_output=True)

    def _write_client_config(self) -> None:
        blocks = [f"Host {name}\n    HostName {self.net.address(name)}\n" for name in self.names]
        blocks.append(
            "Host *\n"
            "    User root\n"
            f"    Port {_PORT}\n"
            f"    IdentityFile {self.identity}\n"
            "    IdentitiesOnly yes\n"
            "    IdentityAgent none\n"
            "    StrictHostKeyChecking accept-new\n"
            f"    UserKnownHostsFile {self.known_hosts}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    BatchMode yes\n"
            "    ConnectTimeout 5\n"
            "    ControlMaster no\n"
            "    ControlPath none\n"
            "    LogLevel ERROR\n")
        self.config_path.write_text("\n".join(blocks))

    def _write_server_config(self, name: str) -> None:
        self._path(name, "sshd_config").write_text(
            f"ListenAddress {self.net.address(name)}:{_PORT}\n"
            f"HostKey {self._path(name, 'host_key')}\n"
            f"PidFile {self._path(name, 'sshd')}.pid\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            "PermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "UseDNS no\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "LogLevel VERBOSE\n"
            "Subsystem sftp internal-sftp\n")

    # --- the servers ------------------------------------------------------------------------

    def start_sshd(self, name: str, timeout_s: float = 10.0) -> None:
        """Start host `name`'s sshd (again, after stop_sshd) and wait until it listens."""
        if name in self._sshd:
            raise ValueError(f"the sshd of host {name} is already running")
        real_run = self._path(name, "run")
        real_run.mkdir(exist_ok=True)
        log = self._path(name, "sshd").with_suffix(".log")
        sshd = [_which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f", str(self._path(name, "sshd_config")),
                "-h", str(self._path(name, "host_key"))]
        argv = [_which("unshare") or "unshare", "--mount", "--propagation", "slave", "sh", "-c", _PRIVSEP_RUN, "sh",
                *self.net.command(name, sshd)]
        env = {**os.environ, "REAL_RUN": str(real_run)}
        with open(log, "ab") as out:
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self._sshd[name] = p
        deadline = time.monotonic() + timeout_s
        while not _listening(self.net.address(name), _PORT):
            if p.poll() is not None or time.monotonic() > deadline:
                self.stop_sshd(name)
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
                raise SshdError(f"the sshd of host {name} did not listen on {self.net.address(name)}:{_PORT} "
                                f"(exit {p.returncode}):\n{tail}")
            time.sleep(0.05)

    def stop_sshd(self, name: str) -> None:
        """Stop host `name`'s sshd, and the sessions it still serves: ssh to it is then refused."""
        p = self._sshd.pop(name, None)
        if p is None:
            return
        try:
            sessions = psutil.Process(p.pid).children(recursive=True)
        except psutil.Error:
            sessions = []
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for child in sessions:
            try:
                child.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(sessions, timeout=5)  # gone, not only signalled, when this returns

    def sshd_pids(self) -> list[int]:
        return [p.pid for p in self._sshd.values()]

    # --- the client -------------------------------------------------------------------------

    def ssh_command(self, host: str, cmd: str | Sequence[str]) -> list[str]:
        """The ssh command line that runs `cmd` (a shell string, or an argv to quote) on `host`."""
        remote = cmd if isinstance(cmd, str) else shlex.join(cmd)
        return [_which("ssh") or "ssh", "-F", str(self.config_path), host, remote]

    def ssh(self, host: str, cmd: str | Sequence[str], timeout_s: float = 30.0,
            check: bool = False) -> subprocess.CompletedProcess:
        """Run `cmd` on `host` over ssh; its output and exit status (255: ssh itself failed)."""
        return subprocess.run(self.ssh_command(host, cmd), capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, check=check)
