"""A long-running loop that checkpoints, so its journal stays bounded and a takeover
resumes from the last checkpoint instead of replaying from the start."""

from __future__ import annotations

import json
import os
import sys
import time

from common import note_leader, session_from_env

from regent.worker import Actor, endpoint


class Acc(Actor):
    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    @endpoint
    def add(self, step: int) -> int:
        self.seen[step] = self.seen.get(step, 0) + 1
        return step * 2

    @endpoint
    def report(self) -> dict[int, int]:
        return self.seen


def main() -> None:
    steps = int(os.environ.get("REGENT_TEST_STEPS", "60"))
    pace_s = float(os.environ.get("REGENT_TEST_STEP_S", "0"))  # a pause after each live step
    hold = os.environ.get("REGENT_TEST_HOLD_FILE")  # live steps after _HOLD_AT wait while it exists
    hold_at = int(os.environ.get("REGENT_TEST_HOLD_AT", "3"))
    with session_from_env() as s:
        note_leader()
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("acc", Acc)
        state = s.resume({"step": 0, "acc": 0})
        while state["step"] < steps:
            state["acc"] += sum(mesh.add.call(state["step"]).get().values())
            mesh.add.broadcast(-1 - state["step"])
            state["step"] += 1
            if state["step"] % 10 == 0:
                s.checkpoint(state)
            if not s.replaying:
                print(f"step {state['step'] - 1}", file=sys.stderr, flush=True)
                time.sleep(pace_s)
                while hold and state["step"] > hold_at and os.path.exists(hold):  # REGENT_TEST_HOLD_FILE
                    time.sleep(0.02)
        print(json.dumps({"acc": state["acc"], "reports": mesh.report.call().get().values(),
                          "stats": s.stats, "session": s.name}), flush=True)


if __name__ == "__main__":
    main()
