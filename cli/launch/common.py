"""What every launcher shares: checks made before anything starts (the program, the keys,
the journal), the environment agents and programs get, and the rule that says when a run
of primary + standbys is over and with which status."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from regent.controller.session import DEPOSED_EXIT_STATUS

__all__ = ["LaunchError", "check_journal", "check_keys", "check_program", "ended_the_run", "etcd_command",
           "launch_env", "supervise"]

KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)  # as Popen and as a shell (or srun) report it


class LaunchError(Exception):
    """A launch that cannot go ahead; the message is the one line the user sees."""


def check_program(path: str) -> Path:
    program = Path(path).expanduser()
    if not program.is_file():
        raise LaunchError(f"no program at {path}: give the path of the controller program (PROGRAM.py)")
    return program.resolve()


def check_keys() -> Path:
    """The cluster's CURVE keys (every launch is off loopback, so every socket uses them)."""
    from regent.wire.security import keys_dir, load_credentials

    try:
        load_credentials(secure=True)
    except RuntimeError as e:
        raise LaunchError(str(e).splitlines()[0]) from None
    return keys_dir()


def check_journal(url: str, timeout_s: float = 3.0) -> str:
    """`url` if some etcd member it names accepts a connection within `timeout_s`."""
    from regent.journal.etcd_target import parse_etcd_url, redact

    if not url.startswith(("etcd://", "etcds://")):
        raise LaunchError(f"--journal {redact(url)}: a launch across machines needs etcd (etcd://HOST:2379[,...]); "
                          "an SQLite file is only on one machine")
    try:
        target = parse_etcd_url(url)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    errors = []
    for host, port in target.addresses:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return url
        except OSError as e:
            errors.append(f"{host}:{port}: {e.strerror or e}")
    raise LaunchError(f"the journal {redact(url)} does not answer ({'; '.join(errors)}); start etcd there or "
                      "give another --journal")


def launch_env(cluster: str, journal: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What agents and programs of a launch get: the cluster, its journal, CURVE on."""
    from regent.wire.security import regent_home

    env = dict(os.environ if base is None else base)
    env.update({"REGENT_CLUSTER": cluster, "REGENT_JOURNAL": journal, "REGENT_SECURE": "1",
                "REGENT_HOME": str(regent_home()), "PYTHONUNBUFFERED": "1"})
    return env


def etcd_command(data_dir: str, address: str, port: int, name: str = "regent") -> list[str]:
    """A single-member etcd serving clients on address:port, its peer port next to it on the same
    address (a fixed loopback port would collide with any other etcd on the machine)."""
    binary = shutil.which("etcd") or "etcd"
    peer = f"http://{address}:{port + 1}"
    return [binary, "--name", name, "--data-dir", data_dir,
            "--listen-client-urls", f"http://{address}:{port}", "--advertise-client-urls", f"http://{address}:{port}",
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{name}={peer}", "--log-level", "warn"]


SSH_GONE = 255  # ssh's status for a remote command killed by a signal, or a connection cut


def ended_the_run(status: int, others_running: bool, over_ssh: bool = False) -> bool:
    """Whether a controller that exited with `status` ended the run: it did unless it was
    deposed or killed while another controller (a standby) still runs to carry the run on.
    Through ssh a killed controller exits 255, as does one whose connection was cut: gone
    either way, it leaves the run to the others."""
    gone = (DEPOSED_EXIT_STATUS, *KILLED, *((SSH_GONE,) if over_ssh else ()))
    return not others_running or status not in gone


def supervise(procs: Sequence[subprocess.Popen], stop: Callable[[subprocess.Popen], None] | None = None,
              poll_s: float = 0.05, over_ssh: Collection[subprocess.Popen] = ()) -> int:
    """Wait until a controller ends the run; stop the others (standbys, which would take over
    an ended session and start it anew); the run's status. `over_ssh`: the controllers that
    run on another host through ssh."""
    stop = stop or _kill
    waiting = list(procs)  # a controller deposed or killed while others ran leaves this list
    while True:
        exited = [(p, code) for p in waiting if (code := p.poll()) is not None]
        running = [p for p in waiting if p.returncode is None]
        # A status that ends the run whoever else still runs; a deposed or killed one only
        # when nobody is left to carry the run on.
        final = next(((p, code) for p, code in exited
                      if ended_the_run(code, others_running=True, over_ssh=p in over_ssh)), None)
        if final is None and exited and not running:
            final = exited[-1]
        if final is not None:
            for q in running:
                stop(q)
            return final[1]
        waiting = running
        time.sleep(poll_s)


def _kill(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()


def say(prog: str, line: str) -> None:
    """What a launcher starts, and where: one line on stderr."""
    print(f"{prog}: {line}", file=sys.stderr, flush=True)
