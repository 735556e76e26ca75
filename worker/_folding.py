"""An Accumulator folded on its host (`Accumulator(..., on_host=True)`): one proc of each host
(the folder, its first point in mesh order) gathers the results of its host's points and
answers the controller with one value, the fold of theirs, rather than one result each.

Nothing about a call changes but where its answer goes: each member runs its call once under
its own id (the dedupe cache), and answers its folder (the call's `rt`) as it would answer a
controller; a repeat is answered from the cache the same way. The folder answers the
controller's point of its own with the fold and names the points folded in (`fp`). What cannot
be folded goes on as it came, one result per point: an error or a refusal among them, a value
that does not unpickle, a reducer that raises, a fold too large for the journal. The controller
sends any later try of the call unfolded (to itself), so a folder that dies or a result lost on
the way costs a resend, never a value.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from regent import wire
from regent.wire import Kind
from regent.worker.dedupe import LARGE_RESULT_BYTES

log = structlog.get_logger("regent.proc")

MAX_GROUPS = 4096  # folds kept (answered ones until the controller's watermark passes them)
MAX_EARLY = 16384  # members' results that came before their folder's call


@dataclass
class _Group:
    to: str  # the controller that asked
    epoch: int
    relay: bool  # it is answered through the host's agent
    points: tuple[int, ...]  # the folder's own first
    fn: bytes  # pickled (identity, reducer)
    results: dict[int, tuple[dict, list]] = field(default_factory=dict)
    answer: list[list] | None = None  # the messages it was answered with


class Folds:
    """A proc's folds as their folder. `send(rt, msg)` collects a reply; `through_agent(rt)`
    routes replies to `rt` through the host's agent."""

    def __init__(self, send: Callable[[str, list], None], through_agent: Callable[[str], None]):
        self._send = send
        self._through_agent = through_agent
        self._groups: dict[int, _Group] = {}
        self._early: collections.OrderedDict[tuple[int, int], tuple[dict, list]] = collections.OrderedDict()
        self.folded = 0  # folds answered as one value

    def expect(self, meta: dict, fence: int) -> None:
        """The folder's own call, with its group (wire.schema.FoldGroup). A controller that
        takes over sends it again: a fold it was answered already is answered to it."""
        fg, seq, epoch = meta["fg"], meta["s"], meta["e"]
        points = tuple(fg["pts"])
        if epoch < fence or points[0] != meta["pt"] or len(set(points)) != len(points):
            return  # a deposed controller's (refused anyway), or not a group this point folds
        group = self._groups.get(seq)
        if group is not None:
            if epoch < group.epoch or group.points != points:
                return
            group.to, group.epoch, group.relay = fg["to"], epoch, bool(fg.get("rv"))
            if group.answer is not None:
                self._answer(group)
            return
        while len(self._groups) >= MAX_GROUPS:  # the oldest: its controller resends unfolded
            self._groups.pop(next(iter(self._groups)))
        group = self._groups[seq] = _Group(fg["to"], epoch, bool(fg.get("rv")), points, fg["fn"])
        for p in points:
            early = self._early.pop((seq, p), None)
            if early is not None:
                group.results[p] = early
        self._complete(seq, group)

    def result(self, meta: dict, payload: list) -> None:
        """A member's result (or the folder's own), sent here as its call's `rt`."""
        seq, point = meta["s"], meta["pt"]
        group = self._groups.get(seq)
        if group is None:
            if len(self._early) >= MAX_EARLY:
                self._early.popitem(last=False)
            self._early[(seq, point)] = (meta, list(payload))
            return
        if point not in group.points or point in group.results:
            return  # not of this fold, or a repeat
        group.results[point] = (meta, list(payload))
        self._complete(seq, group)

    def release(self, through: int) -> None:
        """The controller's journal holds every outcome up to `through`: forget those folds."""
        for seq in [s for s in self._groups if s <= through]:
            del self._groups[seq]
        for key in [k for k in self._early if k[0] <= through]:
            del self._early[key]

    def _complete(self, seq: int, group: _Group) -> None:
        if group.answer is not None or len(group.results) < len(group.points):
            return
        folded = self._fold(group)
        if folded is not None:
            self.folded += 1
            first = group.results[group.points[0]][0]
            meta = {k: first[k] for k in ("sid", "a") if k in first}
            meta.update(s=seq, pt=group.points[0], st="ok", fp=list(group.points[1:]))
            group.answer = [wire.encode(Kind.RESULT, meta, folded)]
        else:  # each as it came: the controller folds them, or raises the first error
            group.answer = [wire.encode(Kind.RESULT, *group.results[p]) for p in group.points]
        group.results.clear()
        self._answer(group)

    def _fold(self, group: _Group) -> list | None:
        """The frames of the fold's value, or None where it must go unfolded."""
        if any(meta.get("st") != "ok" for meta, _ in group.results.values()):
            return None
        try:
            identity, reducer = wire.loads([group.fn])
            acc = identity
            for p in group.points:
                frames = group.results[p][1]
                acc = reducer(acc, wire.loads(frames) if frames else None)
            frames = wire.dumps(acc)
        except Exception as e:  # noqa: BLE001 - the controller folds them itself and raises it there
            log.info("values sent unfolded", points=len(group.points), error=repr(e))
            return None
        if wire.payload_size(frames) > LARGE_RESULT_BYTES:
            return None  # a fold the journal would hold as a digest only: its points keep their values
        return frames

    def _answer(self, group: _Group) -> None:
        if group.relay:
            self._through_agent(group.to)
        for msg in group.answer or ():
            self._send(group.to, msg)
