"""A program for the host-replacement failover tests: a 2-host data-parallel job (a process
group, a one_for_all mesh that replaces lost hosts) that retries a step a supervision error
interrupted. Prints "step N" live on stderr; ends with one JSON line of what it observed."""

from __future__ import annotations

import json
import os
import sys
import time

from common import note_leader, session_from_env

from regent import RestartPolicy, SupervisionError
from regent.worker import Actor, context, endpoint
from regent.worker.procinfo import host_agent_of


class Trainer(Actor):
    @endpoint
    def step(self, i: int) -> tuple[float, int]:
        import torch
        import torch.distributed as dist

        t = torch.full((4,), float(context().rank + 1))
        dist.all_reduce(t)
        return float(t[0]), host_agent_of(os.getpid())  # its parent, or its zygote's


steps = int(os.environ.get("REGENT_TEST_STEPS", "8"))
pause_s = float(os.environ.get("REGENT_TEST_STEP_S", "0"))
policy = RestartPolicy(strategy="one_for_all", on_host_lost="replace", max_restarts=20, window_s=120,
                       restart_timeout_s=120)
with session_from_env() as s:
    note_leader()
    procs = s.host_mesh(hosts=2, cluster="loop").spawn_procs(per_host={"procs": 1})
    procs.init_process_group(backend="gloo")
    trainers = procs.spawn("t", Trainer, restart=policy)
    seen: list = []
    step = 0
    while step < steps:
        try:
            values = trainers.step.call(step).get(timeout=180).values()
        except SupervisionError as e:
            seen.append(["error", step, e.reason])
            continue
        seen.append(["ok", step, [v[0] for v in values]])
        if not s.replaying:
            print(f"step {step}", file=sys.stderr, flush=True)
            time.sleep(pause_s)  # a step's compute: the test's faults land in a run still going
        step += 1
    parents = [v[1] for v in trainers.step.call(step).get(timeout=180).values()]
    print(json.dumps({"seen": seen, "parents": parents, "stats": s.stats}), flush=True)
