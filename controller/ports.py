"""The controller program's ports: `s.open_port()` (Monarch's `Channel.open()` in the client).

The receivers live in a proc of the session's own, in a `PortServer` system actor spawned on
first use on the host of the program's first proc (else this host); each `recv` is a journaled call to it, so what the program receives,
and in which order, is journaled as every result is and replays the same on a standby
(docs/design.md, "Ports")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from regent import wire
from regent.controller.mesh import BroadcastSink, HostMesh
from regent.wire import Kind
from regent.worker.ports import PORT_ACTOR, Mapped, Port, unwrap
from regent.worker.system import PortServer

if TYPE_CHECKING:
    from regent.controller.mesh import ActorMesh
    from regent.controller.session import Session

PORTS_ACTOR = "__regent_ports__"


class PortReceiver:
    """The receiving end of a controller port: `rx.recv().get()`, or `await rx.recv()` under `s.run`."""

    def __init__(self, server: ActorMesh, pid: str):
        self._server, self.id = server, pid

    def recv(self) -> Mapped:
        """The next value sent to the port (an ActorError if a sender sent an exception)."""
        return Mapped(self._server.recv.call_one(self.id), lambda item: unwrap(item, self.id))


class ControllerPorts:
    """The PortServer lives on the host of the program's first proc, which its actors reach (the
    controller's own machine may not be reachable from a cluster's hosts), else on this host."""

    def __init__(self, session: Session):
        self._s = session
        self._server: ActorMesh | None = None
        self._opened = 0

    def open(self) -> tuple[Port, PortReceiver]:
        if self._server is None:  # made at the same point of the program on every replay
            self._server = self._hosts().spawn_procs(per_host={"procs": 1}).spawn(PORTS_ACTOR, PortServer)
        pid = f"s{self._opened}"
        self._opened += 1
        port: Any = self._server.port.call_one(pid).get()
        return port, PortReceiver(self._server, pid)

    def send(self, port: Port, item: tuple) -> None:
        """A value the program sends to a port an actor opened: a journaled call to the
        `__port__` endpoint of the proc owning it, which delivers it once under the call's seq.
        Fire and forget, as in an actor; an undelivered value is logged."""
        s = self._s
        if port.session != s.sid:
            raise ValueError(f"port {port.id} belongs to session {port.session!r}, not to this one ({s.sid!r})")
        proc = s.proc_named(port.target.proc, f"port {port.id}", "have an actor send to it")
        frames, digest = wire.dumps_call((port.id, item), {})
        s.runtime.refuse_oversized_call(PORT_ACTOR, "send", frames)
        s._issue_call(Kind.CALL, "call_one", PORT_ACTOR, "send", frames, digest, [proc], (0,),
                      BroadcastSink(PORT_ACTOR, "send", what="a value sent to a port was not delivered"))

    def _hosts(self) -> HostMesh:
        procs = self._s._lifecycle.procs
        return HostMesh(self._s, [procs[0].host]) if procs else self._s.this_host()
