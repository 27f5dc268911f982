"""The probe's record kinds, defined once: every field's name, type and meaning, in the probe's output order.

The probe (``probe.py``, one stdlib file shipped to brokers) cannot import this module; ``tests/test_records.py``
checks that what it prints has exactly these fields in this order. Everything else is derived from here:

- ``arrow_schema(kind)``: the Parquet table a kind is staged as (``fleet_doctor.staging``);
- ``spark_schema(kind)``: what detection reads of a kind (``fleet_doctor.detect.frames``), the fields marked
  ``detect``;
- ``markdown(kind)``: the field tables of docs/probe-schema.md (a test keeps them current).

Types are a small vocabulary (``TYPES``) with one Arrow and one Spark spelling each. Imports of pyarrow and pyspark
happen inside the functions that need them: the DAGs import this package at parse time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# type -> (how the docs spell it); Arrow and Spark types are built from the same names in _arrow / _spark
TYPES = {
    "string": "str",
    "int32": "int",
    "int64": "int",
    "bool": "bool",
    "null": "null",
    "object": "obj",
    "list<int64>": "[int]",
    "list<string>": "[str]",
    "list<list<int64>>": "[[int]]",
    "entries": "[[str\\|int]]",  # a checkpoint's entries: numbers staged; JSON's offset checkpoints mix in topics
    "list<mismatch>": "[obj]",
    "meta": "obj",
}


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # a TYPES key
    doc: str
    detect: bool = False  # detection reads it (part of spark_schema)
    staged: bool = True  # a column of the kind's Parquet table (kinds staged as Parquet only)
    deep: bool = False  # printed in deep mode only
    file_types: tuple[str, ...] = ()  # file records: the file types that carry it (empty: every one)


@dataclass(frozen=True)
class RecordKind:
    kind: str
    fields: tuple[Field, ...]
    doc: str
    staged: bool = False  # staged as Parquet beside the JSON Lines (docs/probe-schema.md, "Staged form")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.kind} records have no field {name!r}")


def _kind(kind: str, fields: str, *, staged: bool, doc: str) -> RecordKind:
    """A record kind from its field table: one field per line, ``name type flags doc``, the doc going on over the
    lines below it that start with spaces. Flags (``-`` for none): ``detect`` (detection reads it), ``deep`` (deep
    mode only), ``json`` (not a column of the staged table: such records stay JSON), ``types:a+b`` (file records:
    only these file types carry it)."""
    rows: list[list[str]] = []
    for line in fields.strip("\n").splitlines():
        if line.startswith(" "):
            rows[-1][3] = f"{rows[-1][3]} {line.strip()}".strip()
        else:
            name, type_, flags, *words = line.split(None, 3)
            rows.append([name, type_, flags, words[0] if words else ""])
    out = []
    for name, type_, flags, text in rows:
        flag = {} if flags == "-" else dict(f.partition(":")[::2] for f in flags.split(","))
        if type_ not in TYPES or not set(flag) <= {"detect", "deep", "json", "types"} or not text:
            raise ValueError(f"{kind} record field {name}: unknown type {type_!r}, flags {flags!r} or no meaning")
        file_types = tuple(flag["types"].split("+")) if "types" in flag else ()
        out.append(Field(name, type_, text, "detect" in flag, "json" not in flag, "deep" in flag, file_types))
    if len({f.name for f in out}) != len(out):
        raise ValueError(f"{kind} records: a field is defined twice")
    return RecordKind(kind, tuple(out), doc, staged)


_PROBE_FIELDS = """
schema_version               int64              -             1
probe_version                string             -             version of probe.py
mode                         string             -             `metadata` or `deep`
verify_crc                   bool               -             batch CRCs verified
hostname                     string             -             where it ran
python                       string             -             the interpreter's version
started_at_ms                int64              -             start time
paths                        list<string>       -             the log dirs probed
"""
PROBE = _kind("probe", _PROBE_FIELDS, staged=False, doc="The first record.")

_LOGDIR_FIELDS = """
logdir                       string             detect        the log dir as given
path                         string             detect        the log dir as given
realpath                     string             -             resolved path; symlinks inside the log dir must resolve
                                                              below it to be followed
exists                       bool               detect        the path is a readable directory
error                        string             detect        why the log dir could not be read at all
meta                         meta               detect        parsed `meta.properties`: `version` (0 = ZooKeeper, 1 =
                                                              KRaft), `broker_id` (`broker.id` or `node.id`),
                                                              `cluster_id`, `directory_id`, raw `properties`
meta_error                   string             detect        `meta.properties` unreadable or malformed
clean_shutdown               bool               detect        `.kafka_cleanshutdown` exists (Kafka only checks
                                                              existence)
clean_shutdown_broker_epoch  int64              -             `brokerEpoch` of the 3.7+ JSON marker
lock_present                 bool               -             `.lock` exists
lock_held_by_pid             int64              detect        PID holding a lock on `.lock` per `/proc/locks` (a running
                                                              broker); the probe never takes the lock
kraft                        bool               detect        meta.properties version 1 or a `__cluster_metadata-0` dir
checkpoints                  object             -             per offset checkpoint file present: `{"entries": N|null,
                                                              "error": str|null}`
partition_dirs               int64              -             partition directories found (all states)
other_entries                int64              -             entries that are neither partition dirs nor known log-dir
                                                              files
"""
LOGDIR = _kind("logdir", _LOGDIR_FIELDS, staged=False, doc="One per log dir given, after its own file records.")

_PARTITION_FIELDS = """
logdir                       string             detect        the log dir as given
path                         string             detect        the partition dir
dir                          string             detect        its name
topic                        string             detect        parsed from the dir name
partition                    int32              detect        parsed from the dir name
dir_state                    string             detect        `live`, `delete`, `future` or `stray`
dir_uid                      string             -             the unique id of a suffixed dir
topic_id                     string             detect        from `partition.metadata` (22-character Kafka Uuid)
partition_metadata_present   bool               detect        `partition.metadata` exists
partition_metadata_version   int64              -             its parsed version
partition_metadata_error     string             detect        why it could not be parsed, in Kafka's wording ("Malformed
                                                              line in checkpoint file [...]", "Invalid topic ID in
                                                              partition metadata file (...)")
leader_epochs                list<list<int64>>  detect        `leader-epoch-checkpoint` entries `[[epoch,
                                                              start_offset]]` (an empty 0-byte file gives `[]`)
leader_epoch_present         bool               -             `leader-epoch-checkpoint` exists
leader_epoch_error           string             detect        why it could not be parsed
latest_leader_epoch          int64              detect        its last epoch
segment_count                int64              detect        live segments (distinct base offsets of
                                                              `.log`/`.index`/`.timeindex`/`.txnindex`)
log_start_segment_offset     int64              -             lowest segment base offset
active_base_offset           int64              -             highest segment base offset
size_bytes                   int64              -             bytes of all files in the dir
producer_snapshots           list<int64>        -             offsets of `<offset>.snapshot` producer-state files
recovery_point               int64              detect        this partition's entry in the log dir's `recovery-point-
                                                              offset-checkpoint` (live and -future dirs)
log_start_offset             int64              -             its entry in `log-start-offset-checkpoint`
high_watermark               int64              -             its entry in `replication-offset-checkpoint`
cleaner_offset               int64              -             its entry in `cleaner-offset-checkpoint`
leftover_files               int64              -             `.swap` / `.cleaned` / `.deleted` files in the dir
error                        string             detect        the dir could not be listed
log_end_offset               int64              detect,deep   next offset after the last valid batch; the active base
                                                              offset when every segment is empty
batch_count                  int64              deep          over all segments
record_count                 int64              deep          over all segments (`uncounted_batches` excluded)
max_timestamp                int64              deep          over all segments
torn_segments                int64              deep          segments with a torn tail
crc_errors                   int64              deep          over all segments
uncounted_batches            int64              deep          over all segments
"""
PARTITION = _kind(
    "partition",
    _PARTITION_FIELDS,
    staged=True,
    doc="One per partition directory (`<topic>-<partition>`, or `<topic>-<partition>.<uid>-delete|-future|-stray`).",
)


def _index_fields(p: str, what: str, entry: int, order: str, *ends: tuple[str, str]) -> str:
    """The field table of one index's summary (``p``: ``index`` or ``timeindex``): both are summarised alike."""
    rows = [
        (f"has_{p}", "bool", "detect", f"the `.{p}` file exists"),
        (f"{p}_bytes", "int64", "detect", "its size (null when absent or unreadable)"),
        (f"{p}_entries", "int64", "detect", "**real** entries, the preallocated zero tail excluded"),
        (
            f"{p}_zero_tail_entries",
            "int64",
            "detect",
            f"all-zero entries after the last real one (an untrimmed {what} holds `segment.index.bytes / {entry}` "
            f"minus `{p}_entries`)",
        ),
        (f"{p}_remainder", "int64", "detect", f"`{p}_bytes % {entry}` (non-zero: not a whole number of entries)"),
        (f"{p}_monotonic", "bool", "detect", f"{order}, over the entries checked"),
        (
            f"{p}_checked_entries",
            "int64",
            "-",
            "entries checked (metadata mode: the first 4 KiB plus the last entry; deep mode: all)",
        ),
        (f"{p}_first_violation", "int64", "detect", "entry number of the first order violation"),
    ]
    rows += [(f"{p}_{name}", "int64", "-" if name == "first_offset" else "detect", doc) for name, doc in ends]
    return "".join(f"{name} {type_} {flags} {doc}\n" for name, type_, flags, doc in rows)


_SEGMENT_FIELDS = """
logdir                       string             detect        the log dir as given
path                         string             detect        the partition dir
topic                        string             detect        from the partition dir's name
partition                    int32              detect        from the partition dir's name
base_offset                  int64              detect        the segment's base offset (its files' name)
active                       bool               detect        highest base offset in the partition (the segment a
                                                              running broker writes to)
has_log                      bool               detect        the `.log` file exists
log_bytes                    int64              detect        its size
log_mtime_ms                 int64              -             its modification time
has_txnindex                 bool               -             the `.txnindex` file exists
txnindex_bytes               int64              -             its size
INDEXES
deep                         null               deep          `null` when deep mode had no `.log` to walk (the fields
                                                              below are then absent)
batch_count                  int64              detect,deep   valid batches (v2) or top-level messages (v0/v1)
record_count                 int64              deep          records (v2 `recordsCount`; the inner messages of v0/v1
                                                              gzip/snappy wrappers, decompressed)
uncounted_batches            int64              deep          v0/v1 lz4 wrappers, whose records are not counted
first_offset                 int64              detect,deep   first offset of the valid batches
last_offset                  int64              detect,deep   last offset of the valid batches
next_offset                  int64              detect,deep   the offset after the last valid batch
max_timestamp                int64              deep          over the valid batches
valid_bytes                  int64              detect,deep   bytes from 0 that form complete, valid batches: what
                                                              `LogSegment.recover` keeps
torn_tail                    bool               detect,deep   bytes after `valid_bytes` do not form a batch (incomplete
                                                              last batch, a size below the minimum overhead such as a
                                                              zero-filled tail, bad magic)
tail_error                   string             detect,deep   why, in Kafka's wording
magic                        list<int64>        deep          record format versions seen (sorted)
codecs                       list<string>       deep          compression codecs seen (`none`, `gzip`, `snappy`, `lz4`,
                                                              `zstd`)
crc_checked                  int64              detect,deep   batches whose CRC was verified (`--verify-crc`)
crc_errors                   int64              detect,deep   batches failing their CRC (CRC-32C over `[21,end)` for v2,
                                                              CRC-32 over `[16,end)` for v0/v1; the walk stops at the
                                                              first, as recovery does)
first_crc_error_position     int64              detect,deep   byte position of that batch
offset_errors                int64              detect,deep   batches whose offsets go backwards or precede the segment
                                                              base
first_offset_error_position  int64              detect,deep   byte position of the first
control_batches              int64              deep          v2 batches with the control bit (0x20)
transactional_batches        int64              deep          v2 batches with the transactional bit (0x10)
max_leader_epoch             int64              deep          over the valid v2 batches
index_checked                int64              deep          offset-index entries compared with the batches (like
                                                              `kafka-dump-log --verify-index-only`)
index_not_batch_start        int64              detect,deep   entries whose position is not the start of a batch
index_offset_before_batch    int64              detect,deep   entries at a batch start whose offset precedes the batch
index_offset_after_batch     int64              detect,deep   entries at a batch start whose offset is past the batch's
                                                              last offset: benign on 2.0+ when one append wrote several
                                                              batches
index_beyond_log             int64              detect,deep   entries pointing at or past `valid_bytes`
index_mismatch_examples      list<mismatch>     deep          up to 5 `{problem, index_offset, index_position, batch:
                                                              [position, first, last]}`
error                        string             detect        `; `-joined messages naming each file that could not be
                                                              read
""".replace(
    "INDEXES\n",
    _index_fields(
        "index",
        "offset index",
        8,
        "offsets strictly increase and positions never decrease",
        ("first_offset", "first real entry's offset (absolute)"),
        ("last_offset", "last real entry's offset (absolute)"),
        ("last_position", "last real entry's position in the `.log`"),
    )
    + _index_fields(
        "timeindex",
        "time index",
        12,
        "timestamps and offsets never decrease",
        ("first_timestamp", "first real entry's timestamp"),
        ("last_timestamp", "last real entry's timestamp"),
        ("last_offset", "last real entry's offset (absolute)"),
    ),
)
SEGMENT = _kind(
    "segment",
    _SEGMENT_FIELDS,
    staged=True,
    doc=(
        "One per base offset. `path` is the partition dir; the files are `path/<base_offset as %020d>.<ext>`. The "
        "`index_*`/`timeindex_*` detail fields other than `has_*`, `*_bytes`, `*_entries` and `*_zero_tail_entries` "
        "are present only when that index was read."
    ),
)

_FILE_FIELDS = """
logdir                       string             detect        the log dir as given
path                         string             detect        the file
file_type                    string             detect        `meta_properties`, `clean_shutdown`, `lock`,
                                                              `offset_checkpoint`, `bootstrap_checkpoint`,
                                                              `partition_metadata`, `leader_epoch_checkpoint`,
                                                              `producer_snapshot`, `segment_leftover`, `quorum_state`,
                                                              `kraft_snapshot`, `symlink`, `unknown_dir`, `unknown`
symlink_target               string             types:symlink
                                                              where it points (always with an `error`: outside the log
                                                              dir, not followed)
name                         string             types:unknown_dir+unknown
                                                              the entry's name
meta                         meta               json,types:meta_properties
                                                              as in `logdir.meta`
content                      object             json,types:clean_shutdown+quorum_state
                                                              the JSON content (null when empty)
checkpoint                   string             detect,json,types:offset_checkpoint
                                                              which of the four offset checkpoints
temporary                    bool               detect,json,types:offset_checkpoint
                                                              a `.tmp` left by an interrupted write
topic_id                     string             types:partition_metadata
                                                              the topic ID
version                      int64              types:offset_checkpoint+partition_metadata
                                                              the file's format version
entries                      entries            detect,types:offset_checkpoint+leader_epoch_checkpoint
                                                              `[[topic, partition, offset]]` (offset checkpoints) or
                                                              `[[epoch, start_offset]]` (leader epochs)
base_offset                  int64              types:producer_snapshot+segment_leftover
                                                              the offset in its name
segment_file                 string             types:segment_leftover
                                                              `log`, `index`, `timeindex`, `txnindex` or `snapshot`
leftover                     string             detect,types:segment_leftover
                                                              `swap`, `cleaned` or `deleted`
end_offset                   int64              types:kraft_snapshot
                                                              from its name
epoch                        int64              types:kraft_snapshot
                                                              from its name
state                        string             types:kraft_snapshot
                                                              null, `part` or `deleted`
error                        string             detect        could not be read or parsed (names the file)
partition_dir                string             detect        partition-level files: the partition dir's name
topic                        string             detect        partition-level files: the topic
partition                    int32              detect        partition-level files: the partition
bytes                        int64              detect        from `stat`
mtime_ms                     int64              -             from `stat`
"""
FILE = _kind(
    "file",
    _FILE_FIELDS,
    staged=True,
    doc=(
        "Every file that is not part of a live segment, plus the log dir's own files. The records with an object or a "
        "mixed list (`meta`, `content`, offset checkpoint `entries`) stay JSON when staged; the others are a Parquet "
        "table of the staged fields."
    ),
)

_PROBE_END_FIELDS = """
schema_version               int64              -             1
complete                     bool               -             true
logdirs                      int64              -             log dirs probed
partitions                   int64              -             partition records printed
segments                     int64              -             segment records printed
files                        int64              -             file records printed
errors                       int64              -             records carrying an error
elapsed_ms                   int64              -             how long the probe ran
"""
PROBE_END = _kind(
    "probe_end",
    _PROBE_END_FIELDS,
    staged=False,
    doc="The last record: a staged output without it, `complete` true, was cut off.",
)

KINDS: dict[str, RecordKind] = {k.kind: k for k in (PROBE, LOGDIR, PARTITION, SEGMENT, FILE, PROBE_END)}
STAGED: tuple[RecordKind, ...] = tuple(k for k in KINDS.values() if k.staged)


# ---- derived forms
def _arrow(type_: str) -> Any:
    import pyarrow as pa

    scalar = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "bool": pa.bool_(), "null": pa.null()}
    if type_ in scalar:
        return scalar[type_]
    if type_ == "entries":
        return pa.list_(pa.list_(pa.int64()))
    if type_ == "list<mismatch>":
        return pa.list_(
            pa.struct(
                [
                    ("problem", pa.string()),
                    ("index_offset", pa.int64()),
                    ("index_position", pa.int64()),
                    ("batch", pa.list_(pa.int64())),
                ]
            )
        )
    if type_.startswith("list<") and type_.endswith(">"):
        return pa.list_(_arrow(type_[5:-1]))
    raise ValueError(f"{type_}: no Arrow type (not staged as Parquet)")


def arrow_schema(kind: str) -> Any:
    """The Parquet table a staged kind is written as: its staged fields, in the probe's order."""
    k = KINDS[kind]
    assert k.staged, kind
    import pyarrow as pa

    return pa.schema([(f.name, _arrow(f.type)) for f in k.fields if f.staged])


def _spark(type_: str, staged: bool = False) -> Any:
    from pyspark.sql import types as T

    if type_ == "entries":  # staged: numbers; as JSON, offset checkpoints' [topic, partition, offset] read as text
        return T.ArrayType(T.ArrayType(T.LongType() if staged else T.StringType()))
    scalar = {
        "string": T.StringType(),
        "int32": T.IntegerType(),
        "int64": T.LongType(),
        "bool": T.BooleanType(),
    }
    if type_ in scalar:
        return scalar[type_]
    if type_ == "meta":  # the parts of meta.properties detection compares
        return T.StructType(
            [
                T.StructField("version", T.IntegerType(), True),
                T.StructField("broker_id", T.IntegerType(), True),
                T.StructField("cluster_id", T.StringType(), True),
            ]
        )
    if type_.startswith("list<") and type_.endswith(">"):
        return T.ArrayType(_spark(type_[5:-1], staged))
    raise ValueError(f"{type_}: no Spark type")


def spark_schema(kind: str, *, staged: bool = False) -> Any:
    """What detection reads of ``kind``: the fields marked ``detect``, as JSON parses them, or (``staged``) as the
    kind's Parquet table stores them (null-able all)."""
    from pyspark.sql import types as T

    fields = []
    for f in KINDS[kind].fields:
        if f.detect and (f.staged or not staged):
            fields.append(T.StructField(f.name, _spark(f.type, staged), True))
    return T.StructType(fields)


def _block(kind: str) -> tuple[str, str]:
    return f"<!-- records:{kind}:begin -->", f"<!-- records:{kind}:end -->"


def render_doc(text: str) -> str:
    """``text`` (docs/probe-schema.md) with every ``records:<kind>`` block replaced by ``markdown(kind)``."""
    for kind in KINDS:
        begin, end = _block(kind)
        head, found, rest = text.partition(begin + "\n")
        if not found:
            raise ValueError(f"no {begin} block")
        _, found, tail = rest.partition(end)
        if not found:
            raise ValueError(f"no {end} after {begin}")
        text = f"{head}{begin}\n{markdown(kind)}{end}{tail}"
    return text


def markdown(kind: str) -> str:
    """The field table of ``kind`` for docs/probe-schema.md."""
    k = KINDS[kind]
    file_kind = any(f.file_types for f in k.fields)
    head = [
        "| field | type | meaning |" + (" file types |" if file_kind else ""),
        "|---|---|---|" + ("---|" if file_kind else ""),
    ]
    rows = []
    for f in k.fields:
        meaning = (("deep only: " if f.deep else "") + f.doc).replace("|", "\\|")
        row = f"| `{f.name}` | {TYPES[f.type]} | {meaning} |"
        if file_kind:
            row += " " + (", ".join(f"`{t}`" for t in f.file_types) or "all") + " |"
        rows.append(row)
    return "\n".join([k.doc, "", *head, *rows]) + "\n"


if __name__ == "__main__":  # python -m fleet_doctor.records docs/probe-schema.md: rewrite its field tables
    import sys

    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        current = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_doc(current))
