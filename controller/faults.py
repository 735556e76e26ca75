"""Unhandled faults: actor failures nothing handles, handed to the program's hook.

Monarch calls `unhandled_fault_hook(failure)` in the client when an actor mesh fails and no
owner handles the supervision event. regent's supervision is the controller's (its
`RestartPolicy`), so a failure nothing handles is one of two kinds:

- `"escalation"`: a supervised mesh exceeded its restart intensity and is no longer restarted;
- `"unsupervised"`: an actor of a mesh spawned with `restart=None` failed (its proc died, or it
  exited abnormally, `ActorExit(normal=False)`); nothing will bring it back.

A failure its policy handles is not one: a restart, and also a `temporary` (or, for a normal
exit, `transient`) policy's decision to leave the actor down, which the program chose.

Which thread runs the hook
--------------------------

`Session(name, on_unhandled_fault=fn)`: `fn(failure: MeshFailure)` runs **on the program's
thread**, inside the first session call the program makes after the failure was seen (any call
that takes a seq: an endpoint adverb, `spawn`, `stop`, `s.now()`, `s.checkpoint(...)`, ...),
before that call is issued. Never on the supervisor's or the IO thread: those detect the failure
and only queue it, since a hook running there could not call the session (the engine is stepped
by one driver at a time, controller/drive.py) and would run at a moment no replay can reproduce.
Running it at a call gives it a place in the program's order (the seq it came before), and
that place is what makes it replayable:

- Before the hook runs, a `sup` record `{"ev": "unhandled_fault", "at": seq, ...}` naming the
  failure and that seq is journaled durably (invariant 4: a supervision failure is an
  observation that may differ between runs).
- A standby (or an audit) replaying the journal calls the hook for each such record, in journal
  order, at the same seq: the program sees the same failures at the same points, so a hook that
  sets a flag the program reads steers the replay as it steered the primary. Failures the
  standby finds itself (a proc that died while no controller looked, an escalation the primary
  journaled but had not handed to the program yet) are handed over once replay is over, at its
  first live call; a failure the journal shows delivered is never delivered again.

The hook may do anything the program may, session calls included (they are journaled and
replayed like the program's own; a hook running inside another's call does not recurse). An
`Exception` from it is logged and the call goes on; a `BaseException` (`SystemExit`, to exit as
Monarch's default hook does) propagates out of the session call that ran it. A failure seen
after the program's last session call is logged, not handed over.

With no hook (the default), failures are only logged, as before: regent's failures also reach
the program as `SupervisionError` on its calls, so the default does not exit.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from regent.controller.replay import SUPERVISION
from regent.worker.shape import Point
from regent.worker.supervision import FaultKind, MeshFailure

if TYPE_CHECKING:
    from regent.controller.replay import ReplayIndex
    from regent.controller.session import Session
    from regent.controller.supervisor import MeshState

log = structlog.get_logger("regent.supervisor")

UNHANDLED = "unhandled_fault"  # the `ev` of the sup record journaled before the hook runs


@dataclass
class _Pending:
    """A failure seen on this side, not handed to the program yet."""

    key: tuple
    data: dict  # the record's fields but `ev` and `at`
    state: MeshState


def _key(mesh: Any, spawn: Any, rank: Any, kind: Any) -> tuple:
    """What one failure is, across controllers: an unsupervised member fails at most once per
    spawn, a supervised mesh escalates at most once per spawn."""
    return (mesh, spawn, rank if kind == "unsupervised" else None, kind)


def _failure(d: dict) -> MeshFailure:
    return MeshFailure(d["mesh"], d["rank"], Point(d["rank"], dict(d["co"]), d["sz"]), d["reason"], d["kind"])


def _valid(d: Any) -> bool:
    """A journaled unhandled_fault record, checked as the untrusted input it is."""
    return (isinstance(d, dict) and isinstance(d.get("at"), int) and isinstance(d.get("mesh"), str)
            and isinstance(d.get("rank"), int) and isinstance(d.get("co"), dict) and isinstance(d.get("sz"), dict)
            and isinstance(d.get("reason"), str) and d.get("kind") in ("escalation", "unsupervised"))


class Faults:
    """The unhandled faults of one session: queued by whichever thread sees them (`seen`),
    handed to the hook by the program's thread (`deliver`, from Session._begin)."""

    def __init__(self, hook: Callable[[MeshFailure], Any] | None, replay: ReplayIndex | None):
        if hook is not None and not callable(hook):
            raise TypeError(f"on_unhandled_fault takes a callable, not {hook!r}")
        self.hook = hook
        self._lock = threading.Lock()
        # Seen on this side, in the order seen (any thread appends).
        self.live: collections.deque[_Pending] = collections.deque()
        # Handed over by a previous leader: delivered again at the same seqs, in journal order.
        self.replayed: collections.deque[dict] = collections.deque()
        self._known: set[tuple] = set()  # every failure delivered, or queued to be
        self._delivering = False
        if replay is not None:
            records = [d for d in replay.supervision if isinstance(d, dict) and d.get("ev") == UNHANDLED]
            for d in records:
                if _valid(d):
                    self._known.add(_key(d["mesh"], d.get("spawn"), d["rank"], d["kind"]))
            if hook is not None:
                # Sorted by seq, journal order within one (sorted is stable).
                self.replayed.extend(sorted((d for d in records if _valid(d)), key=lambda d: d["at"]))

    # --- seen (any thread) -------------------------------------------------------------

    def seen(self, state: MeshState, rank: int, reason: str, kind: FaultKind) -> None:
        """A failure nothing handles (the supervisor's thread, the IO thread, or a driver)."""
        key = _key(state.name, state.spawn_seq, rank, kind)
        with self._lock:
            if key in self._known:
                return
            self._known.add(key)
        if self.hook is None:
            if kind == "unsupervised":  # an escalation is logged by the supervisor already
                log.warning("an actor of an unsupervised mesh failed; nothing restarts it",
                            mesh=state.name, rank=rank, reason=reason)
            return
        coords = state.coords[rank] if rank < len(state.coords) else {}
        data = {"mesh": state.name, "spawn": state.spawn_seq, "rank": rank, "co": dict(coords.get("co") or {}),
                "sz": dict(coords.get("sz") or state.dims), "reason": reason, "kind": kind}
        self.live.append(_Pending(key, data, state))

    # --- delivered (the program's thread) ------------------------------------------------

    def skip_to(self, seq: int) -> None:
        """A takeover resumed from a checkpoint at `seq`: what was delivered before it is part
        of the checkpointed state, not handed over again."""
        while self.replayed and self.replayed[0]["at"] <= seq:
            self.replayed.popleft()

    def deliver(self, s: Session) -> None:
        """Hand the program what is due before its next call, `s.core.next_seq`: first what
        the journal shows delivered at that seq, then (once replay is over) what this side saw."""
        if self._delivering:
            return  # a session call the hook itself makes
        self._delivering = True
        try:
            self._deliver(s)
        finally:
            self._delivering = False

    def _deliver(self, s: Session) -> None:
        replayed, live = self.replayed, self.live
        while replayed and replayed[0]["at"] <= s.core.next_seq:
            self._call(_failure(replayed.popleft()))
        replay = s._engine.replay
        if replay is not None and s.core.next_seq <= replay.max_seq:
            return  # replaying: a failure seen now waits for the end of replay
        while live:
            p = live.popleft()
            if s._supervisor.meshes.get(p.state.name) is not p.state or p.state.procs[p.data["rank"]].stopped:
                continue  # the program stopped the mesh or its proc meanwhile: nothing to report
            s._check_live()
            s._append(SUPERVISION, {"ev": UNHANDLED, "at": s.core.next_seq, **p.data}, durable=True)
            self._call(_failure(p.data))

    def _call(self, failure: MeshFailure) -> None:
        try:
            self.hook(failure)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - the hook's failure is the program's to read, not the session's end
            log.exception("the unhandled-fault hook raised; the session goes on", mesh=failure.mesh,
                          rank=failure.rank, kind=failure.kind)

    def undelivered(self) -> int:
        return len(self.live)


__all__ = ["FaultKind", "Faults", "MeshFailure"]
