"""A controller program for the concurrent-endpoint failover test: a concurrent `wait` that
only a later call opens. REGENT_TEST_HOLD=1 (the primary): once the proc runs the wait, print
"holding" and wait to be killed. A standby takes over, sends the wait again under its id, opens
the gate and prints one JSON line: the wait's value and how many times the actor ran it.

Configured by environment as tests/failover/programs/mixed.py is (REGENT_TEST_SESSION,
REGENT_TEST_JOURNAL, REGENT_TEST_LEADER_FILE, REGENT_TEST_TTL).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from regent.controller import Session
from regent.worker import Actor, concurrent_endpoint, endpoint


class Gate(Actor):
    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.waits = 0

    @concurrent_endpoint
    async def wait(self) -> str:
        self.waits += 1
        await self.opened.wait()
        return f"opened after {self.waits} wait(s)"

    @endpoint
    def waiting(self) -> int:
        return self.waits

    @endpoint
    def open(self) -> None:
        self.opened.set()


def main() -> None:
    with Session(os.environ["REGENT_TEST_SESSION"], journal=os.environ["REGENT_TEST_JOURNAL"],
                 lease_ttl_s=float(os.environ.get("REGENT_TEST_TTL", "1.0"))) as s:
        with open(os.environ["REGENT_TEST_LEADER_FILE"], "a") as f:
            f.write(f"{os.getpid()}\n")
        gate = s.spawn_procs(per_host={"procs": 1}).spawn("gate", Gate)
        waited = gate.wait.call_one()
        assert gate.waiting.call_one().get(timeout=10) == 1  # it runs: the mailbox went on
        if os.environ.get("REGENT_TEST_HOLD") == "1":
            print("holding", file=sys.stderr, flush=True)
            time.sleep(600)
        gate.open.call_one().get(timeout=10)
        value = waited.get(timeout=10)
        print(json.dumps({"wait": value, "runs": gate.waiting.call_one().get(timeout=10), "role": s.role}),
              flush=True)


if __name__ == "__main__":
    main()
