"""Meshes as actors hold them: references that travel as plain data, and the calls an actor
makes through them (docs/design.md, "Calls made by actors").

An ActorMesh or ProcMesh passed to an actor (as an argument, in a result, in actor state)
arrives as an `ActorMeshRef` or `ProcMeshRef`: the session, the mesh's name and shape, and
where each member lives (its proc's inbox, id and host agent). No Session travels. Inside an
actor the reference has the same adverbs as the controller's mesh (call, call_one, choose,
stream, broadcast, slice, spawn, stop); the proc's `ActorClient` sends the calls under ids
derived from the call the actor is running, so a caller run again re-issues the same ids and
each callee runs each call once.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import structlog

from regent import wire
from regent.wire import Kind
from regent.worker.actor import Bootstrap, CallSite, _calling, endpoint_names
from regent.worker.classref import class_ref
from regent.worker.client import ActorClient, Target
from regent.worker.errors import FencedError, SupervisionError, outcome_error
from regent.worker.program import program_side
from regent.worker.shape import Point, ValueMesh, point_of, select, size_of

log = structlog.get_logger("regent.actor")

_client: ActorClient | None = None  # this proc's, set when the proc starts
# A hollow host's procs share one process (worker/hollow.py): each sets its own while it serves.
MAX_SCOPED_NAME = 1000  # an actor-spawned mesh's name with its owners' (the wire allows 1024)
serving_client: contextvars.ContextVar[ActorClient | None] = contextvars.ContextVar("regent_client", default=None)


def install_client(client: ActorClient | None) -> None:
    global _client
    _client = client


def _site(what: str) -> tuple[ActorClient, CallSite]:
    site = _calling.get()
    client = serving_client.get() or _client
    if client is None or site is None:
        raise RuntimeError(
            f"{what} can only be made by an actor, while it runs an endpoint or __init__: a mesh "
            "reference names no controller. In the controller program, call the mesh the session "
            "spawned (an ActorMesh), not a reference an actor sent back")
    return client, site


def _refuse_self_await(futures: list[asyncio.Future]) -> None:
    client = serving_client.get() or _client
    if client is not None:
        client.refuse_self_await(futures)


def _decode(meta: dict, payload: list, actor: str, method: str) -> Any:
    """An answer as the caller sees it: the value, or the error it raises."""
    st = meta["st"]
    if st == "ok":
        return wire.loads(payload) if payload else None
    who = f"{actor}[{meta.get('pt', '?')}]"
    error = outcome_error(st, meta, who, method)
    if error is not None:
        raise error
    if st == "fenced":
        raise FencedError(f"{who} refused {method}: {meta.get('em')}")
    raise SupervisionError(f"{who}.{method}: unexpected status {st!r}", actor=who, reason=st)


class RemoteFuture:
    """The answer of a call an actor made: `await` it in an async endpoint, or `.get()` (which
    serves the proc's inbox meanwhile, so a sync endpoint can wait)."""

    def __init__(self, futures: list[asyncio.Future], combine: Callable[[list], Any], actor: str, method: str):
        self._futures = futures
        self._combine = combine
        self._actor, self._method = actor, method

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def get(self, timeout: float | None = None) -> Any:
        if not self.done():
            client, _ = _site("waiting for a call")
            if not client.pump(self.done, timeout, self._futures):
                raise TimeoutError(f"{self._actor}.{self._method} did not answer within {timeout} s")
        return self._value()

    def _value(self) -> Any:
        return self._combine([_decode(*f.result(), self._actor, self._method) for f in self._futures])

    def __await__(self):
        if not self.done():
            _refuse_self_await(self._futures)
            yield from asyncio.gather(*self._futures).__await__()
        return self._value()


class RemoteStream:
    """(point, value) of each member as it answers, in completion order."""

    def __init__(self, ref: ActorMeshRef, method: str, futures: list[asyncio.Future]):
        self._ref, self._method = ref, method
        self._left = dict(enumerate(futures))

    def _take(self, pos: int) -> tuple[Point, Any]:
        meta, payload = self._left.pop(pos).result()
        return point_of(self._ref.dims, pos), _decode(meta, payload, self._ref.name, self._method)

    def _ready(self) -> int | None:
        return next((pos for pos, f in self._left.items() if f.done()), None)

    def __iter__(self) -> Iterator[tuple[Point, Any]]:
        while self._left:
            pos = self._ready()
            if pos is None:
                client, _ = _site("waiting for a stream")
                client.pump(lambda: self._ready() is not None, None, list(self._left.values()))
                continue
            yield self._take(pos)

    def __aiter__(self) -> RemoteStream:
        return self

    async def __anext__(self) -> tuple[Point, Any]:
        if not self._left:
            raise StopAsyncIteration
        pos = self._ready()
        if pos is None:
            _refuse_self_await(list(self._left.values()))
            await asyncio.wait(list(self._left.values()), return_when=asyncio.FIRST_COMPLETED)
            pos = self._ready()
        return self._take(pos)


class _MeshRef:
    """What both references share: pickled as their fields, shaped by `dim_items` over `targets`."""

    dim_items: tuple[tuple[str, int], ...]
    targets: tuple[Target, ...]

    def __reduce__(self) -> tuple:
        return type(self), tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]

    @property
    def dims(self) -> dict[str, int]:
        return dict(self.dim_items)

    def __len__(self) -> int:
        return len(self.targets)

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        return size_of(self.dims, dim)


@dataclass(frozen=True, eq=False)
class ActorMeshRef(_MeshRef):
    """A mesh of actors as an actor holds it. Endpoints are attributes, with the controller's
    adverbs; `slice` and `size` as on an ActorMesh."""

    session: str
    name: str
    class_name: str
    endpoints: frozenset[str]
    dim_items: tuple[tuple[str, int], ...]  # this view's dims
    ranks: tuple[int, ...]  # each member's rank in the mesh it was spawned as, in view order
    targets: tuple[Target, ...]
    keys: tuple[str, ...]  # stable ids of the procs (a digest names these, not addresses)
    epoch: int = 0

    def __regent_digest__(self) -> tuple:
        return ("actor-mesh", self.session, self.name, self.dim_items, self.ranks, self.keys)

    def slice(self, **sel: int | slice) -> ActorMeshRef:
        dims, picked = select(self.dims, list(range(len(self.targets))), sel)
        return ActorMeshRef(self.session, self.name, self.class_name, self.endpoints, tuple(dims.items()),
                            tuple(self.ranks[i] for i in picked), tuple(self.targets[i] for i in picked),
                            tuple(self.keys[i] for i in picked), self.epoch)

    def stop(self, reason: str = "") -> Any:
        """Stop these actors; returns once they are gone, with a done future (Monarch's stop()
        is a future: `.get()` and `await` both work). `reason`, if given, is logged."""
        program = program_side(f"stopping {self.name}")
        if program is not None:
            return program.mesh_of(self).stop(reason)
        client, site = _site(f"stopping {self.name}")
        origin = site.child()
        if reason:
            log.info("stopping actors", mesh=self.name, ranks=len(self.ranks), reason=reason)
        futures = [client.send(Kind.STOP, t, site.seq, self.name, r, origin, "__stop__", b"", [])
                   for r, t in zip(self.ranks, self.targets, strict=True)]
        done = RemoteFuture(futures, lambda _: None, self.name, "__stop__")
        done.get()
        return done

    def __getattr__(self, name: str) -> RemoteEndpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self.endpoints:
            raise AttributeError(f"{self.class_name} has no endpoint {name!r} (endpoints: {sorted(self.endpoints)})")
        program = program_side(f"a call of {self.name}.{name}")
        if program is not None:  # the program calls a mesh an actor spawned: its calls are journaled
            return getattr(program.mesh_of(self), name)
        return RemoteEndpoint(self, name)

    def __repr__(self) -> str:
        return f"ActorMeshRef({self.name!r}, {self.class_name}, {self.dims})"


class RemoteEndpoint:
    """One endpoint of a mesh reference, called from inside an actor."""

    def __init__(self, ref: ActorMeshRef, method: str):
        self._ref, self._method = ref, method

    def _post(self, positions: Sequence[int], args: tuple, kwargs: dict,
              extra: dict | None = None) -> list[asyncio.Future]:
        ref = self._ref
        client, site = _site(f"a call of {ref.name}.{self._method}")
        if ref.session != client.rt.session:
            raise ValueError(f"{ref!r} belongs to session {ref.session!r}; this actor serves {client.rt.session!r}")
        origin = site.child()
        frames, digest = wire.dumps_call(args, kwargs)
        return [client.send(Kind.CALL, ref.targets[p], site.seq, ref.name, ref.ranks[p], origin, self._method,
                            digest, frames, extra) for p in positions]

    def call(self, *args: Any, **kwargs: Any) -> RemoteFuture:
        """Call every member; the future holds a ValueMesh."""
        dims = self._ref.dims
        return RemoteFuture(self._post(range(len(self._ref)), args, kwargs), lambda vs: ValueMesh(dims, vs),
                            self._ref.name, self._method)

    def call_one(self, *args: Any, **kwargs: Any) -> RemoteFuture:
        if len(self._ref) != 1:
            raise ValueError(f"call_one needs a mesh of one actor, {self._ref.name} has {len(self._ref)} "
                             f"{self._ref.dims}: slice it first")
        return RemoteFuture(self._post([0], args, kwargs), lambda vs: vs[0], self._ref.name, self._method)

    def choose(self, *args: Any, **kwargs: Any) -> RemoteFuture:
        """Call one member. The pick follows from the call's id, so the same call run again
        picks the same member (and finds the call there)."""
        return RemoteFuture(self._post([self._pick()], args, kwargs), lambda vs: vs[0], self._ref.name, self._method)

    def _pick(self) -> int:
        _, site = _site(f"a call of {self._ref.name}.{self._method}")
        return zlib.crc32(f"{site.seq}/{site.origin}/{site.made}".encode()) % len(self._ref)

    def send(self, args: tuple = (), kwargs: Mapping[str, Any] | None = None, port: Any = None,
             selection: str = "all") -> None:
        """Monarch's send() from an actor: to every member, or one ("choose"); without a port a
        broadcast, with one each member's value or error goes to it (docs/monarch.md)."""
        positions = range(len(self._ref)) if check_selection(selection) == "all" else [self._pick()]
        args, kwargs = tuple(args), dict(kwargs or {})
        if port is not None:
            args, extra = (port, *args), {"rp": True}
        else:
            extra = {"bc": True}
        ref, method = self._ref, self._method
        for pos, f in zip(positions, self._post(positions, args, kwargs, extra), strict=True):
            f.add_done_callback(lambda f, pos=pos: _log_failed(f, ref, method, pos))

    def stream(self, *args: Any, **kwargs: Any) -> RemoteStream:
        return RemoteStream(self._ref, self._method, self._post(range(len(self._ref)), args, kwargs))

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every member without waiting. An Exception it raises fails the member (its
        owner's `__supervise__` hears of it), as in Monarch; a failure is logged here."""
        ref, method = self._ref, self._method
        for pos, f in enumerate(self._post(range(len(ref)), args, kwargs, {"bc": True})):
            f.add_done_callback(lambda f, pos=pos: _log_failed(f, ref, method, pos))


def _log_failed(f: asyncio.Future, ref: ActorMeshRef, method: str, pos: int) -> None:
    meta, _ = f.result()
    if meta["st"] != "ok":
        log.warning("broadcast failed on one actor", actor=ref.name, endpoint=method, point=ref.ranks[pos],
                    status=meta["st"], error=meta.get("em"))


@dataclass(frozen=True, eq=False)
class ProcMeshRef(_MeshRef):
    """A mesh of procs as an actor holds it: `spawn` actors on it from inside an actor."""

    session: str
    dim_items: tuple[tuple[str, int], ...]
    targets: tuple[Target, ...]
    keys: tuple[str, ...]
    epoch: int = 0

    def __regent_digest__(self) -> tuple:
        return ("proc-mesh", self.session, self.dim_items, self.keys)

    def slice(self, **sel: int | slice) -> ProcMeshRef:
        dims, picked = select(self.dims, list(range(len(self.targets))), sel)
        return ProcMeshRef(self.session, tuple(dims.items()), tuple(self.targets[i] for i in picked),
                           tuple(self.keys[i] for i in picked), self.epoch)

    def spawn(self, name: str, actor_class: type, *args: Any, **kwargs: Any) -> ActorMeshRef:
        """Create one actor per proc, owned by the calling actor; returns once every __init__
        ran. Its name is scoped by its owner's, `owner[rank].name`: the owner may not spawn a
        second mesh of that name while the first lives.
        A member that fails is reported to the owner's `__supervise__(failure)`, and the mesh is
        stopped when its owner ends (docs/design.md, "Calls made by actors")."""
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ValueError(f"actor mesh name {name!r} must be a non-empty string")
        program = program_side(f"spawning {name}")
        if program is not None:  # a proc mesh an actor sent back: the program's spawn, supervised as any
            return program.mesh_of(self).spawn(name, actor_class, *args, **kwargs)
        client, site = _site(f"spawning {name}")
        # Scoped by its owner, as Monarch's are by their parent: two actors may each spawn a
        # child mesh of one name on the same procs.
        name = f"{site.actor}[{site.point}].{name}"
        if len(name) > MAX_SCOPED_NAME:
            raise ValueError(f"actor mesh name {name[:200]}... is {len(name)} characters with its owners' names: "
                             f"meshes spawned by actors nest at most {MAX_SCOPED_NAME} characters deep")
        origin = site.child()
        frames = wire.dumps((class_ref(actor_class), args, kwargs))
        identity = (actor_class.__module__, actor_class.__qualname__, args, kwargs)
        digest = wire.call_digest(identity, wire.dumps(identity))
        dims = self.dims
        rt = client.rt
        owner = {"a": site.actor, "pt": site.point, "addr": rt.inbox.address, "p": rt.proc_id, "h": rt.host_inbox}
        futures = [client.send(Kind.SPAWN, t, site.seq, name, i, origin, "__init__", digest, frames,
                               {"co": dict(point_of(dims, i)), "sz": dims, "ow": owner})
                   for i, t in enumerate(self.targets)]
        RemoteFuture(futures, list, name, "__init__").get()
        child = ActorMeshRef(self.session, name, actor_class.__name__, frozenset(endpoint_names(actor_class)),
                             self.dim_items, tuple(range(len(self.targets))), self.targets, self.keys, self.epoch)
        rt.owned(site.actor, child)
        return child

    def __repr__(self) -> str:
        return f"ProcMeshRef({self.dims})"


def proc_ref(session: str, dims: Mapping[str, int], targets: Sequence[Target], keys: Sequence[str],
             epoch: int = 0) -> ProcMeshRef:
    return ProcMeshRef(session, tuple(dims.items()), tuple(targets), tuple(keys), epoch)


def get_or_spawn_controller(name: str, actor_class: type, *args: Any, **kwargs: Any) -> Any:
    """Monarch's singleton actors of the client process: in the controller program, the one
    actor named `name` on the program's own proc, spawned on first use (`Session.
    get_or_spawn_controller`). Blocks until it is there and returns its mesh (Monarch returns
    a future of it). An actor is handed the mesh as an argument instead (docs/monarch.md)."""
    program = program_side(f"get_or_spawn_controller({name!r})")
    if program is None:
        raise RuntimeError(f"get_or_spawn_controller({name!r}) inside an actor: regent's controller actors are "
                           "the program's; have the program call it and pass the mesh to this actor")
    return program.get_or_spawn_controller(name, actor_class, *args, **kwargs)


def this_proc() -> Any:
    """The proc the running actor lives on, as a one-proc mesh (Monarch's `this_proc()`). In the
    controller program: the program's own proc, on the controller's machine (`s.this_proc()`)."""
    program = program_side("this_proc()")
    if program is not None:
        return program.this_proc()
    client, _ = _site("this_proc()")
    rt = client.rt
    return proc_ref(rt.session, {"procs": 1}, [Target(rt.inbox.address, rt.proc_id, rt.host_inbox)],
                    [rt.proc_id], rt.fence.epoch)


@dataclass(frozen=True, eq=False)
class HostMeshRef:
    """The machine an actor runs on (`this_host()` in an actor): it spawns procs there, owned
    by the actor, under an id derived from the call it runs (docs/design.md, "Calls made by
    actors"), so a re-run of that call gets the same procs back from the host agent."""

    session: str
    host: str  # the host agent's inbox
    epoch: int = 0

    @property
    def dims(self) -> dict[str, int]:
        return {"hosts": 1}

    def __len__(self) -> int:
        return 1

    def spawn_procs(self, per_host: Mapping[str, int] | None = None,
                    bootstrap: Callable[[], Any] | None = None) -> ProcMeshRef:
        """`per_host` procs on this machine, as a ProcMeshRef of dims {"hosts": 1, dim: n};
        `bootstrap` runs once in each before any actor is spawned there. Blocks until every
        proc is up. The procs live until their owner ends (it stops them) or the session does."""
        dim, count = _per_host(per_host)
        if bootstrap is not None and (asyncio.iscoroutinefunction(bootstrap) or not callable(bootstrap)):
            raise TypeError(f"bootstrap must be a plain function, not {bootstrap!r}")
        client, site = _site("spawn_procs")
        _, digest = wire.dumps_call((1, dim, count), {})
        envs = [{"REGENT_PROC_RANK": str(i), "REGENT_PROC_DIM": dim} for i in range(count)]
        future = client.ask_host(self.host, "spawn_procs", {
            "s": site.seq, "o": site.child(), "count": count, "envs": envs, "d": digest,
            "path": [p for p in sys.path if p]})
        if not future.done():
            client.pump(future.done, None, [future])  # sent again until answered
        reply = future.result()
        if reply.get("st") != "ok":
            raise SupervisionError(f"host agent at {self.host} could not spawn procs: {reply.get('em')}",
                                   reason=str(reply.get("st")))
        listed = sorted(reply.get("procs") or [], key=lambda p: p["idx"])
        procs = ProcMeshRef(self.session, (("hosts", 1), (dim, count)),
                            tuple(Target(p["addr"], p["id"], self.host) for p in listed),
                            tuple(p["id"] for p in listed), client.rt.fence.epoch)
        client.rt.owned(site.actor, OwnedProcs(self.host, procs.keys))
        if bootstrap is not None:
            procs.spawn("__regent_bootstrap__", Bootstrap, bootstrap)
        return procs

    def __repr__(self) -> str:
        return f"HostMeshRef({self.host})"


def _per_host(per_host: Mapping[str, int] | None) -> tuple[str, int]:
    per_host = dict(per_host or {"procs": 1})
    if len(per_host) != 1:
        raise ValueError(f"per_host names one dimension, e.g. {{'procs': 4}}; got {per_host}")
    ((dim, count),) = per_host.items()
    if dim == "hosts" or not isinstance(dim, str) or not isinstance(count, int) or isinstance(count, bool) \
            or not 0 < count <= 1024:
        raise ValueError(f"per_host={per_host}: the count must be an int from 1 to 1024 and the dim not 'hosts'")
    return dim, count


@dataclass(frozen=True)
class OwnedProcs:
    """Procs an actor spawned: its proc asks their host agent to stop them when the actor ends."""

    host: str
    ids: tuple[str, ...]


def check_selection(selection: str) -> str:
    """Monarch's `Selection` for send(): "all" or "choose"."""
    if selection not in ("all", "choose"):
        raise ValueError(f"selection={selection!r}: send() takes 'all' or 'choose'")
    return selection


def send(endpoint: Any, args: tuple = (), kwargs: Mapping[str, Any] | None = None, port: Any = None,
         selection: str = "all") -> None:
    """Monarch's `send(endpoint, args, kwargs, port=None, selection="all")`: fire and forget to
    the endpoint's mesh (or one member of it, "choose"); with `port`, each answer goes there. For
    an endpoint of the program's ActorMesh and of an actor's ActorMeshRef alike."""
    endpoint.send(args, kwargs, port, selection)


def this_host() -> Any:
    """The machine the running actor is on, as a HostMeshRef that spawns procs (Monarch's
    `this_host()`). In the controller program: the program's machine, `s.this_host()`."""
    program = program_side("this_host()")
    if program is not None:
        return program.this_host()
    client, _ = _site("this_host()")
    return HostMeshRef(client.rt.session, client.rt.host_inbox, client.rt.fence.epoch)
