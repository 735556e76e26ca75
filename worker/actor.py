"""The user-facing actor model: `Actor`, `endpoint`, `concurrent_endpoint`, and the
per-actor context.

An actor is plain Python state inside one proc; the proc's runtime feeds it one
message at a time, except that a `concurrent_endpoint` lets the next ones in while it
awaits. Nothing here knows about sockets.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from regent.worker.errors import ActorExit

F = TypeVar("F", bound=Callable[..., Any])

_ENDPOINT_ATTR = "__regent_endpoint__"
_CONCURRENT_ATTR = "__regent_concurrent__"
_PORT_ATTR = "__regent_response_port__"


def endpoint(fn: F | None = None, *, explicit_response_port: bool = False) -> Any:
    """Mark a method of an Actor as callable from the controller (sync or async).

    `@endpoint(explicit_response_port=True)`: the method gets a `Port` as its first argument
    and answers its caller by `port.send(value)` (or `port.exception(exc)`), when it likes:
    from another call, or after returning; what it returns is ignored (Monarch's shape)."""
    def mark(f: F) -> F:
        setattr(f, _ENDPOINT_ATTR, True)
        if explicit_response_port:
            setattr(f, _PORT_ATTR, True)
        return f

    return mark if fn is None else mark(fn)


def concurrent_endpoint(fn: F) -> F:
    """Mark an `async def` method of an Actor as an endpoint that does not hold the actor's
    mailbox: once a call of it has started (run to its first await), the actor takes its
    next message while the call awaits, so a gate, a long poll or a ping-pong does not
    deadlock. Calls of other endpoints keep running one at a time, in order (docs/design.md,
    "Concurrent endpoints")."""
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"concurrent_endpoint can only mark an async def method; {fn.__qualname__} is not "
                         "one (a sync endpoint holds the proc's only thread until it returns)")
    setattr(fn, _ENDPOINT_ATTR, True)
    setattr(fn, _CONCURRENT_ATTR, True)
    return fn


def endpoint_names(cls: type) -> set[str]:
    """Names of the endpoints an actor class declares (including inherited ones)."""
    names = set()
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if getattr(value, _ENDPOINT_ATTR, False):
                names.add(name)
    return names


def is_async_endpoint(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn)


def is_concurrent_endpoint(fn: Callable[..., Any]) -> bool:
    return bool(getattr(fn, _CONCURRENT_ATTR, False))


def takes_response_port(fn: Callable[..., Any]) -> bool:
    return bool(getattr(fn, _PORT_ATTR, False))


@dataclass(frozen=True)
class ActorContext:
    """Where the running actor sits: its mesh (the name it was spawned as), its rank and
    coordinates in it (`point`, a `Point` once spawned), the mesh's sizes, its proc."""

    mesh: str
    rank: int
    point: Mapping[str, int]
    proc_index: int
    incarnation: int = 0
    sizes: Mapping[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        """The actor's identity as its log lines show it: `trainers{'hosts': 0/1, 'procs': 2/4}`."""
        return f"{self.mesh}{self.point!r}"

    @property
    def actor_instance(self) -> ActorContext:
        """Monarch's spelling, `context().actor_instance`: the running actor, whose `str()` is
        its name and point and whose `rank` is its place in its mesh."""
        return self

    def abort(self, reason: str | None = None) -> NoReturn:
        """Monarch's `actor_instance.abort(reason)`: end the running actor with a failure, which
        its mesh's restart policy (or its owner's supervision) then handles. It raises
        ActorExit, so the endpoint stops there; its caller gets a SupervisionError."""
        raise ActorExit(reason or f"actor {self} aborted", normal=False)


_current: contextvars.ContextVar[ActorContext | None] = contextvars.ContextVar(
    "regent_actor_context", default=None
)

MAX_ORIGIN = 4000  # characters of a call's origin path (wire.schema.Origin allows 4096)


@dataclass(slots=True)
class CallSite:
    """The call an actor's code is running under: what the ids of the calls it makes derive
    from. The k-th call made while running call (seq, origin) at actor[point] has the id
    (seq, origin + "/actor[point]#k"): the same on every execution of that call, so a callee
    runs each once (docs/design.md, "Calls made by actors")."""

    seq: int  # the root call id: the controller's seq this chain of calls descends from
    origin: str  # "" for a call the controller made
    actor: str
    point: int
    made: int = 0
    sends: dict[str, int] = field(default_factory=dict)  # port id -> the last send's number

    def child(self) -> str:
        """The origin of the next call made under this one."""
        step = f"{self.actor}[{self.point}]#{self.made}"
        self.made += 1
        origin = f"{self.origin}/{step}" if self.origin else step
        if len(origin) > MAX_ORIGIN:
            raise RuntimeError(f"calls made by actors nest too deep ({origin[:200]}...): "
                               f"a chain of calls may be at most {MAX_ORIGIN} characters of ids")
        return origin


_calling: contextvars.ContextVar[CallSite | None] = contextvars.ContextVar("regent_call_site", default=None)


def context() -> ActorContext:
    """The context of the actor whose code is running (raises outside an actor)."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("worker.context() called outside an actor endpoint")
    return ctx


def current_rank() -> Mapping[str, int]:
    """The running actor's coordinates in its mesh, as Monarch's `current_rank()`: a `Point`
    (a mapping dim -> index, with `.rank`, shown as {'hosts': 0/1, 'procs': 2/4})."""
    return context().point


def current_actor_name() -> str:
    """The running actor's name and place, as its log lines show it (Monarch's
    `current_actor_name()`): `to{'hosts': 0/1, 'gpus': 1/2}`, one per member of a mesh."""
    return str(context())


def current_size() -> dict[str, int]:
    """The size of each dim of the running actor's mesh, as Monarch's `current_size()`."""
    return dict(context().sizes)


class Actor:
    """Base class of user actors. Subclasses define `@endpoint` methods.

    Optional hook: `__cleanup__(self, exc)` (or `async def`, awaited) runs once when the actor
    ends: exc is None when it was stopped or exited normally, else the exception that failed
    it. Its calls still running, and the tasks its code started, are cancelled first. A
    `__cleanup__(self)` without `exc` is called without it.
    """

    @property
    def context(self) -> ActorContext:
        return context()

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """Monarch's `self.logger`: a logger named for the actor's class, at DEBUG."""
        logger = logging.getLogger(type(self).__name__)
        logger.setLevel(logging.DEBUG)
        return logger


class Bootstrap(Actor):
    """Runs `spawn_procs(bootstrap=fn)`'s `fn` once in its proc, as its `__init__` (a system
    actor, re-exported by worker/system.py; here so that mesh references can spawn it)."""

    def __init__(self, fn: object) -> None:
        fn()  # type: ignore[operator]
