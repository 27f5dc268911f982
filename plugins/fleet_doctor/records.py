"""The probe's record kinds, defined once: every field's name, type and meaning, in the probe's output order.

The probe (``probe.py``, one stdlib file shipped to brokers) cannot import this module; ``tests/test_records.py``
checks that what it prints has exactly these fields in this order. Everything else is derived from here:

- ``arrow_schema(kind)``: the Parquet table a kind is staged as (``fleet_doctor.audit.staging``);
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
    "list<list<string>>": "[[str\\|int]]",
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
    spark_type: str | None = None  # detection reads it with another type than the table's (JSON's view of it)
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


def _f(name: str, type_: str, doc: str, **kw: Any) -> Field:
    assert type_ in TYPES, type_
    return Field(name, type_, doc, **kw)


def _index_fields(p: str, what: str, order: str, entry: int, extra: tuple[Field, ...]) -> tuple[Field, ...]:
    return (
        _f(f"has_{p}", "bool", f"the `.{p}` file exists", detect=True),
        _f(f"{p}_bytes", "int64", "its size (null when absent or unreadable)", detect=True),
        _f(f"{p}_entries", "int64", "**real** entries, the preallocated zero tail excluded", detect=True),
        _f(
            f"{p}_zero_tail_entries",
            "int64",
            f"all-zero entries after the last real one (an untrimmed {what} holds `segment.index.bytes / {entry}` "
            f"minus `{p}_entries`)",
            detect=True,
        ),
        _f(f"{p}_remainder", "int64", f"`{p}_bytes % {entry}` (non-zero: not a whole number of entries)", detect=True),
        _f(f"{p}_monotonic", "bool", f"{order}, over the entries checked", detect=True),
        _f(
            f"{p}_checked_entries",
            "int64",
            "entries checked (metadata mode: the first 4 KiB plus the last entry; deep mode: all)",
        ),
        _f(f"{p}_first_violation", "int64", "entry number of the first order violation", detect=True),
        *extra,
    )


SEGMENT = RecordKind(
    "segment",
    doc="One per base offset. `path` is the partition dir; the files are `path/<base_offset as %020d>.<ext>`. The "
    "`index_*`/`timeindex_*` detail fields other than `has_*`, `*_bytes`, `*_entries` and `*_zero_tail_entries` "
    "are present only when that index was read.",
    staged=True,
    fields=(
        _f("logdir", "string", "the log dir as given", detect=True),
        _f("path", "string", "the partition dir", detect=True),
        _f("topic", "string", "from the partition dir's name", detect=True),
        _f("partition", "int32", "from the partition dir's name", detect=True),
        _f("base_offset", "int64", "the segment's base offset (its files' name)", detect=True),
        _f(
            "active",
            "bool",
            "highest base offset in the partition (the segment a running broker writes to)",
            detect=True,
        ),
        _f("has_log", "bool", "the `.log` file exists", detect=True),
        _f("log_bytes", "int64", "its size", detect=True),
        _f("log_mtime_ms", "int64", "its modification time"),
        _f("has_txnindex", "bool", "the `.txnindex` file exists"),
        _f("txnindex_bytes", "int64", "its size"),
        *_index_fields(
            "index",
            "offset index",
            "offsets strictly increase and positions never decrease",
            8,
            (
                _f("index_first_offset", "int64", "first real entry's offset (absolute)"),
                _f("index_last_offset", "int64", "last real entry's offset (absolute)", detect=True),
                _f("index_last_position", "int64", "last real entry's position in the `.log`", detect=True),
            ),
        ),
        *_index_fields(
            "timeindex",
            "time index",
            "timestamps and offsets never decrease",
            12,
            (
                _f("timeindex_first_timestamp", "int64", "first real entry's timestamp", detect=True),
                _f("timeindex_last_timestamp", "int64", "last real entry's timestamp", detect=True),
                _f("timeindex_last_offset", "int64", "last real entry's offset (absolute)", detect=True),
            ),
        ),
        _f("deep", "null", "`null` when deep mode had no `.log` to walk (the fields below are then absent)", deep=True),
        _f(
            "batch_count",
            "int64",
            "valid batches (v2) or top-level messages (v0/v1)",
            deep=True,
            detect=True,
        ),
        _f(
            "record_count",
            "int64",
            "records (v2 `recordsCount`; the inner messages of v0/v1 gzip/snappy wrappers, decompressed)",
            deep=True,
        ),
        _f("uncounted_batches", "int64", "v0/v1 lz4 wrappers, whose records are not counted", deep=True),
        _f("first_offset", "int64", "first offset of the valid batches", deep=True, detect=True),
        _f("last_offset", "int64", "last offset of the valid batches", deep=True, detect=True),
        _f("next_offset", "int64", "the offset after the last valid batch", deep=True, detect=True),
        _f("max_timestamp", "int64", "over the valid batches", deep=True),
        _f(
            "valid_bytes",
            "int64",
            "bytes from 0 that form complete, valid batches: what `LogSegment.recover` keeps",
            deep=True,
            detect=True,
        ),
        _f(
            "torn_tail",
            "bool",
            "bytes after `valid_bytes` do not form a batch (incomplete last batch, a size below the minimum overhead "
            "such as a zero-filled tail, bad magic)",
            deep=True,
            detect=True,
        ),
        _f("tail_error", "string", "why, in Kafka's wording", deep=True, detect=True),
        _f("magic", "list<int64>", "record format versions seen (sorted)", deep=True),
        _f("codecs", "list<string>", "compression codecs seen (`none`, `gzip`, `snappy`, `lz4`, `zstd`)", deep=True),
        _f("crc_checked", "int64", "batches whose CRC was verified (`--verify-crc`)", deep=True, detect=True),
        _f(
            "crc_errors",
            "int64",
            "batches failing their CRC (CRC-32C over `[21,end)` for v2, CRC-32 over `[16,end)` for v0/v1; the walk "
            "stops at the first, as recovery does)",
            deep=True,
            detect=True,
        ),
        _f("first_crc_error_position", "int64", "byte position of that batch", deep=True, detect=True),
        _f(
            "offset_errors",
            "int64",
            "batches whose offsets go backwards or precede the segment base",
            deep=True,
            detect=True,
        ),
        _f("first_offset_error_position", "int64", "byte position of the first", deep=True, detect=True),
        _f("control_batches", "int64", "v2 batches with the control bit (0x20)", deep=True),
        _f("transactional_batches", "int64", "v2 batches with the transactional bit (0x10)", deep=True),
        _f("max_leader_epoch", "int64", "over the valid v2 batches", deep=True),
        _f(
            "index_checked",
            "int64",
            "offset-index entries compared with the batches (like `kafka-dump-log --verify-index-only`)",
            deep=True,
        ),
        _f(
            "index_not_batch_start",
            "int64",
            "entries whose position is not the start of a batch",
            deep=True,
            detect=True,
        ),
        _f(
            "index_offset_before_batch",
            "int64",
            "entries at a batch start whose offset precedes the batch",
            deep=True,
            detect=True,
        ),
        _f(
            "index_offset_after_batch",
            "int64",
            "entries at a batch start whose offset is past the batch's last offset: benign on 2.0+ when one append "
            "wrote several batches",
            deep=True,
            detect=True,
        ),
        _f("index_beyond_log", "int64", "entries pointing at or past `valid_bytes`", deep=True, detect=True),
        _f(
            "index_mismatch_examples",
            "list<mismatch>",
            "up to 5 `{problem, index_offset, index_position, batch: [position, first, last]}`",
            deep=True,
        ),
        _f("error", "string", "`; `-joined messages naming each file that could not be read", detect=True),
    ),
)

PARTITION = RecordKind(
    "partition",
    doc="One per partition directory (`<topic>-<partition>`, or `<topic>-<partition>.<uid>-delete|-future|-stray`).",
    staged=True,
    fields=(
        _f("logdir", "string", "the log dir as given", detect=True),
        _f("path", "string", "the partition dir", detect=True),
        _f("dir", "string", "its name", detect=True),
        _f("topic", "string", "parsed from the dir name", detect=True),
        _f("partition", "int32", "parsed from the dir name", detect=True),
        _f("dir_state", "string", "`live`, `delete`, `future` or `stray`", detect=True),
        _f("dir_uid", "string", "the unique id of a suffixed dir"),
        _f("topic_id", "string", "from `partition.metadata` (22-character Kafka Uuid)", detect=True),
        _f("partition_metadata_present", "bool", "`partition.metadata` exists", detect=True),
        _f("partition_metadata_version", "int64", "its parsed version"),
        _f(
            "partition_metadata_error",
            "string",
            'why it could not be parsed, in Kafka\'s wording ("Malformed line in checkpoint file [...]", "Invalid '
            'topic ID in partition metadata file (...)")',
            detect=True,
        ),
        _f(
            "leader_epochs",
            "list<list<int64>>",
            "`leader-epoch-checkpoint` entries `[[epoch, start_offset]]` (an empty 0-byte file gives `[]`)",
            detect=True,
        ),
        _f("leader_epoch_present", "bool", "`leader-epoch-checkpoint` exists"),
        _f("leader_epoch_error", "string", "why it could not be parsed", detect=True),
        _f("latest_leader_epoch", "int64", "its last epoch", detect=True),
        _f(
            "segment_count",
            "int64",
            "live segments (distinct base offsets of `.log`/`.index`/`.timeindex`/`.txnindex`)",
            detect=True,
        ),
        _f("log_start_segment_offset", "int64", "lowest segment base offset"),
        _f("active_base_offset", "int64", "highest segment base offset"),
        _f("size_bytes", "int64", "bytes of all files in the dir"),
        _f("producer_snapshots", "list<int64>", "offsets of `<offset>.snapshot` producer-state files"),
        _f(
            "recovery_point",
            "int64",
            "this partition's entry in the log dir's `recovery-point-offset-checkpoint` (live and -future dirs)",
            detect=True,
        ),
        _f("log_start_offset", "int64", "its entry in `log-start-offset-checkpoint`"),
        _f("high_watermark", "int64", "its entry in `replication-offset-checkpoint`"),
        _f("cleaner_offset", "int64", "its entry in `cleaner-offset-checkpoint`"),
        _f("leftover_files", "int64", "`.swap` / `.cleaned` / `.deleted` files in the dir"),
        _f("error", "string", "the dir could not be listed", detect=True),
        _f(
            "log_end_offset",
            "int64",
            "next offset after the last valid batch; the active base offset when every segment is empty",
            deep=True,
            detect=True,
        ),
        _f("batch_count", "int64", "over all segments", deep=True),
        _f("record_count", "int64", "over all segments (`uncounted_batches` excluded)", deep=True),
        _f("max_timestamp", "int64", "over all segments", deep=True),
        _f("torn_segments", "int64", "segments with a torn tail", deep=True),
        _f("crc_errors", "int64", "over all segments", deep=True),
        _f("uncounted_batches", "int64", "over all segments", deep=True),
    ),
)

FILE = RecordKind(
    "file",
    doc="Every file that is not part of a live segment, plus the log dir's own files. The records with an object or "
    "a mixed list (`meta`, `content`, offset checkpoint `entries`) stay JSON when staged; the others are a Parquet "
    "table of the staged fields.",
    staged=True,
    fields=(
        _f("logdir", "string", "the log dir as given", detect=True),
        _f("path", "string", "the file", detect=True),
        _f(
            "file_type",
            "string",
            "`meta_properties`, `clean_shutdown`, `lock`, `offset_checkpoint`, `bootstrap_checkpoint`, "
            "`partition_metadata`, `leader_epoch_checkpoint`, `producer_snapshot`, `segment_leftover`, "
            "`quorum_state`, `kraft_snapshot`, `symlink`, `unknown_dir`, `unknown`",
            detect=True,
        ),
        _f(
            "symlink_target",
            "string",
            "where it points (always with an `error`: outside the log dir, not followed)",
            file_types=("symlink",),
        ),
        _f("name", "string", "the entry's name", file_types=("unknown_dir", "unknown")),
        _f("meta", "meta", "as in `logdir.meta`", staged=False, file_types=("meta_properties",)),
        _f(
            "content",
            "object",
            "the JSON content (null when empty)",
            staged=False,
            file_types=("clean_shutdown", "quorum_state"),
        ),
        _f(
            "checkpoint",
            "string",
            "which of the four offset checkpoints",
            staged=False,
            detect=True,
            file_types=("offset_checkpoint",),
        ),
        _f(
            "temporary",
            "bool",
            "a `.tmp` left by an interrupted write",
            staged=False,
            detect=True,
            file_types=("offset_checkpoint",),
        ),
        _f("topic_id", "string", "the topic ID", file_types=("partition_metadata",)),
        _f("version", "int64", "the file's format version", file_types=("offset_checkpoint", "partition_metadata")),
        _f(
            "entries",
            "list<list<int64>>",
            "`[[topic, partition, offset]]` (offset checkpoints) or `[[epoch, start_offset]]` (leader epochs)",
            detect=True,
            spark_type="list<list<string>>",
            file_types=("offset_checkpoint", "leader_epoch_checkpoint"),
        ),
        _f("base_offset", "int64", "the offset in its name", file_types=("producer_snapshot", "segment_leftover")),
        _f(
            "segment_file",
            "string",
            "`log`, `index`, `timeindex`, `txnindex` or `snapshot`",
            file_types=("segment_leftover",),
        ),
        _f("leftover", "string", "`swap`, `cleaned` or `deleted`", detect=True, file_types=("segment_leftover",)),
        _f("end_offset", "int64", "from its name", file_types=("kraft_snapshot",)),
        _f("epoch", "int64", "from its name", file_types=("kraft_snapshot",)),
        _f("state", "string", "null, `part` or `deleted`", file_types=("kraft_snapshot",)),
        _f("error", "string", "could not be read or parsed (names the file)", detect=True),
        _f("partition_dir", "string", "partition-level files: the partition dir's name", detect=True),
        _f("topic", "string", "partition-level files: the topic", detect=True),
        _f("partition", "int32", "partition-level files: the partition", detect=True),
        _f("bytes", "int64", "from `stat`", detect=True),
        _f("mtime_ms", "int64", "from `stat`"),
    ),
)

LOGDIR = RecordKind(
    "logdir",
    doc="One per log dir given, after its own file records.",
    fields=(
        _f("logdir", "string", "the log dir as given", detect=True),
        _f("path", "string", "the log dir as given", detect=True),
        _f("realpath", "string", "resolved path; symlinks inside the log dir must resolve below it to be followed"),
        _f("exists", "bool", "the path is a readable directory", detect=True),
        _f("error", "string", "why the log dir could not be read at all", detect=True),
        _f(
            "meta",
            "meta",
            "parsed `meta.properties`: `version` (0 = ZooKeeper, 1 = KRaft), `broker_id` (`broker.id` or `node.id`), "
            "`cluster_id`, `directory_id`, raw `properties`",
            detect=True,
        ),
        _f("meta_error", "string", "`meta.properties` unreadable or malformed", detect=True),
        _f("clean_shutdown", "bool", "`.kafka_cleanshutdown` exists (Kafka only checks existence)", detect=True),
        _f("clean_shutdown_broker_epoch", "int64", "`brokerEpoch` of the 3.7+ JSON marker"),
        _f("lock_present", "bool", "`.lock` exists"),
        _f(
            "lock_held_by_pid",
            "int64",
            "PID holding a lock on `.lock` per `/proc/locks` (a running broker); the probe never takes the lock",
            detect=True,
        ),
        _f("kraft", "bool", "meta.properties version 1 or a `__cluster_metadata-0` dir", detect=True),
        _f(
            "checkpoints",
            "object",
            'per offset checkpoint file present: `{"entries": N|null, "error": str|null}`',
        ),
        _f("partition_dirs", "int64", "partition directories found (all states)"),
        _f("other_entries", "int64", "entries that are neither partition dirs nor known log-dir files"),
    ),
)

PROBE = RecordKind(
    "probe",
    doc="The first record.",
    fields=(
        _f("schema_version", "int64", "1"),
        _f("probe_version", "string", "version of probe.py"),
        _f("mode", "string", "`metadata` or `deep`"),
        _f("verify_crc", "bool", "batch CRCs verified"),
        _f("hostname", "string", "where it ran"),
        _f("python", "string", "the interpreter's version"),
        _f("started_at_ms", "int64", "start time"),
        _f("paths", "list<string>", "the log dirs probed"),
    ),
)

PROBE_END = RecordKind(
    "probe_end",
    doc="The last record: a staged output without it, `complete` true, was cut off.",
    fields=(
        _f("schema_version", "int64", "1"),
        _f("complete", "bool", "true"),
        _f("logdirs", "int64", "log dirs probed"),
        _f("partitions", "int64", "partition records printed"),
        _f("segments", "int64", "segment records printed"),
        _f("files", "int64", "file records printed"),
        _f("errors", "int64", "records carrying an error"),
        _f("elapsed_ms", "int64", "how long the probe ran"),
    ),
)

KINDS: dict[str, RecordKind] = {k.kind: k for k in (PROBE, LOGDIR, PARTITION, SEGMENT, FILE, PROBE_END)}
STAGED: tuple[RecordKind, ...] = tuple(k for k in KINDS.values() if k.staged)


# ---- derived forms
def _arrow(type_: str) -> Any:
    import pyarrow as pa

    scalar = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "bool": pa.bool_(), "null": pa.null()}
    if type_ in scalar:
        return scalar[type_]
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


def _spark(type_: str) -> Any:
    from pyspark.sql import types as T

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
        return T.ArrayType(_spark(type_[5:-1]))
    raise ValueError(f"{type_}: no Spark type")


def spark_schema(kind: str, *, staged: bool = False) -> Any:
    """What detection reads of ``kind``: the fields marked ``detect``, as JSON parses them, or (``staged``) as the
    kind's Parquet table stores them (null-able all)."""
    from pyspark.sql import types as T

    fields = []
    for f in KINDS[kind].fields:
        if f.detect and (f.staged or not staged):
            type_ = f.type if staged else (f.spark_type or f.type)
            fields.append(T.StructField(f.name, _spark(type_), True))
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
