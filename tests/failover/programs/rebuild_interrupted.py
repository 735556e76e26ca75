"""A program for the interrupted-rebuild test: two supervised meshes on one proc. When the
test kills the proc, the leader replaces it and rebuilds "w" first, which takes seconds; the
test kills the leader then, before it rebuilds "kv". The standby takes over with "kv" missing
from the new proc, then (after the go file appears) calls both. Prints one JSON line."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from common import note_leader, session_from_env

from regent.controller import SupervisionError
from regent.worker import Actor, context, endpoint


class Slow(Actor):
    def __init__(self, flag: str) -> None:
        if context().incarnation > 0:  # a rebuild: long enough for the test to kill the leader
            Path(flag).touch()
            time.sleep(3)

    @endpoint
    def info(self) -> tuple[int, int]:
        return os.getpid(), context().incarnation


class Member(Actor):
    @endpoint
    def info(self) -> tuple[int, int]:
        return os.getpid(), context().incarnation


with session_from_env() as s:
    note_leader()
    procs = s.spawn_procs(per_host={"procs": 1})
    w = procs.spawn("w", Slow, os.environ["REGENT_TEST_FLAG_FILE"], restart="permanent")
    kv = procs.spawn("kv", Member, restart="permanent")
    before = kv.info.call_one().get(timeout=10)
    s.now()  # durable, and durability comes in journal order: the journal holds all of the above
    if not s.replaying:
        print(f"proc {before[0]}\nstep 0", file=sys.stderr, flush=True)
    go = Path(os.environ["REGENT_TEST_GO_FILE"])
    while not go.exists():
        time.sleep(0.02)
    failures, after = [], None
    for _ in range(40):
        try:
            after = kv.info.call_one().get(timeout=10)
            break
        except SupervisionError as e:
            failures.append(str(e)[:300])
            time.sleep(0.1)
    w_after = w.info.call_one().get(timeout=10)
    print(json.dumps({"before": before, "after": after, "w_after": w_after, "failures": failures,
                      "role": s.role}), flush=True)
