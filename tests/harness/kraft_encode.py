"""A KRaft metadata encoder for the decoder's hostile-input tests: the mirror of ``cluster_metadata.decode_message``,
written from the same schema tables (``METADATA_RECORDS``, ``CONTROL_RECORDS``), never a second schema.

It writes what Kafka writes (kraft-ref §2-§3): flexible message bodies with tagged sections, metadata record values
(frame version 1, apiKey, version, body), control records (key: version 0 + type), v2 record batches with CRC-32C.
Tests then break the bytes on purpose.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

from fleet_doctor import probe
from fleet_doctor.cluster_metadata import (
    CONTROL_KEY,
    CONTROL_KEYS,
    CONTROL_RECORD_VERSION,
    CONTROL_RECORDS,
    METADATA_FRAME_VERSION,
    METADATA_RECORDS,
    RECORD_KEYS,
    SCALAR_TYPES,
    element_type,
    field_default,
    in_range,
    uuid_bytes,
)


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint(n: int) -> bytes:
    return uvarint((n << 1) ^ (n >> 63))


def _value(f: dict[str, Any], t: str, v: Any, version: int) -> bytes:
    st = SCALAR_TYPES.get(t)
    if st is not None:
        return st.pack(v)
    if t == "bool":
        return b"\x01" if v else b"\x00"
    if t == "uuid":
        return uuid_bytes(v)
    if t in ("string", "bytes"):
        if v is None:
            return uvarint(0)
        raw = v.encode("utf-8") if t == "string" else bytes(v)
        return uvarint(len(raw) + 1) + raw
    et = element_type(t)
    if et is not None:
        if v is None:
            return uvarint(0)
        if et in SCALAR_TYPES or et in ("bool", "uuid", "string", "bytes"):
            return uvarint(len(v) + 1) + b"".join(_value(f, et, x, version) for x in v)
        return uvarint(len(v) + 1) + b"".join(encode_struct(f["fields"], x, version) for x in v)
    return encode_struct(f["fields"], v, version)


def encode_struct(fields: Sequence[dict[str, Any]], values: dict[str, Any], version: int) -> bytes:
    """A struct's fields in order, then its tagged section (tagged fields only when not at their default)."""
    out = bytearray()
    tagged = []
    for f in fields:
        if not in_range(f["versions"], version):
            continue
        v = values.get(f["name"], field_default(f, version))
        if f["tag"] is not None:
            if v != field_default(f, version):
                tagged.append((f["tag"], _value(f, f["type"], v, version)))
            continue
        out += _value(f, f["type"], v, version)
    out += uvarint(len(tagged))
    for tag, raw in sorted(tagged):
        out += uvarint(tag) + uvarint(len(raw)) + raw
    return bytes(out)


def encode_message(schema: dict[str, Any], values: dict[str, Any], version: int) -> bytes:
    return encode_struct(schema["fields"], values, version)


def metadata_value(name: str, version: int = 0, **fields: Any) -> bytes:
    """A metadata record value: frame version, apiKey, version, body."""
    key = RECORD_KEYS[name]
    body = encode_message(METADATA_RECORDS[key], fields, version)
    return uvarint(METADATA_FRAME_VERSION) + uvarint(key) + uvarint(version) + body


def raw_metadata_value(api_key: int, version: int, body: bytes = b"\x00") -> bytes:
    """A value with any apiKey / version (unknown ones included) and a given body."""
    return uvarint(METADATA_FRAME_VERSION) + uvarint(api_key) + uvarint(version) + body


def control_record(name: str, **fields: Any) -> tuple[bytes, bytes]:
    ctype = CONTROL_KEYS[name]
    fields.setdefault("Version", 0)
    return CONTROL_KEY.pack(0, ctype), encode_message(CONTROL_RECORDS[ctype], fields, CONTROL_RECORD_VERSION)


def encode_record(offset_delta: int, key: bytes | None, value: bytes | None) -> bytes:
    body = bytearray(b"\x00")  # attributes
    body += varint(0)  # timestampDelta
    body += varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(0)  # headers
    return varint(len(body)) + bytes(body)


def batch(
    base_offset: int,
    records: Iterable[tuple[bytes | None, bytes | None]],
    epoch: int = 1,
    control: bool = False,
    timestamp: int = 1_700_000_000_000,
    count: int | None = None,
) -> bytes:
    """A v2 record batch as KRaft writes it (uncompressed, producer id -1), CRC-32C sealed."""
    recs = list(records)
    payload = b"".join(encode_record(i, k, v) for i, (k, v) in enumerate(recs))
    attrs = 0x20 if control else 0
    n = len(recs) if count is None else count
    after_crc = struct.pack(">hiqqqhii", attrs, max(len(recs) - 1, 0), timestamp, timestamp, -1, -1, -1, n) + payload
    crc = probe.crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)  # partitionLeaderEpoch, magic, crc, then the rest
    return struct.pack(">qiibI", base_offset, length, epoch, 2, crc) + after_crc


def data_batch(base_offset: int, values: Iterable[bytes], epoch: int = 1) -> bytes:
    return batch(base_offset, [(None, v) for v in values], epoch=epoch)


def control_batch(base_offset: int, name: str, epoch: int = 1, **fields: Any) -> bytes:
    return batch(base_offset, [control_record(name, **fields)], epoch=epoch, control=True)
