"""What the journal says the program did: the index a replaying controller checks
each new call against (DESIGN invariants 1, 4 and 6).

Pure data built from journal records; no IO. A run starts at its `start` record;
a session's log may hold several runs, and only the last one is replayed.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from regent import wire
from regent.journal import CorruptRecord, Record
from regent.wire import ProtocolError
from regent.worker.dedupe import LARGE_RESULT_BYTES
from regent.worker.errors import RegentError

# Record kinds the controller writes.
START = "start"  # {run, ts}
CALL = "call"  # {s, k, a, m, d, pts} or, for values the program asked for, {s, k, v}
RESULT = "result"  # {s, pt, st, v: [frames] | None, big: [digest, size] | None, x: {...}}
# Two compact forms of the same, for the call path's volume (read through `expand`):
CALLS = "calls"  # {items: [[s, k, a, m, d, pts, ts], ...]}: endpoint calls, collected
RESULTS = "results"  # {b: [frames]}: a batch of replies as a worker sent it; its `covered` results
OBS = "obs"  # {s, w, i, v}: a choose pick, a stream position, a timeout
PROCS = "procs"  # {s, procs: [...]}: what spawn_procs got
SUPERVISION = "sup"  # {ev, ...}
PLACED = "placed"  # a SUPERVISION record's ev, no event: where a live spawn's members are {mesh, spawn, procs}
CHECKPOINT = "ckpt"  # {s}
END = "session_end"  # {error?}
PROGRAM = "program"  # {path, digest, by, ts}: `regent upgrade`'s program leads the run from here
PATCH = "patch"  # a CALL record's kind: the marker of s.patched(change id), the id as its method
MAX_CHANGE_ID = 200

_PLACEMENTS = frozenset({"this_host", "host_mesh", "grow"})  # value records naming hosts
VALUE_KINDS = frozenset({"now", "random", "side_effect", "this_host", "host_mesh", "grow", "resume", "checkpoint"})


class NonDeterminismError(RegentError):
    """The program made a different call than its journal records at the same seq."""

    def __init__(self, seq: int, journaled: str, new: str):
        self.seq = seq
        self.journaled = journaled
        self.new = new
        super().__init__(
            f"non-determinism at seq {seq}: the journal records {journaled}, but the program now "
            f"makes {new}. A controller program must make the same calls in the same order on "
            "replay; take values that may differ from s.now(), s.random() or s.side_effect(). A "
            "program changed on purpose guards the change with s.patched(change_id) (docs/failover.md, "
            "\"Changing a running program\")."
        )


class LostResultError(RegentError):
    """A standby cannot observe what the primary observed: a result the journal keeps as a
    digest only could not be had again with that digest. Nothing the program does next can
    take the session over, so every later call raises this too."""


_RESULT = wire.Kind.RESULT
RESULTS_MAX_BYTES = 256 * 1024  # a batch of replies larger than this is journaled result by result


def covered(replies: list[tuple[wire.Kind, dict, list]], small: bool = False) -> list[int]:
    """Which replies of a batch its RESULTS record journals (their indices).

    Plain values of program calls, small enough for the journal. Everything else (failures,
    which may need a durable record; large values, journaled as a digest; answers to the
    supervisor's requests) gets a RESULT record of its own. `small`: the caller knows the
    whole batch is within LARGE_RESULT_BYTES, so no reply in it can be larger. One call per
    batch, not per reply: the controller runs this for every batch it receives."""
    out = []
    for i, (kind, meta, payload) in enumerate(replies):
        if (kind is _RESULT and meta.get("st") == "ok" and "n" not in meta
                and type(meta.get("s")) is int and type(meta.get("pt")) is int
                and (small or wire.payload_size(payload) <= LARGE_RESULT_BYTES)):
            out.append(i)
    return out


def expand(records: Iterable[Record], session: str = "") -> Iterator[Record]:
    """The records with CALLS and RESULTS unpacked into the CALL and RESULT records they stand
    for (same lsn and epoch); what reads a journal by call reads it through this."""
    for rec in records:
        kind = rec.kind
        if kind == CALLS:
            lsn, epoch = rec.lsn, rec.epoch
            for item in rec.data["items"]:
                if len(item) == 7:
                    s, k, a, m, d, pts, ts = item
                    yield Record(lsn, epoch, CALL, {"s": s, "k": k, "a": a, "m": m, "d": d, "pts": pts}, ts)
                elif len(item) == 8:  # made by a task of an async program
                    s, k, a, m, d, pts, ts, task = item
                    yield Record(lsn, epoch, CALL, {"s": s, "k": k, "a": a, "m": m, "d": d, "pts": pts,
                                                    "task": task}, ts)
                else:
                    for data in collected_results(item, session, lsn):
                        yield Record(lsn, epoch, RESULT, data, item[3])
        elif kind == RESULTS:
            lsn, epoch, ts = rec.lsn, rec.epoch, rec.ts
            for data in batched_results(rec, session):
                yield Record(lsn, epoch, RESULT, data, ts)
        else:
            yield rec


def collected_results(item: Any, session: str = "", lsn: int = -1) -> list[dict]:
    """The RESULT records' data a CALLS item `[s, pt, frames, ts]` stands for: a plain value
    that answered its call alone (Session._record_result), in the stream after its call; with a
    fifth element, the points a host folded into it (controller/folding.py), each answered with
    an empty value."""
    try:
        s, pt, frames, _ts, *folded = item
        if type(s) is not int or type(pt) is not int:
            raise TypeError(f"seq {s!r} and point {pt!r} are not ints")
        out = [{"s": s, "pt": pt, "st": "ok", "v": tuple(frames)}]
        if folded:
            (points,) = folded
            if not isinstance(points, list) or not all(type(p) is int for p in points):
                raise TypeError(f"folded points {points!r} are not a list of ints")
            out[0]["x"] = {"fp": points}  # the replayed outcome's metadata, as the live one's
            out.extend({"s": s, "pt": p, "st": "ok", "v": ()} for p in points)
        return out
    except (TypeError, ValueError) as e:
        raise CorruptRecord(session or "(unnamed)", lsn,
                            f"a calls record holds an item that is neither a call nor a value ({e})") from e


def batched_results(rec: Record, session: str = "") -> Iterator[dict]:
    """The RESULT records' data a RESULTS record stands for: {s, pt, st: "ok", v: frames}."""
    try:
        kind, meta, payload = wire.decode(list(rec.data["b"]))
        if kind is not wire.Kind.BATCH:
            raise ValueError(f"a {kind.name} message")
        replies = [wire.decode_one(sub) for sub in wire.split_batch(meta, payload)]
    except (ProtocolError, KeyError, TypeError, ValueError) as e:
        raise CorruptRecord(session or "(unnamed)", rec.lsn,
                            f"a results record does not hold a batch of replies ({e})") from e
    for i in covered(replies):
        _, meta, payload = replies[i]
        # The frames are views into the record's bytes: a copy each, kept as a tuple of bytes,
        # which the cyclic GC stops tracking (a standby holds one per journaled call).
        yield {"s": meta["s"], "pt": meta["pt"], "st": "ok", "v": tuple([bytes(f) for f in payload])}


def change_id(value: object) -> str:
    """A change id of s.patched / s.deprecate_patch, checked."""
    if not isinstance(value, str) or not value or len(value) > MAX_CHANGE_ID or not value.isprintable():
        raise ValueError(f"a change id is a printable string of 1..{MAX_CHANGE_ID} characters, not {value!r:.80}")
    return value


def describe(kind: str, actor: str = "", method: str = "", digest: bytes = b"", points: Iterable[int] = ()) -> str:
    if kind == PATCH:
        return f"the marker of s.patched({method!r})"
    if kind == "host_mesh":
        return f"host_mesh(hosts={method}, cluster={actor!r})"
    if kind == "grow":
        return f"a proc mesh's grow(hosts={method}) in cluster {actor!r}"
    if kind in VALUE_KINDS:
        return f"{kind}()"
    if kind == "loop":
        return f"an event-loop {method} (the program's tasks in another order)"
    pts = list(points)
    where = f"{actor}.{method}" if method else actor
    return f"{kind} {where} on points {pts} (argument digest {digest.hex()[:12]})"


@dataclass(slots=True)
class JournaledCall:
    seq: int
    kind: str
    actor: str = ""
    method: str = ""
    digest: bytes = b""
    points: tuple[int, ...] = ()
    value: Any = None
    results: dict[int, dict] = field(default_factory=dict)
    procs: list[dict] | None = None

    def describe(self) -> str:
        return describe(self.kind, self.actor, self.method, self.digest, self.points)


def placed_hosts(kind: str, value: Any) -> list[str]:
    """The host agents' addresses a placement's value names (`this_host`, `host_mesh`, `grow`)."""
    if kind == "this_host":
        return [value] if isinstance(value, str) else []
    hosts = value.get("hosts") if kind in ("host_mesh", "grow") and isinstance(value, dict) else None
    if not isinstance(hosts, list):
        return []
    return [h["addr"] for h in hosts if isinstance(h, dict) and isinstance(h.get("addr"), str)]


class ReplayIndex:
    """The last run of a session, indexed by seq."""

    def __init__(self, records: Iterable[Any] = ()):
        self._reset()
        self.extend(records)

    def extend(self, records: Iterable[Any]) -> None:
        """Index more records, in the journal's order (a catching-up standby's tail)."""
        # Indexing builds many small objects and no cycles: the cyclic collector would
        # only rescan them, more than halving the rate (measured: 75-85k -> 180-230k/s).
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            for rec in records:
                kind = rec.kind
                if kind == CALLS:
                    self._add_calls(rec)
                elif kind == RESULTS:
                    self._add_results(rec)
                else:
                    self.add(rec)
        finally:
            if gc_was_on:
                gc.enable()

    def _reset(self) -> None:
        self.run: str | None = None
        self.ended = False
        self.calls: dict[int, JournaledCall] = {}
        self.obs: dict[tuple[int, str, int], Any] = {}
        self.supervision: list[dict] = []
        self.replaced: dict[str, str] = {}  # proc id -> the id of the proc that replaced it
        self.incarnations: dict[tuple[str, int], int] = {}  # (mesh, rank) -> last restart's incarnation
        self.records = 0
        self.epochs: list[int] = []
        self.last_lsn = -1
        self.max_seq = -1
        self.program: dict | None = None  # the newest PROGRAM record's {path, digest}
        self.placements: list[JournaledCall] = []  # this_host, host_mesh and grow: the hosts it used

    def add(self, rec: Any) -> None:
        """Index one record (CALLS and RESULTS records through `_add_calls`, `_add_results`)."""
        kind, d = rec.kind, rec.data
        if kind == START:
            self._reset()  # a new run: forget the previous one
            self.run = d["run"]
            self.last_lsn = rec.lsn
            self.records = 1
            self.epochs = [rec.epoch]
            return
        self._note(rec, 1)
        if kind == CALL:
            self.max_seq = max(self.max_seq, d["s"])
            jc = self.calls[d["s"]] = JournaledCall(
                d["s"], d["k"], d.get("a", ""), d.get("m", ""), d.get("d", b""),
                tuple(d.get("pts", ())), d.get("v"))
            if jc.kind in _PLACEMENTS:
                self.placements.append(jc)
        elif kind == RESULT:
            self._add_result(d)
        elif kind == OBS:
            self.obs[(d["s"], d["w"], d.get("i", 0))] = d.get("v")
        elif kind == PROCS:
            call = self.calls.get(d["s"])
            if call is not None:
                call.procs = d["procs"]
        elif kind == SUPERVISION:
            self.supervision.append(d)
            if d.get("ev") == "proc_replaced" and isinstance(d.get("old"), str) and isinstance(d.get("new"), str):
                self.replaced[d["old"]] = d["new"]
            elif d.get("ev") == "restart":
                for r, inc in zip(d.get("ranks") or [], d.get("incarnation") or [], strict=False):
                    if isinstance(r, int) and isinstance(inc, int):
                        key = (d.get("mesh"), r)
                        self.incarnations[key] = max(self.incarnations.get(key, 0), inc)
        elif kind == PROGRAM:
            path, digest = d.get("path"), d.get("digest")
            if isinstance(path, str) and isinstance(digest, str):
                self.program = {"path": path, "digest": digest}
        elif kind == END:
            self.ended = True

    def _add_calls(self, rec: Any) -> None:
        """`add` for each CALL record a CALLS record stands for (as `expand` unpacks it),
        without building the records: a standby indexes one per journaled call."""
        self._note(rec, len(rec.data["items"]))
        calls = self.calls
        top = self.max_seq
        for item in rec.data["items"]:
            if len(item) in (7, 8):
                s, k, a, m, d, pts = item[:6]
                calls[s] = JournaledCall(s, k, a, m, d, tuple(pts))
                if s > top:
                    top = s
            else:
                for d in collected_results(item, lsn=rec.lsn):
                    self._add_result(d)
        self.max_seq = top

    def _add_results(self, rec: Any) -> None:
        """`add` for each RESULT record a RESULTS record stands for (batched_results)."""
        results = list(batched_results(rec))
        self._note(rec, len(results))
        for d in results:
            self._add_result(d)

    def _add_result(self, d: dict) -> None:
        call = self.calls.get(d["s"])
        if call is not None:
            call.results[d["pt"]] = d

    def _note(self, rec: Any, n: int) -> None:
        """Count `n` records stored in `rec` (its lsn and epoch)."""
        if n:
            self.last_lsn = rec.lsn
            self.records += n
            if not self.epochs or self.epochs[-1] != rec.epoch:
                self.epochs.append(rec.epoch)

    def check(self, seq: int, kind: str, actor: str = "", method: str = "", digest: bytes = b"",
              points: Iterable[int] | None = None) -> JournaledCall | None:
        """The journaled call at seq if the new one matches it; None past the journal's end."""
        jc = self.calls.get(seq)
        if jc is None:
            return None
        same = jc.kind == kind and jc.actor == actor and jc.method == method and jc.digest == digest
        if same and points is not None and kind != "choose":
            same = jc.points == tuple(points)
        if not same:
            raise NonDeterminismError(seq, jc.describe(), describe(kind, actor, method, digest, points or ()))
        return jc
