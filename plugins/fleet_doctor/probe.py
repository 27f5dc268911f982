#!/usr/bin/env python3
"""Kafka log-dir probe: reads Kafka broker data directories exactly as Kafka writes them.

This file is the single home of Kafka's on-disk formats in Fleet Doctor. It is streamed to a
broker over SSH and run there as ``python3 - [--deep] [--verify-crc] LOGDIR...``, so it must
run on Python 3.6+ and import nothing outside the standard library.

It states facts, never judgements: it walks log dirs and prints JSON Lines records of kind
``probe``, ``logdir``, ``partition``, ``segment``, ``file`` and ``probe_end`` (schema in
docs/probe-schema.md). Rule ids and severities live in the detection app, not here.

Modes
  metadata (default)  stat every file, read index heads/tails (a binary search finds the
                      preallocated zero tail), parse the small metadata files. Never reads .log.
  deep (--deep)       also walks .log batch headers, seeking from header to header, and checks
                      every offset-index entry against the batch it points at.
  --verify-crc        deep, plus every batch CRC (CRC-32C for v2, CRC-32 for v0/v1), streamed.

Kafka sources are cited as in docs/kafka-reference.md: ``S/`` = storage/.../storage/internals/,
``R/`` = clients/.../common/record/, ``C/`` = core/src/main/scala/kafka/.
"""

import gc
import itertools
import json
import operator
import os
import re
import signal
import socket
import stat
import struct
import sys
import time
import zlib

PROBE_VERSION = "1.0.0"
SCHEMA_VERSION = 1

# --------------------------------------------------------------------------------------------
# Offset index: <20-digit base offset>.index, big-endian, 8 bytes per entry.
# S/log/OffsetIndex.java (ENTRY_SIZE = 8; getInt(n*8), getInt(n*8+4)); C/log/OffsetIndex.scala @0.8.2.2
OFFSET_INDEX_ENTRY = struct.Struct(
    ">"
    "i"  # relativeOffset  int32  offset - baseOffset
    "i"  # position        int32  byte position of the batch in the .log
)
# Time index: <base>.timeindex (0.10.1.0+), big-endian, 12 bytes per entry.
# S/log/TimeIndex.java (getLong(n*12), getInt(n*12+8))
TIME_INDEX_ENTRY = struct.Struct(
    ">"
    "q"  # timestamp       int64  max timestamp seen so far (ms)
    "i"  # relativeOffset  int32  offset of that timestamp - baseOffset
)
# segment.index.bytes default (ServerLogConfigs.java); a fresh index is setLength(roundDown(10 MiB,
# entrySize)): 10,485,760 B for .index, 10,485,756 B for .timeindex (S/log/AbstractIndex.java).
DEFAULT_SEGMENT_INDEX_BYTES = 10485760

# Record batch, magic v2: R/DefaultRecordBatch.java. CRC-32C over [21, end) (attributes onward).
V2_BATCH_HEADER = struct.Struct(
    ">"
    "q"  # 0  baseOffset            int64
    "i"  # 8  batchLength           int32  bytes after this field; batch size = 12 + batchLength
    "i"  # 12 partitionLeaderEpoch  int32
    "b"  # 16 magic                 int8   = 2
    "I"  # 17 crc                   uint32 CRC-32C of bytes [21, end)
    "h"  # 21 attributes            int16  bits 0-2 codec, 3 timestamp type, 0x10 txn, 0x20 control
    "i"  # 23 lastOffsetDelta       int32
    "q"  # 27 baseTimestamp         int64
    "q"  # 35 maxTimestamp          int64
    "q"  # 43 producerId            int64
    "h"  # 51 producerEpoch         int16
    "i"  # 53 baseSequence          int32
    "i"  # 57 recordsCount          int32  then the records (varint-framed), maybe compressed
)
V2_CRC_START = 21
V2_MIN_BATCH_SIZE = V2_BATCH_HEADER.size  # 61: "smaller than the minimum allowed overhead 61"

# Message set, magic v0/v1: R/LegacyRecord.java. CRC-32 over [16, end) (magic onward).
LOG_OVERHEAD = struct.Struct(
    ">"
    "q"  # 0  offset  int64  (a compressed wrapper carries its last inner message's offset)
    "i"  # 8  size    int32  bytes after this field
)
LEGACY_HEADER = struct.Struct(
    ">"
    "q"  # 0  offset      int64
    "i"  # 8  size        int32
    "I"  # 12 crc         uint32 CRC-32 of bytes [16, end)
    "b"  # 16 magic       int8   0 or 1  (every format puts magic at byte 16: R/Records.java)
    "b"  # 17 attributes  int8   bits 0-2 codec (v1: bit 3 timestamp type)
)
V1_TIMESTAMP = struct.Struct(">q")  # 18 timestamp int64, magic v1 only
LEGACY_CRC_START = 16
MAGIC_OFFSET = 16
HEADER_SIZE_UP_TO_MAGIC = 17  # FileLogInputStream.nextBatch: fewer than 17 bytes left = end of log
LEGACY_MIN_RECORD_OVERHEAD = 14  # "record size N smaller than minimum record overhead (14)"
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# Offset checkpoint files (C/server/checkpoints/OffsetCheckpointFile.scala, CheckpointFile.java):
#   0                         <- version
#   N                         <- entry count
#   topic partition offset    <- N lines, split on \s+
OFFSET_CHECKPOINT_FILES = (
    "recovery-point-offset-checkpoint",
    "log-start-offset-checkpoint",
    "replication-offset-checkpoint",
    "cleaner-offset-checkpoint",
)
# leader-epoch-checkpoint (S/checkpoint/LeaderEpochCheckpointFile.java): 0 / N / "epoch startOffset"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
# partition.metadata (S/checkpoint/PartitionMetadata.java): b"version: 0\ntopic_id: <uuid>", no
# trailing newline; lines split on ":\s+". The topic ID is Uuid.toString(): url-safe base64 of the
# 16 bytes (msb||lsb) without padding, 22 characters.
PARTITION_METADATA = "partition.metadata"
ZERO_UUID = "AAAAAAAAAAAAAAAAAAAAAA"
METADATA_TOPIC_UUID = "AAAAAAAAAAAAAAAAAAAAAQ"  # Uuid.ONE: KRaft's __cluster_metadata
META_PROPERTIES = "meta.properties"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"  # empty, or {"version":0,"brokerEpoch":N} (3.7+)
LOCK_FILE = ".lock"
QUORUM_STATE = "quorum-state"  # KRaft __cluster_metadata-0: JSON

# Partition dir names (C/log/LocalLog.scala, UnifiedLog.scala): "<topic>-<partition>", and while a
# replica is being deleted / moved / found stray: "<topic>-<partition>.<uniqueId>-delete|-future|-stray".
PARTITION_DIR_RE = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
SUFFIXED_DIR_RE = re.compile(
    r"^(?P<topic>.+)-(?P<partition>\d+)\.(?P<uid>[0-9A-Za-z_-]+)-(?P<state>delete|future|stray)$"
)
# Segment file names: 20-digit zero-padded base offset (LogFileUtils.filenamePrefixFromOffset) plus
# an extension; ".swap", ".cleaned", ".deleted" are appended while a file is being swapped in,
# written by the cleaner, or awaiting async deletion (S/log/LogFileUtils.java).
SEGMENT_EXTENSIONS = ("log", "index", "timeindex", "txnindex")
LEFTOVER_SUFFIXES = ("swap", "cleaned", "deleted")
KRAFT_SNAPSHOT_RE = re.compile(r"^(\d{20})-(\d{10})\.checkpoint(?:\.(part|deleted))?$")

DEFAULT_JOBS = 2  # processes per log dir for the CLI (--jobs); forked workers, see _probe_partitions
# O_NONBLOCK: opening a FIFO planted in a log dir must not block the probe (no effect on regular files)
_O_RDONLY = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)

# files Kafka itself reads: a directory (or anything not a regular file) there is an error
_LOGDIR_FILES = (META_PROPERTIES, CLEAN_SHUTDOWN_FILE) + OFFSET_CHECKPOINT_FILES
_PARTITION_FILES = (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT, QUORUM_STATE)

HEAD_READ_BYTES = 4096  # metadata mode reads an index's head in one pread: first entries + order
READ_CHUNK = 1 << 20


# --------------------------------------------------------------------------------------------
# CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven: the stdlib has only CRC-32.
def _make_crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data, crc=0):
    """CRC-32C of ``data``; pass the previous result as ``crc`` to continue a stream."""
    table = _CRC32C_TABLE
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# --------------------------------------------------------------------------------------------
# Names
def parse_partition_dir_name(name):
    """Return {topic, partition, dir_state, dir_uid} for a partition dir name, or None.

    dir_state is "live", "delete", "future" or "stray" (KRaft 3.7+ LogManager.isStrayKraftReplica).
    """
    m = SUFFIXED_DIR_RE.match(name)
    if m:
        return {
            "topic": m.group("topic"),
            "partition": int(m.group("partition")),
            "dir_state": m.group("state"),
            "dir_uid": m.group("uid"),
        }
    m = PARTITION_DIR_RE.match(name)
    if m:
        return {
            "topic": m.group("topic"),
            "partition": int(m.group("partition")),
            "dir_state": "live",
            "dir_uid": None,
        }
    return None


_DIGITS20 = re.compile(r"^[0-9]{20}$")


def parse_segment_file_name(name):
    """Split "<20 digits>.<ext>[.<suffix>]" into (base_offset, ext, suffix), or None.

    ext is one of log/index/timeindex/txnindex/snapshot; suffix is swap/cleaned/deleted or None.
    """
    if len(name) < 22 or name[20] != "." or not _DIGITS20.match(name[:20]):
        return None
    rest = name[21:]
    ext, _, suffix = rest.partition(".")
    if ext not in SEGMENT_EXTENSIONS and ext != "snapshot":
        return None
    if suffix and suffix not in LEFTOVER_SUFFIXES:
        return None
    return int(name[:20]), ext, (suffix or None)


def segment_file_name(base_offset, ext):
    return "%020d.%s" % (base_offset, ext)


# --------------------------------------------------------------------------------------------
# Small text formats. Each returns (value, error); error is None or a message naming the file.
def _open_regular(path):
    """Open a regular file for reading; anything else (directory, FIFO, device) is a ValueError
    naming the path, so callers report it instead of blocking or reading garbage."""
    fd = os.open(path, _O_RDONLY)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ValueError("%s is not a regular file" % path)
    return fd


def _read_small(path, limit=1 << 20):
    # os.read in 64 KiB steps: a buffered f.read(limit + 1) allocates the whole limit on every call
    fd = _open_regular(path)
    try:
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ValueError("file is larger than %d bytes; not a Kafka metadata file" % limit)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _decode_text(data, path):
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, "not UTF-8 text in %s: %s" % (path, e)


def parse_offset_checkpoint(data, path):
    """Parse an offset checkpoint file's bytes into ([[topic, partition, offset], ...], version).

    Raises ValueError with Kafka's own wording (CheckpointFile.java) when malformed. A file with no
    content reads as an empty map, as in Kafka.
    """
    text, err = _decode_text(data, path)
    if err:
        raise ValueError(err)
    if text.strip() == "":
        return [], None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    try:
        version = int(lines[0].strip())
    except ValueError:
        raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, lines[0]))
    if version != 0:
        raise ValueError("Unrecognised version:%d, expected version: 0 in checkpoint file at: %s" % (version, path))
    if len(lines) < 2:
        raise ValueError("Malformed line in checkpoint file [%s]: (missing entry count)" % path)
    try:
        expected = int(lines[1].strip())
    except ValueError:
        raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, lines[1]))
    entries = []
    for line in lines[2:]:
        parts = line.split()
        if len(parts) != 3:
            raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, line))
        try:
            entries.append([parts[0], int(parts[1]), int(parts[2])])
        except ValueError:
            raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, line))
    if len(entries) != expected:
        raise ValueError(
            "Expected [%d] entries in checkpoint file [%s], but found only [%d]" % (expected, path, len(entries))
        )
    return entries, version


def parse_leader_epoch_checkpoint(data, path):
    """Parse leader-epoch-checkpoint bytes into [[epoch, start_offset], ...].

    Same framing as the offset checkpoints (version 0, count, entries); a 0-byte file is the normal
    state of a replica that has never been assigned an epoch. Raises ValueError when malformed.
    """
    text, err = _decode_text(data, path)
    if err:
        raise ValueError(err)
    if text.strip() == "":
        return []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    try:
        version = int(lines[0].strip())
        expected = int(lines[1].strip()) if len(lines) > 1 else None
    except ValueError:
        raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, "\\n".join(lines[:2])))
    if version != 0:
        raise ValueError("Unrecognised version:%d, expected version: 0 in checkpoint file at: %s" % (version, path))
    if expected is None:
        raise ValueError("Malformed line in checkpoint file [%s]: (missing entry count)" % path)
    entries = []
    for line in lines[2:]:
        parts = line.split()
        if len(parts) != 2:
            raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, line))
        try:
            entries.append([int(parts[0]), int(parts[1])])
        except ValueError:
            raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, line))
    if len(entries) != expected:
        raise ValueError(
            "Expected [%d] entries in checkpoint file [%s], but found only [%d]" % (expected, path, len(entries))
        )
    return entries


_B64URL = re.compile(r"^[A-Za-z0-9_-]{22}$")
_B64URL_BYTES = re.compile(rb"[A-Za-z0-9_-]{22}\Z")


def valid_topic_id(text):
    """True if text is a Kafka Uuid string (22 url-safe base64 chars decoding to 16 bytes)."""
    if not _B64URL.match(text):
        return False
    # 22 chars carry 132 bits; the last char's low 4 bits must be zero for an exact 16-byte value,
    # i.e. its base64 index is a multiple of 16: A, Q, g or w.
    return text[-1] in "AQgw"


def parse_partition_metadata(data, path):
    """Parse partition.metadata bytes into {"version": int, "topic_id": str}.

    Raises ValueError as PartitionMetadataFile does: malformed lines, or the zero UUID ("Invalid
    topic ID in partition metadata file").
    """
    if len(data) == 43 and data[:21] == b"version: 0\ntopic_id: " and _B64URL_BYTES.match(data, 21):
        # the file as Kafka writes it (what the general parse below returns for it)
        topic_id = data[21:].decode("ascii")
        if valid_topic_id(topic_id) and topic_id != ZERO_UUID:
            return {"version": 0, "topic_id": topic_id}
    text, err = _decode_text(data, path)
    if err:
        raise ValueError(err)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, text[:80]))
    fields = {}
    for line in lines[:2]:
        kv = re.split(r":\s+", line, maxsplit=1)
        if len(kv) != 2:
            raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, line))
        fields[kv[0]] = kv[1]
    if set(fields) != {"version", "topic_id"}:
        raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, lines[0]))
    try:
        version = int(fields["version"])
    except ValueError:
        raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, lines[0]))
    if version < 0:
        raise ValueError("Unrecognised version:%d in partition metadata file %s" % (version, path))
    topic_id = fields["topic_id"]
    if not valid_topic_id(topic_id):
        raise ValueError("Malformed topic ID %r in partition metadata file (%s)" % (topic_id, path))
    if topic_id == ZERO_UUID:
        raise ValueError("Invalid topic ID in partition metadata file (%s)" % path)
    return {"version": version, "topic_id": topic_id}


def parse_properties(data, path):
    """Parse a Java .properties file (meta.properties) into a dict of strings."""
    text, err = _decode_text(data, path)
    if err:
        raise ValueError(err)
    props = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"^((?:[^=:\s\\]|\\.)+)\s*[=:\s]\s*(.*)$", line)
        if not m:
            props[line] = ""
            continue
        props[m.group(1).replace("\\", "")] = m.group(2)
    return props


def parse_meta_properties(data, path):
    """meta.properties: version 0 (ZK: broker.id) or 1 (KRaft: node.id, directory.id)."""
    props = parse_properties(data, path)
    out = {"properties": props, "version": None, "broker_id": None, "cluster_id": None, "directory_id": None}
    if "version" in props:
        try:
            out["version"] = int(props["version"])
        except ValueError:
            raise ValueError("Invalid version %r in %s" % (props["version"], path))
    node = props.get("node.id", props.get("broker.id"))
    if node is not None:
        try:
            out["broker_id"] = int(node)
        except ValueError:
            raise ValueError("Invalid broker.id/node.id %r in %s" % (node, path))
    out["cluster_id"] = props.get("cluster.id")
    out["directory_id"] = props.get("directory.id")
    return out


# --------------------------------------------------------------------------------------------
# Index files
def _is_zero(b):
    return not b.strip(b"\0")


def read_index_summary(path, entry_struct, full=False, fd=None, size=None):
    """Summarise an offset or time index without loading it.

    Reads the head (HEAD_READ_BYTES) and, when the last entry is zero, binary-searches the first
    zero entry: real entries are monotonic and non-zero, the preallocated tail is all zeros (a
    fresh index is setLength(10 MiB) and only trimToValidSize() on close or roll shortens it).
    With full=True every entry is read (streamed) and checked.

    Returns a dict: bytes, entries (real), zero_tail_entries, remainder (size % entry size),
    first, last (raw tuples), monotonic (over the entries examined, or None), checked_entries,
    first_violation (entry number) and, with full=True, zero_entries_inside.
    """
    esize = entry_struct.size
    own = fd is None
    if own:
        fd = _open_regular(path)
    try:
        if size is None:
            size = os.fstat(fd).st_size
        n = size // esize
        out = {
            "bytes": size,
            "entries": 0,
            "zero_tail_entries": 0,
            "remainder": size % esize,
            "first": None,
            "last": None,
            "monotonic": None,
            "checked_entries": 0,
            "first_violation": None,
        }
        if n == 0:
            return out
        if full:
            return _index_full_scan(fd, n, entry_struct, out)
        head = os.pread(fd, min(n * esize, HEAD_READ_BYTES), 0)
        (
            out["entries"],
            out["zero_tail_entries"],
            out["first"],
            out["last"],
            out["monotonic"],
            out["checked_entries"],
            out["first_violation"],
        ) = _summarize_index_head(fd, n, head, entry_struct)
        return out
    finally:
        if own:
            os.close(fd)


_UNPACK_N = {}  # (entry size, count) -> Struct of `count` entries back to back


def _unpack_n(entry_struct, count):
    fmt = _struct_format(entry_struct)
    multi = struct.Struct(fmt[0] + fmt[1:] * count)
    if count <= _SPLIT_CACHED_ENTRIES or count * entry_struct.size > HEAD_READ_BYTES - entry_struct.size:
        _UNPACK_N[(entry_struct.size, count)] = multi  # few entries, or a full head: kept
    return multi


def _summarize_index_head(fd, n, head, entry_struct):
    """The metadata-mode summary of an index of n (> 0) entries, given its first min(n entries,
    HEAD_READ_BYTES) bytes as `head`. Returns (entries, zero_tail_entries, first, last, monotonic,
    checked_entries, first_violation); only the binary search past the head and the last entry
    beyond it read the file (fd)."""
    esize = entry_struct.size
    hn = len(head) // esize
    if hn == n:
        tail_entry = head[(n - 1) * esize : n * esize]
    else:
        tail_entry = os.pread(fd, esize, (n - 1) * esize)
    if tail_entry.strip(b"\0"):
        real = n
    elif hn == n:
        real = _first_zero_in_buffer(head, n, esize)
    else:
        lo, hi = 0, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if mid < hn:
                chunk = head[mid * esize : (mid + 1) * esize]
            else:
                chunk = os.pread(fd, esize, mid * esize)
            if _is_zero(chunk):
                hi = mid
            else:
                lo = mid + 1
        real = lo
    if not real:
        return 0, n, None, None, None, 0, None
    checked = real if real < hn else hn
    # every examined entry in one unpack: a flat tuple (e0[0], e0[1], e1[0], e1[1], ...)
    multi = _UNPACK_N.get((esize, checked))
    if multi is None:
        multi = _unpack_n(entry_struct, checked)
    flat = multi.unpack_from(head, 0)
    first = flat[0:2]
    if real <= hn:
        last = flat[2 * real - 2 : 2 * real]
    else:
        last = entry_struct.unpack(os.pread(fd, esize, (real - 1) * esize))
    viol = None
    if checked > 1:
        # C-speed check of the order rules (see _first_order_violation); locate only on failure
        a, b = flat[0::2], flat[1::2]
        if esize == OFFSET_INDEX_ENTRY.size:
            ok = all(map(operator.lt, a, a[1:])) and all(map(operator.le, b, b[1:]))
        else:
            ok = all(map(operator.le, a, a[1:])) and all(map(operator.le, b, b[1:]))
        if not ok:
            viol = _first_order_violation(entry_struct.iter_unpack(head[: checked * esize]), esize)
    if viol is None and real > hn:
        # last must not precede the head's final entry
        if _first_order_violation([flat[2 * checked - 2 : 2 * checked], last], esize) is not None:
            viol = real - 1
    return real, n - real, first, last, viol is None, checked, viol


def _first_zero_in_buffer(buf, n, esize):
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _is_zero(buf[mid * esize : (mid + 1) * esize]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _first_order_violation(entries, esize):
    """Entry number of the first entry that breaks the index order, or None.

    Offset index (8 B): relative offsets strictly increase (OffsetIndex.append requires
    offset > lastOffset), positions never decrease. Time index (12 B): timestamps and offsets never
    decrease (TimeIndex.maybeAppend).
    """
    prev = None
    for i, e in enumerate(entries):
        if prev is not None:
            if esize == OFFSET_INDEX_ENTRY.size:
                if e[0] <= prev[0] or e[1] < prev[1]:
                    return i
            elif e[0] < prev[0] or e[1] < prev[1]:
                return i
        prev = e
    return None


def _nonzero_end(buf, block=1 << 16):
    """Length of ``buf`` without its trailing zero bytes. Whole blocks are compared against zeros (memcmp speed);
    bytes.rstrip, a byte-by-byte loop, only runs on the block that holds the last non-zero byte."""
    end = len(buf)
    while end > 0:
        start = max(0, end - block)
        part = buf[start:end]
        if part != bytes(end - start):  # calloc'd zeros: cheaper than caching one per size
            return start + len(part.rstrip(b"\0"))
        end = start
    return 0


def _zero_tail_start(fd, total, step):
    """Byte position where the all-zero tail of the first ``total`` bytes begins, found from the end in
    chunks with C-speed byte checks: a preallocated 10 MiB index is mostly tail, and entry-by-entry
    unpacking of it in Python is what a deep probe of a running broker must not pay for."""
    end = total
    while end > 0:
        start = max(0, end - step)
        buf = os.pread(fd, end - start, start)
        if len(buf) != end - start:
            return total  # the file changed under us: scan everything
        if buf != bytes(len(buf)):
            return start + _nonzero_end(buf)
        end = start
    return 0


def _index_full_scan(fd, n, entry_struct, out):
    esize = entry_struct.size
    last_nonzero = -1
    zeros_seen = 0
    first = last = None
    viol = None
    prev = None
    pos = 0
    i = 0
    step = (READ_CHUNK // esize) * esize
    whole = n * esize
    # entries are scanned up to the entry holding the last non-zero byte; the rest is the zero tail
    tail = _zero_tail_start(fd, whole, step)
    total = min(whole, -(-tail // esize) * esize)
    zeros_seen += (whole - total) // esize
    while pos < total:
        buf = os.pread(fd, min(step, total - pos), pos)
        if not buf:
            break
        pos += len(buf)
        for e in entry_struct.iter_unpack(buf[: (len(buf) // esize) * esize]):
            if e[0] == 0 and e[1] == 0:
                zeros_seen += 1
            else:
                last_nonzero = i
                last = e
                if first is None:
                    first = e
            if prev is not None and viol is None:
                if esize == OFFSET_INDEX_ENTRY.size:
                    if e[0] <= prev[0] or e[1] < prev[1]:
                        viol = i
                elif e[0] < prev[0] or e[1] < prev[1]:
                    viol = i
            prev = e
            i += 1
    real = last_nonzero + 1
    out["entries"] = real
    out["zero_tail_entries"] = n - real
    out["zero_entries_inside"] = zeros_seen - (n - real)
    out["first"] = first
    out["last"] = last
    if real:
        # zeros at the very end are the preallocated tail, not an order violation
        out["monotonic"] = viol is None or viol >= real
        out["first_violation"] = viol if (viol is not None and viol < real) else None
        out["checked_entries"] = real
    return out


def iter_index_entries(path, entry_struct, limit_entries=None):
    """Yield every entry of an index file, streamed in chunks (trailing partial entry ignored)."""
    esize = entry_struct.size
    with os.fdopen(_open_regular(path), "rb") as f:
        count = 0
        while True:
            buf = f.read((READ_CHUNK // esize) * esize)
            if not buf:
                return
            usable = (len(buf) // esize) * esize
            for e in entry_struct.iter_unpack(buf[:usable]):
                yield e
                count += 1
                if limit_entries is not None and count >= limit_entries:
                    return
            if usable < len(buf):
                return


# --------------------------------------------------------------------------------------------
# Log segments (deep mode)
def _snappy_decompress_raw(data):
    """Raw snappy block decompression (format_description.txt of google/snappy)."""
    pos = 0
    n = len(data)
    length = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 35:
            raise ValueError("snappy: bad length varint")
    out = bytearray()
    while pos < n:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:
            ln = tag >> 2
            if ln >= 60:
                nb = ln - 59
                ln = int.from_bytes(data[pos : pos + nb], "little")
                pos += nb
            ln += 1
            out += data[pos : pos + ln]
            pos += ln
            continue
        if kind == 1:
            ln = ((tag >> 2) & 7) + 4
            off = ((tag >> 5) << 8) | data[pos]
            pos += 1
        elif kind == 2:
            ln = (tag >> 2) + 1
            off = int.from_bytes(data[pos : pos + 2], "little")
            pos += 2
        else:
            ln = (tag >> 2) + 1
            off = int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        if off == 0 or off > len(out):
            raise ValueError("snappy: bad copy offset")
        for _ in range(ln):
            out.append(out[-off])
    if len(out) != length:
        raise ValueError("snappy: length mismatch")
    return bytes(out)


def _snappy_decompress(data):
    """Snappy as Kafka's v0/v1 producers wrote it, or None when data is not valid snappy."""
    try:
        return _snappy_decompress_framed(data)
    except (ValueError, IndexError):
        return None


def _snappy_decompress_framed(data):
    """Snappy as Kafka's v0/v1 producers wrote it: xerial framing, or a raw block."""
    if data[:8] == b"\x82SNAPPY\x00":
        pos = 16  # magic(8) + version(4) + compatible version(4)
        out = bytearray()
        while pos + 4 <= len(data):
            ln = int.from_bytes(data[pos : pos + 4], "big")
            pos += 4
            out += _snappy_decompress_raw(data[pos : pos + ln])
            pos += ln
        return bytes(out)
    return _snappy_decompress_raw(data)


def _legacy_value(buf, magic):
    """Return the value bytes of a legacy message buffer (starting at its offset field)."""
    pos = 18 + (8 if magic == 1 else 0)
    klen = struct.unpack_from(">i", buf, pos)[0]
    pos += 4 + max(klen, 0)
    vlen = struct.unpack_from(">i", buf, pos)[0]
    pos += 4
    if vlen < 0:
        return b""
    return buf[pos : pos + vlen]


def count_legacy_inner(wrapper, magic, codec):
    """Count inner messages of a compressed v0/v1 wrapper, or None when the codec is not decodable
    with the standard library (lz4) or the wrapper is not valid."""
    try:
        return _count_legacy_inner(wrapper, magic, codec)
    except (ValueError, IndexError, struct.error, zlib.error, MemoryError):
        return None


def _count_legacy_inner(wrapper, magic, codec):
    value = _legacy_value(wrapper, magic)
    if codec == 1:
        inner = zlib.decompress(value, 16 + zlib.MAX_WBITS)
    elif codec == 2:
        inner = _snappy_decompress(value)
        if inner is None:
            return None
    else:
        return None
    count = 0
    pos = 0
    while pos + LOG_OVERHEAD.size <= len(inner):
        _off, size = LOG_OVERHEAD.unpack_from(inner, pos)
        if size < LEGACY_MIN_RECORD_OVERHEAD or pos + 12 + size > len(inner):
            break
        count += 1
        pos += 12 + size
    return count


def _crc_stream(f, start, length, v2):
    """CRC of [start, start+length) of an open file, read in chunks."""
    f.seek(start)
    crc = 0
    remaining = length
    while remaining > 0:
        chunk = f.read(min(READ_CHUNK, remaining))
        if not chunk:
            break
        crc = crc32c(chunk, crc) if v2 else zlib.crc32(chunk, crc)
        remaining -= len(chunk)
    return crc & 0xFFFFFFFF


def walk_log(path, base_offset=None, verify_crc=False, on_batch=None):
    """Walk a .log from header to header without loading it. Mirrors FileLogInputStream.nextBatch
    and LogSegment.recover (S/log/LogSegment.java): stops cleanly on a batch that extends past EOF
    or when fewer than 17 bytes remain, with an error on a too-small size, a bad magic or a CRC
    failure. Everything after valid_bytes is what recovery would truncate.

    on_batch(position, first_offset, last_offset, size) is called for each valid batch.
    """
    res = {
        "batch_count": 0,
        "record_count": 0,
        "uncounted_batches": 0,
        "first_offset": None,
        "last_offset": None,
        "next_offset": None,
        "max_timestamp": None,
        "valid_bytes": 0,
        "torn_tail": False,
        "tail_error": None,
        "magic": [],
        "codecs": [],
        "crc_checked": 0,
        "crc_errors": 0,
        "first_crc_error_position": None,
        "offset_errors": 0,
        "first_offset_error_position": None,
        "control_batches": 0,
        "transactional_batches": 0,
        "max_leader_epoch": None,
    }
    magics = set()
    codecs = set()
    with os.fdopen(_open_regular(path), "rb", 65536) as f:
        size = os.fstat(f.fileno()).st_size
        pos = 0
        prev_last = None
        while True:
            remaining = size - pos
            if remaining == 0:
                break
            if remaining < HEADER_SIZE_UP_TO_MAGIC:
                res["torn_tail"] = True
                res["tail_error"] = "%d trailing bytes, fewer than a batch header" % remaining
                break
            f.seek(pos)
            head = f.read(V2_MIN_BATCH_SIZE if remaining >= V2_MIN_BATCH_SIZE else remaining)
            offset, length = LOG_OVERHEAD.unpack_from(head, 0)
            magic = head[MAGIC_OFFSET]
            if magic > 127:
                magic -= 256
            bsize = 12 + length
            if length < LEGACY_MIN_RECORD_OVERHEAD:
                res["torn_tail"] = True
                res["tail_error"] = "record size %d smaller than minimum record overhead (14) at byte %d" % (
                    length,
                    pos,
                )
                break
            if magic not in (0, 1, 2):
                res["torn_tail"] = True
                res["tail_error"] = "invalid magic %d at byte %d" % (magic, pos)
                break
            if bsize > remaining:
                res["torn_tail"] = True
                res["tail_error"] = "batch at byte %d needs %d bytes, only %d left" % (pos, bsize, remaining)
                break
            if magic == 2:
                if bsize < V2_MIN_BATCH_SIZE:
                    res["torn_tail"] = True
                    res["tail_error"] = (
                        "Record batch is corrupt (the size %d is smaller than the minimum allowed "
                        "overhead 61) at byte %d" % (bsize, pos)
                    )
                    break
                (b_off, _bl, epoch, _m, crc, attrs, lod, _bts, max_ts, _pid, _pe, _bs, count) = (
                    V2_BATCH_HEADER.unpack_from(head, 0)
                )
                first, last = b_off, b_off + lod
                codec = attrs & 7
                records = count
                if attrs & 0x20:
                    res["control_batches"] += 1
                if attrs & 0x10:
                    res["transactional_batches"] += 1
                if epoch >= 0 and (res["max_leader_epoch"] is None or epoch > res["max_leader_epoch"]):
                    res["max_leader_epoch"] = epoch
                crc_start = V2_CRC_START
            else:
                (_o, _s, crc, _m, attrs) = LEGACY_HEADER.unpack_from(head, 0)
                codec = attrs & 7
                max_ts = None
                if magic == 1 and len(head) >= 26:
                    max_ts = V1_TIMESTAMP.unpack_from(head, 18)[0]
                last = offset
                records = 1
                if codec:
                    f.seek(pos)
                    wrapper = f.read(bsize)
                    try:
                        records = count_legacy_inner(wrapper, magic, codec)
                    except Exception:
                        records = None
                    if records is None:
                        res["uncounted_batches"] += 1
                        first = (prev_last + 1) if prev_last is not None else last
                    elif magic == 1:
                        first = last - records + 1
                    else:
                        first = last - records + 1
                else:
                    first = offset
                crc_start = LEGACY_CRC_START
            if verify_crc:
                computed = _crc_stream(f, pos + crc_start, bsize - crc_start, magic == 2)
                res["crc_checked"] += 1
                if computed != crc:
                    res["crc_errors"] += 1
                    if res["first_crc_error_position"] is None:
                        res["first_crc_error_position"] = pos
                        res["tail_error"] = "Record is corrupt (stored crc = %d, computed crc = %d) at byte %d" % (
                            crc,
                            computed,
                            pos,
                        )
                    # LogSegment.recover stops at the first invalid batch
                    break
            if (prev_last is not None and first <= prev_last) or (base_offset is not None and first < base_offset):
                res["offset_errors"] += 1
                if res["first_offset_error_position"] is None:
                    res["first_offset_error_position"] = pos
            magics.add(magic)
            codecs.add(CODECS.get(codec, str(codec)))
            res["batch_count"] += 1
            if records is not None:
                res["record_count"] += records
            if res["first_offset"] is None:
                res["first_offset"] = first
            res["last_offset"] = last
            if max_ts is not None and max_ts >= 0 and (res["max_timestamp"] is None or max_ts > res["max_timestamp"]):
                res["max_timestamp"] = max_ts
            if on_batch is not None:
                on_batch(pos, first, last, bsize)
            prev_last = last
            pos += bsize
        res["valid_bytes"] = pos
    if res["last_offset"] is not None:
        res["next_offset"] = res["last_offset"] + 1
    res["magic"] = sorted(magics)
    res["codecs"] = sorted(codecs)
    return res


class _IndexMatcher(object):
    """Merge-walks offset-index entries against the batches of the log (both sorted by position),
    like DumpLogSegments --verify-index-only, without holding either in memory."""

    def __init__(self, entries, base_offset):
        self._it = iter(entries)
        self._base = base_offset
        self._cur = None
        self._pos_prev_last = None
        self.checked = 0
        self.not_batch_start = 0
        self.offset_outside_batch = 0
        self.offset_after_batch = 0  # 2.0+ multi-batch appends index the append's last offset
        self.beyond_log = 0
        self.examples = []
        self._advance()

    def _advance(self):
        for rel, position in self._it:
            if rel == 0 and position == 0:
                # the preallocated zero tail (a real entry never has position 0: the first entry is
                # appended only after index.interval.bytes of data)
                self._cur = None
                return
            self._cur = (self._base + rel, position)
            return
        self._cur = None

    def _example(self, what, entry, batch):
        if len(self.examples) < 5:
            self.examples.append(
                {"problem": what, "index_offset": entry[0], "index_position": entry[1], "batch": batch}
            )

    def on_batch(self, pos, first, last, size):
        while self._cur is not None and self._cur[1] < pos + size:
            off, p = self._cur
            self.checked += 1
            if p != pos:
                self.not_batch_start += 1
                self._example("not_batch_start", self._cur, [pos, first, last])
            elif off > last:
                self.offset_after_batch += 1
                self._example("offset_after_batch", self._cur, [pos, first, last])
            elif off < first:
                self.offset_outside_batch += 1
                self._example("offset_before_batch", self._cur, [pos, first, last])
            self._advance()

    def finish(self):
        while self._cur is not None:
            self.checked += 1
            self.beyond_log += 1
            self._example("beyond_valid_log", self._cur, None)
            self._advance()


# --------------------------------------------------------------------------------------------
# Locks: which log dirs are held by a running broker. Read /proc/locks (never take the lock:
# a probe that grabbed .lock even briefly could make a starting broker fail "Failed to acquire lock").
def held_lock_inodes():
    held = {}
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                # "1: POSIX  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"   (a "->" marks a waiter)
                if "->" in parts:
                    continue
                try:
                    pid = int(parts[4])
                    maj, mnr, ino = parts[5].split(":")
                    held[(int(maj, 16), int(mnr, 16), int(ino))] = pid
                except (IndexError, ValueError):
                    continue
    except OSError:
        return None
    return held


# --------------------------------------------------------------------------------------------
# The walker
def _err(e):
    if isinstance(e, OSError) and e.strerror:
        return "%s: %s" % (type(e).__name__, e.strerror)
    return "%s: %s" % (type(e).__name__, e)


# A str as JSON, ASCII-escaped: odd file names (unicode, undecodable bytes as surrogates) stay valid
# JSON. What json.dumps(s) returns for a str, without its argument checks.
_j = json.encoder.encode_basestring_ascii


def _num(v):
    return "null" if v is None else str(v)


_entry_name = operator.attrgetter("name")
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_SEGMENT_EXTENSION_SET = frozenset(SEGMENT_EXTENSIONS)
_BOOL_JSON = {None: "null", True: "true", False: "false"}


def _json_encoder():
    """json.dumps(o, separators=(",", ":")) for the probe's records (no cycles, no floats needed):
    the C encoder that JSONEncoder.encode builds on every call, built once; JSONEncoder.encode
    itself where there is no C encoder or it does not give the same text."""
    encode = json.JSONEncoder(separators=(",", ":")).encode
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return encode
    try:
        chunks = make(None, encode.__self__.default, _j, None, ":", ",", False, False, True)
        sample = {"kind": "x\u00e9\udcff", "n": [1, -2, None, True, False, [[3, 4]]], "f": 0.5, "e": {}, "l": []}

        def fast(o):
            return "".join(chunks(o, 0))

        if fast(sample) == encode(sample):
            return fast
    except Exception:
        pass
    return encode


_JSON_ENCODE = _json_encoder()

# A segment record after its constant head (see probe_partition), formatted with % in one step.
_SEGMENT_FIELDS = '%d,"active":%s,"has_log":%s,"log_bytes":%s,"log_mtime_ms":%s,"has_txnindex":%s,"txnindex_bytes":%s'


def _index_fields(prefix, extra):
    return (
        ',"has_{p}":true,"{p}_bytes":%d,"{p}_entries":%d,"{p}_zero_tail_entries":%d,"{p}_remainder":%d,'
        '"{p}_monotonic":%s,"{p}_checked_entries":%d,"{p}_first_violation":%s'.format(p=prefix)
        + extra
    )


def _index_absent(prefix, present):
    return ',"has_{p}":{t},"{p}_bytes":null,"{p}_entries":null,"{p}_zero_tail_entries":null'.format(
        p=prefix, t="true" if present else "false"
    )


_INDEX_FIELDS = _index_fields("index", ',"index_first_offset":%s,"index_last_offset":%s,"index_last_position":%s')
_TIMEINDEX_FIELDS = _index_fields(
    "timeindex", ',"timeindex_first_timestamp":%s,"timeindex_last_timestamp":%s,"timeindex_last_offset":%s'
)
_INDEX_MISSING, _INDEX_UNREADABLE = _index_absent("index", False), _index_absent("index", True)
_TIMEINDEX_MISSING, _TIMEINDEX_UNREADABLE = _index_absent("timeindex", False), _index_absent("timeindex", True)


_FAST_SEGMENT = (
    '%d,"active":%s,"has_log":true,"log_bytes":%d,"log_mtime_ms":%d,"has_txnindex":false,"txnindex_bytes":null'
    + _INDEX_FIELDS
    + _TIMEINDEX_FIELDS
    + ',"error":null}\n'
)


# file records of _partition_file_fast: logdir, path, the type's fields, then partition_dir, topic,
# partition (fctx[1]), bytes, mtime_ms; key order as file_record(..., **dict(common, **fields))
_FILE_RECORD_HEAD = '{"kind":"file","logdir":%s,"path":%s,"file_type":'
_FILE_RECORD_TAIL = '%s,"bytes":%d,"mtime_ms":%d}\n'
_SNAPSHOT_RECORD = _FILE_RECORD_HEAD + '"producer_snapshot","base_offset":%d' + _FILE_RECORD_TAIL
_PARTITION_METADATA_RECORD = _FILE_RECORD_HEAD + '"partition_metadata","topic_id":%s,"version":%d' + _FILE_RECORD_TAIL
_LEADER_EPOCH_RECORD = _FILE_RECORD_HEAD + '"leader_epoch_checkpoint","entries":%s' + _FILE_RECORD_TAIL

# A clean segment (both indexes trimmed, monotonic, no zero tail, no remainder): fewer fields to fill.
_CLEAN_SEGMENT = (
    '%d,"active":%s,"has_log":true,"log_bytes":%d,"log_mtime_ms":%d,"has_txnindex":false,"txnindex_bytes":null'
    ',"has_index":true,"index_bytes":%d,"index_entries":%d,"index_zero_tail_entries":0,"index_remainder":0,'
    '"index_monotonic":true,"index_checked_entries":%d,"index_first_violation":null,"index_first_offset":%d,'
    '"index_last_offset":%d,"index_last_position":%d'
    ',"has_timeindex":true,"timeindex_bytes":%d,"timeindex_entries":%d,"timeindex_zero_tail_entries":0,'
    '"timeindex_remainder":0,"timeindex_monotonic":true,"timeindex_checked_entries":%d,'
    '"timeindex_first_violation":null,"timeindex_first_timestamp":%d,"timeindex_last_timestamp":%d,'
    '"timeindex_last_offset":%d,"error":null}\n'
)


def _index_head_summary(path, entry_struct):
    """Metadata-mode summary of the index at path, which the directory listing says is a regular
    file, as (bytes, entries, zero_tail_entries, remainder, monotonic, first, last,
    checked_entries, first_violation); None if fstat says it is not a regular file. Raises
    OSError. The same values as read_index_summary(full=False), with fewer system calls: one
    read from offset 0 of up to HEAD_READ_BYTES + 1 bytes, whose length is the file's size when
    it comes back short (no fstat)."""
    fd = os.open(path, _O_RDONLY)
    try:
        buf = os.pread(fd, HEAD_READ_BYTES + 1, 0)
        size = len(buf)
        if size > HEAD_READ_BYTES:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            size = st.st_size
        return _summary_from_head(fd, size, buf, entry_struct)
    finally:
        os.close(fd)


def _summary_from_head(fd, size, buf, entry_struct):
    """_index_head_summary's tuple for an index of `size` bytes whose first bytes are buf."""
    esize = entry_struct.size
    n = size // esize
    if n == 0:
        return (size, 0, 0, size % esize, None, None, None, 0, None)
    hbytes = n * esize
    if hbytes > HEAD_READ_BYTES:
        hbytes = HEAD_READ_BYTES
    real, zero_tail, first, last, monotonic, checked, viol = _summarize_index_head(
        fd, n, buf if hbytes == len(buf) else buf[:hbytes], entry_struct
    )
    return (size, real, zero_tail, size % esize, monotonic, first, last, checked, viol)


def _index_values_from(fd, buf, base, entry_struct, is_offset):
    """The values of an index's segment-record fields, ready for %, given the index open as fd
    and buf, its first HEAD_READ_BYTES + 1 bytes (all of it when shorter); None if fstat says it
    is not a regular file. Raises OSError.

    A trimmed index of at most HEAD_READ_BYTES whose entries are all real and in order (the usual
    case) gives 6 values for _CLEAN_SEGMENT: bytes, entries, checked entries, then first offset,
    last offset, last position (offset index) or first timestamp, last timestamp, last offset (time
    index). Any other index gives the 10 values of _INDEX_FIELDS / _TIMEINDEX_FIELDS. fd is only
    used for an index longer than HEAD_READ_BYTES or with a zero last entry."""
    size = len(buf)
    esize = entry_struct.size
    if size <= HEAD_READ_BYTES and size and not size % esize and buf[-esize:].strip(b"\0"):
        # every entry is in buf and the last is not zero: all real (read_index_summary's result
        # with entries = checked_entries = n, no zero tail, no remainder)
        a, b = _split_fields(entry_struct, buf)
        n = len(a)
        if n == 1 or (
            all(map(operator.lt if is_offset else operator.le, a, a[1:])) and all(map(operator.le, b, b[1:]))
        ):
            if is_offset:
                return (size, n, n, base + a[0], base + a[-1], b[-1])
            return (size, n, n, a[0], a[-1], base + b[-1])
        viol = _first_order_violation(entry_struct.iter_unpack(buf), esize)
        if is_offset:
            return (size, n, 0, 0, "false", n, viol, base + a[0], base + a[-1], b[-1])
        return (size, n, 0, 0, "false", n, viol, a[0], a[-1], base + b[-1])
    if size > HEAD_READ_BYTES:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        size = st.st_size
    s = _summary_from_head(fd, size, buf, entry_struct)
    first, last = s[5], s[6]
    if is_offset:
        a = "null" if first is None else base + first[0]
        b = "null" if last is None else base + last[0]
        c = "null" if last is None else last[1]
    else:
        a = "null" if first is None else first[0]
        b = "null" if last is None else last[0]
        c = "null" if last is None else base + last[1]
    return (s[0], s[1], s[2], s[3], _BOOL_JSON[s[4]], s[7], "null" if s[8] is None else s[8], a, b, c)


def _clean_to_full(v):
    """_index_values_from's 6 clean values as the 10 of _INDEX_FIELDS / _TIMEINDEX_FIELDS."""
    return (v[0], v[1], 0, 0, "true", v[2], "null", v[3], v[4], v[5])


def _struct_format(entry_struct):
    fmt = entry_struct.format
    return fmt.decode("ascii") if isinstance(fmt, bytes) else fmt  # bytes before Python 3.7


# entry size -> {buffer size: (unpack of every entry's first field, unpack of every second field)}
_SPLIT = {OFFSET_INDEX_ENTRY.size: {}, TIME_INDEX_ENTRY.size: {}}
_SPLIT_CACHED_ENTRIES = 64  # compiled once up to this many entries; longer ones use struct's cache


def _split_fields(entry_struct, buf):
    """(first fields, second fields) of the whole entries that fill buf."""
    cache = _SPLIT.setdefault(entry_struct.size, {})
    split = cache.get(len(buf))
    if split is None:
        fmt = _struct_format(entry_struct)
        order, f1, f2 = fmt[0], fmt[1], fmt[2]
        s1, s2 = struct.calcsize(order + f1), struct.calcsize(order + f2)
        n = len(buf) // entry_struct.size
        fa = order + (f1 + "%dx" % s2) * n
        fb = order + ("%dx" % s1 + f2) * n
        if n > _SPLIT_CACHED_ENTRIES:
            return struct.unpack(fa, buf), struct.unpack(fb, buf)
        split = cache[len(buf)] = (struct.Struct(fa).unpack, struct.Struct(fb).unpack)
    return split[0](buf), split[1](buf)


# _usual_partition: a partition dir's names, sorted and joined by "\n", one match per name or per segment.
# The usual layout: every segment file belongs to a complete <base>.index, <base>.log, <base>.timeindex
# triple (a producer snapshot of the same base may sort between the .log and the .timeindex), and there
# is no .txnindex. Groups: the triple's base, its snapshot, a segment file outside a triple (not the
# usual layout), any other name.
_LAYOUT_RE = re.compile(
    r"([0-9]{20})\.index\n\1\.log\n(?:(\1\.snapshot)\n)?\1\.timeindex\n"
    r"|([0-9]{20}\.(?:log|index|timeindex|txnindex)\n)"
    r"|([^\n]+)\n"
)
_GROUPS = tuple(operator.itemgetter(i) for i in range(4))
_FAST_CHUNK = 64  # segments per batch of system calls: at most 2 * _FAST_CHUNK index files open at once
_ST_MODE, _ST_SIZE = operator.attrgetter("st_mode"), operator.attrgetter("st_size")
_IS_SYMLINK, _IS_FILE = os.DirEntry.is_symlink, os.DirEntry.is_file
_CLEAN_FRAGMENT_MAX_ENTRIES = 64  # clean-index checks are compiled up to this many entries, see _clean_fragment


def _not_clean(buf, base):
    return None


def _clean_fragment(esize, size):
    """The clean-index check of _usual_batch for an index head of `size` bytes (esize: the entry
    size, 8 for the offset index, 12 for the time index): a function of (head bytes, base offset)
    that returns the segment record's fields of that index, from "<p>_bytes" to its last value, if
    the index is clean, else None. Clean: trimmed (a whole number of entries, at most
    HEAD_READ_BYTES, so buf is all of it), its last entry not zero, its relative offsets increasing
    (offset index) and every other field never decreasing; read_index_summary gives such an index
    entries = checked_entries = n, no zero tail, no remainder, monotonic. No index of any other size
    is clean (_not_clean).

    The order checks are chained comparisons over the unpacked entries, compiled once per entry
    count up to _CLEAN_FRAGMENT_MAX_ENTRIES (a generic loop over n entries costs several times
    more); longer heads use map over the entries and struct's own format cache."""
    if not 0 < size <= HEAD_READ_BYTES or size % esize:
        return _not_clean
    n = size // esize
    offset_index = esize == OFFSET_INDEX_ENTRY.size
    entry_struct = OFFSET_INDEX_ENTRY if offset_index else TIME_INDEX_ENTRY
    p = "index" if offset_index else "timeindex"
    head = (
        '"{p}_bytes":%d,"{p}_entries":%d,"{p}_zero_tail_entries":0,"{p}_remainder":0,"{p}_monotonic":true,'
        '"{p}_checked_entries":%d,"{p}_first_violation":null,"{p}_{f}":'.format(
            p=p, f="first_offset" if offset_index else "first_timestamp"
        )
        % (size, n, n)
    )
    fmt = _struct_format(entry_struct)
    fmt = fmt[0] + fmt[1:] * n  # every entry's fields, flat: first, second, first, second, ...
    first_op = "<" if offset_index else "<="  # relative offsets (offset index) must increase
    if offset_index:  # base + first relative offset, base + last relative offset, last position
        value = """f'{head}{base + t[0]},"index_last_offset":{base + t[-2]},"index_last_position":{t[-1]}'"""
    else:  # first timestamp, last timestamp, base + last relative offset
        value = """f'{head}{t[0]},"timeindex_last_timestamp":{t[-2]},"timeindex_last_offset":{base + t[-1]}'"""
    if n <= _CLEAN_FRAGMENT_MAX_ENTRIES:
        cond = "(t[-2] or t[-1])"
        if n > 1:
            cond += " and %s and %s" % (
                (" %s " % first_op).join("t[%d]" % i for i in range(0, 2 * n, 2)),
                " <= ".join("t[%d]" % i for i in range(1, 2 * n, 2)),
            )
        src = "def fragment(buf, base):\n    t = unpack(buf)\n    if %s:\n        return %s\n" % (cond, value)
        scope = {"unpack": struct.Struct(fmt).unpack, "head": head}
    else:
        src = (
            "def fragment(buf, base):\n    t = unpack(fmt, buf)\n"
            "    if (t[-2] or t[-1]) and all(map(first_op, t[0::2], t[2::2])) and all(map(le, t[1::2], t[3::2])):\n"
            "        return %s\n" % value
        )
        scope = {
            "unpack": struct.unpack,
            "fmt": fmt,
            "head": head,
            "first_op": operator.lt if offset_index else operator.le,
            "le": operator.le,
        }
    exec(src, scope)  # source made here from numbers only
    return scope["fragment"]


class _CleanFragments(dict):
    """index head size -> _clean_fragment(esize, size), made on first use (a head is at most
    HEAD_READ_BYTES + 1 bytes, so there are few)."""

    def __init__(self, esize):
        dict.__init__(self)
        self.esize = esize

    def __missing__(self, size):
        f = self[size] = _clean_fragment(self.esize, size)
        return f


_X_FRAGMENTS, _T_FRAGMENTS = _CleanFragments(OFFSET_INDEX_ENTRY.size), _CleanFragments(TIME_INDEX_ENTRY.size)


def _summary_tuple(s):
    """read_index_summary's dict as the tuple the segment formatter takes."""
    return (
        s["bytes"],
        s["entries"],
        s["zero_tail_entries"],
        s["remainder"],
        s["monotonic"],
        s["first"],
        s["last"],
        s["checked_entries"],
        s["first_violation"],
    )


def _usual_batch(ctx, prefixes, bases, has_active, dfd):
    """The segment records (lines, bytes) of a batch of usual segments (see _usual_partition), or
    None when one is not a usual segment after all (a .log that is not a regular file, an index
    that is not). Raises OSError. System calls: a stat of each .log, then open, one pread of
    HEAD_READ_BYTES + 1 and close of each index, each kind in one run over the batch; an index
    that is not clean (see _clean_fragment: longer than the head, a zero last entry, out of order)
    is summarised by _index_values_from, which may read more of it."""
    os_stat, os_open = os.stat, os.open
    rdonly = _O_RDONLY
    sts = [os_stat(p + ".log", dir_fd=dfd, follow_symlinks=False) for p in prefixes]
    if not all(map(stat.S_ISREG, map(_ST_MODE, sts))):
        return None
    fds = []
    add = fds.append
    try:
        for p in prefixes:
            add(os_open(p + ".index", rdonly, dir_fd=dfd))
            add(os_open(p + ".timeindex", rdonly, dir_fd=dfd))
        k = len(fds)
        bufs = list(map(os.pread, fds, itertools.repeat(HEAD_READ_BYTES + 1, k), itertools.repeat(0, k)))
        # every segment's bytes as if all its indexes were clean (their heads' lengths); corrected below
        total = sum(map(_ST_SIZE, sts)) + sum(map(len, bufs))
        lines = []
        add = lines.append
        xfrag, tfrag = _X_FRAGMENTS, _T_FRAGMENTS
        acts = itertools.chain(itertools.repeat("false", len(bases) - 1), ("true" if has_active else "false",))
        for base, st, xb, tb, act in zip(bases, sts, bufs[0::2], bufs[1::2], acts):
            xf = xfrag[len(xb)](xb, base)
            tf = tfrag[len(tb)](tb, base)
            if xf is not None and tf is not None:
                # _CLEAN_SEGMENT
                add(
                    f'{ctx}{base},"active":{act},"has_log":true,"log_bytes":{st.st_size},'
                    f'"log_mtime_ms":{int(st.st_mtime * 1000)},"has_txnindex":false,"txnindex_bytes":null,'
                    f'"has_index":true,{xf},"has_timeindex":true,{tf},"error":null}}\n'
                )
                continue
            j = 2 * len(lines)
            oi = _index_values_from(fds[j], xb, base, OFFSET_INDEX_ENTRY, True)
            ti = _index_values_from(fds[j + 1], tb, base, TIME_INDEX_ENTRY, False)
            if oi is None or ti is None:  # not a regular file
                return None
            if len(oi) == 6:
                oi = _clean_to_full(oi)
            if len(ti) == 6:
                ti = _clean_to_full(ti)
            add(ctx + _FAST_SEGMENT % ((base, act, st.st_size, int(st.st_mtime * 1000)) + oi + ti))
            total += oi[0] - len(xb) + ti[0] - len(tb)
        return lines, total
    finally:
        any(map(os.close, fds))


# A metadata-mode partition record (probe_partition's keys, in its order), formatted directly.
def _partition_line(r):
    """_JSON_ENCODE(r) + "\n" for a metadata-mode partition record r: probe_partition's keys in its
    order, strings str or None, numbers int or None, lists of ints or of lists of ints."""
    eps = r["leader_epochs"]
    return (
        f'{{"kind":"partition","logdir":{_j(r["logdir"])},"path":{_j(r["path"])},"dir":{_j(r["dir"])},'
        f'"topic":{_j(r["topic"])},"partition":{r["partition"]},"dir_state":{_j(r["dir_state"])},'
        f'"dir_uid":{_str_json(r["dir_uid"])},"topic_id":{_str_json(r["topic_id"])},'
        f'"partition_metadata_present":{_BOOL_JSON[r["partition_metadata_present"]]},'
        f'"partition_metadata_version":{_num(r["partition_metadata_version"])},'
        f'"partition_metadata_error":{_str_json(r["partition_metadata_error"])},'
        f'"leader_epochs":{"null" if eps is None else _JSON_ENCODE(eps)},'
        f'"leader_epoch_present":{_BOOL_JSON[r["leader_epoch_present"]]},'
        f'"leader_epoch_error":{_str_json(r["leader_epoch_error"])},'
        f'"latest_leader_epoch":{_num(r["latest_leader_epoch"])},"segment_count":{r["segment_count"]},'
        f'"log_start_segment_offset":{_num(r["log_start_segment_offset"])},'
        f'"active_base_offset":{_num(r["active_base_offset"])},"size_bytes":{r["size_bytes"]},'
        f'"producer_snapshots":{_JSON_ENCODE(r["producer_snapshots"])},"recovery_point":{_num(r["recovery_point"])},'
        f'"log_start_offset":{_num(r["log_start_offset"])},"high_watermark":{_num(r["high_watermark"])},'
        f'"cleaner_offset":{_num(r["cleaner_offset"])},"leftover_files":{r["leftover_files"]},'
        f'"error":{_str_json(r["error"])}}}\n'
    )


def _str_json(v):
    return "null" if v is None else _j(v)


# Worker -> writer frames: kind (b"D" records, b"P" end of a partition) and payload length.
_FRAME = struct.Struct(">cI")
_COUNT_KEYS = ("partitions", "segments", "files", "errors")
_COUNTS = struct.Struct(">4Q")  # end of partition: the _COUNT_KEYS added
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ on Linux (named in the fcntl module only from 3.10)


def _fork_ok():
    """Forking is safe only without other threads (their locks would be copied held)."""
    if not hasattr(os, "fork"):
        return False
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def _grow_pipe(fd, size=1 << 20):
    """Give a worker room to run ahead: 1 MiB pipes where Linux allows (default 64 KiB)."""
    try:
        import fcntl

        fcntl.fcntl(fd, F_SETPIPE_SZ, size)
    except Exception:
        pass


def _end_worker(pid, f):
    f.close()
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass


# a relayed frame's records by count key: how such a line starts (compact JSON, "kind" first; a line holds no
# raw newline, so only a record's start follows one)
_RELAY_STARTS = {
    "partitions": b'\n{"kind":"partition",',
    "segments": b'\n{"kind":"segment",',
    "files": b'\n{"kind":"file",',
}
_ERROR_KEY = b'"error":"'
_RELAY_KEEP_BYTES = 4 << 20  # a partition's frames kept uncounted, at most


def _count_relayed(payload, counts):
    """Add the records of a frame (whole lines) to ``counts`` as the probe counts them: by kind, and the records
    with an error (only lines that may have one are parsed: an error is rare)."""
    data = b"\n" + payload
    for key, start in _RELAY_STARTS.items():
        counts[key] += data.count(start)
    if _ERROR_KEY in payload:
        for line in payload.split(b"\n"):
            if _ERROR_KEY in line:
                try:
                    rec = json.loads(line.decode("utf-8"))
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("error"):
                    counts["errors"] += 1


class _FrameWriter(object):
    """A worker's output: record strings are batched into frames on the pipe to the writer."""

    def __init__(self, fd):
        self.fd = fd
        self.parts = []
        self.size = 0

    def write(self, text):
        self.parts.append(text)
        self.size += len(text)
        if self.size >= 1 << 16:
            self._send_records()

    def flush(self):
        pass

    def end_partition(self, counts):
        if self.parts:
            self._send_records()
        self._send(b"P", _COUNTS.pack(*counts))

    def _send_records(self):
        data = "".join(self.parts).encode("utf-8")
        self.parts = []
        self.size = 0
        self._send(b"D", data)

    def _send(self, kind, payload):
        view = memoryview(_FRAME.pack(kind, len(payload)) + payload)
        while view:
            view = view[os.write(self.fd, view) :]


class _PartitionDir(object):
    """A partition dir of a log dir by name: the .name and .path that probe_partition reads."""

    __slots__ = ("name", "path")

    def __init__(self, logdir, name):
        self.name = name
        self.path = os.path.join(logdir, name)  # = the DirEntry's path from os.scandir(logdir)


class Probe(object):
    def __init__(self, out, deep=False, verify_crc=False, jobs=1):
        self.out = out
        self.deep = deep or verify_crc
        self.verify_crc = verify_crc
        self.jobs = max(1, int(jobs))
        self.counts = {"logdirs": 0, "partitions": 0, "segments": 0, "files": 0, "errors": 0}
        self.locks = held_lock_inodes()

    # -- output
    def emit(self, record):
        if record.get("error"):
            self.counts["errors"] += 1
        self.out.write(_JSON_ENCODE(record) + "\n")

    def file_record(self, logdir, path, file_type, **fields):
        self.counts["files"] += 1
        rec = {"kind": "file", "logdir": logdir, "path": path, "file_type": file_type}
        rec.update(fields)
        self.emit(rec)

    def _stat_fields(self, path):
        st = os.stat(path)  # symlinks leaving the log dir were filtered out before this
        return {"bytes": st.st_size, "mtime_ms": int(st.st_mtime * 1000)}

    # -- entry point
    def run(self, paths):
        started = time.time()
        self.emit(
            {
                "kind": "probe",
                "schema_version": SCHEMA_VERSION,
                "probe_version": PROBE_VERSION,
                "mode": "deep" if self.deep else "metadata",
                "verify_crc": self.verify_crc,
                "hostname": socket.gethostname(),
                "python": "%d.%d.%d" % sys.version_info[:3],
                "started_at_ms": int(started * 1000),
                "paths": list(paths),
            }
        )
        for p in paths:
            self.probe_logdir(p)
        self.counts["elapsed_ms"] = int((time.time() - started) * 1000)
        rec = {"kind": "probe_end", "schema_version": SCHEMA_VERSION, "complete": True}
        rec.update(self.counts)
        self.emit(rec)
        self.out.flush()

    # -- one log dir
    def probe_logdir(self, logdir):
        self.counts["logdirs"] += 1
        rec = {
            "kind": "logdir",
            "logdir": logdir,
            "path": logdir,
            "realpath": None,
            "exists": False,
            "error": None,
            "meta": None,
            "meta_error": None,
            "clean_shutdown": None,
            "clean_shutdown_broker_epoch": None,
            "lock_present": None,
            "lock_held_by_pid": None,
            "kraft": None,
            "checkpoints": {},
            "partition_dirs": 0,
            "other_entries": 0,
        }
        try:
            st = os.stat(logdir)
        except OSError as e:
            rec["error"] = "cannot open log dir %s: %s" % (logdir, _err(e))
            self.emit(rec)
            return
        if not stat.S_ISDIR(st.st_mode):
            rec["error"] = "log dir %s is not a directory" % logdir
            self.emit(rec)
            return
        rec["exists"] = True
        root = os.path.realpath(logdir)
        rec["realpath"] = root
        try:
            entries = sorted(os.scandir(logdir), key=lambda e: e.name)
        except OSError as e:
            rec["error"] = "cannot list log dir %s: %s" % (logdir, _err(e))
            self.emit(rec)
            return
        partition_entries = []  # names only: a DirEntry per partition would be kept for the whole log dir
        files = []
        for e in entries:
            name = e.name
            if name in (META_PROPERTIES, CLEAN_SHUTDOWN_FILE, LOCK_FILE) or name in OFFSET_CHECKPOINT_FILES:
                files.append(e)
                continue
            try:
                is_dir = e.is_dir(follow_symlinks=False)
                is_link = e.is_symlink()
            except OSError:
                is_dir = is_link = False
            if is_link:
                target_inside, _target = self._link_inside(e.path, root)
                if target_inside and os.path.isdir(e.path) and parse_partition_dir_name(name):
                    partition_entries.append(name)
                else:
                    files.append(e)
                continue
            if is_dir and parse_partition_dir_name(name):
                partition_entries.append(name)
            else:
                files.append(e)
        del entries
        rec["partition_dirs"] = len(partition_entries)
        rec["lock_present"] = os.path.lexists(os.path.join(logdir, LOCK_FILE))
        rec["clean_shutdown"] = os.path.lexists(os.path.join(logdir, CLEAN_SHUTDOWN_FILE))
        # log-dir level files, parsed first so partition records can carry their checkpoint values
        cp_values = {}
        for e in files:
            self._logdir_file(logdir, root, e, rec, cp_values)
        if self.locks is not None and rec["lock_present"]:
            try:
                lst = os.stat(os.path.join(logdir, LOCK_FILE))
                key = (os.major(lst.st_dev), os.minor(lst.st_dev), lst.st_ino)
                rec["lock_held_by_pid"] = self.locks.get(key)
            except OSError:
                pass
        rec["kraft"] = bool(
            (rec["meta"] and rec["meta"].get("version") == 1)
            or any(name == "__cluster_metadata-0" for name in partition_entries)
        )
        self.emit(rec)
        self._probe_partitions(logdir, root, partition_entries, cp_values)

    def _probe_partition_safe(self, logdir, root, e, cp_values):
        if isinstance(e, str):  # a name from probe_logdir
            e = _PartitionDir(logdir, e)
        try:
            self.probe_partition(logdir, root, e, cp_values)
        except Exception as ex:  # the safety net: never crash, never skip silently
            self.emit(
                {
                    "kind": "partition",
                    "logdir": logdir,
                    "path": e.path,
                    "dir": e.name,
                    "error": "probe failed on %s: %s" % (e.path, _err(ex)),
                }
            )

    # -- the partitions of a log dir, in name order, over `jobs` processes
    def _probe_partitions(self, logdir, root, entries, cp_values):
        """Probe the partition dirs in order. With jobs > 1, partition i is probed by process
        i % jobs: this one (0) or a forked worker that sends its records through a pipe; this
        process writes every record, in the same order and bytes as a single process would.
        Worker k runs ahead of the writer by at most its pipe's capacity."""
        jobs = min(self.jobs, len(entries))
        if jobs < 2 or not _fork_ok():
            for e in entries:
                self._probe_partition_safe(logdir, root, e, cp_values)
            return
        self.out.flush()
        workers = {}  # k -> (pid, read end as a buffered file)
        try:
            for k in range(1, jobs):
                try:
                    r, w = os.pipe()
                except OSError:
                    break
                _grow_pipe(w)
                try:
                    pid = os.fork()
                except OSError:
                    os.close(r)
                    os.close(w)
                    break
                if pid == 0:  # worker: never returns
                    status = 1
                    try:
                        os.close(r)
                        for _pid, f in workers.values():
                            f.close()
                        self._partition_worker(w, logdir, root, entries, cp_values, k, jobs)
                        status = 0
                    finally:
                        os._exit(status)
                os.close(w)
                workers[k] = (pid, os.fdopen(r, "rb", 1 << 16))
            for i, e in enumerate(entries):
                worker = workers.get(i % jobs)
                if worker is None:
                    self._probe_partition_safe(logdir, root, e, cp_values)
                    continue
                done, relayed = self._relay_partition(worker[1])
                if done:
                    continue
                # the worker died: take its remaining partitions over
                _end_worker(*workers.pop(i % jobs))
                if relayed is None:
                    self._probe_partition_safe(logdir, root, e, cp_values)
                    continue
                # what it printed of this partition counts (its counts come only with a partition's end)
                for key, n in relayed.items():
                    self.counts[key] += n
                if not relayed["partitions"]:  # the partition record was not printed: one reports the failure
                    if isinstance(e, str):
                        e = _PartitionDir(logdir, e)
                    self.counts["partitions"] += 1
                    self.emit(
                        {
                            "kind": "partition",
                            "logdir": logdir,
                            "path": e.path,
                            "dir": e.name,
                            "error": "probe failed on %s: worker process %d ended mid-partition" % (e.path, worker[0]),
                        }
                    )
        finally:
            for pid, f in workers.values():
                _end_worker(pid, f)

    def _partition_worker(self, fd, logdir, root, entries, cp_values, k, jobs):
        out = self.out = _FrameWriter(fd)
        keys = _COUNT_KEYS
        counts = self.counts
        before = [counts[x] for x in keys]
        for i in range(k, len(entries), jobs):
            self._probe_partition_safe(logdir, root, entries[i], cp_values)
            now = [counts[x] for x in keys]
            out.end_partition([a - b for a, b in zip(now, before)])
            before = now

    def _relay_partition(self, f):
        """Copy one partition's records from a worker; returns (complete, None when nothing was copied, else
        the records copied by count key). Frames hold whole records (a worker writes a record in one call).
        The worker's counts come with the partition's end, so the records copied are counted only when it
        never comes: the frames are kept until then (a big partition's are counted every few MiB instead)."""
        copied = None  # counts of the frames no longer kept
        kept, kept_bytes = [], 0
        raw = getattr(self.out, "buffer", None)
        if raw is not None:
            self.out.flush()
        while True:
            head = f.read(_FRAME.size)
            if len(head) < _FRAME.size:
                break
            kind, n = _FRAME.unpack(head)
            payload = f.read(n)
            if len(payload) < n:
                break
            if kind == b"D":
                if raw is not None:
                    raw.write(payload)
                else:
                    self.out.write(payload.decode("utf-8"))
                if copied is None:
                    copied = dict.fromkeys(_COUNT_KEYS, 0)
                kept.append(payload)
                kept_bytes += len(payload)
                if kept_bytes > _RELAY_KEEP_BYTES:
                    for data in kept:
                        _count_relayed(data, copied)
                    kept, kept_bytes = [], 0
            elif kind == b"P":
                for key, delta in zip(_COUNT_KEYS, _COUNTS.unpack(payload)):
                    self.counts[key] += delta
                return True, copied
            else:
                break
        for data in kept:
            _count_relayed(data, copied)
        return False, copied

    def _link_inside(self, path, root):
        try:
            target = os.path.realpath(path)
        except OSError:
            return False, None
        return (target == root or target.startswith(root + os.sep)), target

    def _logdir_file(self, logdir, root, e, rec, cp_values):
        name, path = e.name, e.path
        try:
            if e.is_symlink():
                inside, target = self._link_inside(path, root)
                if not inside:
                    self.file_record(
                        logdir,
                        path,
                        "symlink",
                        symlink_target=target,
                        error="symlink %s points outside the log dir (%s); not followed" % (path, target),
                    )
                    return
            if e.is_dir() and name not in _LOGDIR_FILES:
                self.file_record(logdir, path, "unknown_dir", name=name)
                rec["other_entries"] += 1
                return
            fields = self._stat_fields(path)
        except OSError as ex:
            self.file_record(logdir, path, "unknown", error="cannot stat %s: %s" % (path, _err(ex)))
            return
        if name == META_PROPERTIES:
            try:
                meta = parse_meta_properties(_read_small(path), path)
                rec["meta"] = meta
                self.file_record(logdir, path, "meta_properties", meta=meta, **fields)
            except Exception as ex:
                rec["meta_error"] = "%s: %s" % (path, _err(ex))
                self.file_record(logdir, path, "meta_properties", error=rec["meta_error"], **fields)
        elif name == CLEAN_SHUTDOWN_FILE:
            content = None
            err = None
            try:
                data = _read_small(path)
                if data.strip():
                    content = json.loads(data.decode("utf-8"))
                    if isinstance(content, dict):
                        rec["clean_shutdown_broker_epoch"] = content.get("brokerEpoch")
            except Exception as ex:
                err = "%s: %s" % (path, _err(ex))
            self.file_record(logdir, path, "clean_shutdown", content=content, error=err, **fields)
        elif name == LOCK_FILE:
            self.file_record(logdir, path, "lock", **fields)
        elif name in OFFSET_CHECKPOINT_FILES or (name.endswith(".tmp") and name[:-4] in OFFSET_CHECKPOINT_FILES):
            cp = name[:-4] if name.endswith(".tmp") else name
            try:
                entries, version = parse_offset_checkpoint(_read_small(path, 64 << 20), path)
                err = None
            except Exception as ex:
                entries, version = None, None
                err = str(ex) if isinstance(ex, ValueError) else "%s: %s" % (path, _err(ex))
            if not name.endswith(".tmp"):
                rec["checkpoints"][cp] = {"entries": None if entries is None else len(entries), "error": err}
                if entries:
                    i = OFFSET_CHECKPOINT_FILES.index(cp)
                    for topic, part, off in entries:
                        values = cp_values.get((topic, part))
                        if values is None:
                            values = cp_values[(topic, part)] = [None, None, None, None]
                        values[i] = off
            self.file_record(
                logdir,
                path,
                "offset_checkpoint",
                checkpoint=cp,
                temporary=name.endswith(".tmp"),
                version=version,
                entries=entries,
                error=err,
                **fields,
            )
        elif name == "bootstrap.checkpoint":
            self.file_record(logdir, path, "bootstrap_checkpoint", **fields)
        else:
            rec["other_entries"] += 1
            self.file_record(logdir, path, "unknown", name=name, **fields)

    # -- one partition dir
    def probe_partition(self, logdir, root, pentry, cp_values):
        self.counts["partitions"] += 1
        pdir = pentry.path
        info = parse_partition_dir_name(pentry.name)
        prec = {
            "kind": "partition",
            "logdir": logdir,
            "path": pdir,
            "dir": pentry.name,
            "topic": info["topic"],
            "partition": info["partition"],
            "dir_state": info["dir_state"],
            "dir_uid": info["dir_uid"],
            "topic_id": None,
            "partition_metadata_present": False,
            "partition_metadata_version": None,
            "partition_metadata_error": None,
            "leader_epochs": None,
            "leader_epoch_present": False,
            "leader_epoch_error": None,
            "latest_leader_epoch": None,
            "segment_count": 0,
            "log_start_segment_offset": None,
            "active_base_offset": None,
            "size_bytes": 0,
            "producer_snapshots": [],
            "recovery_point": None,
            "log_start_offset": None,
            "high_watermark": None,
            "cleaner_offset": None,
            "leftover_files": 0,
            "error": None,
        }
        # cp_values: (topic, partition) -> values in OFFSET_CHECKPOINT_FILES order
        # a -future log is checkpointed in its own log dir under the same topic-partition key
        cps = cp_values.get((info["topic"], info["partition"])) if info["dir_state"] in ("live", "future") else None
        if cps is not None:
            prec["recovery_point"], prec["log_start_offset"], prec["high_watermark"], prec["cleaner_offset"] = cps
        try:
            names = list(os.scandir(pdir))
        except OSError as ex:
            prec["error"] = "cannot list partition dir %s: %s" % (pdir, _err(ex))
            self.emit(prec)
            return
        try:
            dfd = os.open(pdir, _O_RDONLY | _O_DIRECTORY)  # its files are opened relative to it
        except OSError:
            dfd = None
        try:
            self._partition_entries(logdir, root, pdir, info, prec, names, dfd)
        finally:
            if dfd is not None:
                try:
                    os.close(dfd)
                except OSError:  # the partition record is out: the safety net must not print a second one
                    pass

    def _partition_entries(self, logdir, root, pdir, info, prec, names, dfd):
        """probe_partition after listing the dir: its files, its segments, its record."""
        if not self.deep and dfd is not None and self._usual_partition(logdir, root, pdir, info, prec, names, dfd):
            return
        names.sort(key=_entry_name)
        segments = {}
        last_prefix = files = fctx = None
        for e in names:
            name = e.name
            ext = name[21:]
            if ext in _SEGMENT_EXTENSION_SET and name[20:21] == ".":
                # fast path of parse_segment_file_name for a plain segment file (same result); the
                # files of one segment are adjacent in name order
                prefix = name[:20]
                if prefix == last_prefix:
                    files[ext] = e
                    continue
                if _DIGITS20.match(prefix):
                    last_prefix = prefix
                    files = segments.setdefault(int(prefix), {})
                    files[ext] = e
                    continue
            parsed = parse_segment_file_name(name)
            if parsed is not None and parsed[2] is None and parsed[1] != "snapshot":
                segments.setdefault(parsed[0], {})[parsed[1]] = e
                continue
            if fctx is None:
                fctx = (
                    _j(logdir),
                    ',"partition_dir":%s,"topic":%s,"partition":%d'
                    % (_j(prec["dir"]), _j(prec["topic"]), prec["partition"]),
                )
            self._partition_file_fast(logdir, root, prec, e, parsed, fctx, dfd)
        bases = sorted(segments)
        prec["segment_count"] = len(bases)
        if bases:
            prec["log_start_segment_offset"] = bases[0]
            prec["active_base_offset"] = bases[-1]
        deep_totals = {
            "batch_count": 0,
            "record_count": 0,
            "log_end_offset": None,
            "max_timestamp": None,
            "torn_segments": 0,
            "crc_errors": 0,
            "uncounted_batches": 0,
        }
        seg_ctx = '{"kind":"segment","logdir":%s,"path":%s,"topic":%s,"partition":%d,"base_offset":' % (
            _j(logdir),
            _j(pdir),
            _j(info["topic"]),
            info["partition"],
        )
        if self.deep:
            last = len(bases) - 1
            for i, base in enumerate(bases):
                line, seg_bytes = self.probe_segment(seg_ctx, pdir, root, base, segments[base], i == last, deep_totals)
                prec["size_bytes"] += seg_bytes
                self.out.write(line)
        else:
            prec["size_bytes"] += self._metadata_segments(seg_ctx, pdir, root, bases, segments, dfd)
        if self.deep:
            leo = deep_totals["log_end_offset"]
            if leo is None and bases:
                leo = bases[-1]  # every segment empty: LEO is the active segment's base offset
            prec["log_end_offset"] = leo
            prec["batch_count"] = deep_totals["batch_count"]
            prec["record_count"] = deep_totals["record_count"]
            prec["max_timestamp"] = deep_totals["max_timestamp"]
            prec["torn_segments"] = deep_totals["torn_segments"]
            prec["crc_errors"] = deep_totals["crc_errors"]
            prec["uncounted_batches"] = deep_totals["uncounted_batches"]
        self.emit(prec)

    def _usual_partition(self, logdir, root, pdir, info, prec, entries, dfd):
        """Metadata mode's _partition_entries for a partition dir of regular files only, whose
        segment files are complete <base>.index, <base>.log, <base>.timeindex triples (the usual
        case); returns False, having done nothing, for any other. entries: its listing, unsorted.
        The same records in the same order: the other files in name order, the segments in
        base-offset order (in batches of system calls, see _usual_segments), the partition.
        The layout is judged by _LAYOUT_RE over the sorted names, without a loop over them."""
        try:
            if any(map(_IS_SYMLINK, entries)) or not all(map(_IS_FILE, entries)):
                return False
        except OSError:
            return False
        raw = [e.name for e in entries]
        listed = sorted(raw)
        listing = "\n".join(listed)
        if listing.count("\n") != len(listed) - 1:  # a name holds a newline
            return False
        layout = _LAYOUT_RE.findall(listing + "\n")
        if any(map(_GROUPS[2], layout)):
            return False
        prefixes = list(filter(None, map(_GROUPS[0], layout)))
        others = list(filter(None, map(operator.add, map(_GROUPS[1], layout), map(_GROUPS[3], layout))))
        if others:
            fctx = (
                _j(logdir),
                ',"partition_dir":%s,"topic":%s,"partition":%d'
                % (_j(prec["dir"]), _j(prec["topic"]), prec["partition"]),
            )
            for name in others:
                e = entries[raw.index(name)]
                self._partition_file_fast(logdir, root, prec, e, parse_segment_file_name(name), fctx, dfd)
        bases = list(map(int, prefixes))
        prec["segment_count"] = len(bases)
        if bases:
            prec["log_start_segment_offset"] = bases[0]
            prec["active_base_offset"] = bases[-1]
            ctx = '{"kind":"segment","logdir":%s,"path":%s,"topic":%s,"partition":%d,"base_offset":' % (
                _j(logdir),
                _j(pdir),
                _j(info["topic"]),
                info["partition"],
            )
            prec["size_bytes"] += self._usual_segments(ctx, pdir, root, prefixes, bases, entries, raw, dfd)
        if prec["error"]:
            self.counts["errors"] += 1
        self.out.write(_partition_line(prec))
        return True

    def _usual_segments(self, ctx, pdir, root, prefixes, bases, entries, raw, dfd):
        """The segment records of _usual_partition, written in batches; returns their bytes. A batch
        that fails anywhere (a file gone or changed since the listing) is redone segment by segment
        by probe_segment, which reports what went wrong."""
        total = 0
        n = len(bases)
        for lo in range(0, n, _FAST_CHUNK):
            hi = min(n, lo + _FAST_CHUNK)
            try:
                done = _usual_batch(ctx, prefixes[lo:hi], bases[lo:hi], hi == n, dfd)
            except Exception:
                done = None
            if done is None:
                lines = []
                size = 0
                for i in range(lo, hi):
                    files = {ext: entries[raw.index(prefixes[i] + "." + ext)] for ext in ("index", "log", "timeindex")}
                    line, seg_bytes = self.probe_segment(ctx, pdir, root, bases[i], files, i == n - 1, None)
                    lines.append(line)
                    size += seg_bytes
            else:
                lines, size = done
                self.counts["segments"] += hi - lo
            total += size
            self.out.write("".join(lines))
        return total

    def _partition_file_fast(self, logdir, root, prec, e, parsed, fctx, dfd):
        """_partition_file's records for a partition's usual files (a regular partition.metadata,
        leader-epoch-checkpoint or producer snapshot that reads without error), formatted
        directly; everything else, and any error, goes through _partition_file. dfd is the
        partition dir, open (or None)."""
        name = e.name
        if parsed is not None:
            kind = 1 if parsed[1] == "snapshot" and parsed[2] is None else 0
        else:
            kind = 2 if name == PARTITION_METADATA else 3 if name == LEADER_EPOCH_CHECKPOINT else 0
        line = None
        if kind and dfd is not None and e.is_file(follow_symlinks=False):
            path = e.path
            try:
                if kind == 1:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)  # = e.stat(): not a link
                    if stat.S_ISREG(st.st_mode):
                        size, mtime = st.st_size, int(st.st_mtime * 1000)
                        line = _SNAPSHOT_RECORD % (fctx[0], _j(path), parsed[0], fctx[1], size, mtime)
                else:
                    # = e.stat() and _read_small(path): fstat gives the size, one read the bytes
                    fd = os.open(name, _O_RDONLY, dir_fd=dfd)
                    try:
                        st = os.fstat(fd)
                        size = st.st_size
                        data = os.read(fd, size + 1) if stat.S_ISREG(st.st_mode) and size < 1 << 20 else None
                    finally:
                        os.close(fd)
                    if data is not None and len(data) <= size:
                        mtime = int(st.st_mtime * 1000)
                        if kind == 2:
                            pm = parse_partition_metadata(data, path)
                            line = _PARTITION_METADATA_RECORD % (
                                fctx[0],
                                _j(path),
                                _j(pm["topic_id"]),
                                pm["version"],
                                fctx[1],
                                size,
                                mtime,
                            )
                        else:
                            eps = parse_leader_epoch_checkpoint(data, path)
                            line = _LEADER_EPOCH_RECORD % (
                                fctx[0],
                                _j(path),
                                _JSON_ENCODE(eps),
                                fctx[1],
                                size,
                                mtime,
                            )
            except Exception:
                line = None
        if line is None:
            self._partition_file(logdir, root, prec, e, parsed)
            return
        prec["size_bytes"] += size
        if kind == 1:
            prec["producer_snapshots"].append(parsed[0])
        elif kind == 2:
            prec["partition_metadata_present"] = True
            prec["topic_id"] = pm["topic_id"]
            prec["partition_metadata_version"] = pm["version"]
        else:
            prec["leader_epoch_present"] = True
            prec["leader_epochs"] = eps
            prec["latest_leader_epoch"] = eps[-1][0] if eps else None
        self.counts["files"] += 1
        self.out.write(line)

    def _partition_file(self, logdir, root, prec, e, parsed):
        name, path = e.name, e.path
        try:
            if e.is_symlink():
                inside, target = self._link_inside(path, root)
                if not inside:
                    self.file_record(
                        logdir,
                        path,
                        "symlink",
                        partition_dir=prec["dir"],
                        symlink_target=target,
                        error="symlink %s points outside the log dir (%s); not followed" % (path, target),
                    )
                    return
            if e.is_dir() and name not in _PARTITION_FILES:
                self.file_record(logdir, path, "unknown_dir", partition_dir=prec["dir"], name=name)
                return
            fields = self._stat_fields(path)
        except OSError as ex:
            self.file_record(
                logdir, path, "unknown", partition_dir=prec["dir"], error="cannot stat %s: %s" % (path, _err(ex))
            )
            return
        prec["size_bytes"] += fields["bytes"]
        common = {"partition_dir": prec["dir"], "topic": prec["topic"], "partition": prec["partition"]}
        if name == PARTITION_METADATA:
            prec["partition_metadata_present"] = True
            try:
                pm = parse_partition_metadata(_read_small(path), path)
                prec["topic_id"] = pm["topic_id"]
                prec["partition_metadata_version"] = pm["version"]
                self.file_record(
                    logdir,
                    path,
                    "partition_metadata",
                    topic_id=pm["topic_id"],
                    version=pm["version"],
                    **dict(common, **fields),
                )
            except Exception as ex:
                prec["partition_metadata_error"] = (
                    str(ex) if isinstance(ex, ValueError) else "%s: %s" % (path, _err(ex))
                )
                self.file_record(
                    logdir, path, "partition_metadata", error=prec["partition_metadata_error"], **dict(common, **fields)
                )
        elif name == LEADER_EPOCH_CHECKPOINT:
            prec["leader_epoch_present"] = True
            try:
                eps = parse_leader_epoch_checkpoint(_read_small(path, 16 << 20), path)
                prec["leader_epochs"] = eps
                prec["latest_leader_epoch"] = eps[-1][0] if eps else None
                self.file_record(logdir, path, "leader_epoch_checkpoint", entries=eps, **dict(common, **fields))
            except Exception as ex:
                prec["leader_epoch_error"] = str(ex) if isinstance(ex, ValueError) else "%s: %s" % (path, _err(ex))
                self.file_record(
                    logdir, path, "leader_epoch_checkpoint", error=prec["leader_epoch_error"], **dict(common, **fields)
                )
        elif parsed is not None and parsed[1] == "snapshot" and parsed[2] is None:
            prec["producer_snapshots"].append(parsed[0])
            self.file_record(logdir, path, "producer_snapshot", base_offset=parsed[0], **dict(common, **fields))
        elif parsed is not None and parsed[2] is not None:
            prec["leftover_files"] += 1
            self.file_record(
                logdir,
                path,
                "segment_leftover",
                base_offset=parsed[0],
                segment_file=parsed[1],
                leftover=parsed[2],
                **dict(common, **fields),
            )
        elif name == QUORUM_STATE:
            content, err = None, None
            try:
                content = json.loads(_read_small(path).decode("utf-8"))
            except Exception as ex:
                err = "%s: %s" % (path, _err(ex))
            self.file_record(logdir, path, "quorum_state", content=content, error=err, **dict(common, **fields))
        else:
            m = KRAFT_SNAPSHOT_RE.match(name)
            if m:
                self.file_record(
                    logdir,
                    path,
                    "kraft_snapshot",
                    end_offset=int(m.group(1)),
                    epoch=int(m.group(2)),
                    state=m.group(3),
                    **dict(common, **fields),
                )
            else:
                self.file_record(logdir, path, "unknown", name=name, **dict(common, **fields))

    # -- one segment (hot path: one record per segment, formatted directly)
    def probe_segment(self, ctx, pdir, root, base, files, is_active, totals):
        """Return (the segment's JSON line, its bytes on disk). ctx is the record's constant head
        (kind to partition, up to "base_offset":)."""
        self.counts["segments"] += 1
        errors = []
        log_bytes = log_mtime = None
        e = files.get("log")
        if e is not None:
            try:
                if e.is_symlink() and not self._link_inside(e.path, root)[0]:
                    errors.append("symlink %s points outside the log dir; not followed" % e.path)
                    e = None
                else:
                    st = e.stat()
                    if not stat.S_ISREG(st.st_mode):
                        errors.append("%s is not a regular file" % e.path)
                        e = None
                    else:
                        log_bytes = st.st_size
                        log_mtime = int(st.st_mtime * 1000)
            except OSError as ex:
                errors.append("cannot stat %s: %s" % (e.path, _err(ex)))
                e = None
        ie = files.get("index")
        te = files.get("timeindex")
        if self.deep:
            oi = self._index(ie, OFFSET_INDEX_ENTRY, root, errors)
            ti = self._index(te, TIME_INDEX_ENTRY, root, errors)
            if oi is not None:
                oi = _summary_tuple(oi)
            if ti is not None:
                ti = _summary_tuple(ti)
        else:
            oi = None if ie is None else self._index_head(ie, OFFSET_INDEX_ENTRY, root, errors)
            ti = None if te is None else self._index_head(te, TIME_INDEX_ENTRY, root, errors)
        txn = files.get("txnindex")
        txn_bytes = None
        if txn is not None:
            try:
                txn_bytes = txn.stat().st_size
            except OSError as ex:
                errors.append("cannot stat %s: %s" % (txn.path, _err(ex)))
        parts = [
            ctx,
            _SEGMENT_FIELDS
            % (
                base,
                "true" if is_active else "false",
                "false" if log_bytes is None else "true",
                "null" if log_bytes is None else log_bytes,
                "null" if log_mtime is None else log_mtime,
                "false" if txn is None else "true",
                "null" if txn_bytes is None else txn_bytes,
            ),
        ]
        size = (log_bytes or 0) + (txn_bytes or 0)
        if oi is None:
            parts.append(_INDEX_MISSING if ie is None else _INDEX_UNREADABLE)
        else:
            size += oi[0]
            first, last = oi[5], oi[6]
            parts.append(
                _INDEX_FIELDS
                % (
                    oi[0],
                    oi[1],
                    oi[2],
                    oi[3],
                    _BOOL_JSON[oi[4]],
                    oi[7],
                    "null" if oi[8] is None else oi[8],
                    "null" if first is None else base + first[0],
                    "null" if last is None else base + last[0],
                    "null" if last is None else last[1],
                )
            )
        if ti is None:
            parts.append(_TIMEINDEX_MISSING if te is None else _TIMEINDEX_UNREADABLE)
        else:
            size += ti[0]
            first, last = ti[5], ti[6]
            parts.append(
                _TIMEINDEX_FIELDS
                % (
                    ti[0],
                    ti[1],
                    ti[2],
                    ti[3],
                    _BOOL_JSON[ti[4]],
                    ti[7],
                    "null" if ti[8] is None else ti[8],
                    "null" if first is None else first[0],
                    "null" if last is None else last[0],
                    "null" if last is None else base + last[1],
                )
            )
        if self.deep:
            parts.append(self._deep_segment(e, base, ie, root, errors, totals))
        if errors:
            self.counts["errors"] += 1
            parts.append(',"error":%s}\n' % _j("; ".join(errors)))
        else:
            parts.append(',"error":null}\n')
        return "".join(parts), size

    def _metadata_segments(self, ctx, pdir, root, bases, segments, dfd):
        """Metadata mode over a partition's segments, in base-offset order; returns their bytes.

        The usual segment (.log, .index and .timeindex, all regular files by their directory
        entries, no .txnindex) is done here, inline; anything else, or any error, goes through
        probe_segment, which gives the same record for the usual case (this is only its fast
        path). The usual index is trimmed, at most HEAD_READ_BYTES long, its last entry not zero
        and its entries in order; other indexes go through _index_values_from."""
        out_write = self.out.write
        counts = self.counts
        os_open, pread, close, os_stat, s_isreg = os.open, os.pread, os.close, os.stat, stat.S_ISREG
        rdonly, head_bytes, read_bytes = _O_RDONLY, HEAD_READ_BYTES, HEAD_READ_BYTES + 1
        lt, le = operator.lt, operator.le
        split = _split_fields
        OI, TI = OFFSET_INDEX_ENTRY, TIME_INDEX_ENTRY
        osplit, tsplit = _SPLIT[OI.size], _SPLIT[TI.size]
        clean_fmt, full_fmt = _CLEAN_SEGMENT, _FAST_SEGMENT
        total = 0
        lines = []
        last = len(bases) - 1
        # segment files are opened and stat'ed relative to the partition dir (dfd): shorter path walks
        for i, base in enumerate(bases):
            files = segments[base]
            line = None
            if len(files) == 3 and dfd is not None:
                lf = files.get("log")
                xf = files.get("index")
                tf = files.get("timeindex")
                if (
                    lf is not None
                    and xf is not None
                    and tf is not None
                    and not lf.is_symlink()
                    and xf.is_file(follow_symlinks=False)
                    and tf.is_file(follow_symlinks=False)
                ):
                    try:
                        st = os_stat(lf.name, dir_fd=dfd, follow_symlinks=False)  # = lf.stat(): not a link
                        if s_isreg(st.st_mode):
                            oi = ti = None
                            fd = os_open(xf.name, rdonly, dir_fd=dfd)
                            try:
                                xb = pread(fd, read_bytes, 0)
                                xn = len(xb)
                                if not (0 < xn <= head_bytes and not xn & 7 and xb[-8:].strip(b"\0")):
                                    oi = _index_values_from(fd, xb, base, OI, True)
                            finally:
                                close(fd)
                            fd = os_open(tf.name, rdonly, dir_fd=dfd)
                            try:
                                tb = pread(fd, read_bytes, 0)
                                tn = len(tb)
                                if not (0 < tn <= head_bytes and not tn % 12 and tb[-12:].strip(b"\0")):
                                    ti = _index_values_from(fd, tb, base, TI, False)
                            finally:
                                close(fd)
                            head = (base, "true" if i == last else "false", st.st_size, int(st.st_mtime * 1000))
                            if oi is None and ti is None:
                                sp = osplit.get(xn)
                                if sp is None:
                                    a, b = split(OI, xb)
                                else:
                                    a, b = sp[0](xb), sp[1](xb)
                                sp = tsplit.get(tn)
                                if sp is None:
                                    c, d = split(TI, tb)
                                else:
                                    c, d = sp[0](tb), sp[1](tb)
                                if (
                                    all(map(lt, a, a[1:]))
                                    and all(map(le, b, b[1:]))
                                    and all(map(le, c, c[1:]))
                                    and all(map(le, d, d[1:]))
                                ):
                                    n, m = len(a), len(c)
                                    line = ctx + clean_fmt % (
                                        head
                                        + (xn, n, n, base + a[0], base + a[-1], b[-1])
                                        + (tn, m, m, c[0], c[-1], base + d[-1])
                                    )
                                    seg_bytes = st.st_size + xn + tn
                            if line is None:
                                if oi is None:
                                    oi = _index_values_from(None, xb, base, OI, True)
                                if ti is None:
                                    ti = _index_values_from(None, tb, base, TI, False)
                                if oi is not None and ti is not None:  # None: not a regular file
                                    if len(oi) == 6:
                                        oi = _clean_to_full(oi)
                                    if len(ti) == 6:
                                        ti = _clean_to_full(ti)
                                    line = ctx + full_fmt % (head + oi + ti)
                                    seg_bytes = st.st_size + oi[0] + ti[0]
                    except Exception:
                        line = None  # redone by probe_segment, which reports the error
            if line is None:
                line, seg_bytes = self.probe_segment(ctx, pdir, root, base, files, i == last, None)
            else:
                counts["segments"] += 1
            total += seg_bytes
            lines.append(line)
            if len(lines) >= 256:  # one write per batch of records; bounded per-partition state
                out_write("".join(lines))
                del lines[:]
        if lines:
            out_write("".join(lines))
        return total

    def _index_head(self, e, entry_struct, root, errors):
        """Metadata-mode summary of one index as a tuple (see _summary_tuple), or None after
        recording an error. Same result as _index + read_index_summary, with fewer system calls:
        a regular file (known from the directory entry) is opened and read once from offset 0,
        and a read shorter than asked for gives its size without an fstat."""
        if not e.is_file(follow_symlinks=False):  # symlink or not a regular file: the general path
            s = self._index(e, entry_struct, root, errors)
            return None if s is None else _summary_tuple(s)
        try:
            s = _index_head_summary(e.path, entry_struct)
        except Exception as ex:
            errors.append("cannot read %s: %s" % (e.path, _err(ex)))
            return None
        if s is None:
            errors.append("%s is not a regular file" % e.path)
        return s

    def _index(self, e, entry_struct, root, errors):
        if e is None:
            return None
        try:
            if e.is_symlink() and not self._link_inside(e.path, root)[0]:
                errors.append("symlink %s points outside the log dir; not followed" % e.path)
                return None
            fd = os.open(e.path, _O_RDONLY)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    errors.append("%s is not a regular file" % e.path)
                    return None
                return read_index_summary(e.path, entry_struct, full=self.deep, fd=fd, size=st.st_size)
            finally:
                os.close(fd)
        except Exception as ex:
            errors.append("cannot read %s: %s" % (e.path, _err(ex)))
            return None

    def _deep_segment(self, log_entry, base, index_entry, root, errors, totals):
        if log_entry is None:
            return ',"deep":null'
        matcher = None
        if index_entry is not None and not (
            index_entry.is_symlink() and not self._link_inside(index_entry.path, root)[0]
        ):
            try:
                matcher = _IndexMatcher(iter_index_entries(index_entry.path, OFFSET_INDEX_ENTRY), base)
            except Exception as ex:
                errors.append("cannot read %s: %s" % (index_entry.path, _err(ex)))
        try:
            w = walk_log(log_entry.path, base, self.verify_crc, matcher.on_batch if matcher else None)
            if matcher is not None:
                matcher.finish()
        except Exception as ex:
            errors.append("cannot read %s: %s" % (log_entry.path, _err(ex)))
            return ',"deep":null'
        totals["batch_count"] += w["batch_count"]
        totals["record_count"] += w["record_count"]
        totals["uncounted_batches"] += w["uncounted_batches"]
        if w["next_offset"] is not None:
            totals["log_end_offset"] = max(totals["log_end_offset"] or 0, w["next_offset"])
        if w["max_timestamp"] is not None:
            totals["max_timestamp"] = max(totals["max_timestamp"] or w["max_timestamp"], w["max_timestamp"])
        if w["torn_tail"]:
            totals["torn_segments"] += 1
        totals["crc_errors"] += w["crc_errors"]
        if matcher is not None:
            w["index_checked"] = matcher.checked
            w["index_not_batch_start"] = matcher.not_batch_start
            w["index_offset_before_batch"] = matcher.offset_outside_batch
            w["index_offset_after_batch"] = matcher.offset_after_batch
            w["index_beyond_log"] = matcher.beyond_log
            w["index_mismatch_examples"] = matcher.examples
        out = []
        for k, v in w.items():
            out.append(",%s:%s" % (_j(k), json.dumps(v, separators=(",", ":"))))
        return "".join(out)


# --------------------------------------------------------------------------------------------
def discover_logdirs(roots, max_depth=4):
    """Find Kafka log dirs under roots: directories holding meta.properties or a
    recovery-point-offset-checkpoint. Symlinks are not followed."""
    found = []
    for root in roots:
        stack = [(root, 0)]
        while stack:
            d, depth = stack.pop()
            try:
                names = os.listdir(d)
            except OSError:
                continue
            if META_PROPERTIES in names or "recovery-point-offset-checkpoint" in names:
                found.append(d)
                continue
            if depth >= max_depth:
                continue
            for n in sorted(names, reverse=True):
                p = os.path.join(d, n)
                if os.path.isdir(p) and not os.path.islink(p):
                    stack.append((p, depth + 1))
    return sorted(found)


def default_jobs():
    """Processes for the partitions of a log dir: 2 where there are 2 CPUs or more."""
    return max(1, min(DEFAULT_JOBS, os.cpu_count() or 1))


USAGE = """usage: probe.py [--deep] [--verify-crc] [--discover] [--jobs N] LOGDIR...

Walk Kafka log dirs and print JSON Lines facts (schema: docs/probe-schema.md).
  --deep        also walk .log batch headers and check offset-index entries against them
  --verify-crc  deep, and check every batch CRC (CRC-32C for v2, CRC-32 for v0/v1)
  --discover    treat each PATH as a tree and probe every log dir found beneath it
  --jobs N      probe partitions in N processes (default: 2, or 1 on a single CPU); the output
                is the same, in the same order
"""


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    deep = verify = discover = False
    jobs = default_jobs()
    paths = []
    while args:
        a = args.pop(0)
        if a == "--jobs" or a.startswith("--jobs="):
            value = a[len("--jobs=") :] if "=" in a else (args.pop(0) if args else "")
            if not value.isdigit() or int(value) < 1:
                sys.stderr.write("probe: --jobs takes a number >= 1\n%s" % USAGE)
                return 2
            jobs = int(value)
        elif a == "--deep":
            deep = True
        elif a == "--verify-crc":
            verify = True
        elif a == "--discover":
            discover = True
        elif a in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return 0
        elif a.startswith("--"):
            sys.stderr.write("probe: unknown option %s\n%s" % (a, USAGE))
            return 2
        else:
            paths.append(a)
    if not paths:
        sys.stderr.write(USAGE)
        return 2
    if discover:
        found = discover_logdirs(paths)
        if not found:
            sys.stderr.write("probe: no Kafka log dir (meta.properties or checkpoints) under %s\n" % ", ".join(paths))
            return 2
        paths = found
    # the objects made so far (modules, functions) live as long as the probe: keep them out of the
    # garbage collector's full passes, which would also touch every page a forked worker shares (3.7+)
    freeze = getattr(gc, "freeze", None)
    if freeze is not None:
        freeze()
    out = sys.stdout
    probe = Probe(out, deep=deep, verify_crc=verify, jobs=jobs)
    try:
        probe.run(paths)
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
