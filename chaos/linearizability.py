"""An independent check of the chaos workload's key-value register: is its history linearizable?

Each controller process appends what it saw of every register call to a file of its own
(`HistoryLog`, in the directory $REGENT_CHAOS_HISTORY): the invocation, written before the call
is issued, and the outcome once the program sees it. A standby that takes over replays the
program and records the same calls (same ids) again. `merge_history` joins the files into one
history whose intervals can only be wider than the truth, and `check_operations` hands it to
regent-porcupine (chaos/porcupine: Porcupine, a checker regent did not write). Reads files and
runs that program; drives nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

__all__ = [
    "CLIENT",
    "ENV_HISTORY",
    "History",
    "HistoryEvent",
    "HistoryLog",
    "LinearizabilityVerdict",
    "Operation",
    "PorcupineNotInstalled",
    "check_history",
    "check_operations",
    "find_porcupine",
    "merge_history",
    "porcupine_input",
    "read_history",
]

log = structlog.get_logger("chaos.linearizability")

ENV_HISTORY = "REGENT_CHAOS_HISTORY"  # a directory: one history file per controller process
CLIENT = "program"  # the one client: the program, whichever process runs it
OPS = ("put", "append", "get")
_REPO = Path(__file__).resolve().parent.parent
_INSTALL_HINT = f"run {_REPO / 'scripts' / 'install_porcupine.sh'} (it needs a Go toolchain)"


class PorcupineNotInstalled(RuntimeError):
    """No regent-porcupine binary was found."""


# --- recording: one file per controller process ------------------------------------------------

class HistoryLog:
    """One controller process's account of the register calls it issued and of what it was
    told, append-only (one write(2) per event, so a SIGKILL loses at most the event in hand).

    Times are CLOCK_MONOTONIC, which every process on this machine shares and which never
    steps back: a wall clock set back between two events would narrow an interval.
    """

    def __init__(self, directory: str | os.PathLike, run: str, client: str = CLIENT) -> None:
        self.run, self.client = run, client
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(directory) / f"{os.getpid()}.{time.time_ns()}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @classmethod
    def from_env(cls, run: str) -> HistoryLog | None:
        """The log $REGENT_CHAOS_HISTORY asks for, or None when it is not set."""
        directory = os.environ.get(ENV_HISTORY)
        return cls(directory, run) if directory else None

    def invoke(self, op: str, input: dict, *, replaying: bool = False) -> None:
        """Call this before the call goes out: the operation cannot take effect earlier."""
        self._write("invoke", op, input, replaying)

    def ok(self, op: str, input: dict, output: Any, *, replaying: bool = False) -> None:
        """The program was given this result."""
        self._write("ok", op, input, replaying, output=output)

    def unknown(self, op: str, input: dict, why: str, *, replaying: bool = False) -> None:
        """The call failed in a way that leaves its effect open (SupervisionError: it may have
        run before its process died); the program issues it again as a new operation."""
        self._write("unknown", op, input, replaying, why=why[:200])

    def timeout(self, op: str, input: dict, *, replaying: bool = False) -> None:
        """The program's deadline passed; it keeps waiting for the same call."""
        self._write("timeout", op, input, replaying)

    def close(self) -> None:
        os.close(self._fd)

    def _write(self, kind: str, op: str, input: dict, replaying: bool, **extra: Any) -> None:
        event = {"t": time.monotonic_ns(), "wall": time.time_ns(), "ev": kind, "op": op, "run": self.run,
                 "client": self.client, "pid": os.getpid(), "replay": replaying, "input": input, **extra}
        os.write(self._fd, (json.dumps(event, sort_keys=True) + "\n").encode())


@dataclass(frozen=True)
class HistoryEvent:
    t_ns: int
    kind: str  # invoke, ok, unknown, timeout
    op: str  # the operation's id: the call's token
    run: str
    client: str
    pid: int
    replay: bool
    input: dict
    output: Any = None
    source: str = ""  # the file it was read from: one per controller process


def read_history(directory: str | os.PathLike) -> tuple[list[HistoryEvent], list[str]]:
    """Every event under `directory`, and the lines that could not be read. A file's last line
    without its newline is a write its process died in: an invocation never issued or an answer
    not recorded, so leaving it out can only widen an interval; any other bad line is reported."""
    events: list[HistoryEvent] = []
    bad: list[str] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        text = path.read_text()
        lines = text.split("\n")
        for n, line in enumerate(lines, 1):
            if not line or (n == len(lines) and not text.endswith("\n")):
                continue
            try:
                d = json.loads(line)
                events.append(HistoryEvent(int(d["t"]), str(d["ev"]), str(d["op"]), str(d["run"]),
                                           str(d.get("client", CLIENT)), int(d.get("pid", 0)),
                                           bool(d.get("replay", False)), dict(d["input"]), d.get("output"),
                                           path.name))
            except (ValueError, KeyError, TypeError) as e:
                bad.append(f"{path.name}:{n}: unreadable history line ({e}): {line[:80]!r}")
    return events, bad


# --- merging: one interval per operation --------------------------------------------------------

@dataclass(frozen=True)
class Operation:
    """One register call as the merged history has it. `return_ns` None: it never returned
    (no process saw it succeed), so it may have taken effect at any time after its call, or not."""

    id: str
    client: str
    call_ns: int
    return_ns: int | None
    input: dict
    output: Any = None


@dataclass
class History:
    operations: list[Operation] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # one operation told two stories
    processes: int = 0  # controller processes that recorded events
    unknown_outcomes: int = 0  # operations that failed with an open outcome and never succeeded


def merge_history(events: Iterable[HistoryEvent], run: str | None = None) -> History:
    """One operation per id: its call is the earliest invocation any process recorded, its return
    the earliest success any process recorded (with that success's output); without a success it
    never returned. Each process records an invocation before it issues the call and a success
    after the program has it, so the operation took effect inside that interval: the merged
    interval can only be wider than the truth (sound), never narrower. `run`: keep only the
    events of this run of the session (its sid)."""
    by_op: dict[str, list[HistoryEvent]] = defaultdict(list)
    writers: set[tuple[str, int]] = set()
    for e in events:
        if run is None or e.run == run:
            by_op[e.op].append(e)
            writers.add((e.source, e.pid))
    hist = History(processes=len(writers))
    if not by_op:
        return hist
    start = min(e.t_ns for evs in by_op.values() for e in evs)
    for op_id, evs in by_op.items():
        evs.sort(key=lambda e: e.t_ns)
        inputs = {_canonical(e.input) for e in evs}
        if len(inputs) > 1:
            hist.conflicts.append(f"operation {op_id}: recorded with different inputs {sorted(inputs)}")
        invokes = [e for e in evs if e.kind == "invoke"]
        oks = [e for e in evs if e.kind == "ok"]
        # An answer whose invocation no file holds started no later than the history did.
        call = invokes[0].t_ns if invokes else start
        ret, output = None, None
        if oks:
            ret, output = oks[0].t_ns, oks[0].output
            outputs = {_canonical(e.output) for e in oks}
            if len(outputs) > 1:
                hist.conflicts.append(f"operation {op_id}: answered differently in different processes: "
                                      + ", ".join(f"pid {e.pid} got {e.output!r}" for e in oks))
            if ret < call:
                hist.conflicts.append(f"operation {op_id}: answered at {ret} ns, before its first invocation "
                                      f"at {call} ns")
                ret = call
        elif any(e.kind == "unknown" for e in evs):
            hist.unknown_outcomes += 1
        hist.operations.append(Operation(op_id, evs[0].client, call, ret, evs[0].input, output))
    hist.operations.sort(key=lambda op: (op.call_ns, op.id))
    return hist


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def _text(value: Any) -> str:
    """A register value as the checker compares it: strings as they are, others as JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def porcupine_input(operations: Sequence[Operation]) -> list[dict]:
    """The operations in regent-porcupine's format (chaos/porcupine/main.go)."""
    clients: dict[str, int] = {}
    out = []
    for op in operations:
        kind = op.input.get("op")
        if kind not in OPS:
            raise ValueError(f"operation {op.id}: op {kind!r} is not one of {', '.join(OPS)}")
        if "key" not in op.input:
            raise ValueError(f"operation {op.id}: the input has no key")
        rec: dict[str, Any] = {"id": op.id, "client": clients.setdefault(op.client, len(clients)),
                               "call": op.call_ns, "return": op.return_ns,
                               "input": {"op": kind, "key": _text(op.input["key"])}}
        if kind != "get":
            rec["input"]["value"] = _text(op.input.get("value"))
        elif op.return_ns is not None:
            rec["output"] = {"value": None if op.output is None else _text(op.output)}
        out.append(rec)
    return out


# --- checking ------------------------------------------------------------------------------------

@dataclass
class LinearizabilityVerdict:
    """What Porcupine said of a history, and what the merge found before it."""

    result: str  # ok, illegal, unknown (the check timed out), error (it could not run), unchecked
    operations: int = 0
    pending: int = 0  # never returned
    keys: dict[str, dict] = field(default_factory=dict)
    illegal_keys: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    processes: int = 0
    checker: str = ""
    elapsed_s: float = 0.0
    visualization: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Linearizable, and no operation was recorded two ways."""
        return self.result == "ok" and not self.conflicts

    @property
    def failed(self) -> bool:
        """Porcupine found no linearization, could not decide, or the records disagree."""
        return bool(self.conflicts) or self.result not in ("ok", "unchecked")

    def summary(self) -> str:
        if self.result == "unchecked" and not self.conflicts:
            return f"not checked ({self.detail})"
        where = f" from {self.processes} controller processes" if self.processes > 1 else ""
        counts = (f"{self.operations} ops ({self.pending} never returned) on {len(self.keys)} keys{where}")
        if self.result == "ok" and not self.conflicts:
            return f"ok, {counts}"
        parts = [self.result.upper(), counts]
        if self.illegal_keys:
            parts.append(f"not linearizable on {', '.join(self.illegal_keys)}")
        if self.conflicts:
            parts.append(f"{len(self.conflicts)} conflicting records, first: {self.conflicts[0]}")
        if self.detail:
            parts.append(self.detail)
        if self.visualization:
            parts.append(f"see {self.visualization}")
        return "; ".join(parts)


def find_porcupine() -> Path:
    """Locate regent-porcupine: $REGENT_PORCUPINE, then <repo>/.tools/bin, then PATH."""
    candidates: list[Path] = []
    if os.environ.get("REGENT_PORCUPINE"):
        candidates.append(Path(os.environ["REGENT_PORCUPINE"]))
    candidates.append(_REPO / ".tools" / "bin" / "regent-porcupine")
    on_path = shutil.which("regent-porcupine")
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise PorcupineNotInstalled(f"regent-porcupine not found (looked at $REGENT_PORCUPINE, "
                                f"{_REPO / '.tools' / 'bin'}, and PATH); {_INSTALL_HINT} to build it")


def check_operations(operations: Sequence[Operation], *, timeout_s: float = 60.0, html: str | os.PathLike | None = None,
                     binary: str | os.PathLike | None = None) -> LinearizabilityVerdict:
    """Run regent-porcupine on `operations`. Raises PorcupineNotInstalled when it is not built;
    any other failure to check is a verdict of "error" with the reason."""
    exe = Path(binary) if binary is not None else find_porcupine()
    args = [str(exe), f"-timeout={timeout_s}s"]
    if html is not None:
        args.append(f"-html={html}")
    doc = json.dumps({"operations": porcupine_input(operations)})
    try:
        done = subprocess.run(args, input=doc, capture_output=True, text=True, timeout=timeout_s + 60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return LinearizabilityVerdict("error", len(operations), detail=f"{exe} did not run to the end: {e}")
    if done.returncode not in (0, 1, 2):
        return LinearizabilityVerdict("error", len(operations),
                                      detail=f"{exe} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        v = json.loads(done.stdout)
    except ValueError:
        return LinearizabilityVerdict("error", len(operations), detail=f"{exe} printed no verdict: {done.stdout[-300:]!r}")
    return LinearizabilityVerdict(str(v["result"]), int(v["operations"]), int(v["pending"]), dict(v["keys"]),
                                  list(v.get("illegal_keys") or []), checker=str(v.get("checker", "")),
                                  elapsed_s=float(v.get("elapsed_s", 0.0)), visualization=v.get("visualization"))


def check_history(directory: str | os.PathLike, *, run: str | None = None, timeout_s: float = 60.0,
                  html: str | os.PathLike | None = None) -> LinearizabilityVerdict:
    """Merge the history files under `directory` (of run `run`, if given) and check them. Not
    built, or nothing recorded (a program without the register): "unchecked", saying why."""
    events, bad = read_history(directory) if Path(directory).is_dir() else ([], [])
    hist = merge_history(events, run)
    if not hist.operations and not bad:
        return LinearizabilityVerdict("unchecked", detail=f"no register history under {directory}")
    try:
        verdict = check_operations(hist.operations, timeout_s=timeout_s, html=html)
    except PorcupineNotInstalled as e:
        log.warning("linearizability not checked", reason=str(e))
        return LinearizabilityVerdict("unchecked", len(hist.operations), conflicts=bad + hist.conflicts,
                                      processes=hist.processes, detail=str(e))
    verdict.conflicts = bad + hist.conflicts
    verdict.processes = hist.processes
    return verdict
