"""The controller program's answer to names an actor uses: `this_proc()`, `this_host()`,
`Channel.open()`, `Port.send` and the adverbs of a mesh reference outside an actor go to the
Session open in this process.

A Session offers itself when it opens and withdraws when it closes. Everything it does for
these names is a journaled call of the program, so a standby replays it (docs/design.md,
"The controller program's own proc").
"""

from __future__ import annotations

from typing import Any, Protocol

from regent.worker.actor import _calling


class ProgramSide(Protocol):
    """What a Session does for the actor-side names when they are used in its program."""

    def open_port(self) -> tuple[Any, Any]: ...
    def this_proc(self) -> Any: ...
    def this_host(self) -> Any: ...
    def send_to_port(self, port: Any, item: tuple) -> None: ...
    def mesh_of(self, ref: Any) -> Any: ...
    def get_or_spawn_controller(self, name: str, actor_class: type, *args: Any, **kwargs: Any) -> Any: ...


_open: list[ProgramSide] = []  # the sessions open in this process, oldest first


def offer_program(session: ProgramSide, *, withdraw: bool = False) -> None:
    """A Session opened (or closed) in this process."""
    if withdraw:
        if session in _open:
            _open.remove(session)
    else:
        _open.append(session)


def program_side(what: str) -> ProgramSide | None:
    """The session `what` stands for when it is used outside an actor (None inside one, or
    with no session open here)."""
    if _calling.get() is not None or not _open:
        return None
    if len(_open) > 1:
        raise RuntimeError(f"{what} outside an actor, with {len(_open)} sessions open in this process: "
                           "call the Session's own method (s.this_proc(), s.open_port(), ...) on the one meant")
    return _open[0]
