"""A controller program for the re-executed-caller test: a relay actor's call makes a call
to a store, spawns a proc of its own and a store on it and calls that, then holds. The test SIGKILLs the primary and the relay's proc together; the
standby re-runs the relay's call on the restarted relay (at least once: its proc died), which
makes the same call to the store under the same derived id, and the store, whose proc lived,
answers it from its dedupe cache instead of running it again; the host agent gives the re-run
spawn the proc it started the first time, whose store answers from its cache too.

Environment as tests/failover/programs/mixed.py's, plus REGENT_TEST_DIR: where the relay writes
its pid and one line per execution, and the store one line per put it ran.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from regent.controller import Session
from regent.worker import Actor, ActorMeshRef, endpoint, this_host

DIR = Path(os.environ["REGENT_TEST_DIR"])


def _note(name: str, line: str) -> None:
    with open(DIR / name, "a") as f:
        f.write(line + "\n")


class Store(Actor):
    def __init__(self) -> None:
        self.puts = 0

    @endpoint
    def put(self, token: str) -> str:
        self.puts += 1
        _note("store.log", token)
        return f"stored {token} as put {self.puts}"

    @endpoint
    def count(self) -> int:
        return self.puts


class Relay(Actor):
    def __init__(self, store: ActorMeshRef) -> None:
        self.store = store
        (DIR / "relay.pid").write_text(str(os.getpid()))

    @endpoint
    def forward(self, token: str) -> str:
        _note("relay.log", token)
        answer = self.store.put.call_one(token).get(timeout=60)
        mine = this_host().spawn_procs(per_host={"procs": 1})
        _note("spawned.log", mine.keys[0])
        far = mine.spawn("far", Store)
        answer += "; " + far.put.call_one(f"far-{token}").get(timeout=60)
        if not (DIR / "held").exists():  # the first execution holds until it is killed
            (DIR / "held").write_text("")
            time.sleep(600)
        return answer


def main() -> None:
    with Session(os.environ["REGENT_TEST_SESSION"], journal=os.environ["REGENT_TEST_JOURNAL"],
                 lease_ttl_s=float(os.environ.get("REGENT_TEST_TTL", "1.0"))) as s:
        with open(os.environ["REGENT_TEST_LEADER_FILE"], "a") as f:
            f.write(f"{os.getpid()}\n")
        procs = s.spawn_procs(per_host={"procs": 2})
        store = procs.slice(procs=0).spawn("store", Store)
        relay = procs.slice(procs=1).spawn("relay", Relay, store, restart="permanent")
        answer = relay.forward.call_one("t1").get(timeout=120)
        print(json.dumps({"answer": answer, "puts": store.count.call_one().get(timeout=30), "role": s.role}),
              flush=True)


if __name__ == "__main__":
    main()
