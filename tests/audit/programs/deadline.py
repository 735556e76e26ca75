"""A program whose stream passes its deadline: the audit replay must raise the
TimeoutError where the live run did, after the same values. Prints one JSON line."""

from __future__ import annotations

import json
import os
import time

from regent.controller import Session
from regent.worker import Actor, current_rank, endpoint


class Sleeper(Actor):
    @endpoint
    def nap(self, s: float) -> int:
        time.sleep(s * current_rank()["procs"])
        return current_rank()["procs"]


with Session(os.environ["REGENT_TEST_SESSION"], journal=os.environ["REGENT_TEST_JOURNAL"]) as s:
    sleepers = s.spawn_procs(per_host={"procs": 3}).spawn("sleepers", Sleeper)
    seen, timed_out = [], False
    try:
        for _point, rank in sleepers.nap.stream(0.4).iter(timeout=0.2):  # ranks 0 (0 s) in, 2 (0.8 s) not
            seen.append(rank)
    except TimeoutError:
        timed_out = True
    after = sorted(v for _, v in sleepers.nap.stream(0.0))
    print(json.dumps({"seen": seen, "timed_out": timed_out, "after": after}), flush=True)
