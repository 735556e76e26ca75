"""Session: the user's handle on a regent job.

It numbers every side effect of the program (spawns, calls, stops), sends them to
workers through the runtime, and decodes what comes back. The journal and the
standby takeover build on the same call path.
"""

from __future__ import annotations

import itertools
import os
import random as _random
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import structlog

from controller._runtime import ProcRef, Runtime
from controller.core import ControllerCore, Outcome, PendingCall
from controller.futures import Point, point_of
from controller.mesh import ActorMesh, GatherSink, HostMesh, ProcMesh, StreamSink, View
from worker import _wire as wire
from worker._wire import Kind
from worker.classref import class_ref
from worker.errors import ActorError, DivergenceError, FencedError, SupervisionError
from worker.host import ensure_local_host
from worker.transport import PeerGone

log = structlog.get_logger("regent.session")


class Session:
    """A regent session: `with Session("name") as s: ...`."""

    def __init__(self, name: str, journal: str | None = None):
        if not name or "/" in name or len(name) > 128:
            raise ValueError(f"session name {name!r} must be 1..128 characters without '/'")
        self.name = name
        self.journal_url = journal
        self.run_id = secrets.token_hex(4)
        self.sid = f"{name}.{self.run_id}"
        self.epoch = 1
        self.replaying = False
        self.core = ControllerCore(self.sid)
        self.runtime = Runtime(self.sid, self.epoch, self.core)
        self._hosts: list[str] = []
        self._actor_names: set[str] = set()
        self._choose_rr = itertools.count()
        self._closed = False
        self._log = structlog.get_logger("regent.program").bind(session=name)

    # --- context management ----------------------------------------------------------

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the session's actors and procs on every host, then release sockets."""
        if self._closed:
            return
        self._closed = True
        try:
            for host in self._hosts:
                try:
                    self.runtime.host_request(host, "stop_session", timeout=15.0)
                except (TimeoutError, FencedError) as e:
                    log.warning("could not stop the session on a host", host=host, error=str(e))
        finally:
            self.runtime.close()

    # --- nondeterminism the program may ask for ------------------------------------

    def now(self) -> float:
        """Wall-clock time, recorded so a replay sees the same value."""
        self.core.issue()
        return time.time()

    def random(self) -> float:
        """A random float in [0, 1), recorded so a replay sees the same value."""
        self.core.issue()
        return _random.random()

    def side_effect(self, fn: Callable[[], Any]) -> Any:
        """Run fn once; a replay gets its recorded result instead of running it again."""
        self.core.issue()
        return fn()

    def log(self, event: str, **kw: Any) -> None:
        """structlog, silent while replaying so output is not printed twice."""
        if not self.replaying:
            self._log.info(event, **kw)

    # --- meshes ----------------------------------------------------------------------

    def this_host(self) -> HostMesh:
        if not self._hosts:
            host = ensure_local_host()
            self.runtime.register_host(host)
            self.runtime.host_request(host, "hello", timeout=10.0)
            self._hosts.append(host)
        return HostMesh(self, list(self._hosts))

    def spawn_procs(self, per_host: Mapping[str, int] | None = None) -> ProcMesh:
        """Procs on this host: shorthand for `s.this_host().spawn_procs(per_host)`."""
        return self.this_host().spawn_procs(per_host)

    def _spawn_procs(self, hosts: list[str], per_host: dict[str, int]) -> ProcMesh:
        if len(per_host) != 1:
            raise ValueError(f"per_host names one dimension, e.g. {{'procs': 4}}; got {per_host}")
        ((dim, count),) = per_host.items()
        if dim == "hosts" or not isinstance(count, int) or count < 1:
            raise ValueError(f"per_host={per_host}: the count must be a positive int and the dim not 'hosts'")
        seq = self.core.issue()
        envs = [{"REGENT_PROC_RANK": str(i), "REGENT_PROC_DIM": dim} for i in range(count)]
        procs: list[ProcRef] = []
        for host in hosts:
            reply = self.runtime.host_request(
                host, "spawn_procs", s=seq, count=count, envs=envs, path=[p for p in _sys_path() if p])
            if reply.get("st") != "ok":
                raise SupervisionError(f"host agent at {host} could not spawn procs: {reply.get('em')}")
            for p in reply["procs"]:
                ref = ProcRef(p["id"], p["idx"], p["addr"], p["pid"], host)
                self.runtime.procs[ref.id] = ref
                procs.append(ref)
        with self.runtime.lock:
            self.core.finished(seq)
        dims = {"hosts": len(hosts), dim: count}
        return ProcMesh(self, procs, View.full(dims))

    def _spawn_actors(self, mesh: ProcMesh, name: str, cls: type, args: tuple, kwargs: dict) -> ActorMesh:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ValueError(f"actor mesh name {name!r} must be a non-empty string")
        if name in self._actor_names:
            raise ValueError(f"an actor mesh named {name!r} already exists in this session")
        procs = mesh.procs()
        dims = mesh.dims
        frames = wire.dumps((class_ref(cls), args, kwargs))
        digest = wire.digest(frames)
        seq = self.core.issue()
        sink = GatherSink(View.full(dims))
        sink.decode = self._decode
        targets = {rank: p.id for rank, p in enumerate(procs)}
        with self.runtime.lock:
            call = self.core.expect(seq, "spawn", name, "__init__", targets, sink)
        for rank, proc in enumerate(procs):
            meta = {"sid": self.sid, "e": self.epoch, "s": seq, "a": name, "m": "__init__", "d": digest,
                    "rt": self.runtime.inbox.address, "pt": rank, "co": dict(point_of(dims, rank))}
            self._send(call, proc, rank, wire.encode(Kind.SPAWN, meta, frames))
        sink.future.get()
        self._actor_names.add(name)
        return ActorMesh(self, name, cls, procs, dims)

    def _stop_actors(self, mesh: ActorMesh) -> None:
        seq = self.core.issue()
        sink = GatherSink(mesh._view)
        sink.decode = self._decode
        targets = {r: mesh._procs[r].id for r in mesh._view.ranks}
        with self.runtime.lock:
            call = self.core.expect(seq, "stop", mesh.name, "__stop__", targets, sink)
        for rank in mesh._view.ranks:
            meta = {"sid": self.sid, "e": self.epoch, "s": seq, "a": mesh.name, "m": "__stop__",
                    "d": b"", "rt": self.runtime.inbox.address, "pt": rank}
            self._send(call, mesh._procs[rank], rank, wire.encode(Kind.STOP, meta))
        sink.future.get()

    def _stop_procs(self, mesh: ProcMesh) -> None:
        raise NotImplementedError("stopping a part of a session's procs lands with supervision (issue 4)")

    # --- the call path ---------------------------------------------------------------

    def _call(self, mesh: ActorMesh, method: str, args: tuple, kwargs: dict, kind: str,
              ranks: tuple[int, ...], sink: Any) -> PendingCall:
        if self._closed:
            raise RuntimeError(f"session {self.name!r} is closed")
        if self.runtime.fenced:
            raise FencedError(f"session {self.name!r} lost leadership: {self.runtime.fenced}")
        frames = wire.dumps((args, kwargs))
        digest = wire.digest(frames)
        seq = self.core.issue()
        sink.decode = self._decode
        procs = mesh._procs
        targets = {r: procs[r].id for r in ranks}
        with self.runtime.lock:
            call = self.core.expect(seq, kind, mesh.name, method, targets, sink)
        base = {"sid": self.sid, "e": self.epoch, "s": seq, "a": mesh.name, "m": method, "d": digest,
                "rt": self.runtime.inbox.address}
        for r in ranks:
            base["pt"] = r
            self._send(call, procs[r], r, wire.encode(Kind.CALL, base, frames))
        return call

    def _send(self, call: PendingCall, proc: ProcRef, rank: int, msg: list) -> None:
        try:
            self.runtime.send_to_proc(proc, msg)
        except PeerGone as e:
            self.runtime.deliver_local(call, rank, Outcome("dead", {"em": str(e)}, []))

    def _decode(self, call: PendingCall, outcome: Outcome) -> Any:
        st = outcome.status
        if st == "ok":
            return wire.loads(outcome.frames) if outcome.frames else None
        meta = outcome.meta
        who = f"{call.actor}[{meta.get('pt', '?')}]"
        if st == "err":
            raise ActorError(who, call.method, str(meta.get("et")), str(meta.get("em")), str(meta.get("tb", "")))
        if st == "dead" or st == "noactor":
            raise SupervisionError(f"{who}.{call.method} failed: {meta.get('em')}", actor=who, reason=st)
        if st == "fenced":
            raise FencedError(f"{who} refused {call.method}: {meta.get('em')}")
        if st == "divergence":
            raise DivergenceError(f"{who}.{call.method}: {meta.get('em')}")
        raise SupervisionError(f"{who}.{call.method}: unexpected status {st!r}", actor=who, reason=st)

    def _choose(self, mesh: ActorMesh) -> int:
        """Least-busy live member, ties broken round-robin."""
        ranks = mesh._view.ranks
        live = [r for r in ranks if mesh._procs[r].alive] or list(ranks)
        with self.runtime.lock:
            load = {r: 0 for r in live}
            for call in self.core.calls.values():
                for r, pid in call.targets.items():
                    if r in load and mesh._procs[r].id == pid and r not in call.results:
                        load[r] += 1
        low = min(load.values())
        best = [r for r in live if load[r] == low]
        return best[next(self._choose_rr) % len(best)]

    def _stream_results(self, sink: StreamSink) -> Iterator[tuple[Point, Any]]:
        index = {r: i for i, r in enumerate(sink.view.ranks)}
        for _ in range(len(sink.view.ranks)):
            call, rank = sink.queue.get()
            yield point_of(sink.view.dims, index[rank]), self._decode(call, call.results[rank])


def _sys_path() -> list[str]:
    import sys

    cwd = os.getcwd()
    return [p or cwd for p in sys.path]
