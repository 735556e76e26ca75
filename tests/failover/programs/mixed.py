"""A controller program for failover tests: mixed calls, spawns and observations.

Configured by environment: REGENT_TEST_JOURNAL, REGENT_TEST_SESSION, REGENT_TEST_STEPS,
REGENT_TEST_LEADER_FILE (this process appends its pid when it leads), REGENT_TEST_STEP_S (a pause
after each live step), REGENT_TEST_HOLD_FILE (live steps from 3 on wait while it exists), REGENT_TEST_CHANGE_AT
(make a different call at that step: a program edited mid-session).
Prints one JSON line: the program's observations and each actor's execution counts.
"""

from __future__ import annotations

import json
import os
import sys
import time

from common import note_leader, session_from_env

from regent.worker import Actor, endpoint

PRINT = os.environ.get("REGENT_TEST_PRINT") == "1"


class Worker(Actor):
    """Counts every token it executes, so a checker can prove exactly-once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.seen: dict[str, int] = {}
        self.total = 0

    def _note(self, token: str) -> None:
        self.seen[token] = self.seen.get(token, 0) + 1
        if PRINT:  # output a controller forwards: REGENT_TEST_PRINT=1
            print(f"ran {token}", file=sys.stderr, flush=True)

    @endpoint
    def work(self, token: str, x: int) -> int:
        self._note(token)
        self.total += x
        time.sleep(self.delay)
        return self.total

    @endpoint
    def square(self, token: str, x: int) -> int:
        self._note(token)
        time.sleep(self.delay)
        return x * x

    @endpoint
    def report(self) -> dict[str, int]:
        return dict(self.seen)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def main() -> None:
    steps = int(os.environ.get("REGENT_TEST_STEPS", "40"))
    change_at = int(os.environ.get("REGENT_TEST_CHANGE_AT", "-1"))
    # A pause after each live step (results do not depend on it): a run a test can catch midway.
    pace_s = float(os.environ.get("REGENT_TEST_STEP_S", "0"))
    hold = os.environ.get("REGENT_TEST_HOLD_FILE")
    with session_from_env() as s:
        note_leader()
        # REGENT_TEST_HOSTS: the three actors on three hosts of $REGENT_CLUSTER, one each.
        on_hosts = os.environ.get("REGENT_TEST_HOSTS")
        if on_hosts:
            procs = s.host_mesh(hosts=int(on_hosts)).spawn_procs(per_host={"procs": 1})
        else:
            procs = s.spawn_procs(per_host={"procs": 3})
        dim = "hosts" if on_hosts else "procs"
        w = procs.spawn("w", Worker, 0.002)
        out: list = []
        started = s.now()
        for i in range(steps):
            k = i % 5
            if i == change_at:
                out.append(w.work.call(f"changed{i}", 999).get().values())
            elif k == 0:
                out.append(w.work.call(f"c{i}", i).get().values())
            elif k == 1:
                w.work.broadcast(f"b{i}", i)
            elif k == 2:
                out.append(w.square.choose(f"h{i}", i).get())
            elif k == 3:
                out.append(sorted(v for _, v in w.work.stream(f"s{i}", i)))
            else:
                out.append(w.slice(**{dim: i % 3}).work.call_one(f"o{i}", 1).get() >= 0)
            if not s.replaying:
                print(f"step {i}", file=sys.stderr, flush=True)
                time.sleep(pace_s)
                # REGENT_TEST_HOLD_FILE: from step 3 on, the live run waits while that file exists,
                # so a test's kill lands mid-run however loaded the machine (it removes the file).
                while hold and i >= 3 and os.path.exists(hold):
                    time.sleep(0.02)
        reports = w.report.call().get().values()
        pids = w.pid.call().get().values()
        elapsed_known = s.now() >= started
        print(json.dumps({"out": out, "reports": reports, "pids": pids, "clock_ok": elapsed_known,
                          "stats": s.stats, "role": s.role}), flush=True)


if __name__ == "__main__":
    main()
