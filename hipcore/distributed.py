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


def leave_process_group() -> None:
    """Leave the default process group even when a member died: NCCL/RCCL communicators with
    a dead peer hang in destroy unless aborted first (gloo needs no abort: its pairs with
    the dead peer are closed already). A no-op in a process in no group."""
    import sys

    if "torch.distributed" not in sys.modules:  # never imported: no group to leave
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        from torch.distributed import distributed_c10d as c10d

        abort = getattr(c10d, "_abort_process_group", None)
        try:
            if abort is not None:
                abort()
            else:
                c10d._get_default_group()._get_backend(_bound_device()).abort()
        except Exception as e:  # the destroy below is still worth trying
            log.warning("could not abort the NCCL process group before leaving it", error=str(e))
    dist.destroy_process_group()
    log.debug("left the process group")


def _bound_device() -> Any:
    """The torch device of this proc's bound GPU (for a backend's abort)."""
    torch = require_torch("regent.hipcore.distributed")
    from regent.hipcore.device import current_device

    return torch.device("cuda", current_device().index)


# What gloo and NCCL/RCCL say when a peer of a collective is gone (a crash, a lost host):
# gloo raises a plain RuntimeError from its TCP transport; newer torch raises DistError kinds.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "gloo/transport", "Broken pipe",
              "NCCL communicator was aborted", "ncclRemoteError", "ncclSystemError", "NCCL error",
              "Socket Timeout", "Timed out waiting")


def is_peer_failure(e: BaseException) -> bool:
    """Whether `e`, raised by an endpoint of a proc in a process group, is a collective that
    failed because another member is gone, not an error of this proc's own."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    if isinstance(e, getattr(dist, "DistNetworkError", ())) or isinstance(e, getattr(dist, "DistBackendError", ())):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in _PEER_GONE)
