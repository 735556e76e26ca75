"""Large frames out of band through shared memory between processes of one host (wire.bulk):
tensors and arrays in calls and results arrive equal, with their dtype and shape, on every
route; a segment is private, checked before it is mapped, taken once, reused by its sender only
once its receiver let go of it, and given up by its sender, a dead sender's sweep or its
receiver's end; a receiver that cannot take one drops the message and its sender sends it again."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from regent import wire
from regent.controller import Session
from regent.wire import bulk
from regent.wire.protocol import Kind, batchable, kind_byte, relay_header
from regent.worker import Actor, endpoint
from tests.support.agenthome import wait_for

BIG = 1 << 20
THRESHOLD = 256 * 1024


def _message(*payload: bytes) -> list:
    return wire.encode(Kind.CALL, {"s": 1}, [b"main", *payload])


def _envelope(*payload: bytes) -> tuple[list, dict]:
    out = bulk.export(_message(*payload), THRESHOLD, "tcp://127.0.0.1:1")
    assert kind_byte(out[0]) == Kind.BULK
    _, meta, inner = wire.decode(out)
    return inner, meta


def test_a_large_frame_travels_in_a_private_segment_taken_once():
    small, big = b"s" * 100, os.urandom(BIG)
    inner, meta = _envelope(small, big)
    [[index, name, size, _]] = meta["seg"]
    assert (index, size) == (3, BIG) and inner[3] == b"" and inner[2] == small  # only the large frame moved
    path = Path(bulk.SHM_DIR) / name
    assert path.stat().st_mode & 0o777 == 0o600
    frames = bulk.take(inner, meta, 1 << 30)
    assert bytes(frames[3]) == big and bytes(frames[2]) == small and name in bulk.in_use()
    frames[3][:4] = b"\0\0\0\0"  # a receiver may write to its mapping: its own pages only
    with pytest.raises(bulk.BulkError, match="taken already"):
        bulk.take(inner, meta, 1 << 30)  # the same envelope twice
    del frames
    gc.collect()
    assert name not in bulk.in_use() and name in bulk.held()  # released: kept for the next frame
    bulk.forget("tcp://127.0.0.1:1")


def test_hipcores_orphan_sweep_leaves_a_live_senders_frames_alone():
    """hipcore's segments share the `regent-` prefix: its sweep of dead creators' segments (run as a
    process makes its first one) must not read a frame's uid as a pid and unlink it mid-flight."""
    from regent.hipcore import _shm

    inner, meta = _envelope(os.urandom(BIG))
    name = meta["seg"][0][1]
    with pytest.raises(ValueError, match="not a hipcore"):
        _shm.owner_of(name)
    assert name not in _shm.sweep_orphans() and name in bulk.in_use()
    frames = bulk.take(inner, meta, 1 << 30)
    assert len(frames[2]) == BIG
    del frames
    gc.collect()
    bulk.forget("tcp://127.0.0.1:1")


def test_a_segment_is_reused_only_once_its_receiver_let_go_of_it():
    first = [os.urandom(BIG) for _ in range(3)]
    held = [bulk.take(*_envelope(b), 1 << 30)[2] for b in first]  # three mappings alive
    names = [bulk.held()]
    inner, meta = _envelope(os.urandom(BIG))
    fourth = meta["seg"][0][1]
    assert all(bytes(h) == b for h, b in zip(held, first, strict=True))  # none was written over
    assert fourth not in names[0]  # nothing released: a new segment
    bulk.take(inner, meta, 1 << 30)  # taken and dropped at once: released
    gc.collect()
    again = _envelope(os.urandom(BIG))[1]["seg"][0]
    assert again[1] == fourth and again[3] == 2  # the same pages, its second generation
    with pytest.raises(bulk.BulkError, match="taken already or reused"):
        bulk.take(inner, meta, 1 << 30)  # the first generation's envelope names the reused segment
    assert all(bytes(h) == b for h, b in zip(held, first, strict=True))
    del held
    gc.collect()
    bulk.forget("tcp://127.0.0.1:1")


def test_a_child_forked_while_a_frame_is_mapped_does_not_release_it():
    inner, meta = _envelope(os.urandom(BIG))
    name = meta["seg"][0][1]
    held = bulk.take(inner, meta, 1 << 30)
    pid = os.fork()
    if pid == 0:  # a data loader's worker, say: it drops its copy of the mapping and ends
        del held
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert name in bulk.in_use()  # the parent maps it still: not the sender's to reuse
    del held
    gc.collect()
    assert name not in bulk.in_use()
    bulk.forget("tcp://127.0.0.1:1")


def test_a_child_forked_by_a_sender_leaves_its_segments_at_its_exit():
    code = ("import os, sys; from regent.wire import bulk, protocol; "
            "msg = protocol.encode(protocol.Kind.CALL, {}, [b'm', os.urandom(1 << 20)]); "
            "bulk.export(msg, 4096, 'tcp://127.0.0.1:9'); mine = bulk.held(os.getpid()); "
            "pid = os.fork(); "
            "sys.exit(0) if pid == 0 else None; "  # the child exits normally: atexit runs there
            "os.waitpid(pid, 0); print(mine == bulk.held(os.getpid()) and len(mine) == 1, flush=True)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_the_free_segments_a_sender_keeps_are_bounded(monkeypatch):
    monkeypatch.setenv(bulk.POOL_ENV, str(2 * BIG))
    for _ in range(4):
        bulk.take(*_envelope(os.urandom(BIG), os.urandom(BIG), os.urandom(BIG)), 1 << 30)
        gc.collect()
    _envelope(os.urandom(BIG // 2))  # collects: three released, room for two
    bulk.forget("tcp://127.0.0.1:1")
    gc.collect()
    mine = bulk.held(os.getpid())
    assert len(mine) <= 3 and not bulk.in_use(os.getpid()), mine
    monkeypatch.setenv(bulk.POOL_ENV, "0")
    _envelope(os.urandom(BIG // 2))
    bulk.forget("tcp://127.0.0.1:1")
    assert bulk.held(os.getpid()) == []


def test_a_small_message_and_a_peer_elsewhere_are_left_alone():
    msg = _message(b"x" * 1000)
    assert bulk.export(msg, THRESHOLD, "tcp://127.0.0.1:1") is msg
    assert bulk.is_local("tcp://127.0.0.1:5555") and not bulk.is_local("tcp://10.0.0.2:5555")


def test_a_relayed_message_is_wrapped_inside_its_relay_header():
    msg = [relay_header("tcp://127.0.0.1:9"), *_message(os.urandom(BIG))]
    out = bulk.export(msg, THRESHOLD, "tcp://127.0.0.1:1")
    assert out[0] == msg[0] and kind_byte(out[1]) == Kind.BULK  # the agent passes the envelope on
    assert not batchable(out[1:], 100)  # and never inside a batch: the receiver's transport opens it
    bulk.discard(out[1:])
    _, meta, _ = wire.decode(out[1:])
    assert meta["seg"][0][1] not in bulk.in_use()  # not sent: free for the next frame


@pytest.mark.parametrize("defect", ["foreign name", "other user", "symlink", "readable by others", "wrong size",
                                    "not empty", "over the limit"])
def test_a_segment_that_is_not_a_private_file_of_this_user_is_refused_and_removed(tmp_path, defect):
    inner, meta = _envelope(os.urandom(BIG))
    name = meta["seg"][0][1]
    path = Path(bulk.SHM_DIR) / name
    limit = 1 << 30
    if defect == "foreign name":
        meta["seg"][0][1] = "../etc/passwd"
    elif defect == "other user":
        meta["seg"][0][1] = name.replace(f"regent-{os.getuid()}-", f"regent-{os.getuid() + 1}-")
    elif defect == "symlink":
        target = tmp_path / "target"
        target.write_bytes(b"x" * BIG)
        path.unlink()
        path.symlink_to(target)
    elif defect == "readable by others":
        path.chmod(0o644)
    elif defect == "wrong size":
        meta["seg"][0][2] = 4 * BIG  # more than the file holds
    elif defect == "not empty":
        inner[2] = b"not a placeholder"
        meta["seg"][0][0] = 2
    else:
        limit = BIG - 1
    with pytest.raises(bulk.BulkError):
        bulk.take(inner, meta, limit)
    if defect in ("foreign name", "other user"):  # not taken, nor touched
        assert name in bulk.in_use()
        path.unlink()
    elif defect in ("not empty", "over the limit"):  # a sound segment of a refused envelope: back to its sender
        assert name in bulk.held() and name not in bulk.in_use()
        path.unlink()
    assert not path.exists() and not path.is_symlink()
    bulk.forget("tcp://127.0.0.1:1")


def test_segments_of_a_dead_sender_are_swept_and_a_live_senders_kept():
    code = ("import os, sys; from regent.wire import bulk, protocol; "
            "msg = protocol.encode(protocol.Kind.CALL, {}, [b'm', os.urandom(1 << 20)]); "
            "bulk.export(msg, 4096, 'tcp://127.0.0.1:9'); print('ok', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ok"
    [left] = bulk.held(child.pid)
    child.kill()
    child.wait()
    mine = _envelope(os.urandom(BIG))[1]["seg"][0][1]
    bulk.sweep(grace_s=60.0)
    assert left in bulk.held(child.pid)  # too recent: it may still be in flight
    bulk.sweep(grace_s=0.0)
    assert not bulk.held(child.pid) and mine in bulk.held()  # this (live) sender's stays
    bulk.forget("tcp://127.0.0.1:1")


def test_a_sender_gives_up_a_segment_nobody_took(monkeypatch):
    monkeypatch.setattr(bulk, "SEGMENT_TTL_S", 0.0)
    first = _envelope(os.urandom(BIG))[1]["seg"][0][1]
    time.sleep(0.01)
    _envelope(os.urandom(BIG))  # each export gives up what has waited longer than the TTL
    assert first not in bulk.held()
    bulk.forget("tcp://127.0.0.1:1")



def test_the_free_segments_kept_are_at_most_an_eighth_of_dev_shm(monkeypatch):
    monkeypatch.setattr(bulk._segments, "shm_bytes", 8 * BIG)  # a container's small /dev/shm
    names = []
    for _ in range(3):
        inner, meta = _envelope(os.urandom(BIG), os.urandom(BIG), os.urandom(BIG))
        names += [seg[1] for seg in meta["seg"]]
        bulk.take(inner, meta, 1 << 30)
        gc.collect()
    _envelope(os.urandom(BIG // 2))  # collects: room for one of them
    bulk.forget("tcp://127.0.0.1:1")
    assert len(set(names) & set(bulk.held(os.getpid()))) <= 1


def test_a_full_dev_shm_gives_the_free_segments_back_and_tries_once_more(monkeypatch):
    bulk._segments._drop_free()  # none of earlier tests' to reuse
    inner, meta = _envelope(os.urandom(2 * BIG))
    freed = meta["seg"][0][1]
    bulk.take(inner, meta, 1 << 30)
    gc.collect()  # released: kept free, in a size class of its own
    create, calls = bulk._Segments._create, []

    def full_once(self, name, view):
        calls.append(name)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return create(self, name, view)

    monkeypatch.setattr(bulk._Segments, "_create", full_once)
    _, meta = _envelope(os.urandom(BIG))
    assert len(calls) == 2 and meta["seg"][0][1] == calls[1]  # out of band all the same
    assert freed not in bulk.held()  # the free segment's room was given back
    bulk.forget("tcp://127.0.0.1:1")


# --- through real sessions -----------------------------------------------------------------

class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    async def echo_async(self, x: object) -> object:
        await asyncio.sleep(0)
        return x

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def add_one(self, x: np.ndarray) -> np.ndarray:
        x += 1  # writes to its own mapping: the sender's array is not changed
        return x


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool]


def _tensors() -> list[torch.Tensor]:
    out = []
    for dtype in DTYPES:
        n = (BIG // torch.tensor([], dtype=dtype).element_size()) + 7  # above the threshold
        out.append((torch.arange(n) % 100).to(dtype))
    big = torch.arange(512 * 1024, dtype=torch.float32).reshape(512, 1024)
    out += [big.t(), big[::2, 3:], big[:0], torch.ones(10), big.reshape(64, 8, 1024)]  # strided, empty, small
    return out


def _arrays() -> list[np.ndarray]:
    out = [np.arange(BIG // np.dtype(d).itemsize + 3).astype(d) for d in
           ("float32", "float64", "int8", "uint16", "int64", "bool", "complex64")]
    big = np.arange(1 << 18, dtype=np.float64).reshape(512, 512)
    return [*out, big.T, big[::3, ::2], np.zeros((0, 4)), np.ones(5)]


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


@pytest.fixture(params=["direct", "relay"])
def route(request, own_home) -> str:
    own_home(REGENT_HIPCORE_BACKEND="cpu", REGENT_RELAY="1" if request.param == "relay" else "0")
    return request.param


def _pids(mesh) -> list[int]:
    return [os.getpid(), *mesh.pid.call().get(timeout=30).values()]


def _in_use(pids: list[int]) -> list[str]:
    gc.collect()
    return [n for p in pids for n in bulk.in_use(p)]


def _all_released(mesh) -> None:
    """Every segment of the session let go of once the program drops its values (a proc lets go of
    its calls' arguments when it has answered, of its results at the watermark)."""
    pids = _pids(mesh)
    wait_for(lambda: not _in_use(pids), 10, "every segment released")


def test_tensors_and_arrays_of_every_dtype_and_shape_echo_equal(route):
    with Session(f"bulk-echo-{route}", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("e", Echo)
        one = mesh.slice(procs=1)
        values = [*_tensors(), *_arrays()]
        for value in values:
            assert _same(value, one.echo.call_one(value).get(timeout=60)), value.dtype
        for value in values[::3]:
            assert _same(value, one.echo_async.call_one(value).get(timeout=60))
            got = mesh.echo.call({"v": value, "n": 3}).get(timeout=60)  # a mesh-wide call: one segment each
            assert all(_same(value, r["v"]) and r["n"] == 3 for r in got.values())
        a = np.arange(BIG, dtype=np.int64)
        assert np.array_equal(one.add_one.call_one(a).get(timeout=60), a + 1) and a[0] == 0
        del got
        _all_released(mesh)


def test_values_the_program_holds_stay_intact_while_segments_are_reused(own_home):
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    with Session("bulk-reuse", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("e", Echo)
        pids = _pids(mesh)
        kept = [mesh.echo.call_one(torch.full((BIG,), float(i))).get(timeout=60) for i in range(4)]
        for i in range(4, 12):  # the program drops these at once: their segments come back
            assert torch.equal(mesh.echo.call_one(torch.full((BIG,), float(i))).get(timeout=60),
                               torch.full((BIG,), float(i)))
        assert all(torch.equal(k, torch.full((BIG,), float(i))) for i, k in enumerate(kept))
        # The proc's results: 4 held by the program, the other 8 let go at once, so their
        # segments come back (the controller's arguments are held by the proc until the next
        # watermark, however many echoes fit in between: not counted).
        made = len(bulk.held(pids[1]))
        assert made <= 8, made
        del kept
        _all_released(mesh)


def test_a_large_result_in_a_journaled_session(own_home, tmp_path):
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    journal = f"sqlite://{tmp_path / 'j.db'}"
    value = torch.arange(1 << 20, dtype=torch.float32)
    with Session("bulk-journal", journal=journal) as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("e", Echo)
        assert _same(value, mesh.echo.call_one(value).get(timeout=60))
        pids = _pids(mesh)  # the proc keeps the result (over the call's segment) for a standby
    wait_for(lambda: not [n for p in pids for n in bulk.held(p) if p != os.getpid()], 20,
             "the proc's segments gone with it")
    assert not _in_use([os.getpid()])


def test_a_receiver_killed_before_it_reads_leaves_no_segment(own_home):
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    with Session("bulk-receiver-dies", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("e", Echo)
        pid = mesh.pid.call_one().get(timeout=30)
        os.kill(pid, signal.SIGSTOP)  # it never reads the call
        mesh.echo.call_one(torch.zeros(BIG))
        wait_for(lambda: bulk.in_use(os.getpid()), 10, "the call's segment was written")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not bulk.in_use(os.getpid()), 20, "the dead receiver's segment was given up")


def test_turned_off_large_frames_travel_inline(own_home):
    own_home(REGENT_HIPCORE_BACKEND="cpu", REGENT_BULK_BYTES="0")
    with Session("bulk-off", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("e", Echo)
        value = torch.arange(1 << 20)
        assert _same(value, mesh.echo.call_one(value).get(timeout=60))
        pids = _pids(mesh)
        assert not [n for p in pids[1:] for n in bulk.held(p)] and not _in_use(pids[:1])
