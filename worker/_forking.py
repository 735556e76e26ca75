"""How the host agent starts a proc: forked from a zygote of the proc's environment
(worker/zygote.py; REGENT_FORK=0 turns it off), else as a fresh `python -m regent.worker.proc`. A spawn
request whose zygote is still importing waits here until it is ready (or has failed: its
procs then start as fresh processes), so a host imports torch once rather than once per proc."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import structlog

from regent.wire import Kind, ProtocolError
from regent.worker._hoststate import _ForkedProc, _Proc
from regent.worker.zygote import ForkError, ForkServer, ForkServers, forking_enabled

log = structlog.get_logger("regent.host")


class _Forking:
    """Mixed into HostAgent: its inbox address and request dispatch are used here."""

    forks: ForkServers | None
    held: list[tuple[ForkServer, dict]]

    def _init_forking(self, enabled: bool) -> None:
        self.forks = ForkServers(os.getpid(), self.inbox.address) if enabled and forking_enabled() else None
        self.held = []

    def _zygote_fds(self) -> dict[int, ForkServer]:
        """The zygotes that held spawn requests wait for, by descriptor, for the serve loop."""
        return {z.fileno(): z for z, _ in self.held if z.failed is None}

    def _hold_for_zygote(self, meta: dict, env: dict[str, str], preload: tuple[str, ...]) -> bool:
        """Whether spawn request `meta` waits for its zygote to finish importing."""
        if self.forks is None:
            return False
        server = self.forks.prepare(env, preload)
        if server is None:
            return False
        self.held.append((server, meta))
        return True

    def _release_held(self) -> None:
        """Dispatch again the spawn requests whose zygote has settled (ready or failed)."""
        if self.forks is None:
            return
        self.forks.expire()
        ready = [meta for server, meta in self.held if server.settled]
        self.held = [(server, meta) for server, meta in self.held if not server.settled]
        for meta in ready:
            try:
                self._dispatch(Kind.HOST_REQ, meta)
            except ProtocolError as e:
                log.warning("dropped malformed request", op=meta.get("op"), error=str(e))

    def _close_forks(self) -> None:
        if self.forks is not None:
            self.forks.close()

    def _launch(self, proc_id: str, index: int, argv: list[str], env: dict[str, str],
                preload: tuple[str, ...]) -> _Proc:
        """Start proc `proc_id`: forked from a ready zygote if there is one, else a fresh process."""
        return self._fork(proc_id, index, argv, env, preload) or _popen(proc_id, index, argv, env)

    def _fork(self, proc_id: str, index: int, argv: list[str], env: dict[str, str],
              preload: tuple[str, ...]) -> _Proc | None:
        server = self.forks.find(env, preload) if self.forks is not None else None
        if server is None:
            return None
        try:
            pid, pidfd = server.fork(argv, env)
        except ForkError as e:
            log.warning("could not fork a proc from its zygote; starting it as a fresh process", error=str(e))
            return None
        return _ForkedProc(proc_id, index, pid, pidfd, server=server)

    # Provided by HostAgent.
    inbox: Any
    _dispatch: Any


def _popen(proc_id: str, index: int, argv: list[str], env: dict[str, str]) -> _Proc:
    popen = subprocess.Popen([sys.executable, "-m", "regent.worker.proc", *argv],
                             env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    return _Proc(proc_id, index, popen.pid, os.pidfd_open(popen.pid), popen)


def _proc_env(extra_env: dict, path: list) -> dict[str, str]:
    """A proc's environment: the agent's, the request's, its device binding, its sys.path."""
    env = _bound_env({**os.environ, **extra_env})
    pypath = [p for p in path if isinstance(p, str)] + env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in pypath if p))
    return env


def _bound_env(env: dict[str, str]) -> dict[str, str]:
    """A proc's environment with its device binding: proc i of a {"gpus": N} mesh sees GPU i
    of this host only (hipcore.binding, docs/hipcore.md). Other meshes are left unbound.
    Raises ValueError when this host cannot give the proc its GPU."""
    if env.get("REGENT_PROC_DIM") != "gpus":
        return env
    from regent.hipcore import HipcoreError, backend, binding  # imported once a mesh asks for GPUs

    rank = env.get("REGENT_PROC_RANK", "")
    if not rank.isdigit():
        raise ValueError(f"REGENT_PROC_RANK={rank!r} is not a proc rank")
    try:
        info = backend()
    except HipcoreError as e:  # e.g. REGENT_HIPCORE_BACKEND forces a GPU backend this host lacks
        raise ValueError(str(e)) from e
    if info.is_gpu and binding.VISIBLE_DEVICES_ENV[info.name] not in env and int(rank) >= info.device_count:
        raise ValueError(f"proc {rank} needs GPU {rank}, but this host has {info.device_count} "
                         f"{info.name} GPU(s); spawn at most {info.device_count} procs per host")
    return binding.child_env(env, int(rank), 1)
