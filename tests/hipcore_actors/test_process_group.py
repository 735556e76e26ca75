"""`ProcMesh.init_process_group()`: torch.distributed across a mesh's procs, rendezvous
arranged by the controller, then collectives from ordinary user actors."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from regent.controller import ActorError, Session
from regent.worker import Actor, context, endpoint


class Reducer(Actor):
    @endpoint
    def all_reduce(self) -> tuple[int, int, float]:
        """(torch rank, mesh rank, sum over the group of rank + 1)."""
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return dist.get_rank(), context().rank, t.item()

    @endpoint
    def group(self) -> tuple[bool, int, str]:
        return dist.is_initialized(), dist.get_world_size(), str(dist.get_backend())


@pytest.fixture(scope="module")
def session():
    with Session("hipcore-actors-process-group") as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 4})


def test_all_reduce_across_a_four_proc_mesh_with_gloo(procs):
    assert procs.init_process_group() == "gloo"
    reducers = procs.spawn("reducers", Reducer)
    results = reducers.all_reduce.call().get().values()
    assert [r[2] for r in results] == [10.0] * 4
    assert [(r[0], r[1]) for r in results] == [(i, i) for i in range(4)]  # torch rank == mesh rank
    assert reducers.group.call().get().values() == [(True, 4, "gloo")] * 4


def test_init_process_group_again_on_the_same_mesh_is_harmless(procs):
    procs.init_process_group()  # the first test may not have run
    assert procs.init_process_group() == "gloo"
    reducers = procs.spawn("reducers-again", Reducer)
    assert [r[2] for r in reducers.all_reduce.call().get().values()] == [10.0] * 4


def test_a_proc_in_another_group_refuses_to_join_a_second_one(procs):
    procs.init_process_group()
    with pytest.raises(ActorError) as info:
        procs.slice(procs=slice(0, 2)).init_process_group()
    assert info.value.exc_type == "RuntimeError"
    assert "already belongs to a torch.distributed process group" in info.value.message
