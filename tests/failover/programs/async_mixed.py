"""An asyncio controller program for failover tests, run through `s.run`.

Tasks at different speeds share the session: two call loops on their own actors, a producer
and a consumer on an asyncio.Queue, a fan-out read with as_completed, a wait_for deadline that
expires on a slow call, and sleeps. Each task's observations go, in the order the program saw
them, to $REGENT_TEST_OBS_DIR/<pid>.obs; a line is written once a later call has been issued
(the session makes that call wait until what the program saw before it is durable), so a
killed primary's file holds only what any standby must see again. Configured like mixed.py
(REGENT_TEST_SESSION, _JOURNAL, _STEPS, _LEADER_FILE, _TTL, _STEP_S); REGENT_TEST_CHANGE_AT makes the
fast loop call another endpoint at that step; REGENT_TEST_HOLD_FILE makes its live steps from
HOLD_AT on wait while that file exists. Prints one JSON line: observations and each
actor's execution counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from common import note_leader, session_from_env

from regent.controller import Session
from regent.worker import Actor, endpoint

PACE_S = float(os.environ.get("REGENT_TEST_STEP_S", "0"))  # a pause after each live fast step
HOLD = os.environ.get("REGENT_TEST_HOLD_FILE")
HOLD_AT = 10


class Worker(Actor):
    """Counts every token it executes, so a checker can prove exactly-once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.seen: dict[str, int] = {}

    @endpoint
    async def work(self, token: str, x: int) -> int:
        self.seen[token] = self.seen.get(token, 0) + 1
        await asyncio.sleep(self.delay)
        return len(self.seen) * x

    @endpoint
    def report(self) -> dict[str, int]:
        return dict(self.seen)


class Observations:
    """What the program saw, in order; written out only behind a call issued after it."""

    def __init__(self, path: str | None):
        self.seen: list = []
        self._written = 0
        self._file = open(path, "a") if path else None  # noqa: SIM115 - closed at exit

    def saw(self, *what: object) -> None:
        self.seen.append(list(what))

    def issued(self) -> None:
        if self._file is None:
            return
        for item in self.seen[self._written:]:
            self._file.write(json.dumps(item) + "\n")
        self._file.flush()
        self._written = len(self.seen)


async def program(s: Session, fast, slow, nap, steps: int, change_at: int, obs: Observations) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=4)

    def call(mesh, endpoint: str, token: str, x: int):
        fut = getattr(mesh, endpoint).call_one(token, x)
        obs.issued()
        return fut

    async def fast_loop() -> None:
        for i in range(steps):
            token = f"changed{i}" if i == change_at else f"f{i}"
            obs.saw("f", i, await call(fast, "work", token, 1))
            if i % 5 == 4:
                await asyncio.sleep(0.002)
            await queue.put(i)
            if not s.replaying:
                print(f"step {i}", file=sys.stderr, flush=True)
                time.sleep(PACE_S)  # blocks the loop: a live run a test can catch midway
                while HOLD and i >= HOLD_AT and os.path.exists(HOLD):  # however loaded the machine
                    time.sleep(0.02)
        await queue.put(-1)

    async def slow_loop() -> None:
        for i in range(steps // 3):
            obs.saw("s", i, await call(slow, "work", f"s{i}", 2))

    async def consumer() -> None:
        while (i := await queue.get()) >= 0:
            obs.saw("q", i)
            if i % 10 == 9:
                fan = [call(m, "work", f"a{i}.{n}", 3) for n, m in enumerate((fast, slow))]
                for f in asyncio.as_completed(fan):
                    obs.saw("a", i, await f)
            if i % 15 == 14:
                try:
                    obs.saw("d", i, await asyncio.wait_for(call(nap, "work", f"n{i}", 4), timeout=0.005))
                except TimeoutError:
                    obs.saw("d", i, "timeout")

    t0 = asyncio.get_running_loop().time()
    await asyncio.gather(fast_loop(), slow_loop(), consumer())
    obs.saw("clock", asyncio.get_running_loop().time() >= t0)


def main() -> None:
    steps = int(os.environ.get("REGENT_TEST_STEPS", "60"))
    change_at = int(os.environ.get("REGENT_TEST_CHANGE_AT", "-1"))
    obs_dir = os.environ.get("REGENT_TEST_OBS_DIR")
    obs = Observations(os.path.join(obs_dir, f"{os.getpid()}.obs") if obs_dir else None)
    with session_from_env() as s:
        note_leader()
        procs = s.spawn_procs(per_host={"procs": 3})
        fast = procs.slice(procs=0).spawn("fast", Worker, 0.001)
        slow = procs.slice(procs=1).spawn("slow", Worker, 0.004)
        nap = procs.slice(procs=2).spawn("nap", Worker, 0.05)
        s.run(program(s, fast, slow, nap, steps, change_at, obs))
        reports = [m.report.call_one().get() for m in (fast, slow, nap)]
        obs.issued()
        print(json.dumps({"out": obs.seen, "reports": reports, "stats": s.stats, "role": s.role}), flush=True)


if __name__ == "__main__":
    main()
