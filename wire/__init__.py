"""The wire between controller, host agents and procs: message framing and payloads
(`wire.protocol`, re-exported here), the metadata each receiver accepts (`wire.schema`),
authenticated sockets (`wire.transport`, `wire.security`) and the wire's errors.

`wire` sits below `controller` and `worker` and imports neither; `journal` and `hipcore`
do not import it. Importing `wire` itself loads no sockets: `wire.transport` and
`wire.security` (zmq) are imported by name where they are used.

    from regent import wire
    frames = wire.encode(wire.Kind.PING, {"n": 1})
"""

from regent.wire.errors import MessageTooLarge, ProtocolError, RegentError
from regent.wire.protocol import (
    BATCH_ALONE_BYTES,
    BATCH_MESSAGE_FRAMES,
    BATCH_MESSAGES,
    MAX_BATCH,
    MAX_META_BYTES,
    Kind,
    PointMessages,
    call_digest,
    decode,
    decode_one,
    digest,
    dumps,
    dumps_call,
    encode,
    encode_batch,
    frame_bytes,
    kind_byte,
    loads,
    pack,
    payload_size,
    relay_header,
    require,
    split_batch,
)

__all__ = [
    "BATCH_ALONE_BYTES", "BATCH_MESSAGES", "BATCH_MESSAGE_FRAMES", "MAX_BATCH", "MAX_META_BYTES",
    "Kind", "MessageTooLarge", "PointMessages", "ProtocolError", "RegentError", "call_digest",
    "decode", "decode_one", "digest", "dumps", "dumps_call", "encode", "encode_batch",
    "frame_bytes", "kind_byte", "loads", "pack", "payload_size", "relay_header", "require", "split_batch",
]
