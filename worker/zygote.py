"""A host's fork server (zygote): one process per controller environment that has imported
what every proc imports (regent's proc runtime, and torch or numpy when the controller uses
them), from which the host agent forks its procs instead of starting an interpreter for each.
A proc then costs a fork (milliseconds) rather than an interpreter start and its imports
(~0.2 s of CPU, ~2.5 s more with torch), and its host imports torch once, not once per proc.

On by default; `REGENT_FORK=0` in the host agent's environment turns it off. The zygote never creates a zmq
context, an event loop or a thread of its own and never initialises a GPU runtime, so a fork
of it is as clean as a fresh process; the child sets its own environment, starts a session
of its own, reseeds the random generators it shares with its siblings, rewrites its command
line to the one `python -m regent.worker.proc` would have (what adoption and `kill_host` read),
and runs the proc. The zygote reports each child's exit status to the agent; it exits when
the agent does, leaving its children to be adopted like any proc that outlives its agent.
Messages are JSON over a socketpair (SOCK_SEQPACKET), a forked child's pidfd passed with its
reply, so the agent watches a proc from its first instant with no pid-reuse race.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any

import structlog

log = structlog.get_logger("regent.host")

ROOM = 8192  # bytes of the zygote's command line a forked proc rewrites into its own
MAX_MESSAGE = 256 * 1024
PRELOADABLE = ("numpy", "torch")  # preloaded when the controller has imported them: safe before fork
_STARTUP_ENV = ("PYTHON", "LD_", "MALLOC")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")  # read as an interpreter starts: part of a zygote's key


def forking_enabled() -> bool:
    """On unless the agent's environment says REGENT_FORK=0."""
    return os.environ.get("REGENT_FORK", "1") != "0"


def wanted_preload() -> list[str]:
    """What a controller asks its hosts' zygotes to import: the heavy modules it uses itself,
    and those $REGENT_PRELOAD names (comma-separated: modules its actors import that it does
    not, `torch,torch.distributed` say; each must be safe to import before a fork, as torch
    and numpy are: no thread or GPU context started at import)."""
    named = [m.strip() for m in os.environ.get("REGENT_PRELOAD", "").split(",") if m.strip()]
    for m in named:
        if not _MODULE.fullmatch(m):
            raise ValueError(f"REGENT_PRELOAD names {m!r}, which is not a module name (comma-separated, "
                             "e.g. REGENT_PRELOAD=torch,torch.distributed)")
    return sorted({m for m in PRELOADABLE if m in sys.modules} | set(named))


class ForkError(RuntimeError):
    """A zygote could not fork a proc (it died, or did not answer): start one the usual way."""


class ForkServer:
    """The agent's handle on one zygote: started at once, ready once its imports are done."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...], host_pid: int, host_inbox: str):
        self.preload = preload
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", "regent.worker.zygote", "--fd", str(theirs.fileno()),
                "--host-pid", str(host_pid), "--host-inbox", host_inbox,
                *[a for m in preload for a in ("--preload", m)], "--room", " " * ROOM]
        self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()],
                                      start_new_session=True)
        theirs.close()
        self.room = 0  # bytes of command line a child may use; set once the zygote is ready
        self.failed: str | None = None
        self.exits: dict[int, int] = {}  # child pid -> exit code (negative: the signal)
        self.children: set[int] = set()
        self.started_at = self.used_at = time.monotonic()
        self._n = 0

    @property
    def settled(self) -> bool:
        return self.room > 0 or self.failed is not None

    def fileno(self) -> int:
        return self.sock.fileno()

    def pump(self, timeout: float = 0.0) -> dict | None:
        """Read one message if one comes within `timeout`; keep what it says."""
        if self.failed is not None or not select.select([self.sock], [], [], timeout)[0]:
            return None
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 1)
        except OSError as e:
            data, fds = b"", []
            log.warning("lost the connection to a zygote", error=str(e))
        if not data:
            self.fail("the zygote exited")
            return None
        try:
            msg = json.loads(data)
            if not isinstance(msg, dict):
                raise ValueError("not an object")
        except ValueError as e:
            for fd in fds:
                os.close(fd)
            log.warning("dropped a malformed message from a zygote", error=str(e))
            return None
        if isinstance(msg.get("room"), int):
            self.room = msg["room"]
            log.info("zygote ready", pid=self.popen.pid, preload=list(self.preload), room=self.room)
        elif isinstance(msg.get("exit"), int) and isinstance(msg.get("code"), int):
            self.exits[msg["exit"]] = msg["code"]
            self.children.discard(msg["exit"])
        if fds:
            msg["pidfd"] = fds[0]
        return msg

    def fork(self, argv: list[str], env: dict[str, str], timeout: float = 10.0) -> tuple[int, int]:
        """Fork a proc running `python -m regent.worker.proc ARGV` in `env`: (pid, pidfd)."""
        title = "\0".join([sys.executable, "-m", "regent.worker.proc", *argv]).encode() + b"\0"
        if len(title) > self.room:
            raise ForkError(f"the proc's command line ({len(title)} bytes) does not fit the zygote's {self.room}")
        self._n += 1
        request = json.dumps({"n": self._n, "argv": argv, "env": env}).encode()
        if len(request) > MAX_MESSAGE:
            raise ForkError("the proc's environment is too large to send to the zygote")
        try:
            self.sock.send(request)
        except OSError as e:
            self.fail(f"cannot reach the zygote: {e}")
            raise ForkError(self.failed) from e
        deadline = time.monotonic() + timeout
        while self.failed is None and (left := deadline - time.monotonic()) > 0:
            msg = self.pump(left)
            if msg is None or msg.get("n") != self._n:
                continue
            if isinstance(msg.get("pid"), int) and "pidfd" in msg:
                self.children.add(msg["pid"])
                self.used_at = time.monotonic()
                return msg["pid"], msg["pidfd"]
            raise ForkError(f"the zygote could not fork: {msg.get('error')}")
        if self.failed is None:
            self.fail(f"no answer within {timeout:g} s")
        raise ForkError(f"zygote {self.popen.pid}: {self.failed}")

    def exit_code(self, pid: int, wait_s: float = 1.0) -> int | None:
        """How child `pid` ended, as its zygote reaped it (it may report a moment after the
        pidfd says so)."""
        deadline = time.monotonic() + wait_s
        while pid not in self.exits and self.failed is None and (left := deadline - time.monotonic()) > 0:
            self.pump(left)
        return self.exits.pop(pid, None)

    def fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            log.warning("zygote unusable; procs start as fresh processes", pid=self.popen.pid, why=why)
            self.close()

    def close(self) -> None:
        """Stop the zygote (its children live on: they are the agent's procs)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(2.0)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class ForkServers:
    """The agent's zygotes, one per controller environment (sys.path, the variables an
    interpreter reads as it starts, and the modules it preloads)."""

    IDLE_S = 60.0  # a zygote with no live child, unused this long, is stopped
    READY_S = 120.0  # a zygote not ready this long after its start is given up (procs start fresh)

    def __init__(self, host_pid: int, host_inbox: str):
        self.host_pid, self.host_inbox = host_pid, host_inbox
        self.servers: dict[tuple, ForkServer] = {}

    @staticmethod
    def _key(env: dict[str, str]) -> tuple:
        return tuple(sorted((k, v) for k, v in env.items() if k.startswith(_STARTUP_ENV)))

    def find(self, env: dict[str, str], preload: tuple[str, ...] = ()) -> ForkServer | None:
        """A ready zygote for procs of environment `env` that has imported `preload`."""
        for (key, loaded), server in self.servers.items():
            if key == self._key(env) and set(preload) <= set(loaded) and server.room and server.failed is None:
                return server
        return None

    def prepare(self, env: dict[str, str], preload: tuple[str, ...]) -> ForkServer | None:
        """The zygote a spawn in `env` should wait for (None: none is needed, or one failed)."""
        if self.find(env, preload) is not None:
            return None
        slot = (self._key(env), tuple(sorted(set(preload))))
        server = self.servers.get(slot)
        if server is not None and server.failed is not None:
            return None  # it failed: no retry loop; these procs start as fresh processes
        if server is None:
            zygote_env = {k: v for k, v in env.items() if not k.startswith("REGENT_PROC_")}
            server = self.servers[slot] = ForkServer(zygote_env, slot[1], self.host_pid, self.host_inbox)
        return None if server.settled else server

    def expire(self) -> None:
        now = time.monotonic()
        for slot, server in list(self.servers.items()):
            if server.failed is None:
                server.pump(0.0)
            if not server.settled and now - server.started_at > self.READY_S:
                server.fail(f"not ready within {self.READY_S:g} s of its start (stuck importing?)")
            if not server.children and now - server.used_at > self.IDLE_S:
                server.close()
                del self.servers[slot]

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()


# --- the zygote process ----------------------------------------------------------------

def _argv_region() -> tuple[int, int]:
    """Where this process's command line lies in its memory (what /proc/PID/cmdline shows):
    the argument strings sit just before the environment's."""
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    size = sum(len(os.fsencode(a)) + 1 for a in sys.orig_argv)
    start = environ[0] - size
    if ctypes.string_at(start, len(os.fsencode(sys.orig_argv[0]))) != os.fsencode(sys.orig_argv[0]):
        return 0, 0
    return start, size


def _retitle(region: tuple[int, int], argv: list[str]) -> None:
    start, size = region
    title = "\0".join([sys.executable, "-m", "regent.worker.proc", *argv]).encode() + b"\0"
    if start and len(title) <= size:
        ctypes.memmove(start, title.ljust(size, b"\0"), size)


def _child(argv: list[str], env: dict[str, str], region: tuple[int, int], close: list[int]) -> None:
    """In the forked child: become the proc, then exit with its status (never return)."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        os.setsid()
        os.environ.clear()
        os.environ.update(env)
        _retitle(region, argv)
        # Siblings forked from one zygote share its generators' state: give each its own, as
        # a fresh process has (the random module reseeds itself at fork).
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if "torch" in sys.modules:
            sys.modules["torch"].seed()
        from regent.worker import proc

        proc.FORKED = True
        sys.argv = [proc.__file__, *argv]
        proc.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _send(sock: socket.socket, msg: dict, fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(msg).encode()], fds or [])


def _valid_request(msg: Any) -> bool:
    return isinstance(msg, dict) and isinstance(msg.get("n"), int) and isinstance(msg.get("argv"), list) \
        and all(isinstance(a, str) for a in msg["argv"]) and isinstance(msg.get("env"), dict) \
        and all(isinstance(k, str) and isinstance(v, str) for k, v in msg["env"].items())


def serve(sock: socket.socket, region: tuple[int, int]) -> None:
    """Fork a proc for each request, report each child's exit; return when the agent is gone."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send(sock, {"room": region[1], "pid": os.getpid()})
    while True:
        readable = select.select([sock, wake_r], [], [], 1.0)[0]
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_r, 512):
                pass
        while True:  # reap every child that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if sock not in readable:
            continue
        data = sock.recv(MAX_MESSAGE)
        if not data:
            return  # the agent is gone
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if not _valid_request(msg):
            log.warning("zygote dropped a malformed request")
            continue
        try:
            pid = os.fork()
        except OSError as e:
            _send(sock, {"n": msg["n"], "error": str(e)})
            continue
        if pid == 0:
            _child(msg["argv"], msg["env"], region, [sock.fileno(), wake_r, wake_w])
        pidfd = os.pidfd_open(pid)
        try:
            _send(sock, {"n": msg["n"], "pid": pid}, [pidfd])
        finally:
            os.close(pidfd)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="regent-zygote", description="A host agent's fork server.")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--host-pid", type=int, required=True)
    p.add_argument("--host-inbox", required=True)
    p.add_argument("--preload", action="append", default=[])
    p.add_argument("--room", default="")
    a = p.parse_args(argv)
    from regent.worker.logsetup import configure_logging

    configure_logging()
    sock = socket.socket(fileno=a.fd)
    from regent.worker import proc  # what every proc imports, once

    for name in a.preload:
        if not _MODULE.fullmatch(name):
            log.warning("zygote dropped a preload that is not a module name", module=name[:200])
    proc.preload([name for name in a.preload if _MODULE.fullmatch(name)], who="a zygote")
    # What the zygote imported lives as long as every proc forked from it: frozen, a proc's
    # collections neither scan it (torch's ~200k objects) nor write to its pages, which
    # would copy them out of the zygote's one by one (docs/design.md, "The cyclic collector").
    gc.freeze()
    serve(sock, _argv_region())


if __name__ == "__main__":
    main()
