"""`regent journal export`: a session as Chrome trace events (ui.perfetto.dev opens them) or
as JSON lines, one record each."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from regent.controller.replay import (
    CALL,
    END,
    PATCH,
    PLACED,
    PROGRAM,
    RESULT,
    START,
    SUPERVISION,
    VALUE_KINDS,
    expand,
)


def export_jsonl(records: Iterable) -> Iterator[str]:
    """One JSON object per record: lsn, epoch, ts, kind and the record's fields (bytes as
    {"bytes": n, "hex": first 32 bytes}). CALLS and RESULTS records are unpacked (replay.expand)."""
    for rec in expand(records):
        yield json.dumps({"lsn": rec.lsn, "epoch": rec.epoch, "ts": rec.ts, "kind": rec.kind,
                          **{k: _plain(v) for k, v in rec.data.items()}}, sort_keys=False)


def _plain(v: Any) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        b = bytes(v)
        return {"bytes": len(b), "hex": b[:32].hex()}
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def export_perfetto(records: Iterable, session: str = "") -> dict:
    """The session as Chrome trace events: a process per actor mesh with a thread (track)
    per actor, a span per call from its call record to its result record, and instant
    markers for failovers (epoch changes), supervision events, checkpoints and s.patched markers. An async
    program's calls (s.run) also appear on a track per task, from the call to its last result.

    A span starts no earlier than the end of the previous one on its track: an actor runs
    one message at a time, and the trace format wants the slices of a track to nest.
    """
    events: list[dict] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[int, str], int] = {}
    open_calls: dict[int, dict] = {}
    track_end: dict[tuple[int, int], float] = {}
    t0: float | None = None
    epoch: int | None = None
    last_ts = 0.0

    def us(ts: float) -> float:
        return round((ts - t0) * 1e6, 3)

    def track(mesh: str, name: str) -> tuple[int, int]:
        if mesh not in pids:
            pids[mesh] = len(pids) + 1
            events.append({"ph": "M", "name": "process_name", "pid": pids[mesh], "tid": 0,
                           "args": {"name": mesh}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pids[mesh], "tid": 0,
                           "args": {"sort_index": pids[mesh]}})
        pid = pids[mesh]
        if (pid, name) not in tids:
            tids[(pid, name)] = len([k for k in tids if k[0] == pid]) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[(pid, name)],
                           "args": {"name": name}})
        return pid, tids[(pid, name)]

    ctl = track("controller", "program")
    markers = track("controller", "failovers, restarts, checkpoints")
    for rec in expand(records):
        d = rec.data
        if t0 is None:
            t0 = rec.ts
        last_ts = max(last_ts, rec.ts)
        if epoch is not None and rec.epoch != epoch:
            events.append({"ph": "i", "s": "g", "name": f"failover: epoch {epoch} -> {rec.epoch}",
                           "cat": "failover", "ts": us(rec.ts), "pid": markers[0], "tid": markers[1],
                           "args": {"from_epoch": epoch, "to_epoch": rec.epoch, "lsn": rec.lsn}})
        epoch = rec.epoch
        if rec.kind == START:
            events.append({"ph": "i", "s": "g", "name": f"run {d.get('run')} starts", "cat": "run",
                           "ts": us(rec.ts), "pid": markers[0], "tid": markers[1], "args": {"lsn": rec.lsn}})
        elif rec.kind == CALL:
            kind = d.get("k")
            if kind == "checkpoint":
                events.append({"ph": "i", "s": "g", "name": f"checkpoint (seq {d['s']})", "cat": "checkpoint",
                               "ts": us(rec.ts), "pid": markers[0], "tid": markers[1],
                               "args": {"seq": d["s"], "lsn": rec.lsn}})
            elif kind == PATCH:
                events.append({"ph": "i", "s": "g", "name": f"patched({d.get('m')!r})", "cat": "patch",
                               "ts": us(rec.ts), "pid": markers[0], "tid": markers[1],
                               "args": {"seq": d["s"], "change": d.get("m"), "lsn": rec.lsn}})
            elif kind in VALUE_KINDS or not d.get("a"):
                events.append({"ph": "i", "s": "t", "name": f"{kind}()" if kind in VALUE_KINDS else kind,
                               "cat": "value", "ts": us(rec.ts), "pid": ctl[0], "tid": ctl[1],
                               "args": {"seq": d["s"]}})
            else:
                open_calls[d["s"]] = {"ts": rec.ts, "a": d["a"], "m": d.get("m"), "k": kind,
                                      "pts": d.get("pts") or [], "epoch": rec.epoch, "task": d.get("task")}
        elif rec.kind == RESULT:
            call = open_calls.get(d["s"])
            if call is None:
                continue
            pid, tid = track(call["a"], f"{call['a']}[{d['pt']}]")
            _span(events, track_end, pid, tid, call, d["s"], us(call["ts"]), us(rec.ts), d.get("st"),
                  (d.get("x") or {}).get("em"))
            done = call.setdefault("done", set())
            done.add(d["pt"])
            if isinstance(call["task"], str) and done >= set(call["pts"]):
                pid, tid = track("controller tasks", call["task"])
                _span(events, track_end, pid, tid, {**call, "m": f"{call['a']}.{call['m']}"}, d["s"],
                      us(call["ts"]), us(rec.ts), "complete", None)
        elif rec.kind == SUPERVISION and d.get("ev") != PLACED:  # (where members are: not an event)
            where = f"{d.get('mesh')}[{d.get('rank')}]" if d.get("mesh") is not None else None
            pid, tid = track(d["mesh"], where) if where else markers
            events.append({"ph": "i", "s": "t" if where else "g", "name": f"supervision: {d.get('ev')}",
                           "cat": "restart", "ts": us(rec.ts), "pid": pid, "tid": tid,
                           "args": {k: _plain(v) for k, v in d.items()}})
        elif rec.kind == PROGRAM:
            events.append({"ph": "i", "s": "g", "name": f"program changed: {d.get('path')}", "cat": "upgrade",
                           "ts": us(rec.ts), "pid": markers[0], "tid": markers[1],
                           "args": {"path": d.get("path"), "digest": d.get("digest"), "lsn": rec.lsn}})
        elif rec.kind == END:
            events.append({"ph": "i", "s": "g", "name": "run ends" + (" with an error" if d.get("error") else ""),
                           "cat": "run", "ts": us(rec.ts), "pid": markers[0], "tid": markers[1],
                           "args": {"error": d.get("error")}})
    # Calls with points that never answered (in flight at the end) run to the end of the trace.
    for seq, call in open_calls.items():
        for pt in call["pts"]:
            if pt not in call.get("done", ()):
                pid, tid = track(call["a"], f"{call['a']}[{pt}]")
                _span(events, track_end, pid, tid, call, seq, us(call["ts"]), us(last_ts), "no result", None)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"session": session, "exported_by": "regent journal export"}}


def _span(events: list, track_end: dict, pid: int, tid: int, call: dict, seq: int, start: float, end: float,
          status: str | None, error: str | None) -> None:
    begin = max(start, track_end.get((pid, tid), start))
    end = max(end, begin)
    track_end[(pid, tid)] = end
    args = {"seq": seq, "adverb": call["k"], "status": status, "issued_at_us": start, "epoch": call["epoch"]}
    if error:
        args["error"] = error
    events.append({"ph": "X", "name": call["m"], "cat": "call", "ts": begin, "dur": round(end - begin, 3),
                   "pid": pid, "tid": tid, "args": args})
