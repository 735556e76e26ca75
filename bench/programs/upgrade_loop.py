"""The controller program of bench/bench_upgrade.py: journals BENCH_CALLS calls (pipelined),
then makes one call every BENCH_PACE_S until BENCH_STOP exists. BENCH_VERSION=v2 adds a call per
step behind s.patched, as an upgraded program would. Each process notes its first live call of
the loop in BENCH_MARKS (a JSON line: pid, version, time.time())."""

from __future__ import annotations

import json
import os
import time

from regent.controller import Session
from regent.worker import Actor, endpoint


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n


def main() -> None:
    calls = int(os.environ["BENCH_CALLS"])
    pace_s = float(os.environ.get("BENCH_PACE_S", "0.005"))
    version = os.environ.get("BENCH_VERSION", "v1")
    stop = os.environ["BENCH_STOP"]
    with Session(os.environ["BENCH_SESSION"], journal=os.environ["BENCH_JOURNAL"], lease_ttl_s=2.0) as s:
        c = s.spawn_procs(per_host={"procs": 1}).spawn("c", Counter)
        for start in range(0, calls, 1000):
            for f in [c.incr.call_one() for _ in range(min(1000, calls - start))]:
                f.get()
        marked = False
        while not os.path.exists(stop):
            c.incr.call_one().get()
            # Replay ends with the first call past the journal: this one was live if it is over.
            if not marked and not s.replaying:
                marked = True
                with open(os.environ["BENCH_MARKS"], "a") as f:
                    f.write(json.dumps({"pid": os.getpid(), "version": version, "t": time.time()}) + "\n")
            if version == "v2" and s.patched("bench-v2"):
                c.incr.call_one().get()
            if not s.replaying:  # a replay (a standby's, or the upgrade's check) runs at full speed
                time.sleep(pace_s)


if __name__ == "__main__":
    main()
