"""What the host agent keeps per session: its procs (each a pidfd handle), the spawn
requests that started them, keyed for dedupe, and the session's fence and controllers.
State only: no sockets, and every decision on it is the agent's (worker/host.py)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from regent.worker.fencing import EpochFence


@dataclass
class _Proc:
    id: str
    index: int
    pid: int
    pidfd: int
    popen: subprocess.Popen | None = None  # None: adopted from a dead agent, so not our child
    addr: str | None = None
    exited: bool = False
    exit_status: int | None = None  # stays None for an adopted proc: its status goes to init
    replaces: str | None = None  # a warm proc assigned to replace this proc (worker/_warm.py)

    @property
    def adopted(self) -> bool:
        return self.popen is None

    def send_signal(self, sig: int) -> None:
        """Signal through the pidfd: never a process that reused the pid."""
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None) -> bool:
        """True once the process has exited (its status collected when it is our child)."""
        if not fd_ready(self.pidfd, timeout):
            return False
        self.exited = True
        if self.popen is not None:
            self.exit_status = self.popen.wait()
        return True

    def status_text(self) -> str:
        return "unknown (adopted)" if self.adopted else str(self.exit_status)


@dataclass
class _ForkedProc(_Proc):
    """A proc forked by one of the agent's zygotes (worker/zygote.py): not the agent's child,
    so its exit status comes from the zygote that reaped it."""

    server: Any = None

    @property
    def adopted(self) -> bool:
        return False

    def wait(self, timeout: float | None) -> bool:
        if not fd_ready(self.pidfd, timeout):
            return False
        self.exited = True
        if self.exit_status is None and self.server is not None:
            self.exit_status = self.server.exit_code(self.pid)
        return True

    def status_text(self) -> str:
        return "unknown (its zygote did not say)" if self.exit_status is None else str(self.exit_status)


def fd_ready(fd: int, timeout: float | None) -> bool:
    """Whether `fd` is readable within `timeout` (None: wait). poll, not select: an agent with
    many sockets (a hollow one) has descriptors above select's 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))


class _RequestIdentity(NamedTuple):
    """What a spawn_procs call id, or the proc a respawn_proc replaces, stands for: the same
    key sent again with anything else is another request, refused as a divergence. Only
    what a restarted agent learns again from the procs it adopts belongs here."""

    op: str
    size: int  # procs asked for
    index: int  # of the proc a respawn_proc replaces; -1 for spawn_procs
    digest: bytes | None  # the controller's digest of a spawn_procs call (None: it sent none)

    def describe(self) -> str:
        if self.op == "respawn_proc":
            return f"respawn_proc at index {self.index}"
        digest = "no digest" if self.digest is None else f"digest {self.digest.hex()}"
        return f"spawn_procs of {self.size} procs with {digest}"


@dataclass
class _SpawnRequest:
    sid: str
    seq: int  # the controller's call id; -1 for a respawn
    identity: _RequestIdentity
    procs: list[_Proc]
    waiters: list[tuple[str, object]]
    started: float
    size: int  # procs it asked for: fewer are known while a restarted agent adopts them
    first: int  # index of its first proc
    answered: dict | None = None
    refill: tuple[list, list] | None = None  # envs and path for procs that died with the old agent
    origin: str = ""  # a spawn an actor made: the rest of its call id (docs/design.md)

    def complete(self) -> bool:
        return len(self.procs) == self.size and all(p.addr for p in self.procs)


def _spawn_origin(seq: int, identity: _RequestIdentity, pos: int, origin: str = "") -> list[str]:
    """The argv naming a spawn_procs request to its proc at `pos`, which tells a successor agent."""
    argv = ["--spawn-seq", str(seq), "--spawn-size", str(identity.size), "--spawn-pos", str(pos)]
    if origin:
        argv += ["--spawn-origin", origin]
    if identity.digest is not None:
        argv += ["--spawn-digest", identity.digest.hex()]
    return argv


@dataclass
class _SessionState:
    fence: EpochFence = field(default_factory=EpochFence)
    controllers: set[str] = field(default_factory=set)
    procs: dict[str, _Proc] = field(default_factory=dict)
    spawns: dict[tuple[int, str], _SpawnRequest] = field(default_factory=dict)  # by (seq, origin)
    respawns: dict[str, _SpawnRequest] = field(default_factory=dict)  # by the id of the proc replaced
    next_index: int = 0
    undelivered: list[dict] = field(default_factory=list)  # deaths seen before any controller said hello
    stopped_ids: set[str] = field(default_factory=set)
    exited_ids: set[str] = field(default_factory=set)  # procs this agent saw die
    warm: dict[tuple, _Proc] = field(default_factory=dict)  # started ahead of need (worker/_warm.py)
    last_contact: float = field(default_factory=time.monotonic)
    orphan_timeout_s: float = field(default_factory=lambda: float(os.environ.get("REGENT_ORPHAN_TIMEOUT_S", "300")))

    def requests(self) -> list[_SpawnRequest]:
        return [*self.spawns.values(), *self.respawns.values()]


def _env_at(envs: list, i: int) -> dict[str, str]:
    """The i-th requested environment, as strings."""
    env = envs[i] if i < len(envs) and isinstance(envs[i], dict) else {}
    return {k: str(v) for k, v in env.items() if isinstance(k, str)}
