"""DedupeCache (worker/dedupe.py) on its own: what a watermark releases, whatever order
the calls came in."""

from __future__ import annotations

import pytest

from regent.wire import Kind
from regent.worker.dedupe import LARGE_RESULT_BYTES, CallIdentity, DedupeCache
from regent.worker.errors import DivergenceError

ADD = CallIdentity(Kind.CALL, "add", 0, b"d")


def _run(cache: DedupeCache, seq: int, actor: str = "a", size: int = 10, finish: bool = True) -> None:
    assert cache.admit(seq, actor, ADD, "rt") == ("run", None)
    if finish:
        cache.complete(seq, actor, ({"s": seq}, ()), size)


def test_a_watermark_releases_small_finished_results_at_or_below_it():
    cache = DedupeCache()
    for seq in range(10):
        _run(cache, seq)
    _run(cache, 10, finish=False)  # in flight: kept whatever the watermark
    _run(cache, 11, size=LARGE_RESULT_BYTES)  # large: kept until the checkpoint watermark
    assert cache.watermark(11, -1) == 10
    assert len(cache) == 2
    assert cache.admit(10, "a", ADD, "rt2") == ("joined", None)
    with pytest.raises(DivergenceError, match="released"):
        cache.admit(3, "a", ADD, "rt")
    assert cache.watermark(11, 11) == 1  # the large one goes with the checkpoint
    assert len(cache) == 1


def test_calls_that_arrive_out_of_seq_order_are_released_too():
    cache = DedupeCache()
    for seq in (5, 6, 7, 2, 9, 3, 20, 1):  # a new leader resends older calls among new ones
        _run(cache, seq)
    assert cache.watermark(6, -1) == 5  # 1, 2, 3, 5, 6: none hides behind 7 or 9
    assert cache.watermark(9, -1) == 2
    _run(cache, 21)
    _run(cache, 22)
    assert cache.watermark(21, -1) == 2  # 20 and 21
    assert len(cache) == 1


def test_one_call_id_reaching_several_actors_is_kept_per_actor():
    cache = DedupeCache()
    _run(cache, 1, "a")
    _run(cache, 1, "b")
    _run(cache, 2, "a", finish=False)
    assert cache.watermark(1, -1) == 2
    assert len(cache) == 1


# The same id and arguments, anything else different: another call, never the first one's result.
OTHERS = [
    pytest.param(ADD._replace(method="sub"), id="another endpoint"),
    pytest.param(ADD._replace(point=1), id="another point"),
    pytest.param(ADD._replace(kind=Kind.STOP), id="another kind"),
    pytest.param(ADD._replace(digest=b"e"), id="other arguments"),
]


@pytest.mark.parametrize("other", OTHERS)
def test_a_finished_call_id_reused_for_another_call_is_a_divergence(other):
    cache = DedupeCache()
    _run(cache, 1)
    with pytest.raises(DivergenceError, match="seq 1 to a was first sent as CALL 'add' at point 0") as e:
        cache.admit(1, "a", other, "rt2")
    assert other.describe() in str(e.value)
    assert cache.admit(1, "a", ADD, "rt3") == ("cached", ({"s": 1}, ()))  # the call itself still hits


@pytest.mark.parametrize("other", OTHERS)
def test_a_call_id_in_flight_reused_for_another_call_is_a_divergence_and_joins_nothing(other):
    cache = DedupeCache()
    _run(cache, 1, finish=False)
    with pytest.raises(DivergenceError, match="not run again"):
        cache.admit(1, "a", other, "rt2")
    assert cache.admit(1, "a", ADD, "rt3") == ("joined", None)
    assert cache.complete(1, "a", ({"s": 1}, ()), 10) == ["rt", "rt3"]  # rt2 is no waiter


def test_calls_made_by_actors_are_kept_apart_from_the_controllers_call_of_the_same_seq():
    c = DedupeCache()
    assert c.admit(5, "a", ADD, "ctl") == ("run", None)
    assert c.admit(5, "a", ADD, "p1", origin="relay[0]#0") == ("run", None)
    assert c.admit(5, "a", ADD, "p1", origin="relay[0]#1") == ("run", None)
    assert c.admit(5, "a", ADD, "p2", origin="relay[0]#0") == ("joined", None)
    assert c.complete(5, "a", "r0", 1, origin="relay[0]#0") == ["p1", "p2"]
    assert c.admit(5, "a", ADD, "p1", origin="relay[0]#0") == ("cached", "r0")
    with pytest.raises(DivergenceError, match="relay"):
        c.admit(5, "a", CallIdentity(Kind.CALL, "add", 0, b"other"), "p1", origin="relay[0]#0")


def test_a_call_made_by_an_actor_is_not_refused_below_the_watermark_and_outlives_it_a_while(monkeypatch):
    """A broadcast's handler may call after the broadcast's seq was released; its callee keeps
    the answer DERIVED_HOLD_S after it finished, for the caller's resends."""
    from regent.worker import dedupe

    c = DedupeCache()
    c.watermark(10, -1)
    assert c.admit(3, "a", ADD, "p1", origin="b[1]#0") == ("run", None)
    c.complete(3, "a", "r", 1, origin="b[1]#0")
    c.watermark(11, -1)
    assert c.admit(3, "a", ADD, "p1", origin="b[1]#0") == ("cached", "r")
    monkeypatch.setattr(dedupe, "DERIVED_HOLD_S", 0.0)
    c.watermark(11, -1)
    assert len(c) == 0
