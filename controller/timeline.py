"""`regent journal show`: one readable line per record, with filters. It never unpickles
values (results are shown by size), so it is safe on any journal."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from regent.controller.replay import (
    CALL,
    CHECKPOINT,
    END,
    OBS,
    PATCH,
    PLACED,
    PROCS,
    PROGRAM,
    RESULT,
    START,
    SUPERVISION,
    expand,
)


@dataclass
class Filter:
    actor: str | None = None
    endpoint: str | None = None
    errors_only: bool = False
    since: float | None = None
    until: float | None = None


def _when(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def timeline(records: Iterable, flt: Filter | None = None) -> Iterator[str]:
    """One readable line per record that passes the filter."""
    flt = flt or Filter()
    calls: dict[int, tuple[str, str]] = {}
    for rec in expand(records):
        d = rec.data
        if rec.kind == CALL:
            calls[d["s"]] = (d.get("a", ""), d.get("m", ""))
        if flt.since is not None and rec.ts < flt.since or flt.until is not None and rec.ts > flt.until:
            continue
        actor, method = calls.get(d.get("s", -1), ("", "")) if isinstance(d, dict) else ("", "")
        if flt.actor and actor != flt.actor or flt.endpoint and method != flt.endpoint:
            continue
        line = _describe(rec, actor, method)
        if flt.errors_only and not _is_error(rec):
            continue
        yield f"{rec.lsn:>8}  e{rec.epoch:<6} {_when(rec.ts)}  {line}"


def _wake(v: object) -> str:
    """A `loop` record's value (untrusted: the journal's)."""
    if not isinstance(v, dict):
        return repr(v)[:80]
    try:
        when = _when(v["t"]) if isinstance(v.get("t"), (int, float)) else "?"
    except (OverflowError, ValueError, OSError):
        when = "?"
    return f"the task awaiting seq {v['f']} resumes at {when}" if "f" in v else f"the clock reads {when}"


def _is_error(rec) -> bool:
    d = rec.data
    return (rec.kind == RESULT and d.get("st") != "ok") or (rec.kind == SUPERVISION and d.get("ev") != PLACED) or (
        rec.kind == END and d.get("error")) or (rec.kind == OBS and d.get("w") == "timeout")


def _describe(rec, actor: str, method: str) -> str:
    d, k = rec.data, rec.kind
    if k == START:
        return f"run {d.get('run')} started"
    if k == CALL:
        kind = d.get("k")
        if "v" in d and kind in ("now", "random", "this_host"):
            return f"seq {d['s']:<6} {kind}() = {d['v']!r}"
        if kind == "host_mesh" and isinstance(d.get("v"), dict):
            hosts = [h.get("id") for h in d["v"].get("hosts") or [] if isinstance(h, dict)]
            return f"seq {d['s']:<6} host_mesh(cluster={d.get('a')!r}) = {hosts}"
        if kind in ("side_effect", "resume", "checkpoint"):
            return f"seq {d['s']:<6} {kind}()"
        if kind == PATCH:
            return f"seq {d['s']:<6} patched({d.get('m')!r}): the program from here on has this change"
        if kind == "loop":
            return f"seq {d['s']:<6} event loop {d.get('m')}: {_wake(d.get('v'))}"
        return f"seq {d['s']:<6} {kind} {d.get('a')}.{d.get('m')} -> points {d.get('pts')}"
    if k == RESULT:
        where = f"seq {d['s']:<6} {actor}[{d.get('pt')}].{method}"
        if d.get("st") == "ok":
            size = d["big"][1] if d.get("big") else sum(len(b) for b in d.get("v") or [])
            kept = "kept by the worker" if d.get("big") else "in journal"
            return f"{where} ok ({size} bytes, {kept})"
        x = d.get("x") or {}
        return f"{where} {d.get('st').upper()} {x.get('et', '')} {x.get('em', '')}".rstrip()
    if k == OBS:
        return f"seq {d['s']:<6} observed {d.get('w')}[{d.get('i')}] = {d.get('v')!r}"
    if k == PROCS:
        return f"seq {d['s']:<6} procs " + ", ".join(f"{p['id']} pid {p['pid']}" for p in d.get("procs", []))
    if k == SUPERVISION:
        return f"supervision {d}"
    if k == CHECKPOINT:
        return f"seq {d.get('s')} checkpoint"
    if k == PROGRAM:
        return f"program {d.get('path')} (sha256 {str(d.get('digest'))[:16]}) leads the run from here (regent upgrade)"
    if k == END:
        return "run ended" + (f" with error {d['error']}" if d.get("error") else "")
    return f"{k} {d}"
