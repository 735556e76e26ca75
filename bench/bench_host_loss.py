"""Host loss benchmark (issue #29): from a host's death to the next completed training step,
with a spare and live recovery against a whole-job restart from the last checkpoint (what
TorchElastic does), and the steps each redoes.

    .venv/bin/python bench/bench_host_loss.py [--runs 5] [--steps 40] [--json-out FILE]

Both run examples/train/train.py (the tiny model, data-parallel on 2 loopback hosts of an
SQLite-registered cluster, TTL 1 s) and SIGKILL one host whole (agent and every proc) at a
random step after the first checkpoint file:

- spare: `--hosts 2 --spares 1`: the host is replaced from the spare, the group re-forms,
  the new replica takes a healthy one's state through an RDMA buffer; one controller throughout.
- restart: `--hosts 2` with no spare policy: the job fails; a new job (a new session) is
  started on the hosts still registered, every replica loads the last checkpoint file
  (`--resume-from`), and training goes on from its step.

The figure is the time from the SIGKILL to the first step the job completes on its new membership
(after the spare run's "healed" line; the restarted job's first step); steps redone
are the spare run's step calls retried, and for the restart the steps between the checkpoint
and the step the job had reached. One JSON object goes to stdout; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRAIN = ROOT / "examples" / "train" / "train.py"
sys.path.insert(0, str(ROOT / "examples" / "train"))

from demo import start_agents  # noqa: E402

from regent.chaos import kill_host  # noqa: E402


class Job:
    """One train.py process; its progress lines (with the time each was read) on a queue."""

    def __init__(self, args: list[str], log: Path, env: dict):
        self.proc = subprocess.Popen([sys.executable, str(TRAIN), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        self.log = log
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with open(self.log, "w") as out:
            for line in self.proc.stderr:
                out.write(line)
                if line.startswith("step ") and "/" in line.split()[1]:
                    self.lines.put((time.time(), int(line.split()[1].split("/")[0])))
                elif line.startswith("healed "):
                    self.lines.put((time.time(), -1))  # the replicas healed: the next step is on the new membership
        self.lines.put((time.time(), None))

    def step_line(self, timeout: float = 300.0) -> tuple[float, int | None]:
        return self.lines.get(timeout=timeout)

    def result(self) -> dict | None:
        out = self.proc.stdout.read()
        self.proc.wait(60)
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if self.proc.returncode == 0 and lines else None


def one(mode: str, run: int, steps: int, kill_step: int, workdir: Path, save_every: int) -> dict:
    work = workdir / f"{mode}-{run}"
    work.mkdir(parents=True)
    url = f"sqlite://{work / 'journal.db'}"
    cluster = f"bench{os.getpid()}{mode}{run}"
    env = {**os.environ, "REGENT_CLUSTER": cluster, "PYTHONUNBUFFERED": "1", "REGENT_HIPCORE_BACKEND": "cpu"}
    agents = start_agents(url, cluster, ["h0", "h1", "h2"], work)
    # A 3 s lease: a 2-core machine busy starting procs can stall a renewal past 1 s.
    base = ["--tiny", "--steps", str(steps), "--hosts", "2", "--journal", url, "--step-delay", "0.05",
            "--lease-ttl", "3"]
    try:
        spare = ["--spares", "1"] if mode == "spare" else []
        job = Job([*base, *spare, "--session", f"{mode}-{run}", "--checkpoint-dir", str(work / "ckpt")],
                  work / "job.log", env)
        while True:
            _, step = job.step_line()
            if step is None:
                raise RuntimeError(f"the job ended before step {kill_step}: {job.log}")
            if step >= kill_step:
                break
        victim = random.Random(run).choice(["h0", "h1"])
        killed_at = time.time()
        kill_host(agents[victim].pid, target=f"host/{victim}")
        if mode == "spare":
            while job.step_line()[1] != -1:  # steps already in flight may complete: not the recovery
                pass
            next_at, next_step = job.step_line()
            result = job.result()
            redone = result["redone"] if result else None
        else:
            while job.step_line()[1] is not None:  # the job fails (a lost host, no spare policy)
                pass
            job.proc.wait(60)
            ckpts = sorted((work / "ckpt").glob("ckpt-*.pt"))
            resume = ckpts[-1]
            from_step = int(resume.stem.split("-")[1])
            again = Job([*base, "--session", f"{mode}-{run}-again", "--checkpoint-dir", str(work / "ckpt2"),
                         "--resume-from", str(resume)], work / "again.log", env)
            next_at, next_step = again.step_line()
            again.proc.kill()
            redone = step - from_step
        return {"mode": mode, "run": run, "killed": victim, "killed_at_step": step, "next_step": next_step,
                "to_next_step_s": round(next_at - killed_at, 3), "steps_redone": redone}
    finally:  # every host of the run goes, its procs too (an agent's procs outlive it otherwise)
        for name, agent in agents.items():
            if agent.poll() is None:
                kill_host(agent.pid, target=f"host/{name}")
            agent.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--json-out")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="regent-bench-host-loss-"))
    home = workdir / "home"
    home.mkdir(mode=0o700)
    os.environ["REGENT_HOME"] = str(home)
    from regent.wire.security import init_keys

    init_keys()
    save_every = 16  # the tiny config's
    rng = random.Random(29)
    runs = []
    for i in range(args.runs):
        kill_step = rng.randint(save_every + 2, args.steps - 8)
        for mode in ("spare", "restart"):
            r = one(mode, i, args.steps, kill_step, workdir, save_every)
            print(json.dumps(r), file=sys.stderr, flush=True)
            runs.append(r)
    p50 = {m: statistics.median(r["to_next_step_s"] for r in runs if r["mode"] == m) for m in ("spare", "restart")}
    redone = {m: max(r["steps_redone"] for r in runs if r["mode"] == m) for m in ("spare", "restart")}
    out = {"bench": "host_loss", "when": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.machine(),
           "cpus": os.cpu_count(), "runs": runs, "p50_to_next_step_s": p50,
           "ratio_spare_to_restart": round(p50["spare"] / p50["restart"], 3), "max_steps_redone": redone,
           "targets": {"ratio_at_most": 0.5, "spare_steps_redone_at_most": 1}}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text)


if __name__ == "__main__":
    main()
