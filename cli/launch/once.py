"""`regent launch once --cluster C --store URL -- COMMAND...`: run a controller program once
per cluster, under a scheduler that restarts whatever exits (a Kubernetes Deployment).

It runs COMMAND; a controller deposed or killed (another carries the run on) is started
again, as a standby; one that ends the run records its status in the store (the first to do
so wins) and then idles, as does every controller that finds the end recorded, whether it
was running (a standby, stopped) or starting. SIGTERM ends it (and its program).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from regent.cli.launch.common import ended_the_run, say

PROG = "regent launch once"


def once(cluster: str, store: str, command: list[str], idle: bool = True, poll_s: float = 1.0) -> int:
    from regent.journal import open_journal
    from regent.journal.hosts import end_run, run_ended

    if not command:
        print(f"{PROG}: give the program to run after --", file=sys.stderr)
        return 2
    me = f"{socket.gethostname()}:{os.getpid()}"
    stopping = threading.Event()
    child: list[subprocess.Popen] = []

    def terminate(signum: int, frame: object) -> None:
        stopping.set()
        for p in child:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminate)
    journal = open_journal(store)
    try:
        while not stopping.is_set():
            ended = run_ended(journal.backend, cluster)
            if ended is None:
                child[:] = [subprocess.Popen(command)]
                while child[0].poll() is None and not stopping.is_set():
                    ended = run_ended(journal.backend, cluster)
                    if ended is not None:  # another controller ended the run: this one stood by
                        child[0].kill()
                        break
                    stopping.wait(poll_s)
                code = child[0].wait()
                if ended is None and not stopping.is_set():
                    if not ended_the_run(code, others_running=True):
                        say(PROG, f"the controller exited {code} (deposed or killed); starting it again as a standby")
                        time.sleep(1.0)
                        continue
                    ended = end_run(journal.backend, cluster, code, by=me)
            if ended is None:
                break
            say(PROG, f"the run of cluster {cluster} ended with status {ended['status']} ({ended['by']}); "
                      "idling so that it is not started again (delete the deployment to finish)")
            if not idle:
                return int(ended["status"])
            while not stopping.is_set():
                stopping.wait(3600)
        return 0
    finally:
        journal.close()
