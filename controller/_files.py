"""The controller's open files, checked before a spawn: every proc it links to directly costs it
about FILES_PER_DIRECT_PROC descriptors, and a process out of them does not fail, it hangs (zmq
retries accepting the procs' connections in a loop, a core busy, and the procs are never heard).
Past the limit the spawn is refused with what to do instead."""

from __future__ import annotations

import os
import resource

import structlog

from regent.worker.errors import SupervisionError

log = structlog.get_logger("regent.controller")

# A direct link: the zmq socket's mailbox and its TCP connection, the link monitor (two zmq
# sockets, a mailbox each), and the proc's connection back to the controller's inbox.
FILES_PER_DIRECT_PROC = 5
FILES_KEPT = 256  # for everything else: the journal's connections, logs, what the program opens


def open_files() -> tuple[int, int, int]:
    """(descriptors open now, the soft limit, the hard limit) of this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return len(os.listdir("/proc/self/fd")), soft, hard


def check_room(direct_procs: int, files: tuple[int, int, int] | None = None) -> None:
    """Raise SupervisionError if linking to `direct_procs` more procs would leave this process
    out of descriptors; the soft limit is raised to the hard one first where that suffices."""
    if direct_procs <= 0:
        return
    now, soft, hard = files if files is not None else open_files()
    need = direct_procs * FILES_PER_DIRECT_PROC + FILES_KEPT
    if now + need <= soft:
        return
    limit = soft
    if hard == resource.RLIM_INFINITY or soft < hard:  # what the process may raise itself to
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            limit = hard
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-file limit", soft=soft, hard=hard, error=str(e))
    if limit == resource.RLIM_INFINITY or now + need <= limit:
        return
    raise SupervisionError(
        f"spawning {direct_procs} procs this controller links to directly needs about {need} more "
        f"open files ({FILES_PER_DIRECT_PROC} a proc, {FILES_KEPT} kept for the rest), and this "
        f"process has {now} open of its limit of {limit}: raise the limit (`ulimit -n`; LimitNOFILE= "
        f"under systemd, the container's nofile ulimit under Kubernetes or Docker), or cast through "
        f"the host agents (REGENT_RELAY=1: the controller then links to each host's agent, not to "
        f"each proc)")
