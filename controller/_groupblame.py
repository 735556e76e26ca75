"""Group failures held until the controller learns which member died.

A survivor's collective fails (status "grp") as soon as a peer's socket closes; the controller
sees the peer's death later (a lost host takes up to its TTL). The failure is held until then,
so its error names the member that died, or until the wait is over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regent.controller.refs import ProcRef

# How long a survivor's failed collective waits to learn which member of its group died.
GROUP_BLAME_WAIT_S = 15.0


class HeldGroupFailures:
    """`groups`: process group (its system mesh) -> members by rank, shared with the runtime;
    `proc_of(meta)`: the proc a result's point ran on, if its call is known."""

    def __init__(self, groups: dict[str, list[ProcRef]], proc_of: Callable[[dict], ProcRef | None]):
        self.groups = groups
        self.proc_of = proc_of
        self._held: list[tuple[float, dict, list]] = []

    def blame(self, meta: dict, final: bool) -> bool:
        """Name, in a group failure's error, the member of the group that died (True); False
        while none is known dead, unless `final` (the wait is over: say that none was seen)."""
        proc = self.proc_of(meta)
        members = next((g for g in self.groups.values() if proc is not None and proc in g), None)
        dead = [p for p in members or () if not p.alive and p is not proc]
        if dead:
            meta["em"] = (f"a member of its process group died ({dead[0].death}); the collective failed with: "
                          f"{str(meta.get('em'))[:1000]}")
        elif final or members is None:
            meta["em"] = (f"a collective failed, as when a member of its process group dies, but no member was "
                          f"seen to die within {GROUP_BLAME_WAIT_S:g} s: {str(meta.get('em'))[:1000]}")
        else:
            return False
        return True

    def hold(self, meta: dict, payload: list) -> None:
        self._held.append((time.monotonic() + GROUP_BLAME_WAIT_S, meta, payload))

    def due(self, expired_only: bool) -> list[tuple[dict, list]]:
        """The held failures to deliver now: those whose dead member is known (unless
        `expired_only`) and those whose wait is over."""
        if not self._held:
            return []
        now, held, self._held, out = time.monotonic(), self._held, [], []
        for until, meta, payload in held:
            if now >= until or (not expired_only and self.blame(dict(meta), final=False)):
                out.append((meta, payload))
            else:
                self._held.append((until, meta, payload))
        return out
