"""The training job's actors: data-parallel trainers, an evaluator and a checkpoint writer.

The trainers all-reduce gradients through the torch.distributed group the controller
formed over their procs (`procs.init_process_group()`); trainer 0 publishes its weights
in a shared-memory RDMA buffer that the evaluator and the checkpoint writer read
one-sidedly, so the weights never pass through the controller.
"""

from __future__ import annotations

import asyncio
import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
from model import Config, Corpus, batch_key, build, deterministic, digest, flat_params

from regent import Actor, context, endpoint
from regent.hipcore import RDMABuffer, shared_tensor

# A replica's training state, per proc: a replica rebuilt on the same proc (its mesh restarted
# after another host was lost) goes on from it rather than from scratch.
_KEPT: dict[str, dict] = {}


class Trainer(Actor):
    """One data-parallel replica: every replica starts from the same weights and applies
    the same averaged gradients, so all of them hold the same model after each step.

    A replica knows the next step it has to apply (`progress`): asked for a step it applied
    already (a step retried after a lost host failed it on another replica), it answers that
    step's loss without applying it again. A replica started on a new proc (a spare) has no
    state: the controller program has it take a healthy replica's weights, optimizer state and
    last published snapshot through an RDMA buffer (`export_state` / `import_state`), so only
    the step in flight when the host died is redone, not the steps since a checkpoint.

    `step` is async and runs on one dedicated thread: the collective in it must not block
    the proc's message loop. If a controller dies after sending step k+1 to replica 0 but
    not to replica 1, replica 0 sits in the all-reduce of step k+1; the standby first asks
    again for step k, and replica 0 can only answer that (from its dedupe cache) while the
    all-reduce waits if its loop is free.
    """

    def __init__(self, cfg: dict):
        self.cfg = Config(**cfg)
        self.corpus = Corpus()
        self.compute = ThreadPoolExecutor(1, thread_name_prefix="trainer")
        self.compute.submit(deterministic).result()  # thread settings are per thread
        kept = _KEPT.get("trainer")
        if kept is not None and kept["cfg"] == cfg:  # rebuilt on its proc: it goes on from there
            self.state = kept
        else:
            model = build(self.cfg, self.corpus.vocab)
            self.state = {"cfg": cfg, "model": model, "opt": torch.optim.AdamW(model.parameters(), lr=self.cfg.lr),
                          "next": 0, "losses": {}, "fresh": True, "published": None, "buffer": None}
            _KEPT["trainer"] = self.state

    @property
    def model(self) -> torch.nn.Module:
        return self.state["model"]

    @property
    def opt(self) -> torch.optim.Optimizer:
        return self.state["opt"]

    @property
    def published(self) -> torch.Tensor | None:
        return self.state["published"]

    @endpoint
    async def step(self, step: int) -> float:
        """One optimizer step on this replica's batch for `step`; returns the mean loss."""
        return await asyncio.get_running_loop().run_in_executor(self.compute, self._step, step)

    def _step(self, step: int) -> float:
        state = self.state
        if step < state["next"]:  # applied already: a retried step
            return state["losses"][step]
        if step != state["next"]:
            raise RuntimeError(f"this replica's next step is {state['next']}, not {step}: it has to take a "
                               "healthy replica's state first (import_state)")
        rank, world = dist.get_rank(), dist.get_world_size()
        x, y = self.corpus.batch("train", self.cfg, batch_key(self.cfg, step, rank))
        _, loss = self.model(x, y)
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        grads = [p.grad for p in self.model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
        dist.all_reduce(flat)  # one collective per step: every gradient and the loss
        flat /= world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        self.opt.step()
        loss = float(flat[-1])
        state["losses"][step], state["next"], state["fresh"] = loss, step + 1, False
        return loss

    @endpoint
    def weights(self) -> RDMABuffer:
        """The RDMA buffer this replica publishes its weights in (shared memory, zero-copy)."""
        state = self.state
        if state["buffer"] is None:
            state["published"] = shared_tensor(flat_params(self.model).numel(), torch.float32)
            state["buffer"] = RDMABuffer(state["published"])
        return state["buffer"]

    @endpoint
    def publish(self, step: int) -> int:
        """Copy the current weights into the RDMA buffer; returns the step they belong to."""
        self.weights()
        self.published.copy_(flat_params(self.model))
        return step

    @endpoint
    def progress(self) -> tuple[int, bool]:
        """(the next step this replica applies, whether it holds trained state)."""
        return self.state["next"], not self.state["fresh"]

    @endpoint
    def export_state(self) -> RDMABuffer:
        """This replica's whole training state (weights, optimizer, losses, the published
        snapshot) serialized into an RDMA buffer, for a new replica to read one-sidedly."""
        state = self.state
        blob = io.BytesIO()
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "next": state["next"],
                    "losses": state["losses"],
                    "published": None if state["published"] is None else state["published"].clone()}, blob)
        data = blob.getbuffer()
        out = shared_tensor(len(data), torch.uint8)
        out.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        state["exported"] = RDMABuffer(out)  # held until the next export
        return state["exported"]

    @endpoint
    def import_state(self, buf: RDMABuffer, next_step: int) -> bool:
        """Take a healthy replica's state from `buf` unless this replica is at `next_step`
        with trained state already; True if it took it."""
        state = self.state
        if state["next"] == next_step and not state["fresh"]:
            return False
        raw = torch.empty(buf.size, dtype=torch.uint8)
        buf.read_into(raw, timeout=120).get(timeout=120)
        got = torch.load(io.BytesIO(raw.numpy().tobytes()), weights_only=False)
        self.model.load_state_dict(got["model"])
        self.opt.load_state_dict(got["opt"])
        state["next"], state["losses"], state["fresh"] = got["next"], got["losses"], False
        if got["published"] is not None:
            self.weights()
            self.published.copy_(got["published"])
        return True

    @endpoint
    def restore(self, path: str) -> int:
        """No healthy replica is left: start again from a checkpoint file (weights only; the
        optimizer starts afresh). Returns the step it resumes at."""
        ckpt = torch.load(path, weights_only=False)
        self.model.load_state_dict(ckpt["model"])
        state = self.state
        state["opt"] = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr)
        state["next"], state["fresh"] = ckpt["step"], False
        return ckpt["step"]

    @endpoint
    def digest(self) -> str:
        return digest(self.model)

    @endpoint
    def where(self) -> dict:
        return {"rank": context().rank, "pid": os.getpid(), "torch_rank": dist.get_rank()}


def _read_weights(buf: RDMABuffer, cfg: Config, vocab: int) -> torch.nn.Module:
    flat = torch.empty(buf.size // 4, dtype=torch.float32)
    buf.read_into(flat, timeout=60).get(timeout=60)
    model = build(cfg, vocab)
    torch.nn.utils.vector_to_parameters(flat, model.parameters())
    return model


class Evaluator(Actor):
    """Held-out loss and a text sample from the weights in an RDMA buffer."""

    def __init__(self, cfg: dict):
        self.cfg = Config(**cfg)
        self.corpus = Corpus()

    @endpoint
    def evaluate(self, buf: RDMABuffer, step: int) -> dict:
        model = _read_weights(buf, self.cfg, self.corpus.vocab)
        model.eval()
        with torch.no_grad():
            losses = [float(model(*self.corpus.batch("val", self.cfg, k))[1]) for k in range(self.cfg.eval_batches)]
        prompt = [self.corpus.index[c] for c in "ROMEO:"]
        text = self.corpus.decode(model.sample(prompt, 48, seed=step))
        return {"step": step, "val_loss": sum(losses) / len(losses), "sample": text}


class Checkpointer(Actor):
    """Writes `torch.save` checkpoints of the weights it reads from an RDMA buffer."""

    def __init__(self, cfg: dict, directory: str):
        self.cfg = Config(**cfg)
        self.vocab = Corpus().vocab
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    @endpoint
    def save(self, buf: RDMABuffer, step: int) -> str:
        model = _read_weights(buf, self.cfg, self.vocab)
        path = self.dir / f"ckpt-{step:06d}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save({"step": step, "config": self.cfg.asdict(), "model": model.state_dict()}, tmp)
        os.replace(tmp, path)  # a reader never sees half a checkpoint
        return str(path)
