"""A program that reads a result too large for the journal (a digest only), then dies.

MODE=primary: read it, make sure its record is durable, and die (os._exit) leaving the
proc alive. MODE=primary-kill-proc: the same, but SIGKILL the proc first (a permanent restart
policy brings a new one, whose value differs). MODE=standby: run the program again; it
prints the digest of what it read, or the error that stopped it."""

from __future__ import annotations

import hashlib
import os
import signal
import sys

from regent.controller import Actor, Session, endpoint
from regent.controller.replay import LostResultError


class Blob(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def blob(self) -> bytes:
        return os.urandom(200_000)


def main() -> None:
    mode = os.environ["MODE"]
    with Session(os.environ["SESSION"], journal=os.environ["JOURNAL"], lease_ttl_s=1.0) as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("b", Blob, restart="permanent")
        pid = mesh.pid.call_one().get()
        try:
            data = mesh.blob.call_one().get()
        except LostResultError as e:
            print("LOST", e, flush=True)
            sys.exit(3)
        print("DIGEST", hashlib.sha256(data).hexdigest(), flush=True)
        if mode.startswith("primary"):
            s.writer.flush(timeout=10)
            if mode == "primary-kill-proc":
                os.kill(pid, signal.SIGKILL)
            os._exit(0)
        print("DONE", s.stats, flush=True)


if __name__ == "__main__":
    main()
