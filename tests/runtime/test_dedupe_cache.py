"""DedupeCache (worker/dedupe.py) on its own: what a watermark releases, whatever order
the calls came in."""

from __future__ import annotations

import pytest

from worker.dedupe import LARGE_RESULT_BYTES, DedupeCache
from worker.errors import DivergenceError


def _run(cache: DedupeCache, seq: int, actor: str = "a", size: int = 10, finish: bool = True) -> None:
    assert cache.admit(seq, actor, b"d", "rt") == ("run", None)
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
    assert cache.admit(10, "a", b"d", "rt2") == ("joined", None)
    with pytest.raises(DivergenceError, match="released"):
        cache.admit(3, "a", b"d", "rt")
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
