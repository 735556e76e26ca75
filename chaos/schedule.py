"""Fault schedules: what to break, where, when and for how long.

A Schedule is plain, validated data: written by hand as a TOML or JSON scenario file,
or drawn by random_schedule() from a seed (same seed, same schedule). Nothing here
applies a fault; chaos.runner.ScheduleRunner plays a schedule.
"""

from __future__ import annotations

import json
import math
import random
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regent.chaos.packets import (
    PACKET_KINDS,
    REST,
    PacketFaultError,
    groups_of,
    validate_packet_fault,
)
from regent.chaos.toxics import STREAMS, TOXICS, ToxicValidationError, validate_toxic

__all__ = [
    "IN_FLIGHT",
    "FAULT_KINDS",
    "LINK_KINDS",
    "PACKET_KINDS",
    "PROCESS_KINDS",
    "Fault",
    "Schedule",
    "ScheduleError",
    "load_schedule",
    "parse_schedule",
    "random_schedule",
]

LINK_KINDS: tuple[str, ...] = (*TOXICS, "down")
PROCESS_KINDS: tuple[str, ...] = ("kill", "pause", "kill_host")  # kill_host: an agent and all it started
IN_FLIGHT = "in_flight_s"  # the attribute of a kill or toxic that waits for a call to be running
FAULT_KINDS: tuple[str, ...] = (*LINK_KINDS, *PROCESS_KINDS, *PACKET_KINDS)

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
    attributes: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ScheduleError(
                f"'kind': unknown fault kind {self.kind!r}; choose one of: {', '.join(FAULT_KINDS)}"
            )
        if not isinstance(self.target, str) or not self.target:
            what = "a link name" if self.on_link else "hosts" if self.on_hosts else "a process name"
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
        if self.kind in ("kill", "kill_host"):
            if self.duration_s is not None:
                raise ScheduleError(f"'duration_s': a {self.kind} has no duration; remove it")
        elif self.duration_s is not None:
            _check_number("duration_s", self.duration_s, minimum=0.0, exclusive=True)
        if self.kind in TOXICS:
            # in_flight_s is the runner's, not Toxiproxy's: add the toxic once the process the
            # link leads to runs a call the program waits for (so calls are on the link).
            toxic_attributes = {k: v for k, v in self.attributes.items() if k != IN_FLIGHT}
            try:
                resolved = validate_toxic(
                    self.kind,
                    stream=self.stream,
                    toxicity=self.toxicity,
                    attributes=toxic_attributes,
                )
            except ToxicValidationError as exc:
                raise ScheduleError(str(exc)) from None
            object.__setattr__(self, "attributes", {**resolved, **self._in_flight()})
        elif self.kind in PACKET_KINDS:
            try:
                resolved = validate_packet_fault(self.kind, self.target, self.attributes)
            except PacketFaultError as exc:
                raise ScheduleError(str(exc)) from None
            object.__setattr__(self, "attributes", resolved)
        elif self.kind == "kill":
            # in_flight_s: wait up to that long for the target to be running a call the program
            # waits for, then kill it (a kill that must land on a call, not between two).
            extra = sorted(set(self.attributes) - {IN_FLIGHT})
            if extra:
                raise ScheduleError(f"'attributes': a kill takes only '{IN_FLIGHT}'; got {extra}")
            object.__setattr__(self, "attributes", self._in_flight())
        else:
            if self.attributes:
                raise ScheduleError(
                    f"'attributes': a {self.kind!r} fault takes none; got {sorted(self.attributes)}"
                )
            object.__setattr__(self, "attributes", {})

    def _in_flight(self) -> dict[str, Any]:
        """The checked `in_flight_s` attribute, as a one-item dict, or an empty one."""
        if IN_FLIGHT not in self.attributes:
            return {}
        _check_number(f"attributes.{IN_FLIGHT}", self.attributes[IN_FLIGHT], minimum=0.0)
        return {IN_FLIGHT: self.attributes[IN_FLIGHT]}

    @property
    def in_flight_of(self) -> str | None:
        """The process whose running call this fault waits for (`in_flight_s`): a kill's target,
        or the process a toxic's link leads to ("controller->proc/1": proc/1); else None."""
        if not self.attributes.get(IN_FLIGHT):
            return None
        return self.target.rpartition("->")[2] if self.on_link else self.target

    @property
    def on_link(self) -> bool:
        return self.kind in LINK_KINDS

    @property
    def on_hosts(self) -> bool:
        """A packet fault between namespace hosts (chaos.packets)."""
        return self.kind in PACKET_KINDS

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
        if self.attributes:
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

    def check_targets(self, links: Iterable[str], processes: Iterable[str], hosts: Iterable[str] = ()) -> None:
        """Raise ScheduleError for the first fault whose target is not a known link, process,
        or host (or host role)."""
        known_links, known_procs, known_hosts = set(links), set(processes), set(hosts)
        for i, fault in enumerate(self.faults):
            if fault.on_hosts:
                names = {n for g in groups_of(fault.kind, fault.target) for n in g} - {REST}
                unknown = sorted(names - known_hosts)
                if unknown:
                    raise ScheduleError(
                        f"faults[{i}] ({fault.kind}): no host or role named {unknown[0]!r}; known: "
                        f"{', '.join(sorted(known_hosts)) or 'none: packet faults need namespace hosts (regent chaos run --hosts)'}"
                    )
                continue
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
            if fault.in_flight_of is not None and fault.in_flight_of not in known_procs:
                raise ScheduleError(
                    f"faults[{i}] ({fault.kind}): {IN_FLIGHT} waits for a call on process "
                    f"{fault.in_flight_of!r}, which is not one of: {', '.join(sorted(known_procs)) or 'none'}"
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
    hosts: Iterable[str] = (),
) -> Schedule:
    """Draw ``n_faults`` faults within ``duration_s`` seconds; same arguments, same schedule.

    ``kinds`` defaults to every kind that has a target: link kinds if ``links`` is
    non-empty, kill and pause if ``processes`` is, packet kinds (but netem) if ``hosts``
    (host names and roles) is. Every fault ends by ``duration_s``.
    A fault that lasts (all but kill) lasts 5-30 % of ``duration_s``, or a time drawn from
    ``fault_s=(shortest, longest)`` seconds when given, so that a long schedule need not
    mean long outages.
    """
    if fault_s is not None and not (0 < fault_s[0] <= fault_s[1]):
        raise ScheduleError(f"random_schedule: fault_s must be (shortest, longest) with 0 < shortest <= longest, "
                            f"got {fault_s!r}")
    link_names, proc_names, host_names = sorted(set(links)), sorted(set(processes)), sorted(set(hosts))

    def pool(kind: str) -> list[str]:
        return link_names if kind in LINK_KINDS else host_names if kind in PACKET_KINDS else proc_names

    if kinds is None:
        # kill_host needs host agents as targets: drawn only when asked for.
        chosen = [k for k in FAULT_KINDS if pool(k) and k not in ("netem", "kill_host")]
    else:
        chosen = list(dict.fromkeys(kinds))
    if not chosen:
        raise ScheduleError("random_schedule: no fault kind has a target; give links or processes")
    for kind in chosen:
        if kind not in FAULT_KINDS:
            raise ScheduleError(
                f"random_schedule: unknown fault kind {kind!r}; choose from {', '.join(FAULT_KINDS)}"
            )
        if not pool(kind):
            what = "link" if kind in LINK_KINDS else "host" if kind in PACKET_KINDS else "process"
            raise ScheduleError(f"random_schedule: kind {kind!r} needs at least one {what}")
    if not (isinstance(duration_s, int | float) and duration_s > 0):
        raise ScheduleError(f"random_schedule: duration_s must be > 0, got {duration_s!r}")
    if n_faults < 0:
        raise ScheduleError(f"random_schedule: n_faults must be >= 0, got {n_faults!r}")

    rng = random.Random(seed)
    drawn: list[Fault] = []
    for _ in range(n_faults):
        kind = rng.choice(chosen)
        target = _random_host_target(kind, host_names, rng) if kind in PACKET_KINDS else rng.choice(pool(kind))
        at_s = round(rng.uniform(0.0, duration_s * 0.9), 3)
        duration = None
        if kind not in ("kill", "kill_host"):
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
        elif kind in PACKET_KINDS:
            extra = {"attributes": _random_packet_attributes(kind, rng)}
        drawn.append(Fault(kind=kind, target=target, at_s=at_s, duration_s=duration, **extra))
    drawn.sort(key=lambda f: f.at_s or 0.0)
    return Schedule(tuple(drawn), name=f"random-{seed}", seed=seed)


def _random_host_target(kind: str, names: list[str], rng: random.Random) -> str:
    """A target for a packet fault: one name, two disjoint groups, or a group against the rest."""
    if kind == "partition":
        cut = rng.sample(names, rng.randint(1, max(1, len(names) // 2)))
        return ",".join(cut) + "|" + REST
    if kind == "block":
        src, dst = rng.sample(names, 2) if len(names) > 1 else (names[0], names[0])
        return f"{src}>{dst}"
    return rng.choice(names)


def _random_packet_attributes(kind: str, rng: random.Random) -> dict[str, float]:
    if kind in ("loss", "duplicate"):
        return {"percent": float(rng.choice((1, 2, 5, 10, 20)))}
    if kind == "netem":
        delay = rng.randint(1, 100)
        return {"delay_ms": float(delay), "jitter_ms": float(rng.randint(0, delay)),
                "reorder_pct": float(rng.choice((0, 5, 25)))}
    return {}


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
