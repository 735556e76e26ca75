"""A program for the lost-host test: a first mesh whose host agent and procs will be
gone when a standby takes over, then (after the go file appears) a second mesh.
Prints one JSON line."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from common import note_leader, session_from_env

from regent.worker import Actor, endpoint


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x + 1


with session_from_env() as s:
    note_leader()
    first = s.spawn_procs(per_host={"procs": 2}).spawn("first", Echo)
    before = first.ping.call(1).get().values()
    # The test kills the procs with the primary as soon as it reads "step 0": a result read
    # just before is journaled within a linger (JOURNAL_LINGER_S), not at once, and lost with
    # its proc if the kill comes sooner. The test is about the lost host agent, so it has the journal hold
    # what the program read first: s.now() is durable, and durability comes in journal order.
    s.now()
    if not s.replaying:
        print("step 0", file=sys.stderr, flush=True)
    go = Path(os.environ["REGENT_TEST_GO_FILE"])
    while not go.exists():
        time.sleep(0.02)
    second = s.spawn_procs(per_host={"procs": 2}).spawn("second", Echo)
    after = second.ping.call(10).get().values()
    print(json.dumps({"before": before, "after": after, "stats": s.stats}), flush=True)
