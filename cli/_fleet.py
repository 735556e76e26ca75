"""`regent host --cluster C --hollow K --fleet M`: M hollow host agents from one command.

Each agent is its own process, forked from this one once the agent's modules are imported, so
the M agents share those pages instead of importing them M times (docs/multihost.md says how
much that saves). Past the fork each is exactly
the agent `regent host --cluster C --hollow K --name NAME-i` would start: its own name,
sockets, registration and procs. Killing one is that host's loss; the others go on. This
process only waits: SIGTERM or SIGINT here stops every agent, and it returns once all have
ended (1 if any ended badly). It restarts none: a lost hollow host stays lost, as a real one.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Callable

import structlog

log = structlog.get_logger("regent.host.fleet")

MAX_FLEET = 1024


def fleet_names(base: str, count: int) -> list[str]:
    """The agents' names: `base-0` .. `base-(count-1)`, zero-padded to one width so they sort."""
    width = len(str(count - 1))
    return [f"{base}-{i:0{width}d}" for i in range(count)]


def without_fleet(argv: list[str], name: str) -> list[str]:
    """`argv` for one agent of the fleet: --fleet and --name dropped, `--name name` added."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--fleet", "--name"):
            skip = True
            continue
        if arg.startswith(("--fleet=", "--name=")):
            continue
        out.append(arg)
    return [*out, "--name", name]


def _preload() -> None:
    """Import what every agent imports, before the fork, so the agents share those pages."""
    import regent.journal.etcd_store  # noqa: F401  (grpc: importing it before a fork is safe; a channel is not)
    import regent.journal.sqlite_store  # noqa: F401
    import regent.worker.hollow  # noqa: F401
    import regent.worker.host  # noqa: F401
    import regent.worker.metrics  # noqa: F401
    import regent.worker.proc  # noqa: F401


def run_fleet(argv: list[str], base: str, count: int, agent: Callable[[list[str]], int]) -> int:
    """Fork `count` agents, each running `agent(argv for it)`; wait for every one to end."""
    _preload()
    gc.freeze()  # the collector would otherwise write to every shared object's header, copying its page
    children: dict[int, str] = {}
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    sys.stdout.flush()
    sys.stderr.flush()
    for name in fleet_names(base, count):
        if stopping:
            break
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                for s, handler in old.items():
                    signal.signal(s, handler)
                rc = agent(without_fleet(argv, name))
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:
                log.exception("a fleet's agent failed", host=name)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        children[pid] = name
    log.info("fleet started", agents=len(children), base=base, pid=os.getpid())
    bad = 0
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        name = children.pop(pid, None)
        if name is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and not (stopping and code == -signal.SIGTERM):
            bad += 1
            log.warning("a fleet's agent ended", host=name, pid=pid, exit_status=code)
    return 1 if bad else 0
