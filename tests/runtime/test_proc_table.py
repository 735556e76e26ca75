"""The controller's proc table (controller/refs.py ProcTable): its index by host agent follows
every change, so a host's hello answer and a lost host find exactly that host's procs."""

from __future__ import annotations

from regent.controller.refs import ProcRef, ProcTable


def _proc(i: int, host: str) -> ProcRef:
    return ProcRef(id=f"p{i}", index=i, address=f"tcp://127.0.0.1:{20000 + i}", pid=100 + i, host=host)


def test_the_index_by_host_follows_entries_removals_and_replacements() -> None:
    t = ProcTable()
    for i in range(4):
        t[f"p{i}"] = _proc(i, "tcp://127.0.0.1:1" if i % 2 else "tcp://127.0.0.1:2")
    assert [p.id for p in t.on_host("tcp://127.0.0.1:1")] == ["p1", "p3"]
    t.pop("p1")
    assert [p.id for p in t.on_host("tcp://127.0.0.1:1")] == ["p3"]
    moved = t.pop("p3")  # a replacement: out under its old id, in under its new one elsewhere
    moved.id, moved.host = "p5", "tcp://127.0.0.1:2"
    t[moved.id] = moved
    assert t.on_host("tcp://127.0.0.1:1") == []
    assert [p.id for p in t.on_host("tcp://127.0.0.1:2")] == ["p0", "p2", "p5"]
    del t["p0"]
    t.update({"p6": _proc(6, "tcp://127.0.0.1:3")})
    assert [p.id for p in t.on_host("tcp://127.0.0.1:2")] == ["p2", "p5"]
    assert [p.id for p in t.on_host("tcp://127.0.0.1:3")] == ["p6"]
    t.setdefault("p7", _proc(7, "tcp://127.0.0.1:3"))
    assert [p.id for p in t.on_host("tcp://127.0.0.1:3")] == ["p6", "p7"]
    t.clear()
    assert t.on_host("tcp://127.0.0.1:3") == [] and not t
