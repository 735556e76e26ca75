"""An Accumulator folded on its hosts (`Accumulator(..., on_host=True)`), the controller's side.

A fold is a mesh-wide call like any other: one call id, a point per actor, its record and each
point's outcome journaled. What differs is the first send's route: the points of one host
answer their host's folder (its first point, worker/_folding.py), which answers the controller
with one value for them all, naming the points it folded in (`fp`). `expand` turns that one
answer into an outcome per point (the folder's holds the fold, the others an empty value), so the
watermarks and a replay see one outcome per point as for `call()`; the journal holds the fold as
one item of the CALLS stream naming the points folded in (controller/replay.py reads it back as
an outcome each). Every later
send of the call goes unfolded, to the controller itself: the values then come one by one, and
`FoldSink` folds the hosts' folds and plain values alike, in mesh order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from regent import wire
from regent.wire import Kind

if TYPE_CHECKING:
    from regent.controller.core import PendingCall
    from regent.controller.refs import ProcRef

log = structlog.get_logger("regent.controller")

MAX_FN_BYTES = 16 * 1024  # a pickled (identity, reducer) larger than this is folded here


def pickled_reducer(identity: Any, reducer: Callable[[Any, Any], Any]) -> bytes | None:
    """(identity, reducer) as the folders get them, or None where they cannot go (they do not
    pickle, carry buffers of their own, or are too large): the controller then folds."""
    try:
        frames = wire.dumps((identity, reducer))
    except Exception as e:  # noqa: BLE001 - a reducer that does not pickle is folded here
        log.info("the Accumulator's reducer is folded on the controller", error=repr(e))
        return None
    if len(frames) != 1 or len(frames[0]) > MAX_FN_BYTES:
        return None
    return bytes(frames[0])


def groups(procs: Sequence[ProcRef], ranks: Iterable[int]) -> dict[int, tuple[int, ...]]:
    """Folder rank -> the ranks it folds (its own first), for each host with two points or more."""
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(procs[r].host, []).append(r)
    return {pts[0]: tuple(pts) for pts in by_host.values() if len(pts) > 1}


def fold_metas(procs: Sequence[ProcRef], folds: Mapping[int, tuple[int, ...]], fn: bytes, reply_to: str,
               relay: bool) -> list[dict]:
    """Per-rank metadata of a fold's first send: each folded point answers its folder."""
    metas: list[dict] = [{} for _ in procs]
    for folder, pts in folds.items():
        via = procs[folder].address
        for r in pts:
            metas[r] = {"rt": via, "fo": True, "rv": False}
        group = {"to": reply_to, "pts": list(pts), "fn": fn}
        if relay:
            group["rv"] = True
        metas[folder]["fg"] = group
    return metas


def expand(calls: Mapping[int, PendingCall], replies: list[tuple[Kind, dict, list]]) -> list[tuple[Kind, dict, list]]:
    """Each folder's answer as an outcome per point it names; one that does not match the fold
    sent, or comes after one of its points was answered otherwise, is dropped (its points are
    answered one by one when the call is sent again)."""
    out = []
    for kind, meta, payload in replies:
        fp = meta.get("fp") if kind is Kind.RESULT else None
        if fp is None:
            out.append((kind, meta, payload))
            continue
        seq, pt = meta["s"], meta["pt"]
        call = calls.get(seq)
        folds = getattr(call.wire, "folds", None) if call is not None and call.wire is not None else None
        pts = (pt, *fp)
        if not folds or folds.get(pt) != pts or meta["st"] != "ok" or any(p in call.results for p in pts):
            log.debug("a host's fold dropped", seq=seq, point=pt)
            continue
        out.append((kind, meta, payload))  # journaled as one item naming its points (`fp`)
        base = {k: meta[k] for k in ("sid", "a") if k in meta}
        out.extend((Kind.RESULT, {**base, "s": seq, "pt": p, "st": "ok", "fd": pt}, []) for p in fp)
    return out


def folded(values: Mapping[int, Any], covered: set[int], ranks: Sequence[int], identity: Any,
           reducer: Callable[[Any, Any], Any]) -> Any:
    """The fold of a call's values in mesh order, but for the `covered` points: those a host
    folded into its folder's value (empty themselves)."""
    acc = identity
    for r in ranks:
        if r not in covered:
            acc = reducer(acc, values[r])
    return acc
