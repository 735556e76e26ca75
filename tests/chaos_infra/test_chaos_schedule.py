"""Fault schedules: scenario files, seeded random schedules, and the runner against real faults."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos_sockets import EchoServer, connect, round_trip

from regent.chaos import (
    FAULT_KINDS,
    LINK_KINDS,
    PACKET_KINDS,
    ChaosNet,
    Fault,
    FaultLog,
    Schedule,
    ScheduleError,
    ScheduleRunner,
    ToxiproxyServer,
    load_schedule,
    parse_schedule,
    process_state,
    random_schedule,
)

RUNNING = ("running", "sleeping", "disk-sleep")  # disk-sleep: a brief uninterruptible wait
LINKS = ["controller->etcd", "standby->etcd", "controller->proc/3", "host->etcd"]
PROCESSES = ["controller", "standby", "host/0", "proc/3"]

SCENARIO = """
name = "etcd-flaky"
description = "etcd slows down, then the controller is partitioned and killed"

[[faults]]
at_s = 0.5
kind = "latency"
target = "controller->etcd"
duration_s = 2.0
attributes = { latency = 100, jitter = 20 }

[[faults]]
at_s = 3.0
kind = "down"
target = "controller->etcd"
duration_s = 1.5

[[faults]]
after_calls = 50
kind = "kill"
target = "controller"
"""


def write(tmp_path: Path, text: str, suffix: str = ".toml") -> Path:
    path = tmp_path / f"scenario{suffix}"
    path.write_text(text)
    return path


def test_a_scenario_file_parses_into_faults(tmp_path: Path) -> None:
    schedule = load_schedule(write(tmp_path, SCENARIO))
    assert schedule.name == "etcd-flaky"
    assert schedule.faults == (
        Fault(
            "latency",
            "controller->etcd",
            at_s=0.5,
            duration_s=2.0,
            attributes={"latency": 100, "jitter": 20},
        ),
        Fault("down", "controller->etcd", at_s=3.0, duration_s=1.5),
        Fault("kill", "controller", after_calls=50),
    )
    as_json = write(tmp_path, schedule.to_json(), ".json")
    assert load_schedule(as_json) == schedule


def fault_toml(body: str) -> str:
    return f'[[faults]]\nat_s = 1.0\nkind = "latency"\ntarget = "a->b"\nattributes = {{ latency = 10 }}\n\n[[faults]]\n{body}\n'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('at_s = 1\nkind = "latncy"\ntarget = "a->b"',
         "faults[1]: 'kind': unknown fault kind 'latncy'; choose one of: latency, bandwidth"),
        ('at_s = 1\nafter_calls = 3\nkind = "down"\ntarget = "a->b"',
         "faults[1]: give exactly one trigger: 'at_s' (seconds after the run starts) or "
         "'after_calls' (number of calls noted), not both"),
        ('kind = "down"\ntarget = "a->b"', "faults[1]: give exactly one trigger"),
        ('at_s = 1\nkind = "down"', "faults[1]: missing 'target'"),
        ('at_s = -1\nkind = "down"\ntarget = "a->b"', "faults[1]: 'at_s': must be >= 0.0, got -1"),
        ('at_s = 1\nkind = "pause"\ntarget = "p"\nduration_s = 0',
         "faults[1]: 'duration_s': must be > 0.0, got 0"),
        ('at_s = 1\nkind = "kill"\ntarget = "p"\nduration_s = 2',
         "faults[1]: 'duration_s': a kill has no duration; remove it"),
        ('at_s = 1\nkind = "kill"\ntarget = "p"\nstream = "upstream"',
         "faults[1]: 'stream' applies to toxics only, not to a 'kill' fault"),
        ('after_calls = 2.5\nkind = "kill"\ntarget = "p"',
         "faults[1]: 'after_calls': must be an integer >= 0, got 2.5"),
        ('at_s = 1\nkind = "down"\ntarget = "a->b"\ndurations = 2',
         "faults[1]: unknown key 'durations'; allowed keys: kind, target, at_s"),
        ('at_s = 1\nkind = "latency"\ntarget = "a->b"\nattributes = { latncy = 5 }',
         "faults[1]: toxic 'latency' has no attribute 'latncy'; its attributes are: "
         "latency (ms, required), jitter (ms, default 0)"),
        ('at_s = 1\nkind = "latency"\ntarget = "a->b"\nattributes = { latency = "50ms" }',
         "faults[1]: toxic 'latency': attribute 'latency' must be an integer number of ms, "
         "got '50ms'"),
        ('at_s = 1\nkind = "bandwidth"\ntarget = "a->b"',
         "faults[1]: toxic 'bandwidth' needs attribute 'rate' (KB/s)"),
        ('at_s = 1\nkind = "slicer"\ntarget = "a->b"\nattributes = { average_size = 8, size_variation = 8 }',
         "faults[1]: toxic 'slicer': attribute 'size_variation' (8) must be smaller than 'average_size' (8)"),
        ('at_s = 1\nkind = "timeout"\ntarget = "a->b"\ntoxicity = 1.5',
         "faults[1]: toxic 'timeout': toxicity is the probability that a connection is affected "
         "and must be in [0, 1], got 1.5"),
        ('at_s = 1\nkind = "timeout"\ntarget = "a->b"\nstream = "sideways"',
         "faults[1]: toxic 'timeout': stream must be 'downstream' (server to client) or "
         "'upstream' (client to server), got 'sideways'"),
        ('at_s = 1\nkind = "down"\ntarget = "a->b"\nattributes = { x = 1 }',
         "faults[1]: 'attributes': a 'down' fault takes none; got ['x']"),
    ],
)  # fmt: skip
def test_scenario_errors_name_the_file_the_fault_and_the_field(
    tmp_path: Path, body: str, message: str
) -> None:
    path = write(tmp_path, fault_toml(body))
    with pytest.raises(ScheduleError) as err:
        load_schedule(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_scenario_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(ScheduleError, match=r"scenario\.toml: not valid TOML"):
        load_schedule(write(tmp_path, "[[faults]\n"))
    with pytest.raises(ScheduleError, match=r"scenario\.json: not valid JSON"):
        load_schedule(write(tmp_path, "{", ".json"))
    with pytest.raises(ScheduleError, match=r"no 'faults' list"):
        load_schedule(write(tmp_path, 'name = "empty"\n'))
    with pytest.raises(ScheduleError, match=r"unknown key 'fault'; allowed keys: name"):
        load_schedule(write(tmp_path, json.dumps({"fault": []}), ".json"))
    with pytest.raises(ScheduleError, match=r"must end in \.toml or \.json"):
        load_schedule(write(tmp_path, "faults: []", ".yaml"))
    with pytest.raises(ScheduleError, match=r"cannot read scenario"):
        load_schedule(tmp_path / "missing.toml")
    with pytest.raises(ScheduleError, match=r"<dict>: faults\[0\]: a fault must be a table"):
        parse_schedule({"faults": ["kill"]}, "<dict>")


def test_random_schedule_is_reproducible_from_its_seed() -> None:
    first = random_schedule(7, 10.0, 25, LINKS, PROCESSES)
    again = random_schedule(
        7, 10.0, 25, reversed(LINKS), set(PROCESSES)
    )  # input order is irrelevant
    other = random_schedule(8, 10.0, 25, LINKS, PROCESSES)
    assert first == again
    assert first.to_json() == again.to_json()
    assert first != other
    assert first.seed == 7 and len(first.faults) == 25


def test_random_schedule_stays_within_its_targets_kinds_and_duration() -> None:
    schedule = random_schedule(3, 5.0, 200, LINKS, PROCESSES)
    # No hosts given; and a host kill only when asked for (it needs host agents as targets).
    assert {f.kind for f in schedule.faults} == set(FAULT_KINDS) - set(PACKET_KINDS) - {"kill_host"}
    for fault in schedule.faults:
        assert fault.target in (LINKS if fault.kind in LINK_KINDS else PROCESSES)
        assert 0.0 <= fault.at_s <= 5.0
        if fault.kind == "kill":
            assert fault.duration_s is None
        else:
            assert fault.at_s + fault.duration_s <= 5.0 + 1e-9
    assert [f.at_s for f in schedule.faults] == sorted(f.at_s for f in schedule.faults)
    assert parse_schedule(schedule.to_dict()) == schedule  # drawn faults are valid faults

    hosts = random_schedule(3, 5.0, 10, LINKS, ["host/a", "host/b"], kinds=["kill_host"])
    assert {f.kind for f in hosts.faults} == {"kill_host"} and all(f.duration_s is None for f in hosts.faults)
    with pytest.raises(ScheduleError, match="a kill_host has no duration"):
        Fault("kill_host", "host/a", at_s=0.0, duration_s=1.0)
    only = random_schedule(3, 5.0, 30, LINKS, kinds=["latency", "down"])
    assert {f.kind for f in only.faults} == {"latency", "down"}
    with pytest.raises(ScheduleError, match="kind 'kill' needs at least one process"):
        random_schedule(1, 5.0, 3, LINKS, kinds=["kill"])
    with pytest.raises(ScheduleError, match="unknown fault kind 'explode'"):
        random_schedule(1, 5.0, 3, LINKS, PROCESSES, kinds=["explode"])


def test_random_schedule_fault_lengths_can_be_bounded_apart_from_the_schedule_length() -> None:
    long = random_schedule(5, 100.0, 300, LINKS, PROCESSES, fault_s=(0.1, 2.0))
    lasting = [f for f in long.faults if f.duration_s is not None]
    assert lasting and all(0.001 <= f.duration_s <= 2.0 for f in lasting)
    assert max(f.duration_s for f in random_schedule(5, 100.0, 300, LINKS, PROCESSES).faults
               if f.duration_s is not None) > 10.0  # unbounded: up to 30 % of the schedule
    with pytest.raises(ScheduleError, match="fault_s must be"):
        random_schedule(1, 5.0, 3, LINKS, PROCESSES, fault_s=(2.0, 1.0))


# The runner, against a real Toxiproxy server and real processes.


@pytest.fixture
def net(toxiproxy: ToxiproxyServer, echo_server: EchoServer) -> Iterator[ChaosNet]:
    with ChaosNet(toxiproxy) as net:
        net.link("client->echo", echo_server.address)
        yield net


@pytest.fixture
def sleepers() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    procs = {name: subprocess.Popen(["sleep", "60"]) for name in ("controller", "standby")}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait()


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def refuses(address: str) -> bool:
    try:
        connect(address, timeout_s=0.5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_runner_applies_each_fault_for_its_duration_then_undoes_it(
    net: ChaosNet, sleepers: dict[str, subprocess.Popen]
) -> None:
    link = "client->echo"
    schedule = Schedule(
        (
            Fault("latency", link, at_s=0.0, duration_s=0.6, attributes={"latency": 50}),
            Fault("pause", "controller", at_s=0.0, duration_s=0.4),
            Fault("down", link, at_s=0.1, duration_s=0.3),
        )
    )
    processes = {name: proc.pid for name, proc in sleepers.items()}
    address = net.address(link)
    with ScheduleRunner(schedule, net, processes) as runner:
        assert wait_for(lambda: process_state(processes["controller"]) == "stopped")
        assert wait_for(lambda: refuses(address))
        assert runner.wait(10)
    assert runner.errors == []
    assert net[link].toxics() == [] and net[link].refresh().enabled
    assert process_state(processes["controller"]) in RUNNING
    round_trip(address)

    events = runner.events()
    by_fault: dict[int, list] = {}
    for event in events:
        by_fault.setdefault(event.detail["fault"], []).append(event)
    assert [e.kind for e in by_fault[0]] == ["toxic_add", "toxic_remove"]
    assert [e.kind for e in by_fault[1]] == ["pause", "resume"]
    assert [e.kind for e in by_fault[2]] == ["down", "up"]
    for index, fault in enumerate(schedule.faults):
        start, end = by_fault[index]
        assert start.detail["offset_s"] >= fault.at_s
        assert end.detail["offset_s"] - start.detail["offset_s"] >= fault.duration_s
    assert [e.t for e in events] == sorted(e.t for e in events)


def test_after_calls_faults_fire_once_enough_calls_are_noted(
    net: ChaosNet, sleepers: dict[str, subprocess.Popen]
) -> None:
    victim = sleepers["standby"]
    schedule = Schedule((Fault("kill", "standby", after_calls=3),))
    with ScheduleRunner(schedule, net, {"standby": lambda: victim.pid}) as runner:
        runner.note_calls(2)
        time.sleep(0.2)
        assert victim.poll() is None
        runner.note_calls()
        assert victim.wait(5) == -signal.SIGKILL
        assert runner.wait(5)
    assert [(e.kind, e.target) for e in runner.events()] == [("kill", "standby")]
    assert runner.calls == 3


def test_stop_undoes_faults_that_have_no_duration(
    net: ChaosNet, sleepers: dict[str, subprocess.Popen]
) -> None:
    pid = sleepers["controller"].pid
    schedule = Schedule(
        (
            Fault("down", "client->echo", at_s=0.0),
            Fault("timeout", "client->echo", at_s=0.0, attributes={"timeout": 0}),
            Fault("pause", "controller", at_s=0.0),
        )
    )
    runner = ScheduleRunner(schedule, net, {"controller": pid}).start()
    assert runner.wait(5)  # everything fired; nothing timed is left
    assert process_state(pid) == "stopped" and not net["client->echo"].refresh().enabled
    runner.stop()
    assert process_state(pid) in RUNNING
    assert net["client->echo"].refresh().enabled and net["client->echo"].toxics() == []


def test_overlapping_partitions_keep_the_link_down_until_the_last_ends(net: ChaosNet) -> None:
    link = "client->echo"
    schedule = Schedule(
        (
            Fault("down", link, at_s=0.0, duration_s=0.2),
            Fault("down", link, at_s=0.1, duration_s=0.4),
        )
    )
    with ScheduleRunner(schedule, net) as runner:
        assert runner.wait(5)
    downs = [(e.kind, e.detail["fault"]) for e in runner.events()]
    assert downs == [("down", 0), ("up", 1)]


def test_a_fault_that_fails_is_recorded_and_the_run_goes_on(
    net: ChaosNet, sleepers: dict[str, subprocess.Popen]
) -> None:
    gone = sleepers["standby"]
    gone.kill()
    gone.wait()
    schedule = Schedule(
        (
            Fault("kill", "standby", at_s=0.0),
            Fault("latency", "client->echo", at_s=0.05, duration_s=0.05, attributes={"latency": 1}),
        )
    )
    with ScheduleRunner(schedule, net, {"standby": gone.pid}) as runner:
        assert runner.wait(5)
    assert len(runner.errors) == 1 and "no such process" in runner.errors[0]
    assert [e.kind for e in runner.events()] == ["error", "toxic_add", "toxic_remove"]


def test_a_process_fault_waits_for_a_target_that_is_being_restarted(
    net: ChaosNet, sleepers: dict[str, subprocess.Popen]
) -> None:
    """With target_wait_s, a kill that lands while its proc is being restarted kills the new one
    once it is there; a target that never comes back is an error after the wait."""
    victim = sleepers["standby"]
    there_at = time.monotonic() + 0.3

    def restarting() -> int:
        if time.monotonic() < there_at:
            raise ProcessLookupError("no live standby right now")
        return victim.pid

    def never() -> int:
        raise ProcessLookupError("no live controller right now")

    schedule = Schedule((Fault("kill", "standby", at_s=0.0), Fault("kill", "controller", at_s=0.0)))
    with ScheduleRunner(schedule, net, {"standby": restarting, "controller": never}, target_wait_s=1.0) as runner:
        assert runner.wait(10)
    assert victim.wait(5) == -signal.SIGKILL
    assert len(runner.errors) == 1 and "no live controller" in runner.errors[0]


def test_an_in_flight_kill_waits_until_its_target_runs_a_call(
    net: ChaosNet, sleepers: dict[str, subprocess.Popen]
) -> None:
    """A kill with in_flight_s lands only once the target runs a call (its note says so); one
    whose target runs none within in_flight_s is applied anyway, noted as not in flight."""
    busy_from = time.monotonic() + 0.4
    busy = {sleepers["standby"].pid}
    schedule = Schedule((Fault("kill", "standby", at_s=0.0, attributes={"in_flight_s": 5.0}),
                         Fault("kill", "controller", at_s=0.0, attributes={"in_flight_s": 0.2})))
    t0 = time.time()
    with ScheduleRunner(schedule, net, {"standby": sleepers["standby"].pid, "controller": sleepers["controller"].pid},
                        in_flight=lambda pid: pid in busy and time.monotonic() >= busy_from) as runner:
        assert runner.wait(10)
    kills = {e.target: e for e in runner.events() if e.kind == "kill"}
    assert kills["standby"].detail["in_flight"] is True and kills["standby"].t >= t0 + 0.35
    assert kills["controller"].detail["in_flight"] is False
    assert sleepers["standby"].wait(5) == -signal.SIGKILL and sleepers["controller"].wait(5) == -signal.SIGKILL


def test_an_in_flight_kill_needs_a_cluster_that_can_tell(net: ChaosNet, sleepers: dict[str, subprocess.Popen]) -> None:
    schedule = Schedule((Fault("kill", "standby", at_s=0.0, attributes={"in_flight_s": 1.0}),))
    with pytest.raises(ValueError, match="in_flight_s"):
        ScheduleRunner(schedule, net, {"standby": sleepers["standby"].pid})
    with pytest.raises(ScheduleError, match="only 'in_flight_s'"):
        Fault("kill", "standby", at_s=0.0, attributes={"latency": 1.0})
    with pytest.raises(ScheduleError, match="in_flight_s"):
        Fault("kill", "standby", at_s=0.0, attributes={"in_flight_s": -1.0})
    # A toxic waits on the process its link leads to; Toxiproxy never sees the attribute.
    toxic = Fault("latency", "controller->proc/3", at_s=0.0, attributes={"latency": 10, "in_flight_s": 2.0})
    assert toxic.in_flight_of == "proc/3" and toxic.attributes["in_flight_s"] == 2.0
    Schedule((toxic,)).check_targets(LINKS, PROCESSES)
    with pytest.raises(ScheduleError, match="waits for a call on process 'proc/3'"):
        Schedule((toxic,)).check_targets(LINKS, ["controller"])
    assert Fault("latency", "controller->proc/3", at_s=0.0, attributes={"latency": 10}).in_flight_of is None


class _StuckNet:
    """A ChaosNet stand-in whose toxic removal blocks until released, as Toxiproxy's does
    while the peer of a poisoned link is stopped and its socket buffers are full."""

    def __init__(self) -> None:
        self.faults = FaultLog()
        self.release = threading.Event()
        self.removed = threading.Event()

    def __iter__(self):
        return iter(["client->echo"])

    def add_toxic(self, name: str, kind: str, stream: str, toxicity: float, **_: object) -> None:
        pass

    def remove_toxic(self, name: str, toxic_name: str, **_: object) -> None:
        self.release.wait(10)
        self.removed.set()


def test_a_stuck_link_call_does_not_hold_back_a_process_resume(sleepers: dict[str, subprocess.Popen]) -> None:
    net, pid = _StuckNet(), sleepers["controller"].pid
    schedule = Schedule((
        Fault("latency", "client->echo", at_s=0.0, duration_s=0.05, attributes={"latency": 10}),
        Fault("pause", "controller", at_s=0.0, duration_s=0.3),
    ))
    with ScheduleRunner(schedule, net, {"controller": pid}) as runner:  # type: ignore[arg-type]
        assert wait_for(lambda: process_state(pid) == "stopped")
        # The toxic's removal is stuck behind the paused peer; the resume goes out regardless.
        assert wait_for(lambda: process_state(pid) in RUNNING, 2.0)
        assert not net.removed.is_set() and not runner.wait(0.1)
        net.release.set()
        assert runner.wait(5) and net.removed.is_set()
    assert runner.errors == []


def test_runner_rejects_targets_it_does_not_know(net: ChaosNet) -> None:
    schedule = Schedule((Fault("down", "controller->etcd", at_s=0.0),))
    with pytest.raises(
        ScheduleError,
        match=r"faults\[0\] \(down\): no link named 'controller->etcd'; known links: client->echo",
    ):
        ScheduleRunner(schedule, net)
    schedule = Schedule((Fault("pause", "controller", at_s=0.0),))
    with pytest.raises(ScheduleError, match="no process named 'controller'; known processes: none"):
        ScheduleRunner(schedule, net)


SHIPPED = sorted((Path(__file__).resolve().parents[2] / "chaos" / "scenarios").glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_scenarios_are_valid(path: Path) -> None:
    schedule = load_schedule(path)
    assert schedule.name and schedule.faults
    if path.name.startswith("hosts_"):  # for regent chaos run --hosts: its hosts, roles and processes
        from regent.chaos.hostcluster import HOST_ROLES

        names = ["c1", "c2", "h1", "h2", "h3", "e1", "e2", "e3"]
        procs = ["controller", "standby", "etcd-leader", "etcd-follower", "agent/h1", "proc/h1", "host/h1", "etcd/e1"]
        schedule.check_targets([], procs, [*HOST_ROLES, *names])


HOSTS = ("c1", "c2", "e1", "e2", "e3", "primary", "etcd-leader", "workers")


def test_packet_faults_parse_from_a_scenario_and_check_their_hosts() -> None:
    schedule = parse_schedule({"faults": [
        {"kind": "partition", "target": "primary,etcd-follower|rest", "at_s": 1, "duration_s": 4},
        {"kind": "block", "target": "primary>workers", "after_calls": 10, "duration_s": 2},
        {"kind": "isolate", "target": "etcd-leader", "at_s": 2, "duration_s": 1.5},
        {"kind": "loss", "target": "all", "at_s": 0, "attributes": {"percent": 5}},
        {"kind": "duplicate", "target": "all", "at_s": 0, "attributes": {"percent": 1.5}},
        {"kind": "netem", "target": "h1", "at_s": 0, "attributes": {"delay_ms": 20, "reorder_pct": 25}},
    ]})
    assert [f.on_hosts for f in schedule.faults] == [True] * 6
    assert schedule.faults[4].attributes == {"percent": 1.5}
    assert parse_schedule(schedule.to_dict()) == schedule
    with pytest.raises(ScheduleError, match="no host or role named 'etcd-follower'"):
        schedule.check_targets([], [], HOSTS)
    schedule.check_targets([], [], [*HOSTS, "etcd-follower", "all", "h1"])


@pytest.mark.parametrize(("fault", "message"), [
    ({"kind": "partition", "target": "c1"}, "groups joined by '|'"),
    ({"kind": "block", "target": "c1|c2"}, "'FROM>TO'"),
    ({"kind": "block", "target": "c1>rest"}, "only meaningful in a partition"),
    ({"kind": "isolate", "target": "c1,,c2"}, "an empty host name"),
    ({"kind": "isolate", "target": "c1", "attributes": {"percent": 5}}, "takes no attributes"),
    ({"kind": "loss", "target": "c1"}, "needs attributes = {percent = P}"),
    ({"kind": "loss", "target": "c1", "attributes": {"percent": 150}}, "percentage"),
    ({"kind": "duplicate", "target": "c1", "attributes": {"percent": 0}}, "must be > 0"),
    ({"kind": "netem", "target": "c1", "attributes": {"delay": 5}}, "no attribute 'delay'"),
    ({"kind": "netem", "target": "c1", "attributes": {"delay_ms": -1}}, ">= 0"),
    ({"kind": "loss", "target": "c1", "attributes": {"percent": 5}, "stream": "upstream"}, "toxics only"),
])
def test_packet_faults_written_wrongly_say_what_to_change(fault: dict, message: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(message)):
        parse_schedule({"faults": [{"at_s": 0, "duration_s": 1, **fault}]})


def test_random_schedules_draw_packet_faults_over_hosts_and_roles() -> None:
    schedule = random_schedule(11, 20.0, 300, processes=PROCESSES, hosts=HOSTS)
    kinds = {f.kind for f in schedule.faults}
    assert set(PACKET_KINDS) - {"netem"} <= kinds and "netem" not in kinds  # netem only when asked for
    schedule.check_targets([], PROCESSES, HOSTS)
    assert parse_schedule(schedule.to_dict()) == schedule
    assert random_schedule(11, 20.0, 300, processes=PROCESSES, hosts=HOSTS) == schedule
    with pytest.raises(ScheduleError, match="kind 'isolate' needs at least one host"):
        random_schedule(1, 5.0, 3, LINKS, kinds=["isolate"])
