"""One-sided RDMA reads and writes between real processes over shared memory and TCP."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pickle
import signal
import time

import hipcore_children as children
import numpy as np
import pytest

from regent.hipcore import (
    RDMABuffer,
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerGoneError,
    RDMASizeError,
    RDMATimeoutError,
    shared_array,
)

SIZES = [1, 4097, (1 << 20) + 3, 64 << 20]
BIG = 256 << 20


class Owner:
    """A child process that registered one RDMABuffer per size and takes commands."""

    def __init__(self, spawn, sizes, memory):
        self.to_parent, self.from_parent = spawn.Queue(), spawn.Queue()
        self.proc = spawn.Process(
            target=children.rdma_owner, args=(sizes, memory, self.to_parent, self.from_parent)
        )
        self.proc.start()
        self.buffers: list[RDMABuffer] = pickle.loads(self.to_parent.get(timeout=120))

    def ask(self, cmd, arg=None):
        self.from_parent.put((cmd, arg))
        return self.to_parent.get(timeout=120)

    def holds(self, index, salt):
        return self.ask("check", (index, salt))

    def stop(self):
        if self.proc.is_alive():
            self.from_parent.put(("stop", None))
            self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


@pytest.fixture(scope="module")
def shared_owner(spawn):
    owner = Owner(spawn, SIZES + [BIG], "shared")
    yield owner
    owner.stop()


@pytest.fixture
def plain_owner(spawn):
    owner = Owner(spawn, [4097, 1 << 20], "plain")
    yield owner
    owner.stop()


def read(buf, transport, n=None, timeout=60):
    dst = np.empty(buf.size if n is None else n, dtype=np.uint8)
    buf.read_into(dst, transport=transport).get(timeout=timeout)
    return dst


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("index", range(len(SIZES)), ids=[f"{n}B" for n in SIZES])
def test_read_into_copies_the_owners_bytes(shared_owner, transport, index):
    buf = shared_owner.buffers[index]
    assert buf.size == SIZES[index]
    assert np.array_equal(read(buf, transport), children.pattern(SIZES[index], salt=1))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("index", range(len(SIZES)), ids=[f"{n}B" for n in SIZES])
def test_write_from_lands_in_the_owners_memory(shared_owner, transport, index):
    buf, n = shared_owner.buffers[index], SIZES[index]
    buf.write_from(children.pattern(n, salt=2), transport=transport).get(timeout=60)
    assert shared_owner.holds(index, salt=2)
    buf.write_from(children.pattern(n, salt=1), transport=transport).get(timeout=60)
    assert shared_owner.holds(index, salt=1)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_256_mib_round_trip(shared_owner, transport):
    buf = shared_owner.buffers[len(SIZES)]
    expected = children.pattern(BIG, salt=1)
    assert np.array_equal(read(buf, transport, timeout=120), expected)
    buf.write_from(children.pattern(BIG, salt=3), transport=transport).get(timeout=120)
    assert shared_owner.holds(len(SIZES), salt=3)
    buf.write_from(expected, transport=transport).get(timeout=120)


def test_auto_picks_shm_for_shared_memory_and_tcp_for_plain_memory(shared_owner, plain_owner):
    shared = shared_owner.buffers[1].handle
    plain = plain_owner.buffers[0].handle
    assert [name for name, _ in shared.endpoints] == ["shm", "tcp"]
    assert [name for name, _ in plain.endpoints] == ["tcp"]
    assert np.array_equal(read(plain_owner.buffers[1], None), children.pattern(1 << 20, salt=1))
    with pytest.raises(RDMAError, match="transport 'shm' cannot reach"):
        read(plain_owner.buffers[0], "shm")


def test_sub_range_reads_and_writes_with_offset(shared_owner):
    buf, n = shared_owner.buffers[2], SIZES[2]
    expected = children.pattern(n, salt=1)
    for transport in ("shm", "tcp"):
        part = np.empty(1000, dtype=np.uint8)
        buf.read_into(part, offset=n - 1000, transport=transport).get(timeout=30)
        assert np.array_equal(part, expected[-1000:])


def test_wrong_sizes_are_refused_before_anything_moves(shared_owner):
    buf = shared_owner.buffers[1]
    with pytest.raises(RDMASizeError, match="destination has 4096 bytes but the RDMABuffer has 4097"):
        buf.read_into(np.empty(4096, dtype=np.uint8))
    with pytest.raises(RDMASizeError, match="source has 4098 bytes"):
        buf.write_from(np.empty(4098, dtype=np.uint8))
    with pytest.raises(RDMASizeError, match="overruns"):
        buf.read_into(np.empty(10, dtype=np.uint8), offset=4090)
    with pytest.raises(ValueError, match="read-only"):
        buf.read_into(np.frombuffer(bytes(4097), dtype=np.uint8))


def test_a_handle_with_the_wrong_token_is_rejected(shared_owner):
    buf = shared_owner.buffers[1]
    forged = RDMABuffer.from_handle(dataclasses.replace(buf.handle, token=bytes(16)))
    with pytest.raises(RDMAError, match="wrong token"):
        read(forged, "tcp")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_reads_of_a_dropped_buffer_fail_clearly(spawn, transport):
    owner = Owner(spawn, [4097, 4097], "shared")
    try:
        buf = owner.buffers[0]
        read(buf, transport)
        assert owner.ask("drop", 0) == "dropped"
        with pytest.raises(RDMABufferDroppedError, match="released with drop"):
            read(buf, transport)
        with pytest.raises(RDMABufferDroppedError):
            buf.write_from(np.zeros(4097, dtype=np.uint8), transport=transport).get(timeout=30)
        assert np.array_equal(read(owner.buffers[1], transport), children.pattern(4097, salt=1))
    finally:
        owner.stop()


def test_drop_from_a_holder_releases_the_buffer_in_the_owner(plain_owner):
    buf = plain_owner.buffers[0]
    buf.drop()
    buf.drop()  # twice is a no-op
    assert plain_owner.ask("local_read", 0) == "RDMABufferDroppedError"
    with pytest.raises(RDMABufferDroppedError):
        read(buf, "tcp")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_reader_whose_owner_was_killed_gets_an_error(spawn, transport):
    owner = Owner(spawn, [1 << 20], "shared")
    buf = owner.buffers[0]
    read(buf, transport)  # the reader has mapped / connected to the owner already
    os.kill(owner.proc.pid, signal.SIGKILL)
    owner.proc.join(10)
    with pytest.raises(RDMAOwnerGoneError, match=f"pid {owner.proc.pid}"):
        read(buf, transport, timeout=30)


def test_owner_killed_mid_tcp_read_fails_the_future_instead_of_hanging(spawn):
    owner = Owner(spawn, [BIG], "plain")
    buf = owner.buffers[0]
    os.kill(owner.proc.pid, signal.SIGSTOP)  # freeze the owner so the read is in flight
    try:
        future = buf.read_into(np.empty(BIG, dtype=np.uint8), transport="tcp", timeout=120)
        time.sleep(0.5)
        assert not future.done(), "a read from a frozen owner cannot have finished"
        os.kill(owner.proc.pid, signal.SIGKILL)
        with pytest.raises(RDMAOwnerGoneError, match="mid-transfer"):
            future.get(timeout=20)
    finally:
        os.kill(owner.proc.pid, signal.SIGKILL)
        owner.proc.join(10)


def test_a_stalled_owner_times_out_and_later_reads_work(spawn):
    owner = Owner(spawn, [1 << 20], "plain")
    buf = owner.buffers[0]
    try:
        os.kill(owner.proc.pid, signal.SIGSTOP)
        dst = np.empty(1 << 20, dtype=np.uint8)
        with pytest.raises(RDMATimeoutError, match="stalled"):
            buf.read_into(dst, timeout=0.5).get(timeout=20)
        os.kill(owner.proc.pid, signal.SIGCONT)
        assert np.array_equal(read(buf, "tcp"), children.pattern(1 << 20, salt=1))
    finally:
        os.kill(owner.proc.pid, signal.SIGCONT)
        owner.stop()


@pytest.mark.slow
def test_torch_tensors_are_registered_and_filled(spawn, torch):
    owner = Owner(spawn, [4096], "torch")
    try:
        buf = owner.buffers[0]
        dst = torch.empty(1024, dtype=torch.float32)
        buf.read_into(dst).get(timeout=30)
        assert np.array_equal(dst.numpy().view(np.uint8), children.pattern(4096, salt=1))
        buf.write_from(torch.from_numpy(children.pattern(4096, salt=4))).get(timeout=30)
        assert owner.holds(0, salt=4)
    finally:
        owner.stop()


@pytest.mark.slow
@pytest.mark.parametrize("transport", [None, "tcp"])
def test_device_memory_is_readable_and_writable_across_processes(spawn, torch, transport):
    # CPU backend: device memory is host memory served over TCP. GPU backends: CUDA/HIP IPC
    # when the reader sees the owner's GPU, TCP through pinned staging otherwise.
    from regent import hipcore

    n = (8 << 20) + 5
    owner = Owner(spawn, [n], "device")
    try:
        buf = owner.buffers[0]
        assert buf.handle.device == ("cpu" if hipcore.backend().name == "cpu" else "cuda")
        dev = hipcore.current_device()
        dst = dev.empty(n, torch.uint8)
        buf.read_into(dst, transport=transport).get(timeout=60)
        assert np.array_equal(dst.cpu().numpy(), children.pattern(n, salt=1))
        src = dev.empty(n, torch.uint8)
        src.copy_(torch.from_numpy(children.pattern(n, salt=5)))
        dev.synchronize()
        buf.write_from(src, transport=transport).get(timeout=60)
        assert owner.holds(0, salt=5)
    finally:
        owner.stop()


def test_owner_side_reads_and_writes_are_local_copies():
    arr = shared_array((4, 8), dtype=np.float64)
    arr[:] = 1.5
    buf = RDMABuffer(arr)
    out = np.zeros((4, 8))
    buf.read_into(out).get(timeout=10)
    assert (out == 1.5).all()
    buf.write_from(np.full((4, 8), 2.5)).get(timeout=10)
    assert (arr == 2.5).all()
    buf.drop()
    with pytest.raises(RDMABufferDroppedError):
        buf.read_into(out).get(timeout=10)


def test_read_only_memory_can_be_read_but_not_written():
    buf = RDMABuffer(b"hello world")
    assert buf.size == 11
    dst = bytearray(11)
    buf.read_into(dst).get(timeout=10)
    assert bytes(dst) == b"hello world"
    with pytest.raises(RDMAError, match="read-only"):
        buf.write_from(b"HELLO WORLD")


def test_futures_are_awaitable(shared_owner):
    buf = shared_owner.buffers[1]

    async def main():
        dst = np.empty(buf.size, dtype=np.uint8)
        await buf.read_into(dst)
        return dst

    assert np.array_equal(asyncio.run(main()), children.pattern(4097, salt=1))


def test_a_handle_is_small():
    buf = RDMABuffer(shared_array(1 << 20))
    assert len(pickle.dumps(buf)) < 1024
