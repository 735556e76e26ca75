"""Runs a controller program as primary + standbys in real processes, and checks
what the actors executed against what the program issued."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from regent.controller.edge import STANDING_BY

PROGRAMS = Path(__file__).parent / "programs"


@dataclass
class Cluster:
    """Controllers of one session: start them, find the leader, kill it."""

    session: str
    journal: str
    workdir: Path
    program: str = "mixed.py"
    steps: int = 40
    ttl: float = 1.0
    extra_env: dict = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)
    # Where the n-th controller runs: a command prefix (e.g. `ip netns exec HOST`) and the
    # environment of that host; default this machine's.
    prefix: Callable[[int], list[str]] | None = None
    host_env: Callable[[int], dict] | None = None

    @property
    def leader_file(self) -> Path:
        return self.workdir / f"{self.session}.leaders"

    def env(self, n: int = 0, **extra: str) -> dict:
        env = dict(os.environ) if self.host_env is None else self.host_env(n)
        env.update({
            "REGENT_TEST_SESSION": self.session,
            "REGENT_TEST_JOURNAL": self.journal,
            "REGENT_TEST_STEPS": str(self.steps),
            "REGENT_TEST_LEADER_FILE": str(self.leader_file),
            "REGENT_TEST_TTL": str(self.ttl),
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        env.update(extra)
        return env

    def start(self, **extra_env: str) -> subprocess.Popen:
        n = len(self.procs)
        p = subprocess.Popen(
            [*(self.prefix(n) if self.prefix else []), sys.executable, str(PROGRAMS / self.program)],
            env=self.env(n, **extra_env), stdout=subprocess.PIPE,
            stderr=open(self.workdir / f"{self.session}.ctl{n}.log", "w"), text=True)
        self.procs.append(p)
        return p

    def primary_and_standby(self, step: int = 3, primary_env: dict | None = None,
                            standby_env: dict | None = None) -> tuple[int, subprocess.Popen]:
        """A primary that ran `step` live (held there while REGENT_TEST_HOLD_FILE exists, if the
        program is given one) and a standby standing by: the primary's pid, the standby."""
        self.start(**(primary_env or {}))
        primary = self.wait_leader(1)
        self.wait_step(primary, step)
        standby = self.start(**(standby_env or {}))
        self.wait_standby()
        return primary, standby

    def leaders(self) -> list[int]:
        try:
            return [int(x) for x in self.leader_file.read_text().split()]
        except FileNotFoundError:
            return []

    def wait_leader(self, count: int, timeout: float = 30.0) -> int:
        """Pid of the count-th process to become leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.leaders()
            if len(pids) >= count:
                return pids[count - 1]
            time.sleep(0.005)
        raise TimeoutError(f"no leader #{count} of {self.session} within {timeout} s; see {self.workdir}")

    def wait_standby(self, timeout: float = 30.0) -> None:
        """Until some controller stands by (it has opened the journal and found a leader)."""
        deadline = time.monotonic() + timeout
        while not any(STANDING_BY in f.read_text() for f in self.workdir.glob(f"{self.session}.ctl*.log")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no standby of {self.session} within {timeout} s\n{self.log_tail()}")
            time.sleep(0.01)

    def log_of(self, pid: int) -> Path:
        n = self.procs.index(self.by_pid(pid))
        return self.workdir / f"{self.session}.ctl{n}.log"

    def wait_step(self, pid: int, step: int, timeout: float = 60.0) -> None:
        """Until the controller with this pid reports having run `step` live."""
        log = self.log_of(pid)
        deadline = time.monotonic() + timeout
        while f"step {step}\n" not in log.read_text():
            if time.monotonic() > deadline:
                raise TimeoutError(f"controller {pid} did not reach step {step}\n{self.log_tail()}")
            time.sleep(0.005)

    def wait_live_steps(self, pid: int, n: int, timeout: float = 60.0) -> bool:
        """Until the controller with this pid has run n steps live; False if it exited first."""
        log = self.log_of(pid)
        proc = self.by_pid(pid)
        deadline = time.monotonic() + timeout
        while log.read_text().count("step ") < n:
            if proc.poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(f"controller {pid} did not run {n} steps\n{self.log_tail()}")
            time.sleep(0.002)
        return True

    def kill_leaders(self, n: int, rng: random.Random, max_live_steps: int) -> list[int]:
        """SIGKILL n successive leaders, each at a random point: during its takeover (0 live
        steps) or up to max_live_steps in, plus a sub-step delay so kills land inside calls;
        a fresh standby follows each kill. The pids killed (fewer if the run finished)."""
        killed: list[int] = []
        while len(killed) < n:
            pid = self.wait_leader(len(killed) + 1, timeout=60)
            if not self.wait_live_steps(pid, rng.randint(0, max_live_steps)):
                break  # the program finished before this kill point
            time.sleep(rng.uniform(0.0, 0.01))
            proc = self.by_pid(pid)
            if proc.poll() is not None:
                break
            os.kill(pid, signal.SIGKILL)
            proc.wait()
            killed.append(pid)
            self.start()
        return killed

    def pause_until_deposed(self, step: int) -> tuple[subprocess.Popen, int]:
        """SIGSTOP the first leader at `step` until a standby leads, then let it run again.
        Returns the old leader's process (exited) and the new leader's pid."""
        old_pid = self.wait_leader(1)
        old = self.by_pid(old_pid)
        self.wait_step(old_pid, step)
        # A standby still opening the SQLite file when the primary freezes inside a write
        # would give up on the lock; one that stands by already only campaigns.
        self.wait_standby()
        os.kill(old_pid, signal.SIGSTOP)
        try:
            new_pid: int | None = self.wait_leader(2, timeout=self.ttl + 8)
            time.sleep(0.3)  # the new leader fences workers and gets going
        except TimeoutError:
            # Only the embedded store may stall here: a process frozen inside a SQLite write
            # holds the file's lock until it runs again (documented). Safety must still hold.
            if not self.journal.startswith("sqlite"):
                raise
            new_pid = None
        os.kill(old_pid, signal.SIGCONT)
        if new_pid is None:
            new_pid = self.wait_leader(2, timeout=30)
        old.wait(timeout=30)
        return old, new_pid

    def by_pid(self, pid: int) -> subprocess.Popen:
        return next(p for p in self.procs if p.pid == pid)

    def finish(self, proc: subprocess.Popen, timeout: float = 120.0) -> dict:
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"controller exited {proc.returncode}; logs in {self.workdir}\n{self.log_tail()}")
        return json.loads(out.strip().splitlines()[-1])

    def log_tail(self, n: int = 40) -> str:
        text = ""
        for f in sorted(self.workdir.glob(f"{self.session}.ctl*.log")):
            text += f"--- {f.name}\n" + "\n".join(f.read_text().splitlines()[-n:]) + "\n"
        return text

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def expected_tokens(steps: int, change_at: int = -1) -> tuple[dict[int, set], set]:
    """Tokens each of the 3 actors must run exactly once, and choose tokens (one actor each)."""
    per_actor: dict[int, set] = {a: set() for a in range(3)}
    chosen = set()
    for i in range(steps):
        k = i % 5
        if i == change_at:
            for a in per_actor:
                per_actor[a].add(f"changed{i}")
        elif k in (0, 1, 3):
            prefix = {0: "c", 1: "b", 3: "s"}[k]
            for a in per_actor:
                per_actor[a].add(f"{prefix}{i}")
        elif k == 2:
            chosen.add(f"h{i}")
        else:
            per_actor[i % 3].add(f"o{i}")
    return per_actor, chosen


def check_exactly_once(result: dict, steps: int) -> None:
    """Every issued call ran exactly once on each actor it targeted (counted by the actors)."""
    per_actor, chosen = expected_tokens(steps)
    reports = result["reports"]
    twice = {(a, t): n for a, seen in enumerate(reports) for t, n in seen.items() if n != 1}
    assert not twice, f"calls run more than once: {twice}"
    for a, seen in enumerate(reports):
        got = set(seen) - chosen
        assert got == per_actor[a], f"actor {a}: missing {per_actor[a] - got}, unexpected {got - per_actor[a]}"
    picks = [t for seen in reports for t in seen if t in chosen]
    assert sorted(picks) == sorted(chosen), "each choose call must run on exactly one actor"
