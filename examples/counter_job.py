"""A small job for the failover demo: counters driven for a number of steps.

Run it twice with the same session name (e.g. `regent run examples/counter_job.py
--standby 1`): one process leads, the other stands by; kill the leader and the
standby finishes the job without running any call twice.
"""

from __future__ import annotations

import json
import os
import sys
import time

from regent import Actor, Session, endpoint


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0
        self.calls = 0

    @endpoint
    def add(self, x: int) -> int:
        self.calls += 1
        self.n += x
        time.sleep(0.01)
        return self.n

    @endpoint
    def stats(self) -> dict:
        return {"n": self.n, "calls": self.calls}


def main() -> None:
    name = os.environ.get("REGENT_DEMO_SESSION", "counter-job")
    steps = int(os.environ.get("REGENT_DEMO_STEPS", "60"))
    with Session(name, journal=os.environ.get("REGENT_JOURNAL"), lease_ttl_s=1.0) as s:
        marker = os.environ.get("REGENT_DEMO_LEADER_FILE")
        if marker:
            with open(marker, "a") as f:
                f.write(f"{os.getpid()} {time.time()}\n")
        counters = s.spawn_procs(per_host={"procs": 4}).spawn("counters", Counter)
        total = 0
        for step in range(steps):
            total = sum(counters.add.call(step).get().values())
            if not s.replaying:
                print(f"step {step + 1}/{steps} total={total}", file=sys.stderr, flush=True)
        stats = counters.stats.call().get().values()
        print(json.dumps({"total": total, "actors": stats, "role": s.role, "stats": s.stats,
                          "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
