"""KRaft for the fleet lab: the files of a node's metadata log, written byte for byte as Kafka 3.7 writes them.

The record schemas are not repeated here: the encoder below is the mirror of the product's decoder and writes
from its tables (``fleet_doctor.cluster_metadata``: ``METADATA_RECORDS``, ``CONTROL_RECORDS``, the type
vocabulary), so the lab and the decoder share one definition of the format. What this module adds
(kraft-reference.md, "kraft-ref §n"):

- ``metadata_record`` / ``control_record``: a record value (frame version 1, apiKey, version, body; §3) and a
  control record's key and value (§2); ``data_batch`` / ``control_batch``: the v2 batches that carry them
  (uncompressed, null keys for data records, all records at the batch's append time);
- ``MetadataLog``: a node's ``__cluster_metadata-0`` as UnifiedLog keeps it (segments rolled at
  ``segment.bytes``, offset and time index entries every ``index.interval.bytes``, the active segment's indexes
  preallocated while the node runs and trimmed at a clean stop, the leader epoch cache, recovery of every
  segment at open as KafkaMetadataLog asks for, truncation);
- snapshots (``<end offset>-<epoch>.checkpoint``: SnapshotHeader, the image's records, SnapshotFooter; §1, §5),
  ``bootstrap.checkpoint``, ``quorum-state`` (§6) and ``meta.properties`` version 1;
- ``Controller``: the records the active controller of Kafka 3.7 writes for what the lab does: registration,
  unfencing, controlled shutdown, fencing (leader and ISR moves, PartitionChangeRecord merge rules), ISR
  expansion, topic creation, and the image's records for a snapshot. Its state is the decoder's own
  ``Image``, replayed from the very bytes the controller writes.

The processes that use these (the quorum stand-in) are in ``fleet_lab.quorum``.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor import cluster_metadata as cm
from fleet_doctor.probe import (
    DEFAULT_SEGMENT_INDEX_BYTES,
    KRAFT_SNAPSHOT_RE,
    LEADER_EPOCH_CHECKPOINT,
    META_PROPERTIES,
    METADATA_TOPIC_UUID,
    OFFSET_INDEX_ENTRY,
    PARTITION_METADATA,
    QUORUM_STATE,
    TIME_INDEX_ENTRY,
    V2_BATCH_HEADER,
    segment_file_name,
)
from fleet_lab.kafka_files import (
    CONTROL_BATCH,
    KafkaFeatures,
    Record,
    SegmentIndexes,
    _uvarint,
    encode_meta_properties_kraft,
    encode_partition_metadata,
    encode_v2_batch,
    log_batches,
    preallocate_index,
    segment_bases,
    segment_indexes,
    write_atomic,
    write_leader_epoch_checkpoint,
)

METADATA_DIR = cm.METADATA_DIR_NAME  # "__cluster_metadata-0"
BOOTSTRAP_CHECKPOINT = "bootstrap.checkpoint"  # kafka-storage format, 3.3+: the metadata log dir (kraft-ref §1)
# MetadataVersion.IBP_3_7_IV4: what a 3.7 cluster formatted at its release version finalizes (kraft-3.7-ldipoc: 19)
METADATA_VERSION_3_7 = 19
MIN_METADATA_VERSION = (
    1  # MetadataVersion.MINIMUM_KRAFT_VERSION (IBP_3_0_IV1): the brokers' supported range starts here
)
# Record versions Kafka 3.7 writes at MV 3.7-IV4, as the real 3.7 log (kraft-3.7-ldipoc) shows them: RegisterBroker v3
# (LogDirs), Partition / PartitionChange v1 (Directories), BrokerRegistrationChange v0 to fence and unfence, v1 for
# InControlledShutdown
REGISTER_BROKER_VERSION = 3
PARTITION_RECORD_VERSION = 1
PARTITION_CHANGE_VERSION = 1
NO_LEADER = -1
NO_LEADER_CHANGE = -2
FENCE, UNFENCE = 1, -1  # BrokerRegistrationFencingChange
MAX_BATCH_BYTES = cm.KRAFT_MAX_BATCH_BYTES  # a snapshot's records fill batches up to it
CONFIG_TOPIC = cm.CONFIG_TOPIC
SECURITY_PROTOCOL_IDS = {v: k for k, v in cm.SECURITY_PROTOCOLS.items()}


def supports_kraft(features: KafkaFeatures) -> bool:
    """The KRaft lab writes what Kafka 3.7 writes (MV 3.7-IV4: directory ids, RegisterBrokerRecord v3)."""
    return features.at_least("3.7") and not features.at_least("3.8")


def random_directory_id() -> str:
    """Uuid.randomUuid for ``directory.id`` (DirectoryId: never one of the reserved ids below (0, 100))."""
    while True:
        text = cm.uuid_text(uuid.uuid4().bytes)
        raw = cm.uuid_bytes(text)
        if raw[:8] != b"\0" * 8 or int.from_bytes(raw[8:], "big") >= 100:
            return text


# --------------------------------------------------------------------------------------------
# The encoder: the decoder's tables read the other way (kraft-ref §3)
def _encode_value(f: dict[str, Any], t: str, v: Any, version: int) -> bytes:
    st = cm.SCALAR_TYPES.get(t)
    if st is not None:
        return st.pack(v)
    if t == "bool":
        return b"\x01" if v else b"\x00"
    if t == "uuid":
        return cm.uuid_bytes(v)
    et = cm.element_type(t)
    if t in ("string", "bytes") or et is not None:
        if v is None:
            if not cm.in_range(f["nullable_versions"], version):
                raise ValueError(f"field {f['name']} is not nullable in version {version}")
            return _uvarint(0)
        if t == "string":
            raw = v.encode("utf-8")
            return _uvarint(len(raw) + 1) + raw
        if t == "bytes":
            return _uvarint(len(v) + 1) + bytes(v)
        out = bytearray(_uvarint(len(v) + 1))
        for x in v:
            out += _encode_value(f, et, x, version) if et in cm.TYPES else encode_struct(f["fields"], x, version)
        return bytes(out)
    return encode_struct(f["fields"], v, version)


def encode_struct(
    fields_: Sequence[dict[str, Any]], values: dict[str, Any], version: int, flexible: bool = True
) -> bytes:
    """A struct's fields in schema order, then its tagged section (tags ascending, only values that differ from the
    field's default): the mirror of the decoder's ``_read_struct``. Absent values take the field's default."""
    names = {f["name"] for f in fields_}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"no such field(s) {sorted(unknown)} (known: {sorted(names)})")
    out = bytearray()
    tagged = []
    for f in fields_:
        default = cm.field_default(f, version)
        v = values.get(f["name"], default)
        if not cm.in_range(f["versions"], version):
            if v != default:
                raise ValueError(f"field {f['name']} does not exist in version {version}")
            continue
        if f["tag"] is not None:
            if v != default:
                tagged.append((f["tag"], _encode_value(f, f["type"], v, version)))
        else:
            out += _encode_value(f, f["type"], v, version)
    if flexible:
        out += _uvarint(len(tagged))
        for tag, raw in sorted(tagged):
            out += _uvarint(tag) + _uvarint(len(raw)) + raw
    return bytes(out)


@dataclass(frozen=True)
class MetadataRecord:
    """One metadata record to write: its schema name (``TopicRecord``), version and fields (Kafka's names)."""

    name: str
    version: int
    fields: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return metadata_record(self.name, self.version, self.fields)


def metadata_record(name: str, version: int, fields_: dict[str, Any]) -> bytes:
    """A metadata record value (MetadataRecordSerde): uvarint frame version 1, apiKey, version, then the body."""
    key = cm.RECORD_KEYS[name]
    schema = cm.METADATA_RECORDS[key]
    if not cm.in_range(schema["versions"], version):
        raise ValueError(f"{name} has no version {version}")
    body = encode_struct(schema["fields"], fields_, version, cm.in_range(schema["flexible"], version))
    return _uvarint(cm.METADATA_FRAME_VERSION) + _uvarint(key) + _uvarint(version) + body


def control_record(name: str, fields_: dict[str, Any]) -> tuple[bytes, bytes]:
    """(key, value) of a control record: key int16 version 0 + int16 type; value the message at version 0 with no
    frame header (ControlRecordUtils, kraft-ref §2)."""
    ctype = cm.CONTROL_KEYS[name]
    schema = cm.CONTROL_RECORDS[ctype]
    v = cm.CONTROL_RECORD_VERSION
    value = encode_struct(schema["fields"], {"Version": v, **fields_}, v, cm.in_range(schema["flexible"], v))
    return cm.CONTROL_KEY.pack(0, ctype), value


def data_batch(base_offset: int, epoch: int, values: Sequence[bytes], timestamp_ms: int) -> bytes:
    """A batch of metadata records as KRaft's BatchBuilder writes it: uncompressed, null keys, no headers, every
    record at the batch's append time, producer fields -1, partitionLeaderEpoch = the raft epoch (kraft-ref §2)."""
    return encode_v2_batch(base_offset, [Record(timestamp_ms, None, v) for v in values], epoch)


def control_batch(base_offset: int, epoch: int, name: str, fields_: dict[str, Any], timestamp_ms: int) -> bytes:
    key, value = control_record(name, fields_)
    return encode_v2_batch(base_offset, [Record(timestamp_ms, key, value)], epoch, attributes=CONTROL_BATCH)


def leader_change(leader_id: int, voters: Iterable[int], granting: Iterable[int]) -> dict[str, Any]:
    """LeaderChangeMessage (v0, as 3.x writes it)."""
    return {
        "LeaderId": leader_id,
        "Voters": [{"VoterId": v} for v in sorted(voters)],
        "GrantingVoters": [{"VoterId": v} for v in sorted(granting)],
    }


@dataclass(frozen=True)
class BatchHeader:
    base_offset: int
    last_offset: int
    epoch: int
    crc: int
    max_timestamp: int
    control: bool
    size: int

    @classmethod
    def of(cls, batch: bytes) -> BatchHeader:
        (base, length, epoch, _magic, crc, attrs, last_delta, _bts, max_ts, *_rest) = V2_BATCH_HEADER.unpack_from(
            batch, 0
        )
        return cls(base, base + last_delta, epoch, crc, max_ts, bool(attrs & CONTROL_BATCH), 12 + length)


def now_ms() -> int:
    return int(time.time() * 1000)


# --------------------------------------------------------------------------------------------
# Small files of a metadata log dir
def encode_quorum_state(leader_id: int, leader_epoch: int, voted_id: int, voters: Iterable[int]) -> bytes:
    """quorum-state data_version 0 (FileBasedStateStore, 3.x static quorum): one JSON object, no newline (kraft-ref
    §6; the byte layout of the real files of kraft-3.2-3broker-replicated-nurlan and kraft-3.7-ldipoc)."""
    obj = {
        "clusterId": "",
        "leaderId": leader_id,
        "leaderEpoch": leader_epoch,
        "votedId": voted_id,
        "appliedOffset": 0,
        "currentVoters": [{"voterId": v} for v in sorted(voters)],
        "data_version": 0,
    }
    return json.dumps(obj, separators=(",", ":")).encode("ascii")


def write_quorum_state(mdir: Path, leader_id: int, leader_epoch: int, voted_id: int, voters: Iterable[int]) -> None:
    """Written as FileBasedStateStore does: ``quorum-state.tmp``, fsync, atomic move."""
    write_atomic(mdir / QUORUM_STATE, encode_quorum_state(leader_id, leader_epoch, voted_id, voters))


def write_kraft_meta_properties(log_dir: Path, node_id: int, cluster_id: str, directory_id: str) -> None:
    write_atomic(log_dir / META_PROPERTIES, encode_meta_properties_kraft(node_id, cluster_id, directory_id))


def snapshot_file_name(end_offset: int, epoch: int) -> str:
    """Snapshots.filenameFromSnapshotId: %020d-%010d.checkpoint (end offset = last contained offset + 1)."""
    return f"{end_offset:020d}-{epoch:010d}.checkpoint"


def snapshot_ids(mdir: Path) -> list[tuple[int, int]]:
    """(end offset, epoch) of the complete snapshots of a metadata dir, oldest first (by epoch, then offset)."""
    return [(end, epoch) for end, epoch, _name in cm.snapshot_files(os.listdir(mdir))]


def encode_snapshot(values: Sequence[bytes], epoch: int, last_contained_ms: int) -> bytes:
    """A snapshot's bytes (RecordsSnapshotWriter): a SnapshotHeader control batch at offset 0, the records in batches
    of at most MAX_BATCH_BYTES from offset 1, a SnapshotFooter control batch; every batch at the snapshot's epoch.
    (3.8+ adds KRaftVersion / Voters control records after the header for kraft.version 1: not for 3.7.)"""
    ts = now_ms()
    out = bytearray(control_batch(0, epoch, "SNAPSHOT_HEADER", {"LastContainedLogTimestamp": last_contained_ms}, ts))
    offset = 1
    chunk: list[bytes] = []
    size = 0
    for v in values:
        if chunk and size + len(v) + 16 > MAX_BATCH_BYTES:
            out += data_batch(offset, epoch, chunk, ts)
            offset += len(chunk)
            chunk, size = [], 0
        chunk.append(v)
        size += len(v) + 16
    if chunk:
        out += data_batch(offset, epoch, chunk, ts)
        offset += len(chunk)
    out += control_batch(offset, epoch, "SNAPSHOT_FOOTER", {}, ts)
    return bytes(out)


def write_snapshot(mdir: Path, end_offset: int, epoch: int, data: bytes) -> Path:
    """FileRawSnapshotWriter: written to ``<id>.checkpoint.part``, flushed, then moved to ``<id>.checkpoint``
    (freeze)."""
    final = mdir / snapshot_file_name(end_offset, epoch)
    part = final.with_name(final.name + ".part")
    with open(part, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, final)
    return final


def bootstrap_checkpoint(metadata_version: int) -> bytes:
    """``bootstrap.checkpoint`` as ``kafka-storage format`` writes it (BootstrapDirectory, snapshot format at epoch 0,
    LastContainedLogTimestamp 0): the metadata.version FeatureLevelRecord (kraft-3.5-3broker-greenlemon's file)."""
    ts = now_ms()
    fl = MetadataRecord("FeatureLevelRecord", 0, {"Name": "metadata.version", "FeatureLevel": metadata_version})
    return (
        control_batch(0, 0, "SNAPSHOT_HEADER", {"LastContainedLogTimestamp": 0}, ts)
        + data_batch(1, 0, [fl.encode()], ts)
        + control_batch(2, 0, "SNAPSHOT_FOOTER", {}, ts)
    )


# --------------------------------------------------------------------------------------------
# A node's metadata log (K/raft/KafkaMetadataLog over UnifiedLog)
@dataclass
class BatchRef:
    """Where a batch of a metadata log is: its header and its place in its segment."""

    header: BatchHeader
    segment: Path
    position: int


class MetadataLog:
    """A node's ``__cluster_metadata-0``: append-only segments and their indexes as UnifiedLog writes them.

    ``running``: the active segment's indexes are preallocated to ``segment.index.bytes`` as a running broker keeps
    them (``close()`` trims them, as a clean stop does; a killed node leaves them preallocated). Without it (the lab
    writing a stopped cluster's files) every index is written trimmed."""

    def __init__(
        self,
        path: Path,
        features: KafkaFeatures,
        segment_bytes: int,
        *,
        running: bool = False,
        index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES,
    ) -> None:
        self.path = path
        self.f = features
        self.segment_bytes = segment_bytes
        self.running = running
        self.index_bytes = index_bytes
        self.bases: list[int] = []
        self.next_offset = 0
        self.epochs: list[tuple[int, int]] = []  # the leader epoch cache: (epoch, start offset)
        self.last: BatchHeader | None = None
        self._active = SegmentIndexes(0)
        self._active_size = 0
        self.recovery: list[str] = []  # what open() did, for the node's log

    # ---- creating and opening
    def create(self) -> MetadataLog:
        """A new, empty metadata log (what the first start after ``kafka-storage format`` creates)."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path / PARTITION_METADATA, encode_partition_metadata(METADATA_TOPIC_UUID))
        write_leader_epoch_checkpoint(self.path, [])
        self._start_segment(0)
        return self

    def open(self) -> MetadataLog:
        """KafkaMetadataLog.apply: the log is loaded with recovery point 0 and lastShutdownClean false, so every
        segment is recovered (indexes rebuilt, a torn or corrupt tail truncated and later segments dropped);
        ``.checkpoint.part`` / ``.deleted`` snapshots are removed (recoverSnapshots), and a snapshot beyond the log
        end truncates the log fully (truncateToLatestSnapshot)."""
        for name in sorted(os.listdir(self.path)):
            m = KRAFT_SNAPSHOT_RE.fullmatch(name)
            if m and m.group(3):
                os.unlink(self.path / name)
                self.recovery.append(f"Deleted snapshot file {name} left by an interrupted write or delete")
        bases = segment_bases(self.path)
        if not bases:
            self._start_segment(0)
            bases = [0]
        from fleet_lab.kafka_files import recover_segment  # the broker's recovery, one definition

        kept = []
        for i, base in enumerate(bases):
            res = recover_segment(self.path, base, self.f)
            kept.append(base)
            if res.truncated_bytes:
                self.recovery.append(
                    f"Recovered segment {base} of {METADATA_DIR}: truncated {res.truncated_bytes} bytes after "
                    f"offset {res.next_offset} (torn or corrupt batch)"
                )
                for later in bases[i + 1 :]:
                    for ext in ("log", "index", "timeindex"):
                        (self.path / segment_file_name(later, ext)).unlink(missing_ok=True)
                    self.recovery.append(f"Deleted segment {later} of {METADATA_DIR} after the truncation")
                break
        self.bases = kept
        self._load_tail()
        snaps = snapshot_ids(self.path)
        if snaps and snaps[-1][0] > self.next_offset:
            end, epoch = snaps[-1]
            self.recovery.append(
                f"Truncating the log fully to the latest snapshot {snapshot_file_name(end, epoch)} (log end "
                f"{self.next_offset})"
            )
            self.truncate_fully(end)
        return self

    def _load_tail(self) -> None:
        """Next offset, last batch, the epoch cache and the active segment's index state from the files."""
        refs = self.batch_refs()
        self.last = refs[-1].header if refs else None
        self.next_offset = refs[-1].header.last_offset + 1 if refs else self.bases[-1]
        epochs: list[tuple[int, int]] = []
        for r in refs:
            if not epochs or r.header.epoch > epochs[-1][0]:
                epochs.append((r.header.epoch, r.header.base_offset))
        if epochs != self.epochs or not (self.path / LEADER_EPOCH_CHECKPOINT).exists():
            self.epochs = epochs
            write_leader_epoch_checkpoint(self.path, epochs)
        active = self.bases[-1]
        self._active = segment_indexes(self.path, active, self.f)
        self._active_size = (self.path / segment_file_name(active, "log")).stat().st_size
        self._write_active_indexes()

    def _start_segment(self, base: int) -> None:
        (self.path / segment_file_name(base, "log")).touch()
        self.bases.append(base)
        self._active = SegmentIndexes(base)
        self._active_size = 0
        self._write_active_indexes()

    def _write_active_indexes(self) -> None:
        if not self.running:
            self._active.write(self.path, self.f)
            return
        for ext, entry, entries in (
            ("index", OFFSET_INDEX_ENTRY, self._active.offsets),
            ("timeindex", TIME_INDEX_ENTRY, self._active.times),
        ):
            p = self.path / segment_file_name(self._active.base_offset, ext)
            preallocate_index(p, entry, self.index_bytes)
            fd = os.open(p, os.O_WRONLY)
            try:
                os.pwrite(fd, b"".join(entry.pack(*e) for e in entries), 0)
            finally:
                os.close(fd)

    # ---- appending
    def append(self, batch: bytes) -> BatchHeader:
        """Append one batch whose base offset is the log end offset (the leader's own, or a follower's copy of the
        leader's bytes). Rolls a segment first when the batch does not fit (LogSegment.shouldRoll on size)."""
        h = BatchHeader.of(batch)
        if h.base_offset != self.next_offset:
            raise ValueError(f"{self.path}: batch at offset {h.base_offset} appended at log end {self.next_offset}")
        if self._active_size and self._active_size + len(batch) > self.segment_bytes:
            self._roll()
        self._active.on_batch(h.last_offset, self._active_size, len(batch), h.max_timestamp, h.last_offset)
        with open(self.path / segment_file_name(self._active.base_offset, "log"), "ab") as f:
            f.write(batch)
        self._active_size += len(batch)
        self._write_active_indexes()
        self.next_offset = h.last_offset + 1
        self.last = h
        if not self.epochs or h.epoch > self.epochs[-1][0]:
            self.epochs.append((h.epoch, h.base_offset))  # LeaderEpochFileCache.assign: flushed
            write_leader_epoch_checkpoint(self.path, self.epochs)
        return h

    def _roll(self) -> None:
        """onBecomeInactiveSegment: the max-timestamp entry appended, the indexes trimmed; a new active segment."""
        self._active.finish()
        self._active.write(self.path, self.f)
        self._start_segment(self.next_offset)

    def close(self) -> None:
        """A clean stop (LogSegment.close): the active segment's time index gets its max-timestamp entry and both
        indexes are trimmed to their entries."""
        self._active.finish()
        self._active.write(self.path, self.f)

    # ---- truncation (a follower whose log diverged from the leader's, or a snapshot beyond the log)
    def truncate_to(self, offset: int) -> None:
        """UnifiedLog.truncateTo at a batch boundary: the segments from ``offset`` on deleted, the segment holding
        it cut there, its indexes rebuilt (zeros after the entries, as a truncated mmap'd index), the epoch cache cut
        (truncateFromEnd)."""
        if offset >= self.next_offset:
            return
        if not self.bases or offset <= self.bases[0]:
            self.truncate_fully(offset)
            return
        cut = next((r for r in self.batch_refs(offset) if r.header.base_offset >= offset), None)
        for base in [b for b in self.bases if b >= offset]:
            for ext in ("log", "index", "timeindex"):
                (self.path / segment_file_name(base, ext)).unlink(missing_ok=True)
        self.bases = [b for b in self.bases if b < offset]
        seg = self.path / segment_file_name(self.bases[-1], "log")
        if cut is not None and cut.segment == seg:
            os.truncate(seg, cut.position)
        for ext in ("index", "timeindex"):
            (self.path / segment_file_name(self.bases[-1], ext)).unlink(missing_ok=True)
        self.epochs = [e for e in self.epochs if e[1] < offset]
        write_leader_epoch_checkpoint(self.path, self.epochs)
        self._load_tail()

    def truncate_fully(self, start: int) -> None:
        """UnifiedLog.truncateFullyAndStartAt: every segment deleted, an empty one at ``start``, the epoch cache
        cleared."""
        for base in self.bases or segment_bases(self.path):
            for ext in ("log", "index", "timeindex"):
                (self.path / segment_file_name(base, ext)).unlink(missing_ok=True)
        self.bases = []
        self.epochs = []
        write_leader_epoch_checkpoint(self.path, [])
        self.next_offset = start
        self.last = None
        self._start_segment(start)

    # ---- reading (this node's files, or another node's: the leader's log a follower fetches from)
    def batch_refs(self, from_offset: int = 0) -> list[BatchRef]:
        return read_batch_refs(self.path, from_offset)

    @property
    def log_start_offset(self) -> int:
        return self.bases[0] if self.bases else 0


def read_batch_refs(mdir: Path, from_offset: int = 0) -> list[BatchRef]:
    """Headers and places of the complete batches of a metadata log whose last offset is at or after
    ``from_offset``, in order. A batch being appended (incomplete) ends the walk, as a fetch would."""
    out: list[BatchRef] = []
    bases = segment_bases(mdir)
    start = max([b for b in bases if b <= from_offset], default=bases[0] if bases else 0)
    for base in (b for b in bases if b >= start):
        seg = mdir / segment_file_name(base, "log")
        try:
            batches = log_batches(seg, base)
            with open(seg, "rb") as f:
                for pos, _first, last, _size in batches:
                    if last < from_offset:
                        continue
                    f.seek(pos)
                    head = f.read(V2_BATCH_HEADER.size)
                    if len(head) < V2_BATCH_HEADER.size:
                        break
                    out.append(BatchRef(BatchHeader.of(head), seg, pos))
        except FileNotFoundError:  # the segment went while we looked (truncation): what we have is what there is
            break
    return out


def read_batch(ref: BatchRef) -> bytes:
    with open(ref.segment, "rb") as f:
        f.seek(ref.position)
        return f.read(ref.header.size)


# --------------------------------------------------------------------------------------------
# The controller's records
@dataclass(frozen=True)
class BrokerInfo:
    """What a broker sends in its BrokerRegistrationRequest (the lab's listener, log dirs and supported features)."""

    broker_id: int
    incarnation_id: str
    port: int
    log_dirs: list[str]  # directory ids
    host: str = "127.0.0.1"
    max_metadata_version: int = METADATA_VERSION_3_7
    rack: str | None = None  # broker.rack


class Controller:
    """The active controller's record generation for a Kafka 3.7 cluster (QuorumController, ClusterControlManager,
    ReplicationControlManager, PartitionChangeBuilder), over the decoder's ``Image``.

    Every method returns the records of one batch, already replayed into ``self.image`` through the decoder (each
    record is encoded, decoded and applied), so the next decision sees them as a reader of the log would."""

    def __init__(self, image: cm.Image | None = None) -> None:
        self.image = image or cm.Image()

    # ---- applying
    def _apply(self, out: list[MetadataRecord], rec: MetadataRecord) -> None:
        _key, _version, name, body = cm.decode_metadata_record(rec.encode())
        err = self.image.replay(name, body)
        if err:
            raise ValueError(f"the lab controller wrote an inconsistent record: {err}")
        out.append(rec)

    def apply_all(self, records: Iterable[MetadataRecord]) -> list[MetadataRecord]:
        out: list[MetadataRecord] = []
        for r in records:
            self._apply(out, r)
        return out

    # ---- views
    def broker(self, broker_id: int) -> dict[str, Any] | None:
        return self.image.brokers.get(broker_id)

    def active(self, broker_id: int) -> bool:
        """Unfenced and not in controlled shutdown: may lead and join ISR (BrokerHeartbeatManager.isActive)."""
        b = self.broker(broker_id)
        return b is not None and not b["Fenced"] and not b["InControlledShutdown"]

    def partitions(self) -> list[tuple[str, dict[str, Any]]]:
        """(topic name, partition registration) in topic then partition order."""
        out = []
        for _tid, t in sorted(self.image.topics.items(), key=lambda kv: kv[1]["name"]):
            for _p, reg in sorted(t["partitions"].items()):
                out.append((t["name"], reg))
        return out

    def topic_id(self, name: str) -> str | None:
        return next((tid for tid, t in self.image.topics.items() if t["name"] == name), None)

    # ---- bootstrap
    def bootstrap(self, metadata_version: int) -> list[MetadataRecord]:
        """The bootstrap records the first controller writes, in a metadata transaction from MV 3.6-IV1
        (QuorumController's ActivationRecordsGenerator; kraft-3.7-ldipoc offsets 1-4)."""
        return self.apply_all(
            [
                MetadataRecord("BeginTransactionRecord", 0, {"Name": "Bootstrap records"}),
                MetadataRecord("FeatureLevelRecord", 0, {"Name": "metadata.version", "FeatureLevel": metadata_version}),
                MetadataRecord("ZkMigrationStateRecord", 0, {"ZkMigrationState": 0}),
                MetadataRecord("EndTransactionRecord", 0, {}),
            ]
        )

    # ---- brokers
    def register_broker(self, info: BrokerInfo, offset: int) -> list[MetadataRecord]:
        """ClusterControlManager.registerBroker: a new registration (or a new incarnation replacing the old one),
        fenced, its broker epoch the record's offset."""
        rec = MetadataRecord(
            "RegisterBrokerRecord",
            REGISTER_BROKER_VERSION,
            {
                "BrokerId": info.broker_id,
                "IsMigratingZkBroker": False,
                "IncarnationId": info.incarnation_id,
                "BrokerEpoch": offset,
                "EndPoints": [
                    {
                        "Name": "PLAINTEXT",
                        "Host": info.host,
                        "Port": info.port,
                        "SecurityProtocol": SECURITY_PROTOCOL_IDS["PLAINTEXT"],
                    }
                ],
                "Features": [
                    {
                        "Name": "metadata.version",
                        "MinSupportedVersion": MIN_METADATA_VERSION,
                        "MaxSupportedVersion": info.max_metadata_version,
                    }
                ],
                "Rack": info.rack,
                "Fenced": True,
                "InControlledShutdown": False,
                "LogDirs": list(info.log_dirs),
            },
        )
        return self.apply_all([rec])

    def _registration_change(self, broker_id: int, version: int, **change: int) -> MetadataRecord:
        b = self.image.brokers[broker_id]
        return MetadataRecord(
            "BrokerRegistrationChangeRecord",
            version,
            {"BrokerId": broker_id, "BrokerEpoch": b["BrokerEpoch"], **change},
        )

    def unfence(self, broker_id: int) -> list[MetadataRecord]:
        """ReplicationControlManager.handleBrokerUnfenced: the registration change (v0), then the partitions without
        a leader whose ISR holds the broker elect it (generateLeaderAndIsrUpdates over partitionsWithNoLeader)."""
        out: list[MetadataRecord] = []
        self._apply(out, self._registration_change(broker_id, 0, Fenced=UNFENCE))
        for _name, p in self.partitions():
            if p["Leader"] == NO_LEADER and broker_id in p["Isr"]:
                change = self._elect(p, remove=None)
                if change:
                    self._apply(out, change)
        return out

    def controlled_shutdown(self, broker_id: int) -> list[MetadataRecord]:
        """handleBrokerInControlledShutdown: InControlledShutdown (v1), then the broker leaves every ISR it is in and
        every leadership (kraft-3.7-ldipoc offset 4871)."""
        out: list[MetadataRecord] = []
        self._apply(out, self._registration_change(broker_id, 1, InControlledShutdown=1))
        for _name, p in self.partitions():
            if broker_id in p["Isr"]:
                change = self._elect(p, remove=broker_id)
                if change:
                    self._apply(out, change)
        return out

    def fence(self, broker_id: int) -> list[MetadataRecord]:
        """handleBrokerFenced: the broker leaves the ISRs and leaderships it still holds, then the registration change
        (Fenced, v0)."""
        out: list[MetadataRecord] = []
        for _name, p in self.partitions():
            if broker_id in p["Isr"]:
                change = self._elect(p, remove=broker_id)
                if change:
                    self._apply(out, change)
        self._apply(out, self._registration_change(broker_id, 0, Fenced=FENCE))
        return out

    def _elect(self, p: dict[str, Any], remove: int | None) -> MetadataRecord | None:
        """PartitionChangeBuilder for one partition: ``remove`` leaves the ISR (never the last member: KRaft keeps it
        and the partition goes leaderless), then a leader is chosen if the current one is no longer eligible: the
        first replica in replica order that is in the new ISR and active. Only changed fields are written."""
        isr = list(p["Isr"])
        if remove is not None and remove in isr and len(isr) > 1:
            isr = [b for b in isr if b != remove]
        leader = p["Leader"]
        if leader == NO_LEADER or leader == remove or not self.active(leader) or leader not in isr:
            candidates = [r for r in p["Replicas"] if r in isr and r != remove and self.active(r)]
            leader = candidates[0] if candidates else NO_LEADER
        fields_: dict[str, Any] = {"PartitionId": p["PartitionId"], "TopicId": p["TopicId"]}
        if isr != list(p["Isr"]):
            fields_["Isr"] = isr
        if leader != p["Leader"]:
            fields_["Leader"] = leader
        if len(fields_) == 2:
            return None
        return MetadataRecord("PartitionChangeRecord", PARTITION_CHANGE_VERSION, fields_)

    def elect_preferred(
        self, wanted: Iterable[tuple[str, int]] | None
    ) -> tuple[list[MetadataRecord], dict[str, str | None]]:
        """ReplicationControlManager.electLeaders (PREFERRED): each partition (None: every one) led by its first
        replica where that replica is in ISR and active; the records and each partition's outcome (None elected,
        ``admin.NOT_NEEDED``, or the error text), as the ElectLeaders response gives them."""
        from fleet_lab.admin import preferred_result

        by_name = {(name, p["PartitionId"]): p for name, p in self.partitions()}
        keys = sorted(by_name) if wanted is None else list(wanted)
        active = {b for b in self.image.brokers if self.active(b)}
        out: list[MetadataRecord] = []
        results: dict[str, str | None] = {}
        for key in keys:
            name = f"{key[0]}-{key[1]}"
            p = by_name.get(key)
            replicas = list(p["Replicas"]) if p else []
            results[name] = preferred_result(
                replicas, p["Leader"] if p else NO_LEADER, list(p["Isr"]) if p else [], active, name
            )
            if p is not None and results[name] is None:
                fields_ = {"PartitionId": p["PartitionId"], "TopicId": p["TopicId"], "Leader": replicas[0]}
                self._apply(out, MetadataRecord("PartitionChangeRecord", PARTITION_CHANGE_VERSION, fields_))
        return out, results

    def expand_isr(self, broker_id: int, exclude: Iterable[tuple[str, int]] = ()) -> list[MetadataRecord]:
        """The partition leaders' AlterPartition once the broker's replicas caught up (Partition.maybeExpandIsr): the
        broker appended to the ISR of each partition with a leader it is a replica of. ``exclude``: (topic,
        partition) the broker does not serve (an inconsistent topic ID)."""
        skip = set(exclude)
        out: list[MetadataRecord] = []
        for name, p in self.partitions():
            if (
                broker_id in p["Replicas"]
                and broker_id not in p["Isr"]
                and p["Leader"] != NO_LEADER
                and (name, p["PartitionId"]) not in skip
            ):
                self._apply(
                    out,
                    MetadataRecord(
                        "PartitionChangeRecord",
                        PARTITION_CHANGE_VERSION,
                        {"PartitionId": p["PartitionId"], "TopicId": p["TopicId"], "Isr": [*p["Isr"], broker_id]},
                    ),
                )
        return out

    def shrink_isr(self, broker_id: int, partitions: Iterable[tuple[str, int]]) -> list[MetadataRecord]:
        """Replicas the broker cannot serve (an offline log dir, an inconsistent topic ID): out of the ISR, as the
        leaders' AlterPartition drops a follower that stopped fetching (Partition.maybeShrinkIsr), and out of the
        leadership, as the controller moves leaders off an offline directory (handleDirectoriesOffline)."""
        want = set(partitions)
        out: list[MetadataRecord] = []
        for name, p in self.partitions():
            if (name, p["PartitionId"]) in want and broker_id in p["Isr"]:
                change = self._elect(p, remove=broker_id)
                if change:
                    self._apply(out, change)
        return out

    # ---- topics
    def create_topic(
        self,
        name: str,
        topic_id: str,
        assignment: dict[int, list[int]],
        configs: dict[str, str],
        directories: dict[int, list[str]],
        leader_epochs: dict[int, int] | None = None,
    ) -> list[MetadataRecord]:
        """CreateTopics (ReplicationControlManager.createTopic): TopicRecord, the topic's ConfigRecords, one
        PartitionRecord per partition (leader the first replica, ISR all replicas), in one batch."""
        recs = [MetadataRecord("TopicRecord", 0, {"Name": name, "TopicId": topic_id})]
        for k, v in configs.items():
            recs.append(
                MetadataRecord(
                    "ConfigRecord", 0, {"ResourceType": CONFIG_TOPIC, "ResourceName": name, "Name": k, "Value": v}
                )
            )
        for p, replicas in sorted(assignment.items()):
            recs.append(
                MetadataRecord(
                    "PartitionRecord",
                    PARTITION_RECORD_VERSION,
                    {
                        "PartitionId": p,
                        "TopicId": topic_id,
                        "Replicas": list(replicas),
                        "Isr": list(replicas),
                        "RemovingReplicas": [],
                        "AddingReplicas": [],
                        "Leader": replicas[0],
                        "LeaderEpoch": (leader_epochs or {}).get(p, 0),
                        "PartitionEpoch": 0,
                        "Directories": list(directories[p]),
                    },
                )
            )
        return self.apply_all(recs)

    # ---- the image as records (a snapshot)
    def snapshot_records(self) -> list[MetadataRecord]:
        """MetadataImage.write: features (metadata.version first, then ZkMigrationStateRecord from MV 3.4), the
        cluster (broker registrations as they stand), topics (TopicRecord, then its PartitionRecords), configs."""
        img = self.image
        out = []
        if "metadata.version" in img.features:
            out.append(
                MetadataRecord(
                    "FeatureLevelRecord",
                    0,
                    {"Name": "metadata.version", "FeatureLevel": img.features["metadata.version"]},
                )
            )
        for name, level in sorted(img.features.items()):
            if name != "metadata.version":
                out.append(MetadataRecord("FeatureLevelRecord", 0, {"Name": name, "FeatureLevel": level}))
        if img.zk_migration_state is not None:
            out.append(MetadataRecord("ZkMigrationStateRecord", 0, {"ZkMigrationState": img.zk_migration_state}))
        for bid in sorted(img.brokers):
            b = dict(img.brokers[bid])
            out.append(MetadataRecord("RegisterBrokerRecord", REGISTER_BROKER_VERSION, b))
        for tid, t in sorted(img.topics.items(), key=lambda kv: kv[1]["name"]):
            out.append(MetadataRecord("TopicRecord", 0, {"Name": t["name"], "TopicId": tid}))
            for _p, reg in sorted(t["partitions"].items()):
                fields_ = {
                    k: v for k, v in reg.items() if k not in ("EligibleLeaderReplicas", "LastKnownElr")
                }  # v2 fields (ELR): not written at MV 3.7
                out.append(MetadataRecord("PartitionRecord", PARTITION_RECORD_VERSION, fields_))
        for (rtype, rname), conf in sorted(img.configs.items()):
            for k, v in sorted(conf.items()):
                out.append(
                    MetadataRecord(
                        "ConfigRecord", 0, {"ResourceType": rtype, "ResourceName": rname, "Name": k, "Value": v}
                    )
                )
        return out


def image_from_decoded(records: Sequence[dict[str, Any]]) -> cm.Image:
    """The decoder's output (``read_cluster_metadata``) back into its ``Image`` (Kafka's field names), for a node that
    becomes the active controller: the state it continues from is what a reader of its log sees."""
    img = cm.Image()
    head = records[0]
    img.features = dict(head.get("features") or {})
    img.zk_migration_state = 0 if img.features else None
    topic_ids: dict[str, str] = {}
    for r in records:
        kind = r.get("kind")
        if kind == "broker" and r.get("error") is None:
            protocols = r.get("listener_security_protocol_map") or {}
            endpoints = []
            for ep in r.get("endpoints") or []:
                name, _, hostport = ep.partition("://")
                host, _, port = hostport.rpartition(":")
                endpoints.append(
                    {
                        "Name": name,
                        "Host": host.strip("[]"),
                        "Port": int(port),
                        "SecurityProtocol": SECURITY_PROTOCOL_IDS.get(protocols.get(name, name), 0),
                    }
                )
            img.brokers[r["broker_id"]] = {
                "BrokerId": r["broker_id"],
                "IsMigratingZkBroker": bool(r.get("is_migrating_zk_broker")),
                "IncarnationId": r["incarnation_id"],
                "BrokerEpoch": r["broker_epoch"],
                "EndPoints": endpoints,
                "Features": [
                    {"Name": n, "MinSupportedVersion": v["min_version"], "MaxSupportedVersion": v["max_version"]}
                    for n, v in sorted((r.get("features") or {}).items())
                ],
                "Rack": r.get("rack"),
                "Fenced": bool(r["fenced"]),
                "InControlledShutdown": bool(r["in_controlled_shutdown"]),
                "LogDirs": list(r.get("log_dirs") or []),
            }
        elif kind == "topic" and r.get("error") is None:
            topic_ids[r["topic"]] = r["topic_id"]
            img.topics[r["topic_id"]] = {"name": r["topic"], "partitions": {}}
            if r.get("config"):
                img.configs[(CONFIG_TOPIC, r["topic"])] = dict(r["config"])
        elif kind == "partition_state" and r.get("error") is None:
            tid = r.get("topic_id") or topic_ids.get(r["topic"])
            if tid not in img.topics:
                continue
            img.topics[tid]["partitions"][r["partition"]] = {
                "PartitionId": r["partition"],
                "TopicId": tid,
                "Replicas": list(r["replicas"]),
                "Isr": list(r["isr"]),
                "RemovingReplicas": list(r.get("removing_replicas") or []),
                "AddingReplicas": list(r.get("adding_replicas") or []),
                "Leader": r["leader"],
                "LeaderRecoveryState": r.get("leader_recovery_state") or 0,
                "LeaderEpoch": r["leader_epoch"],
                "PartitionEpoch": r["partition_epoch"],
                "Directories": list(r.get("directories") or []),
                "EligibleLeaderReplicas": list(r.get("eligible_leader_replicas") or []),
                "LastKnownElr": list(r.get("last_known_elr") or []),
            }
        elif kind == "broker_config":
            name = "" if r.get("broker_id") is None else str(r["broker_id"])
            img.configs[(cm.CONFIG_BROKER, name)] = dict(r.get("config") or {})
    img.reindex()  # filled directly, not by replay: what replay looks up (ClearElrRecord) rebuilt
    return img


def read_image(mdir: Path) -> tuple[dict[str, Any], cm.Image]:
    """(the decoder's ``cluster_metadata`` header, the image) of a node's metadata dir (the product's decoder)."""
    records = cm.read_cluster_metadata(str(mdir))
    return records[0], image_from_decoded(records)


NO_OP_VALUE = MetadataRecord("NoOpRecord", 0).encode()  # KIP-835's record: it leaves the image as it was


def after_no_ops(mdir: Path, last: BatchHeader, end_offset: int) -> BatchHeader | None:
    """Where a reader of the log stands once it reaches ``end_offset`` from ``last`` (the header of the batch it
    took last), when that changes nothing it holds: the log still holds ``last`` where it was (no truncation, no
    snapshot reload took it away), and every batch after it up to ``end_offset`` is a data batch of NoOpRecords
    only (what the active controller writes when idle, KIP-835; what a broker's metadata publisher passes over). The
    header of the batch ending at ``end_offset - 1`` then; None otherwise (the reader reads the log again). The log
    must not change during the call (``QuorumNode.passed_no_ops`` holds the node's mutex): the batches are read at
    the places the walk found them."""
    refs = read_batch_refs(mdir, last.last_offset)
    if not refs or refs[0].header != last:
        return None
    reached = last
    for ref in refs[1:]:
        if ref.header.base_offset >= end_offset:
            break
        if ref.header.control:
            return None
        try:
            _head, records = cm.batch_records(read_batch(ref))
        except (OSError, cm.DecodeError):  # a segment gone meanwhile, a batch torn: read the log again
            return None
        if any(r.value != NO_OP_VALUE for r in records):
            return None
        reached = ref.header
    return reached if reached.last_offset == end_offset - 1 else None


# --------------------------------------------------------------------------------------------
# A stopped cluster's metadata, written before the nodes start
@dataclass
class NodeFiles:
    """One combined node of the lab: its id, metadata log dir (its first log dir) and listener port."""

    node_id: int
    metadata_log_dir: Path
    port: int
    directory_ids: dict[str, str]  # log dir -> directory.id
    rack: str | None = None  # broker.rack


@dataclass
class TopicSpec:
    name: str
    topic_id: str
    assignment: dict[int, list[int]]
    configs: dict[str, str]
    directories: dict[int, list[str]]
    leader_epochs: dict[int, int] = field(default_factory=dict)


def write_stopped_cluster(
    nodes: Sequence[NodeFiles],
    topics: Sequence[TopicSpec],
    features: KafkaFeatures,
    segment_bytes: int,
    metadata_version: int = METADATA_VERSION_3_7,
) -> dict[str, Any]:
    """Every node's ``__cluster_metadata-0`` as a cluster leaves it whose nodes all stopped together: the history of
    its first run in epoch 1 under the lowest node id (LEADER_CHANGE, the bootstrap transaction, each broker's
    registration and unfencing, one CreateTopics batch per topic), a snapshot at its end, identical on every node
    (followers replicate byte for byte), quorum-state naming that leader; ``bootstrap.checkpoint`` in each metadata
    log dir. The quorum lost its majority before anyone could be fenced, so the image ends with every broker
    registered and unfenced and every partition led by its first replica with its whole replica set in ISR.
    Returns {"end_offset", "snapshot", "broker_epochs": {id: epoch}, "leader": id, "epoch": 1}."""
    voters = sorted(n.node_id for n in nodes)
    leader, epoch = voters[0], 1
    first = nodes[0]
    mdir = first.metadata_log_dir / METADATA_DIR
    log = MetadataLog(mdir, features, segment_bytes).create()
    ctl = Controller()
    ts = now_ms() - 60_000  # the history happened a minute ago

    def append_records(records: Sequence[MetadataRecord]) -> None:
        nonlocal ts
        ts += 1
        log.append(data_batch(log.next_offset, epoch, [r.encode() for r in records], ts))

    ts += 1
    log.append(control_batch(0, epoch, "LEADER_CHANGE", leader_change(leader, voters, voters), ts))
    append_records(ctl.bootstrap(metadata_version))
    for n in sorted(nodes, key=lambda n: n.node_id):
        info = BrokerInfo(
            n.node_id, cm.uuid_text(uuid.uuid4().bytes), n.port, list(n.directory_ids.values()), rack=n.rack
        )
        append_records(ctl.register_broker(info, log.next_offset))
    for n in sorted(nodes, key=lambda n: n.node_id):
        append_records(ctl.unfence(n.node_id))
    for t in topics:
        append_records(ctl.create_topic(t.name, t.topic_id, t.assignment, t.configs, t.directories, t.leader_epochs))
    log.close()
    end = log.next_offset
    snap = write_snapshot(mdir, end, epoch, encode_snapshot([r.encode() for r in ctl.snapshot_records()], epoch, ts))
    write_quorum_state(mdir, leader, epoch, -1, voters)
    for n in nodes:
        if n is not first:
            shutil.copytree(mdir, n.metadata_log_dir / METADATA_DIR)
        write_atomic(n.metadata_log_dir / BOOTSTRAP_CHECKPOINT, bootstrap_checkpoint(metadata_version))
    return {
        "end_offset": end,
        "snapshot": snap.name,
        "broker_epochs": {bid: b["BrokerEpoch"] for bid, b in ctl.image.brokers.items()},
        "leader": leader,
        "epoch": epoch,
    }


def crc_of(data: bytes) -> int:
    """The CRC field of a batch (bytes 17-20), for comparing batches across nodes without reading them whole."""
    return struct.unpack_from(">I", data, 17)[0]
