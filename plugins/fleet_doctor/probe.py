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

Why one long file: it is the program sent to each broker (``python3 -`` reads one file from stdin), so every format
it reads and every check it makes travel together; splitting it would mean bundling it again before each run.
"""

import bisect
import errno
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
# Index files. Each kind is written down once, as Kafka's OffsetIndex and TimeIndex classes own theirs: the entry
# layout, the order every entry keeps with the one before it (what their append methods enforce, ref §1.1), and the
# prefix of its fields in the segment record. Every index check here is derived from OFFSET_INDEX and TIME_INDEX.

# A summary's values (index_summary), in the order of the segment record's fields for the index
INDEX_SUMMARY_FIELDS = (
    "bytes",
    "entries",
    "zero_tail_entries",
    "remainder",
    "monotonic",
    "checked_entries",
    "first_violation",
)
HEAD_READ_BYTES = 4096  # metadata mode reads an index's head in one pread: first entries + order


def _template(fields):
    """',"f1":%s,"f2":%s...' for a record's fields: the values go in as JSON text or ints."""
    assert all(re.fullmatch(r"[a-z0-9_]+", f) for f in fields), fields  # keys that need no JSON escaping
    return "".join(',"%s":%%s' % f for f in fields)


class IndexFormat(object):
    """One index kind: its layout, its order rule (as data) and the checks derived from them."""

    def __init__(self, ext, entry, order, relative, record):
        self.ext = ext  # the file extension, and the prefix of the segment record's fields for this index
        self.entry = entry  # one entry, big-endian; two fields
        self.size = entry.size
        # per entry field, op(previous entry's value, this entry's value) holds in a valid index
        self.order = order
        self.relative = relative  # which entry field (0 or 1) is offset - baseOffset: the record shows it absolute
        # the record's fields: has_<ext>, the summary's, then `record`: first entry's field 0, last entry's 0 and 1
        self.fields = ("has_" + ext,) + tuple("%s_%s" % (ext, f) for f in INDEX_SUMMARY_FIELDS + record)
        # an index that is absent (has_<ext> false) or could not be read (true): its size fields null, no others
        self.missing, self.unreadable = (
            _template(self.fields[:4]) % (b, "null", "null", "null") for b in ("false", "true")
        )
        self._summary_template = _template(self.fields[:8])
        # the record's fields from has_<ext> on: % (the summary's text, the values of the `record` fields)
        self.text_template = "%s" + _template(self.fields[8:])
        self._summary_text = {}  # summary values -> their text, for the few sizes of a trimmed index
        self.flat = _FlatUnpack(entry)
        self.zero = bytes(self.size)  # an entry of the preallocated tail: all zero bytes
        self.last_entry = slice(-self.size, None)  # the last entry of a whole number of entries
        # the length of an index that a head holds whole, a whole number of entries -> the number
        self.whole = dict((n * self.size, n) for n in range(1, HEAD_READ_BYTES // self.size + 1))

    def ordered(self, flat, firsts=None, lasts=None):
        """Whether every entry keeps the order with the one before it. flat: the entries' fields, one after the
        other (self.flat). For the entries of several indexes one after the other, firsts and lasts: per field, its
        values in each index's first and last entry; an index's first entry is not compared with the entry before
        it, another index's last."""
        for i, op in enumerate(self.order):
            values = flat[i::2]  # this field of every entry
            kept = map(op, values[:-1], values[1:])  # per entry after the first: whether it keeps the order
            if firsts is None:
                if not all(kept):
                    return False
            # where an index begins the comparison is no check: the others hold if all that fail are those
            elif operator.countOf(kept, True) != len(values) - 1 - operator.countOf(
                map(op, lasts[i][:-1], firsts[i][1:]), False
            ):
                return False
        return True

    def first_violation(self, flat):
        """The number of the first entry that breaks the order with the one before it, or None."""
        first, second = self.order
        for i in range(2, len(flat) - 1, 2):
            if not (first(flat[i - 2], flat[i]) and second(flat[i - 1], flat[i + 1])):
                return i // 2
        return None

    def record_values(self, summaries, bases):
        """This index's fields in the segment records of segments with these base offsets, from their summaries
        (the columns SUMMARY_COLUMNS of index_summaries), as the columns that self.text_template takes: the text of
        has_<ext> and the summary, then the values of the `record` fields."""
        # a trimmed, ordered index's summary depends on its size only (the usual one: its text is kept by size)
        if summaries[4].count(True) == len(bases) and summaries[1] == summaries[5] and not any(summaries[2]):
            keys = summaries[0]
        else:
            keys = [s[0] if s[4] and s[1] == s[5] and not s[2] else s for s in zip(*summaries[:7])]
        texts = list(map(self._summary_text.get, keys))
        if None in texts:
            for i, text in enumerate(texts):
                if text is None:
                    s = tuple(values[i] for values in summaries[:7])
                    text = texts[i] = self._summary_template % (
                        ("true",) + s[:4] + (_BOOL_JSON[s[4]], s[5], _num(s[6]))
                    )
                    if s[0] <= HEAD_READ_BYTES and len(self._summary_text) < 4096:
                        self._summary_text[keys[i]] = text
        first, last, last_other = summaries[7], summaries[9], summaries[10]
        empty = None in first  # an index without real entries: null values
        if empty:
            first, last, last_other = ([0 if v is None else v for v in values] for values in (first, last, last_other))
        # the first entry's field 0, the last entry's fields 0 and 1, the relative offset made absolute
        if self.relative:
            values = [texts, first, last, list(map(operator.add, bases, last_other))]
        else:
            values = [texts, list(map(operator.add, bases, first)), list(map(operator.add, bases, last)), last_other]
        if empty:
            values[1:] = ([_num(v) if e is not None else "null" for v, e in zip(c, summaries[7])] for c in values[1:])
        return values

    def record_text(self, s, base):
        """This index's fields in the segment record, from its summary s (index_summary, index_full_summary), or
        from whether it exists when it was not read."""
        if s.__class__ is not tuple:
            return self.unreadable if s else self.missing
        return self.text_template % tuple(values[0] for values in self.record_values(_summary_columns((s,)), (base,)))


_ONES = itertools.repeat(1)


class _FlatUnpack(dict):
    """entry count -> unpack_from of that many entries of a format, giving their fields one after the other."""

    def __init__(self, entry):
        dict.__init__(self)
        self.format = _struct_format(entry)
        self.size = entry.size

    def __missing__(self, count):
        unpack = struct.Struct(self.format[0] + self.format[1:] * count).unpack_from
        if count * self.size <= HEAD_READ_BYTES:  # a head's entry counts are kept, not deep mode's chunks
            self[count] = unpack
        return unpack


def _struct_format(entry_struct):
    fmt = entry_struct.format
    return fmt.decode("ascii") if isinstance(fmt, bytes) else fmt  # bytes before Python 3.7


# Offset index: <20-digit base offset>.index, 8 bytes per entry.
# S/log/OffsetIndex.java (ENTRY_SIZE = 8; getInt(n*8), getInt(n*8+4)); C/log/OffsetIndex.scala @0.8.2.2
OFFSET_INDEX = IndexFormat(
    "index",
    struct.Struct(
        ">"
        "i"  # relativeOffset  int32  offset - baseOffset
        "i"  # position        int32  byte position of the batch in the .log
    ),
    # OffsetIndex.append refuses an offset not larger than the last one; positions follow the log, which only grows
    order=(operator.lt, operator.le),
    relative=0,
    record=("first_offset", "last_offset", "last_position"),
)
# Time index: <base>.timeindex (0.10.1.0+), 12 bytes per entry. S/log/TimeIndex.java (getLong(n*12), getInt(n*12+8))
TIME_INDEX = IndexFormat(
    "timeindex",
    struct.Struct(
        ">"
        "q"  # timestamp       int64  max timestamp seen so far (ms)
        "i"  # relativeOffset  int32  offset of that timestamp - baseOffset
    ),
    # TimeIndex.maybeAppend refuses a timestamp or an offset smaller than the last entry's
    order=(operator.le, operator.le),
    relative=1,
    record=("first_timestamp", "last_timestamp", "last_offset"),
)
OFFSET_INDEX_ENTRY, TIME_INDEX_ENTRY = OFFSET_INDEX.entry, TIME_INDEX.entry
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
# Names come from brokers: every pattern ends in \Z (a "$" also matches before a trailing newline) and is
# applied with fullmatch.
PARTITION_DIR_RE = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)\Z")
SUFFIXED_DIR_RE = re.compile(
    r"^(?P<topic>.+)-(?P<partition>\d+)\.(?P<uid>[0-9A-Za-z_-]+)-(?P<state>delete|future|stray)\Z"
)
# Segment file names: 20-digit zero-padded base offset (LogFileUtils.filenamePrefixFromOffset) plus
# an extension; ".swap", ".cleaned", ".deleted" are appended while a file is being swapped in,
# written by the cleaner, or awaiting async deletion (S/log/LogFileUtils.java).
SEGMENT_EXTENSIONS = ("log", "index", "timeindex", "txnindex")
LEFTOVER_SUFFIXES = ("swap", "cleaned", "deleted")
KRAFT_SNAPSHOT_RE = re.compile(r"^(\d{20})-(\d{10})\.checkpoint(?:\.(part|deleted))?\Z")

DEFAULT_JOBS = 2  # processes per log dir for the CLI (--jobs); forked workers, see _probe_partitions
# O_NONBLOCK: opening a FIFO planted in a log dir must not block the probe (no effect on regular files)
_O_RDONLY = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)

# files Kafka itself reads: a directory (or anything not a regular file) there is an error
_LOGDIR_FILES = (META_PROPERTIES, CLEAN_SHUTDOWN_FILE) + OFFSET_CHECKPOINT_FILES
_PARTITION_FILES = (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT, QUORUM_STATE)

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


def _slicing_tables(table):
    """The tables of slicing-by-8 (eight bytes per step): table k is the CRC of a byte followed by k zero bytes."""
    tables = [table]
    for _ in range(7):
        prev = tables[-1]
        tables.append(tuple((prev[i] >> 8) ^ table[prev[i] & 0xFF] for i in range(256)))
    return tuple(tables)


_CRC32C_SLICES = _slicing_tables(_CRC32C_TABLE)
_TWO_WORDS = struct.Struct("<II")


def crc32c(data, crc=0):
    """CRC-32C of ``data``; pass the previous result as ``crc`` to continue a stream. Eight bytes a step
    (slicing-by-8, as Java's CRC32C does in software), the last few one at a time."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _CRC32C_SLICES
    crc ^= 0xFFFFFFFF
    view = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else memoryview(data)
    whole = len(view) - len(view) % 8
    for lo, hi in _TWO_WORDS.iter_unpack(view[:whole]):
        lo ^= crc
        crc = (
            t7[lo & 0xFF]
            ^ t6[(lo >> 8) & 0xFF]
            ^ t5[(lo >> 16) & 0xFF]
            ^ t4[lo >> 24]
            ^ t3[hi & 0xFF]
            ^ t2[(hi >> 8) & 0xFF]
            ^ t1[(hi >> 16) & 0xFF]
            ^ t0[hi >> 24]
        )
    for b in view[whole:]:
        crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# --------------------------------------------------------------------------------------------
# Names
def parse_partition_dir_name(name):
    """Return {topic, partition, dir_state, dir_uid} for a partition dir name, or None.

    dir_state is "live", "delete", "future" or "stray" (KRaft 3.7+ LogManager.isStrayKraftReplica).
    """
    m = SUFFIXED_DIR_RE.fullmatch(name)
    if m:
        return {
            "topic": m.group("topic"),
            "partition": int(m.group("partition")),
            "dir_state": m.group("state"),
            "dir_uid": m.group("uid"),
        }
    m = PARTITION_DIR_RE.fullmatch(name)
    if m:
        return {
            "topic": m.group("topic"),
            "partition": int(m.group("partition")),
            "dir_state": "live",
            "dir_uid": None,
        }
    return None


_BASE_DIGITS = "[0-9]{20}"  # a segment file's base offset, zero-padded (LogFileUtils.filenamePrefixFromOffset)
_DIGITS20 = re.compile(r"^%s\Z" % _BASE_DIGITS)


def parse_segment_file_name(name):
    """Split "<20 digits>.<ext>[.<suffix>]" into (base_offset, ext, suffix), or None.

    ext is one of log/index/timeindex/txnindex/snapshot; suffix is swap/cleaned/deleted or None.
    """
    if len(name) < 22 or name[20] != "." or not _DIGITS20.fullmatch(name[:20]):
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
                raise ValueError("%s is larger than %d bytes; not a Kafka metadata file" % (path, limit))
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _decode_text(data, path):
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, "not UTF-8 text in %s: %s" % (path, e)


# Entries a checkpoint file may hold before it is refused unread: a broker with 2^18 partitions (or a partition with
# 2^18 leader epochs) is far beyond any Kafka deployment, and parsing more would take the probe's memory with it.
CHECKPOINT_ENTRIES_MAX = 1 << 18


def _parse_checkpoint(data, path, columns, entry):
    """The framing every Kafka checkpoint file shares (CheckpointFile.java): a version line (0), an entry count,
    then that many lines of ``columns`` whitespace-separated fields, each line turned into an entry by ``entry``.
    Returns (entries, version); a file with no content reads as ([], None), as in Kafka. Raises ValueError with
    Kafka's wording when malformed."""
    text, err = _decode_text(data, path)
    if err:
        raise ValueError(err)
    if text.strip() == "":
        return [], None
    if text.count("\n") > CHECKPOINT_ENTRIES_MAX + 2:  # version, count, entries: counted before any is split
        raise ValueError(
            "Checkpoint file [%s] holds more than %d entries (Kafka's brokers hold far fewer partitions and epochs); "
            "not read" % (path, CHECKPOINT_ENTRIES_MAX)
        )
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
        if len(parts) != columns:
            raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, line))
        try:
            entries.append(entry(parts))
        except ValueError:
            raise ValueError("Malformed line in checkpoint file [%s]: %s" % (path, line))
    if len(entries) != expected:
        raise ValueError(
            "Expected [%d] entries in checkpoint file [%s], but found only [%d]" % (expected, path, len(entries))
        )
    return entries, version


def parse_offset_checkpoint(data, path):
    """An offset checkpoint file's bytes as ([[topic, partition, offset], ...], version)."""
    return _parse_checkpoint(data, path, 3, lambda p: [p[0], int(p[1]), int(p[2])])


def parse_leader_epoch_checkpoint(data, path):
    """leader-epoch-checkpoint bytes as [[epoch, start_offset], ...]; a 0-byte file is the normal state of a replica
    that has never been assigned an epoch."""
    return _parse_checkpoint(data, path, 2, lambda p: [int(p[0]), int(p[1])])[0]


_B64URL = re.compile(r"^[A-Za-z0-9_-]{22}\Z")
_B64URL_BYTES = re.compile(rb"[A-Za-z0-9_-]{22}\Z")


def valid_topic_id(text):
    """True if text is a Kafka Uuid string (22 url-safe base64 chars decoding to 16 bytes)."""
    if not _B64URL.fullmatch(text):
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
        m = re.fullmatch(r"((?:[^=:\s\\]|\\.)+)\s*[=:\s]\s*(.*)", line)
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
# Index summaries: (bytes, entries, zero_tail_entries, remainder, monotonic, checked_entries, first_violation,
# first entry, last entry), the values of INDEX_SUMMARY_FIELDS then the raw first and last real entries. For a batch
# of indexes they are columns (index_summaries): SUMMARY_COLUMNS, the entries split into their two fields.
SUMMARY_COLUMNS = INDEX_SUMMARY_FIELDS + ("first_0", "first_1", "last_0", "last_1")
_NO_ENTRY = (None, None)


def _is_zero(b):
    return not b.strip(b"\0")


def _summary_columns(summaries):
    """Summaries (index_summary, index_full_summary) as the columns of index_summaries."""
    return [list(values) for values in zip(*(s[:7] + (s[7] or _NO_ENTRY) + (s[8] or _NO_ENTRY) for s in summaries))]


def index_summary(fmt, fd, head, size=None):
    """Metadata mode's summary of an index of format fmt, open as fd, without loading it; None when fstat says it
    is not a regular file. head: its first HEAD_READ_BYTES + 1 bytes (all of it when shorter). size: its length
    if known; otherwise the head tells it when short, fstat when not. The summary of a batch of one
    (index_summaries)."""
    columns = index_summaries(fmt, (fd,), (head,), None if size is None else (size,))
    if columns is None:
        return None
    s = [values[0] for values in columns]
    return tuple(s[:7]) + ((None if s[7] is None else tuple(s[7:9])), (None if s[9] is None else tuple(s[9:11])))


def index_summaries(fmt, fds, heads, sizes=None):
    """Metadata mode's summaries of a batch of indexes of format fmt, open as fds, whose heads (index_summary) were
    read, as columns (SUMMARY_COLUMNS); None if fstat says one is not a regular file. sizes: their lengths, if
    known.

    Real entries are non-zero and in order, the preallocated tail all zeros (a fresh index is setLength(10 MiB)
    and only trimToValidSize() on close or roll shortens it). The usual index is whole in its head (a whole
    number of entries, its length if known) and its last entry is real, so it has no zero tail: those of a batch
    are unpacked and checked together (_whole_summaries). Any other, and every index of a batch in which an entry
    breaks the order, is summarised alone (_index_summary_alone)."""
    counts = list(map(fmt.whole.get, map(len, heads)))  # its number of entries if it is whole in its head
    # the usual index: whole in its head, and its last entry (fmt.last_entry of a whole head) not the zero entry
    if sizes is None and None not in counts and fmt.zero not in map(operator.getitem, heads, _repeat(fmt.last_entry)):
        usual = None  # all of them
        columns = _whole_summaries(fmt, heads, counts)
        if columns is not None:
            return columns
    else:
        usual = [
            n is not None and (sizes is None or sizes[i] == len(heads[i])) and heads[i][fmt.last_entry] != fmt.zero
            for i, n in enumerate(counts)
        ]
        columns = _whole_summaries(fmt, list(itertools.compress(heads, usual)), list(itertools.compress(counts, usual)))
    if columns is None:  # none, or an entry breaks the order: each index alone tells where
        usual = _repeat(False)
    whole = zip(*columns) if columns is not None else None  # the usual indexes' summaries, in order
    summaries = []
    for fd, head, size, u in zip(fds, heads, _repeat(None) if sizes is None else sizes, usual):
        if u:
            summaries.append(next(whole))
            continue
        s = _index_summary_alone(fmt, fd, head, size)
        if s is None:
            return None
        summaries.append(s[:7] + (s[7] or _NO_ENTRY) + (s[8] or _NO_ENTRY))
    return [list(values) for values in zip(*summaries)]


def _whole_summaries(fmt, heads, counts):
    """index_summaries' columns for indexes whole in their heads, each with its last entry real (counts: their
    numbers of entries); None if there are none, or if an entry breaks the order (_index_summary_alone then tells
    which)."""
    if not heads:
        return None
    ends = list(itertools.accumulate(counts))
    starts = [0]
    starts += ends[:-1]
    # the first and the last entry of each index (itemgetter gives a tuple for two items or more: one more, dropped)
    first_of, last_of = operator.itemgetter(0, *starts), operator.itemgetter(0, *map(operator.sub, ends, _ONES))
    # unpacked as a multiple of _FLAT_STEP entries, zeros after the last: few entry counts to keep an unpack for
    pad = -ends[-1] % _FLAT_STEP
    flat = fmt.flat[ends[-1] + pad](b"".join(heads) + fmt.zero * pad)[: 2 * ends[-1]]
    fields = flat[0::2], flat[1::2]
    firsts = [first_of(values)[1:] for values in fields]
    lasts = [last_of(values)[1:] for values in fields]
    if not fmt.ordered(flat, firsts, lasts):
        return None
    k = len(heads)
    return [
        list(map(operator.mul, counts, _repeat(fmt.size))),
        counts,
        [0] * k,
        [0] * k,
        [True] * k,
        counts,
        [None] * k,
        firsts[0],
        firsts[1],
        lasts[0],
        lasts[1],
    ]


_repeat = itertools.repeat
_FLAT_STEP = 16


def _index_summary_alone(fmt, fd, head, size=None):
    """index_summary of one index (index_summaries for any that is not whole in its head with its last entry real):
    when the last entry is zero, a binary search finds the first zero entry. Checked for order: the head's real
    entries and the last one."""
    if size is None:
        size = len(head)
        if size > HEAD_READ_BYTES:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            size = st.st_size
    esize = fmt.size
    n = size // esize
    end = n * esize
    if not n:
        return (size, 0, 0, size, None, 0, None, None, None)
    hn = n if end <= HEAD_READ_BYTES else HEAD_READ_BYTES // esize  # entries in the head
    real = n
    if _is_zero(head[end - esize : end] if n <= hn else os.pread(fd, esize, end - esize)):
        lo, hi = 0, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if _is_zero(head[mid * esize : (mid + 1) * esize] if mid < hn else os.pread(fd, esize, mid * esize)):
                hi = mid
            else:
                lo = mid + 1
        real = lo
        if not real:
            return (size, 0, n, size - end, None, 0, None, None, None)
    checked = real if real < hn else hn
    flat = fmt.flat[checked](head)
    viol = None if fmt.ordered(flat) else fmt.first_violation(flat)
    if real == checked:
        last = flat[-2:]
    else:
        last = fmt.entry.unpack(os.pread(fd, esize, (real - 1) * esize))
        if viol is None and not fmt.ordered(flat[-2:] + last):
            viol = real - 1
    return (size, real, n - real, size - end, viol is None, checked, viol, flat[:2], last)


def index_full_summary(fmt, fd, size):
    """Deep mode's summary of an index open as fd: every entry up to the zero tail read (streamed) and checked,
    all of them counted as checked; index_summary's values plus zero_entries_inside (all-zero entries before the
    last real one)."""
    esize = fmt.size
    n = size // esize
    if not n:
        return (size, 0, 0, size % esize, None, 0, None, None, None, 0)
    whole = n * esize
    step = (READ_CHUNK // esize) * esize
    # entries are read up to the one holding the last non-zero byte; the rest is the zero tail
    tail = _zero_tail_start(fd, whole, step)
    total = min(whole, -(-tail // esize) * esize)
    zeros = (whole - total) // esize
    real = done = 0
    first = last = viol = None
    prev = ()  # the last entry read before
    pos = 0
    while pos < total:
        buf = os.pread(fd, min(step, total - pos), pos)
        if not buf:
            break
        pos += len(buf)
        count = len(buf) // esize
        flat = fmt.flat[count](buf)
        nonzero = list(map(operator.truth, map(operator.or_, flat[0::2], flat[1::2])))
        zeros += nonzero.count(False)
        if True in nonzero:
            if first is None:
                k = 2 * nonzero.index(True)
                first = flat[k : k + 2]
            k = count - 1 - nonzero[::-1].index(True)
            last = flat[2 * k : 2 * k + 2]
            real = done + k + 1
        if viol is None:
            flat = prev + flat
            if not fmt.ordered(flat):
                viol = done - len(prev) // 2 + fmt.first_violation(flat)
            prev = flat[-2:]
        done += count
    if not real:
        return (size, 0, n, size % esize, None, 0, None, None, None, zeros - n)
    if viol is not None and viol >= real:
        viol = None  # zeros at the very end are the preallocated tail, not an order violation
    return (size, real, n - real, size % esize, viol is None, real, viol, first, last, zeros - (n - real))


_SUMMARY_KEYS = INDEX_SUMMARY_FIELDS + ("first", "last", "zero_entries_inside")


def read_index_summary(path, fmt, full=False):
    """index_summary (full: index_full_summary) of the index file at path, as a dict."""
    fd = _open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if full:
            s = index_full_summary(fmt, fd, size)
        else:
            s = index_summary(fmt, fd, os.pread(fd, HEAD_READ_BYTES + 1, 0), size)
    finally:
        os.close(fd)
    return dict(zip(_SUMMARY_KEYS, s))


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


def _data_end(fd, total):
    """Where the file's last data within its first ``total`` bytes ends, by the file system's map of its holes
    (lseek SEEK_DATA / SEEK_HOLE): the bytes after it are a hole, which reads as zeros. Kafka grows an active
    segment's index with RandomAccessFile.setLength, so on ext4 and XFS its preallocated tail is a hole: reading it
    only had the kernel zero-fill up to 10 MiB of pages per index. ``total`` where the file system cannot say."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return total
    end = pos = 0
    try:
        while pos < total:  # every data extent in turn: data may follow a hole (lseek cannot look backwards)
            start = os.lseek(fd, pos, seek_data)
            if start >= total:
                break
            pos = os.lseek(fd, start, seek_hole)
            end = min(pos, total)
    except OSError as e:
        if e.errno != errno.ENXIO:  # ENXIO: no data after pos; anything else: no map to go by
            return total
    return end


def _zero_tail_start(fd, total, step):
    """Byte position where the all-zero tail of the first ``total`` bytes begins, found from the end in
    chunks with C-speed byte checks: a preallocated 10 MiB index is mostly tail, and entry-by-entry
    unpacking of it in Python is what a deep probe of a running broker must not pay for. A tail that is a
    hole in the file is not read at all (_data_end)."""
    end = _data_end(fd, total)
    while end > 0:
        start = max(0, end - step)
        buf = os.pread(fd, end - start, start)
        if len(buf) != end - start:
            return total  # the file changed under us: scan everything
        if buf != bytes(len(buf)):
            return start + _nonzero_end(buf)
        end = start
    return 0


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
# A compressed v0/v1 wrapper (R/AbstractLegacyRecordBatch.java) holds its inner messages compressed in its value;
# deep mode inflates the value only to count them. Nothing in Kafka bounds the inflated size (a 255 KiB gzip value
# can inflate to 255 MiB), so the count is streamed in INFLATE_STEP pieces and stops, the wrapper left uncounted
# with an error naming the file, past LEGACY_INFLATED_MAX bytes: far above what a producer's batch inflates to.
LEGACY_INFLATED_MAX = 64 << 20
INFLATE_STEP = 1 << 16
# Snappy is decoded a block at a time (a block's copies reach back anywhere in it): the block and its compressed
# form in memory at once. Kafka's producers wrote xerial frames of 32 KiB blocks (SnappyOutputStream); some clients
# one raw block per message. A bigger block, or its compressed form bigger than snappy's MaxCompressedLength of it:
# not decoded.
SNAPPY_BLOCK_MAX = 16 << 20
SNAPPY_COMPRESSED_MAX = 32 + SNAPPY_BLOCK_MAX + SNAPPY_BLOCK_MAX // 6


class LegacyInflateLimit(Exception):
    """A compressed v0/v1 wrapper whose value inflates (or, snappy, says it does) past LEGACY_INFLATED_MAX."""


def _snappy_decompress_raw(data, limit=SNAPPY_BLOCK_MAX):
    """Raw snappy block decompression (format_description.txt of google/snappy). A block that says it holds more
    than ``limit`` bytes raises LegacyInflateLimit before anything is decoded. Returns a bytearray."""
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
    if length > limit:
        raise LegacyInflateLimit("a snappy block of %d bytes, more than %d" % (length, limit))
    out = bytearray()
    view = memoryview(data)  # literals appended without a copy of their own
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
            out += view[pos : pos + ln]
            pos += ln
        else:
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
            if off >= ln:
                out += out[-off : len(out) - off + ln]
            else:  # the copy overlaps its own output: the last `off` bytes repeated
                out += (out[-off:] * (ln // off + 1))[:ln]
        if len(out) > length:
            raise ValueError("snappy: length mismatch")
    if len(out) != length:
        raise ValueError("snappy: length mismatch")
    return out


def _snappy_decompress(data):
    """Snappy as Kafka's v0/v1 producers wrote it, or None when data is not valid snappy (or holds more than
    _snappy_blocks decodes)."""
    try:
        return b"".join(_snappy_blocks(_bytes_reader(data), len(data)))
    except (ValueError, IndexError, LegacyInflateLimit):
        return None


def _snappy_blocks(read_at, size, limit=LEGACY_INFLATED_MAX):
    """The decoded blocks of the ``size`` bytes of snappy read by read_at(position, n), as Kafka's v0/v1 producers
    wrote it: xerial framing (magic, two versions, then int32-length-prefixed raw blocks), or one raw block.
    LegacyInflateLimit for a block over SNAPPY_BLOCK_MAX (or SNAPPY_COMPRESSED_MAX compressed) and past ``limit``
    bytes in all."""
    if read_at(0, 8) != b"\x82SNAPPY\x00":
        yield _snappy_block(read_at, 0, size)
        return
    total = 0
    pos = 16  # magic(8) + version(4) + compatible version(4)
    while pos + 4 <= size:
        ln = int.from_bytes(read_at(pos, 4), "big")
        pos += 4
        block = _snappy_block(read_at, pos, min(ln, size - pos))
        total += len(block)
        if total > limit:
            raise LegacyInflateLimit("snappy value inflates to more than %d bytes" % limit)
        yield block
        block = None  # not held while the next one is decoded
        pos += ln


def _snappy_block(read_at, pos, n):
    if n > SNAPPY_COMPRESSED_MAX:
        raise LegacyInflateLimit("a snappy block of %d compressed bytes, more than %d" % (n, SNAPPY_COMPRESSED_MAX))
    return _snappy_decompress_raw(read_at(pos, n))


def _bytes_reader(data):
    def read_at(pos, n):
        return data[pos : pos + n]

    return read_at


def _gunzip_steps(chunks, limit=LEGACY_INFLATED_MAX):
    """The first gzip member of the bytes in ``chunks``, inflated INFLATE_STEP bytes at a time (what
    zlib.decompress(data, 16 + MAX_WBITS) returns, never all held at once); past ``limit`` bytes:
    LegacyInflateLimit. A truncated stream raises zlib.error, as zlib.decompress does."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total = 0
    for data in chunks:
        while data and not d.eof:
            out = d.decompress(data, INFLATE_STEP)
            data = d.unconsumed_tail
            total += len(out)
            if total > limit:
                raise LegacyInflateLimit("gzip value inflates to more than %d bytes" % limit)
            if out:
                yield out
        if d.eof:
            return
    while not d.eof:  # all input taken; output zlib still holds back
        out = d.decompress(b"", INFLATE_STEP)
        if not out:
            raise zlib.error("incomplete or truncated stream")
        total += len(out)
        if total > limit:
            raise LegacyInflateLimit("gzip value inflates to more than %d bytes" % limit)
        yield out


def _count_inner_messages(steps):
    """Count the complete v0/v1 messages (offset, size >= 14, then size bytes) at the start of the bytes that
    ``steps`` yields, up to the first that is too small or runs past the end. Every step is consumed, so an
    error in decompression anywhere still surfaces; no step is copied (a snappy block can be big)."""
    count = 0
    skip = 0  # bytes of the message being counted still to come
    rest = b""  # the start of a header cut by the end of a step
    stopped = False
    unpack = LOG_OVERHEAD.unpack_from
    steps = iter(steps)
    while True:
        chunk = None  # not held while the next step is made
        chunk = next(steps, None)
        if chunk is None:
            break
        if stopped:
            continue
        end = len(chunk)
        pos = 0
        if skip:
            if skip > end:
                skip -= end
                continue
            pos, skip = skip, 0
            count += 1
        if rest:
            need = LOG_OVERHEAD.size - len(rest)
            rest += bytes(chunk[pos : pos + need])
            if len(rest) < LOG_OVERHEAD.size:
                continue
            size = unpack(rest)[1]
            rest = b""
            if size < LEGACY_MIN_RECORD_OVERHEAD:
                stopped = True
                continue
            pos += need + size
            if pos > end:
                skip = pos - end
                continue
            count += 1
        while pos + 12 <= end:
            size = unpack(chunk, pos)[1]
            if size < LEGACY_MIN_RECORD_OVERHEAD:
                stopped = True
                break
            nxt = pos + 12 + size
            if nxt > end:
                skip = nxt - end
                pos = end
                break
            count += 1
            pos = nxt
        if pos < end and not stopped:
            rest = bytes(chunk[pos:end])
    return count


def _legacy_value_range(read_at, size, magic):
    """(start, end) of the value of a v0/v1 message of ``size`` bytes read by read_at(position, n) (from its
    offset field on): the value's int32 length, cut at the message's end; an empty range for a null value."""
    pos = 18 + (8 if magic == 1 else 0)
    klen = struct.unpack(">i", read_at(pos, 4))[0]
    pos += 4 + max(klen, 0)
    vlen = struct.unpack(">i", read_at(pos, 4))[0]
    pos += 4
    if vlen < 0:
        return pos, pos
    return pos, min(pos + vlen, size)


def _value_steps(read_at, start, end):
    while start < end:
        n = min(INFLATE_STEP, end - start)
        data = read_at(start, n)
        if not data:
            return
        yield data
        start += len(data)


def _count_legacy_inner_at(read_at, size, magic, codec, limit=LEGACY_INFLATED_MAX):
    """Count the inner messages of a compressed v0/v1 wrapper of ``size`` bytes read by read_at(position, n):
    gzip streamed, snappy a block at a time; None for other codecs. Raises LegacyInflateLimit past ``limit``,
    ValueError, IndexError, struct.error or zlib.error on a wrapper that is not valid."""
    start, end = _legacy_value_range(read_at, size, magic)
    if codec == 1:
        return _count_inner_messages(_gunzip_steps(_value_steps(read_at, start, end), limit))
    if codec == 2:
        return _count_inner_messages(_snappy_blocks(_sub_reader(read_at, start, end), end - start, limit))
    return None


def _sub_reader(read_at, start, end):
    """read_at for the bytes [start, end) of what read_at reads."""

    def sub(pos, n):
        return read_at(start + pos, min(n, end - start - pos)) if pos < end - start else b""

    return sub


def count_legacy_inner(wrapper, magic, codec):
    """Count inner messages of a compressed v0/v1 wrapper, or None when the codec is not decodable
    with the standard library (lz4), the wrapper is not valid or it inflates past LEGACY_INFLATED_MAX."""
    try:
        return _count_legacy_inner_at(_bytes_reader(wrapper), len(wrapper), magic, codec)
    except (ValueError, IndexError, struct.error, zlib.error, MemoryError, LegacyInflateLimit):
        return None


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


# the result of walk_log before the walk, in the order of the segment record's deep-mode fields
_LOG_WALK_START = (
    ("batch_count", 0),
    ("record_count", 0),
    ("uncounted_batches", 0),
    ("first_offset", None),
    ("last_offset", None),
    ("next_offset", None),
    ("max_timestamp", None),
    ("valid_bytes", 0),
    ("torn_tail", False),
    ("tail_error", None),
    ("magic", ()),
    ("codecs", ()),
    ("crc_checked", 0),
    ("crc_errors", 0),
    ("first_crc_error_position", None),
    ("offset_errors", 0),
    ("first_offset_error_position", None),
    ("control_batches", 0),
    ("transactional_batches", 0),
    ("max_leader_epoch", None),
)
LOG_WALK_FIELDS = tuple(k for k, _ in _LOG_WALK_START)


def _reader(f, start, size):
    """read_at(position, n) for the ``size`` bytes of the open file f from ``start`` on: never past them."""

    def read_at(pos, n):
        if pos >= size:
            return b""
        f.seek(start + pos)
        return f.read(min(n, size - pos))

    return read_at


WALK_STOP = "stop"  # what an on_batch callback of walk_log returns to end the walk there


def walk_log(path, base_offset=None, verify_crc=False, on_batch=None, start=0):
    """Walk a .log from header to header without loading it. Mirrors FileLogInputStream.nextBatch
    and LogSegment.recover (S/log/LogSegment.java): stops cleanly on a batch that extends past EOF
    or when fewer than 17 bytes remain, with an error on a too-small size, a bad magic or a CRC
    failure. Everything after valid_bytes is what recovery would truncate.

    on_batch(position, first_offset, last_offset, size) is called for each valid batch; when it returns WALK_STOP
    the walk ends after that batch. ``start``: the byte position of a batch to begin at (a follower of the log that
    read up to there before). A compressed v0/v1
    wrapper whose records could not be counted within LEGACY_INFLATED_MAX adds a message naming the file to the
    result's "errors" (a key present only then).
    """
    res = dict(_LOG_WALK_START)
    magics = set()
    codecs = set()
    with os.fdopen(_open_regular(path), "rb", 65536) as f:
        size = os.fstat(f.fileno()).st_size
        pos = start
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
                    try:
                        records = _count_legacy_inner_at(_reader(f, pos, bsize), bsize, magic, codec)
                    except LegacyInflateLimit as ex:
                        records = None
                        res.setdefault("errors", []).append(
                            "v0/v1 %s message at byte %d of %s: %s; its records are not counted"
                            % (CODECS.get(codec, codec), pos, path, ex)
                        )
                    except Exception:  # not valid: uncounted, as lz4 is
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
            prev_last = last
            if on_batch is not None and on_batch(pos, first, last, bsize) == WALK_STOP:
                pos += bsize
                break
            pos += bsize
        res["valid_bytes"] = pos
    if res["last_offset"] is not None:
        res["next_offset"] = res["last_offset"] + 1
    res["magic"] = sorted(magics)
    res["codecs"] = sorted(codecs)
    return res


# _IndexMatcher.results(), as the segment record's deep-mode fields
INDEX_MATCH_FIELDS = (
    "index_checked",
    "index_not_batch_start",
    "index_offset_before_batch",
    "index_offset_after_batch",
    "index_beyond_log",
    "index_mismatch_examples",
)


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

    def results(self):
        return (
            self.checked,
            self.not_batch_start,
            self.offset_outside_batch,
            self.offset_after_batch,
            self.beyond_log,
            self.examples,
        )


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
# Records: each kind's fields, in output order, after "kind" (every record starts with it); docs/probe-schema.md.
def _err(e):
    if isinstance(e, OSError) and e.strerror:
        return "%s: %s" % (type(e).__name__, e.strerror)
    return "%s: %s" % (type(e).__name__, e)


# A str as JSON, ASCII-escaped: odd file names (unicode, undecodable bytes as surrogates) stay valid
# JSON. What json.dumps(s) returns for a str, without its argument checks.
_j = json.encoder.encode_basestring_ascii


def _num(v):
    return "null" if v is None else str(v)


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

PROBE_FIELDS = ("schema_version", "probe_version", "mode", "verify_crc", "hostname", "python", "started_at_ms", "paths")
LOGDIR_FIELDS = (
    "logdir",
    "path",
    "realpath",
    "exists",
    "error",
    "meta",
    "meta_error",
    "clean_shutdown",
    "clean_shutdown_broker_epoch",
    "lock_present",
    "lock_held_by_pid",
    "kraft",
    "checkpoints",
    "partition_dirs",
    "other_entries",
)
# A partition dir that could not be probed at all gets only logdir, path, dir and error.
PARTITION_FIELDS = (
    "logdir",
    "path",
    "dir",
    "topic",
    "partition",
    "dir_state",
    "dir_uid",
    "topic_id",
    "partition_metadata_present",
    "partition_metadata_version",
    "partition_metadata_error",
    "leader_epochs",
    "leader_epoch_present",
    "leader_epoch_error",
    "latest_leader_epoch",
    "segment_count",
    "log_start_segment_offset",
    "active_base_offset",
    "size_bytes",
    "producer_snapshots",
    "recovery_point",
    "log_start_offset",
    "high_watermark",
    "cleaner_offset",
    "leftover_files",
    "error",
)
# deep mode: after the others, summed or maxed over the segments
PARTITION_DEEP_FIELDS = (
    "log_end_offset",
    "batch_count",
    "record_count",
    "max_timestamp",
    "torn_segments",
    "crc_errors",
    "uncounted_batches",
)
# An index that is absent or could not be read has only its first four fields (IndexFormat.missing, .unreadable).
SEGMENT_FIELDS = (
    ("logdir", "path", "topic", "partition", "base_offset", "active")
    + ("has_log", "log_bytes", "log_mtime_ms", "has_txnindex", "txnindex_bytes")
    + OFFSET_INDEX.fields
    + TIME_INDEX.fields
    + ("error",)
)
# deep mode, before "error": "deep": null when there is no .log to walk, else walk_log's fields, then the
# _IndexMatcher's when the offset index could be read
SEGMENT_DEEP_FIELDS = ("deep",) + LOG_WALK_FIELDS + INDEX_MATCH_FIELDS
COUNT_FIELDS = ("logdirs", "partitions", "segments", "files", "errors")  # probe_end's counts
PROBE_END_FIELDS = ("schema_version", "complete") + COUNT_FIELDS + ("elapsed_ms",)
# Every field a record of each kind can have, in output order (a record has those that apply, see above; a file
# record's depend on its file_type: FILE_FIELDS).
RECORD_FIELDS = {
    "probe": PROBE_FIELDS,
    "logdir": LOGDIR_FIELDS,
    "partition": PARTITION_FIELDS + PARTITION_DEEP_FIELDS,
    "segment": SEGMENT_FIELDS[:-1] + SEGMENT_DEEP_FIELDS + SEGMENT_FIELDS[-1:],
    "probe_end": PROBE_END_FIELDS,
}
# file records: logdir, path, file_type, then the fields of its type, of which a record has those that apply (a
# log-dir file has no partition_dir, topic, partition; a file that could not be read has an error and no values).
_IN_PARTITION = ("partition_dir", "topic", "partition")
_STAT = ("bytes", "mtime_ms")
FILE_FIELDS = {
    "meta_properties": ("meta", "error") + _STAT,
    "clean_shutdown": ("content", "error") + _STAT,
    "lock": _STAT,
    "offset_checkpoint": ("checkpoint", "temporary", "version", "entries", "error") + _STAT,
    "bootstrap_checkpoint": _STAT,
    "partition_metadata": ("topic_id", "version", "error") + _IN_PARTITION + _STAT,
    "leader_epoch_checkpoint": ("entries", "error") + _IN_PARTITION + _STAT,
    "producer_snapshot": ("base_offset",) + _IN_PARTITION + _STAT,
    "segment_leftover": ("base_offset", "segment_file", "leftover") + _IN_PARTITION + _STAT,
    "quorum_state": ("content", "error") + _IN_PARTITION + _STAT,
    "kraft_snapshot": ("end_offset", "epoch", "state") + _IN_PARTITION + _STAT,
    "symlink": ("partition_dir", "symlink_target", "error"),  # pointing outside the log dir: not followed
    "unknown_dir": ("partition_dir", "name"),
    "unknown": ("name", "partition_dir", "error", "topic", "partition") + _STAT,  # error: it could not be stat'ed
}


def _record(kind, fields, **values):
    """A record of `kind` with `fields` in order: the values given, None for the others."""
    rec = dict.fromkeys(("kind",) + fields)
    rec["kind"] = kind
    rec.update(values)
    assert len(rec) == 1 + len(fields), values  # every value given is one of the fields
    return rec


# A segment record is formatted directly: its start, the same for a partition's segments (% logdir, path, topic,
# partition as JSON), the fields from base_offset to txnindex_bytes (_SEGMENT_HEAD), each index's fields
# (IndexFormat.record_text), deep mode's, the error.
_SEGMENT_START = '{"kind":"segment"' + _template(SEGMENT_FIELDS[:4])
_SEGMENT_HEAD = _template(SEGMENT_FIELDS[4:11])
_USUAL_HEAD = _SEGMENT_HEAD % ("%s", "%s", "true", "%s", "%s", "false", "null")  # a regular .log, no .txnindex
_ERROR = _template(SEGMENT_FIELDS[-1:]) + "}\n"  # the record's last field
_NO_ERROR = _ERROR % "null"
_NO_LOG_TO_WALK = _template(SEGMENT_DEEP_FIELDS[:1]) % "null"


def _segment_line(ctx, head, index, timeindex, deep, error):
    """A segment record. ctx: its start; head: the text of _SEGMENT_HEAD's fields; index, timeindex: the text of each
    index's fields (IndexFormat.record_text); deep: deep mode's fields as JSON text ("" in metadata mode); error:
    the text of the error field (_NO_ERROR, or _ERROR with the message)."""
    return "".join((ctx, head, index, timeindex, deep, error))


# the record of a usual segment (_regular_segments), % (ctx, the _USUAL_HEAD values, each index's record_values)
_USUAL_LINE = _segment_line("%s", _USUAL_HEAD, OFFSET_INDEX.text_template, TIME_INDEX.text_template, "", _NO_ERROR)


# --------------------------------------------------------------------------------------------
# The walker's helpers: the fast branch of the segment records and the usual partition files
_entry_name = operator.attrgetter("name")
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_SEGMENT_EXTENSION_SET = frozenset(SEGMENT_EXTENSIONS)
_SEGMENT_BATCH = 64  # segments per write, and per run of system calls in _regular_segments (2 open files each)
_ST_MODE, _ST_SIZE = operator.attrgetter("st_mode"), operator.attrgetter("st_size")
_IS_SYMLINK, _IS_FILE = os.DirEntry.is_symlink, os.DirEntry.is_file


def _all_regular(entries):
    """Whether every entry of a directory listing is a regular file, not a symlink (by the listing's file types)."""
    try:
        return not any(map(_IS_SYMLINK, entries)) and all(map(_IS_FILE, entries))
    except OSError:  # a file system without file types in its listings: an entry gone since
        return False


# A partition dir's names, sorted, each followed by "\n" (_usual_layout): one match per segment whose files are its
# .index, .log and .timeindex (they sort together; a producer snapshot of its base sorts between the last two), per
# other segment file (parse_segment_file_name's: not the usual layout), per other name. Groups: the segment's base
# offset digits, its snapshot's name, the other segment file, the other name.
_LISTING_RE = re.compile(
    r"({0})\.{1}\n\1\.{2}\n(?:(\1\.snapshot)\n)?\1\.{3}\n|({0}\.(?:{4})\n)|([^\n]*)\n".format(
        _BASE_DIGITS, OFFSET_INDEX.ext, "log", TIME_INDEX.ext, "|".join(SEGMENT_EXTENSIONS)
    )
)
_INDEX_SUFFIX, _TIMEINDEX_SUFFIX = "." + OFFSET_INDEX.ext, "." + TIME_INDEX.ext


def _usual_layout(entries):
    """For a partition dir's entries, sorted by name, whose segment files are all in the usual layout (_LISTING_RE):
    (the base offset digits of its segments, its other entries in name order, its names); else None."""
    names = list(map(_entry_name, entries))
    listing = "\n".join(names) + "\n"
    if not names or listing.count("\n") != len(names):  # none, or a name holds a newline
        return None
    digits, snapshots, lone, other = zip(*_LISTING_RE.findall(listing))
    if any(lone):
        return None
    others = filter(None, map(operator.add, snapshots, other))
    return list(filter(None, digits)), [entries[bisect.bisect_left(names, name)] for name in others], names


def _regular_segments(ctx, bases, prefixes, has_active, dfd):
    """The records Probe._segment gives, in metadata mode, for segments whose .log, .index and .timeindex are
    regular files by their directory entries and that have no .txnindex (the usual case), as (lines, bytes); None
    if a file is not a regular file after all. Raises OSError. prefixes: the segments' base offset digits (their
    file names without extension). The same inputs, read with fewer system calls: relative to the partition dir
    (dfd), each kind in one run over the batch, and an index's size from its head when that comes back short (no
    fstat); the same summaries and record from them."""
    os_stat, os_open = os.stat, os.open
    sts = [os_stat(p + ".log", dir_fd=dfd, follow_symlinks=False) for p in prefixes]
    if not all(map(stat.S_ISREG, map(_ST_MODE, sts))):
        return None
    fds = []
    add = fds.append
    try:
        for p in prefixes:
            add(os_open(p + _INDEX_SUFFIX, _O_RDONLY, dir_fd=dfd))
            add(os_open(p + _TIMEINDEX_SUFFIX, _O_RDONLY, dir_fd=dfd))
        k = len(fds)
        heads = list(map(os.pread, fds, itertools.repeat(HEAD_READ_BYTES + 1, k), itertools.repeat(0, k)))
        xs = index_summaries(OFFSET_INDEX, fds[0::2], heads[0::2])
        ts = index_summaries(TIME_INDEX, fds[1::2], heads[1::2])
        if xs is None or ts is None:
            return None
        sizes = list(map(_ST_SIZE, sts))
        mtimes = [int(st.st_mtime * 1000) for st in sts]
        acts = itertools.chain(itertools.repeat("false", len(bases) - 1), ("true" if has_active else "false",))
        lines = list(
            map(
                _USUAL_LINE.__mod__,
                zip(
                    itertools.repeat(ctx),
                    bases,
                    acts,
                    sizes,
                    mtimes,
                    *(OFFSET_INDEX.record_values(xs, bases) + TIME_INDEX.record_values(ts, bases)),
                ),
            )
        )
        total = sum(sizes) + sum(xs[0]) + sum(ts[0])
        return lines, total
    finally:
        any(map(os.close, fds))


class _UsualSegments(object):
    """The segments of a partition dir in the usual layout (_usual_layout) by base offset: each one's files as its
    listing has them ({ext: DirEntry}, as Probe._segment takes them), looked up when asked."""

    def __init__(self, entries, names, prefixes):
        self.entries, self.names, self.prefixes = entries, names, prefixes

    def __getitem__(self, base):
        return {
            ext: self.entries[self.names.index(segment_file_name(base, ext))]
            for ext in (OFFSET_INDEX.ext, "log", TIME_INDEX.ext)
        }


_READ_FAST = (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT)  # partition files read whole by _regular_file_at


def _regular_file_at(dfd, name, read):
    """({"bytes", "mtime_ms"}, its bytes if `read`) of a regular file of the dir open as dfd, stat'ed, or opened,
    fstat'ed and read in one go (under 1 MiB); (None, None) for anything else, left to the general path."""
    try:
        if read:
            fd = os.open(name, _O_RDONLY, dir_fd=dfd)
            try:
                st = os.fstat(fd)
                ok = stat.S_ISREG(st.st_mode) and st.st_size < 1 << 20
                data = os.read(fd, st.st_size + 1) if ok else None
            finally:
                os.close(fd)
            if data is None or len(data) > st.st_size:
                return None, None
        else:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            data = None
            if not stat.S_ISREG(st.st_mode):
                return None, None
    except OSError:
        return None, None
    return {"bytes": st.st_size, "mtime_ms": int(st.st_mtime * 1000)}, data


# --------------------------------------------------------------------------------------------
# Worker processes (--jobs): a worker sends its records to the main process in frames, each with the counts its
# records add (a record is counted as it is written), so probe_end stays exact whenever a worker dies.
_FRAME = struct.Struct(">?I5Q")  # partition done, payload bytes, then the COUNT_FIELDS added
_FRAME_BYTES = 1 << 20  # a big partition's records go in frames of about this size
_PARTITIONS = COUNT_FIELDS.index("partitions")
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


class _FrameOut(object):
    """A worker's output: its records go to the main process in frames of whole records, each with the counts
    they add; the last frame of a partition says so."""

    def __init__(self, fd, counts):
        self.fd = fd
        self.counts = counts
        self.sent = [counts[k] for k in COUNT_FIELDS]
        self.parts = []
        self.size = 0

    def write(self, text):
        self.parts.append(text)
        self.size += len(text)
        if self.size >= _FRAME_BYTES:
            self.send(False)

    def flush(self):
        pass

    def send(self, done):
        now = [self.counts[k] for k in COUNT_FIELDS]
        data = "".join(self.parts).encode("utf-8")
        frame = memoryview(_FRAME.pack(done, len(data), *map(operator.sub, now, self.sent)) + data)
        self.sent, self.parts, self.size = now, [], 0
        while frame:
            frame = frame[os.write(self.fd, frame) :]


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
        self.counts = dict.fromkeys(COUNT_FIELDS, 0)
        self.locks = False  # held_lock_inodes(), read for the first log dir with a lock file (a slow read on Linux)

    # -- output: a record is counted where it is written (the worker frames rely on it)
    def emit(self, record):
        if record.get("error"):
            self.counts["errors"] += 1
        self.out.write(_JSON_ENCODE(record) + "\n")

    def file_record(self, logdir, path, file_type, **fields):
        rec = {"kind": "file", "logdir": logdir, "path": path, "file_type": file_type}
        for key in FILE_FIELDS[file_type]:
            if key in fields:
                rec[key] = fields[key]
        assert len(rec) == 4 + len(fields), (file_type, fields)  # every field given is one of its type's
        self.counts["files"] += 1
        self.emit(rec)

    def _emit_partition(self, rec):
        self.counts["partitions"] += 1
        self.emit(rec)

    def _stat_fields(self, path):
        st = os.stat(path)  # symlinks leaving the log dir were filtered out before this
        return {"bytes": st.st_size, "mtime_ms": int(st.st_mtime * 1000)}

    # -- entry point
    def run(self, paths):
        started = time.time()
        self.emit(
            _record(
                "probe",
                PROBE_FIELDS,
                schema_version=SCHEMA_VERSION,
                probe_version=PROBE_VERSION,
                mode="deep" if self.deep else "metadata",
                verify_crc=self.verify_crc,
                hostname=socket.gethostname(),
                python="%d.%d.%d" % sys.version_info[:3],
                started_at_ms=int(started * 1000),
                paths=list(paths),
            )
        )
        for p in paths:
            self.probe_logdir(p)
        self.counts["elapsed_ms"] = int((time.time() - started) * 1000)
        self.emit(_record("probe_end", PROBE_END_FIELDS, schema_version=SCHEMA_VERSION, complete=True, **self.counts))
        self.out.flush()

    # -- one log dir
    def probe_logdir(self, logdir):
        self.counts["logdirs"] += 1
        rec = _record(
            "logdir",
            LOGDIR_FIELDS,
            logdir=logdir,
            path=logdir,
            exists=False,
            checkpoints={},
            partition_dirs=0,
            other_entries=0,
        )
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
        if rec["lock_present"] and self.locks is False:
            self.locks = held_lock_inodes()
        if self.locks and rec["lock_present"]:
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
            self._failed_partition(logdir, e, "probe failed on %s: %s" % (e.path, _err(ex)))

    def _failed_partition(self, logdir, e, error):
        self._emit_partition({"kind": "partition", "logdir": logdir, "path": e.path, "dir": e.name, "error": error})

    # -- the partitions of a log dir, in name order, over `jobs` processes
    def _probe_partitions(self, logdir, root, names, cp_values):
        """Probe the partition dirs in order. With jobs > 1, partition i is probed by process i % jobs: this one
        (0) or a forked worker that sends its records here through a pipe; this process writes every record, in
        the order and bytes one process would. A worker runs ahead by at most its pipe's capacity. When a worker
        dies, this process probes the partitions it did not finish, or reports the one it died in as failed if
        some of its records are out already."""
        jobs = min(self.jobs, len(names))
        if jobs < 2 or not _fork_ok():
            for name in names:
                self._probe_partition_safe(logdir, root, name, cp_values)
            return
        self.out.flush()
        workers = {}  # k -> (pid, read end as a buffered file)
        try:
            for k in range(1, jobs):
                try:
                    r, w = os.pipe()
                except OSError:
                    break  # fewer workers: this process probes their partitions
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
                        out = self.out = _FrameOut(w, self.counts)
                        for name in names[k::jobs]:
                            self._probe_partition_safe(logdir, root, name, cp_values)
                            out.send(True)
                        status = 0
                    finally:
                        os._exit(status)
                os.close(w)
                workers[k] = (pid, os.fdopen(r, "rb", 1 << 16))
            for i, name in enumerate(names):
                worker = workers.get(i % jobs)
                if worker is not None:
                    got = self._relay_partition(worker[1])
                    if got:
                        continue
                    _end_worker(*workers.pop(i % jobs))  # it died: this process takes its partitions over
                    if got is not None:  # some of its records are out: not its partition record
                        self._failed_partition(
                            logdir,
                            _PartitionDir(logdir, name),
                            "probe failed on %s: worker process %d ended mid-partition"
                            % (os.path.join(logdir, name), worker[0]),
                        )
                        continue
                self._probe_partition_safe(logdir, root, name, cp_values)
        finally:
            for pid, f in workers.values():
                _end_worker(pid, f)

    def _relay_partition(self, f):
        """Copy one partition's frames from a worker to the output, adding their counts. Returns whether its
        partition record came, or None if nothing of the partition did (the worker ended before it)."""
        got = None
        raw = getattr(self.out, "buffer", None)
        if raw is not None:
            self.out.flush()
        while True:
            head = f.read(_FRAME.size)
            if len(head) < _FRAME.size:
                return got
            done, n, *added = _FRAME.unpack(head)
            data = f.read(n)
            if len(data) < n:
                return got
            if raw is not None:
                raw.write(data)
            else:
                self.out.write(data.decode("utf-8"))
            for key, count in zip(COUNT_FIELDS, added):
                self.counts[key] += count
            got = bool(got) or added[_PARTITIONS] > 0  # its partition record came
            if done:
                return True

    def _link_inside(self, path, root):
        try:
            target = os.path.realpath(path)
        except OSError:
            return False, None
        return (target == root or target.startswith(root + os.sep)), target

    def _entry_fields(self, logdir, root, e, known, **where):
        """The stat fields of a file in a log dir or partition dir, or, after printing its record, the file type it
        was reported as: a symlink leading out of the log dir (not followed), a directory where Kafka expects
        files (``known``: the names Kafka reads there), or an entry that cannot be stat'ed. ``where``: the
        record's place (a partition file's ``partition_dir``)."""
        path = e.path
        try:
            if e.is_symlink():
                inside, target = self._link_inside(path, root)
                if not inside:
                    error = "symlink %s points outside the log dir (%s); not followed" % (path, target)
                    self.file_record(logdir, path, "symlink", symlink_target=target, error=error, **where)
                    return "symlink"
            if e.is_dir() and e.name not in known:
                self.file_record(logdir, path, "unknown_dir", name=e.name, **where)
                return "unknown_dir"
            return self._stat_fields(path)
        except OSError as ex:
            self.file_record(logdir, path, "unknown", error="cannot stat %s: %s" % (path, _err(ex)), **where)
            return "unknown"

    def _logdir_file(self, logdir, root, e, rec, cp_values):
        name, path = e.name, e.path
        fields = self._entry_fields(logdir, root, e, _LOGDIR_FILES)
        if not isinstance(fields, dict):
            if fields == "unknown_dir":
                rec["other_entries"] += 1
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
        pdir = pentry.path
        info = parse_partition_dir_name(pentry.name)
        prec = _record(
            "partition",
            PARTITION_FIELDS,
            logdir=logdir,
            path=pdir,
            dir=pentry.name,
            partition_metadata_present=False,
            leader_epoch_present=False,
            segment_count=0,
            size_bytes=0,
            producer_snapshots=[],
            leftover_files=0,
            **info,
        )
        # cp_values: (topic, partition) -> values in OFFSET_CHECKPOINT_FILES order
        # a -future log is checkpointed in its own log dir under the same topic-partition key
        cps = cp_values.get((info["topic"], info["partition"])) if info["dir_state"] in ("live", "future") else None
        if cps is not None:
            prec["recovery_point"], prec["log_start_offset"], prec["high_watermark"], prec["cleaner_offset"] = cps
        try:
            names = list(os.scandir(pdir))
        except OSError as ex:
            prec["error"] = "cannot list partition dir %s: %s" % (pdir, _err(ex))
            self._emit_partition(prec)
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
        """probe_partition after listing the dir: its files in name order, its segments in base-offset order, its
        record."""
        regular = not self.deep and dfd is not None and _all_regular(names)  # segments may take _regular_segments
        names.sort(key=_entry_name)
        usual = _usual_layout(names) if regular else None
        segments = {}
        last_prefix = files = None
        for e in names if usual is None else usual[1]:
            name = e.name
            ext = name[21:]
            if ext in _SEGMENT_EXTENSION_SET and name[20:21] == ".":
                # fast path of parse_segment_file_name for a plain segment file (same result); the
                # files of one segment are adjacent in name order
                prefix = name[:20]
                if prefix == last_prefix:
                    files[ext] = e
                    continue
                if _DIGITS20.fullmatch(prefix):
                    last_prefix = prefix
                    files = segments.setdefault(int(prefix), {})
                    files[ext] = e
                    continue
            parsed = parse_segment_file_name(name)
            if parsed is not None and parsed[2] is None and parsed[1] != "snapshot":
                segments.setdefault(parsed[0], {})[parsed[1]] = e
                continue
            self._partition_file(logdir, root, prec, e, parsed, dfd)
        if usual is not None:  # the segments, all in the usual layout
            bases = list(map(int, usual[0]))
            segments = _UsualSegments(names, usual[2], usual[0])
        else:
            bases = sorted(segments)
        prec["segment_count"] = len(bases)
        if bases:
            prec["log_start_segment_offset"] = bases[0]
            prec["active_base_offset"] = bases[-1]
        totals = dict.fromkeys(PARTITION_DEEP_FIELDS, 0) if self.deep else None
        if totals is not None:
            totals["log_end_offset"] = totals["max_timestamp"] = None
        ctx = _SEGMENT_START % (_j(logdir), _j(pdir), _j(info["topic"]), info["partition"])
        prec["size_bytes"] += self._segments(ctx, root, bases, segments, regular, dfd, totals)
        if totals is not None:
            if totals["log_end_offset"] is None and bases:
                totals["log_end_offset"] = bases[-1]  # every segment empty: LEO is the active segment's base offset
            prec.update(totals)
        self._emit_partition(prec)

    def _segments(self, ctx, root, bases, segments, regular, dfd, totals):
        """Write the segment records of a partition in base-offset order, _SEGMENT_BATCH at a time; returns their
        bytes. A batch of usual segments whose files are all regular (`regular`) goes through _regular_segments,
        and is redone segment by segment by _segment if that fails anywhere (a file gone or changed since the
        listing): _segment reports what went wrong."""
        total = 0
        n = len(bases)
        usual = segments.prefixes if segments.__class__ is _UsualSegments else None
        for lo in range(0, n, _SEGMENT_BATCH):
            batch = bases[lo : lo + _SEGMENT_BATCH]
            hi = lo + len(batch)
            if usual is not None:
                prefixes = usual[lo:hi]
            else:
                files = [segments[base] for base in batch]
                prefixes = None
                if regular and all(len(f) == 3 and "txnindex" not in f for f in files):
                    prefixes = [f["log"].name[:20] for f in files]
            done = None
            if prefixes is not None:
                try:
                    done = _regular_segments(ctx, batch, prefixes, hi == n, dfd)
                except Exception:
                    done = None
            errors = 0
            if done is None:
                if usual is not None:
                    files = [segments[base] for base in batch]
                lines = []
                size = 0
                for i, base in enumerate(batch):
                    line, seg_bytes, error = self._segment(ctx, root, base, files[i], lo + i == n - 1, totals)
                    lines.append(line)
                    size += seg_bytes
                    errors += error
            else:
                lines, size = done
            total += size
            self.counts["segments"] += len(lines)
            self.counts["errors"] += errors
            self.out.write("".join(lines))
        return total

    def _partition_file(self, logdir, root, prec, e, parsed, dfd):
        name, path = e.name, e.path
        snapshot = parsed is not None and parsed[1] == "snapshot" and parsed[2] is None
        fields = data = None
        if dfd is not None and (snapshot or name in _READ_FAST) and e.is_file(follow_symlinks=False):
            # the usual files, regular by the listing: fewer system calls; anything unusual goes the general way
            fields, data = _regular_file_at(dfd, name, not snapshot)
        if fields is None:
            fields = self._entry_fields(logdir, root, e, _PARTITION_FILES, partition_dir=prec["dir"])
            if not isinstance(fields, dict):
                return
        prec["size_bytes"] += fields["bytes"]
        fields.update(partition_dir=prec["dir"], topic=prec["topic"], partition=prec["partition"])
        if name == PARTITION_METADATA:
            prec["partition_metadata_present"] = True
            try:
                pm = parse_partition_metadata(_read_small(path) if data is None else data, path)
                prec["topic_id"] = pm["topic_id"]
                prec["partition_metadata_version"] = pm["version"]
                self.file_record(
                    logdir, path, "partition_metadata", topic_id=pm["topic_id"], version=pm["version"], **fields
                )
            except Exception as ex:
                prec["partition_metadata_error"] = (
                    str(ex) if isinstance(ex, ValueError) else "%s: %s" % (path, _err(ex))
                )
                self.file_record(logdir, path, "partition_metadata", error=prec["partition_metadata_error"], **fields)
        elif name == LEADER_EPOCH_CHECKPOINT:
            prec["leader_epoch_present"] = True
            try:
                eps = parse_leader_epoch_checkpoint(_read_small(path, 16 << 20) if data is None else data, path)
                prec["leader_epochs"] = eps
                prec["latest_leader_epoch"] = eps[-1][0] if eps else None
                self.file_record(logdir, path, "leader_epoch_checkpoint", entries=eps, **fields)
            except Exception as ex:
                prec["leader_epoch_error"] = str(ex) if isinstance(ex, ValueError) else "%s: %s" % (path, _err(ex))
                self.file_record(logdir, path, "leader_epoch_checkpoint", error=prec["leader_epoch_error"], **fields)
        elif snapshot:
            prec["producer_snapshots"].append(parsed[0])
            self.file_record(logdir, path, "producer_snapshot", base_offset=parsed[0], **fields)
        elif parsed is not None and parsed[2] is not None:
            prec["leftover_files"] += 1
            self.file_record(
                logdir,
                path,
                "segment_leftover",
                base_offset=parsed[0],
                segment_file=parsed[1],
                leftover=parsed[2],
                **fields,
            )
        elif name == QUORUM_STATE:
            content, err = None, None
            try:
                content = json.loads(_read_small(path).decode("utf-8"))
            except Exception as ex:
                err = "%s: %s" % (path, _err(ex))
            self.file_record(logdir, path, "quorum_state", content=content, error=err, **fields)
        else:
            m = KRAFT_SNAPSHOT_RE.fullmatch(name)
            if m:
                self.file_record(
                    logdir,
                    path,
                    "kraft_snapshot",
                    end_offset=int(m.group(1)),
                    epoch=int(m.group(2)),
                    state=m.group(3),
                    **fields,
                )
            else:
                self.file_record(logdir, path, "unknown", name=name, **fields)

    # -- one segment: the general path
    def _segment(self, ctx, root, base, files, is_active, totals):
        """(the segment's record, its bytes on disk, whether the record has an error)."""
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
        ie, te = files.get("index"), files.get("timeindex")
        xs = self._index(ie, OFFSET_INDEX, root, errors)
        ts = self._index(te, TIME_INDEX, root, errors)
        txn = files.get("txnindex")
        txn_bytes = None
        if txn is not None:
            try:
                txn_bytes = txn.stat().st_size
            except OSError as ex:
                errors.append("cannot stat %s: %s" % (txn.path, _err(ex)))
        deep = self._deep_segment(e, base, ie, root, errors, totals) if self.deep else ""
        head = _SEGMENT_HEAD % (
            base,
            _BOOL_JSON[is_active],
            _BOOL_JSON[log_bytes is not None],
            _num(log_bytes),
            _num(log_mtime),
            _BOOL_JSON[txn is not None],
            _num(txn_bytes),
        )
        size = (log_bytes or 0) + (txn_bytes or 0) + (xs[0] if xs else 0) + (ts[0] if ts else 0)
        error = "; ".join(errors) if errors else None
        line = _segment_line(
            ctx,
            head,
            OFFSET_INDEX.record_text(ie is not None if xs is None else xs, base),
            TIME_INDEX.record_text(te is not None if ts is None else ts, base),
            deep,
            _NO_ERROR if error is None else _ERROR % _j(error),
        )
        return line, size, bool(errors)

    def _index(self, e, fmt, root, errors):
        """The summary of an index (index_summary; index_full_summary in deep mode), or None when it is absent or
        could not be read (then after adding why to errors)."""
        if e is None:
            return None
        try:
            if e.is_symlink() and not self._link_inside(e.path, root)[0]:
                errors.append("symlink %s points outside the log dir; not followed" % e.path)
                return None
            fd = os.open(e.path, _O_RDONLY)
            try:
                size = None
                if self.deep or not e.is_file(follow_symlinks=False):  # else its directory entry says regular
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        errors.append("%s is not a regular file" % e.path)
                        return None
                    size = st.st_size
                if self.deep:
                    return index_full_summary(fmt, fd, size)
                s = index_summary(fmt, fd, os.pread(fd, HEAD_READ_BYTES + 1, 0), size)
            finally:
                os.close(fd)
        except Exception as ex:
            errors.append("cannot read %s: %s" % (e.path, _err(ex)))
            return None
        if s is None:
            errors.append("%s is not a regular file" % e.path)
        return s

    def _deep_segment(self, log_entry, base, index_entry, root, errors, totals):
        if log_entry is None:
            return _NO_LOG_TO_WALK
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
            return _NO_LOG_TO_WALK
        errors.extend(w.get("errors", ()))
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
        fields = LOG_WALK_FIELDS
        if matcher is not None:
            w.update(zip(INDEX_MATCH_FIELDS, matcher.results()))
            fields += INDEX_MATCH_FIELDS
        return "".join(',"%s":%s' % (k, _JSON_ENCODE(w[k])) for k in fields)


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
