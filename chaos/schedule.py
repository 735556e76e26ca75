"""Fault schedules: what to break, where, when and for how long, and the runner that does it.

A Schedule is plain, validated data: written by hand as a TOML or JSON scenario file,
or drawn by random_schedule() from a seed (same seed, same schedule). A
ScheduleRunner plays one against a ChaosNet and a table of named processes in a
thread it owns, and records every fault in a FaultLog.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from chaos import faults as process_faults
from chaos.faults import FaultEvent, FaultLog
from chaos.net import ChaosNet
from chaos.toxics import STREAMS, TOXICS, ToxicValidationError, validate_toxic

__all__ = [
    "FAULT_KINDS",
    "LINK_KINDS",
    "PROCESS_KINDS",
    "Fault",
    "Schedule",
    "ScheduleError",
    "ScheduleRunner",
    "load_schedule",
    "parse_schedule",
    "random_schedule",
]

log = structlog.get_logger("chaos.schedule")

LINK_KINDS: tuple[str, ...] = (*TOXICS, "down")
PROCESS_KINDS: tuple[str, ...] = ("kill", "pause")
FAULT_KINDS: tuple[str, ...] = (*LINK_KINDS, *PROCESS_KINDS)

_FAULT_KEYS = (
    "kind",
    "target",
    "at_s",
    "after_calls",
    "duration_s",
    "stream",
    "toxicity",
    "attributes",
)
_SCHEDULE_KEYS = ("name", "description", "seed", "faults")


class ScheduleError(ValueError):
    """A scenario or schedule that cannot be run as written; the message says where."""


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on ``target``, triggered ``at_s`` seconds after the runner
    starts or once ``after_calls`` calls were noted, lasting ``duration_s`` (None: until
    the runner stops; a kill has no duration)."""

    kind: str
    target: str
    at_s: float | None = None
    after_calls: int | None = None
    duration_s: float | None = None
    stream: str = "downstream"
    toxicity: float = 1.0
    attributes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ScheduleError(
                f"'kind': unknown fault kind {self.kind!r}; choose one of: {', '.join(FAULT_KINDS)}"
            )
        if not isinstance(self.target, str) or not self.target:
            what = "a link name" if self.on_link else "a process name"
            raise ScheduleError(
                f"'target': must be {what} (a non-empty string), got {self.target!r}"
            )
        if (self.at_s is None) == (self.after_calls is None):
            raise ScheduleError(
                "give exactly one trigger: 'at_s' (seconds after the run starts) or "
                "'after_calls' (number of calls noted)"
                + (", not both" if self.at_s is not None else "")
            )
        if self.at_s is not None:
            _check_number("at_s", self.at_s, minimum=0.0)
        if self.after_calls is not None and (
            isinstance(self.after_calls, bool)
            or not isinstance(self.after_calls, int)
            or self.after_calls < 0
        ):
            raise ScheduleError(f"'after_calls': must be an integer >= 0, got {self.after_calls!r}")
        if self.kind == "kill":
            if self.duration_s is not None:
                raise ScheduleError("'duration_s': a kill has no duration; remove it")
        elif self.duration_s is not None:
            _check_number("duration_s", self.duration_s, minimum=0.0, exclusive=True)
        if self.kind in TOXICS:
            try:
                resolved = validate_toxic(
                    self.kind,
                    stream=self.stream,
                    toxicity=self.toxicity,
                    attributes=self.attributes,
                )
            except ToxicValidationError as exc:
                raise ScheduleError(str(exc)) from None
            object.__setattr__(self, "attributes", resolved)
        else:
            if self.attributes:
                raise ScheduleError(
                    f"'attributes': a {self.kind!r} fault takes none; got {sorted(self.attributes)}"
                )
            object.__setattr__(self, "attributes", {})

    @property
    def on_link(self) -> bool:
        return self.kind in LINK_KINDS

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "target": self.target}
        if self.at_s is not None:
            out["at_s"] = self.at_s
        if self.after_calls is not None:
            out["after_calls"] = self.after_calls
        if self.duration_s is not None:
            out["duration_s"] = self.duration_s
        if self.kind in TOXICS:
            out["stream"] = self.stream
            out["toxicity"] = self.toxicity
            out["attributes"] = dict(self.attributes)
        return out


@dataclass(frozen=True)
class Schedule:
    """An ordered list of faults, with an optional name and the seed that drew it."""

    faults: tuple[Fault, ...]
    name: str = ""
    description: str = ""
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.name:
            out["name"] = self.name
        if self.description:
            out["description"] = self.description
        if self.seed is not None:
            out["seed"] = self.seed
        out["faults"] = [f.to_dict() for f in self.faults]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def check_targets(self, links: Iterable[str], processes: Iterable[str]) -> None:
        """Raise ScheduleError for the first fault whose target is not a known link/process."""
        known_links, known_procs = set(links), set(processes)
        for i, fault in enumerate(self.faults):
            pool, what, whats = (
                (known_links, "link", "links")
                if fault.on_link
                else (known_procs, "process", "processes")
            )
            if fault.target not in pool:
                raise ScheduleError(
                    f"faults[{i}] ({fault.kind}): no {what} named {fault.target!r}; "
                    f"known {whats}: {', '.join(sorted(pool)) or 'none'}"
                )


def parse_schedule(data: Any, source: str = "<schedule>") -> Schedule:
    """Validate a decoded scenario (dict from TOML/JSON) into a Schedule."""
    if not isinstance(data, Mapping):
        raise ScheduleError(
            f"{source}: a scenario must be a table/object, got {type(data).__name__}"
        )
    _reject_unknown(data, _SCHEDULE_KEYS, source)
    name = data.get("name", "")
    description = data.get("description", "")
    for key, value in (("name", name), ("description", description)):
        if not isinstance(value, str):
            raise ScheduleError(f"{source}: '{key}' must be a string, got {value!r}")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ScheduleError(f"{source}: 'seed' must be an integer, got {seed!r}")
    raw_faults = data.get("faults")
    if raw_faults is None:
        raise ScheduleError(
            f"{source}: no 'faults' list; add at least one [[faults]] table (TOML) "
            'or a "faults": [...] array (JSON)'
        )
    if not isinstance(raw_faults, Sequence) or isinstance(raw_faults, str):
        raise ScheduleError(f"{source}: 'faults' must be a list, got {type(raw_faults).__name__}")
    parsed = [_parse_fault(raw, f"{source}: faults[{i}]") for i, raw in enumerate(raw_faults)]
    return Schedule(tuple(parsed), name=name, description=description, seed=seed)


def load_schedule(path: str | Path) -> Schedule:
    """Read a scenario file: ``.toml`` or ``.json``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScheduleError(f"cannot read scenario {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ScheduleError(f"{path}: scenario files must end in .toml or .json")
    except tomllib.TOMLDecodeError as exc:
        raise ScheduleError(f"{path}: not valid TOML: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"{path}: not valid JSON: {exc}") from None
    return parse_schedule(data, str(path))


def _parse_fault(raw: Any, where: str) -> Fault:
    if not isinstance(raw, Mapping):
        raise ScheduleError(f"{where}: a fault must be a table/object, got {raw!r}")
    _reject_unknown(raw, _FAULT_KEYS, where)
    for required in ("kind", "target"):
        if required not in raw:
            raise ScheduleError(f"{where}: missing '{required}'")
    kind = raw["kind"]
    if kind in FAULT_KINDS and kind not in TOXICS:
        for key in ("stream", "toxicity"):
            if key in raw:
                raise ScheduleError(
                    f"{where}: '{key}' applies to toxics only, not to a {kind!r} fault; remove it"
                )
    attributes = raw.get("attributes", {})
    if not isinstance(attributes, Mapping):
        raise ScheduleError(f"{where}: 'attributes' must be a table/object, got {attributes!r}")
    try:
        return Fault(
            kind=kind,
            target=raw["target"],
            at_s=raw.get("at_s"),
            after_calls=raw.get("after_calls"),
            duration_s=raw.get("duration_s"),
            stream=raw.get("stream", "downstream"),
            toxicity=raw.get("toxicity", 1.0),
            attributes=dict(attributes),
        )
    except ScheduleError as exc:
        raise ScheduleError(f"{where}: {exc}") from None


def _reject_unknown(data: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ScheduleError(
            f"{where}: unknown key {unknown[0]!r}; allowed keys: {', '.join(allowed)}"
        )


def _check_number(key: str, value: Any, *, minimum: float, exclusive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScheduleError(f"'{key}': must be a number of seconds, got {value!r}")
    if value < minimum or (exclusive and value == minimum):
        op = ">" if exclusive else ">="
        raise ScheduleError(f"'{key}': must be {op} {minimum}, got {value!r}")


def random_schedule(
    seed: int,
    duration_s: float,
    n_faults: int,
    links: Iterable[str] = (),
    processes: Iterable[str] = (),
    kinds: Iterable[str] | None = None,
    fault_s: tuple[float, float] | None = None,
) -> Schedule:
    """Draw ``n_faults`` faults within ``duration_s`` seconds; same arguments, same schedule.

    ``kinds`` defaults to every kind that has a target: link kinds if ``links`` is
    non-empty, kill and pause if ``processes`` is. Every fault ends by ``duration_s``.
    A fault that lasts (all but kill) lasts 5-30 % of ``duration_s``, or a time drawn from
    ``fault_s=(shortest, longest)`` seconds when given, so that a long schedule need not
    mean long outages.
    """
    if fault_s is not None and not (0 < fault_s[0] <= fault_s[1]):
        raise ScheduleError(f"random_schedule: fault_s must be (shortest, longest) with 0 < shortest <= longest, "
                            f"got {fault_s!r}")
    link_names, proc_names = sorted(set(links)), sorted(set(processes))
    if kinds is None:
        chosen = [k for k in FAULT_KINDS if (link_names if k in LINK_KINDS else proc_names)]
    else:
        chosen = list(dict.fromkeys(kinds))
    if not chosen:
        raise ScheduleError("random_schedule: no fault kind has a target; give links or processes")
    for kind in chosen:
        if kind not in FAULT_KINDS:
            raise ScheduleError(
                f"random_schedule: unknown fault kind {kind!r}; choose from {', '.join(FAULT_KINDS)}"
            )
        if kind in LINK_KINDS and not link_names:
            raise ScheduleError(f"random_schedule: kind {kind!r} needs at least one link")
        if kind in PROCESS_KINDS and not proc_names:
            raise ScheduleError(f"random_schedule: kind {kind!r} needs at least one process")
    if not (isinstance(duration_s, int | float) and duration_s > 0):
        raise ScheduleError(f"random_schedule: duration_s must be > 0, got {duration_s!r}")
    if n_faults < 0:
        raise ScheduleError(f"random_schedule: n_faults must be >= 0, got {n_faults!r}")

    rng = random.Random(seed)
    drawn: list[Fault] = []
    for _ in range(n_faults):
        kind = rng.choice(chosen)
        target = rng.choice(link_names if kind in LINK_KINDS else proc_names)
        at_s = round(rng.uniform(0.0, duration_s * 0.9), 3)
        duration = None
        if kind != "kill":
            longest = duration_s - at_s
            drawn_s = rng.uniform(*fault_s) if fault_s else rng.uniform(0.05, 0.3) * duration_s
            duration = round(min(longest, drawn_s), 3)
            duration = max(duration, 0.001)
        extra: dict[str, Any] = {}
        if kind in TOXICS:
            extra = {
                "stream": rng.choice(STREAMS),
                "toxicity": rng.choice((1.0, 1.0, 1.0, 0.5)),
                "attributes": _random_attributes(kind, rng),
            }
        drawn.append(Fault(kind=kind, target=target, at_s=at_s, duration_s=duration, **extra))
    drawn.sort(key=lambda f: f.at_s or 0.0)
    return Schedule(tuple(drawn), name=f"random-{seed}", seed=seed)


def _random_attributes(kind: str, rng: random.Random) -> dict[str, int]:
    if kind == "latency":
        latency = rng.randint(5, 500)
        return {"latency": latency, "jitter": rng.randint(0, latency // 4)}
    if kind == "bandwidth":
        return {"rate": rng.randint(8, 1024)}
    if kind == "slow_close":
        return {"delay": rng.randint(10, 1000)}
    if kind == "timeout":
        return {"timeout": rng.randint(0, 2000)}
    if kind == "reset_peer":
        return {"timeout": rng.randint(0, 500)}
    if kind == "slicer":
        size = rng.randint(8, 1024)
        return {
            "average_size": size,
            "size_variation": rng.randint(0, size // 2),
            "delay": rng.randint(0, 1000),
        }
    if kind == "limit_data":
        return {"bytes": rng.randint(1, 1 << 16)}
    raise AssertionError(f"no random attributes for {kind!r}")


ProcessRef = int | Callable[[], int]


@dataclass
class _Active:
    index: int
    fault: Fault
    ends_at: float | None
    undo: Callable[[], None]


class _LinkWorker:
    """Applies link faults in order, in a thread of their own.

    A Toxiproxy API call can block for as long as a process at either end of the link
    is SIGSTOPped (removing a toxic waits for the toxic's goroutine, which waits to
    write to a peer that does not read). Process faults therefore never queue behind
    link calls: the SIGCONT that unblocks a stuck call always goes out on time.
    """

    def __init__(self, name: str, on_error: Callable[[int, Fault, str, Exception], None]) -> None:
        self._on_error = on_error
        self._jobs: list[tuple[int, Fault, str, Callable[[], None]] | None] = []
        self._cond = threading.Condition()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=f"chaos-links:{name}", daemon=True)
        self._thread.start()

    def submit(self, index: int, fault: Fault, phase: str, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append((index, fault, phase, job))
            self._cond.notify_all()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted job has run; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._busy, timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Run what is queued, then end the thread; False if it is still stuck after ``timeout_s``."""
        with self._cond:
            self._jobs.append(None)
            self._cond.notify_all()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs))
                item = self._jobs.pop(0)
                if item is None:
                    self._cond.notify_all()
                    return
                self._busy = True
            index, fault, phase, job = item
            try:
                job()
            except Exception as exc:
                self._on_error(index, fault, phase, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class ScheduleRunner:
    """Plays a Schedule in a background thread it owns; ``stop()`` undoes what is still active.

    ``processes`` maps a process name to its pid, or to a callable returning the
    current pid (a process that is restarted gets a new one). Call ``note_calls()`` as
    calls are made to fire ``after_calls`` faults. Use as a context manager::

        with ScheduleRunner(schedule, net, {"controller": pid}) as runner:
            ...drive the workload...
        report = runner.faults.events()
    """

    def __init__(
        self,
        schedule: Schedule,
        net: ChaosNet | None = None,
        processes: Mapping[str, ProcessRef] | None = None,
        *,
        faults: FaultLog | None = None,
    ) -> None:
        self.schedule = schedule
        self.net = net
        self.processes = dict(processes or {})
        schedule.check_targets(list(net) if net is not None else [], self.processes)
        if faults is not None:
            self.faults = faults
        else:
            self.faults = net.faults if net is not None else FaultLog()
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._calls = 0
        self._stopping = False
        self._all_done = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._down_count: dict[str, int] = {}
        self._pause_count: dict[int, int] = {}
        self._links: _LinkWorker | None = None

    def __enter__(self) -> ScheduleRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def calls(self) -> int:
        with self._cond:
            return self._calls

    def events(self) -> list[FaultEvent]:
        return self.faults.events()

    def start(self) -> ScheduleRunner:
        if self._thread is not None:
            raise RuntimeError("ScheduleRunner.start() called twice; create a new runner")
        self._t0 = time.monotonic()
        self._links = _LinkWorker(self.schedule.name or "unnamed", self._error)
        self._thread = threading.Thread(
            target=self._run, name=f"chaos-schedule:{self.schedule.name or 'unnamed'}", daemon=True
        )
        self._thread.start()
        return self

    def note_calls(self, n: int = 1) -> None:
        """Count ``n`` more calls; faults with ``after_calls`` fire once the count reaches it."""
        with self._cond:
            self._calls += n
            self._cond.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every fault has fired and every timed fault has ended."""
        return self._all_done.wait(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop firing faults, undo the active ones, and join the threads.

        Paused processes are resumed first, then links are restored. A link call still
        stuck after ``timeout_s`` (a peer stopped by something other than this schedule)
        is recorded in ``errors`` rather than raised, so the run can still be checked.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout_s
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError(f"ScheduleRunner thread did not stop within {timeout_s}s")
        assert self._links is not None
        if not self._links.close(max(0.0, deadline - time.monotonic())):
            message = f"link faults were still being undone {timeout_s}s after stop(); Toxiproxy is stuck"
            self.errors.append(message)
            log.warning("link undo stuck", schedule=self.schedule.name, timeout_s=timeout_s)

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _run(self) -> None:
        pending = list(enumerate(self.schedule.faults))
        active: list[_Active] = []
        try:
            while True:
                with self._cond:
                    if self._stopping:
                        break
                    calls = self._calls
                now = self._now()
                still: list[tuple[int, Fault]] = []
                for index, fault in pending:
                    due = (fault.at_s is not None and fault.at_s <= now) or (
                        fault.after_calls is not None and fault.after_calls <= calls
                    )
                    if not due:
                        still.append((index, fault))
                        continue
                    undo = self._apply(index, fault)
                    if undo is not None:
                        ends = None if fault.duration_s is None else self._now() + fault.duration_s
                        active.append(_Active(index, fault, ends, undo))
                pending = still
                now = self._now()
                for item in [a for a in active if a.ends_at is not None and a.ends_at <= now]:
                    active.remove(item)
                    self._undo(item)
                deadlines = [f.at_s for _, f in pending if f.at_s is not None]
                deadlines += [a.ends_at for a in active if a.ends_at is not None]
                if not pending and not deadlines and not self._all_done.is_set():
                    assert self._links is not None
                    # Done means applied: nothing is paused now, so link calls cannot stay stuck.
                    if self._links.drain(timeout_s=0.05):
                        self._all_done.set()
                    else:
                        deadlines.append(self._now() + 0.05)
                with self._cond:
                    if self._stopping:
                        break
                    if self._calls != calls:
                        continue
                    timeout = max(0.0, min(deadlines) - self._now()) if deadlines else None
                    self._cond.wait(timeout)
        finally:
            # Resume processes before restoring links: a stopped peer can block link calls.
            for item in reversed(active):
                if item.fault.kind in PROCESS_KINDS:
                    self._undo(item)
            for item in reversed(active):
                if item.fault.kind not in PROCESS_KINDS:
                    self._undo(item)
            self._all_done.set()

    def _note(self, index: int) -> dict[str, Any]:
        return {"fault": index, "offset_s": round(self._now(), 4)}

    def _apply(self, index: int, fault: Fault) -> Callable[[], None] | None:
        try:
            if fault.kind in TOXICS:
                return self._apply_toxic(index, fault)
            if fault.kind == "down":
                return self._apply_down(index, fault)
            pid = self._pid(fault.target)
            if fault.kind == "kill":
                process_faults.kill(
                    pid, target=fault.target, log_to=self.faults, note=self._note(index)
                )
                return None
            return self._apply_pause(index, fault, pid)
        except Exception as exc:  # a fault that cannot be applied must not end the run
            self._error(index, fault, "apply", exc)
            return None

    def _apply_toxic(self, index: int, fault: Fault) -> Callable[[], None]:
        assert self.net is not None and self._links is not None
        net, links, name = self.net, self._links, f"chaos{index}_{fault.kind}_{fault.stream}"
        added_at: float | None = None

        def add() -> None:
            nonlocal added_at
            net.add_toxic(
                fault.target,
                fault.kind,
                fault.stream,
                fault.toxicity,
                toxic_name=name,
                note=self._note(index),
                **fault.attributes,
            )
            added_at = self._now()

        def remove() -> None:
            if added_at is None:  # a toxic that could not be added has nothing to remove
                return
            self._hold(fault, added_at)
            net.remove_toxic(fault.target, name, note=self._note(index))

        links.submit(index, fault, "apply", add)
        return lambda: links.submit(index, fault, "undo", remove)

    def _apply_down(self, index: int, fault: Fault) -> Callable[[], None]:
        assert self.net is not None and self._links is not None
        net, links, link = self.net, self._links, fault.target

        # Overlapping partitions of one link: it comes back up when the last one ends.
        # The count lives in the link thread, which runs these jobs in order.
        applied_at: float | None = None

        def down() -> None:
            nonlocal applied_at
            if self._down_count.get(link, 0) == 0:
                net.partition(link, note=self._note(index))
            self._down_count[link] = self._down_count.get(link, 0) + 1
            applied_at = self._now()

        def up() -> None:
            if applied_at is None:  # a partition that could not be applied has nothing to heal
                return
            self._hold(fault, applied_at)
            self._down_count[link] -= 1
            if self._down_count[link] == 0:
                net.heal(link, note=self._note(index))

        links.submit(index, fault, "apply", down)
        return lambda: links.submit(index, fault, "undo", up)

    def _hold(self, fault: Fault, applied_at: float) -> None:
        """A link fault applied late (its call queued behind another) still lasts its full
        duration: the undo waits out the rest (unless the runner is stopping)."""
        if fault.duration_s is None:
            return
        rest = applied_at + fault.duration_s - self._now()
        if rest > 0:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping, rest)

    def _apply_pause(self, index: int, fault: Fault, pid: int) -> Callable[[], None]:
        if self._pause_count.get(pid, 0) == 0:
            process_faults.pause(
                pid, target=fault.target, log_to=self.faults, note=self._note(index)
            )
        self._pause_count[pid] = self._pause_count.get(pid, 0) + 1

        def undo() -> None:
            self._pause_count[pid] -= 1
            if self._pause_count[pid] == 0 and process_faults.process_state(pid) not in process_faults.GONE:
                process_faults.resume(
                    pid, target=fault.target, log_to=self.faults, note=self._note(index)
                )

        return undo

    def _undo(self, item: _Active) -> None:
        try:
            item.undo()
        except Exception as exc:
            self._error(item.index, item.fault, "undo", exc)

    def _pid(self, name: str) -> int:
        ref = self.processes[name]
        return ref() if callable(ref) else ref

    def _error(self, index: int, fault: Fault, phase: str, exc: Exception) -> None:
        message = f"faults[{index}] {fault.kind} on {fault.target!r}: {phase} failed: {exc}"
        self.errors.append(message)
        log.warning(
            "fault failed",
            fault=index,
            kind=fault.kind,
            target=fault.target,
            phase=phase,
            error=str(exc),
        )
        self.faults.record(
            "error", fault.target, {"fault": index, "phase": phase, "error": str(exc)}
        )
