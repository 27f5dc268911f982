"""Reference readings of Kafka files written for the tests, independently of the probe, from
../shared/docs/kafka-reference.md. Tests compare the probe against these, never against itself."""

from __future__ import annotations

import struct


def ref_batches(data: bytes) -> list[tuple[int, int]]:
    """(start, size) of each consecutive complete batch from byte 0 (kafka-reference.md §3.3);
    size = 12 + int32 at byte 8. Stops when fewer than 17 bytes remain, the size is below 14, the
    magic is not 0..2, a v2 batch is below 61 bytes, or the batch runs past EOF."""
    out = []
    pos = 0
    while len(data) - pos >= 17:
        (length,) = struct.unpack_from(">i", data, pos + 8)
        size = 12 + length
        magic = data[pos + 16]
        if length < 14 or magic not in (0, 1, 2) or (magic == 2 and size < 61) or pos + size > len(data):
            break
        out.append((pos, size))
        pos += size
    return out


def ref_valid_bytes(data: bytes) -> int:
    b = ref_batches(data)
    return b[-1][0] + b[-1][1] if b else 0
