"""torch.distributed bootstrap for procs: pick gloo or nccl (RCCL on ROCm) and join the group.

The controller passes each proc its rank, the world size and the master
address/port; this module only turns those into an initialised process group.
"""

from __future__ import annotations

import datetime
from typing import Any

import structlog

from regent.hipcore import ports
from regent.hipcore.backend import backend as hip_backend
from regent.hipcore.backend import require_torch
from regent.hipcore.errors import BackendUnavailableError

log = structlog.get_logger("hipcore.distributed")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, for the group's rendezvous (hipcore.ports)."""
    return ports.free_port(host)


def default_backend() -> str:
    """``nccl`` on a GPU backend (ROCm torch exposes RCCL under that name), else ``gloo``."""
    return "nccl" if hip_backend().is_gpu else "gloo"


def init_process_group(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    backend: str = "auto",
    timeout_s: float = 300.0,
) -> str:
    """Join the default torch.distributed process group; returns the backend used.

    ``backend="auto"`` picks ``default_backend()``. On a GPU backend the proc's
    bound device (``hipcore.current_device()``) becomes the current CUDA/HIP device
    first, as NCCL/RCCL require.
    """
    torch = require_torch("regent.hipcore.distributed.init_process_group")
    import torch.distributed as dist

    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    chosen = default_backend() if backend == "auto" else backend
    if chosen == "nccl":
        if not hip_backend().is_gpu:
            raise BackendUnavailableError(
                "backend='nccl' needs a GPU backend, but hipcore runs the CPU backend "
                f"({hip_backend().reason}); use backend='gloo' or 'auto'"
            )
        from regent.hipcore.device import current_device

        torch.cuda.set_device(current_device().index)
    host = f"[{master_addr}]" if ":" in master_addr else master_addr
    dist.init_process_group(
        backend=chosen,
        init_method=f"tcp://{host}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    log.debug("joined process group", rank=rank, world_size=world_size, backend=chosen)
    return chosen


def destroy_process_group() -> None:
    """Leave the default process group if this process joined one."""
    torch: Any = require_torch("regent.hipcore.distributed.destroy_process_group")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
