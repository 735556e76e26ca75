"""A program that reads a result too large for the journal (a digest only), then dies.

MODE=primary: read it, make sure its record is durable, and die (os._exit) leaving the
proc alive. MODE=primary-kill-proc: the same, but SIGKILL the proc first (a permanent restart
policy brings a new one, whose value differs). MODE=standby: run the program again; it
prints the digest of what it read, or the error that stopped it. BLOB=tensor: the result is a
4 MiB CPU tensor (through shared memory between the proc and its controller, wire.bulk);
MODE=primary-outstanding: the primary dies (SIGKILL) while that result is still being made.
The proc's pid is printed (PROC pid) so a test can look for what it left in /dev/shm."""

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

    @endpoint
    def tensor_blob(self, delay_s: float) -> object:
        import time

        import torch

        time.sleep(delay_s)
        return torch.randint(0, 255, (4 << 20,), dtype=torch.uint8)


def main() -> None:
    mode = os.environ["MODE"]
    print("PID", os.getpid(), flush=True)
    with Session(os.environ["SESSION"], journal=os.environ["JOURNAL"], lease_ttl_s=1.0) as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("b", Blob, restart="permanent")
        pid = mesh.pid.call_one().get()
        print("PROC", pid, flush=True)
        try:
            if os.environ.get("BLOB") == "tensor":
                fut = mesh.tensor_blob.call_one(float(os.environ.get("DELAY", "0")))
                if mode == "primary-outstanding":  # its call durable, its result not yet made
                    s.writer.flush(timeout=10)
                    os.kill(os.getpid(), signal.SIGKILL)
                data = fut.get(timeout=60).numpy().tobytes()
            else:
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
