"""The controller program bench_failover.py runs as primary and standby: no-op calls in a loop.

It appends timestamped marks (one JSON object a line) to $BENCH_MARKS, so the bench can split
a failover into its parts: `lead` when Session() returns (with the moment leadership was won),
`live` after the first call this process completes live (with the moment replay finished).
Configured by environment (see `Config`); it must behave identically in primary and standby.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass

from regent.controller import Session
from regent.worker import Actor, endpoint


class Noop(Actor):
    @endpoint
    def noop(self, i: int) -> int:
        return i


@dataclass(frozen=True)
class Config:
    session: str
    journal: str | None
    ttl: float
    marks: str
    pace_s: float  # sleep between live calls (no sleep while replaying)
    calls: int  # > 0: issue this many calls pipelined, then wait to be stopped
    chunk: int  # futures in flight at once in that mode
    live_after_takeover: int  # a standby that took over makes this many live calls, then ends
    asyncio: bool  # run the paced loop as a task of an asyncio program (s.run), beside another

    @staticmethod
    def from_env() -> Config:
        env = os.environ
        return Config(
            session=env["BENCH_SESSION"],
            journal=env.get("BENCH_JOURNAL") or None,
            ttl=float(env.get("BENCH_TTL", "2.0")),
            marks=env["BENCH_MARKS"],
            pace_s=float(env.get("BENCH_PACE_S", "0.01")),
            calls=int(env.get("BENCH_CALLS", "0")),
            chunk=int(env.get("BENCH_CHUNK", "2000")),
            live_after_takeover=int(env.get("BENCH_LIVE_AFTER", "20")),
            asyncio=env.get("BENCH_ASYNC") == "1",
        )


def mark(cfg: Config, event: str, **fields: object) -> None:
    line = json.dumps({"ev": event, "pid": os.getpid(), **fields})
    with open(cfg.marks, "a") as f:
        f.write(line + "\n")


def main() -> None:
    cfg = Config.from_env()
    profile_to = os.environ.get("BENCH_PROFILE")  # a path prefix: cProfile this process to its first live call
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        global mark

        def mark(cfg: Config, event: str, _mark=mark, **fields: object) -> None:  # noqa: F811
            if event == "live":
                profiler.disable()
                profiler.dump_stats(f"{profile_to}.{os.getpid()}.prof")
            _mark(cfg, event, **fields)
    with Session(cfg.session, journal=cfg.journal, lease_ttl_s=cfg.ttl) as s:
        returned = time.time()
        # Session() records when the campaign was won on the monotonic clock; map it to wall
        # time so the bench can set it against the moment it killed the primary.
        leader_at = returned - (time.monotonic() - s.takeover_at)
        # A standby took over: it waited for the lease, or found a run to carry on.
        took_over = s.waited or s.replaying
        mark(cfg, "lead", leader_at=leader_at, returned_at=returned, standby=took_over,
             replaying=s.replaying)
        cluster = os.environ.get("BENCH_CLUSTER")
        if cluster:  # a mesh over the cluster's hosts; each step a call() on every actor
            hosts = s.host_mesh(hosts=int(os.environ["BENCH_HOSTS"]), cluster=cluster)
            wide = hosts.spawn_procs(per_host={"procs": int(os.environ["BENCH_PER_HOST"])}).spawn("noop", Noop)
        mesh = wide if cluster else s.spawn_procs(per_host={"procs": 1}).spawn("noop", Noop)
        one = mesh.slice(procs=0)
        if cfg.calls > 0:
            done = 0
            while done < cfg.calls:
                n = min(cfg.chunk, cfg.calls - done)
                futures = [one.noop.call_one(done + k) for k in range(n)]
                for f in futures:
                    f.get()
                done += n
            if not took_over:
                mark(cfg, "recorded", at=time.time())
                while True:  # the bench stops this primary (SIGTERM) and starts a standby
                    time.sleep(0.05)
            # Past the journal's end: this call is live, and ends the replay.
            replay_done = time.time()
            one.noop.call_one(-1).get()
            mark(cfg, "live", at=time.time(), replay_done_at=replay_done,
                 stats=dict(s.stats), standby=took_over)
            return
        if cfg.asyncio:
            other = s.spawn_procs(per_host={"procs": 1}).spawn("other", Noop).slice(procs=0)
            s.run(paced_async(s, cfg, one, other, returned, took_over))
            return
        i = 0
        replay_done = returned
        live = 0
        while True:
            if cluster:
                mesh.noop.call(i).get(timeout=300)
            else:
                one.noop.call_one(i).get()
            i += 1
            if s.replaying:
                replay_done = time.time()
                continue
            if live == 0:
                mark(cfg, "live", at=time.time(), replay_done_at=replay_done,
                     stats=dict(s.stats), standby=took_over, seq=i)
            live += 1
            if took_over and live >= cfg.live_after_takeover:
                return
            time.sleep(cfg.pace_s)


async def paced_async(s: Session, cfg: Config, one, other, returned: float, took_over: bool) -> None:
    """The paced loop as one task of an asyncio program, while a second task calls another
    actor: the loop's wake-ups are choices between them, journaled and replayed."""
    stop = asyncio.Event()

    async def background() -> None:
        j = 0
        while not stop.is_set():
            await other.noop.call_one(j)
            j += 1
            await asyncio.sleep(cfg.pace_s / 2)

    task = asyncio.get_running_loop().create_task(background())
    i, live, replay_done = 0, 0, returned
    while True:
        await one.noop.call_one(i)
        i += 1
        if s.replaying:
            replay_done = time.time()
            # Not skipped while replaying, as the sequential loop's time.sleep is: a sleep reads
            # the loop's journaled clock. Replaying, it does not wait.
            await asyncio.sleep(cfg.pace_s)
            continue
        if live == 0:
            mark(cfg, "live", at=time.time(), replay_done_at=replay_done,
                 stats=dict(s.stats), standby=took_over, seq=i)
        live += 1
        if took_over and live >= cfg.live_after_takeover:
            stop.set()
            await task
            return
        await asyncio.sleep(cfg.pace_s)


if __name__ == "__main__":
    main()
