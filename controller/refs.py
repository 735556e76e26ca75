"""What the controller's edge knows of a proc, and keeps of a call to send it (again).

Plain data shared by the session, the runtime and the supervisor; a call's message is encoded
in one place (`Wire.message`) for its first send and every resend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from regent import wire
from regent.wire import Kind


@dataclass
class ProcRef:
    """A proc as the controller knows it."""

    id: str
    index: int
    address: str
    pid: int
    host: str
    alive: bool = True
    death: str = ""
    key: str = ""  # stable across replacements: calls target it, deaths are matched by it
    env: dict = field(default_factory=dict)  # what the host agent was asked to start it with
    stopped: bool = False  # the program stopped it: not a failure, never restarted

    def __post_init__(self) -> None:
        self.key = self.key or self.id

    def is_alive(self) -> bool:
        return self.alive


class ProcTable(dict[str, ProcRef]):
    """A session's procs by id, with an index by host agent built when asked for and dropped
    on every change (a proc's host is set before it is entered, never while it is in the
    table), so a host's hello answer is checked against its own procs, not every proc."""

    def __init__(self) -> None:
        super().__init__()
        self._by_host: dict[str, list[ProcRef]] | None = None

    def __setitem__(self, key: str, value: ProcRef) -> None:
        self._by_host = None
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._by_host = None
        super().__delitem__(key)

    def pop(self, *args: Any) -> Any:
        self._by_host = None
        return super().pop(*args)

    def popitem(self) -> tuple[str, ProcRef]:
        self._by_host = None
        return super().popitem()

    def clear(self) -> None:
        self._by_host = None
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._by_host = None
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: ProcRef) -> ProcRef:  # type: ignore[override]
        self._by_host = None
        return super().setdefault(key, default)

    def on_host(self, host: str) -> list[ProcRef]:
        """The procs whose agent serves (or served) at `host`, in the order they were entered."""
        if self._by_host is None:
            index: dict[str, list[ProcRef]] = {}
            for proc in self.values():
                index.setdefault(proc.host, []).append(proc)
            self._by_host = index
        return self._by_host.get(host, [])


class Wire:
    """What the edge keeps of a call to send it, and again under the same id."""

    __slots__ = ("kind", "base", "frames", "metas", "procs", "issued_at", "sent_at", "wait", "_points", "folds",
                 "_folder_of", "unfolded")

    def __init__(self, kind: Kind, base: dict, frames: Any, metas: list[dict] | None, procs: list[ProcRef],
                 sent_at: float, wait: float, *, many: bool = False, folds: dict[int, tuple[int, ...]] | None = None):
        self.kind, self.base, self.frames, self.metas, self.procs = kind, base, frames, metas, procs
        self.sent_at, self.wait = sent_at, wait  # when it was last sent; how long until overdue
        self.issued_at = sent_at  # when it was first sent
        # A call to several points packs their shared metadata once.
        self._points = wire.PointMessages(kind, base, frames) if many and not metas else None
        # An Accumulator folded on its hosts (folding.py): folder rank -> the ranks it folds, and
        # the folder of each of them, whose point is sent unfolded once that folder is gone.
        self.folds = folds
        self._folder_of = {r: f for f, pts in folds.items() for r in pts} if folds else None
        # Folders whose points answer here (a point of the fold died); none for any other call.
        self.unfolded: set[int] | frozenset[int] = set() if folds else frozenset()

    def message(self, rank: int) -> list:
        """The call's message to one point."""
        if self._points is not None:
            return self._points.encode(rank)
        if self.metas:
            extra = self.metas[rank]
            if self._folder_of is not None and rank in self._folder_of:
                f = self._folder_of[rank]
                folder = self.procs[f]
                if f in self.unfolded or not folder.alive or folder.address != extra["rt"]:
                    extra = {}  # a point of its fold died, or its folder was replaced: it answers here
            return wire.encode(self.kind, {**self.base, "pt": rank, **extra}, self.frames)
        return wire.encode(self.kind, {**self.base, "pt": rank}, self.frames)
