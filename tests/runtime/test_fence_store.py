"""FenceStore (worker/fencing.py) on its own: what a restarted host agent reads back of
the epochs its predecessor saw, and what it refuses to believe."""

from __future__ import annotations

import json

from regent.worker.fencing import FenceStore


def test_a_saved_epoch_is_read_back_by_another_store_on_the_same_directory(tmp_path):
    FenceStore(tmp_path / "fences").save("s.1", 7)
    FenceStore(tmp_path / "fences").save("s.1", 9)
    again = FenceStore(tmp_path / "fences")
    assert (again.load("s.1"), again.load("s.2")) == (9, 0)
    (f,) = (tmp_path / "fences").iterdir()
    assert f.stat().st_mode & 0o777 == 0o600 and "s.1" not in f.name  # the id never names a file


def test_a_session_id_cannot_reach_outside_the_directory(tmp_path):
    store = FenceStore(tmp_path / "fences")
    store.save("../../escape", 3)
    assert [p.parent for p in tmp_path.rglob("*") if p.is_file()] == [tmp_path / "fences"]
    assert store.load("../../escape") == 3


def test_a_file_that_is_not_this_session_s_fence_counts_as_none(tmp_path):
    store = FenceStore(tmp_path / "fences")
    store.save("s.1", 5)
    (path,) = (tmp_path / "fences").iterdir()
    for content in ("garbage", "[]", json.dumps({"sid": "other", "epoch": 5}),
                    json.dumps({"sid": "s.1", "epoch": "5"}), json.dumps({"sid": "s.1", "epoch": -1}),
                    json.dumps({"sid": "s.1", "epoch": True})):
        path.write_text(content)
        assert store.load("s.1") == 0, content


def test_old_fences_are_pruned_but_never_those_of_sessions_still_served(tmp_path):
    store = FenceStore(tmp_path / "fences", kept=10)
    store.save("live", 1)
    for i in range(15):
        store.save(f"s.{i}", 1, keep={"live"})
    assert len(list((tmp_path / "fences").iterdir())) == 10
    assert store.load("live") == 1 and store.load("s.14") == 1  # the one just written stays too
