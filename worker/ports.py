"""Ports, channels and accumulators, Monarch's names for values sent back later or many times
(docs/design.md, "Ports").

A `Port` is where values go: plain data naming the proc that owns it and its id there, so it
travels in arguments and results like a mesh reference. `Channel.open()` makes one with its
`PortReceiver`, inside an actor. A send from another proc is a call to the owner's `__port__`
system endpoint under an id derived from the sending call, so the owner delivers it once even
when the sender runs again. An endpoint marked `explicit_response_port=True` gets a port whose
first value is its call's result: the caller (the controller or an actor) sees it as any
result, journaled where the controller observes it.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import structlog

from regent import wire
from regent.wire import Kind
from regent.worker.client import Target
from regent.worker.errors import ActorError, error_fields
from regent.worker.program import program_side
from regent.worker.remote import _site

if TYPE_CHECKING:
    from regent.worker.proc import ProcRuntime

log = structlog.get_logger("regent.actor")

PORT_ACTOR = "__port__"  # the system endpoint of every proc that values for its ports arrive at


@dataclass(frozen=True, eq=False)
class Port:
    """Where values for one receiver (or one call's result) go. `send` from any actor of the session."""

    session: str
    target: Target  # the proc that owns the receiver
    id: str

    def __reduce__(self) -> tuple:
        return Port, tuple(getattr(self, f.name) for f in fields(self))

    def __regent_digest__(self) -> tuple:
        return ("port", self.session, self.id)

    def send(self, value: Any) -> None:
        """Deliver `value` (without waiting). To a response port: the call's result, once."""
        self._put(("v", value))

    def exception(self, exc: BaseException) -> None:
        """Fail the receiver's next `recv` (or the call a response port answers) with `exc`,
        which reaches the caller as an ActorError."""
        f = error_fields(exc)
        self._put(("e", (f["et"], f["em"], f["tb"])))

    def _put(self, item: tuple) -> None:
        program = program_side("a send to a port")
        if program is not None:  # the controller program's send: a journaled call
            program.send_to_port(self, item)
            return
        client, site = _site("a send to a port")
        rt = client.rt
        if self.target.address == rt.inbox.address:  # ours: no message, and no sender to run again
            refused = rt.ports.deliver(self.id, item)
            if refused:
                raise ValueError(refused)
            return
        origin = site.child()
        # Its place among this call's sends to this port: the owner delivers them in that order,
        # whatever order resends arrive in. A re-run of the call sends the same (sender, n).
        n = site.sends[self.id] = site.sends.get(self.id, -1) + 1
        sender = f"{site.seq}/{site.origin}/{site.actor}[{site.point}]"
        frames, digest = wire.dumps_call((self.id, item, sender, n), {})
        fut = client.send(Kind.CALL, self.target, site.seq, PORT_ACTOR, 0, origin, "send", digest, frames)
        fut.add_done_callback(lambda f: _log_undelivered(f, self))


def _log_undelivered(f: asyncio.Future, port: Port) -> None:
    meta, _ = f.result()
    if meta["st"] != "ok":
        log.warning("a value sent to a port was not delivered", port=port.id, status=meta["st"], error=meta.get("em"))


class PortReceiver:
    """The receiving end of a channel: `await rx.recv()` in an async endpoint, `rx.recv().get()`
    in a sync one. Values come in the order they arrived."""

    def __init__(self, loop: asyncio.AbstractEventLoop, id: str):
        self.id = id
        self._loop = loop
        self._items: collections.deque = collections.deque()
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    def _put(self, item: tuple) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(item)
                return
        self._items.append(item)

    def recv(self) -> Received:
        fut = self._loop.create_future()
        if self._items:
            fut.set_result(self._items.popleft())
        else:
            self._waiters.append(fut)
        return Received(fut, self.id)

    def ready(self) -> int:
        """How many values wait to be received."""
        return len(self._items)


class Received:
    """One value a receiver will get."""

    def __init__(self, fut: asyncio.Future, port: str):
        self._fut, self._port = fut, port

    def _value(self) -> Any:
        return unwrap(self._fut.result(), self._port)

    def get(self, timeout: float | None = None) -> Any:
        if not self._fut.done():
            client, _ = _site("waiting on a port")
            if not client.pump(self._fut.done, timeout, [self._fut]):
                raise TimeoutError(f"nothing arrived at port {self._port} within {timeout} s")
        return self._value()

    def __await__(self):
        if not self._fut.done():
            yield from self._fut.__await__()
        return self._value()


class Channel:
    """Monarch's `Channel.open()`: a new (Port, PortReceiver) pair, owned by the running actor's
    proc; in the controller program, the session's `s.open_port()` (its values are journaled).
    `Channel[int].open()` as in Monarch: the type is for the reader only."""

    def __class_getitem__(cls, item: Any) -> type[Channel]:
        return cls

    @staticmethod
    def open() -> tuple[Port, Any]:
        program = program_side("Channel.open()")
        if program is not None:
            return program.open_port()
        client, site = _site("Channel.open() (in the controller program: s.open_port())")
        rt = client.rt
        pid = f"c{site.seq}:{site.child()}"  # the same on a re-run of the opening call
        return rt.ports.open(pid)


class ProcPorts:
    """The ports a proc owns: channel receivers, and the response ports of calls still open."""

    def __init__(self, runtime: ProcRuntime):
        self.rt = runtime
        # Held weakly: a receiver its program dropped takes no more values (their senders hear so).
        self.receivers: weakref.WeakValueDictionary[str, PortReceiver] = weakref.WeakValueDictionary()
        self.responses: dict[str, tuple[str, Callable[[tuple], None]]] = {}  # pid -> (actor, answer)
        # Per port and sending call: the next send due, and those that came before their turn.
        self._order: dict[str, dict[str, tuple[int, dict[int, tuple]]]] = {}

    def _port(self, pid: str) -> Port:
        rt = self.rt
        return Port(rt.session, Target(rt.inbox.address, rt.proc_id, rt.host_inbox), pid)

    def open(self, pid: str) -> tuple[Port, PortReceiver]:
        rx = self.receivers.get(pid)
        if rx is None:
            rx = self.receivers[pid] = PortReceiver(self.rt.loop, pid)
            weakref.finalize(rx, self._order.pop, pid, None)
        return self._port(pid), rx

    def response(self, seq: int, actor: str, point: int, origin: str, answer: Callable[[tuple], None]) -> Port:
        """A port whose first value answers call (seq, actor, point, origin)."""
        pid = f"r{seq}:{actor}:{point}:{origin}"
        self.responses[pid] = (actor, answer)
        return self._port(pid)

    def close(self, pid: str) -> bool:
        """Forget a response port that will not be answered (its endpoint raised); True if it was open."""
        return self.responses.pop(pid, None) is not None

    def of_actor(self, actor: str) -> list[tuple[str, Callable[[tuple], None]]]:
        """Take every open response port of an actor that is gone: (pid, answer) each."""
        mine = [(pid, a) for pid, (who, a) in self.responses.items() if who == actor]
        for pid, _ in mine:
            del self.responses[pid]
        return mine

    def deliver(self, pid: str, item: tuple, sender: str | None = None, n: int | None = None) -> str | None:
        """Give a value to the port `pid`, the `n`-th from call `sender` (None: from this proc,
        in order already); an error message if there is no such port."""
        found = self.responses.pop(pid, None)
        if found is not None:
            found[1](item)
            return None
        rx = self.receivers.get(pid)
        if rx is None:
            if pid.startswith("r"):
                return f"port {pid} has answered its call already"
            return f"no port {pid} on proc {self.rt.proc_id}: its receiver's proc was restarted, or it never opened"
        if sender is None or n is None:
            rx._put(item)
            return None
        senders = self._order.setdefault(pid, {})
        due, early = senders.get(sender, (0, {}))
        if n < due:
            return None  # delivered already (a repeat the dedupe cache had released)
        early[n] = item
        while due in early:  # this one and any that came before their turn
            rx._put(early.pop(due))
            due += 1
        senders[sender] = (due, early)
        return None


def receiver(pid: str) -> PortReceiver:
    """The receiver of port `pid` on the running actor's proc, opened if it is not yet."""
    client, _ = _site("a port's receiver")
    return client.rt.ports.open(pid)[1]


def port_here(pid: str) -> Port:
    """Port `pid` of the running actor's proc."""
    client, _ = _site("a port")
    return client.rt.ports.open(pid)[0]


class Accumulator:
    """Monarch's `Accumulator(endpoint, identity, reducer)`: `accumulate(*args)` calls every member
    and folds their values, in mesh order, into `identity` with `reducer(acc, value)`. Works on a
    controller mesh's endpoint and on a reference's inside an actor; the values folded are the
    call's results, journaled where the controller makes the call.

    `on_host=True` (a controller's endpoint) folds each host's values on that host first, so the
    controller gets, and journals, one value per host rather than one per actor. Then `reducer`
    must be associative and commutative with `identity` its neutral element (a sum, a max, merging
    counters): values are folded per host, and the hosts' folds together, in no fixed order
    across hosts. `identity` and `reducer` travel pickled to the hosts; inside an actor, or where
    they do not pickle, the values are folded where the call is made, as without it."""

    def __init__(self, endpoint: Any, identity: Any, reducer: Callable[[Any, Any], Any], *, on_host: bool = False):
        self._endpoint, self._identity, self._reducer = endpoint, identity, reducer
        self._on_host = on_host

    def accumulate(self, *args: Any, **kwargs: Any) -> Any:
        if self._on_host:
            fold = getattr(self._endpoint, "reduce_on_hosts", None)
            if fold is not None:
                return fold(self._identity, self._reducer, args, kwargs)
        return Reduced(self._endpoint.call(*args, **kwargs), self._identity, self._reducer)


class Mapped:
    """Another future's value passed through `fn`: `.get(timeout)` or `await`."""

    def __init__(self, inner: Any, fn: Callable[[Any], Any]):
        self._inner, self._fn = inner, fn

    def done(self) -> bool:
        return self._inner.done()

    def get(self, timeout: float | None = None) -> Any:
        return self._fn(self._inner.get(timeout=timeout))

    def __await__(self):
        value = yield from self._inner.__await__()
        return self._fn(value)


class Reduced(Mapped):
    """The folded value of an accumulate."""

    def __init__(self, inner: Any, identity: Any, reducer: Callable[[Any, Any], Any]):
        def fold(mesh: Any) -> Any:
            acc = identity
            for v in mesh.values():
                acc = reducer(acc, v)
            return acc

        super().__init__(inner, fold)


def unwrap(item: tuple, port: str) -> Any:
    """A port's (kind, value) as its receiver sees it: the value, or ActorError."""
    kind, value = item
    if kind == "e":
        raise ActorError(f"port {port}", "send", *value)
    return value
