"""Test data that actors and the test agree on: seeded bytes and their checksum."""

from __future__ import annotations

import zlib

import numpy as np

# Odd-sized, so a chunk copied to the wrong place (transports move 4 or 64 MiB at a time)
# does not land on an identical copy of itself.
_BLOCK = (1 << 20) + 7


def fill(dst: np.ndarray, seed: int) -> np.ndarray:
    """Write seeded bytes into the uint8 array dst (the same bytes for the same size and seed)."""
    block = np.random.default_rng(seed).integers(0, 256, size=min(len(dst), _BLOCK), dtype=np.uint8)
    for start in range(0, len(dst), len(block)):
        k = min(len(block), len(dst) - start)
        dst[start : start + k] = block[:k]
    return dst


def checksum(data: object) -> int:
    """crc32 of a uint8 numpy array or CPU torch tensor."""
    arr = data.numpy() if hasattr(data, "numpy") else data
    return zlib.crc32(memoryview(np.ascontiguousarray(arr)).cast("B"))


def expected(n: int, seed: int) -> int:
    return checksum(fill(np.empty(n, dtype=np.uint8), seed))
