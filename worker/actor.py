"""The user-facing actor model: `Actor`, `endpoint`, and the per-actor context.

An actor is plain Python state inside one proc; the proc's runtime feeds it one
message at a time. Nothing here knows about sockets.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_ENDPOINT_ATTR = "__regent_endpoint__"


def endpoint(fn: F) -> F:
    """Mark a method of an Actor as callable from the controller (sync or async)."""
    setattr(fn, _ENDPOINT_ATTR, True)
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


@dataclass(frozen=True)
class ActorContext:
    """Where the running actor sits: its mesh, its coordinates in it, its proc."""

    mesh: str
    rank: int
    point: Mapping[str, int]
    proc_index: int
    incarnation: int = 0


_current: contextvars.ContextVar[ActorContext | None] = contextvars.ContextVar(
    "regent_actor_context", default=None
)


def context() -> ActorContext:
    """The context of the actor whose code is running (raises outside an actor)."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("worker.context() called outside an actor endpoint")
    return ctx


def current_rank() -> Mapping[str, int]:
    """The running actor's coordinates in its mesh, as Monarch's `current_rank()`."""
    return context().point


class Actor:
    """Base class of user actors. Subclasses define `@endpoint` methods.

    Optional hooks: `__cleanup__(self)` runs when the actor is stopped.
    """

    @property
    def context(self) -> ActorContext:
        return context()
