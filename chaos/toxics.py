"""The catalogue of Toxiproxy toxics: their attributes, units and limits.

Arguments are checked here, before anything reaches the server, so that a typo in
a scenario file fails with the toxic and attribute named instead of a bare HTTP 400.
This module only describes and validates; it does no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "STREAMS",
    "TOXICS",
    "AttributeSpec",
    "ToxicSpec",
    "ToxicValidationError",
    "validate_toxic",
]

STREAMS: tuple[str, ...] = ("downstream", "upstream")


class ToxicValidationError(ValueError):
    """A toxic kind, attribute, stream or toxicity that Toxiproxy would reject or misread."""


@dataclass(frozen=True)
class AttributeSpec:
    """One integer attribute of a toxic."""

    name: str
    unit: str
    minimum: int = 0
    default: int | None = None  # None: the caller must give it

    @property
    def required(self) -> bool:
        return self.default is None


@dataclass(frozen=True)
class ToxicSpec:
    """A toxic kind as Toxiproxy v2 implements it."""

    kind: str
    summary: str
    attributes: tuple[AttributeSpec, ...] = field(default_factory=tuple)

    def attribute(self, name: str) -> AttributeSpec | None:
        for spec in self.attributes:
            if spec.name == name:
                return spec
        return None

    @property
    def attribute_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)


TOXICS: dict[str, ToxicSpec] = {
    spec.kind: spec
    for spec in (
        ToxicSpec(
            "latency",
            "delay each chunk of data by latency +/- jitter",
            (AttributeSpec("latency", "ms"), AttributeSpec("jitter", "ms", default=0)),
        ),
        ToxicSpec(
            "bandwidth",
            "limit throughput to rate KB/s",
            (AttributeSpec("rate", "KB/s", minimum=1),),
        ),
        ToxicSpec(
            "slow_close",
            "delay the TCP close by delay",
            (AttributeSpec("delay", "ms"),),
        ),
        ToxicSpec(
            "timeout",
            "drop all data and close the connection after timeout (0: never close)",
            (AttributeSpec("timeout", "ms", default=0),),
        ),
        ToxicSpec(
            "reset_peer",
            "reset the connection (TCP RST) timeout after data arrives (0: at once)",
            (AttributeSpec("timeout", "ms", default=0),),
        ),
        ToxicSpec(
            "slicer",
            "cut data into pieces of average_size +/- size_variation bytes, delay apart",
            (
                AttributeSpec("average_size", "bytes", minimum=1),
                AttributeSpec("size_variation", "bytes", default=0),
                AttributeSpec("delay", "us", default=0),
            ),
        ),
        ToxicSpec(
            "limit_data",
            "close the connection once bytes have passed",
            (AttributeSpec("bytes", "bytes", minimum=1),),
        ),
    )
}


def validate_toxic(
    kind: str,
    *,
    stream: str = "downstream",
    toxicity: float = 1.0,
    attributes: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """Check a toxic's arguments; return its attributes with defaults filled in.

    Raises ToxicValidationError naming the toxic and the attribute at fault.
    """
    spec = TOXICS.get(kind)
    if spec is None:
        raise ToxicValidationError(
            f"unknown toxic kind {kind!r}; Toxiproxy has: {', '.join(sorted(TOXICS))}"
        )
    if stream not in STREAMS:
        raise ToxicValidationError(
            f"toxic {kind!r}: stream must be 'downstream' (server to client) or "
            f"'upstream' (client to server), got {stream!r}"
        )
    if isinstance(toxicity, bool) or not isinstance(toxicity, int | float):
        raise ToxicValidationError(
            f"toxic {kind!r}: toxicity must be a number in [0, 1], got {toxicity!r}"
        )
    if not 0.0 <= float(toxicity) <= 1.0:
        raise ToxicValidationError(
            f"toxic {kind!r}: toxicity is the probability that a connection is affected "
            f"and must be in [0, 1], got {toxicity!r}"
        )
    given = dict(attributes or {})
    unknown = sorted(set(given) - set(spec.attribute_names))
    if unknown:
        raise ToxicValidationError(
            f"toxic {kind!r} has no attribute {unknown[0]!r}; "
            f"its attributes are: {', '.join(_describe(a) for a in spec.attributes)}"
        )
    resolved: dict[str, int] = {}
    for attr in spec.attributes:
        if attr.name not in given:
            if attr.required:
                raise ToxicValidationError(
                    f"toxic {kind!r} needs attribute {attr.name!r} ({attr.unit}); "
                    f"e.g. {kind}({attr.name}={max(attr.minimum, 1) * 100})"
                )
            assert attr.default is not None
            resolved[attr.name] = attr.default
            continue
        value = given[attr.name]
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise ToxicValidationError(
                    f"toxic {kind!r}: attribute {attr.name!r} must be an integer "
                    f"number of {attr.unit}, got {value!r}"
                )
        if value < attr.minimum:
            raise ToxicValidationError(
                f"toxic {kind!r}: attribute {attr.name!r} must be >= {attr.minimum} "
                f"{attr.unit}, got {value}"
            )
        resolved[attr.name] = value
    if kind == "slicer" and resolved["size_variation"] >= resolved["average_size"]:
        raise ToxicValidationError(
            f"toxic 'slicer': attribute 'size_variation' ({resolved['size_variation']}) "
            f"must be smaller than 'average_size' ({resolved['average_size']})"
        )
    return resolved


def _describe(attr: AttributeSpec) -> str:
    if attr.required:
        return f"{attr.name} ({attr.unit}, required)"
    return f"{attr.name} ({attr.unit}, default {attr.default})"
