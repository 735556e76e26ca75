"""The user's view (DESIGN.md): every adverb, slicing, ValueMesh, async endpoints,
per-sender FIFO, remote errors. Real host agent, real procs."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from regent.controller import ActorError, Point, Session, ValueMesh
from regent.worker import Actor, SupervisionError, current_rank, endpoint


class Counter(Actor):
    def __init__(self, start: int = 0):
        self.n = start
        self.log: list[int] = []

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    def value(self) -> int:
        return self.n

    @endpoint
    def record(self, i: int) -> None:
        self.log.append(i)

    @endpoint
    def recorded(self) -> list[int]:
        return list(self.log)

    @endpoint
    async def slow_incr(self, by: int, delay: float) -> int:
        await asyncio.sleep(delay)
        self.n += by
        return self.n

    @endpoint
    def where(self) -> dict:
        return dict(current_rank())

    @endpoint
    def fail(self, message: str) -> None:
        raise KeyError(message)

    @endpoint
    def echo(self, x):
        return x


@pytest.fixture(scope="module")
def session():
    # Nothing here tests leases: a TTL that a loaded machine's scheduling cannot outlast.
    with Session("endpoints", lease_ttl_s=10.0) as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 4})


@pytest.fixture()
def counters(procs, request):
    name = request.node.name.replace("[", "_").replace("]", "")
    return procs.spawn(name, Counter, start=10)


def test_call_returns_a_value_mesh_with_one_value_per_actor(counters):
    values = counters.incr.call(by=2).get()
    assert isinstance(values, ValueMesh)
    assert len(values) == 4
    assert values.values() == [12, 12, 12, 12]
    assert values.dims == {"hosts": 1, "procs": 4}
    points = [p for p, _ in values.items()]
    assert [p.rank for p in points] == [0, 1, 2, 3]
    assert [p["procs"] for p in points] == [0, 1, 2, 3]
    assert values.item(hosts=0, procs=3) == 12


def test_actors_know_their_coordinates(counters):
    where = counters.where.call().get()
    assert where.values() == [{"hosts": 0, "procs": i} for i in range(4)]


def test_call_one_on_a_slice_reaches_only_that_actor(counters):
    assert counters.slice(procs=1).incr.call_one(by=5).get() == 15
    assert counters.value.call().get().values() == [10, 15, 10, 10]


def test_call_one_on_a_mesh_of_many_is_refused(counters):
    with pytest.raises(ValueError, match="call_one needs a mesh of one actor"):
        counters.incr.call_one()


def test_slicing_by_ranges_and_by_several_dims(counters):
    part = counters.slice(hosts=0, procs=slice(0, 2))
    assert part.dims == {"procs": 2}
    assert part.incr.call().get().values() == [11, 11]
    tail = counters.slice(procs=slice(2, None))
    assert tail.dims == {"hosts": 1, "procs": 2}
    vm = tail.value.call().get()
    assert vm.item(hosts=0, procs=0) == 10
    assert counters.value.call().get().values() == [11, 11, 10, 10]
    with pytest.raises(KeyError, match="no dimension 'gpus'"):
        counters.slice(gpus=0)
    with pytest.raises(IndexError):
        counters.slice(procs=7)


def test_proc_mesh_slices_spawn_on_their_members_only(procs):
    m = procs.slice(procs=slice(1, 3)).spawn("sliced_counters", Counter, start=0)
    assert len(m) == 2
    assert m.where.call().get().values() == [{"hosts": 0, "procs": 0}, {"hosts": 0, "procs": 1}]


def test_broadcast_is_fire_and_forget_but_delivered(counters):
    assert counters.incr.broadcast(by=3) is None
    # Same sender, same actor: the later call observes the broadcast (FIFO).
    assert counters.value.call().get().values() == [13, 13, 13, 13]


def test_choose_calls_exactly_one_actor(counters):
    before = sum(counters.value.call().get().values())
    got = counters.incr.choose(by=1).get()
    assert got == 11
    assert sum(counters.value.call().get().values()) == before + 1


def test_choose_spreads_over_the_mesh(counters):
    for _ in range(8):
        counters.incr.choose().get()
    assert counters.value.call().get().values() == [12, 12, 12, 12]


def test_stream_yields_every_point_in_completion_order(counters):
    # The actor at procs=0 sleeps longest, so it must come last.
    delays = [0.3, 0.0, 0.0, 0.0]
    results = []
    for i, d in enumerate(delays):
        counters.slice(procs=i).slow_incr.call_one(0, d)
    for point, value in counters.value.stream():
        results.append((point, value))
    assert isinstance(results[0][0], Point)
    assert sorted(p.rank for p, _ in results) == [0, 1, 2, 3]
    assert results[-1][0].rank == 0


def test_async_endpoints_run_and_keep_mailbox_order(counters):
    one = counters.slice(procs=2)
    futs = [one.slow_incr.call_one(1, 0.02), one.incr.call_one(100), one.slow_incr.call_one(1000, 0.0)]
    assert [f.get(timeout=10) for f in futs] == [11, 111, 1111]


def test_per_sender_fifo_order_is_kept(counters):
    one = counters.slice(procs=3)
    for i in range(500):
        one.record.broadcast(i)
    assert one.recorded.call_one().get() == list(range(500))


def test_pipelined_calls_mixed_with_async_ones_and_a_stop_keep_each_actors_order(procs):
    """A proc queues a batch's calls before running them (one greenlet switch for an actor's run
    of sync calls): sync and async calls of two actors keep each actor's order, and a stop sent
    after them ends the rest of that actor's calls, each answered (an async call the stop
    cancelled before it began too: it used to be left unanswered)."""
    a = procs.spawn("order_a", Counter, start=0).slice(procs=0)
    b = procs.spawn("order_b", Counter, start=0).slice(procs=0)
    of_a, of_b = [], []
    for i in range(300):
        of_a.append(a.incr.call_one(1))
        of_b.append(b.incr.call_one(2))
        if i % 50 == 0:
            of_a.append(a.slow_incr.call_one(1000, 0.0))
    a.stop()
    got_a, ended = [], 0
    for f in of_a:
        try:
            value = f.get(timeout=30)
        except SupervisionError as e:
            assert "order_a was stopped by the program" in str(e)
            ended += 1
            continue
        assert not ended, "a call ran after one the stop ended"
        got_a.append(value)
    assert got_a == sorted(got_a) and len(set(got_a)) == len(got_a)
    assert [f.get(timeout=30) for f in of_b] == list(range(2, 601, 2))


def test_futures_are_awaitable_on_the_sessions_loop(session, counters):
    async def main():
        a = counters.slice(procs=0).incr.call_one(by=1)
        b = counters.incr.call(by=1)
        return await a, (await b).values()

    one, many = session.run(main())
    assert one == 11
    assert many == [12, 11, 11, 11]


def test_actor_error_carries_the_remote_traceback_and_the_actor_keeps_serving(counters):
    one = counters.slice(procs=0)
    with pytest.raises(ActorError) as info:
        one.fail.call_one("no such key").get()
    err = info.value
    assert err.exc_type == "KeyError"
    assert "no such key" in err.message
    assert "in fail" in err.remote_traceback and "raise KeyError" in err.remote_traceback
    assert one.incr.call_one().get() == 11


def test_unknown_endpoint_is_an_attribute_error(counters):
    with pytest.raises(AttributeError, match="has no endpoint 'nope'"):
        counters.nope  # noqa: B018


def test_numpy_and_torch_values_round_trip(counters):
    one = counters.slice(procs=1)
    arr = np.arange(1000, dtype=np.float32)
    ten = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    got = one.echo.call_one({"a": arr, "t": ten}).get()
    assert np.array_equal(got["a"], arr)
    assert torch.equal(got["t"], ten) and got["t"].dtype == torch.bfloat16
    big = torch.randn(1 << 20)
    assert torch.equal(one.echo.call_one(big).get(), big)


def test_get_with_timeout_raises_timeout_error(counters):
    fut = counters.slice(procs=0).slow_incr.call_one(1, 0.5)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.05)
    assert fut.get(timeout=10) == 11


@pytest.mark.serial  # it keeps both cores busy for its whole run
def test_a_hundred_thousand_pipelined_calls_all_get_their_reply(counters):
    one = counters.slice(procs=0)
    futs = [one.incr.call_one() for _ in range(100_000)]
    assert [f.get(timeout=120) for f in futs[-3:]] == [100_008, 100_009, 100_010]
    assert all(f.done() for f in futs)
    assert one.value.call_one().get() == 100_010


def test_stream_with_a_deadline_yields_what_arrived_then_raises_timeout_error(counters):
    for i, d in enumerate([0.0, 0.0, 0.0, 0.6]):  # rank 3 is busy for 0.6 s
        counters.slice(procs=i).slow_incr.call_one(0, d)
    seen = []
    with pytest.raises(TimeoutError, match="stream seq"):
        for point, _value in counters.value.stream().iter(timeout=0.3):
            seen.append(point["procs"])
    assert sorted(seen) == [0, 1, 2]
    # Without a deadline the stream waits as long as it takes.
    assert sorted(v for _, v in counters.value.stream()) == [10, 10, 10, 10]
