"""`regent launch ssh`: a regent job on machines reached over ssh (OpenSSH, with the user's
own keys and config), run from this machine.

It checks every host answers, copies the cluster's CURVE keys to hosts that lack them (and
refuses hosts that hold other keys), starts one `regent host` agent per host, runs the
program here as the primary controller and, with --standby-on, a standby on that host, and
stops the agents (and with them their procs) when the run ends or on Ctrl-C. Without
--journal the journal is a single etcd member on this machine, for the launch's life.
"""

from __future__ import annotations

import argparse
import base64
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from regent.cli.launch.common import (
    LaunchError,
    check_journal,
    check_keys,
    check_program,
    etcd_command,
    launch_env,
    say,
    supervise,
)

PROG = "regent launch ssh"
KEY_FILES = ("regent.key", "regent.key_secret", "authorized/regent.key")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="the controller program (PROGRAM.py); arguments after -- go to it")
    p.add_argument("--hosts", required=True, help="the machines, comma-separated, as ssh names them")
    p.add_argument("--standby-on", default=None, metavar="HOST", help="run a standby controller on this host")
    p.add_argument("--journal", default=None,
                   help="etcd://HOST:2379[,...] (default: one etcd member on this machine, for this launch only)")
    p.add_argument("--cluster", default=None, help="the regent cluster name (default ssh-<pid>)")
    p.add_argument("--ssh-config", "-F", default=None, help="an ssh config file (ssh -F)")
    p.add_argument("--ssh-option", "-o", action="append", default=[], metavar="OPT", help="ssh -o OPT (repeatable)")
    p.add_argument("--python", default=sys.executable,
                   help="the Python that runs regent on the hosts (default: this one's path)")
    p.add_argument("--remote-home", default="$HOME/.regent",
                   help="REGENT_HOME on the hosts ({host} is replaced by the host's name; default $HOME/.regent)")
    p.add_argument("--etcd-port", type=int, default=2379, help="this launch's own etcd client port (default 2379)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable of the program, here and on the standby's host (repeatable)")


@dataclass
class Remote:
    """A process on a host, started over ssh; `pid` is its pid there."""

    host: str
    popen: subprocess.Popen
    pid: int | None = None


@dataclass
class SshLaunch:
    a: argparse.Namespace
    program: Path
    args: list[str]
    hosts: list[str] = field(default_factory=list)
    agents: list[Remote] = field(default_factory=list)
    controllers: list[subprocess.Popen] = field(default_factory=list)
    standby: Remote | None = None
    etcd: subprocess.Popen | None = None
    etcd_dir: str | None = None

    def ssh(self, host: str, command: str) -> list[str]:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
        if self.a.ssh_config:
            argv += ["-F", self.a.ssh_config]
        for opt in self.a.ssh_option:
            argv += ["-o", opt]
        return [*argv, host, command]

    def home(self, host: str) -> str:
        return self.a.remote_home.replace("{host}", host)

    # --- before anything starts ----------------------------------------------------------

    def check_hosts(self) -> None:
        for host in self.hosts:
            try:
                done = subprocess.run(self.ssh(host, "true"), capture_output=True, text=True, timeout=30)
            except subprocess.TimeoutExpired:
                raise LaunchError(f"host {host} did not answer ssh within 30 s") from None
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or [f"ssh exited {done.returncode}"])[-1]
                raise LaunchError(f"cannot reach host {host} over ssh: {why}")

    def sync_keys(self, keys: Path) -> None:
        """Copy this machine's CURVE keys to hosts without any; refuse hosts with others."""
        ours = {name: (keys / name).read_bytes() for name in KEY_FILES}
        for host in self.hosts:
            home = self.home(host)
            listing = "; ".join(f'if [ -f "{home}/keys/{n}" ]; then echo {n} $(base64 -w0 "{home}/keys/{n}"); '
                                f'else echo {n} -; fi' for n in KEY_FILES)
            done = subprocess.run(self.ssh(host, listing), capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise LaunchError(f"cannot read the keys on host {host}: {done.stderr.strip()[-200:]}")
            theirs = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
            present = {n for n, v in theirs.items() if v != "-"}
            differ = [n for n in present if base64.b64decode(theirs[n]) != ours[n]]
            if differ:
                raise LaunchError(f"host {host} holds other CURVE keys in {home}/keys ({', '.join(sorted(differ))}); "
                                  "refusing to overwrite them: remove them there, or use the same keys here")
            if len(present) == len(KEY_FILES):
                continue
            script = f'umask 077; mkdir -p "{home}/keys/authorized"\n' + "".join(
                f'echo {base64.b64encode(data).decode()} | base64 -d > "{home}/keys/{n}"\n'
                for n, data in ours.items())
            done = subprocess.run(self.ssh(host, "sh -s"), input=script, capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise LaunchError(f"cannot copy the keys to host {host}: {done.stderr.strip()[-200:]}")
            say(PROG, f"copied the cluster's CURVE keys to {host}:{home}/keys")

    def own_etcd(self) -> str:
        """A single etcd member here, on the address that reaches the first host."""
        address = self._address_toward(self.hosts[0])
        self.etcd_dir = tempfile.mkdtemp(prefix="regent-etcd-")
        log = open(Path(self.etcd_dir) / "etcd.log", "wb")
        try:
            self.etcd = subprocess.Popen(etcd_command(str(Path(self.etcd_dir) / "data"), address, self.a.etcd_port),
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise LaunchError("etcd is not installed here: install it, or give --journal etcd://HOST:2379") from None
        finally:
            log.close()
        url = f"etcd://{address}:{self.a.etcd_port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                check_journal(url, timeout_s=1.0)
                break
            except LaunchError:
                if self.etcd.poll() is not None or time.monotonic() > deadline:
                    tail = (Path(self.etcd_dir) / "etcd.log").read_text()[-300:].strip()
                    raise LaunchError(f"the launch's etcd did not start on {address}:{self.a.etcd_port}: {tail}") from None
                time.sleep(0.1)
        say(PROG, f"journal {url}: one etcd member on this machine that lives as long as this launch "
                  "(its journal ends with it; give --journal for one that outlives it)")
        return url

    def _address_toward(self, host: str) -> str:
        done = subprocess.run(["ssh", *(["-F", self.a.ssh_config] if self.a.ssh_config else []), "-G", host],
                              capture_output=True, text=True, timeout=10)
        name = next((line.split()[1] for line in done.stdout.splitlines() if line.startswith("hostname ")), host)
        port = int(next((line.split()[1] for line in done.stdout.splitlines() if line.startswith("port ")), 22))
        try:
            ip = socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((ip, port))
                return s.getsockname()[0]
        except OSError as e:
            raise LaunchError(f"no route from here to host {host} ({name}): {e}") from None

    # --- starting and stopping -------------------------------------------------------------

    def _remote(self, host: str, env: dict[str, str], argv: list[str], tag: str, cwd: str | None = None) -> Remote:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        home = f'REGENT_HOME="{self.home(host)}"'
        go = f"cd {shlex.quote(cwd)} && " if cwd else ""
        command = f"echo $$; {go}exec env {home} {exports} {' '.join(shlex.quote(x) for x in argv)}"
        popen = subprocess.Popen(self.ssh(host, command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, text=True, bufsize=1)
        remote = Remote(host, popen)
        first = popen.stdout.readline().strip()
        remote.pid = int(first) if first.isdigit() else None
        threading.Thread(target=_forward, args=(popen, f"[{tag}] ", first if remote.pid is None else ""),
                         daemon=True).start()
        return remote

    def start_agents(self, cluster: str, journal: str) -> None:
        env = {"REGENT_CLUSTER": cluster, "REGENT_JOURNAL": journal, "REGENT_SECURE": "1", "PYTHONUNBUFFERED": "1"}
        for host in self.hosts:
            name = _host_name(host)
            argv = [self.a.python, "-m", "regent.cli", "host", "--cluster", cluster, "--store", journal,
                    "--advertise", "auto", "--name", name]
            self.agents.append(self._remote(host, env, argv, f"agent {host}"))
            say(PROG, f"host agent on {host} (as {name})")

    def stop_remote(self, r: Remote, sig: str = "TERM", wait_s: float = 20.0) -> None:
        if r.pid is not None and r.popen.poll() is None:
            subprocess.run(self.ssh(r.host, f"kill -{sig} {r.pid}"), capture_output=True, timeout=30)
        try:
            r.popen.wait(wait_s)
        except subprocess.TimeoutExpired:
            if r.pid is not None:
                subprocess.run(self.ssh(r.host, f"kill -KILL {r.pid}"), capture_output=True, timeout=30)
            r.popen.kill()
            r.popen.wait()

    def close(self) -> None:
        for p in self.controllers:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.standby is not None:
            self.stop_remote(self.standby, "KILL", 5.0)
        for agent in self.agents:  # SIGTERM: the agent stops its procs, then exits
            self.stop_remote(agent)
        if self.agents:
            say(PROG, f"stopped the host agents on {', '.join(a.host for a in self.agents)}")
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait()
        if self.etcd_dir:
            import shutil

            shutil.rmtree(self.etcd_dir, ignore_errors=True)

    def run(self) -> int:
        a = self.a
        self.hosts = [h.strip() for h in a.hosts.split(",") if h.strip()]
        if not self.hosts:
            raise LaunchError("--hosts names no host: give them comma-separated, e.g. --hosts a,b,c")
        if a.standby_on and a.standby_on not in self.hosts:
            raise LaunchError(f"--standby-on {a.standby_on} is not one of --hosts {','.join(self.hosts)}")
        for x in a.env:
            _key_value(x)
        keys = check_keys()
        journal = check_journal(a.journal) if a.journal else None
        self.check_hosts()
        self.sync_keys(keys)
        journal = journal or self.own_etcd()
        cluster = a.cluster or f"ssh-{os.getpid()}"
        self.start_agents(cluster, journal)
        from regent.cli.launch import wait

        if wait(journal, cluster, len(self.hosts), 60.0) != 0:
            raise LaunchError(f"the host agents did not all join cluster {cluster}; see their output above")
        extra = dict(_key_value(x) for x in a.env)
        env = {**launch_env(cluster, journal), **extra}
        argv = [str(self.program), *self.args]
        self.controllers.append(subprocess.Popen([sys.executable, *argv], env=env))
        say(PROG, f"primary controller here (pid {self.controllers[0].pid}): {' '.join(argv)}")
        procs: list[subprocess.Popen] = list(self.controllers)
        if a.standby_on:
            remote_env = {k: env[k] for k in ("REGENT_CLUSTER", "REGENT_JOURNAL", "REGENT_SECURE", "PYTHONUNBUFFERED")}
            self.standby = self._remote(a.standby_on, {**remote_env, **extra}, [a.python, *argv],
                                        f"standby {a.standby_on}", cwd=os.getcwd())
            procs.append(self.standby.popen)
            say(PROG, f"standby controller on {a.standby_on}")

        interrupted: list[int] = []

        def interrupt(signum: int, frame: object) -> None:
            interrupted.append(signum)
            for p in self.controllers:
                if p.poll() is None:
                    p.send_signal(signum)
            if self.standby is not None and self.standby.popen.poll() is None and self.standby.pid:
                subprocess.run(self.ssh(self.standby.host, f"kill -INT {self.standby.pid}"), capture_output=True,
                               timeout=30)

        previous = signal.signal(signal.SIGINT, interrupt), signal.signal(signal.SIGTERM, interrupt)
        try:
            status = supervise(procs, stop=self._stop_controller,
                               over_ssh=[self.standby.popen] if self.standby is not None else [])
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
        if interrupted and status == 0:
            # Stopped by Ctrl-C or SIGTERM, the run did not end by itself: say so, as a shell does.
            status = 128 + interrupted[0]
        say(PROG, f"the run ended with status {status}")
        return status

    def _stop_controller(self, p: subprocess.Popen) -> None:
        if self.standby is not None and p is self.standby.popen:
            self.stop_remote(self.standby, "KILL", 5.0)
        else:
            p.kill()
            p.wait()


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise LaunchError(f"--env {text!r}: write KEY=VALUE")
    return key, value


def _host_name(host: str) -> str:
    """The cluster name of a host given as ssh names it (user@name, name:port)."""
    name = host.rsplit("@", 1)[-1].split(":")[0].split(".")[0]
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name) or "host"


def _forward(popen: subprocess.Popen, prefix: str, first: str) -> None:
    if first:
        sys.stderr.write(prefix + first + "\n")
    for line in popen.stdout:
        sys.stderr.write(prefix + line)


def run(a: argparse.Namespace, rest: list[str]) -> int:
    launch = None
    try:
        launch = SshLaunch(a, check_program(a.program), rest)
        return launch.run()
    except LaunchError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    finally:
        if launch is not None:
            launch.close()
