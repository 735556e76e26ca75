"""The RL example's task, policy and configuration: small enough for a CPU, deterministic.

The task is a contextual bandit standing in for a prompt -> completion reward: a prompt is a
token id, the policy answers with one of `actions` tokens, and the reward model pays 1 for the
answer `target(prompt)` and 0 otherwise. The policy is an embedding and a linear head trained
with REINFORCE (reward minus the batch mean as the advantage). Every random draw is a function
of (seed, step, rank), so any run of the job, with or without failures, draws the same.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Config:
    steps: int = 120
    prompts: int = 256  # rollouts per step, split between the samplers (and then the trainers)
    vocab: int = 64  # prompt ids
    actions: int = 16
    hidden: int = 32
    lr: float = 0.5
    seed: int = 11
    eval_every: int = 20
    eval_prompts: int = 512

    def asdict(self) -> dict:
        return asdict(self)


FULL = Config()
TINY = Config(steps=16, prompts=64, vocab=16, actions=8, eval_every=4, eval_prompts=64)


def deterministic() -> None:
    """One thread and deterministic kernels, in the thread that computes."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def build(cfg: Config) -> nn.Module:
    """The policy, with seeded initial weights (the same in every process)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    model = nn.Sequential(nn.Embedding(cfg.vocab, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, cfg.actions))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def target(prompts: torch.Tensor, cfg: Config) -> torch.Tensor:
    """The answer the reward model pays for."""
    return (prompts * 5 + 3) % cfg.actions


def seed_of(*key: object) -> int:
    """A seed from a key, the same in every process (unlike hash(), which is salted)."""
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:7], "big")


def prompts_for(cfg: Config, step: int, rank: int, n: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed_of(cfg.seed, "prompts", step, rank))
    return torch.randint(0, cfg.vocab, (n,), generator=gen)


def action_generator(cfg: Config, step: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed_of(cfg.seed, "actions", step, rank))


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
