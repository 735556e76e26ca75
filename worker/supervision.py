"""Restart policies and the supervisor's decisions, in the manner of Erlang/OTP.

`RestartPolicy` is what a program gives at spawn time; `MeshSupervisor` decides,
from failures it is told about, whether to restart (whom, after what backoff) or
escalate. Pure state and arithmetic: no processes, sockets or clocks of its own
(the caller passes `now`), so every rule is tested directly.

Defaults: OTP's supervisor allows 1 restart in 5 s; regent allows 3 in 5 s, because
a proc restart is cheaper than an OTP node's and a transient network blip can take
out several actors at once. Backoff starts at 10 ms and doubles up to 2 s, with
jitter, so a crash loop cannot become a restart storm.
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field
from typing import Literal

import tenacity

from regent.worker.shape import Point

RestartType = Literal["permanent", "transient", "temporary"]
Strategy = Literal["one_for_one", "one_for_all"]
HostLost = Literal["escalate", "replace", "shrink"]


@dataclass(frozen=True)
class RestartPolicy:
    """How a mesh's actors are restarted after a failure.

    restart: "permanent" always restarts, "transient" only after an abnormal exit,
    "temporary" never. At most `max_restarts` restarts within `window_s` seconds;
    one more failure escalates to the controller program. Between restarts of the
    same actor the supervisor waits an exponential backoff with jitter, capped at
    `backoff_max_s`. strategy "one_for_all" restarts every actor of the mesh when one
    fails (an SPMD group). `shutdown_grace_s` is the time `__cleanup__` gets before
    the process is killed. `restart_timeout_s` bounds how long a call issued during
    a restart waits for it.

    on_host_lost: what a lost host (its registration expired: docs/multihost.md) does to a
    mesh spawned on a host mesh. "escalate" (the default): its members there are failures
    like any other, and their restarts, which need the lost host, fail until the budget
    escalates. "replace": the lost host's procs start again on a spare host of the cluster
    (one the session does not use), at the same points, waiting up to `replace_timeout_s`
    for one to register. "shrink": the lost host's points leave the mesh. With "replace", the
    first `warm_spares` spares of the cluster keep procs started ahead of need, with the actors'
    modules (and torch.distributed, for a process group) imported, so a replacement does not
    wait for a new Python process to start (0: spares start procs when a host is lost).
    """

    restart: RestartType = "permanent"
    max_restarts: int = 3
    window_s: float = 5.0
    backoff_initial_s: float = 0.01
    backoff_max_s: float = 2.0
    backoff_jitter_s: float = 0.01
    strategy: Strategy = "one_for_one"
    shutdown_grace_s: float = 5.0
    restart_timeout_s: float = 30.0
    on_host_lost: HostLost = "escalate"
    replace_timeout_s: float = 60.0
    warm_spares: int = 1

    def __post_init__(self) -> None:
        if self.restart not in ("permanent", "transient", "temporary"):
            raise ValueError(f"restart={self.restart!r}: use 'permanent', 'transient' or 'temporary'")
        if self.strategy not in ("one_for_one", "one_for_all"):
            raise ValueError(f"strategy={self.strategy!r}: use 'one_for_one' or 'one_for_all'")
        if self.on_host_lost not in ("escalate", "replace", "shrink"):
            raise ValueError(f"on_host_lost={self.on_host_lost!r}: use 'escalate', 'replace' or 'shrink'")
        if not self.replace_timeout_s >= 0:
            raise ValueError(f"replace_timeout_s={self.replace_timeout_s!r} must be >= 0 seconds")
        if not isinstance(self.warm_spares, int) or isinstance(self.warm_spares, bool) or self.warm_spares < 0:
            raise ValueError(f"warm_spares={self.warm_spares!r}: give a count of spares, 0 or more")
        if self.max_restarts < 0 or self.window_s <= 0:
            raise ValueError("max_restarts must be >= 0 and window_s > 0")

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Delay before restart number `attempt` (1-based) within the current window."""
        wait = tenacity.wait_exponential(
            multiplier=self.backoff_initial_s, min=self.backoff_initial_s, max=self.backoff_max_s, exp_base=2)
        base = wait(_Attempt(attempt))
        jitter = (rng or random).uniform(0, self.backoff_jitter_s)
        return min(self.backoff_max_s, base + jitter)


class _Attempt:
    """The part of tenacity's RetryCallState its wait strategies read."""

    def __init__(self, n: int) -> None:
        self.attempt_number = n


@dataclass(frozen=True)
class Decision:
    """What to do about a failure: restart `ranks` after `delay_s`, escalate, or nothing."""

    action: Literal["restart", "escalate", "ignore"]
    ranks: tuple[int, ...] = ()
    delay_s: float = 0.0
    report: str = ""


@dataclass
class FailureRecord:
    t: float
    rank: int
    reason: str
    abnormal: bool


@dataclass
class MeshSupervisor:
    """Supervision state of one actor mesh."""

    mesh: str
    size: int
    policy: RestartPolicy
    restarts: collections.deque = field(default_factory=collections.deque)  # times of restarts
    failures: list[FailureRecord] = field(default_factory=list)
    escalated: str | None = None
    incarnation: dict[int, int] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)

    def leaves_down(self, abnormal: bool) -> bool:
        """Whether the policy leaves a member that failed this way down (not a restart)."""
        return self.policy.restart == "temporary" or (self.policy.restart == "transient" and not abnormal)

    def on_failure(self, rank: int, reason: str, abnormal: bool, now: float) -> Decision:
        self.failures.append(FailureRecord(now, rank, reason, abnormal))
        if self.escalated:
            return Decision("ignore", report=self.escalated)
        p = self.policy
        if self.leaves_down(abnormal):
            return Decision("ignore", report=f"{self.mesh}[{rank}] {reason}; restart={p.restart}: not restarted")
        while self.restarts and now - self.restarts[0] > p.window_s:
            self.restarts.popleft()
        if len(self.restarts) >= p.max_restarts:
            self.escalated = self._report(now)
            return Decision("escalate", report=self.escalated)
        self.restarts.append(now)
        ranks = tuple(range(self.size)) if p.strategy == "one_for_all" else (rank,)
        for r in ranks:
            self.incarnation[r] = self.incarnation.get(r, 0) + 1
        return Decision("restart", ranks, p.backoff(len(self.restarts), self.rng))

    def _report(self, now: float) -> str:
        recent = [f for f in self.failures if now - f.t <= self.policy.window_s]
        lines = [
            f"actor mesh {self.mesh!r} exceeded its restart intensity: {len(recent)} failures within "
            f"{self.policy.window_s:g} s (max_restarts={self.policy.max_restarts}); it is no longer restarted.",
        ]
        for f in recent[-10:]:
            lines.append(f"  t={f.t:.3f} {self.mesh}[{f.rank}]: {f.reason}")
        return "\n".join(lines)


FaultKind = Literal["escalation", "unsupervised"]


@dataclass(frozen=True)
class MeshFailure:
    """An actor mesh's failure that nothing handles, as the unhandled-fault hook gets it.

    mesh: the actor mesh's name; rank and point: the member that failed (for an escalation,
    the one whose failure exceeded the intensity); reason: why it failed (for an escalation,
    the supervisor's report: what failed, when and how often); kind: "escalation" (a supervised
    mesh gave up restarting) or "unsupervised" (a mesh with no restart policy lost a member).
    """

    mesh: str
    rank: int
    point: Point
    reason: str
    kind: FaultKind

    @property
    def escalation(self) -> bool:
        return self.kind == "escalation"

    def __str__(self) -> str:
        what = "escalated" if self.escalation else "failed (unsupervised)"
        return f"actor mesh {self.mesh!r} {what} at {self.point!r}: {self.reason}"
