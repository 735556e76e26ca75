"""A controller program for the unhandled-fault failover test. An unsupervised mesh loses a
member (its proc SIGKILLs itself), then a supervised mesh allowed one restart fails twice and escalates; after
each, the program polls `s.now()` until its `on_unhandled_fault` hook has run, and counts the
polls. REGENT_TEST_HOLD (the primary): "after", once both faults reached the hook, print what
it saw and "holding" to stderr and wait to be killed; "before", the same right after the first
member died, before the program made a call that could hand the fault over. A standby takes
over, replays, carries on and prints one JSON line: the faults its hook got, in order, the poll
counts, and what a call to the escalated mesh got.

Configured by environment as tests/failover/programs/mixed.py is (REGENT_TEST_SESSION,
REGENT_TEST_JOURNAL, REGENT_TEST_LEADER_FILE, REGENT_TEST_TTL).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from regent.controller import MeshFailure, RestartPolicy, Session, SupervisionError
from regent.worker import Actor, endpoint


class Victim(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


faults: list[list] = []


def hook(failure: MeshFailure) -> None:
    faults.append([failure.mesh, failure.rank, failure.kind, failure.point["procs"]])


def hold(s: Session, polls: list[int]) -> None:
    print("saw " + json.dumps({"faults": faults, "polls": polls}), file=sys.stderr, flush=True)
    print("holding", file=sys.stderr, flush=True)
    time.sleep(600)


def poll_until(s: Session, n: int) -> int:
    polls = 0
    while len(faults) < n:
        s.now()  # the hook runs inside one of these, on this thread
        polls += 1
        time.sleep(0.02)
    return polls


def main() -> None:
    held = os.environ.get("REGENT_TEST_HOLD")
    with Session(os.environ["REGENT_TEST_SESSION"], journal=os.environ["REGENT_TEST_JOURNAL"],
                 lease_ttl_s=float(os.environ.get("REGENT_TEST_TTL", "1.0")), on_unhandled_fault=hook) as s:
        with open(os.environ["REGENT_TEST_LEADER_FILE"], "a") as f:
            f.write(f"{os.getpid()}\n")
        u = s.spawn_procs(per_host={"procs": 2}).spawn("u", Victim)
        # One restart allowed: a standby that forgot the escalation would restart it once more.
        e = s.spawn_procs(per_host={"procs": 1}).spawn("e", Victim, restart=RestartPolicy(max_restarts=1,
                                                                                           window_s=120))
        try:
            u.slice(procs=1).die.call_one().get(timeout=30)
        except SupervisionError:
            pass
        if held == "before":
            hold(s, [])
        polls = [poll_until(s, 1)]
        try:
            e.die.call_one().get(timeout=30)
        except SupervisionError:
            pass
        for _ in range(200):  # restarted (each failed try is journaled: a replay retries as often)
            try:
                e.pid.call_one().get(timeout=30)
                break
            except SupervisionError:
                time.sleep(0.05)
        try:
            e.die.call_one().get(timeout=30)  # its second failure in the window escalates
        except SupervisionError:
            pass
        polls.append(poll_until(s, 2))
        if held == "after":
            hold(s, polls)
        u.slice(procs=0).pid.call_one().get(timeout=10)  # the survivor serves on
        try:
            e.pid.call_one().get(timeout=10)
            escalated = "served"
        except SupervisionError as x:
            escalated = "escalated" if "restart intensity" in str(x) else str(x)
        s.now()
        print(json.dumps({"faults": faults, "polls": polls, "e": escalated, "role": s.role}), flush=True)


if __name__ == "__main__":
    main()
