"""Cut a run of framed records into stored values and transactions that respect etcd's limits.

etcd refuses a request over 1.5 MiB and a transaction over 128 operations; a batch value is
kept well under the request limit so that one oversized record still fits on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codec import encode_batch

VALUE_TARGET_BYTES = 512 * 1024
TXN_MAX_BYTES = 1_300_000
TXN_MAX_VALUES = 120


@dataclass(frozen=True, slots=True)
class Batch:
    first_lsn: int
    count: int
    value: bytes


def pack(
    frames: list[bytes],
    first_lsn: int,
    *,
    value_target: int = VALUE_TARGET_BYTES,
    txn_max_bytes: int = TXN_MAX_BYTES,
    txn_max_values: int = TXN_MAX_VALUES,
) -> list[list[Batch]]:
    """Group frames (lsns first_lsn, first_lsn+1, ...) into batches, and batches into txns."""
    batches: list[Batch] = []
    start = 0
    size = 0
    for i, frame in enumerate(frames):
        if i > start and size + len(frame) > value_target:
            batches.append(Batch(first_lsn + start, i - start, encode_batch(frames[start:i])))
            start, size = i, 0
        size += len(frame)
    if start < len(frames):
        batches.append(Batch(first_lsn + start, len(frames) - start, encode_batch(frames[start:])))

    txns: list[list[Batch]] = []
    current: list[Batch] = []
    current_bytes = 0
    for batch in batches:
        if current and (
            current_bytes + len(batch.value) > txn_max_bytes or len(current) >= txn_max_values
        ):
            txns.append(current)
            current, current_bytes = [], 0
        current.append(batch)
        current_bytes += len(batch.value)
    if current:
        txns.append(current)
    return txns
