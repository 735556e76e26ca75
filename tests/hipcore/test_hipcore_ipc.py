"""Inter-process events and barriers across real processes (spawn), including a dead owner."""

from __future__ import annotations

import os
import pickle
import signal
import time

import hipcore_children as children
import pytest

from regent import hipcore
from regent.hipcore import Barrier, BrokenBarrierError, IpcError, IpcEvent

ON_CPU = hipcore.backend().name == "cpu"


def _join(procs, timeout=60):
    for p in procs:
        p.join(timeout)
        assert p.exitcode == 0, f"child {p.pid} exited with {p.exitcode}"


def test_barrier_releases_four_processes_together_each_round(spawn):
    barrier = Barrier(4)
    out = spawn.Queue()
    procs = [spawn.Process(target=children.barrier_party, args=(barrier, 3, out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    _join(procs)
    for r in range(3):
        arrivals = [times[r][0] for times in results]
        departures = [times[r][1] for times in results]
        assert min(departures) >= max(arrivals), f"round {r}: someone left before the last arrived"
        assert sorted(times[r][2] for times in results) == [0, 1, 2, 3]


def test_a_barrier_timeout_breaks_it_for_every_party():
    barrier = Barrier(2)
    with pytest.raises(BrokenBarrierError, match="timed out"):
        barrier.wait(timeout=0.2)
    assert barrier.broken
    with pytest.raises(BrokenBarrierError):
        pickle.loads(pickle.dumps(barrier)).wait(timeout=5)


def test_a_barrier_handle_is_small_and_picklable():
    assert len(pickle.dumps(Barrier(3))) < 400
    assert len(pickle.dumps(IpcEvent())) < 600


def test_processes_waiting_on_an_ipc_event_see_the_work_before_it(spawn):
    to_parent, from_parent, out = spawn.Queue(), spawn.Queue(), spawn.Queue()
    owner = spawn.Process(target=children.ipc_event_owner, args=(to_parent, from_parent, 0.5))
    owner.start()
    payload = to_parent.get(timeout=60)
    waiters = [
        spawn.Process(target=children.ipc_event_waiter, args=(payload, out)) for _ in range(3)
    ]
    for p in waiters:
        p.start()
    results = [out.get(timeout=120) for _ in waiters]
    from_parent.put("stop")
    _join(waiters + [owner])
    for via_stream, via_host, queried in results:
        assert via_host == 42 and queried
        if ON_CPU:
            assert via_stream == 42, "a stream waiting on the IpcEvent ran ahead of it"


@pytest.mark.slow
def test_an_ipc_event_whose_owner_is_killed_fails_its_waiters(spawn):
    to_parent, from_parent, out = spawn.Queue(), spawn.Queue(), spawn.Queue()
    owner = spawn.Process(target=children.ipc_event_owner, args=(to_parent, from_parent, 600.0))
    owner.start()
    payload = to_parent.get(timeout=60)
    waiter = spawn.Process(target=children.ipc_event_synchronize, args=(payload, out))
    waiter.start()
    assert out.get(timeout=60) == "opened"
    os.kill(owner.pid, signal.SIGKILL)
    owner.join(10)
    t0 = time.monotonic()
    result = out.get(timeout=30)
    assert result.startswith("PeerGoneError"), result
    assert f"pid {owner.pid}" in result
    assert time.monotonic() - t0 < 10
    _join([waiter])


def test_only_the_creating_process_may_record_an_ipc_event():
    event = IpcEvent()
    opened = IpcEvent.open(event.handle)
    opened.is_owner = False  # as seen from another process
    with pytest.raises(IpcError, match="only allowed in the process that created"):
        opened.record()


def test_ipc_event_query_and_synchronize_in_the_owner():
    s = hipcore.current_device().stream()
    event = IpcEvent()
    assert event.query()
    s.delay(0.2)
    event.record(s)
    assert not event.query()
    event.synchronize(timeout=10)
    assert event.query()
