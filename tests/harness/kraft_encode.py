"""KRaft metadata bytes for the decoder's tests, from the lab's encoder (``fleet_lab.kraft``), which writes from the
decoder's own schema tables: one definition of the format. What is added here is only what a hostile-input test
needs: raw values with any apiKey / version, and batches whose header says what the test wants (resealed CRC)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

from fleet_doctor import probe
from fleet_doctor.cluster_metadata import METADATA_FRAME_VERSION
from fleet_lab import kraft
from fleet_lab.kafka_files import CONTROL_BATCH, Record, encode_v2_batch
from fleet_lab.kafka_files import _uvarint as uvarint

TIMESTAMP_MS = 1_700_000_000_000

__all__ = [
    "batch",
    "control_batch",
    "control_record",
    "data_batch",
    "empty_records_gzip_batch",
    "encode_message",
    "gzip_batch",
    "metadata_value",
    "raw_metadata_value",
    "uvarint",
]


def encode_message(schema: dict[str, Any], values: dict[str, Any], version: int) -> bytes:
    return kraft.encode_struct(schema["fields"], values, version)


def metadata_value(name: str, version: int = 0, **fields: Any) -> bytes:
    """A metadata record value: frame version, apiKey, version, body."""
    return kraft.metadata_record(name, version, fields)


def raw_metadata_value(api_key: int, version: int, body: bytes = b"\x00") -> bytes:
    """A value with any apiKey / version (unknown ones included) and a given body."""
    return uvarint(METADATA_FRAME_VERSION) + uvarint(api_key) + uvarint(version) + body


def control_record(name: str, **fields: Any) -> tuple[bytes, bytes]:
    fields.pop("Version", None)  # the lab's writer sets it (0)
    return kraft.control_record(name, fields)


def batch(
    base_offset: int,
    records: Iterable[tuple[bytes | None, bytes | None]],
    epoch: int = 1,
    control: bool = False,
    count: int | None = None,
) -> bytes:
    """A v2 batch of (key, value) records; ``count`` forges the header's record count (the CRC is resealed)."""
    recs = [Record(TIMESTAMP_MS, k, v) for k, v in records]
    out = bytearray(encode_v2_batch(base_offset, recs, epoch, attributes=CONTROL_BATCH if control else 0))
    if count is not None:
        out[57:61] = count.to_bytes(4, "big", signed=True)
        out[17:21] = probe.crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


def data_batch(base_offset: int, values: Iterable[bytes], epoch: int = 1) -> bytes:
    return kraft.data_batch(base_offset, epoch, list(values), TIMESTAMP_MS)


def control_batch(base_offset: int, name: str, epoch: int = 1, **fields: Any) -> bytes:
    return kraft.control_batch(base_offset, epoch, name, fields, TIMESTAMP_MS)


def gzip_batch(plain: bytes) -> bytes:
    """An uncompressed v2 batch's records gzip-compressed (codec 1), the length and CRC resealed. KRaft never writes
    one; the decoder reads it all the same (kraft-ref §2)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    after_crc = (
        bytearray(plain[21 : probe.V2_MIN_BATCH_SIZE]) + z.compress(plain[probe.V2_MIN_BATCH_SIZE :]) + z.flush()
    )
    after_crc[1] |= 1  # attributes' low byte: codec gzip
    length = 4 + 1 + 4 + len(after_crc)  # partitionLeaderEpoch, magic, crc, then the rest
    return (
        plain[:8]
        + length.to_bytes(4, "big")
        + plain[12:17]
        + probe.crc32c(bytes(after_crc)).to_bytes(4, "big")
        + bytes(after_crc)
    )


EMPTY_RECORD = bytes([0x0C, 0, 0, 0, 1, 1, 0])  # length 6: attributes, timestamp and offset deltas 0, key and value -1


def empty_records_gzip_batch(inflated_bytes: int, base_offset: int = 0) -> bytes:
    """A hostile gzip batch: ``inflated_bytes`` of empty records (null key and value, offset delta 0) once inflated,
    a few kB on disk (97,845 bytes for 64 MiB: the safety review's file). The header counts the records."""
    n = inflated_bytes // len(EMPTY_RECORD)
    one = batch(base_offset, [(None, None)])
    records = EMPTY_RECORD * n
    plain = bytearray(one[: probe.V2_MIN_BATCH_SIZE] + records)
    plain[8:12] = (len(plain) - 12).to_bytes(4, "big")
    plain[57:61] = n.to_bytes(4, "big")
    return gzip_batch(bytes(plain))
