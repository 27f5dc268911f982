"""Reference readings of Kafka files written for the tests, independently of the probe, from
../shared/docs/kafka-reference.md. Tests compare the probe against these, never against itself."""

from __future__ import annotations

import struct
import zlib


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


def ref_crc32c(data: bytes) -> int:
    """CRC-32C, bit by bit (no table): an independent check of the table-driven one in the probe."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos


def ref_v2_batch(data: bytes) -> dict:
    """Decode one uncompressed magic-2 batch (kafka-reference.md §3.1): header fields and records."""
    (
        base_offset,
        length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_delta,
        base_ts,
        max_ts,
        pid,
        pepoch,
        bseq,
        count,
    ) = struct.unpack_from(">qiibIhiqqqhii", data, 0)
    records = []
    pos = 61
    for _ in range(count):
        size, pos = _read_varint(data, pos)
        end = pos + size
        pos += 1  # record attributes
        ts_delta, pos = _read_varint(data, pos)
        off_delta, pos = _read_varint(data, pos)
        parts = []
        for _ in range(2):
            n, pos = _read_varint(data, pos)
            parts.append(None if n < 0 else data[pos : pos + n])
            pos += max(n, 0)
        headers, pos = _read_varint(data, pos)
        assert headers == 0 and pos == end, "records with headers are not used by these tests"
        records.append((base_ts + ts_delta, off_delta, parts[0], parts[1]))
    return {
        "base_offset": base_offset,
        "size": 12 + length,
        "leader_epoch": leader_epoch,
        "magic": magic,
        "crc": crc,
        "attributes": attributes,
        "last_offset_delta": last_delta,
        "max_timestamp": max_ts,
        "producer_id": pid,
        "producer_epoch": pepoch,
        "base_sequence": bseq,
        "records": records,
    }


def ref_legacy_message(
    offset: int, magic: int, value: bytes | None, *, attributes: int = 0, timestamp: int = 0
) -> bytes:
    """One v0/v1 message (kafka-reference.md §3.2): offset, size, CRC-32 of [16, end), magic, attributes, the
    timestamp (v1 only), a null key and the value (int32 length + bytes, -1 = null). A compressed wrapper is one
    whose attributes name a codec (bits 0-2) and whose value is its inner messages, compressed."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    body += struct.pack(">i", -1)
    body += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    crc = zlib.crc32(body) & 0xFFFFFFFF
    return struct.pack(">qiI", offset, 4 + len(body), crc) + body
