"""Finding this machine's host agent through $REGENT_HOME/host.json, and starting one
(detached, so it is never the caller's child) when none runs.

The agent publishes its record there; everyone else only reads it. A record whose
process is gone, or whose pid another process now has, names no agent.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from regent.wire.security import regent_home
from regent.wire.transport import valid_address
from regent.worker import procinfo

HOST_FILE_ENV = "REGENT_HOST_FILE"  # set by a cluster agent (one of several on a machine) for its procs
HOST_CMD_ENV = "REGENT_HOST_CMD"  # JSON argv that starts that agent again, for its procs


def host_file() -> Path:
    named = os.environ.get(HOST_FILE_ENV)
    return Path(named) if named else regent_home() / "host.json"


def _agent_command(log_path: Path) -> list[str]:
    """How to start this machine's agent in the background: the command a cluster agent
    left for its procs (so a successor joins the same cluster), else the plain agent."""
    named = os.environ.get(HOST_CMD_ENV)
    if named:
        try:
            cmd = json.loads(named)
        except ValueError:
            cmd = None
        if isinstance(cmd, list) and cmd and all(isinstance(c, str) for c in cmd):
            return [*cmd, "--daemonize", "--log", str(log_path)]
        raise RuntimeError(f"${HOST_CMD_ENV} is not a JSON list of strings: {named[:200]!r}")
    return [sys.executable, "-m", "regent.worker.host", "--daemonize", "--log", str(log_path)]


def host_record() -> dict | None:
    """What host.json says, whether or not that agent still runs."""
    try:
        info = json.loads(host_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int) or not valid_address(info.get("address")):
        return None
    return info


def live_host_record() -> dict | None:
    """host.json, if the agent it names is running (a dead agent, or its pid reused, is none)."""
    info = host_record()
    if info is None or not procinfo.running(info["pid"]):
        return None
    if "start" in info and info["start"] != procinfo.start_ticks(info["pid"]):
        return None
    return info


def publish(address: str, host_id: str) -> None:
    """Name this process as the machine's host agent, at `address` (atomically replaced)."""
    pid = os.getpid()
    tmp = host_file().with_suffix(f".{pid}.tmp")
    tmp.write_text(json.dumps({"pid": pid, "start": procinfo.start_ticks(pid),
                               "address": address, "host": host_id}))
    os.replace(tmp, host_file())


def withdraw() -> None:
    """Remove host.json if it still names this process (a successor may have replaced it)."""
    try:
        if json.loads(host_file().read_text()).get("pid") == os.getpid():
            host_file().unlink()
    except (OSError, ValueError):
        pass


def ensure_local_host(timeout: float = 30.0, env: dict[str, str] | None = None) -> str:
    """Address of this machine's host agent, starting one (detached) if none runs.

    env: the environment to start it with (default: this process's). A proc that
    restarts its dead agent passes the dead agent's, so the new agent's procs see
    what the old one's did, not the proc's own device binding."""
    info = live_host_record()
    if info:
        return info["address"]
    lock_path = host_file().with_suffix(".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = live_host_record()
        if info:
            return info["address"]
        log_path = host_file().with_suffix(".log")
        # The launcher forks the agent and exits at once, so the agent is never a
        # child of this (controller) process: SIGKILL of the controller spares it.
        if env is None:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        else:  # whatever the given PYTHONPATH, the agent must find this very package: the
            # folder that holds regent/ (the checkout, or site-packages for a wheel)
            root = str(Path(str(sys.modules["regent"].__file__)).resolve().parents[1])
            env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)}
        subprocess.run(_agent_command(log_path), env=env, check=True, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = live_host_record()
            if info:
                return info["address"]
            time.sleep(0.02)
    raise RuntimeError(f"the host agent did not start within {timeout:.0f} s: see {log_path}")
