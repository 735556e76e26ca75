"""The chaos workload: a deterministic controller program that uses every adverb.

Run as primary and standbys by chaos.cluster. Configured by environment:
REGENT_CHAOS_SESSION, REGENT_CHAOS_JOURNAL, REGENT_CHAOS_STEPS, REGENT_CHAOS_TTL,
REGENT_CHAOS_LEDGER (where actors record executions), REGENT_CHAOS_LEADERS (this
process appends "pid time" when it leads), REGENT_CHAOS_PROCS, REGENT_CHAOS_PAYLOAD
(bytes of the array moved by `echo`), REGENT_CHAOS_STEP_S (a pause after each live
step; results do not depend on it), REGENT_CHAOS_CALL_TIMEOUT_S (the deadline of
every get), REGENT_CHAOS_RESTART (a restart policy: permanent, transient, temporary
or none), REGENT_CHAOS_ON_HOST_LOST (its on_host_lost: escalate, replace, shrink), REGENT_CHAOS_TOXIPROXY (route links through proxies, see chaos.links), REGENT_CHAOS_HOSTS (the
actors on N hosts of $REGENT_CLUSTER, one each, instead of REGENT_CHAOS_PROCS procs here),
REGENT_CHAOS_HISTORY (where this process records the register calls it issues and what it was
told of them, for chaos.linearizability).

Results depend only on arguments, so a run whose procs restart still returns what a
fault-free run returns. A call that fails (SupervisionError, or its deadline passed)
is issued again under a new token: each token is a distinct call to the checker.
Each step also puts or gets a key of a key-value register (`Register`, one per proc, whose
writes survive the proc) on the rank that holds the key. A register call that misses its
deadline is waited for again rather than issued anew: a second write could land after later
ones, and the reads would then differ from a fault-free run's.
Prints one JSON line: the outputs, the register's outputs, the retries and the session's stats.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from regent.chaos.ledger import Ledger, in_flight_marker
from regent.chaos.linearizability import HistoryLog
from regent.chaos.links import links_from_env
from regent.controller import Session, SupervisionError
from regent.journal import LeadershipLost
from regent.worker import Actor, context, endpoint
from regent.worker.supervision import RestartPolicy

MAX_ATTEMPTS = 40
KEYS = 4  # register keys; key j lives on rank j % procs


class Echo(Actor):
    """Pure endpoints (results depend on arguments only) that record every execution."""

    def __init__(self, ledger_dir: str, delay_s: float) -> None:
        ctx = context()
        self.ledger = Ledger(ledger_dir, ctx.mesh, ctx.rank, ctx.incarnation)
        self.delay_s = delay_s
        self.marker = in_flight_marker(ledger_dir, os.getpid())
        self.marker.parent.mkdir(parents=True, exist_ok=True)

    @endpoint
    def square(self, token: str, x: int) -> int:
        self.ledger.note("square", token, x)
        if self.delay_s:
            # A broadcast (token b<i>) has nobody waiting on it: a kill there fails no call.
            waited = not token.startswith("b")
            if waited:
                self.marker.touch()
            time.sleep(self.delay_s)
            if waited:
                self.marker.unlink(missing_ok=True)
        return x * x

    @endpoint
    def echo(self, token: str, data: np.ndarray) -> list:
        self.ledger.note("echo", token, data)
        return [int(data.nbytes), zlib.crc32(data.tobytes())]


class Register(Actor):
    """A key-value register whose writes survive its process: each is appended to a file of
    this rank's before the reply, and a restarted actor reads them back. Every execution is
    noted in the ledger, as Echo's are."""

    def __init__(self, ledger_dir: str, state_dir: str) -> None:
        ctx = context()
        self.ledger = Ledger(ledger_dir, ctx.mesh, ctx.rank, ctx.incarnation)
        path = Path(state_dir) / f"{ctx.mesh}.{ctx.rank}.kv"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.values: dict[str, Any] = {}
        if path.exists():
            text = path.read_text()
            # A last line without its newline is a write its process died in, never acknowledged.
            for line in text.split("\n")[:-1]:
                d = json.loads(line)
                self.values[d["k"]] = d["v"] if d["op"] == "put" else self.values.get(d["k"], "") + d["v"]
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _persist(self, op: str, key: str, value: Any) -> None:
        # One write(2) reaches the page cache before the reply: a SIGKILL cannot take it back
        # (only a power loss could, and no fault here is one).
        os.write(self._fd, (json.dumps({"op": op, "k": key, "v": value}) + "\n").encode())

    @endpoint
    def put(self, token: str, key: str, value: Any) -> None:
        self.ledger.note("put", token, key, value)
        if value is None:
            raise ValueError("a register value cannot be None (None is what get returns for no value)")
        self._persist("put", key, value)
        self.values[key] = value

    @endpoint
    def append(self, token: str, key: str, value: str) -> None:
        self.ledger.note("append", token, key, value)
        self._persist("append", key, value)
        self.values[key] = self.values.get(key, "") + value

    @endpoint
    def get(self, token: str, key: str) -> Any:
        self.ledger.note("get", token, key)
        return self.values.get(key)


class Registers:
    """The program's register calls, each recorded in the history (chaos.linearizability)
    before it is issued and when its outcome reaches the program."""

    def __init__(self, s: Session, kv, n_procs: int, timeout_s: float, history: HistoryLog | None,
                 retries: dict) -> None:
        self.s, self.kv, self.n = s, kv, n_procs
        self.timeout_s = timeout_s
        self.history = history
        self.retries = retries
        retries.setdefault("waited_again", 0)  # register calls past their deadline, waited for again
        dims = kv.dims  # {"procs": N} here, {"hosts": N, "procs": 1} across hosts: slice the long one
        self.dim = max(dims, key=dims.__getitem__)

    def step(self, i: int) -> Any:
        """Step i's register call: puts on even steps, key by key in turn; reads on odd ones, of
        the key just written every third time, else of one written some steps before."""
        m = i // 2
        if i % 2 == 0:
            return self.call(f"p{i}", "put", f"k{m % KEYS}", i)
        return self.call(f"g{i}", "get", f"k{(m + m % 3) % KEYS}")

    def call(self, base: str, op: str, key: str, value: Any = None) -> Any:
        """op until it succeeds. A SupervisionError leaves the outcome open (the proc may have
        run it before it died): the call is issued again under a new token, a new operation.
        A missed deadline does not: the call stays outstanding, and is waited for again."""
        actor = self.kv.slice(**{self.dim: int(key[1:]) % self.n})
        args = (key,) if op == "get" else (key, value)
        record = {"op": op, "key": key} if op == "get" else {"op": op, "key": key, "value": value}
        h, t = self.history, self.timeout_s
        for a in range(MAX_ATTEMPTS):
            tok = f"{base}.{a}"
            if h:
                h.invoke(tok, record, replaying=self.s.replaying)
            try:
                fut = getattr(actor, op).call_one(tok, *args)
                for _ in range(MAX_ATTEMPTS):
                    try:
                        out = fut.get(timeout=t)
                        break
                    except TimeoutError as e:
                        self.retries["waited_again"] += 1
                        if h:
                            h.timeout(tok, record, replaying=self.s.replaying)
                        self.s.log("register call past its deadline; waiting for it again", call=tok,
                                   error=str(e)[:200])
                else:
                    raise RuntimeError(f"{tok}: no answer after {MAX_ATTEMPTS} deadlines")
            except SupervisionError as e:
                self.retries["supervision"] += 1
                if h:
                    h.unknown(tok, record, str(e), replaying=self.s.replaying)
                self.s.log("register call failed; issuing it again", call=tok, error=str(e)[:200])
                if not self.s.replaying:
                    time.sleep(0.05)
                continue
            if h:
                h.ok(tok, record, out, replaying=self.s.replaying)
            return out
        raise RuntimeError(f"{base}: no success after {MAX_ATTEMPTS} attempts")


class Workload:
    def __init__(self, s: Session, w, n_procs: int, timeout_s: float, payload: int) -> None:
        self.s, self.w, self.n = s, w, n_procs
        self.timeout_s = timeout_s
        self.payload = payload
        self.retries = {"supervision": 0, "timeout": 0}
        self.dim = "hosts" if w.dims.get("hosts", 1) > 1 else "procs"  # the dimension the actors spread over

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
            return self.attempt(f"o{i}", lambda tok: w.slice(**{self.dim: r}).square.call_one(tok, i).get(timeout=t))
        data = np.arange(self.payload // 8, dtype=np.int64) * i
        r = i % self.n
        return self.attempt(f"e{i}", lambda tok: w.slice(**{self.dim: r}).echo.call_one(tok, data).get(timeout=t))


def _policy() -> RestartPolicy | None:
    kind = os.environ.get("REGENT_CHAOS_RESTART", "permanent")
    if kind == "none":
        return None
    return RestartPolicy(restart=kind, max_restarts=1000, window_s=1.0, backoff_max_s=0.2,
                         restart_timeout_s=20.0, on_host_lost=os.environ.get("REGENT_CHAOS_ON_HOST_LOST", "escalate"))


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
            on_hosts = int(env.get("REGENT_CHAOS_HOSTS", "0"))  # one proc on each of N cluster hosts
            if on_hosts:
                procs = s.host_mesh(hosts=on_hosts).spawn_procs(per_host={"procs": 1})
                n_procs = on_hosts
            else:
                procs = s.spawn_procs(per_host={"procs": n_procs})
            w = procs.spawn("w", Echo, env["REGENT_CHAOS_LEDGER"], delay_s, restart=_policy())
            state_dir = os.path.join(env["REGENT_CHAOS_LEDGER"], "registers", s.sid)
            kv = procs.spawn("kv", Register, env["REGENT_CHAOS_LEDGER"], state_dir, restart=_policy())
            work = Workload(s, w, n_procs, timeout_s, payload)
            registers = Registers(s, kv, n_procs, timeout_s, HistoryLog.from_env(s.sid), work.retries)
            out, kv_out = [], []
            for i in range(steps):
                out.append(work.step(i))
                kv_out.append(registers.step(i))
                if not s.replaying:
                    print(f"step {i}", file=sys.stderr, flush=True)
                    if pace_s:
                        time.sleep(pace_s)
            # A last call on every actor: per-sender FIFO puts every broadcast before it.
            out.append(work.attempt("final", lambda tok: w.square.call(tok, -1).get(timeout=timeout_s).values()))
            kv_out.append([registers.call(f"final-k{j}", "get", f"k{j}") for j in range(KEYS)])
            print(json.dumps({"out": out, "kv": kv_out, "retries": work.retries, "stats": s.stats, "role": s.role,
                              "sid": s.sid}), flush=True)
    except LeadershipLost as e:
        print(f"deposed: {e}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
