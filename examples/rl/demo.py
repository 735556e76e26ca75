"""`regent demo --rl`: RL post-training survives a SIGKILLed controller and a SIGKILLed sampler.

A primary and a standby run examples/rl/rl.py (an asyncio program on `s.run`) on one session.
At one random step the leader is SIGKILLed and the standby takes over, replaying the journal,
including the order in which the program's tasks woke; at another a sampler proc is SIGKILLed
and its supervision policy restarts it. Then the same job runs once more without any failure,
and the demo shows that both end with the same policy weights (sha256), rewards and
evaluations, and verifies the journal. `run_job` and `run_clean` are what tests/train uses.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import signal
import sys
import time
from pathlib import Path

RL = Path(__file__).with_name("rl.py")
ROOT = Path(__file__).resolve().parents[2]


def _train_demo():
    """examples/train/demo.py: the controller-process driver both demos share."""
    spec = importlib.util.spec_from_file_location("regent_train_demo", ROOT / "examples" / "train" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class SamplerKiller:
    """Kills one sampler proc when the leader reports `at_step` (pids from its `procs` line)."""

    def __init__(self, at_step: int | None):
        self.at_step = at_step
        self.pids: list[int] = []
        self.killed: tuple[int, int] | None = None  # (pid, step)

    def __call__(self, pid: int, line: str) -> None:
        if line.startswith("procs samplers "):
            self.pids = [int(p) for p in line.split()[2:]]
        elif line.startswith("step ") and self.at_step is not None and self.killed is None and self.pids:
            step = int(line.split()[1].split("/")[0])
            if step >= self.at_step:
                victim = self.pids[-1]
                try:
                    os.kill(victim, signal.SIGKILL)
                except ProcessLookupError:
                    return
                self.killed = (victim, step)


def run_job(session: str, workdir: Path, args: list[str], kill_steps: list[int], sampler_step: int | None, *,
            journal: str | None = None, progress: bool = True, timeout: float = 600.0):
    """The job with a primary and a standby, the leader SIGKILLed at each of kill_steps and a
    sampler proc at sampler_step. Returns (the driver's Run, the SamplerKiller)."""
    killer = SamplerKiller(sampler_step)
    run = _train_demo().run_controllers(session, workdir, args, kill_steps, journal=journal, progress=progress,
                                        timeout=timeout, program=RL, on_line=killer)
    return run, killer


def run_clean(session: str, workdir: Path, args: list[str], *, journal: str | None = None,
              progress: bool = True, timeout: float = 600.0):
    return _train_demo().run_reference(session, workdir, args, journal=journal, progress=progress,
                                       timeout=timeout, program=RL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="regent demo --rl", description=__doc__.splitlines()[0])
    p.add_argument("--journal", default=os.environ.get("REGENT_JOURNAL"),
                   help="etcd://host:port or sqlite:///path.db (default: the embedded store)")
    p.add_argument("--steps", type=int, help="policy steps (default: the full config's)")
    p.add_argument("--tiny", action="store_true", help="the tests' tiny configuration")
    p.add_argument("--seed", type=int, help="seed of the random kill steps (default: the clock)")
    p.add_argument("--workdir", help="logs (default: a temp dir)")
    args = p.parse_args(argv)

    sys.path.insert(0, str(RL.parent))
    from policy import FULL, TINY

    cfg = TINY if args.tiny else FULL
    steps = args.steps or cfg.steps
    job_args = (["--tiny"] if args.tiny else []) + ["--steps", str(steps), "--step-delay", "0.05"]
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    lo, hi = max(2, steps // 10), max(4, steps * 9 // 10)
    controller_step, sampler_step = rng.sample(range(lo, hi), 2)
    session = f"demo-rl-{time.strftime('%Y%m%d-%H%M%S')}"
    workdir = Path(args.workdir) if args.workdir else Path(os.environ.get("TMPDIR", "/tmp")) / f"regent-{session}"
    where = args.journal or "the embedded journal"
    print(f"regent demo --rl: policy-gradient post-training, {steps} steps; trainers data-parallel on 2 procs\n"
          f"  (gloo), 2 samplers (supervised) reading the latest weights through an RDMA buffer, a reward model\n"
          f"  and an evaluator; sampling for step t+1 runs while step t trains (asyncio on s.run).\n"
          f"  Primary + standby on {where}; SIGKILL of the leader at step {controller_step} and of a sampler proc\n"
          f"  at step {sampler_step} (seed {seed}); logs in {workdir}")
    t0 = time.monotonic()
    failed, killer = run_job(session, workdir, job_args, [controller_step], sampler_step, journal=args.journal)
    print(f"\nthe same job with no failure (session {session}-ref):")
    ref = run_clean(f"{session}-ref", workdir, job_args, journal=args.journal)
    verify = _train_demo().journal_cli(args.journal, "verify", session)
    wall = time.monotonic() - t0

    a, b = failed.result, ref.result
    same_weights = a["weights_sha256"] == b["weights_sha256"]
    same_curves = a["rewards"] == b["rewards"] and a["evals"] == b["evals"]
    print("\nsummary")
    print(f"  steps               {steps} (mean reward {a['rewards'][0]:.3f} -> {a['rewards'][-1]:.3f}; greedy "
          f"accuracy {a['evals'][0]['accuracy']:.3f} -> {a['evals'][-1]['accuracy']:.3f})")
    for i, t in enumerate(failed.takeovers, 1):
        print(f"  failover {i}          killed at step {t.killed_at_step}; standby led after "
              f"{t.led_at - t.killed_at:.2f} s, live after {t.failover_s:.2f} s; "
              f"{t.replayed} calls replayed from the journal, {t.resent} re-sent to workers")
    if killer.killed:
        print(f"  sampler             pid {killer.killed[0]} SIGKILLed at step {killer.killed[1]}; restarted by "
              "its supervision policy, its call sent again")
    print(f"  final leader stats  {a['stats']}")
    print(f"  weights sha256      {a['weights_sha256'][:16]}... with the failures, {b['weights_sha256'][:16]}... "
          f"without: {'bit-identical' if same_weights else 'DIFFERENT'}")
    print(f"  rewards, evals      {'equal' if same_curves else 'DIFFERENT'} ({len(a['rewards'])} steps, "
          f"{len(a['evals'])} evaluations)")
    print(f"  journal verify      {verify.stdout.strip().splitlines()[0] if verify.stdout.strip() else verify.stderr[-300:]}")
    print(f"  wall time           {wall:.1f} s (with failures {failed.wall_s:.1f} s, reference {ref.wall_s:.1f} s)")
    ok = same_weights and same_curves and a["replicas_agree"] and verify.returncode == 0 \
        and len(failed.takeovers) == 1 and all(t.live_at for t in failed.takeovers) and killer.killed is not None
    print("demo OK" if ok else "demo FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
