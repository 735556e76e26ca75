"""The RL job's actors: data-parallel policy trainers, samplers, a reward model, an evaluator.

Trainer 0 publishes the policy's weights in a shared-memory RDMA buffer; the samplers and the
evaluator read it one-sidedly (`buf.read_into`), so weights never pass through the controller.
Samplers keep no state between calls (weights come from the buffer, random draws from (seed,
step, rank)), so one restarted by its supervision policy answers a call sent again exactly as
the one that died would have.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from policy import (
    Config,
    action_generator,
    build,
    deterministic,
    digest,
    flat_params,
    load_flat,
    prompts_for,
    target,
)

from regent import Actor, context, endpoint
from regent.hipcore import RDMABuffer, shared_tensor


class Trainer(Actor):
    """One data-parallel replica of the policy. `step` is async on a thread of its own: the
    all-reduce in it must not block the proc's message loop (a standby may ask again for the
    previous step, answered from the dedupe cache, while a replica waits in a collective)."""

    def __init__(self, cfg: dict):
        self.cfg = Config(**cfg)
        self.compute = ThreadPoolExecutor(1, thread_name_prefix="trainer")
        self.compute.submit(deterministic).result()
        self.model = build(self.cfg)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.cfg.lr)
        self.published: torch.Tensor | None = None
        self.buffer: RDMABuffer | None = None

    @endpoint
    async def step(self, step: int, rollouts: dict, rewards: list[float]) -> dict:
        """One policy-gradient step on this replica's half of the rollouts."""
        return await asyncio.get_running_loop().run_in_executor(self.compute, self._step, step, rollouts, rewards)

    def _step(self, step: int, rollouts: dict, rewards: list[float]) -> dict:
        rank, world = dist.get_rank(), dist.get_world_size()
        prompts = torch.tensor(rollouts["prompts"])[rank::world]
        actions = torch.tensor(rollouts["actions"])[rank::world]
        reward = torch.tensor(rewards, dtype=torch.float32)
        advantage = (reward - reward.mean())[rank::world]
        logp = torch.log_softmax(self.model(prompts), dim=-1).gather(1, actions[:, None])[:, 0]
        loss = -(advantage * logp).mean()
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        grads = [p.grad for p in self.model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # one collective per step
        flat /= world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        self.opt.step()
        return {"step": step, "reward": float(reward.mean())}

    @endpoint
    def weights(self) -> RDMABuffer:
        """The RDMA buffer this replica publishes its weights in."""
        if self.buffer is None:
            self.published = shared_tensor(flat_params(self.model).numel(), torch.float32)
            self.buffer = RDMABuffer(self.published)
        return self.buffer

    @endpoint
    def publish(self, version: int) -> int:
        """Copy the current weights into the buffer; returns the version they are."""
        assert self.published is not None, "call weights() first"
        self.published.copy_(flat_params(self.model))
        return version

    @endpoint
    def digest(self) -> str:
        return digest(self.model)


def _policy_from(buf: RDMABuffer, cfg: Config) -> torch.nn.Module:
    model = build(cfg)
    flat = torch.empty(buf.size // 4, dtype=torch.float32)
    buf.read_into(flat, timeout=60).get(timeout=60)
    load_flat(model, flat)
    return model


class Sampler(Actor):
    """Rollouts for one step with the weights in the buffer: this rank's share of the prompts,
    answers drawn from the policy."""

    def __init__(self, cfg: dict, samplers: int):
        deterministic()
        self.cfg = Config(**cfg)
        self.samplers = samplers

    @endpoint
    def sample(self, buf: RDMABuffer, step: int, version: int) -> dict:
        rank = context().rank
        cfg = self.cfg
        prompts = prompts_for(cfg, step, rank, cfg.prompts // self.samplers)
        with torch.no_grad():
            probs = torch.softmax(_policy_from(buf, cfg)(prompts), dim=-1)
        actions = torch.multinomial(probs, 1, generator=action_generator(cfg, step, rank))[:, 0]
        return {"prompts": prompts.tolist(), "actions": actions.tolist(), "version": version}


class Reward(Actor):
    """The reward model: 1 for the answer the task wants, 0 for any other."""

    def __init__(self, cfg: dict):
        self.cfg = Config(**cfg)

    @endpoint
    def score(self, rollouts: dict) -> list[float]:
        prompts, actions = torch.tensor(rollouts["prompts"]), torch.tensor(rollouts["actions"])
        return (actions == target(prompts, self.cfg)).float().tolist()


class Evaluator(Actor):
    """The greedy policy's accuracy on a fixed set of prompts, from the weights in the buffer."""

    def __init__(self, cfg: dict):
        deterministic()
        self.cfg = Config(**cfg)

    @endpoint
    def evaluate(self, buf: RDMABuffer, step: int) -> dict:
        cfg = self.cfg
        prompts = prompts_for(cfg, -1, 0, cfg.eval_prompts)
        with torch.no_grad():
            greedy = _policy_from(buf, cfg)(prompts).argmax(dim=-1)
        return {"step": step, "accuracy": float((greedy == target(prompts, cfg)).float().mean())}
