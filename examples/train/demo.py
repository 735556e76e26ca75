"""`regent demo`: the training job survives SIGKILLed controllers and ends bit-identical.

A primary and a standby run examples/train/train.py on one session; at a random step the
primary is SIGKILLed, the standby takes over (replaying the journal from the last
checkpoint) and finishes (`--failovers N`: each new leader is killed in turn, a fresh
standby waiting each time). Then the same training runs once more without any failure,
and the demo shows that both end with the same weights (sha256) and the same loss curve,
compacts the journal and verifies it.

`run_controllers` and `run_reference` are what tests/train uses, with the tiny config, and
what the RL demo (examples/rl/demo.py) drives its own program with.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from regent.controller.edge import STANDING_BY

TRAIN = Path(__file__).with_name("train.py")
STEP = re.compile(r"^step (\d+)/(\d+) (\w+) (\S+)")  # step 3/16 loss 2.31 (or reward 0.12)
LIVE = re.compile(r"^live at (\S+) replayed (\d+) resent (\d+)")


@dataclass
class Takeover:
    killed_pid: int
    killed_at_step: int
    killed_at: float
    leader_pid: int = 0
    led_at: float = 0.0  # the standby won the lead (lease expired)
    live_at: float = 0.0  # its replay was over and it issued new calls
    replayed: int = 0
    resent: int = 0

    @property
    def failover_s(self) -> float:
        return self.live_at - self.killed_at


@dataclass
class Run:
    session: str
    result: dict
    wall_s: float
    takeovers: list[Takeover] = field(default_factory=list)
    logs: Path | None = None


# Where a controller runs: (a command prefix such as `ip netns exec HOST`, its environment).
Where = Callable[[int], tuple[list[str], dict[str, str]]]


class Controller:
    """One controller process; a thread copies its stderr to a log and reports progress lines."""

    def __init__(self, cmd: list[str], log: Path, events: queue.Queue, env: dict):
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.pid = self.proc.pid
        self._events = events
        self.standing_by = threading.Event()  # it found a leader and waits behind it
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.log, "w") as out:
            for line in self.proc.stderr:
                out.write(line)
                out.flush()
                if STANDING_BY in line:
                    self.standing_by.set()
                if line.startswith(("step ", "live at ", "eval ", "procs ", "healed ")):
                    self._events.put((self.pid, line.rstrip("\n")))

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()

    def result(self, timeout: float) -> dict:
        out = self.proc.stdout.read()
        self.proc.wait(timeout)
        self._reader.join(5)
        if self.proc.returncode != 0:
            tail = "".join(self.log.read_text().splitlines(keepends=True)[-30:])
            raise RuntimeError(f"controller {self.pid} exited {self.proc.returncode}; log {self.log}:\n{tail}")
        return json.loads(out.strip().splitlines()[-1])


def _leaders(path: Path) -> list[tuple[int, float]]:
    try:
        return [(int(p), float(t)) for p, t in (line.split() for line in path.read_text().splitlines())]
    except FileNotFoundError:
        return []


def _wait_for_standby(controllers: dict[int, Controller], leader: Controller, deadline: float) -> None:
    while not any(c.standing_by.is_set() for c in controllers.values() if c is not leader and c.proc.poll() is None):
        if time.monotonic() > deadline:
            raise TimeoutError("no standby stood by behind the leader to take over; see the controller logs")
        time.sleep(0.01)


def run_controllers(session: str, workdir: Path, train_args: list[str], kill_steps: list[int], *,
                    journal: str | None = None, progress: bool = True, timeout: float = 600.0,
                    program: Path = TRAIN, on_line: Callable[[int, str], None] | None = None,
                    where: Where | None = None) -> Run:
    """Train with a primary and a standby; SIGKILL the leader once it reports each step of
    kill_steps (a fresh standby replaces every standby that takes over). `on_line(pid, line)`
    sees every progress line of the leader; `where(n)` says where the n-th controller runs."""
    workdir.mkdir(parents=True, exist_ok=True)
    leader_file = workdir / f"{session}.leaders"
    cmd = [sys.executable, str(program), "--session", session, "--leader-file", str(leader_file), *train_args]
    if program == TRAIN:
        cmd += ["--checkpoint-dir", str(workdir / f"{session}.ckpt")]
    if journal:
        cmd += ["--journal", journal]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    events: queue.Queue = queue.Queue()
    controllers: dict[int, Controller] = {}

    def start() -> Controller:
        prefix, run_env = where(len(controllers)) if where is not None else ([], env)
        c = Controller([*prefix, *cmd], workdir / f"{session}.ctl{len(controllers)}.log", events, run_env)
        controllers[c.pid] = c
        return c

    t0 = time.monotonic()
    start()
    time.sleep(0.3)  # the first one started leads: the demo then reads in order
    start()
    takeovers: list[Takeover] = []
    pending = sorted(kill_steps)
    deadline = time.monotonic() + timeout
    bar = tqdm(desc=f"{session} (primary)", unit="step", disable=not progress, dynamic_ncols=True, leave=True)
    try:
        def current() -> Controller | None:
            leaders = _leaders(leader_file)
            if takeovers and not takeovers[-1].leader_pid and len(leaders) > len(takeovers):
                t = takeovers[-1]
                t.leader_pid, t.led_at = leaders[len(takeovers)]
                if pending:  # another failover to come: a fresh standby waits behind the new leader
                    start()
            return controllers.get(leaders[-1][0]) if leaders else None

        while True:
            leader = current()
            if leader is not None and leader.proc.poll() not in (None, -signal.SIGKILL):
                break  # finished (or failed: result() says how)
            try:
                pid, line = events.get(timeout=0.05)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"training session {session} did not finish in {timeout:.0f} s; logs in {workdir}") from None
                continue
            leader = current()  # a new leader may have written the file after our last look
            if leader is None or pid != leader.pid:
                continue
            if on_line is not None:
                on_line(pid, line)
            if m := LIVE.match(line):
                if takeovers and takeovers[-1].leader_pid == pid:
                    t = takeovers[-1]
                    t.live_at, t.replayed, t.resent = float(m[1]), int(m[2]), int(m[3])
                    bar.set_description(f"{session} (standby {len(takeovers)} took over)")
                    bar.write(f"  standby pid {pid} is live {t.failover_s:.2f} s after the kill "
                              f"(lead after {t.led_at - t.killed_at:.2f} s; {t.replayed} calls replayed "
                              f"from the journal, {t.resent} re-sent to workers)")
            elif m := STEP.match(line):
                step, total = int(m[1]), int(m[2])
                bar.total = total
                bar.n = step
                bar.set_postfix({m[3]: m[4]}, refresh=False)
                bar.refresh()
                if pending and step >= pending[0]:
                    pending.pop(0)
                    # A standby still starting (a loaded machine) would find the seat empty
                    # and lead as a fresh primary: the demo kills once one stands by.
                    _wait_for_standby(controllers, leader, deadline)
                    leader.kill()
                    takeovers.append(Takeover(pid, step, time.time()))
                    bar.write(f"  >>> SIGKILL leader pid {pid} at step {step}")
            elif line.startswith("eval ") and progress:
                bar.write("  " + line)
        leader = controllers[_leaders(leader_file)[-1][0]]
        result = leader.result(timeout=60)
    finally:
        bar.close()
        for c in controllers.values():
            if c.proc.poll() is None:
                c.kill()
    return Run(session, result, time.monotonic() - t0, takeovers, workdir)


def run_reference(session: str, workdir: Path, train_args: list[str], *, journal: str | None = None,
                  progress: bool = True, timeout: float = 600.0, program: Path = TRAIN,
                  where: Where | None = None) -> Run:
    """The same training with one controller and no failure."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(program), "--session", session, *train_args]
    if program == TRAIN:
        cmd += ["--checkpoint-dir", str(workdir / f"{session}.ckpt")]
    if journal:
        cmd += ["--journal", journal]
    events: queue.Queue = queue.Queue()
    t0 = time.monotonic()
    prefix, env = where(0) if where is not None else ([], {**os.environ, "PYTHONUNBUFFERED": "1"})
    c = Controller([*prefix, *cmd], workdir / f"{session}.log", events, env)
    bar = tqdm(desc=f"{session} (no failure)", unit="step", disable=not progress, dynamic_ncols=True)
    try:
        deadline = time.monotonic() + timeout
        while c.proc.poll() is None or not events.empty():
            if time.monotonic() > deadline:
                raise TimeoutError(f"reference run {session} did not finish in {timeout:.0f} s")
            try:
                _, line = events.get(timeout=0.05)
            except queue.Empty:
                continue
            if m := STEP.match(line):
                bar.total = int(m[2])
                bar.n = int(m[1])
                bar.set_postfix({m[3]: m[4]}, refresh=False)
                bar.refresh()
        result = c.result(timeout=60)
    finally:
        bar.close()
        if c.proc.poll() is None:
            c.kill()
    return Run(session, result, time.monotonic() - t0, [], workdir)


def journal_cli(journal: str | None, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "regent.cli", "journal"]
    if journal:
        cmd += ["--journal", journal]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])


def _records(journal: str | None, session: str) -> int:
    from regent.journal import open_journal

    j = open_journal(journal)
    try:
        return j.session_info(session).records
    finally:
        j.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="regent demo", description=__doc__.splitlines()[0])
    p.add_argument("--journal", default=os.environ.get("REGENT_JOURNAL"),
                   help="etcd://host:port or sqlite:///path.db (default: the embedded store)")
    p.add_argument("--failovers", type=int, default=1, help="how many leaders to SIGKILL (default 1)")
    p.add_argument("--steps", type=int, help="training steps (default: the full config's)")
    p.add_argument("--tiny", action="store_true", help="the tests' tiny model (seconds, not minutes)")
    p.add_argument("--seed", type=int, help="seed of the random kill steps (default: the clock)")
    p.add_argument("--workdir", help="logs and checkpoints (default: a temp dir)")
    p.add_argument("--hosts", type=int, default=0,
                   help="train on N hosts of a cluster of loopback host agents (one replica each), and "
                        "SIGKILL one of them (its agent and every proc) at a random step too")
    p.add_argument("--spares", type=int, default=1, help="spare hosts beyond --hosts (default 1)")
    args = p.parse_args(argv)
    if args.hosts:
        return main_hosts(args)

    sys.path.insert(0, str(TRAIN.parent))
    from model import FULL, TINY

    cfg = TINY if args.tiny else FULL
    steps = args.steps or cfg.steps
    train_args = (["--tiny"] if args.tiny else []) + ["--steps", str(steps)]
    if args.tiny:
        train_args += ["--step-delay", "0.05"]
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    lo, hi = max(2, steps // 10), max(3, steps * 9 // 10)
    if args.failovers < 0 or args.failovers > hi - lo:
        p.error(f"--failovers must be between 0 and {hi - lo} for {steps} steps")
    kills = sorted(rng.sample(range(lo, hi), args.failovers))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    session = f"demo-train-{stamp}"
    workdir = Path(args.workdir) if args.workdir else Path(os.environ.get("TMPDIR", "/tmp")) / f"regent-{session}"
    where = args.journal or "the embedded journal"
    print(f"regent demo: a character-level transformer on Shakespeare, {steps} steps, data-parallel on 2 procs,\n"
          f"  evaluator and checkpoint actor on a third; primary + standby on {where};\n"
          f"  SIGKILL of the leader at step{'s' if len(kills) != 1 else ''} {kills} (seed {seed}); logs in {workdir}")
    t0 = time.monotonic()
    failed = run_controllers(session, workdir, train_args, kills, journal=args.journal)
    print(f"\nthe same training with no failure (session {session}-ref):")
    ref = run_reference(f"{session}-ref", workdir, train_args, journal=args.journal)
    before = _records(args.journal, session)
    compact = journal_cli(args.journal, "compact", session)
    after = _records(args.journal, session)
    verify = journal_cli(args.journal, "verify", session)
    wall = time.monotonic() - t0

    a, b = failed.result, ref.result
    same_weights = a["weights_sha256"] == b["weights_sha256"]
    same_losses = a["losses"] == b["losses"] and [e["val_loss"] for e in a["evals"]] == [e["val_loss"] for e in b["evals"]]
    losses = a["losses"]
    print("\nsummary")
    print(f"  steps               {steps} (loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
          f"held-out {a['evals'][0]['val_loss']:.3f} -> {a['evals'][-1]['val_loss']:.3f})")
    print(f"  sample at the end   {a['evals'][-1]['sample']!r}")
    for i, t in enumerate(failed.takeovers, 1):
        print(f"  failover {i}          killed at step {t.killed_at_step}; standby led after "
              f"{t.led_at - t.killed_at:.2f} s, live after {t.failover_s:.2f} s; "
              f"{t.replayed} calls replayed from the journal, {t.resent} re-sent to workers")
    print(f"  final leader stats  {a['stats']}")
    print(f"  weights sha256      {a['weights_sha256'][:16]}... with failover{'s' if len(kills) > 1 else ''}, "
          f"{b['weights_sha256'][:16]}... without: {'bit-identical' if same_weights else 'DIFFERENT'}")
    print(f"  loss curves         {'equal' if same_losses else 'DIFFERENT'} ({len(losses)} train losses, "
          f"{len(a['evals'])} evaluations)")
    print(f"  journal             {before} records, {after} after `regent journal compact` "
          f"({(compact.stdout.strip().splitlines() or [compact.stderr.strip()])[-1]})")
    print(f"  journal verify      {verify.stdout.strip().splitlines()[0] if verify.stdout.strip() else verify.stderr[-300:]}")
    print(f"  checkpoints         {', '.join(Path(s).name for s in a['saved'])} in {Path(a['saved'][-1]).parent}")
    print(f"  wall time           {wall:.1f} s (failover run {failed.wall_s:.1f} s, reference {ref.wall_s:.1f} s)")
    ok = same_weights and same_losses and a["replicas_agree"] and verify.returncode == 0 and compact.returncode == 0 \
        and len(failed.takeovers) == len(kills) and all(t.live_at for t in failed.takeovers)
    print("demo OK" if ok else "demo FAILED")
    return 0 if ok else 1


def start_agents(url: str, cluster: str, names: list[str], workdir: Path, ttl_s: float = 1.0) -> dict[str, subprocess.Popen]:
    """Host agents of `cluster` on loopback, registered in `url`'s store (no root needed)."""
    from regent.journal import open_journal
    from regent.journal.hosts import registered_hosts

    agents = {name: subprocess.Popen(
        [sys.executable, "-m", "regent.cli", "host", "--cluster", cluster, "--store", url, "--advertise", "127.0.0.1",
         "--name", name, "--ttl", str(ttl_s)], stdout=open(workdir / f"agent-{name}.log", "a"),
        stderr=subprocess.STDOUT) for name in names}
    j = open_journal(url)
    try:
        deadline = time.monotonic() + 60
        while len(registered_hosts(j.backend, cluster)) < len(names):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the host agents did not register; logs in {workdir}")
            time.sleep(0.1)
    finally:
        j.close()
    return agents


@dataclass
class HostKill:
    """A host SIGKILLed during training (agent and procs) and how training came through it."""

    host: str
    at_step: int
    at: float = 0.0
    healed_at: float = 0.0  # when the replicas were healed (the new member took a healthy one's state)
    next_step_at: float = 0.0  # when the first step on the new membership completed

    @property
    def recovery_s(self) -> float:
        return self.next_step_at - self.at if self.next_step_at else float("nan")


def run_with_host_kill(session: str, workdir: Path, train_args: list[str], controller_kills: list[int],
                       host_kill: HostKill, agents: dict[str, subprocess.Popen], *, journal: str,
                       progress: bool = True, timeout: float = 900.0) -> Run:
    """run_controllers, and SIGKILL host `host_kill.host` (agent and procs) once the leader
    reports step `host_kill.at_step`; the time until the next step completes is recorded."""
    from regent.chaos import kill_host

    def on_line(pid: int, line: str) -> None:
        if line.startswith("healed ") and host_kill.at and not host_kill.healed_at:
            host_kill.healed_at = time.time()
        m = STEP.match(line)
        if m is None:
            return
        if not host_kill.at and int(m[1]) >= host_kill.at_step:
            kill_host(agents[host_kill.host].pid, target=f"host/{host_kill.host}")
            host_kill.at = time.time()
            if progress:
                print(f"  >>> SIGKILL host {host_kill.host} (its agent and every proc) at step {m[1]}", flush=True)
        elif host_kill.healed_at and not host_kill.next_step_at:
            host_kill.next_step_at = time.time()

    return run_controllers(session, workdir, train_args, controller_kills, journal=journal, progress=progress,
                           timeout=timeout, on_line=on_line)


def with_and_without_faults(session: str, workdir: Path, train_args: list[str], controller_kills: list[int],
                            host_kill: HostKill, agents: dict[str, subprocess.Popen], *, journal: str,
                            progress: bool = True, timeout: float = 900.0) -> tuple[Run, Run]:
    """run_with_host_kill, then the same training without faults on the hosts left; the
    agents are stopped at the end."""
    try:
        failed = run_with_host_kill(session, workdir, train_args, controller_kills, host_kill, agents,
                                    journal=journal, progress=progress, timeout=timeout)
        if progress:
            print(f"\nthe same training with no failure (session {session}-ref):")
        ref = run_reference(f"{session}-ref", workdir, train_args, journal=journal, progress=progress,
                            timeout=timeout)
    finally:
        for agent in agents.values():
            agent.terminate()
        for agent in agents.values():
            agent.wait(30)
    return failed, ref


def main_hosts(args: argparse.Namespace) -> int:
    """`regent demo --hosts N --spares K`: training on N loopback hosts with K spares; one host
    and the controller are SIGKILLed at random steps, and the run ends bit-identical to one
    without faults."""
    sys.path.insert(0, str(TRAIN.parent))
    from model import FULL, TINY

    cfg = TINY if args.tiny else FULL
    steps = args.steps or cfg.steps
    if args.hosts < 2 or args.spares < 1:
        raise SystemExit("regent demo: --hosts needs at least 2 hosts and --spares at least 1")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    session = f"demo-hosts-{stamp}"
    workdir = Path(args.workdir) if args.workdir else Path(os.environ.get("TMPDIR", "/tmp")) / f"regent-{session}"
    workdir.mkdir(parents=True, exist_ok=True)
    journal = args.journal or f"sqlite://{workdir / 'journal.db'}"
    cluster = f"demo{os.getpid()}"
    os.environ["REGENT_CLUSTER"] = cluster
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    lo, hi = max(2, steps // 5), max(4, steps * 4 // 5)
    host_step, ctl_step = rng.sample(range(lo, hi), 2)
    names = [f"h{i}" for i in range(args.hosts + args.spares)]
    kill = HostKill(rng.choice(names[:args.hosts]), host_step)
    train_args = (["--tiny"] if args.tiny else []) + ["--steps", str(steps), "--hosts", str(args.hosts),
                                                      "--spares", str(args.spares)]
    train_args += ["--step-delay", "0.1" if args.tiny else "0"]
    print(f"regent demo: {steps} steps data-parallel on {args.hosts} loopback hosts ({', '.join(names[:args.hosts])}) "
          f"with {args.spares} spare ({', '.join(names[args.hosts:])});\n  SIGKILL of host {kill.host} at step "
          f"{host_step} and of the controller at step {ctl_step} (seed {seed}); logs in {workdir}")
    agents = start_agents(journal, cluster, names, workdir)
    t0 = time.monotonic()
    failed, ref = with_and_without_faults(session, workdir, train_args, [ctl_step], kill, agents, journal=journal)
    a, b = failed.result, ref.result
    same_weights = a["weights_sha256"] == b["weights_sha256"]
    same_losses = a["losses"] == b["losses"] and a["evals"] == b["evals"]
    print("\nsummary")
    print(f"  host {kill.host} killed  at step {kill.at_step}; the first step on the new membership completed {kill.recovery_s:.2f} s later; "
          f"{a['redone']} step call(s) redone; healed: {a['healed']}")
    for i, t in enumerate(failed.takeovers, 1):
        print(f"  failover {i}          killed at step {t.killed_at_step}; standby live after {t.failover_s:.2f} s")
    print(f"  weights sha256      {a['weights_sha256'][:16]}... with faults, {b['weights_sha256'][:16]}... without: "
          f"{'bit-identical' if same_weights else 'DIFFERENT'}")
    print(f"  loss curves         {'equal' if same_losses else 'DIFFERENT'} ({len(a['losses'])} train losses, "
          f"{len(a['evals'])} evaluations)")
    print(f"  wall time           {time.monotonic() - t0:.1f} s")
    ok = same_weights and same_losses and a["replicas_agree"] and bool(kill.at) and len(failed.takeovers) == 1
    print("demo OK" if ok else "demo FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
