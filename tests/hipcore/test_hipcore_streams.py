"""Streams and events keep GPU ordering semantics on every backend; memory statistics move."""

from __future__ import annotations

import gc

import pytest

from regent import hipcore
from regent.hipcore import Event, EventError, StreamError

ON_CPU = hipcore.backend().name == "cpu"


@pytest.fixture
def dev():
    return hipcore.current_device()


def zeros(dev, torch, n=1024):
    t = dev.empty(n, torch.float32)
    t.zero_()
    dev.synchronize()
    return t


def test_work_on_one_stream_runs_in_submission_order(dev, torch):
    a = zeros(dev, torch)
    s = dev.stream()
    for i in range(1, 51):
        s.launch(a.mul_, 0)
        s.launch(a.add_, i)
    s.synchronize()
    assert a.cpu().eq(50).all()


def test_stream_waiting_on_an_event_never_runs_ahead_of_it(dev, torch):
    a, b = zeros(dev, torch), zeros(dev, torch)
    producer, consumer = dev.stream(), dev.stream()
    producer.delay(0.3)
    producer.launch(a.fill_, 1.0)
    ready = producer.record_event()
    consumer.wait_event(ready)
    consumer.launch(b.copy_, a)
    consumer.synchronize()
    assert b.cpu().eq(1.0).all()
    assert ready.query()


def test_without_a_wait_the_consumer_races_ahead(dev, torch):
    # The control for the test above: the same program minus wait_event sees the old value.
    a, b = zeros(dev, torch), zeros(dev, torch)
    producer, consumer = dev.stream(), dev.stream()
    producer.delay(0.3)
    producer.launch(a.fill_, 1.0)
    consumer.launch(b.copy_, a)
    consumer.synchronize()
    assert b.cpu().eq(0.0).all()
    producer.synchronize()


def test_wait_stream_orders_after_everything_queued_so_far(dev, torch):
    a, b = zeros(dev, torch), zeros(dev, torch)
    s1, s2 = dev.stream(), dev.stream()
    s1.delay(0.2)
    s1.launch(a.fill_, 3.0)
    s2.wait_stream(s1)
    s2.launch(b.copy_, a)
    s2.synchronize()
    assert b.cpu().eq(3.0).all()


def test_a_wait_targets_the_record_current_at_the_time_of_the_wait(dev, torch):
    a, b = zeros(dev, torch), zeros(dev, torch)
    s1, s2 = dev.stream(), dev.stream()
    event = Event()
    s1.delay(0.1)
    s1.launch(a.fill_, 1.0)
    event.record(s1)
    s2.wait_event(event)
    s2.launch(b.copy_, a)
    s1.delay(1.0)
    s1.launch(a.fill_, 2.0)
    event.record(s1)  # re-record: must not extend the wait already queued on s2
    s2.synchronize()
    assert b.cpu().eq(1.0).all()
    assert not s1.query(), "s1 is still inside its 1 s delay"
    assert not event.query()
    event.synchronize()
    assert event.query() and s1.query()
    assert a.cpu().eq(2.0).all()


def test_query_and_synchronize_follow_the_queued_work(dev):
    s = dev.stream()
    fresh = Event()
    assert fresh.query(), "an event never recorded counts as complete"
    fresh.synchronize()
    s.delay(0.3)
    done = s.record_event()
    assert not done.query()
    assert not s.query()
    done.synchronize()
    assert done.query()
    s.synchronize()
    assert s.query()


def test_elapsed_time_measures_the_work_between_two_events(dev):
    s = dev.stream()
    start, end = Event(enable_timing=True), Event(enable_timing=True)
    start.record(s)
    s.delay(0.05)
    end.record(s)
    end.synchronize()
    ms = start.elapsed_time(end)
    assert ms > 0
    if ON_CPU:
        assert ms >= 45


def test_elapsed_time_needs_enable_timing(dev):
    s = dev.stream()
    start, end = Event(), Event(enable_timing=True)
    start.record(s)
    end.record(s)
    end.synchronize()
    with pytest.raises(EventError, match="enable_timing=True"):
        start.elapsed_time(end)


def test_elapsed_time_needs_both_events_recorded(dev):
    s = dev.stream()
    start, end = Event(enable_timing=True), Event(enable_timing=True)
    start.record(s)
    s.synchronize()
    with pytest.raises(EventError, match="never recorded"):
        start.elapsed_time(end)


def test_elapsed_time_needs_both_events_complete(dev):
    s = dev.stream()
    start, end = Event(enable_timing=True), Event(enable_timing=True)
    start.record(s)
    s.delay(0.5)
    end.record(s)
    with pytest.raises(EventError, match="not completed"):
        start.elapsed_time(end)
    end.synchronize()
    assert start.elapsed_time(end) > 0


def test_copy_async_moves_bytes_through_pinned_memory(dev, torch):
    s = dev.stream()
    host = dev.pinned_empty(4096, torch.uint8)
    host.copy_(torch.arange(4096) % 251)
    device = dev.empty(4096, torch.uint8)
    back = dev.pinned_empty(4096, torch.uint8)
    s.copy_async(device, host)
    s.copy_async(back, device)
    s.synchronize()
    assert torch.equal(back, torch.arange(4096).remainder(251).to(torch.uint8))


def test_memory_stats_move_with_allocations(dev, torch):
    gc.collect()
    before = dev.memory_stats()
    nbytes = 4 << 20
    t = dev.empty(nbytes, torch.uint8)
    pinned = dev.pinned_empty(nbytes, torch.uint8)
    during = dev.memory_stats()
    assert during["allocated_bytes"] >= before["allocated_bytes"] + nbytes
    assert during["peak_allocated_bytes"] >= during["allocated_bytes"]
    assert during["total_allocations"] > before["total_allocations"]
    assert during["pinned_bytes"] == before["pinned_bytes"] + nbytes
    view = t[1:]  # a view keeps the allocation alive
    del t
    gc.collect()
    assert dev.memory_stats()["allocated_bytes"] >= before["allocated_bytes"] + nbytes
    del view, pinned
    gc.collect()
    after = dev.memory_stats()
    assert after["allocated_bytes"] == before["allocated_bytes"]
    assert after["pinned_bytes"] == before["pinned_bytes"]
    assert after["peak_allocated_bytes"] >= before["allocated_bytes"] + nbytes


@pytest.mark.skipif(not ON_CPU, reason="GPU backends raise host-side exceptions at launch")
def test_a_failure_on_a_cpu_stream_surfaces_at_synchronize():
    s = hipcore.current_device().stream()
    ran_after = []
    s.launch(lambda: 1 / 0)
    s.launch(ran_after.append, True)
    with pytest.raises(StreamError, match="ZeroDivisionError"):
        s.synchronize()
    assert ran_after == [True]
    s.synchronize()  # the error is reported once


@pytest.mark.skipif(not ON_CPU, reason="CPU emulation detail")
def test_cpu_streams_run_without_torch_using_plain_callables():
    s1, s2 = hipcore.Stream(), hipcore.Stream()
    log: list[str] = []
    s1.delay(0.2)
    s1.launch(log.append, "producer")
    s2.wait_event(s1.record_event())
    s2.launch(log.append, "consumer")
    s2.synchronize()
    assert log == ["producer", "consumer"]


def test_default_stream_is_shared_per_device(dev):
    assert dev.default_stream() is dev.default_stream()
    e = Event()
    e.record()
    e.synchronize()
    assert e.query()
