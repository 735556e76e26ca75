"""Hollow procs: a host agent (`regent host --hollow K`) that serves its spawns with procs
inside its own process, at most K of them, as Kubernetes' kubemark runs real kubelets without
containers. They exist to measure the control plane at sizes a machine cannot hold as real
processes (bench/bench_scale.py --hollow).

A hollow proc is the real proc: worker/proc.py's ProcRuntime with its core, its actors and its
own authenticated inbox, so to a controller it is a proc like any other (spawn, calls,
fencing, supervision). What it lacks is a process of its own. Every hollow proc of the agent
runs on one asyncio loop on one thread; they share the agent's zmq context and interpreter,
so there is no per-proc environment, no device binding, no torch (an actor class that imports
it is refused at spawn), and no output forwarding. A hollow proc ends with its agent: a hollow
host killed is a lost host.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
import zmq

from regent.wire.transport import readable
from regent.worker._hoststate import _Proc
from regent.worker._proc_ending import CLOSE_S
from regent.worker.logsetup import prefix_actor_logs
from regent.worker.proc import ProcRuntime, parse_args, runtime_from
from regent.worker.remote import serving_client

log = structlog.get_logger("regent.host")

NO_TORCH = ("a hollow host (regent host --hollow) runs actors without torch, GPUs or a process of "
            "their own: spawn this actor class on a real host")


class _NoTorch(importlib.abc.MetaPathFinder):
    """Refuses `import torch` in a hollow agent: what needs torch needs a real proc."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"cannot import {name}: {NO_TORCH}")
        return None


@dataclass
class _HollowProc(_Proc):
    """The agent's handle on a hollow proc: `pidfd` is an eventfd written when it has ended, so
    `_Proc.wait` (no popen: no status to collect) serves it as it is."""

    pool: HollowProcs | None = field(default=None, repr=False)
    # The hollow thread's own handle on the eventfd: the agent may close `pidfd` (a stop that
    # timed out) before the proc ends, and a write to a closed, reused number would hit another file.
    signal_fd: int = -1

    def send_signal(self, sig: int) -> None:
        """Any signal stops it (SIGTERM's grace is the proc's own CLOSE_S)."""
        if self.pool is not None and not self.exited:
            self.pool.stop(self.id)

    def ended(self, status: int) -> None:
        """Called on the hollow thread once the proc has closed its sockets."""
        if self.exit_status is None:
            self.exit_status = status
            os.eventfd_write(self.signal_fd, 1)
            os.close(self.signal_fd)

    def status_text(self) -> str:
        return f"{self.exit_status} (hollow)"


class HollowRuntime(ProcRuntime):
    """A proc on its hollow host's shared loop and context."""

    def __init__(self, *args: Any, pool: HollowProcs, **kwargs: Any) -> None:
        super().__init__(*args, ctx=pool.ctx, loop=pool.loop, **kwargs)
        self.pool = pool
        self._spin_s = 0.0  # spinning on one proc's inbox would hold up the others
        self.closed = False

    def open(self) -> None:
        """What `run` does for a process of its own, less signals, output and the agent watch."""
        self.loop.add_reader(self.inbox.sock.getsockopt(zmq.FD), self._on_readable)
        self._say_ready()
        self.loop.call_soon(self._on_readable)

    def _on_readable(self) -> None:
        if self.closed:
            return
        token = serving_client.set(self.client)  # the calls its actors make are this proc's
        try:
            super()._on_readable()
        except (SystemExit, KeyboardInterrupt) as e:
            self._exited(e)
        finally:
            serving_client.reset(token)

    def _resume(self, slot: Any) -> None:
        try:
            super()._resume(slot)
        except (SystemExit, KeyboardInterrupt) as e:
            self._exited(e)

    async def _run_async(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super()._run_async(*args, **kwargs)
        except (SystemExit, KeyboardInterrupt) as e:
            self._exited(e)

    def _exited(self, e: BaseException) -> None:
        """An actor raised SystemExit or KeyboardInterrupt, which ends a real proc: this one ends
        (its agent reports it dead), not the thread every hollow proc runs on."""
        log.warning("an actor ended its hollow proc", proc=self.proc_id, error=f"{type(e).__name__}: {e}")
        if not self.stopping:
            self.loop.call_soon(self.pool.end, self.proc_id, 1)

    def pump_once(self, wait_ms: int) -> None:
        self.pool.pump(wait_ms)  # a sync endpoint waiting on a call: every hollow proc goes on

    def _transmit(self, rt: str, msg: list) -> None:
        if not self.closed:  # a reply of a call cancelled by the stop, or a client's timer
            super()._transmit(rt, msg)

    def close(self, done: Callable[[], None]) -> None:
        """Stop as a proc stops (actors' calls cancelled, __cleanup__ run, within CLOSE_S),
        then close its sockets and call `done`."""
        if self.stopping:
            return
        self._end_actors()

        def finish(*_: object) -> None:
            self.closed = True
            self.pending.clear()  # a backlog's retry (_flush) would open a peer on the closed outbox
            self.loop.remove_reader(self.inbox.sock.getsockopt(zmq.FD))
            self.inbox.close()
            self.outbox.close()
            done()

        if not self._closing:
            finish()
            return
        waiting = self.loop.create_task(asyncio.wait(list(self._closing), timeout=CLOSE_S))
        waiting.add_done_callback(finish)


class HollowProcs:
    """A hollow agent's procs: at most `limit`, on one thread started here. `ctx` is the
    agent's zmq context, sized here for them."""

    def __init__(self, limit: int, ctx: zmq.Context) -> None:
        if limit < 1:
            raise ValueError(f"--hollow {limit}: a hollow host serves at least 1 proc")
        self.limit = limit
        self.ctx = ctx
        self.loop = asyncio.new_event_loop()
        self.runtimes: dict[str, HollowRuntime] = {}
        self.procs: dict[str, _HollowProc] = {}
        if not any(isinstance(f, _NoTorch) for f in sys.meta_path):
            sys.meta_path.insert(0, _NoTorch())
        prefix_actor_logs()
        self._thread = threading.Thread(target=self._serve, name="regent-hollow", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def refusal(self, count: int, envs: list[dict]) -> str | None:
        """Why `count` more procs with environments `envs` cannot start here (None: they can)."""
        if any(str(e.get("REGENT_PROC_DIM")) == "gpus" for e in envs):
            return "a hollow host has no GPUs: spawn meshes with a 'gpus' dimension on real hosts"
        live = len(self.procs)  # a proc leaves it when it ends (end())
        if live + count > self.limit:
            return (f"this hollow host serves at most {self.limit} procs and has {live}: start it with a "
                    f"larger --hollow, or add hollow hosts")
        return None

    def start(self, proc_id: str, index: int, argv: list[str], path: list[str], env: dict) -> _HollowProc:
        """Start a hollow proc from the command line a real one would get; it says it is ready
        to the agent's inbox, as a real one does. Raises ValueError if there is no room."""
        why = self.refusal(1, [env])
        if why is not None:
            raise ValueError(why)
        for p in path:
            if p not in sys.path:
                sys.path.append(p)  # where its actor classes load from (a real proc's PYTHONPATH)
        fd = os.eventfd(0, os.EFD_CLOEXEC)
        proc = _HollowProc(proc_id, index, os.getpid(), fd, pool=self, signal_fd=os.dup(fd))
        self.procs[proc_id] = proc
        self.loop.call_soon_threadsafe(self._open, proc, argv)
        return proc

    def _open(self, proc: _HollowProc, argv: list[str]) -> None:
        try:
            runtime = runtime_from(parse_args(argv), make=HollowRuntime, pool=self)
            self.runtimes[proc.id] = runtime
            runtime.open()
        except Exception:
            log.exception("a hollow proc failed to start", proc=proc.id)
            self.runtimes.pop(proc.id, None)
            proc.ended(1)

    def stop(self, proc_id: str) -> None:
        """From the agent's thread: stop a hollow proc; its handle's wait() returns once it has."""
        self.loop.call_soon_threadsafe(self.end, proc_id, 0)

    def end(self, proc_id: str, status: int) -> None:
        """On the hollow thread: end a proc, which then reports `status` as its exit status."""
        proc = self.procs.pop(proc_id, None)
        runtime = self.runtimes.pop(proc_id, None)
        if runtime is None:
            if proc is not None:
                proc.ended(status)
            return
        runtime.close(lambda: proc.ended(status) if proc is not None else None)

    def pump(self, wait_ms: int) -> None:
        """Handle what any hollow proc's inbox holds, waiting up to `wait_ms` for a message."""
        runtimes = [r for r in self.runtimes.values() if not r.closed]
        ready = [r for r in runtimes if readable(r.inbox.sock)]
        if not ready:
            poller = zmq.Poller()
            for r in runtimes:
                poller.register(r.inbox.sock, zmq.POLLIN)
            socks = dict(poller.poll(max(1, wait_ms)))
            ready = [r for r in runtimes if r.inbox.sock in socks]
        for r in ready:
            token = serving_client.set(r.client)
            try:
                r.take_one()
                r._flush_out()
            except (SystemExit, KeyboardInterrupt) as e:
                r._exited(e)
            finally:
                serving_client.reset(token)

    def shutdown(self) -> None:
        """The agent is exiting: its sessions were stopped; end the thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=CLOSE_S + 1)
