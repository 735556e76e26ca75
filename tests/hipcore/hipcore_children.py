"""Bodies of the child processes hipcore tests spawn (importable by the 'spawn' start method)."""

from __future__ import annotations

import os
import pickle
import time
from typing import Any

import numpy as np

SEED_LEN = 1_000_003  # prime, so a transfer misplaced by any whole number of blocks is caught


def pattern(n: int, salt: int = 0) -> np.ndarray:
    seed = np.random.default_rng(salt).integers(0, 256, size=min(n, SEED_LEN), dtype=np.uint8)
    if n <= SEED_LEN:
        return seed[:n].copy()
    return np.tile(seed, n // SEED_LEN + 1)[:n]


def rdma_owner(sizes: list[int], memory: str, to_parent: Any, from_parent: Any) -> None:
    """Register one buffer per size; answer commands until told to stop."""
    from regent.hipcore import rdma

    arrays = []
    buffers = []
    for n in sizes:
        if memory == "shared":
            arr = rdma.shared_array(n)
            arr[:] = pattern(n, salt=1)
        elif memory == "torch":
            import torch

            arr = torch.from_numpy(pattern(n, salt=1))
        elif memory == "device":
            import torch

            from regent import hipcore

            arr = hipcore.current_device().empty(n, torch.uint8)
            arr.copy_(torch.from_numpy(pattern(n, salt=1)))
        else:
            arr = pattern(n, salt=1)
        arrays.append(arr)
        buffers.append(rdma.RDMABuffer(arr))
    to_parent.put(pickle.dumps(buffers))
    while True:
        cmd, arg = from_parent.get()
        if cmd == "stop":
            return
        if cmd == "check":  # arg: (index, salt) -> does buffer index hold pattern(salt)?
            index, salt = arg
            arr = arrays[index]
            if hasattr(arr, "cpu"):
                arr = arr.cpu().numpy()
            data = np.asarray(arr).reshape(-1).view(np.uint8)
            to_parent.put(bool(np.array_equal(data, pattern(len(data), salt))))
        elif cmd == "drop":
            buffers[arg].drop()
            to_parent.put("dropped")
        elif cmd == "local_read":
            dst = np.empty(buffers[arg].size, dtype=np.uint8)
            try:
                buffers[arg].read_into(dst).get(timeout=30)
                to_parent.put("ok")
            except Exception as exc:  # noqa: BLE001 - reported to the test
                to_parent.put(type(exc).__name__)


def barrier_party(barrier: Any, rounds: int, out: Any) -> None:
    rng = np.random.default_rng(os.getpid())
    times = []
    for _ in range(rounds):
        time.sleep(float(rng.uniform(0, 0.05)))
        arrive = time.time()
        index = barrier.wait(timeout=60)
        times.append((arrive, time.time(), index))
    out.put(times)


def ipc_event_owner(to_parent: Any, from_parent: Any, delay_s: float) -> None:
    """Record an IpcEvent behind ``delay_s`` of stream work that then sets a shared flag."""
    from regent import hipcore

    flag = hipcore.shared_array(8, dtype=np.int64)
    stream = hipcore.current_device().stream()
    event = hipcore.IpcEvent()
    stream.delay(delay_s)
    stream.launch(flag.__setitem__, 0, 42)
    event.record(stream)
    to_parent.put(pickle.dumps((event, hipcore.RDMABuffer(flag))))
    from_parent.get()


def ipc_event_waiter(payload: bytes, out: Any) -> None:
    """Wait on the owner's event two ways; report what the flag held once each wait finished."""
    from regent import hipcore

    event, flag_buf = pickle.loads(payload)
    seen = np.zeros(8, dtype=np.int64)
    stream = hipcore.current_device().stream()
    stream.wait_event(event)
    stream.launch(lambda: flag_buf.read_into(seen).get(timeout=30))
    stream.synchronize(timeout=60)
    via_stream = int(seen[0])
    event.synchronize(timeout=60)
    flag_buf.read_into(seen).get(timeout=30)
    out.put((via_stream, int(seen[0]), event.query()))


def ipc_event_synchronize(payload: bytes, out: Any) -> None:
    from regent import hipcore

    event, _flag = pickle.loads(payload)
    out.put("opened")  # the test kills the owner only once the event is open here
    try:
        event.synchronize(timeout=60)
        out.put("completed")
    except hipcore.PeerGoneError as exc:
        out.put(f"PeerGoneError: {exc}")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(f"{type(exc).__name__}: {exc}")


def allreduce_rank(rank: int, world: int, port: int, out: Any) -> None:
    # Bind this rank to its own device before torch initialises CUDA/HIP, as the host agent does.
    from regent.hipcore import binding

    os.environ.update(binding.proc_env(rank, 1, os.environ.get("REGENT_HIPCORE_BACKEND")))
    import torch
    import torch.distributed as dist

    from regent.hipcore import distributed

    used = distributed.init_process_group(rank, world, "127.0.0.1", port, backend="auto")
    device = "cuda" if used == "nccl" else "cpu"
    t = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(t)
    out.put((rank, used, float(t.item())))
    distributed.destroy_process_group()
