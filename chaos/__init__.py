"""chaos: Toxiproxy-driven network faults, process faults and fault schedules.

Drives the system under test from outside only (see docs/design.md, "Chaos"): it knows
addresses and pids, never the internals of controller, worker or journal.
"""

from regent.chaos.faults import (
    FaultEvent,
    FaultLog,
    ProcessFaultError,
    host_processes,
    kill,
    kill_host,
    pause,
    paused,
    process_state,
    release,
    resume,
)
from regent.chaos.net import ChaosNet, UnknownLinkError
from regent.chaos.runner import ScheduleRunner
from regent.chaos.schedule import (
    FAULT_KINDS,
    LINK_KINDS,
    PACKET_KINDS,
    PROCESS_KINDS,
    Fault,
    Schedule,
    ScheduleError,
    load_schedule,
    parse_schedule,
    random_schedule,
)
from regent.chaos.toxics import TOXICS, ToxicValidationError, validate_toxic
from regent.chaos.toxiproxy import (
    Proxy,
    Toxic,
    ToxiproxyClient,
    ToxiproxyError,
    ToxiproxyNotInstalled,
    ToxiproxyServer,
    find_toxiproxy_server,
)

__all__ = [
    "FAULT_KINDS",
    "LINK_KINDS",
    "PACKET_KINDS",
    "PROCESS_KINDS",
    "TOXICS",
    "ChaosNet",
    "Fault",
    "FaultEvent",
    "FaultLog",
    "ProcessFaultError",
    "Proxy",
    "Schedule",
    "ScheduleError",
    "ScheduleRunner",
    "Toxic",
    "ToxicValidationError",
    "ToxiproxyClient",
    "ToxiproxyError",
    "ToxiproxyNotInstalled",
    "ToxiproxyServer",
    "UnknownLinkError",
    "find_toxiproxy_server",
    "host_processes",
    "kill",
    "kill_host",
    "load_schedule",
    "parse_schedule",
    "pause",
    "paused",
    "process_state",
    "random_schedule",
    "release",
    "resume",
    "validate_toxic",
]
