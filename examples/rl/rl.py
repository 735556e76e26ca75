"""The RL post-training job's controller program: an asyncio program on the session's loop.

Each step t trains the policy on rollouts R_t while the samplers already generate R_{t+1} with
the weights the trainers started step t from (staleness one, so which weights made which
rollouts is fixed by the program, not by timing):

    publish v_t -> sample R_{t+1} with v_t  ........................ (a task)
                -> score R_t (reward actor) -> train step t: v_t -> v_{t+1}
    await R_{t+1}; every N steps the evaluator reads v_t beside the samplers.

A sampler proc that dies is restarted by its supervision policy, and its call sent again;
samplers keep no state, so the rollouts are the same. Run it twice with one session name and
the second waits as a standby (`regent demo --rl` does, and kills both kinds of process).
Progress goes to stderr (`step 3/16 reward 0.1250`, `eval ...`, `live ...`, `procs ...`);
the result is one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # policy.py and actors.py, also under runpy

from actors import Evaluator, Reward, Sampler, Trainer  # noqa: E402
from policy import FULL, TINY  # noqa: E402

from regent import RestartPolicy, Session  # noqa: E402
from regent.worker.errors import SupervisionError  # noqa: E402

SAMPLERS = 2


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--session", default="rl")
    p.add_argument("--journal", default=os.environ.get("REGENT_JOURNAL"),
                   help="etcd://host:port or sqlite:///path.db (default: the embedded store)")
    p.add_argument("--tiny", action="store_true", help="the small configuration tests use")
    p.add_argument("--steps", type=int, help="override the configuration's number of steps")
    p.add_argument("--leader-file", help="append 'pid unix-time' here on becoming leader (for the demo)")
    p.add_argument("--lease-ttl", type=float, default=1.0, help="seconds a dead primary holds the lead")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="sleep this long per step (tests use it to give a kill time to land)")
    return p.parse_args(argv)


async def sample(samplers, buf, step: int, version: int) -> dict:
    """R_step from every sampler, merged in rank order; sent again while a sampler restarts."""
    for attempt in range(20):
        try:
            parts = (await samplers.sample.call(buf, step, version)).values()
        except SupervisionError:
            await asyncio.sleep(0.1 * (attempt + 1))
            continue
        return {"prompts": [p for part in parts for p in part["prompts"]],
                "actions": [a for part in parts for a in part["actions"]], "version": version}
    raise RuntimeError(f"the samplers did not answer step {step} after 20 tries")


async def train(s: Session, args: argparse.Namespace, meshes: dict, steps: int, eval_every: int) -> dict:
    trainers, samplers, reward, evaluator = (meshes[k] for k in ("trainers", "samplers", "reward", "evaluator"))
    publisher = trainers.slice(procs=0)
    buf = await publisher.weights.call_one()
    await publisher.publish.call_one(0)
    rewards: list[float] = []
    evals: list[dict] = []
    rollouts = await sample(samplers, buf, 0, 0)
    live = Live(s)
    for t in range(steps):
        if t:
            await publisher.publish.call_one(t)  # v_t: the samplers are done reading v_{t-1}
        ahead = asyncio.ensure_future(sample(samplers, buf, t + 1, t)) if t + 1 < steps else None
        evaluating = asyncio.ensure_future(evaluator.evaluate.call_one(buf, t)) if t % eval_every == 0 else None
        scores = await reward.score.call_one(rollouts)
        result = (await trainers.step.call(t, rollouts, scores)).values()[0]
        rewards.append(result["reward"])
        live.check()
        if not s.replaying:
            print(f"step {t + 1}/{steps} reward {result['reward']:.4f}", file=sys.stderr, flush=True)
            if args.step_delay:
                # Blocking, and only while live: an asyncio.sleep reads the loop's clock, a
                # journaled observation, so it must not depend on s.replaying.
                time.sleep(args.step_delay)
        if evaluating is not None:
            evals.append(await evaluating)
            if not s.replaying:
                print(f"eval step {t} accuracy {evals[-1]['accuracy']:.4f}", file=sys.stderr, flush=True)
        if ahead is not None:
            rollouts = await ahead  # before the next publish overwrites what it read
    return {"rewards": rewards, "evals": evals}


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    cfg = TINY if args.tiny else FULL
    steps = args.steps or cfg.steps
    with Session(args.session, journal=args.journal, lease_ttl_s=args.lease_ttl) as s:
        if args.leader_file:
            with open(args.leader_file, "a") as f:
                f.write(f"{os.getpid()} {time.time()}\n")
        procs = s.spawn_procs(per_host={"procs": 2 + SAMPLERS + 1})
        trainer_procs = procs.slice(procs=slice(0, 2))
        trainer_procs.init_process_group()  # gloo on CPU: the trainers all-reduce through it
        sampler_procs = procs.slice(procs=slice(2, 2 + SAMPLERS))
        aux = procs.slice(procs=2 + SAMPLERS)
        meshes = {
            "trainers": trainer_procs.spawn("trainers", Trainer, cfg.asdict()),
            "samplers": sampler_procs.spawn("samplers", Sampler, cfg.asdict(), SAMPLERS,
                                            restart=RestartPolicy(restart="permanent", max_restarts=10)),
            "reward": aux.spawn("reward", Reward, cfg.asdict()),
            "evaluator": aux.spawn("evaluator", Evaluator, cfg.asdict()),
        }
        if not s.replaying:
            pids = " ".join(str(p.pid) for p in sampler_procs.procs())
            print(f"procs samplers {pids}", file=sys.stderr, flush=True)
        out = s.run(train(s, args, meshes, steps, cfg.eval_every))
        digests = meshes["trainers"].digest.call().get().values()
        result = {"session": s.name, "steps": steps, "weights_sha256": digests[0],
                  "replicas_agree": len(set(digests)) == 1, "rewards": out["rewards"], "evals": out["evals"],
                  "stats": s.stats, "role": s.role, "pid": os.getpid()}
    print(json.dumps(result), flush=True)
    return result


class Live:
    """Says once, on stderr, when this controller is live (a standby: its replay is over)."""

    def __init__(self, s: Session):
        self.s = s
        self.said = False

    def check(self) -> None:
        if not self.said and not self.s.replaying:
            self.said = True
            st = self.s.stats
            print(f"live at {time.time():.3f} replayed {st['replayed']} resent {st['resent']} role {self.s.role}",
                  file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
