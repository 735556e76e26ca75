"""Meshes and endpoints: the nouns and verbs of the user's program.

A mesh is a view (named dims + the ranks it covers) over a root list of procs.
Every endpoint has the same adverbs as Monarch: call, call_one, choose, stream,
broadcast. They all turn into the session's one call path.
"""

from __future__ import annotations

import inspect
import itertools
import queue
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from regent.controller.folding import folded, pickled_reducer
from regent.controller.futures import Future, Point, ValueMesh, stopped_future
from regent.controller.stream import stream_results
from regent.worker.actor import endpoint_names
from regent.worker.client import Target
from regent.worker.ports import Port
from regent.worker.remote import ActorMeshRef, ProcMeshRef, check_selection, proc_ref
from regent.worker.shape import select, size_of
from regent.worker.system import Bootstrap, ProcGroup

if TYPE_CHECKING:
    from regent.controller.refs import ProcRef
    from regent.controller.session import Session
    from regent.controller.shapes import Shape


@dataclass(frozen=True)
class View:
    """Which members of a root mesh a handle covers, and how they are shaped."""

    dims: dict[str, int]
    ranks: tuple[int, ...]  # root ranks, in this view's row-major order

    @staticmethod
    def full(dims: Mapping[str, int]) -> View:
        n = 1
        for size in dims.values():
            n *= size
        return View(dict(dims), tuple(range(n)))

    def slice(self, **sel: int | slice) -> View:
        dims, ranks = select(self.dims, self.ranks, sel)
        return View(dims, tuple(ranks))

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        return size_of(self.dims, dim)

    def __len__(self) -> int:
        return len(self.ranks)


class HostMesh:
    """Machines with a running host agent."""

    def __init__(self, session: Session, hosts: list[str]):
        self._session = session
        self._hosts = hosts
        self._shut = False

    @property
    def dims(self) -> dict[str, int]:
        return {"hosts": len(self._hosts)}

    def __len__(self) -> int:
        return len(self._hosts)

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        return size_of(self.dims, dim)

    def shutdown(self) -> None:
        """Stop every proc this session started on these hosts, and the actors on them. The
        host agents stay up (other sessions may use them); this handle spawns no more procs."""
        self._shut = True
        self._session._lifecycle.shutdown_hosts(self._hosts)

    def __enter__(self) -> HostMesh:
        if self._shut:
            raise RuntimeError("this HostMesh was shut down; get another with s.this_host() or s.host_mesh()")
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._shut:
            self.shutdown()

    async def __aenter__(self) -> HostMesh:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)

    def slice(self, hosts: int | slice) -> HostMesh:
        """Some of these hosts: hosts=i (one) or hosts=slice(a, b)."""
        picked = self._hosts[hosts] if isinstance(hosts, slice) else [self._hosts[hosts]]
        if not picked:
            raise ValueError(f"hosts={hosts!r} selects none of {len(self._hosts)} hosts")
        return HostMesh(self._session, picked)

    def spawn_procs(self, per_host: Mapping[str, int] | None = None,
                    bootstrap: Callable[[], Any] | None = None) -> ProcMesh:
        """Start procs on every host: per_host={"procs": N} (or {"gpus": N}, one GPU each).

        bootstrap: a plain function each new proc runs once before any actor of the program is
        spawned there (Monarch's `bootstrap=`): set up the environment, logging, a library. It
        runs as the `__init__` of a system actor, so it is journaled like a spawn and a standby
        does not run it again; what it raises fails the call with ActorError."""
        if self._shut:
            raise RuntimeError("this HostMesh was shut down; get another with s.this_host() or s.host_mesh()")
        if bootstrap is not None and (inspect.iscoroutinefunction(bootstrap) or not callable(bootstrap)):
            raise TypeError(f"bootstrap must be a plain function, not {bootstrap!r}")
        procs = self._session._lifecycle.spawn_procs(self._hosts, dict(per_host or {"procs": 1}))
        if bootstrap is not None:
            taken = self._session._lifecycle.actor_names
            free = next(i for i in itertools.count() if f"{_BOOTSTRAP_PREFIX}{i}" not in taken)
            procs.spawn(f"{_BOOTSTRAP_PREFIX}{free}", Bootstrap, bootstrap)
        return procs


class ProcMesh:
    """Processes hosting actors, shaped {"hosts": H, <kind>: N}.

    The handle spawn_procs returns follows its proc mesh's shape: after a lost host's points
    left it (on_host_lost="shrink"), its dims, size and slices are of the smaller mesh from the
    program's next use of a handle on. A slice taken before keeps the points it had."""

    def __init__(self, session: Session, procs: list[ProcRef], view: View, shape: Shape | None = None):
        self._session = session
        self._procs = procs
        self._view = view
        self._shape = shape
        if shape is not None:
            shape.handles.add(self)

    def _reshape(self, procs: list[ProcRef], dims: dict[str, int]) -> None:
        self._procs, self._view = procs, View.full(dims)

    def _current(self) -> View:
        """This handle's view, after any shape change due at this point of the program."""
        if self._shape is not None:
            self._session._shapes.adopt(self._session)
        return self._view

    @property
    def dims(self) -> dict[str, int]:
        return dict(self._current().dims)

    def __len__(self) -> int:
        return len(self._current())

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """How many procs (dim=None), or the size of a dim (or the product of several)."""
        return self._current().size(dim)

    def slice(self, **sel: int | slice) -> ProcMesh:
        return ProcMesh(self._session, self._procs, self._current().slice(**sel))

    def procs(self) -> list[ProcRef]:
        return [self._procs[r] for r in self._current().ranks]

    def grow(self, hosts: int, timeout_s: float = 60.0) -> None:
        """Add `hosts` registered hosts of the cluster that the session does not use (their points
        at the end of the "hosts" dim): procs start there, every actor mesh spawned on this proc
        mesh gets members there (a supervised one is rebuilt at its new size), and a process
        group formed on it re-forms with the larger world. The inverse of a shrink; journaled.
        TimeoutError, saying how many hosts are free, when too few register within timeout_s."""
        self._session._lifecycle.grow(self, hosts, timeout_s)

    def __reduce__(self) -> tuple:
        """Sent to an actor, a proc mesh travels as a `ProcMeshRef`: plain data, no Session."""
        return self._ref().__reduce__()

    def __regent_digest__(self) -> tuple:
        """What a call's digest takes of this mesh: not its addresses or epoch (wire.call_digest)."""
        return self._ref().__regent_digest__()

    def _ref(self) -> ProcMeshRef:
        procs = self.procs()
        return proc_ref(self._session.sid, self._view.dims, [_target(p) for p in procs], [p.key for p in procs],
                        self._session.epoch)

    def spawn(self, name: str, actor_class: type, *args: Any, restart: Any = None, **kwargs: Any) -> ActorMesh:
        """Create one actor per proc; returns when every actor's __init__ has run.

        restart: a `RestartPolicy` (or "permanent" / "transient" / "temporary") to have
        the mesh supervised; None leaves failed actors failed.
        """
        return self._session._lifecycle.spawn_actors(self, name, actor_class, args, kwargs, restart)

    def stop(self, reason: str = "") -> Future[None]:
        """Stop these procs and the actors on them (journaled; supervision does not restart them).
        Returns once they are stopped, with a done future, as Monarch's `stop()` returns a future
        (`.get()` and `await` both work); `reason`, if given, is in the error of a call that finds them gone."""
        self._session._lifecycle.stop_procs(self.procs(), reason)
        return stopped_future()

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        if not all(p.stopped for p in self.procs()):
            self.stop()

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)

    def init_process_group(self, backend: str = "auto", timeout_s: float = 300.0) -> str:
        """Join this mesh's procs to one torch.distributed process group; returns the backend.

        Rank = the proc's rank in this mesh; world size = its size; backend "auto" is
        gloo on CPU procs and nccl (RCCL on ROCm) on GPU procs. The rendezvous is at
        rank 0's host, on a port rank 0 picks. torch.distributed is per process, so
        afterwards every actor on these procs can run collectives. The steps are
        ordinary journaled calls to a system actor (`worker.system.ProcGroup`), so a
        standby replays them and the procs, already in the group, are not asked twice.
        """
        taken = self._session._lifecycle.actor_names
        free = next(i for i in itertools.count() if f"{_PROC_GROUP_PREFIX}{i}" not in taken)  # names are reused
        group = self.spawn(f"{_PROC_GROUP_PREFIX}{free}", ProcGroup, len(self))
        master_addr = host_of(self.procs()[0].address)
        rank0 = group.slice(**dict.fromkeys(group.dims, 0))
        master_port = rank0.free_port.call_one(master_addr).get()
        joined = group.join.call(master_addr, master_port, backend, timeout_s).get().values()[0]
        self._session._lifecycle.group_formed(group.name, self.procs(), joined, timeout_s)
        return joined


_PROC_GROUP_PREFIX = "__regent_pg__"
_BOOTSTRAP_PREFIX = "__regent_bootstrap__"


def _target(p: ProcRef) -> Target:
    return Target(p.address, p.id, p.host)


def host_of(address: str) -> str:
    """The host part of a proc's address: tcp://10.0.0.5:4411 -> 10.0.0.5, tcp://[::1]:4411 -> ::1."""
    host = address.split("://", 1)[-1].rsplit(":", 1)[0]
    return host.strip("[]")


class ActorMesh:
    """One actor per proc of a proc mesh; endpoints are attributes."""

    def __init__(self, session: Session, name: str, actor_class: type, procs: list[ProcRef], dims: dict[str, int],
                 view: View | None = None, shape: Shape | None = None):
        self._init(session, name, actor_class, actor_class.__name__, frozenset(endpoint_names(actor_class)), procs,
                   dims, view or View.full(dims))
        if shape is not None:  # spawned on a whole proc mesh: this handle follows its shape
            self._shape = shape
            shape.handles.add(self)

    def _reshape(self, procs: list[ProcRef], dims: dict[str, int]) -> None:
        self._procs, self._root_dims, self._view = procs, dict(dims), View.full(dims)

    def _current(self) -> View:
        """This handle's view, after any shape change due at this point of the program."""
        if self._shape is not None:
            self._session._shapes.adopt(self._session)
        return self._view

    def _init(self, session: Session, name: str, actor_class: type | None, class_name: str,
              endpoints: frozenset[str], procs: list[ProcRef], dims: dict[str, int], view: View) -> None:
        self._session = session
        self._name = name
        self._class = actor_class  # None for a mesh an actor spawned
        self._class_name, self._endpoints = class_name, endpoints
        self._procs = procs  # indexed by root rank
        self._root_dims = dims
        self._view = view
        self._shape: Shape | None = None

    @classmethod
    def of_ref(cls, session: Session, ref: ActorMeshRef, procs: list[ProcRef]) -> ActorMesh:
        """A mesh an actor spawned, as the program calls it through a reference an actor sent
        back: `procs` are the session's procs its members live on, in the reference's order.
        Its calls are the program's, journaled as every call is."""
        by_rank: list[Any] = [None] * (max(ref.ranks) + 1)
        for r, p in zip(ref.ranks, procs, strict=True):
            by_rank[r] = p
        mesh = cls.__new__(cls)
        mesh._init(session, ref.name, None, ref.class_name, ref.endpoints, by_rank, ref.dims,
                   View(ref.dims, tuple(ref.ranks)))
        return mesh

    @property
    def name(self) -> str:
        return self._name

    @property
    def dims(self) -> dict[str, int]:
        return dict(self._current().dims)

    def __len__(self) -> int:
        return len(self._current())

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """How many actors (dim=None), or the size of a dim (or the product of several)."""
        return self._current().size(dim)

    def slice(self, **sel: int | slice) -> ActorMesh:
        view = self._current().slice(**sel)
        mesh = ActorMesh.__new__(ActorMesh)
        mesh._init(self._session, self._name, self._class, self._class_name, self._endpoints, self._procs,
                   self._root_dims, view)
        return mesh

    def stop(self, reason: str = "") -> Future[None]:
        """Stop these actors (their `__cleanup__` runs); returns once they are gone, with a done
        future, as ProcMesh.stop does. `reason`, if given, is logged with the stop."""
        self._session._lifecycle.stop_actors(self, reason)
        return stopped_future()

    def __reduce__(self) -> tuple:
        """Sent to an actor, an actor mesh travels as an `ActorMeshRef`: plain data, no Session;
        the actor calls it through its own proc (docs/design.md, "Calls made by actors")."""
        return self._ref().__reduce__()

    def __regent_digest__(self) -> tuple:
        """What a call's digest takes of this mesh: not its addresses or epoch (wire.call_digest)."""
        return self._ref().__regent_digest__()

    def _ref(self) -> ActorMeshRef:
        ranks = self._view.ranks
        procs = [self._procs[r] for r in ranks]
        return ActorMeshRef(self._session.sid, self._name, self._class_name, self._endpoints,
                            tuple(self._view.dims.items()), tuple(ranks), tuple(_target(p) for p in procs),
                            tuple(p.key for p in procs), self._session.epoch)

    def __getattr__(self, name: str) -> Endpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._endpoints:
            raise AttributeError(
                f"{self._class_name} has no endpoint {name!r} (endpoints: {sorted(self._endpoints)})"
            )
        ep = self.__dict__[name] = Endpoint(self, name)  # found directly from now on
        return ep

    def __repr__(self) -> str:
        return f"ActorMesh({self._name!r}, {self._class_name}, {self.dims})"


class Endpoint:
    """One endpoint of an actor mesh, with Monarch's adverbs."""

    def __init__(self, mesh: ActorMesh, method: str):
        self._m = mesh
        self._method = method

    @property
    def _mesh(self) -> ActorMesh:
        """The mesh, its shape brought up to this point of the program (a shrink shows here)."""
        m = self._m
        if m._shape is not None:
            m._session._shapes.adopt(m._session)
        return m

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh]:
        """Call every actor of the mesh; the future holds a ValueMesh."""
        mesh = self._mesh
        sink = GatherSink(mesh._view)
        mesh._session._call(mesh, self._method, args, kwargs, "call", mesh._view.ranks, sink)
        return sink.future

    def reduce_on_hosts(self, identity: Any, reducer: Callable[[Any, Any], Any], args: tuple,
                        kwargs: Mapping[str, Any]) -> Future:
        """`Accumulator(endpoint, identity, reducer, on_host=True).accumulate(*args, **kwargs)`:
        call every actor, each host folding its actors' values before the controller."""
        mesh = self._mesh
        sink = FoldSink(mesh._view, identity, reducer)
        mesh._session._call(mesh, self._method, args, dict(kwargs), "call", mesh._view.ranks, sink,
                            fold=pickled_reducer(identity, reducer))
        return sink.future

    def call_one(self, *args: Any, **kwargs: Any) -> Future:
        """Call the single actor of a one-member mesh."""
        mesh = self._mesh
        if len(mesh._view) != 1:
            raise ValueError(
                f"call_one needs a mesh of one actor, {mesh.name} has {len(mesh._view)} "
                f"{mesh.dims}: slice it first, e.g. .slice(procs=0)"
            )
        sink = GatherSink(mesh._view, single=True)
        mesh._session._call(mesh, self._method, args, kwargs, "call_one", mesh._view.ranks, sink)
        return sink.future

    def choose(self, *args: Any, **kwargs: Any) -> Future:
        """Call one actor of the mesh, picked by the session (least busy); the pick is journaled."""
        mesh = self._mesh
        sink = GatherSink(mesh._view, single=True)
        mesh._session._call(mesh, self._method, args, kwargs, "choose", None, sink)
        return sink.future

    def stream(self, *args: Any, **kwargs: Any) -> StreamResults:
        """Call every actor; iterate (point, value) in completion order.

        `for p, v in ep.stream(...)` waits as long as it takes; `ep.stream(...).iter(timeout=2.0)`
        raises TimeoutError when the next value is not in within 2 s of the first wait."""
        mesh = self._mesh
        sink = StreamSink(mesh._view)
        session = mesh._session
        session._call(mesh, self._method, args, kwargs, "stream", mesh._view.ranks, sink)
        return StreamResults(session, sink)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Fire and forget to every actor. Nobody reads its answer, so an exception it raises
        fails that actor, as in Monarch: its restart policy applies, or the unhandled-fault hook
        hears of it; the failure is also logged."""
        mesh = self._mesh
        sink = BroadcastSink(mesh.name, self._method)
        mesh._session._call(mesh, self._method, args, kwargs, "broadcast", mesh._view.ranks, sink)


    def send(self, args: tuple = (), kwargs: Mapping[str, Any] | None = None, port: Port | None = None,
             selection: str = "all") -> None:
        """Monarch's `send(endpoint, args, kwargs, port, selection)`: fire and forget to every
        member ("all") or to one the session picks ("choose", journaled like choose's). Without
        a port it is a broadcast (an Exception fails the actor); with one, each member's value or
        error goes to the port (an endpoint taking a response port gets that port)."""
        mesh = self._mesh
        ranks = mesh._view.ranks if check_selection(selection) == "all" else None  # None: the session chooses
        if port is not None and not isinstance(port, Port):
            raise TypeError(f"send(port=...) takes a Port (from s.open_port() or Channel.open()), got {type(port).__name__}")
        sink = BroadcastSink(mesh.name, self._method, what="a send failed on one actor")
        mesh._session._call(mesh, self._method, tuple(args), dict(kwargs or {}), "broadcast", ranks, sink,
                            answer_to=port)


# --- sinks: how outcomes of a call reach the program --------------------------------


class GatherSink:
    """Resolves one future when every point has answered."""

    def __init__(self, view: View, single: bool = False):
        self.view = view
        self.single = single
        self.future: Future = Future()
        self.decode = None  # set by the session: Outcome -> value or raise
        self.call: Any = None

    def deliver(self, call: Any, point: int) -> None:
        if not call.complete:
            return
        # Where the outcomes sit in the journal, and which procs hold them until then: what
        # the program may issue after reading them depends on both (Session._issue).
        self.future.lsn = max(o.lsn for o in call.results.values())
        self.future.holders = [o.holder for o in call.results.values()]
        try:
            value = self._value(call)
        except BaseException as e:  # noqa: BLE001 - the program sees it through the future
            self.future.set_exception(e)
        else:
            self.future.set_result(value)

    def _value(self, call: Any) -> Any:
        if self.single:
            (only,) = call.results.values()
            return self.decode(call, only)
        index = {r: i for i, r in enumerate(self.view.ranks)}
        values: list[Any] = [None] * len(self.view.ranks)
        for rank, outcome in call.results.items():
            values[index[rank]] = self.decode(call, outcome)
        return ValueMesh(self.view.dims, values)


class FoldSink(GatherSink):
    """An Accumulator's: the fold of every point's value (controller/folding.py), or the error
    of the first point in mesh order that failed."""

    def __init__(self, view: View, identity: Any, reducer: Callable[[Any, Any], Any]):
        super().__init__(view)
        self.identity, self.reducer = identity, reducer

    def _value(self, call: Any) -> Any:
        values = {r: self.decode(call, call.results[r]) for r in self.view.ranks}
        covered = {p for r in self.view.ranks for p in call.results[r].meta.get("fp") or ()}
        return folded(values, covered, self.view.ranks, self.identity, self.reducer)


class StreamResults:
    """The values of a `stream` call in completion order (an iterator of (point, value))."""

    def __init__(self, session: Any, sink: StreamSink):
        self._session = session
        self._sink = sink
        self._it: Iterator[tuple[Point, Any]] | None = None
        self._taken = 0  # values handed out by __anext__

    def iter(self, timeout: float | None = None) -> Iterator[tuple[Point, Any]]:
        """Iterate with a deadline: TimeoutError (journaled, so a replay raises it at the same
        place) when the stream is not complete `timeout` seconds after iteration starts."""
        if self._it is not None:
            raise RuntimeError("this stream is already being iterated")
        self._it = stream_results(self._session, self._sink, timeout)
        return self._it

    def __iter__(self) -> Iterator[tuple[Point, Any]]:
        return self._it if self._it is not None else self.iter()

    def __next__(self) -> tuple[Point, Any]:
        return next(iter(self))

    def __aiter__(self) -> StreamResults:
        """`async for point, value in ...stream(...)` on the session's loop (`s.run`): each step
        awaits the next arrival as a wake-up of the loop, so tasks interleave as a replay repeats."""
        return self

    async def __anext__(self) -> tuple[Point, Any]:
        it = iter(self)
        sink = self._sink
        if self._taken < len(sink.view.ranks):
            with self._session._drive.lock:
                arrival = sink.arrival(self._taken)
            await arrival
        self._taken += 1
        try:
            return next(it)
        except StopIteration:
            raise StopAsyncIteration from None


class StreamSink:
    """Queues each point's outcome as it arrives."""

    def __init__(self, view: View):
        self.view = view
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.decode = None
        self.call: Any = None
        self.delivered = 0
        self._waiting: tuple[int, Future] | None = None

    def deliver(self, call: Any, point: int) -> None:
        self.queue.put((call, point))
        self.delivered += 1
        waiting = self._waiting
        if waiting is not None and self.delivered > waiting[0]:
            self._waiting = None
            waiting[1].set_result(None)

    def arrival(self, n: int) -> Future:
        """A future done once more than `n` outcomes have arrived (the caller holds the drive)."""
        fut: Future = Future()
        fut.tag = self.call.seq
        if self.delivered > n:
            fut.set_result(None)
        else:
            self._waiting = (n, fut)
        return fut


class BroadcastSink:
    """Outcomes nobody reads (a broadcast, a send): a failure is logged."""

    def __init__(self, actor: str, method: str, what: str = "broadcast failed on one actor"):
        self.actor = actor
        self.method = method
        self.what = what
        self.decode = None
        self.call: Any = None

    def deliver(self, call: Any, point: int) -> None:
        outcome = call.results[point]
        if outcome.status != "ok":
            import structlog

            structlog.get_logger("regent.controller").warning(
                self.what, actor=self.actor, endpoint=self.method,
                point=point, status=outcome.status, error=outcome.meta.get("em"))
