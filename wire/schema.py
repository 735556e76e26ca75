"""The wire's metadata, declared in one place: for each receiver (controller, proc, host
agent) and each kind of message it accepts, every field it may read, with its type and
bounds. A receiver decodes a message's metadata through its `Receiver` and gets a dict of
declared fields only, each valid, or a ProtocolError naming the field and the defect.

msgspec decodes and validates msgpack in one pass (in C), in less time than msgpack
alone took to decode it. This module holds declarations only: no sockets, no logging.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import msgspec
from msgspec import Meta

from regent.wire import protocol
from regent.wire.errors import ProtocolError
from regent.wire.protocol import Kind

_I64 = 2**63 - 1

# --- field types ----------------------------------------------------------------------
Seq = Annotated[int, Meta(ge=-1, le=_I64)]  # a call id; -1: a request outside the program's calls
Point = Annotated[int, Meta(ge=0, lt=1 << 31)]  # rank of an actor in its mesh
Index = Annotated[int, Meta(ge=0, lt=1 << 31)]  # a proc's index in its session
Epoch = Annotated[int, Meta(ge=0, le=_I64)]  # a controller's leadership epoch
RequestId = Annotated[int, Meta(ge=0, le=_I64)]  # "n": pairs an answer with its request
Pid = Annotated[int, Meta(ge=1, lt=1 << 31)]
Count = Annotated[int, Meta(ge=0, le=_I64)]
SessionId = Annotated[str, Meta(max_length=256)]
Name = Annotated[str, Meta(max_length=1024)]  # actor, method, proc and host ids
# An inbox to reply to: tcp://host:port (a host name, or an IPv4 or bracketed IPv6 literal; port
# 1..65535) or ipc://path. zmq refuses some others only when a socket connects to them, after
# the receiver acted on the message (tests/fuzz: wire.address holds this to zmq's connect).
_PORT = "(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
_PATH = r"(?!@\Z)[!-~]{1,100}"  # printable ASCII, under the 107 bytes of a socket path; "@" alone is no name
ADDRESS_PATTERN = rf"^(?:tcp://{_HOST}:{_PORT}|ipc://{_PATH})\Z"
ADDRESS = re.compile(ADDRESS_PATTERN)
Address = Annotated[str, Meta(max_length=255, pattern=ADDRESS_PATTERN)]
Digest = Annotated[bytes, Meta(max_length=64)]
# A call made by an actor: the path of calls it descends from under the root call id `s`
# ("<actor>.<point>.<k>" per level, joined by "/"; docs/design.md, "Calls made by actors").
Origin = Annotated[str, Meta(max_length=4096)]
Text = Annotated[str, Meta(max_length=protocol.MAX_META_BYTES)]  # error messages and tracebacks
Seconds = Annotated[float, Meta(ge=0)]
Env = Annotated[dict[Annotated[str, Meta(max_length=1024)], Annotated[str, Meta(max_length=65536)]],
                Meta(max_length=1024)]
Paths = Annotated[list[Annotated[str, Meta(max_length=4096)]], Meta(max_length=4096)]
# A dotted Python module name (what a warm proc imports before it is needed).
ModuleName = Annotated[str, Meta(max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]


def valid_address(addr: object) -> bool:
    """Whether `addr` is an address regent's sockets can connect to (ADDRESS)."""
    return isinstance(addr, str) and len(addr) < 256 and ADDRESS.fullmatch(addr) is not None


# What a worker says became of a call; what a host agent says became of a request.
ResultStatus = Literal["ok", "err", "exit", "dead", "noactor", "divergence", "fenced", "grp"]
HostStatus = Literal["ok", "err", "fenced", "stopped", "divergence", "assigned"]
HostOp = Literal["hello", "spawn_procs", "respawn_proc", "stop_session", "stop_procs", "list", "free_port",
                 "warm_procs"]


# --- controller -> proc ---------------------------------------------------------------

class FoldGroup(TypedDict):
    """An Accumulator's fold on one host: the folder point's values of `pts` (its own first),
    folded with the pickled (identity, reducer) `fn`, go to the controller `to` as one result."""

    to: Address
    pts: Annotated[list[Point], Meta(min_length=2, max_length=1 << 16)]
    fn: Annotated[bytes, Meta(max_length=protocol.MAX_META_BYTES // 2)]
    rv: NotRequired[bool]  # the controller is answered through the host's agent


class Call(TypedDict):
    """CALL and STOP: run endpoint `m` of actor `a` at point `pt`, under call id `s`."""

    sid: SessionId
    e: Epoch
    s: Seq
    a: Name
    m: Name
    d: Digest  # digest of the arguments: the same id with other arguments is a divergence
    pt: Point
    rt: NotRequired[Address]  # where the result goes
    o: NotRequired[Origin]  # made by an actor, not by the controller
    bc: NotRequired[bool]  # a broadcast: an Exception fails the actor rather than answer
    rp: NotRequired[bool]  # the first argument is the Port the answer goes to (Monarch's send(port=))
    rv: NotRequired[bool]  # came through the proc's host agent: the answer goes back the same way
    fo: NotRequired[bool]  # a member of a host fold: `rt` is its host's folder, not a controller
    fg: NotRequired[FoldGroup]  # this point folds its host's members' values (an Accumulator)


class Owner(TypedDict):
    """The actor that spawned a mesh from inside an actor: told of its members' failures."""

    a: Name
    pt: Point
    addr: Address
    p: Name  # its proc's id
    h: Address  # its proc's host agent


class Spawn(Call):
    """SPAWN: create actor `a` (restart=True: a supervisor rebuilds it as incarnation `inc`)."""

    co: NotRequired[Annotated[dict[str, Any], Meta(max_length=64)]]  # the point's coordinates
    sz: NotRequired[Annotated[dict[Name, Count], Meta(max_length=64)]]  # the mesh's size in each dim
    inc: NotRequired[Count]
    restart: NotRequired[bool]
    n: NotRequired[RequestId]
    ow: NotRequired[Owner]


class Fence(TypedDict):
    """FENCE: raise the proc's epoch to `e`; answered by a PONG carrying `n`."""

    sid: SessionId
    e: Epoch
    rt: NotRequired[Address]
    n: NotRequired[RequestId | None]
    rv: NotRequired[bool]  # came through the proc's host agent: the PONG goes back the same way


class Watermark(TypedDict):
    """WATERMARK: results of calls at or below these seqs may be released."""

    sid: SessionId
    e: Epoch
    dw: Seq  # durable watermark
    cw: Seq  # checkpoint watermark


class Ping(TypedDict):
    rt: NotRequired[Address]
    n: NotRequired[RequestId | None]


# --- proc -> controller ---------------------------------------------------------------

class Result(TypedDict):
    """RESULT: the outcome `st` of call `s` at point `pt` (with `n`: an answer to a request)."""

    sid: NotRequired[SessionId]
    s: Seq
    a: NotRequired[Name]
    pt: Point
    st: ResultStatus
    e: NotRequired[Epoch]  # the proc's epoch, when it refused a deposed controller
    et: NotRequired[Name]  # type of the exception an endpoint raised
    em: NotRequired[Text]
    tb: NotRequired[Text]
    normal: NotRequired[bool]  # an actor's own exit was a normal one
    pid: NotRequired[Pid]
    inc: NotRequired[Count]
    n: NotRequired[RequestId | None]
    o: NotRequired[Origin]  # the answer to a call an actor made
    fp: NotRequired[Annotated[list[Point], Meta(min_length=1, max_length=1 << 16)]]  # folded in with `pt` (FoldGroup)


class Pong(TypedDict):
    """PONG: a proc's or host agent's answer to PING (or a proc's to FENCE)."""

    n: NotRequired[RequestId | None]
    id: NotRequired[Name]
    pid: NotRequired[Pid]
    host: NotRequired[Name]
    cached: NotRequired[Count]  # results in the proc's dedupe cache
    epoch: NotRequired[Epoch]
    e: NotRequired[Epoch]


# --- host agent -> controller (and -> proc, answering PROC_ADOPT) ---------------------------

class ProcListing(TypedDict):
    id: Name
    idx: Index
    addr: Address | None  # None until the proc said it is ready
    pid: Pid
    alive: NotRequired[bool]


class HostReply(TypedDict):
    sid: NotRequired[SessionId]
    n: NotRequired[RequestId | None]
    st: HostStatus
    s: NotRequired[Seq | None]
    em: NotRequired[Text]
    e: NotRequired[Epoch]
    pid: NotRequired[Pid]
    at: NotRequired[Address]  # the agent's own inbox
    complete: NotRequired[bool]  # `procs` lists every live proc of the session on that host
    procs: NotRequired[Annotated[list[ProcListing], Meta(max_length=65536)]]
    port: NotRequired[Annotated[int, Meta(ge=1, le=65535)]]  # free_port: a TCP port free on the host
    old: NotRequired[Name]  # assigned (-> a warm proc): the proc it now replaces
    warm: NotRequired[Count]  # warm_procs: the warm procs the session has on the host now
    rl: NotRequired[bool]  # the agent relays messages to its procs (Kind.RELAY)


class HostEvent(TypedDict):
    """HOST_EVENT: `ev` happened to proc `id` (proc_died: exit `status`, None if unknown)."""

    sid: SessionId
    ev: Name
    id: NotRequired[Name]
    idx: NotRequired[Index]
    status: NotRequired[int | None]


# --- controller -> host agent -----------------------------------------------------------

class WarmProc(TypedDict):
    """A proc a spare host keeps started for a session: at `idx`, with `env` (as respawn_proc)."""

    idx: Index
    env: Env


class HostRequest(TypedDict):
    """HOST_REQ: operation `op` for session `sid`; the fields after `orphan_s` belong to one op."""

    sid: SessionId
    e: Epoch
    op: HostOp
    n: NotRequired[RequestId | None]
    rt: Address
    orphan_s: NotRequired[Seconds | None]
    s: NotRequired[Seq]  # spawn_procs: its call id
    o: NotRequired[Origin]  # spawn_procs made by an actor: the rest of its call id
    d: NotRequired[Digest]  # spawn_procs: the digest of its shape (a reused id is a divergence)
    count: NotRequired[Annotated[int, Meta(ge=1, le=1024)]]
    envs: NotRequired[Annotated[list[Env], Meta(max_length=1024)]]
    path: NotRequired[Paths]
    old: NotRequired[Name]  # respawn_proc: the proc it replaces
    idx: NotRequired[Index]
    env: NotRequired[Env]
    ids: NotRequired[Annotated[list[Name], Meta(max_length=65536)]]  # stop_procs
    warm: NotRequired[Annotated[list[WarmProc], Meta(max_length=64)]]  # warm_procs: the procs wanted
    preload: NotRequired[Annotated[list[ModuleName], Meta(max_length=32)]]  # warm_procs, spawn_procs: imported first


# --- proc -> host agent -----------------------------------------------------------------

class ProcReady(TypedDict):
    sid: SessionId
    id: Name
    pid: Pid
    addr: Address
    old: NotRequired[Name]  # a warm proc acknowledging that it now replaces proc `old`


class ProcAdopt(TypedDict):
    """PROC_ADOPT: a proc whose agent died asks to be supervised; the optional fields name
    the request that started it (s, size, pos or old)."""

    sid: SessionId
    id: Name
    idx: Index
    pid: Pid
    addr: Address
    n: NotRequired[RequestId]
    orphan_s: NotRequired[Seconds]
    s: NotRequired[Seq]
    o: NotRequired[Origin]  # the starting spawn_procs was an actor's
    size: NotRequired[Annotated[int, Meta(ge=1, le=1024)]]
    pos: NotRequired[Index]
    old: NotRequired[Name]
    d: NotRequired[Digest]  # the starting spawn_procs request's digest
    e: NotRequired[Epoch]  # the highest epoch of its session the proc has seen
    warm: NotRequired[bool]  # started warm (replacing `old` once assigned, else nothing yet)


MAX_LOG_LINES = 256
MAX_LOG_LINE = 16384


class Log(TypedDict):
    """LOG: lines proc `id` (on host `h`, index `i` there) wrote: [stream (0 stdout, 1 stderr), text]."""

    sid: SessionId
    id: Name
    h: Name
    i: Index
    lines: Annotated[list[tuple[Annotated[int, Meta(ge=0, le=1)], Annotated[str, Meta(max_length=MAX_LOG_LINE)]]],
                     Meta(max_length=MAX_LOG_LINES)]


class Relay(TypedDict):
    """RELAY: to a host agent, the message in its payload frames, for the inbox `to`."""

    to: Address


class Batch(TypedDict):
    """BATCH: the frame lengths of each message it carries (split_batch checks they fit)."""

    n: Annotated[list[Annotated[list[Annotated[int, Meta(ge=0)]],
                                Meta(min_length=1, max_length=protocol.BATCH_MESSAGE_FRAMES)]],
                 Meta(min_length=1, max_length=protocol.MAX_BATCH)]


class Receiver:
    """How one kind of process reads messages: the kinds it accepts and their fields."""

    def __init__(self, name: str, accepts: dict[Kind, type]):
        self.name = name
        self.accepts = dict(accepts)
        self._decoders = {int(k): msgspec.msgpack.Decoder(t) for k, t in accepts.items()}

    def decode(self, frames: Sequence[Any]) -> tuple[Kind, dict, list]:
        """Kind, validated metadata and payload frames of one message, or ProtocolError."""
        kind, body, payload = protocol.decode_head(frames)
        decoder = self._decoders.get(kind)
        if decoder is None:
            raise ProtocolError(f"a {self.name} does not accept {kind.name} messages")
        try:
            meta = decoder.decode(body)
        except msgspec.ValidationError as e:
            raise ProtocolError(f"{kind.name} metadata: {e}") from None
        except msgspec.DecodeError as e:
            raise ProtocolError(f"{kind.name} metadata is not valid msgpack: {e}") from None
        except RecursionError:  # msgspec recurses into nested values, undeclared fields' too
            raise ProtocolError(f"{kind.name} metadata is nested too deeply") from None
        return kind, meta, payload

    def decode_one(self, frames: Sequence[Any]) -> tuple[Kind, dict, list]:
        """`decode` for a message taken out of a batch: batches do not nest."""
        kind, meta, payload = self.decode(frames)
        if kind is Kind.BATCH:
            raise ProtocolError("a batch inside a batch")
        return kind, meta, payload


CONTROLLER = Receiver("controller", {
    Kind.RESULT: Result, Kind.PONG: Pong, Kind.HOST_REP: HostReply, Kind.HOST_EVENT: HostEvent,
    Kind.BATCH: Batch, Kind.LOG: Log,
})
PROC = Receiver("proc", {
    Kind.CALL: Call, Kind.STOP: Call, Kind.SPAWN: Spawn, Kind.FENCE: Fence, Kind.WATERMARK: Watermark,
    Kind.PING: Ping, Kind.HOST_REP: HostReply, Kind.BATCH: Batch,
    Kind.RESULT: Result,  # answers to the calls its actors make
})
HOST = Receiver("host agent", {
    Kind.HOST_REQ: HostRequest, Kind.PING: Ping, Kind.PROC_READY: ProcReady, Kind.PROC_ADOPT: ProcAdopt,
    Kind.RELAY: Relay, Kind.BATCH: Batch,
})
