"""A program for the hollow-host failover test: one mesh over the cluster's hosts (hollow and
real), each step a mesh-wide call, an actor's call to its neighbours on the same host, and a
broadcast, and an Accumulator folded on each host. Prints "step N" live on stderr; ends with one JSON line of what it observed."""

from __future__ import annotations

import json
import operator
import os
import sys
import time

from common import note_leader, session_from_env

from regent.worker import Accumulator, Actor, endpoint


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0
        self.heard = 0

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def hear(self) -> None:
        self.heard += 1

    @endpoint
    def state(self) -> tuple[int, int, int]:
        return self.n, self.heard, os.getpid()

    @endpoint
    def incr_all(self, mesh: object) -> int:
        """A sync endpoint waiting on a call to a mesh (its host's other actors)."""
        return sum(mesh.incr.call().get(timeout=60).values())


steps = int(os.environ.get("REGENT_TEST_STEPS", "8"))
hosts = int(os.environ.get("REGENT_TEST_HOSTS", "2"))
per_host = int(os.environ.get("REGENT_TEST_PROCS", "4"))
with session_from_env() as s:
    note_leader()
    procs = s.host_mesh(hosts=hosts, cluster="loop").spawn_procs(per_host={"procs": per_host})
    counters = procs.spawn("c", Counter)
    others = procs.spawn("o", Counter)
    folded = procs.spawn("f", Counter)
    fold = Accumulator(folded.incr, 0, operator.add, on_host=True)
    seen = []
    for step in range(steps):
        values = counters.incr.call().get(timeout=60).values()
        total = counters.slice(hosts=0, procs=0).incr_all.call_one(others.slice(hosts=0)).get(timeout=60)
        counters.hear.broadcast()
        seen.append([step, values, total, fold.accumulate().get(timeout=60)])
        if not s.replaying:
            print(f"step {step}", file=sys.stderr, flush=True)
            time.sleep(0.1)
    final = counters.state.call().get(timeout=60).values()
    folds = folded.state.call().get(timeout=60).values()
    print(json.dumps({"seen": seen, "final": final, "folds": folds, "stats": s.stats}), flush=True)
