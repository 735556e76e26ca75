"""torch.distributed bootstrap: four procs join a group and all-reduce to the right sum."""

from __future__ import annotations

import socket

import hipcore_children as children
import pytest

from regent.hipcore import distributed


def test_free_port_can_be_bound():
    port = distributed.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_auto_backend_is_gloo_on_cpu_and_nccl_on_gpu():
    from regent import hipcore

    assert distributed.default_backend() == ("nccl" if hipcore.backend().is_gpu else "gloo")


@pytest.mark.slow
def test_all_reduce_across_four_processes_sums(spawn, torch):
    from regent import hipcore

    world = 4
    if hipcore.backend().is_gpu and hipcore.backend().device_count < world:
        pytest.skip(f"nccl needs {world} GPUs, this machine has {hipcore.backend().device_count}")
    port = distributed.free_port()
    out = spawn.Queue()
    procs = [
        spawn.Process(target=children.allreduce_rank, args=(rank, world, port, out))
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    expected_backend = distributed.default_backend()
    assert results == [(r, expected_backend, 10.0) for r in range(world)]


def test_nccl_on_the_cpu_backend_is_refused_with_advice(torch):
    from regent import hipcore

    if hipcore.backend().is_gpu:
        pytest.skip("GPU present")
    with pytest.raises(hipcore.BackendUnavailableError, match="use backend='gloo'"):
        distributed.init_process_group(0, 1, "127.0.0.1", distributed.free_port(), backend="nccl")
