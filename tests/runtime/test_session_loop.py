"""The session's event loop (controller/loop.py), in one process: what asyncio offers works on
it, its wake-ups are journaled only when they are choices, an audit replays an async program
to the same observations without waiting for its sleeps, and a foreign loop is refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from regent.controller import Session
from regent.controller.audit import replay_program
from regent.controller.export import export_perfetto
from regent.controller.loop import SessionLoop
from regent.controller.replay import CALL, expand
from regent.controller.timeline import timeline
from regent.journal import open_journal
from regent.worker import Actor, endpoint


class Echo(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    async def echo(self, x, delay: float = 0.0):
        await asyncio.sleep(delay)
        self.n += 1
        return x


@pytest.fixture(scope="module")
def session():
    with Session("session-loop", journal="off") as s:
        yield s


@pytest.fixture(scope="module")
def pair(session):
    procs = session.spawn_procs(per_host={"procs": 2})
    return procs.slice(procs=0).spawn("a", Echo), procs.slice(procs=1).spawn("b", Echo)


def test_awaiting_on_a_loop_that_is_not_the_sessions_fails_at_once_naming_s_run(pair):
    a, _ = pair

    async def main():
        return await a.echo.call_one(1)

    with pytest.raises(RuntimeError, match=r"s\.run\(main\(\)\)"):
        asyncio.run(main())


def test_s_run_refuses_what_is_not_a_coroutine_and_a_running_loop(session, pair):
    with pytest.raises(TypeError, match="coroutine"):
        session.run(lambda: None)

    async def inner():
        coro = asyncio.sleep(0)
        session.run(coro)

    with pytest.raises(RuntimeError, match="running event loop"):
        session.run(inner())


def test_the_asyncio_api_works_on_the_session_loop(session, pair):
    a, b = pair

    async def main():
        out = {}
        out["gather"] = await asyncio.gather(a.echo.call_one(1), b.echo.call_one(2))
        async with asyncio.TaskGroup() as tg:
            t1 = tg.create_task(_twice(a))
            t2 = tg.create_task(_twice(b))
        out["taskgroup"] = [t1.result(), t2.result()]
        done, pending = await asyncio.wait([asyncio.ensure_future(a.echo.call_one("slow", 0.2)),
                                            asyncio.ensure_future(b.echo.call_one("fast"))],
                                           return_when=asyncio.FIRST_COMPLETED)
        out["wait"] = [f.result() for f in done]
        await asyncio.gather(*pending)
        try:
            async with asyncio.timeout(0.01):
                await a.echo.call_one("late", 0.3)
        except TimeoutError:
            out["timeout"] = True
        event, lock, sem = asyncio.Event(), asyncio.Lock(), asyncio.Semaphore(1)
        order: list[str] = []

        async def setter():
            async with lock, sem:
                order.append(await b.echo.call_one("set"))
            event.set()

        async def waiter():
            await event.wait()
            order.append("woken")

        await asyncio.gather(waiter(), setter())
        out["event"] = order
        t0 = asyncio.get_running_loop().time()
        await asyncio.sleep(0.02)
        out["slept"] = asyncio.get_running_loop().time() - t0 >= 0.0199  # the deadline, to rounding
        out["mixed"] = a.echo.call_one("blocking").get(timeout=10)  # sequential code inside a task
        out["values"] = [isinstance(session.now(), float), 0 <= session.random() < 1,
                         session.side_effect(lambda: "once"), session.replaying]
        return out

    out = session.run(main())
    assert out["gather"] == [1, 2]
    assert out["taskgroup"] == [["x", "y"], ["x", "y"]]
    assert out["wait"] == ["fast"]
    assert out["timeout"] is True
    assert out["event"] == ["set", "woken"]
    assert out["slept"] is True
    assert out["mixed"] == "blocking"
    assert out["values"] == [True, True, "once", False]


async def _twice(mesh):
    return [await mesh.echo.call_one("x"), await mesh.echo.call_one("y")]


def test_async_for_over_a_stream_yields_every_point_while_other_tasks_run(session):
    mesh = session.spawn_procs(per_host={"procs": 3}).spawn("streamed", Echo)

    async def main():
        other = asyncio.ensure_future(mesh.slice(procs=0).echo.call_one("beside", 0.01))
        got = [(point["procs"], value) async for point, value in mesh.echo.stream("s", 0.01)]
        return sorted(got), await other

    got, beside = session.run(main())
    assert got == [(0, "s"), (1, "s"), (2, "s")]
    assert beside == "beside"


def test_a_task_left_running_is_cancelled_when_the_program_returns(session, pair):
    a, _ = pair
    cancelled = []

    async def forever():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)
        return await a.echo.call_one("done")

    assert session.run(main()) == "done"
    assert cancelled == [True]


def test_tasks_that_wait_on_nothing_regent_drives_raise_instead_of_hanging(session):
    async def main():
        await asyncio.Event().wait()

    with pytest.raises(RuntimeError, match="nothing regent drives"):
        session.run(main())


PROGRAM = textwrap.dedent('''
    import asyncio, os, sys
    from regent.controller import Session
    from tests.runtime.test_session_loop import Echo

    async def main(a, b, out):
        async def loop(m, name, n, d):
            for i in range(n):
                out.append([name, await m.echo.call_one(i, d)])
                if i % 3 == 2:
                    await asyncio.sleep(0.05)
        await asyncio.gather(loop(a, "a", 9, 0.001), loop(b, "b", 6, 0.004))
        try:
            await asyncio.wait_for(a.echo.call_one("late", 0.3), 0.01)
        except TimeoutError:
            out.append(["timeout"])
        for f in asyncio.as_completed([a.echo.call_one("x", 0.02), b.echo.call_one("y")]):
            out.append([await f])

    with Session(sys.argv[1], journal=sys.argv[2]) as s:
        procs = s.spawn_procs(per_host={"procs": 2})
        a, b = procs.slice(procs=0).spawn("a", Echo), procs.slice(procs=1).spawn("b", Echo)
        out = []
        s.run(main(a, b, out))
        print("OUT", out, flush=True)
''')


def test_an_audit_replays_an_async_program_to_the_same_observations_without_waiting(
        tmp_path, monkeypatch, capsys):
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    journal = f"sqlite://{tmp_path / 'j.db'}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    live = subprocess.run([sys.executable, str(program), "audited-async", journal], capture_output=True,
                          text=True, timeout=120, env=env)
    assert live.returncode == 0, live.stderr[-3000:]
    (line,) = [ln for ln in live.stdout.splitlines() if ln.startswith("OUT ")]
    with open_journal(journal) as j:
        records = list(expand(j.read("audited-async")))
        ckpt = j.read_checkpoint("audited-async")
    loops = [r.data for r in records if r.kind == CALL and r.data.get("k") == "loop"]
    assert any(d["m"] == "wake" for d in loops)  # choices were journaled
    shown = "\n".join(timeline(records))
    assert "event loop wake: the task awaiting seq" in shown
    # The export has a track per task of the program (two call loops, the main task, ...).
    trace = export_perfetto(records, "audited-async")["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace if e.get("name") == "process_name"}
    (tasks_pid,) = [pid for pid, name in names.items() if name == "controller tasks"]
    tracks = {e["args"]["name"] for e in trace if e.get("name") == "thread_name" and e["pid"] == tasks_pid}
    assert sum("main.<locals>.loop" in t for t in tracks) == 2, tracks
    assert any(e.get("ph") == "X" and e["pid"] == tasks_pid for e in trace)
    # Replaying, every choice comes from the journal and every deadline is in the past: the
    # loop never waits for the clock or a reply.
    waits: list[float | None] = []
    real_first = SessionLoop._first

    def first(self, awaits, timer):
        waits.append(timer)
        return real_first(self, awaits, timer)

    monkeypatch.setattr(SessionLoop, "_first", first)
    capsys.readouterr()
    report = replay_program(str(program), "audited-async", records, ckpt, argv=["audited-async", journal],
                            progress=False)
    assert report.ok, report.render()
    assert waits == []
    assert [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("OUT ")] == [line]
