"""`regent status SESSION`: where a session stands, from its journal and its store only.

What the store says now (who leads, at which epoch) and what the journal's latest run records
(its meshes and their procs per host, restarts and escalations, host losses, failovers, the
call rate), in one JSON-able dict, and a screen of text made from it. It reads: it never
writes the journal, takes a lease or messages a worker (invariant 16), so it is safe against a
live session. Values are never unpickled; what the journal holds is untrusted, and a record of
the wrong shape is skipped, not fatal.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from regent.controller.replay import (
    CALL,
    CHECKPOINT,
    END,
    PLACED,
    PROCS,
    START,
    SUPERVISION,
    expand,
)

# Supervision events a person reads in `status` (the rest are bookkeeping: group re-forms...).
EVENTS = ("failure", "restart", "escalation", "host_lost", "host_back", "host_restarted", "host_replaced",
          "shrunk", "grown", "proc_replaced")
CALL_KINDS = frozenset({"call", "call_one", "choose", "stream", "broadcast", "send", "port"})
RATE_WINDOW_S = 60.0
TIMELINE_LIMIT = 500


@dataclass
class _Mesh:
    name: str
    members: int
    spawned_seq: int
    stopped: bool = False
    failures: int = 0
    restarts: int = 0
    escalated: str | None = None
    last_event: str = ""

    def state(self, run_ended: bool) -> str:
        if self.stopped:
            return "stopped"
        if run_ended:
            return "ended"
        if self.escalated is not None:
            return "escalated"
        if self.last_event == "failure":
            return "restarting"
        return "running"


@dataclass
class _Run:
    """What the journal's latest run records, folded record by record."""

    run: str | None = None
    started: float | None = None
    ended: bool = False
    error: str | None = None
    epochs: dict[int, float] = field(default_factory=dict)  # epoch -> its first record's time
    meshes: dict[str, _Mesh] = field(default_factory=dict)
    procs: dict[str, str] = field(default_factory=dict)  # proc id -> its host agent's address
    clusters: dict[str, list[str]] = field(default_factory=dict)  # cluster -> host ids the run picked
    events: list[dict] = field(default_factory=list)
    call_times: list[float] = field(default_factory=list)
    calls: int = 0
    checkpoint_seq: int | None = None
    checkpoints: list[dict] = field(default_factory=list)
    ended_at: float | None = None
    placed: dict[str, list[str]] = field(default_factory=dict)  # mesh -> its members' proc ids at spawn
    replaced: dict[str, str] = field(default_factory=dict)  # proc id -> the proc that replaced it

    def hosts_of(self, mesh: str) -> dict[str, int]:
        """How many members of `mesh` each host agent runs now (empty if the journal does not say)."""
        out: dict[str, int] = {}
        for proc in self.placed.get(mesh, []):
            for _ in range(len(self.replaced) + 1):  # a replacement's replacement, and so on
                if proc not in self.replaced:
                    break
                proc = self.replaced[proc]
            host = self.procs.get(proc, "?")
            out[host] = out.get(host, 0) + 1
        return out

    def fold(self, rec: Any) -> None:
        d = rec.data if isinstance(rec.data, dict) else {}
        if rec.kind == START:
            self.__init__()  # a new run: what came before was another run's
            self.run, self.started = str(d.get("run")), rec.ts
        self.epochs.setdefault(rec.epoch, rec.ts)
        if rec.kind == CALL:
            self._call(d, rec.ts)
        elif rec.kind == PROCS:
            for p in d.get("procs") or []:
                if isinstance(p, dict) and isinstance(p.get("id"), str):
                    self.procs[p["id"]] = str(p.get("host", "?"))
        elif rec.kind == SUPERVISION:
            self._event(d, rec.ts)
        elif rec.kind == CHECKPOINT:
            self.checkpoint_seq = d.get("s") if isinstance(d.get("s"), int) else self.checkpoint_seq
            self.checkpoints.append({"t": rec.ts, "seq": self.checkpoint_seq})
        elif rec.kind == END:
            self.ended, self.error, self.ended_at = True, d.get("error"), rec.ts

    def _call(self, d: dict, ts: float) -> None:
        kind, name = d.get("k"), d.get("a")
        if kind == "spawn" and isinstance(name, str):
            self.meshes[name] = _Mesh(name, len(d.get("pts") or []), d.get("s", -1))
        elif kind == "stop" and name in self.meshes:
            self.meshes[name].stopped = True
        elif kind == "host_mesh" and isinstance(d.get("v"), dict) and isinstance(name, str):
            hosts = [h.get("id") for h in d["v"].get("hosts") or [] if isinstance(h, dict)]
            self.clusters.setdefault(name, [])
            self.clusters[name] += [str(h) for h in hosts if h not in self.clusters[name]]
        if kind in CALL_KINDS:
            self.calls += 1
            self.call_times.append(ts)

    def _event(self, d: dict, ts: float) -> None:
        ev = d.get("ev")
        if ev == PLACED and isinstance(d.get("mesh"), str) and isinstance(d.get("procs"), list):
            self.placed[d["mesh"]] = [p for p in d["procs"] if isinstance(p, str)]
        if ev == "proc_replaced" and isinstance(d.get("old"), str) and isinstance(d.get("new"), str):
            self.replaced[d["old"]] = d["new"]
        if ev not in EVENTS:
            return
        self.events.append({"ev": ev, "t": d.get("t", ts), **{k: d[k] for k in (
            "mesh", "rank", "ranks", "cause", "reason", "cluster", "host", "report") if k in d}})
        mesh = self.meshes.get(str(d.get("mesh")))
        if ev == "proc_replaced" and isinstance(d.get("new"), str):
            self.procs[d["new"]] = str(d.get("host", "?"))
            self.procs.pop(str(d.get("old")), None)
        if mesh is None:
            return
        mesh.last_event = ev
        if ev == "failure":
            mesh.failures += 1
        elif ev == "restart":
            mesh.restarts += len(d.get("ranks") or [1])
        elif ev == "escalation":
            mesh.escalated = str(d.get("report", ""))[:300]


def session_status(journal: Any, session: str, *, now: float | None = None, window_s: float = 3600.0,
                   records: Iterable | None = None, store: Any = None) -> dict:
    """Where `session` stands: a dict ready for JSON (see `render`). `records`: the session's
    journal records if already read (else they are read here); `window_s`: how far back
    events are listed; `store`: where the cluster hosts register, if not in the journal's store."""
    from regent.journal.hosts import registered_hosts
    from regent.journal.standbys import standbys

    now = time.time() if now is None else now
    info = journal.session_info(session)
    run = _Run()
    for rec in expand(journal.read(session) if records is None else records, session):
        run.fold(rec)
    recent = [now - t for t in run.call_times if t >= now - RATE_WINDOW_S]
    epochs = sorted(run.epochs.items())
    failovers = [{"epoch": e, "at": t, "from_epoch": epochs[i - 1][0]} for i, (e, t) in enumerate(epochs) if i]
    if info.leader is not None:
        state = "running"
    elif run.ended:
        state = "ended" + (" with an error" if run.error else "")
    elif run.run is None:
        state = "empty"
    else:
        state = "no leader (waiting for a standby or a restart of the program)"
    hosts = []
    for cluster, picked in sorted(run.clusters.items()):
        try:
            registered = {h.id: h for h in registered_hosts((store or journal).backend, cluster)}
        except Exception:  # noqa: BLE001 - the store cannot list this cluster: say so, show the rest
            registered = {}
        for host_id in sorted(set(picked) | set(registered)):
            h = registered.get(host_id)
            hosts.append({"cluster": cluster, "host": host_id, "used": host_id in picked,
                          "state": "registered" if h else "not registered",
                          "backend": h.backend if h else None, "devices": list(h.devices) if h else [],
                          "address": h.address if h else None, "hostname": h.hostname if h else None})
    try:
        waiting = standbys(journal.backend, session)
    except Exception:  # noqa: BLE001 - the store cannot list them this time: none shown
        waiting = []
    for w in waiting:  # a standby replays the whole journal when it takes over: that is its lag
        w["lag_records"] = 0 if info.last_lsn is None else info.last_lsn + 1
    per_host: dict[str, int] = {}
    for host in run.procs.values():
        per_host[host] = per_host.get(host, 0) + 1
    return {
        "session": session,
        "store": journal.url,
        "state": state,
        "leader": None if info.leader is None else {"holder": info.leader, "epoch": info.epoch},
        "standbys": waiting,
        "run": run.run,
        "started": run.started,
        "records": info.records,
        "last_write": info.last_write,
        "checkpoint_seq": run.checkpoint_seq,
        "epochs": [e for e, _ in epochs],
        "failovers": len(failovers),
        "last_failover": failovers[-1] if failovers else None,
        "meshes": [{"name": m.name, "members": m.members, "state": m.state(run.ended), "failures": m.failures,
                    "restarts": m.restarts, "hosts": run.hosts_of(m.name),
                    **({"escalation": m.escalated} if m.escalated else {})}
                   for m in run.meshes.values()],
        "procs_per_host": dict(sorted(per_host.items())),
        "hosts": hosts,
        "events": [e for e in run.events if isinstance(e.get("t"), (int, float)) and e["t"] >= now - window_s],
        "timeline": _timeline(run, failovers),
        "calls": run.calls,
        "calls_per_s": round(len(recent) / RATE_WINDOW_S, 2),
        "problem": info.problem,
    }


def _timeline(run: _Run, failovers: list[dict]) -> list[dict]:
    """The run's story in time order, for the dashboard: its start and end, failovers,
    supervision events and checkpoints (the latest TIMELINE_LIMIT)."""
    items = [{"t": run.started, "what": "run started", "detail": run.run}] if run.started else []
    items += [{"t": f["at"], "what": "failover", "detail": f"epoch {f['from_epoch']} -> {f['epoch']}"}
              for f in failovers]
    items += [{"t": e["t"], "what": e["ev"].replace("_", " "),
               "detail": " ".join(f"{k}={str(v)[:120]}" for k, v in e.items() if k not in ("ev", "t"))}
              for e in run.events if isinstance(e.get("t"), (int, float))]
    items += [{"t": c["t"], "what": "checkpoint", "detail": f"seq {c['seq']}"} for c in run.checkpoints]
    if run.ended_at is not None:
        items.append({"t": run.ended_at, "what": "run ended", "detail": str(run.error or "")[:300]})
    items.sort(key=lambda i: i["t"])
    return items[-TIMELINE_LIMIT:]


def _when(ts: float | None, now: float) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    try:
        clock = _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError):
        return "?"
    return f"{clock} UTC ({_ago(now - ts)})"


def _ago(s: float) -> str:
    if s < 0:
        return "in the future"
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def render(st: dict, now: float | None = None) -> str:
    """The status as one screen of text."""
    now = time.time() if now is None else now
    lead = st["leader"]
    lines = [f"session {st['session']!r} in {st['store']}: {st['state']}",
             f"  leader      {lead['holder']} at epoch {lead['epoch']}" if lead else "  leader      none",
             *[f"  standby     {w['holder']}, waiting since {_when(w['since'], now)}, "
               f"{w['lag_records']} records to replay" for w in st["standbys"]],
             f"  run         {st['run'] or '-'}, started {_when(st['started'], now)}",
             f"  journal     {st['records']} records, last written {_when(st['last_write'], now)}"
             + (f", checkpoint at seq {st['checkpoint_seq']}" if st["checkpoint_seq"] is not None else ""),
             f"  calls       {st['calls']} in this run, {st['calls_per_s']:g}/s over the last minute",
             f"  failovers   {st['failovers']} (epochs {', '.join(map(str, st['epochs'])) or '-'})"
             + (f", the last at {_when(st['last_failover']['at'], now)}" if st["last_failover"] else "")]
    if st["problem"]:
        lines.append(f"  PROBLEM     {st['problem']}")
    lines.append("")
    lines.append("meshes" if st["meshes"] else "meshes: none spawned in this run")
    for m in st["meshes"]:
        lines.append(f"  {m['name']:<24} {m['members']:>5} members  {m['state']:<11} "
                     f"{m['failures']} failures, {m['restarts']} restarts"
                     + (f"  escalated: {m['escalation']}" if m.get("escalation") else ""))
        lines += [f"    {host:<38} {n:>5}" for host, n in sorted(m["hosts"].items())]
    if st["procs_per_host"]:
        lines.append("procs per host agent")
        for host, n in st["procs_per_host"].items():
            lines.append(f"  {host:<40} {n:>5}")
    if st["hosts"]:
        lines.append("cluster hosts")
        for h in st["hosts"]:
            devices = ", ".join(h["devices"]) or "no devices"
            lines.append(f"  {h['cluster']}/{h['host']:<20} {'used' if h['used'] else 'spare':<6} {h['state']:<15} "
                         f"{h['backend'] or '-':<7} {devices}")
    lines.append("events in the last hour" if st["events"] else "events in the last hour: none")
    for e in st["events"][-20:]:
        what = {k: v for k, v in e.items() if k not in ("ev", "t")}
        lines.append(f"  {_when(e['t'], now)[:19]}  {e['ev']:<14} "
                     + " ".join(f"{k}={str(v)[:80]}" for k, v in what.items()))
    return "\n".join(lines)
