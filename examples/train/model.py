"""A small character-level transformer and its data: the model the training example trains.

Pure PyTorch, no regent: everything here is deterministic given a seed, so two runs
(one with a controller failover, one without) end with bit-identical weights.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

DATA = Path(__file__).with_name("data") / "tinyshakespeare.txt"


@dataclass(frozen=True)
class Config:
    layers: int = 2
    width: int = 64
    heads: int = 4
    block: int = 64  # context length in characters
    batch: int = 16  # sequences per trainer per step
    lr: float = 3e-3
    steps: int = 600
    eval_every: int = 50  # the evaluator gets the weights every N steps
    save_every: int = 200  # the checkpoint actor writes a torch.save file every M steps
    eval_batches: int = 4
    seed: int = 1234

    def asdict(self) -> dict:
        return asdict(self)


FULL = Config()
# For tests: a one-layer model, short contexts, a few dozen steps; well under a minute.
TINY = Config(layers=1, width=32, heads=2, block=32, batch=8, steps=24, eval_every=8, save_every=16,
              eval_batches=2)


class Corpus:
    """The text as integer tensors: a training split and a held-out split (last 10%)."""

    def __init__(self, path: Path = DATA):
        text = path.read_text(encoding="utf-8")
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        data = torch.tensor([self.index[c] for c in text], dtype=torch.long)
        cut = int(len(data) * 0.9)
        self.train, self.val = data[:cut], data[cut:]

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def batch(self, split: str, cfg: Config, key: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch for `key` (derived from seed, step and rank): the same on every run."""
        data = self.train if split == "train" else self.val
        g = torch.Generator().manual_seed(key)
        starts = torch.randint(0, len(data) - cfg.block - 1, (cfg.batch,), generator=g)
        x = torch.stack([data[s:s + cfg.block] for s in starts.tolist()])
        y = torch.stack([data[s + 1:s + cfg.block + 1] for s in starts.tolist()])
        return x, y


def batch_key(cfg: Config, step: int, rank: int) -> int:
    """Fixed batch order: a function of the seed, the step and the data-parallel rank only."""
    return (cfg.seed * 1_000_003 + step) * 64 + rank


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(), nn.Linear(4 * cfg.width, cfg.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    def __init__(self, cfg: Config, vocab: int):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(vocab, cfg.width)
        self.pos = nn.Embedding(cfg.block, cfg.width)
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.layers)])
        self.ln = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        logits = self.head(self.ln(self.blocks(x)))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    @torch.no_grad()
    def sample(self, prompt: list[int], n: int, seed: int) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        idx = torch.tensor([prompt], dtype=torch.long)
        for _ in range(n):
            logits, _ = self(idx[:, -self.cfg.block:])
            nxt = torch.multinomial(logits[0, -1].softmax(-1), 1, generator=g)
            idx = torch.cat([idx, nxt.view(1, 1)], dim=1)
        return idx[0].tolist()


def build(cfg: Config, vocab: int) -> CharTransformer:
    """The model with its initial weights, the same in every process."""
    deterministic()
    torch.manual_seed(cfg.seed)
    return CharTransformer(cfg, vocab)


def deterministic() -> None:
    """One thread and deterministic kernels: float sums happen in the same order every run."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def digest(model: nn.Module) -> str:
    """sha256 of every parameter's bytes, in order: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
