"""What an idle controller costs: a session with a mesh up and nothing called, its process's CPU
over a while (cores), and how often its IO thread woke (where the runtime counts it).

    .venv/bin/python bench/bench_idle.py [--procs 4] [--seconds 5] [--journal off|sqlite|URL]

One JSON object goes to stdout. It asserts nothing. To compare with an older commit, import that
commit's regent instead: `PYTHONPATH=/path/to/worktree .venv/bin/python bench/bench_idle.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench_core import cpu_seconds, private_regent_home  # noqa: E402

from regent.controller import Session  # noqa: E402
from regent.worker import Actor, endpoint  # noqa: E402


class Echo(Actor):
    @endpoint
    def echo(self, i: int) -> int:
        return i


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--journal", default="off", help="off, sqlite (a temporary file) or a journal URL")
    args = p.parse_args()
    os.environ.setdefault("REGENT_HIPCORE_BACKEND", "cpu")
    with private_regent_home(), tempfile.TemporaryDirectory() as tmp:
        journal = f"sqlite://{Path(tmp) / 'j.db'}" if args.journal == "sqlite" else args.journal
        with Session(f"idle-{os.getpid()}", journal=journal) as s:
            mesh = s.spawn_procs(per_host={"procs": args.procs}).spawn("e", Echo)
            mesh.echo.call(1).get(timeout=60)
            time.sleep(1.0)  # past the call's wake-ups
            passes0 = getattr(s.runtime, "io_passes", None)
            cpu0, t0 = cpu_seconds(), time.perf_counter()
            time.sleep(args.seconds)
            elapsed = time.perf_counter() - t0
            cores = (cpu_seconds() - cpu0) / elapsed
            passes = getattr(s.runtime, "io_passes", None)
    print(json.dumps({"bench": "idle", "procs": args.procs, "journal": args.journal.split(":", 1)[0],
                      "seconds": round(elapsed, 2), "controller_idle_cores": round(cores, 4),
                      "io_wakeups_per_s": None if passes is None else round((passes - passes0) / elapsed, 1)}))


if __name__ == "__main__":
    main()
