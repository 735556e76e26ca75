"""Packet-level faults between namespace hosts, as fault kinds of a Schedule.

A packet fault names hosts, or roles that resolve to hosts when the fault fires (the
primary controller's host moves with each failover):

- ``isolate``    target ``G``: G reaches no host outside it, both ways.
- ``partition``  target ``G1|G2[|G3...]``: each group reaches only itself; hosts in no
  group keep reaching everyone. ``rest`` names every host not in another group.
- ``block``      target ``G1>G2``: what G1 sends to G2 is dropped (one way).
- ``loss``       target ``G``, ``attributes = {percent = P}``: P % of the packets that
  reach each host of G are dropped.
- ``duplicate``  target ``G``, ``attributes = {percent = P}``: P % of the packets each
  host of G sends to another host arrive twice.
- ``netem``      target ``G``, attributes among delay_ms, jitter_ms, loss_pct,
  duplicate_pct, reorder_pct, corrupt_pct: tc netem on each host's link (kernels built
  without sch_netem refuse it; the runner records the fault as not applied).

A group ``G`` is names joined by commas: host names, or roles (``primary``, ``etcd-leader``,
``workers``...) that the cluster running the schedule defines. Blocks, loss and
duplication use nftables (chaos.netns); faults that overlap add up and end one by one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from regent.chaos.faults import FaultLog
from regent.chaos.netns import NamespaceHosts

__all__ = ["NETEM_KEYS", "PACKET_KINDS", "HostFaults", "PacketFaultError", "groups_of", "validate_packet_fault"]

PACKET_KINDS: tuple[str, ...] = ("isolate", "partition", "block", "loss", "duplicate", "netem")
NETEM_KEYS: tuple[str, ...] = ("delay_ms", "jitter_ms", "loss_pct", "duplicate_pct", "reorder_pct", "corrupt_pct")
REST = "rest"


class PacketFaultError(ValueError):
    """A packet fault written wrongly; the message says what to change."""


def groups_of(kind: str, target: str) -> list[list[str]]:
    """The groups of names a packet fault's target spells (syntax only; names are not resolved)."""
    if kind == "partition":
        parts = target.split("|")
        if len(parts) < 2:
            raise PacketFaultError(f"a partition's target is groups joined by '|' (e.g. 'primary,e1|rest'), "
                                   f"got {target!r}")
    elif kind == "block":
        parts = target.split(">")
        if len(parts) != 2:
            raise PacketFaultError(f"a block's target is 'FROM>TO' (e.g. 'primary>workers'), got {target!r}")
    else:
        parts = [target]
    groups = [[n.strip() for n in part.split(",")] for part in parts]
    if any(not n for g in groups for n in g):
        raise PacketFaultError(f"an empty host name in {target!r}; names are joined by ',' and groups by "
                               f"{'|' if kind == 'partition' else '>'}")
    if kind != "partition" and any(REST in g for g in groups):
        raise PacketFaultError(f"'{REST}' is only meaningful in a partition, not in a {kind!r} target")
    return groups


def validate_packet_fault(kind: str, target: str, attributes: Mapping[str, Any]) -> dict[str, float]:
    """Check a packet fault's target syntax and attributes; the attributes to apply."""
    groups_of(kind, target)
    attrs = dict(attributes)
    if kind in ("isolate", "partition", "block"):
        if attrs:
            raise PacketFaultError(f"a {kind!r} fault takes no attributes; got {sorted(attrs)}")
        return {}
    allowed = NETEM_KEYS if kind == "netem" else ("percent",)
    unknown = sorted(set(attrs) - set(allowed))
    if unknown:
        raise PacketFaultError(f"{kind!r} has no attribute {unknown[0]!r}; it takes {', '.join(allowed)}")
    if kind != "netem" and "percent" not in attrs:
        raise PacketFaultError(f"a {kind!r} fault needs attributes = {{percent = P}} (0 < P <= 100)")
    if kind == "netem" and not attrs:
        raise PacketFaultError(f"a netem fault needs at least one of {', '.join(NETEM_KEYS)}")
    out: dict[str, float] = {}
    for key, value in attrs.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise PacketFaultError(f"attribute {key!r} must be a number >= 0, got {value!r}")
        if (key == "percent" or key.endswith("_pct")) and value > 100:
            raise PacketFaultError(f"attribute {key!r} is a percentage (0-100), got {value!r}")
        if key == "percent" and value == 0:
            raise PacketFaultError("attribute 'percent' must be > 0 (a fault that does nothing)")
        out[key] = float(value)
    return out


class HostFaults:
    """Applies packet faults to namespace hosts; ``resolve(name)`` turns a role or a host name
    into the hosts it means now (it raises LookupError when nobody plays the role)."""

    def __init__(self, net: NamespaceHosts, resolve: Callable[[str], Iterable[str]], roles: Iterable[str] = (),
                 faults: FaultLog | None = None) -> None:
        self.net = net
        self._resolve = resolve
        self.names = sorted({*net.names, *roles})
        self.faults = faults if faults is not None else FaultLog()

    def __iter__(self):
        return iter(self.names)

    def hosts(self, group: list[str], others: Iterable[str] = ()) -> list[str]:
        if group == [REST]:
            taken = set(others)
            return [h for h in self.net.names if h not in taken]
        out: list[str] = []
        for name in group:
            found = [name] if name in self.net.names else list(self._resolve(name))
            if not found:
                raise LookupError(f"{name!r} names no host right now")
            out += [h for h in found if h not in out]
        return out

    def apply(self, kind: str, target: str, attributes: Mapping[str, float], note: Mapping[str, Any]) -> Callable[[], None]:
        """Apply one packet fault now; the callable that ends it."""
        net = self.net
        groups = groups_of(kind, target)
        named = {i: self.hosts(g) for i, g in enumerate(groups) if g != [REST]}
        taken = [h for hosts in named.values() for h in hosts]
        resolved = [named[i] if i in named else self.hosts(g, taken) for i, g in enumerate(groups)]
        detail = {**dict(note), "hosts": "|".join(",".join(g) for g in resolved)}
        if kind in ("isolate", "partition", "block"):
            if kind == "isolate":
                pairs = net.partition_pairs(resolved[0], [h for h in net.names if h not in resolved[0]])
            elif kind == "partition":
                pairs = net.partition_pairs(*resolved)
            else:
                pairs = [(s, d) for s in resolved[0] for d in resolved[1] if s != d]
            if not pairs:
                raise LookupError(f"{target!r} separates no hosts right now ({detail['hosts']})")
            net.block_pairs(pairs)

            def undo() -> None:
                net.unblock_pairs(pairs)
        elif kind in ("loss", "duplicate"):
            pct = attributes["percent"]
            add, remove = (net.add_loss, net.remove_loss) if kind == "loss" else (net.add_duplicate, net.remove_duplicate)
            for h in resolved[0]:
                add(h, pct)

            def undo() -> None:
                for h in resolved[0]:
                    remove(h, pct)
        else:
            done: list[str] = []
            try:
                for h in resolved[0]:
                    net.netem(h, **attributes)
                    done.append(h)
            except Exception:
                for h in done:
                    net.clear_netem(h)
                raise

            def undo() -> None:
                for h in done:
                    net.clear_netem(h)
        self.faults.record(kind, target, {**detail, **attributes})

        def end() -> None:
            undo()
            self.faults.record("heal", target, {**dict(note), "fault_kind": kind, "hosts": detail["hosts"]})

        return end
