"""A port's receiver gets each sending call's values in the order sent, whatever order resends
bring them in, and drops a repeat (worker/ports.py ProcPorts)."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace

from regent.worker.ports import ProcPorts


def _ports() -> ProcPorts:
    rt = SimpleNamespace(loop=asyncio.new_event_loop(), session="s", proc_id="p0", host_inbox="tcp://127.0.0.1:1",
                         inbox=SimpleNamespace(address="tcp://127.0.0.1:2"))
    return ProcPorts(rt)  # type: ignore[arg-type]


def _drain(rx) -> list:
    out = []
    while rx.ready():
        out.append(rx.recv()._fut.result()[1])
    return out


def test_values_from_one_sending_call_come_out_in_the_order_sent():
    ports = _ports()
    _, rx = ports.open("c1")
    for n in (2, 0, 3, 1):
        assert ports.deliver("c1", ("v", f"a{n}"), "call-a", n) is None
    ports.deliver("c1", ("v", "b0"), "call-b", 0)  # another sender is not held behind the first
    assert _drain(rx) == ["a0", "a1", "a2", "a3", "b0"]


def test_a_value_that_comes_before_its_turn_waits_for_the_ones_before_it():
    ports = _ports()
    _, rx = ports.open("c1")
    ports.deliver("c1", ("v", "x1"), "call", 1)
    assert _drain(rx) == []
    ports.deliver("c1", ("v", "x0"), "call", 0)
    assert _drain(rx) == ["x0", "x1"]
    ports.deliver("c1", ("v", "x0 again"), "call", 0)  # a repeat: dropped
    assert _drain(rx) == []


def test_a_receiver_the_program_dropped_takes_no_more_values():
    ports = _ports()
    _, rx = ports.open("c1")
    ports.deliver("c1", ("v", 0), "call", 0)
    del rx
    gc.collect()
    assert "no port c1" in ports.deliver("c1", ("v", 1), "call", 1)
    assert "c1" not in ports._order
