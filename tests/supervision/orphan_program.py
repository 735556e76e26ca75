"""A controller that spawns procs, reports their pids, then idles until killed."""

import json
import os
import sys
import time

from regent.controller import Session
from regent.worker import Actor, endpoint


class Idle(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


with Session(sys.argv[1], orphan_timeout_s=float(sys.argv[2]), lease_ttl_s=1.0) as s:
    mesh = s.spawn_procs(per_host={"procs": 2}).spawn("idle", Idle)
    print(json.dumps({"pids": mesh.pid.call().get().values(), "leader": os.getpid()}), flush=True)
    time.sleep(float(sys.argv[3]))
