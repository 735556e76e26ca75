"""A first regent program: spawn a mesh, create actors, use every endpoint adverb.

Run it with `.venv/bin/python examples/quickstart.py`. The actor class lives in
this script (`__main__`): procs receive it by value.
"""

from __future__ import annotations

import asyncio

from regent import Actor, ActorError, Session, current_rank, endpoint


class Counter(Actor):
    def __init__(self, start: int = 0):
        self.n = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    async def slow_square(self, x: int) -> int:
        await asyncio.sleep(0.05 * (current_rank()["procs"] + 1))
        return x * x

    @endpoint
    def divide(self, a: float, b: float) -> float:
        return a / b


def main() -> None:
    with Session("quickstart") as s:
        procs = s.spawn_procs(per_host={"procs": 4})
        counters = procs.spawn("counters", Counter, start=0)
        print("mesh:", counters)
        values = counters.incr.call(by=2).get()
        print("call      ->", values.values())
        print("call_one  ->", counters.slice(procs=1).incr.call_one().get())
        counters.incr.broadcast(by=10)
        print("broadcast -> (fire and forget)")
        print("choose    ->", counters.incr.choose().get())
        order = [(p["procs"], v) for p, v in counters.slow_square.stream(7)]
        print("stream    ->", order)
        try:
            counters.slice(procs=0).divide.call_one(1, 0).get()
        except ActorError as e:
            print("ActorError->", e.exc_type, e.message)
        print("final     ->", counters.incr.call(by=0).get().values())


if __name__ == "__main__":
    main()
