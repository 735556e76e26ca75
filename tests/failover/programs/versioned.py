"""A controller program in several versions, for tests of changing a running program.

REGENT_TEST_VERSION: v1 adds 1 per step; v2 also adds 10 per step behind s.patched("extra");
v3 adds 2 instead of 1 with no marker (an incompatible change); v4 has dropped v1's branch
(s.deprecate_patch("extra")); v2-async runs v2's steps in two tasks of s.run. The rest as
mixed.py: REGENT_TEST_SESSION, _JOURNAL, _STEPS, _LEADER_FILE, _STEP_S, _HOLD_FILE (live steps
from _HOLD_AT, default 3, on wait while it exists). Prints one JSON line: the counter's total and what it ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from common import note_leader, session_from_env

from regent.worker import Actor, RestartPolicy, endpoint


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0
        self.ran: list[str] = []

    @endpoint
    def add(self, tag: str, k: int) -> int:
        self.n += k
        self.ran.append(tag)
        return self.n

    @endpoint
    def report(self) -> tuple[int, list[str], int]:
        return self.n, self.ran, os.getpid()


def main() -> None:
    version = os.environ["REGENT_TEST_VERSION"]
    steps = int(os.environ.get("REGENT_TEST_STEPS", "20"))
    pace_s = float(os.environ.get("REGENT_TEST_STEP_S", "0"))
    hold = os.environ.get("REGENT_TEST_HOLD_FILE")
    hold_at = int(os.environ.get("REGENT_TEST_HOLD_AT", "3"))
    with session_from_env() as s:
        note_leader()
        # REGENT_TEST_RESTART=1: the counter is restarted if its proc dies (its count starts over).
        policy = RestartPolicy(restart="permanent") if os.environ.get("REGENT_TEST_RESTART") == "1" else None
        c = s.spawn_procs(per_host={"procs": 1}).spawn("c", Counter, restart=policy)

        def extra() -> bool:
            if version == "v4":
                s.deprecate_patch("extra")
                return True
            return version.startswith("v2") and s.patched("extra")

        def after(i: int) -> None:
            if not s.replaying:
                print(f"step {i}", file=sys.stderr, flush=True)
                time.sleep(pace_s)
                while hold and i >= hold_at and os.path.exists(hold):
                    time.sleep(0.02)

        if version == "v2-async":
            async def task(name: str, ids: range) -> None:
                for i in ids:
                    await c.add.call_one(f"{name}{i}", 1)
                    if extra():
                        await c.add.call_one(f"x{name}{i}", 10)

            async def both() -> None:
                await asyncio.gather(task("a", range(0, steps, 2)), task("b", range(1, steps, 2)))

            s.run(both())
        else:
            for i in range(steps):
                c.add.call_one(f"a{i}", 2 if version == "v3" else 1).get()
                if extra():
                    c.add.call_one(f"x{i}", 10).get()
                after(i)
        n, ran, pid = c.report.call_one().get()
        print(json.dumps({"n": n, "ran": ran, "pid": pid, "role": s.role, "version": version}), flush=True)


if __name__ == "__main__":
    main()
