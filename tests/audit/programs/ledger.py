"""A small journaled program for audit tests: calls, broadcasts, errors, values the session
journals, and checkpoints. REGENT_AUDIT_CHANGE_AT=k changes the amount posted at step k
(the "code change" an audit must catch)."""

from __future__ import annotations

import json
import os
import sys
import time

from regent.controller import ActorError, Session
from regent.worker import Actor, endpoint


class Ledger(Actor):
    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []

    @endpoint
    def post(self, step: int, amount: int) -> int:
        self.entries.append((step, amount))
        return amount

    @endpoint
    def refuse(self, step: int) -> None:
        raise ValueError(f"step {step} refused")

    @endpoint
    def count(self) -> int:
        return len(self.entries)


def main() -> None:
    steps = int(os.environ.get("REGENT_TEST_STEPS", "30"))
    change_at = int(os.environ.get("REGENT_AUDIT_CHANGE_AT", "-1"))
    delay = float(os.environ.get("REGENT_TEST_DELAY", "0"))
    with Session(os.environ["REGENT_TEST_SESSION"], journal=os.environ.get("REGENT_TEST_JOURNAL") or None,
                 lease_ttl_s=1.0) as s:
        if os.environ.get("REGENT_TEST_LEADER_FILE"):
            with open(os.environ["REGENT_TEST_LEADER_FILE"], "a") as f:
                f.write(f"{os.getpid()}\n")
        started = s.now()
        ledger = s.spawn_procs(per_host={"procs": 2}).spawn("ledger", Ledger)
        clerk = ledger.slice(procs=0)
        state = s.resume({"step": 0, "sum": 0, "refused": 0, "salt": s.random()})
        while state["step"] < steps:
            i = state["step"]
            amount = i + 1000 if i == change_at else i
            state["sum"] += sum(ledger.post.call(i, amount).get().values())
            if i % 5 == 2:
                ledger.post.broadcast(i, 0)
            if i % 7 == 3:
                try:
                    clerk.refuse.call_one(i).get()
                except ActorError:
                    state["refused"] += 1
            state["step"] += 1
            if state["step"] % 10 == 0:
                s.checkpoint(state)
            if not s.replaying:
                print(f"step {i}", file=sys.stderr, flush=True)
                time.sleep(delay)
        counts = ledger.count.call().get().values()
        print(json.dumps({"state": state, "counts": counts, "started": started, "stats": s.stats}), flush=True)


if __name__ == "__main__":
    main()
