"""The chaos workload: a deterministic controller program that uses every adverb.

Run as primary and standbys by chaos.cluster. Configured by environment:
REGENT_CHAOS_SESSION, REGENT_CHAOS_JOURNAL, REGENT_CHAOS_STEPS, REGENT_CHAOS_TTL,
REGENT_CHAOS_LEDGER (where actors record executions), REGENT_CHAOS_LEADERS (this
process appends "pid time" when it leads), REGENT_CHAOS_PROCS, REGENT_CHAOS_PAYLOAD
(bytes of the array moved by `echo`), REGENT_CHAOS_STEP_S (a pause after each live
step; results do not depend on it), REGENT_CHAOS_CALL_TIMEOUT_S (the deadline of
every get), REGENT_CHAOS_RESTART (a restart policy: permanent, transient, temporary
or none), REGENT_CHAOS_TOXIPROXY (route links through proxies, see chaos.links).

Results depend only on arguments, so a run whose procs restart still returns what a
fault-free run returns. A call that fails (SupervisionError, or its deadline passed)
is issued again under a new token: each token is a distinct call to the checker.
Prints one JSON line: the outputs, the retries and the session's stats.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib

import numpy as np

from regent.chaos.ledger import Ledger
from regent.chaos.links import links_from_env
from regent.controller import Session, SupervisionError
from regent.journal import LeadershipLost
from regent.worker import Actor, context, endpoint
from regent.worker.supervision import RestartPolicy

MAX_ATTEMPTS = 40


class Echo(Actor):
    """Pure endpoints (results depend on arguments only) that record every execution."""

    def __init__(self, ledger_dir: str, delay_s: float) -> None:
        ctx = context()
        self.ledger = Ledger(ledger_dir, ctx.mesh, ctx.rank, ctx.incarnation)
        self.delay_s = delay_s

    @endpoint
    def square(self, token: str, x: int) -> int:
        self.ledger.note("square", token, x)
        if self.delay_s:
            time.sleep(self.delay_s)
        return x * x

    @endpoint
    def echo(self, token: str, data: np.ndarray) -> list:
        self.ledger.note("echo", token, data)
        return [int(data.nbytes), zlib.crc32(data.tobytes())]


class Workload:
    def __init__(self, s: Session, w, n_procs: int, timeout_s: float, payload: int) -> None:
        self.s, self.w, self.n = s, w, n_procs
        self.timeout_s = timeout_s
        self.payload = payload
        self.retries = {"supervision": 0, "timeout": 0}

    def attempt(self, base: str, fn):
        """fn(token) until it succeeds; each try is a new call (a new token)."""
        for a in range(MAX_ATTEMPTS):
            try:
                return fn(f"{base}.{a}")
            except SupervisionError as e:
                self.retries["supervision"] += 1
                self.s.log("call failed; issuing it again", call=base, error=str(e)[:200])
            except TimeoutError as e:
                self.retries["timeout"] += 1
                self.s.log("call timed out; issuing it again", call=base, error=str(e)[:200])
            if not self.s.replaying:
                time.sleep(0.05)
        raise RuntimeError(f"{base}: no success after {MAX_ATTEMPTS} attempts")

    def step(self, i: int):
        w, t = self.w, self.timeout_s
        k = i % 6
        if k == 0:
            return self.attempt(f"c{i}", lambda tok: w.square.call(tok, i).get(timeout=t).values())
        if k == 1:
            w.square.broadcast(f"b{i}", i)
            return None
        if k == 2:
            return self.attempt(f"h{i}", lambda tok: w.square.choose(tok, i).get(timeout=t))
        if k == 3:
            return self.attempt(f"s{i}", lambda tok: sorted(v for _, v in w.square.stream(tok, i).iter(timeout=t)))
        if k == 4:
            r = i % self.n
            return self.attempt(f"o{i}", lambda tok: w.slice(procs=r).square.call_one(tok, i).get(timeout=t))
        data = np.arange(self.payload // 8, dtype=np.int64) * i
        r = i % self.n
        return self.attempt(f"e{i}", lambda tok: w.slice(procs=r).echo.call_one(tok, data).get(timeout=t))


def _policy() -> RestartPolicy | None:
    kind = os.environ.get("REGENT_CHAOS_RESTART", "permanent")
    if kind == "none":
        return None
    return RestartPolicy(restart=kind, max_restarts=1000, window_s=1.0, backoff_max_s=0.2,
                         restart_timeout_s=20.0)


def _ended_before(s: Session) -> bool:
    return any(r.kind == "session_end" for r in s.journal.read(s.name))


def main() -> int:
    env = os.environ
    steps = int(env.get("REGENT_CHAOS_STEPS", "60"))
    n_procs = int(env.get("REGENT_CHAOS_PROCS", "3"))
    timeout_s = float(env.get("REGENT_CHAOS_CALL_TIMEOUT_S", "5"))
    payload = int(env.get("REGENT_CHAOS_PAYLOAD", "16384"))
    delay_s = float(env.get("REGENT_CHAOS_DELAY_S", "0.002"))
    pace_s = float(env.get("REGENT_CHAOS_STEP_S", "0"))  # a pause between live steps: a longer run
    try:
        with Session(env["REGENT_CHAOS_SESSION"], journal=env["REGENT_CHAOS_JOURNAL"],
                     lease_ttl_s=float(env.get("REGENT_CHAOS_TTL", "1.0")), links=links_from_env()) as s:
            if s.waited and not s.replaying and _ended_before(s):
                # The run this standby waited on has ended: starting it anew would run every
                # call again. (regent run stops standbys when a run ends; this closes the race.)
                print("the session's run has ended; nothing to take over", file=sys.stderr, flush=True)
                return 4
            leaders = env.get("REGENT_CHAOS_LEADERS")
            if leaders:
                with open(leaders, "a") as f:
                    f.write(f"{os.getpid()} {time.time():.6f}\n")
            procs = s.spawn_procs(per_host={"procs": n_procs})
            w = procs.spawn("w", Echo, env["REGENT_CHAOS_LEDGER"], delay_s, restart=_policy())
            work = Workload(s, w, n_procs, timeout_s, payload)
            out = []
            for i in range(steps):
                out.append(work.step(i))
                if not s.replaying:
                    print(f"step {i}", file=sys.stderr, flush=True)
                    if pace_s:
                        time.sleep(pace_s)
            # A last call on every actor: per-sender FIFO puts every broadcast before it.
            out.append(work.attempt("final", lambda tok: w.square.call(tok, -1).get(timeout=timeout_s).values()))
            print(json.dumps({"out": out, "retries": work.retries, "stats": s.stats, "role": s.role,
                              "sid": s.sid}), flush=True)
    except LeadershipLost as e:
        print(f"deposed: {e}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
