"""Writing Kafka's on-disk files, byte for byte, for the fleet lab (and tests).

The layouts are not repeated here: every struct comes from ``fleet_doctor.probe``, the single home of
the formats (kafka-reference.md §1-§4). This module adds what a broker does with them:

- ``KafkaFeatures``: what a given Kafka version writes (message format, time index, leader-epoch
  checkpoint, partition.metadata, ...) and how it treats a suspicious index at load (§1.3, §1.4).
- ``encode_v2_batch`` / ``encode_legacy_message``: record batches (CRC-32C) and v0/v1 messages (CRC-32).
- ``PartitionLogWriter``: appends to a partition directory as ``Log.append`` does: segments rolled at
  ``segment.bytes``, an offset/time index entry every ``index.interval.bytes``, the max-timestamp entry
  and trimmed indexes when a segment becomes inactive or the log is closed.
- ``recover_segment``: ``LogSegment.recover``: rebuild both indexes from the ``.log`` batches and
  truncate a torn tail (§2.5).
- the small text files: offset checkpoints, leader-epoch-checkpoint, partition.metadata,
  meta.properties, ``.kafka_cleanshutdown``, each written as Kafka does (temp file, fsync, rename).
"""

from __future__ import annotations

import base64
import os
import secrets
import struct
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from fleet_doctor import store
from fleet_doctor.probe import (
    CLEAN_SHUTDOWN_FILE,
    DEFAULT_SEGMENT_INDEX_BYTES,
    LEADER_EPOCH_CHECKPOINT,
    LEGACY_HEADER,
    META_PROPERTIES,
    METADATA_TOPIC_UUID,
    OFFSET_INDEX_ENTRY,
    PARTITION_METADATA,
    TIME_INDEX_ENTRY,
    V1_TIMESTAMP,
    V2_BATCH_HEADER,
    V2_CRC_START,
    ZERO_UUID,
    crc32c,
    parse_segment_file_name,
    segment_file_name,
    walk_log,
)
from fleet_doctor.rules import KafkaVersion

INDEX_INTERVAL_BYTES = 4096  # index.interval.bytes default
DEFAULT_SEGMENT_BYTES = 1 << 30  # log.segment.bytes default
NO_TIMESTAMP = -1  # RecordBatch.NO_TIMESTAMP
CONTROL_BATCH = 0x20  # batch attributes bit 5: a control batch (kraft-reference.md §2)


@dataclass(frozen=True)
class KafkaFeatures:
    """What a Kafka broker of ``version`` writes and does at log load (ZooKeeper mode, IBP = version)."""

    version: KafkaVersion

    @classmethod
    def of(cls, text: str) -> KafkaFeatures:
        return cls(KafkaVersion.parse(text))

    def at_least(self, text: str) -> bool:
        return not self.version < KafkaVersion.parse(text)

    @property
    def magic(self) -> int:
        """Message format: v0 before 0.10, v1 in 0.10.x, v2 (record batches) from 0.11."""
        return 2 if self.at_least("0.11") else 1 if self.at_least("0.10") else 0

    @property
    def has_time_index(self) -> bool:
        return self.at_least("0.10.1")

    @property
    def has_leader_epoch_checkpoint(self) -> bool:
        return self.at_least("0.11")

    @property
    def becoming_leader_assigns_leader_epoch(self) -> bool:
        """KAFKA-7415 (2.1.0, apache/kafka PR #5678): Partition.makeLeader assigns (leader epoch, log end offset) to
        the leader epoch cache, which flushes leader-epoch-checkpoint; before, an epoch entered the cache only with
        the first batch appended in it (the 1.1/2.0 backports are not modelled)."""
        return self.at_least("2.1")

    @property
    def leader_epoch_assign_truncates_conflicts(self) -> bool:
        """Same change (KAFKA-7415, 2.1.0): assign(epoch, offset) first removes the entries at the end with an epoch
        >= epoch or a start offset >= offset; before, it appended only an epoch and offset above the latest ones."""
        return self.at_least("2.1")

    @property
    def recovery_assigns_leader_epoch_zero(self) -> bool:
        """KAFKA-10432 (apache/kafka PR #9219, 2.7.0): LogSegment.recover assigns batches' epochs >= 0; before,
        only > 0 (a log written in epoch 0 recovered no entry)."""
        return self.at_least("2.7")

    @property
    def index_rebuild_recovers_leader_epochs(self) -> bool:
        """3.x's LogLoader recovers a segment whose index is missing or corrupt with the log's leader epoch cache;
        through 2.8 (Log / object LogLoader: recoverSegment's leaderEpochCache defaults to None) only the recovery
        after an unclean shutdown (recoverLog) passed it."""
        return self.at_least("3.0")

    @property
    def has_log_start_offset_checkpoint(self) -> bool:
        return self.at_least("0.11")

    @property
    def has_producer_snapshots(self) -> bool:
        return self.at_least("0.11")

    @property
    def uses_topic_ids(self) -> bool:
        """IBP >= 2.8 in ZooKeeper mode: partition.metadata kept and written (§4.1)."""
        return self.at_least("2.8")

    @property
    def meta_properties_has_cluster_id(self) -> bool:
        return self.at_least("0.10.1")

    @property
    def clean_shutdown_json(self) -> bool:
        """3.7+ writes {"version":0,"brokerEpoch":N} into .kafka_cleanshutdown (KIP-966)."""
        return self.at_least("3.7")

    @property
    def deletes_clean_shutdown_marker_first(self) -> bool:
        """2.8+ (KAFKA-10471) deletes the marker before loading; 0.8.2-2.7 only after all logs load."""
        return self.at_least("2.8")

    @property
    def index_entry_is_last_offset(self) -> bool:
        """2.0+ appends index (largest offset of the append, its position); before: the first offset."""
        return self.at_least("2.0")

    @property
    def index_sanity_at_load(self) -> str:
        """§1.4: "fatal" (0.8: startup fails), "rebuild" (0.9-2.2: recover the segment), "trust" (2.3+)."""
        if not self.at_least("0.9"):
            return "fatal"
        return "trust" if self.at_least("2.3") else "rebuild"

    @property
    def strict_index_last_offset(self) -> bool:
        """Through 1.1.x the offset index is corrupt when last offset <= base; from 2.0 when < base."""
        return not self.at_least("2.0")


# --------------------------------------------------------------------------------------------
# Topic IDs (clients/.../common/Uuid.java)
def random_topic_id() -> str:
    """Uuid.randomUuid().toString(): url-safe base64 of 16 random bytes, no padding; never the zero or
    metadata-topic UUID and never starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode("ascii").rstrip("=")
        if text not in (ZERO_UUID, METADATA_TOPIC_UUID) and not text.startswith("-"):
            return text


# --------------------------------------------------------------------------------------------
# Records
def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _varint(n: int) -> bytes:
    """Zig-zag varint (ByteUtils.writeVarint / writeVarlong)."""
    return _uvarint((n << 1) ^ (n >> 63))


@dataclass(frozen=True)
class Record:
    timestamp: int
    key: bytes | None
    value: bytes | None


def _encode_record_v2(offset_delta: int, timestamp_delta: int, rec: Record) -> bytes:
    """DefaultRecord: length varint, attributes int8, timestampDelta varlong, offsetDelta varint, key,
    value (varint length, -1 = null), headers count varint."""
    body = bytearray(b"\x00")
    body += _varint(timestamp_delta)
    body += _varint(offset_delta)
    for part in (rec.key, rec.value):
        if part is None:
            body += _varint(-1)
        else:
            body += _varint(len(part)) + part
    body += _varint(0)
    return _varint(len(body)) + bytes(body)


def encode_v2_batch(
    base_offset: int,
    records: Sequence[Record],
    leader_epoch: int,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """One uncompressed magic-2 record batch (R/DefaultRecordBatch.java), CRC-32C over [21, end). ``attributes``:
    the batch attributes (0: no compression, CreateTime, not transactional; ``CONTROL_BATCH`` for KRaft's control
    batches)."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    base_ts = records[0].timestamp
    body = b"".join(_encode_record_v2(i, r.timestamp - base_ts, r) for i, r in enumerate(records))
    max_ts = max(r.timestamp for r in records)
    fields = [
        base_offset,
        V2_BATCH_HEADER.size - 12 + len(body),  # batchLength: bytes after the length field
        leader_epoch,
        2,
        0,  # crc, filled in below
        attributes,
        len(records) - 1,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    ]
    header = V2_BATCH_HEADER.pack(*fields)
    fields[4] = crc32c(body, crc32c(header[V2_CRC_START:]))
    return V2_BATCH_HEADER.pack(*fields) + body


def encode_legacy_message(offset: int, magic: int, rec: Record) -> bytes:
    """One uncompressed v0/v1 message (R/LegacyRecord.java): offset, size, CRC-32 of [16, end), magic,
    attributes, timestamp (v1 only), key and value (int32 length, -1 = null)."""
    tail = bytearray()
    if magic == 1:
        tail += V1_TIMESTAMP.pack(rec.timestamp)
    for part in (rec.key, rec.value):
        if part is None:
            tail += struct.pack(">i", -1)
        else:
            tail += struct.pack(">i", len(part)) + part
    after_crc = struct.pack(">bb", magic, 0) + bytes(tail)
    crc = zlib.crc32(after_crc) & 0xFFFFFFFF
    size = 4 + len(after_crc)  # size counts from the CRC on
    head = LEGACY_HEADER.pack(offset, size, crc, magic, 0)
    return head[: LEGACY_HEADER.size - 2] + after_crc


# --------------------------------------------------------------------------------------------
# Small files, written as CheckpointFile does: temp file, fsync, atomic rename
def write_atomic(path: Path, data: bytes) -> None:
    """Write a file as Kafka does: ``<name>.tmp``, fsync'd, renamed over ``<name>`` (CheckpointFile.java)."""
    store.write_atomic(path, data, temp_name=path.name + ".tmp")


def encode_offset_checkpoint(entries: Iterable[tuple[str, int, int]]) -> bytes:
    rows = [f"{t} {p} {o}" for t, p, o in entries]
    return (f"0\n{len(rows)}\n" + "".join(r + "\n" for r in rows)).encode("utf-8")


def encode_leader_epoch_checkpoint(entries: Sequence[tuple[int, int]]) -> bytes:
    return (f"0\n{len(entries)}\n" + "".join(f"{e} {o}\n" for e, o in entries)).encode("ascii")


def encode_partition_metadata(topic_id: str) -> bytes:
    """Exactly ``version: 0\\ntopic_id: <id>``, no trailing newline (§4.1)."""
    return f"version: 0\ntopic_id: {topic_id}".encode("ascii")


def encode_meta_properties(broker_id: int, cluster_id: str | None, features: KafkaFeatures) -> bytes:
    """java.util.Properties.store output as a ZooKeeper-mode broker writes it (version=0)."""
    stamp = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
    lines = ["#", f"#{stamp}", f"broker.id={broker_id}"]
    if cluster_id and features.meta_properties_has_cluster_id:
        lines.append(f"cluster.id={cluster_id}")
    lines.append("version=0")
    return ("\n".join(lines) + "\n").encode("ascii")


def encode_meta_properties_kraft(node_id: int, cluster_id: str, directory_id: str | None) -> bytes:
    """meta.properties as ``kafka-storage format`` writes it for a KRaft node (version=1; ``directory.id`` from 3.7,
    one per log dir), in the order of the real 3.7 file (kraft-3.7-ldipoc)."""
    stamp = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
    lines = ["#", f"#{stamp}", f"node.id={node_id}"]
    if directory_id:
        lines.append(f"directory.id={directory_id}")
    lines += ["version=1", f"cluster.id={cluster_id}"]
    return ("\n".join(lines) + "\n").encode("ascii")


def encode_clean_shutdown(features: KafkaFeatures, broker_epoch: int) -> bytes:
    if features.clean_shutdown_json:
        return b'{"version":0,"brokerEpoch":%d}' % broker_epoch
    return b""


def write_clean_shutdown(log_dir: Path, features: KafkaFeatures, broker_epoch: int) -> None:
    write_atomic(log_dir / CLEAN_SHUTDOWN_FILE, encode_clean_shutdown(features, broker_epoch))


# --------------------------------------------------------------------------------------------
# Indexes
def _write_index(path: Path, entry: struct.Struct, entries: Sequence[tuple[int, int]], length: int | None) -> None:
    """Write entries back to back; ``length`` preallocates (sparse) like a fresh mmap'd index."""
    with open(path, "wb") as f:
        f.write(b"".join(entry.pack(*e) for e in entries))
        if length is not None:
            f.truncate(length - length % entry.size)


def preallocate_index(path: Path, entry: struct.Struct, max_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES) -> None:
    """AbstractIndex.resize(maxIndexSize) of the active segment after load: the file grows (sparse zeros)."""
    length = max_index_bytes - max_index_bytes % entry.size
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size < length:
            os.ftruncate(fd, length)
    finally:
        os.close(fd)


def trim_index(path: Path, entries: int, entry: struct.Struct) -> None:
    """AbstractIndex.trimToValidSize: resize to the entries the broker knows of."""
    os.truncate(path, entries * entry.size)


@dataclass
class SegmentIndexes:
    """The in-memory offset and time index of one segment while it is written."""

    base_offset: int
    offsets: list[tuple[int, int]] = field(default_factory=list)  # (relative offset, position)
    times: list[tuple[int, int]] = field(default_factory=list)  # (timestamp, relative offset)
    bytes_since_last_entry: int = 0
    max_timestamp: int = NO_TIMESTAMP
    offset_of_max_timestamp: int = -1

    def maybe_append_time(self, timestamp: int, offset: int) -> None:
        """TimeIndex.maybeAppend: only a timestamp greater than the last entry's."""
        last = self.times[-1][0] if self.times else NO_TIMESTAMP
        if timestamp > last:
            self.times.append((timestamp, offset - self.base_offset))

    def on_batch(self, index_offset: int, position: int, size: int, max_ts: int, ts_offset: int) -> None:
        """LogSegment.append / recover: an entry once more than index.interval.bytes were written since
        the last one, then account for this batch."""
        if self.bytes_since_last_entry > INDEX_INTERVAL_BYTES:
            self.offsets.append((index_offset - self.base_offset, position))
            if self.max_timestamp != NO_TIMESTAMP:
                self.maybe_append_time(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_last_entry = 0
        self.bytes_since_last_entry += size
        if max_ts > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = max_ts, ts_offset

    def finish(self) -> None:
        """onBecomeInactiveSegment / close: the max-timestamp entry is appended before the trim."""
        if self.max_timestamp != NO_TIMESTAMP:
            self.maybe_append_time(self.max_timestamp, self.offset_of_max_timestamp)

    def write(self, directory: Path, features: KafkaFeatures, preallocate: int | None = None) -> None:
        _write_index(
            directory / segment_file_name(self.base_offset, "index"), OFFSET_INDEX_ENTRY, self.offsets, preallocate
        )
        if features.has_time_index:
            path = directory / segment_file_name(self.base_offset, "timeindex")
            _write_index(path, TIME_INDEX_ENTRY, self.times, preallocate)


# --------------------------------------------------------------------------------------------
# A partition's log
@dataclass
class LogState:
    """What the broker's checkpoints say about one partition."""

    log_end_offset: int
    log_start_offset: int
    leader_epochs: list[tuple[int, int]]  # (epoch, start offset)


class PartitionLogWriter:
    """Append records to one partition directory as a Kafka broker of ``features`` would.

    One ``append`` call is one produce request: a v2 batch, or a v0/v1 message set with one message per
    record. ``close()`` leaves the files of a cleanly shut down broker (trimmed indexes)."""

    def __init__(
        self,
        directory: Path,
        features: KafkaFeatures,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        base_offset: int = 0,
    ) -> None:
        self.dir = directory
        self.features = features
        self.segment_bytes = segment_bytes
        self.dir.mkdir(parents=True, exist_ok=True)
        self.next_offset = base_offset
        self.leader_epochs: list[tuple[int, int]] = []
        self._active = SegmentIndexes(base_offset)
        self._active_size = 0
        self._log_path(base_offset).touch()

    def _log_path(self, base: int) -> Path:
        return self.dir / segment_file_name(base, "log")

    def _roll(self) -> None:
        self._active.finish()
        self._active.write(self.dir, self.features)
        self._active = SegmentIndexes(self.next_offset)
        self._active_size = 0
        self._log_path(self.next_offset).touch()

    def append(self, records: Sequence[Record], leader_epoch: int = 0) -> tuple[int, int]:
        """Append records; returns (first offset, last offset)."""
        first = self.next_offset
        magic = self.features.magic
        if magic == 2:
            data = encode_v2_batch(first, records, leader_epoch)
        else:
            data = b"".join(encode_legacy_message(first + i, magic, r) for i, r in enumerate(records))
        if self._active_size and self._active_size + len(data) > self.segment_bytes:
            self._roll()
        last = first + len(records) - 1
        max_ts = max(r.timestamp for r in records) if magic else NO_TIMESTAMP
        index_offset = last if self.features.index_entry_is_last_offset else first
        self._active.on_batch(index_offset, self._active_size, len(data), max_ts, last)
        with open(self._log_path(self._active.base_offset), "ab") as f:
            f.write(data)
        self._active_size += len(data)
        self.next_offset = last + 1
        if magic == 2 and (not self.leader_epochs or self.leader_epochs[-1][0] < leader_epoch):
            self.leader_epochs.append((leader_epoch, first))
        return first, last

    def close(self) -> LogState:
        self._active.finish()
        self._active.write(self.dir, self.features)
        if self.features.has_leader_epoch_checkpoint:
            write_atomic(self.dir / LEADER_EPOCH_CHECKPOINT, encode_leader_epoch_checkpoint(self.leader_epochs))
        return LogState(self.next_offset, 0, list(self.leader_epochs))


def create_checkpoint_file(path: Path) -> bool:
    """What CheckpointFile's constructor does to its file: ``Files.createFile`` when it does not exist, i.e. an empty
    (0-byte) file, mode 0666 less the umask; an existing file is left as it is. Not the "0 / 0" framing: that is only
    written by a later ``write`` (K@0.11.0 C/server/checkpoints/CheckpointFile.scala, K@3.x
    server-common/.../server/common/CheckpointFile.java). Returns whether it created the file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def write_leader_epoch_checkpoint(directory: Path, entries: Sequence[tuple[int, int]]) -> None:
    """LeaderEpochFileCache's flush: the whole cache, as CheckpointFile.write writes it (temp file, fsync, rename)."""
    write_atomic(directory / LEADER_EPOCH_CHECKPOINT, encode_leader_epoch_checkpoint(entries))


def batch_leader_epochs(log: Path, base_offset: int) -> list[tuple[int, int]]:
    """(partitionLeaderEpoch, baseOffset) of each valid v2 batch of a .log, in file order; v0/v1 messages carry no
    leader epoch and are left out (what LogSegment.recover hands to the epoch cache, §2.5)."""
    out: list[tuple[int, int]] = []
    with open(log, "rb") as f:
        for pos, first, _last, _size in log_batches(log, base_offset):
            f.seek(pos)
            head = f.read(17)  # baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8
            if len(head) == 17 and head[16] == 2:
                out.append((struct.unpack_from(">i", head, 12)[0], first))
    return out


def write_partition_metadata(directory: Path, topic_id: str) -> None:
    write_atomic(directory / PARTITION_METADATA, encode_partition_metadata(topic_id))


def write_meta_properties(log_dir: Path, broker_id: int, cluster_id: str | None, features: KafkaFeatures) -> None:
    write_atomic(log_dir / META_PROPERTIES, encode_meta_properties(broker_id, cluster_id, features))


# --------------------------------------------------------------------------------------------
# Reading back what is on disk
def segment_bases(partition_dir: Path) -> list[int]:
    """Base offsets of the partition's live segments (``<base>.log`` without a .swap/.cleaned/.deleted suffix)."""
    return sorted(
        p[0] for n in os.listdir(partition_dir) if (p := parse_segment_file_name(n)) and p[1] == "log" and not p[2]
    )


def log_batches(log: Path, base_offset: int) -> list[tuple[int, int, int, int]]:
    """(position, first offset, last offset, size) of each valid batch of a .log, from the probe's header walk."""
    batches: list[tuple[int, int, int, int]] = []
    walk_log(str(log), base_offset, on_batch=lambda *b: batches.append(b))
    return batches


def log_end_offset(partition_dir: Path) -> int:
    """The next offset after the last valid batch of the active segment (its base offset if empty)."""
    active = segment_bases(partition_dir)[-1]
    walked = walk_log(str(partition_dir / segment_file_name(active, "log")), active)
    return walked["next_offset"] if walked["next_offset"] is not None else active


# --------------------------------------------------------------------------------------------
# Recovery (S/log/LogSegment.java recover, §2.5)
@dataclass(frozen=True)
class RecoveryResult:
    next_offset: int | None
    truncated_bytes: int
    batches: int


def _batch_max_timestamp(f: BinaryIO, position: int) -> int:
    """maxTimestamp of the v2 batch (timestamp of the v1 message) starting at ``position``; none for v0."""
    f.seek(position)
    head = f.read(V2_BATCH_HEADER.size)
    magic = head[16]
    if magic == 2:
        return V2_BATCH_HEADER.unpack(head)[8]
    if magic == 1:
        return V1_TIMESTAMP.unpack_from(head, LEGACY_HEADER.size)[0]
    return NO_TIMESTAMP


def recover_segment(
    directory: Path, base_offset: int, features: KafkaFeatures, *, preallocate: int | None = None
) -> RecoveryResult:
    """Rebuild the segment's indexes from its .log and truncate everything after the last valid batch."""
    log = directory / segment_file_name(base_offset, "log")
    res, idx = _indexes_of(log, base_offset, features)
    batches = res["batches"]
    valid = res["valid_bytes"]
    total = log.stat().st_size
    if total > valid:
        os.truncate(log, valid)
    idx.finish()
    idx.write(directory, features, preallocate)
    return RecoveryResult(res["next_offset"], total - valid, len(batches))


def _indexes_of(log: Path, base_offset: int, features: KafkaFeatures) -> tuple[dict, SegmentIndexes]:
    """Walk a segment's valid batches (CRC checked) and build its in-memory indexes as LogSegment.recover does.
    Returns the walk's result (with "batches": the (position, first, last, size) of each) and the indexes."""
    batches: list[tuple[int, int, int, int]] = []
    res = walk_log(str(log), base_offset, verify_crc=True, on_batch=lambda *b: batches.append(b))
    idx = SegmentIndexes(base_offset)
    with open(log, "rb") as f:
        for pos, first, last, size in batches:
            max_ts = _batch_max_timestamp(f, pos)
            index_offset = last if features.at_least("0.9") else first  # 0.8 recovery indexed the first offset
            idx.on_batch(index_offset, pos, size, max_ts, last)
    return dict(res, batches=batches), idx


def segment_indexes(directory: Path, base_offset: int, features: KafkaFeatures) -> SegmentIndexes:
    """The in-memory indexes of a segment as a broker holds them after loading it (the active segment's state the
    next append continues from); nothing is written."""
    return _indexes_of(directory / segment_file_name(base_offset, "log"), base_offset, features)[1]
