"""System actors: the runtime's own actors, which the controller spawns under reserved
names (``__regent_...``) to do work that must happen inside every proc of a mesh.

They import hipcore lazily, inside their endpoints, so that the controller, which
only names these classes, never loads the GPU runtime.
"""

from __future__ import annotations

from regent.worker.actor import Actor, Bootstrap, concurrent_endpoint, context, endpoint

__all__ = ["Bootstrap", "PortServer", "ProcGroup"]


class ProcGroup(Actor):
    """Joins its proc to a torch.distributed process group spanning the actor's mesh.

    ``ProcMesh.init_process_group`` spawns one per proc, asks rank 0 for a
    rendezvous port (``free_port``), then calls ``join`` on every rank at once:
    the torch.distributed rendezvous needs all ranks inside init together.
    ``join`` is a sync endpoint on purpose: it runs on the proc's thread, the
    thread user endpoints run on, so with NCCL/RCCL the device made current there
    is the one later collectives use.

    A supervisor re-forming the group after a member was lost (docs/multihost.md) rebuilds
    this actor on every member with the new rendezvous (`master_addr`, `master_port`) and
    `generation`: its ``__init__`` then leaves the old group (aborting it where the backend
    needs that) and joins the new one, all ranks at once.
    """

    def __init__(self, world_size: int, master_addr: str | None = None, master_port: int | None = None,
                 backend: str = "auto", timeout_s: float = 300.0, generation: int = 0):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, not {world_size!r}")
        self.world_size = world_size
        self.generation = generation
        if master_addr is not None:
            from regent.hipcore import distributed

            distributed.leave_process_group()
            distributed.init_process_group(context().rank, world_size, master_addr, int(master_port or 0),
                                           backend, timeout_s)

    @endpoint
    def free_port(self, host: str) -> int:
        """A port free a moment ago on this proc's host: the rendezvous port rank 0 will serve."""
        from regent.hipcore.distributed import free_port

        return free_port(host)

    @endpoint
    def join(self, master_addr: str, master_port: int, backend: str = "auto", timeout_s: float = 300.0) -> str:
        """Join the default process group as this actor's rank; returns the backend in use.

        A proc already in a group with the same rank and size answers with that group's
        backend (so a replaying controller, or a second call, is harmless); one in a
        different group is an error, as torch allows one default group per process.
        """
        import torch.distributed as dist

        from regent.hipcore import distributed

        rank = context().rank
        if dist.is_initialized():
            have = (dist.get_rank(), dist.get_world_size())
            if have == (rank, self.world_size):
                return str(dist.get_backend())
            raise RuntimeError(
                f"this proc already belongs to a torch.distributed process group as rank {have[0]} "
                f"of {have[1]}, so it cannot join another as rank {rank} of {self.world_size}; "
                "torch allows one default group per process: call torch.distributed."
                "destroy_process_group() in the proc first, or use a fresh proc mesh"
            )
        return distributed.init_process_group(rank, self.world_size, master_addr, master_port, backend, timeout_s)


class PortServer(Actor):
    """Holds the receivers of the controller program's ports (`Session.open_port`), one proc of
    the session's own. Each `recv` is a journaled call of the controller's, so the value it
    returns is journaled like any result, and a standby gets the same values in the same order."""

    def __init__(self) -> None:
        self.receivers: dict[str, object] = {}  # held here: the proc keeps receivers weakly

    @endpoint
    def port(self, pid: str) -> object:
        from regent.worker.ports import port_here, receiver

        self.receivers[pid] = receiver(pid)
        return port_here(pid)

    @concurrent_endpoint
    async def recv(self, pid: str) -> tuple:
        """The next value that arrives at port `pid`, as (kind, value)."""
        from regent.worker.ports import receiver

        rx = self.receivers.get(pid) or self.receivers.setdefault(pid, receiver(pid))
        return await rx.recv()._fut  # type: ignore[attr-defined]



