"""An actor as its proc holds it: the instance, its mailbox and the calls it runs, and how
one of its endpoints runs (inline, as a task, concurrently)."""

from __future__ import annotations

import asyncio
import enum
import inspect
import os
from dataclasses import dataclass, field
from typing import Any

from regent import wire
from regent.worker.actor import (
    ActorContext,
    _current,
    is_async_endpoint,
    is_concurrent_endpoint,
    takes_response_port,
)
from regent.worker.ports import Port
from regent.worker.proccore import Mailbox


class _Run(enum.Enum):
    """How a call of an endpoint runs."""

    INLINE = "inline"  # a sync endpoint, on the loop's thread, before the next message
    TASK = "task"  # an async one: the mailbox waits for it
    CONCURRENT = "concurrent"  # an async concurrent_endpoint: the mailbox goes on once it has started


@dataclass
class _Slot:
    """One actor living in this proc, with its mailbox and the calls running as tasks."""

    name: str
    instance: Any
    endpoints: set[str]
    ctx: ActorContext
    mailbox: Mailbox = field(default_factory=Mailbox)
    executions: int = 0
    bound: dict[str, tuple[Any, _Run, bool]] = field(default_factory=dict)  # method -> (fn, how it runs, port)
    tasks: set[asyncio.Task] = field(default_factory=set)
    ended: str | None = None  # why the actor is gone, once it is ("actor a stopped (normal)")
    owner: dict | None = None  # the actor that spawned it from inside an actor (wire.schema.Owner)
    failed: str | None = None  # a child's failure it did not handle: it fails at its next message
    children: list = field(default_factory=list)  # ActorMeshRefs of the meshes it spawned: stopped with it
    body: Any = None  # its sync endpoint's run while that waits for a call (worker/_bodies.py)
    holder: asyncio.Task | None = None  # the async call whose task holds the mailbox (not a concurrent one)
    started: set[asyncio.Task] = field(default_factory=set)  # tasks its own code started (tasks_of)

    def endpoint(self, method: str) -> tuple[Any, _Run, bool]:
        """The bound method, how it runs, and whether it answers through an explicit port."""
        found = self.bound.get(method)
        if found is None:
            fn = getattr(self.instance, method)
            if not is_async_endpoint(fn):
                run = _Run.INLINE
            else:
                run = _Run.CONCURRENT if is_concurrent_endpoint(fn) else _Run.TASK
            found = self.bound[method] = (fn, run, takes_response_port(fn))
        return found


_RUNTIME = os.path.dirname(os.path.abspath(__file__))
_started: dict[int, set[asyncio.Task]] = {}  # id(an actor's context) -> its tasks, while the actor lives


def own_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Make a task that an actor's code starts (`create_task` in __init__, an endpoint, a task of
    its own) that actor's, so that it is cancelled when the actor ends rather than outliving it.
    The runtime's own tasks (worker/) are not an actor's."""
    if loop.get_task_factory() is None:  # a hollow host's procs share one loop and one factory
        loop.set_task_factory(_task_of_actor)


def _task_of_actor(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
    task = asyncio.Task(coro, loop=loop, **kwargs)
    ctx = _current.get()
    started = _started.get(id(ctx)) if ctx is not None else None
    code = getattr(coro, "cr_code", None)
    if started is not None and (code is None or not code.co_filename.startswith(_RUNTIME)):
        started.add(task)
        task.add_done_callback(started.discard)
    return task


def tasks_of(ctx: ActorContext) -> set[asyncio.Task]:
    """The set an actor's started tasks go into, from before its __init__ runs."""
    started = _started[id(ctx)] = set()
    return started


def end_tasks(ctx: ActorContext, started: set[asyncio.Task]) -> None:
    """The actor ended: cancel the tasks its code started (not the one running now)."""
    _started.pop(id(ctx), None)
    me = asyncio.current_task() if asyncio._get_running_loop() is not None else None
    for task in list(started):
        if task is not me:
            task.cancel()


def _how(meta: dict) -> str:
    """How a call is answered: "rp", to the port its first argument is (Monarch's send with a
    port); "bc", nowhere, so an error fails the actor (a broadcast); "", to its caller."""
    return "rp" if meta.get("rp") else "bc" if meta.get("bc") else ""


def _arguments(payload: list, how: str) -> tuple[tuple, dict, Port | None]:
    """A call's arguments, and the port its answer goes to (for "rp")."""
    args, kwargs = wire.loads(payload)
    if how != "rp":
        return args, kwargs, None
    if not args or not isinstance(args[0], Port):
        raise TypeError(f"a send with a port carries the port as its first argument, got {type(args[0]).__name__ if args else 'none'}")
    return tuple(args[1:]), kwargs, args[0]


def _cleanup_args(hook: Any, exc: BaseException | None) -> tuple:
    """`__cleanup__(exc)`, or `__cleanup__()` for a hook that takes no argument."""
    try:
        takes = bool(inspect.signature(hook).parameters)
    except (TypeError, ValueError):  # no signature to read (a builtin): give it the argument
        takes = True
    return (exc,) if takes else ()
