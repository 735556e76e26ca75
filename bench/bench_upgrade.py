"""Upgrade benchmark (issue #33): `regent upgrade` of a running session that holds BENCH_CALLS
journaled calls, on etcd and SQLite.

    .venv/bin/python bench/bench_upgrade.py [--quick] [--calls N] [--runs N] [--catchup on|off|both]
        [--json-out FILE]

Figures: the check (read the journal, replay the new program against it: the CLI's own
measure, and the command's wall time to its verdict), and the hand-over (the new program's
request in the store -> its first call completed live, from the time its log gives the request
and the time the program notes; both taken in the new program's process). By default the new
program catches up with the journal before it asks (controller/catchup.py); `--catchup off`
measures the replay after the takeover instead, `both` each in its own chain of the same run. The session is upgraded
`runs` times in a chain (v1 -> v2 -> v2 ...), each upgrade over the whole, growing journal.
One JSON object goes to stdout, notes to stderr; targets are printed beside the figures,
never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench_core import add_target, note, note_targets, private_regent_home, run_and_report  # noqa: E402

from regent.journal import open_journal  # noqa: E402
from tests.support.etcd import EtcdServer, etcd_available  # noqa: E402

PROGRAM = HERE / "programs" / "upgrade_loop.py"
HANDOVER_TARGET_MS = 100.0  # the bound: the SIGTERM hand-off's today
# The new program's log line as it asks for the hand-over (structlog's UTC timestamp first).
ASKED = re.compile(r"^(\S+) \[info\s*\] asked the primary to hand the session over", re.M)
WON = re.compile(r"^(\S+) \[info\s*\] leading session", re.M)
LIVE = re.compile(r"^(\S+) \[info\s*\] (?:caught up and leading|replay complete)", re.M)


def _stamp(iso: str) -> float:
    """A structlog timestamp (UTC, ISO 8601) as time.time()."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"p50": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "n": len(values), "runs": [round(v, digits) for v in values]}


def _wait(probe: Any, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got is not None:
            return got
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited {proc.returncode}\n"
                               f"{log.read_text()[-3000:] if log else ''}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g} s")
        time.sleep(0.01)


def _mark(marks: Path, pid: int) -> dict | None:
    try:
        lines = marks.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        try:
            m = json.loads(line)
        except ValueError:
            continue  # still being written
        if m.get("pid") == pid:
            return m
    return None


def _upgrade_chain(name: str, url: str, calls: int, runs: int, work: Path, catchup: str = "1") -> dict[str, Any]:
    session = f"bench-up-{secrets.token_hex(3)}"
    marks, stop = work / f"{session}.marks", work / f"{session}.stop"
    env = {**os.environ, "BENCH_SESSION": session, "BENCH_JOURNAL": url, "BENCH_CALLS": str(calls),
           "BENCH_MARKS": str(marks), "BENCH_STOP": str(stop), "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen] = []
    out: dict[str, Any] = {"check_s": [], "check_wall_s": [], "handover_ms": [], "replay_s": [], "journaled": [],
                           "ask_to_lead_ms": [], "lead_to_live_ms": [], "live_to_call_ms": []}
    try:
        log = work / f"{session}.v1.log"
        v1 = subprocess.Popen([sys.executable, str(PROGRAM)], env={**env, "BENCH_VERSION": "v1"},
                              stdout=subprocess.DEVNULL, stderr=open(log, "w"), cwd=ROOT)
        procs.append(v1)
        started = time.monotonic()
        _wait(lambda: _mark(marks, v1.pid), 900, f"{name}: v1 journals {calls} calls", v1, log)
        note(f"{name}: v1 journaled {calls} calls in {time.monotonic() - started:.1f} s")
        current = v1
        for i in range(runs):
            with open_journal(url) as j:
                leader = j.backend.leader(session)
            assert leader is not None, f"{name}: nobody leads {session}"
            log = work / f"{session}.up{i}.log"
            t0 = time.monotonic()
            up = subprocess.Popen([sys.executable, "-m", "regent.cli", "upgrade", session, str(PROGRAM),
                                   "--journal", url], env={**env, "BENCH_VERSION": "v2", "REGENT_CATCHUP": catchup},
                                  stdout=subprocess.DEVNULL, stderr=open(log, "w"), cwd=ROOT)
            procs.append(up)
            checked = _wait(lambda log=log: re.search(r"replays the (\d+) calls .*checked in ([\d.]+) s",
                                                      log.read_text()), 600, f"{name}: the check", up, log)
            out["check_wall_s"].append(time.monotonic() - t0)
            out["journaled"].append(int(checked.group(1)))
            out["check_s"].append(float(checked.group(2)))
            first = _wait(lambda up=up: _mark(marks, up.pid), 300, f"{name}: the new program's first live call",
                          up, log)
            asked = ASKED.search(log.read_text())
            assert asked is not None, f"{name}: no hand-over request for epoch {leader[1]}\n{log.read_text()[-3000:]}"
            at = _stamp(asked.group(1))
            out["handover_ms"].append((first["t"] - at) * 1000)
            won, live = WON.search(log.read_text()), LIVE.search(log.read_text())
            if won and live:  # where the hand-over's time goes: to the election, to going live, to the call
                out["ask_to_lead_ms"].append((_stamp(won.group(1)) - at) * 1000)
                out["lead_to_live_ms"].append((_stamp(live.group(1)) - _stamp(won.group(1))) * 1000)
                out["live_to_call_ms"].append((first["t"] - _stamp(live.group(1))) * 1000)
            replayed = re.search(r"replayed through seq \d+ \(([\d.]+) s after taking over\)", log.read_text())
            if replayed:
                out["replay_s"].append(float(replayed.group(1)))
            if current.wait(timeout=60) != 0:
                raise RuntimeError(f"{name}: the primary asked to hand over exited {current.returncode}")
            current = up
            note(f"{name}: upgrade {i + 1}/{runs}: check {out['check_s'][-1]:.2f} s "
                 f"(wall {out['check_wall_s'][-1]:.2f} s) over {out['journaled'][-1]} calls; hand-over "
                 f"{out['handover_ms'][-1]:.1f} ms (of which replay {out['replay_s'][-1] if replayed else '?'} s; "
                 f"ask->lead {out['ask_to_lead_ms'][-1] if out['ask_to_lead_ms'] else '?':.4g} ms, lead->live "
                 f"{out['lead_to_live_ms'][-1] if out['lead_to_live_ms'] else '?':.4g} ms)")
        stop.touch()
        current.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return {"session": session, "calls": calls, "journaled_calls": out["journaled"],
            "check_s": _spread(out["check_s"]), "check_wall_s": _spread(out["check_wall_s"]),
            "handover_ms": _spread(out["handover_ms"], 1), "replay_after_takeover_s": _spread(out["replay_s"]),
            **{k: _spread(out[k], 1) for k in ("ask_to_lead_ms", "lead_to_live_ms", "live_to_call_ms")}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"bench": "upgrade", "calls": args.calls, "runs": args.runs, "targets": []}
    # BENCH_WORKDIR keeps the controllers' logs (a folder of your choice) for a look afterwards.
    with private_regent_home(), tempfile.TemporaryDirectory(prefix="regent-bench-upgrade-") as tmp:
        tmp = os.environ.get("BENCH_WORKDIR") or tmp
        work = Path(tmp)
        modes = {"on": [("", "1")], "off": [("_replay_after", "0")],
                 "both": [("", "1"), ("_replay_after", "0")]}[args.catchup]
        if "sqlite" in args.store:
            for suffix, catchup in modes:
                report["sqlite" + suffix] = _upgrade_chain("sqlite" + suffix, f"sqlite://{work / f'j{suffix}.db'}",
                                                           args.calls, args.runs, work, catchup)
        if "etcd" in args.store:
            if etcd_available():
                with EtcdServer() as etcd:
                    for suffix, catchup in modes:
                        report["etcd" + suffix] = _upgrade_chain("etcd" + suffix, etcd.url, args.calls, args.runs,
                                                                 work, catchup)
            else:
                note("etcd: not installed (scripts/install_etcd.sh); skipped")
    for store in ("etcd", "sqlite"):
        if store in report:
            add_target(report["targets"], f"{store}.handover_ms.p50", report[store]["handover_ms"].get("p50"),
                       "<=", HANDOVER_TARGET_MS)
    return report


def summary(report: dict[str, Any]) -> None:
    for store in ("etcd", "sqlite", "etcd_replay_after", "sqlite_replay_after"):
        if store in report:
            r = report[store]
            note(f"{store}: check p50 {r['check_s'].get('p50')} s (wall {r['check_wall_s'].get('p50')} s), "
                 f"hand-over p50 {r['handover_ms'].get('p50')} ms, replay after takeover p50 "
                 f"{r['replay_after_takeover_s'].get('p50')} s, over {r['journaled_calls']} calls")
    note_targets(report)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=None, help="calls journaled before the first upgrade "
                                                            "(default 100000; --quick 20000)")
    p.add_argument("--runs", type=int, default=None, help="upgrades per store, the p50 is over these (default 5)")
    p.add_argument("--quick", action="store_true", help="20000 calls, 3 upgrades")
    p.add_argument("--store", action="append", choices=("etcd", "sqlite"), help="only this store (repeatable)")
    p.add_argument("--catchup", choices=("on", "off", "both"), default="on",
                   help="the new program catches up before it leads (on, the default), replays after it takes "
                        "over (off: REGENT_CATCHUP=0, what upgrades did before), or both, one chain each")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    args.calls = args.calls or (20_000 if args.quick else 100_000)
    args.runs = args.runs or (3 if args.quick else 5)
    args.store = args.store or ["etcd", "sqlite"]
    run_and_report(lambda: run(args), summary, args.json_out)


if __name__ == "__main__":
    main()
