"""Detection: probe facts + ZooKeeper snapshot + broker facts -> findings, as Spark DataFrame
transformations. Every rule is one function ``Frames -> DataFrame`` of findings, expressed in the
DataFrame API (no Python UDFs); cross-source rules are joins. Rule metadata (severity bands,
remediation) comes from the registry in ``fleet_doctor.rules``.

I/O stays at the edges (``load_*`` read staged JSON Lines with explicit schemas; spark_apps/detect.py
writes findings). Input layout:

- probe output: ``<probe_dir>/broker_id=<N>/*.jsonl[.gz]`` (docs/probe-schema.md), with the segment, partition
  and file records as ``*.{segments,partitions,files}.parquet`` beside them when staged by the audit or ``scan``
  (fleet_doctor.staged_records)
- broker facts: JSON Lines ``{"broker_id": N, "kafka_version": "3.6.0", "running": false}``
- ZooKeeper snapshot (optional): JSON Lines (docs/zk-snapshot-schema.md)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from fleet_doctor.rules import RULES, KafkaVersion, Needs, Rule, get

L, INT, S, B = T.LongType(), T.IntegerType(), T.StringType(), T.BooleanType()


def _schema(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(n, t, True) for n, t in fields])


# ---- explicit schemas of the staged records (only the fields detection reads)
SEGMENT_SCHEMA = _schema(
    ("logdir", S),
    ("path", S),
    ("topic", S),
    ("partition", INT),
    ("base_offset", L),
    ("active", B),
    ("has_log", B),
    ("log_bytes", L),
    ("has_index", B),
    ("index_bytes", L),
    ("index_entries", L),
    ("index_zero_tail_entries", L),
    ("index_remainder", L),
    ("index_monotonic", B),
    ("index_first_violation", L),
    ("index_last_offset", L),
    ("index_last_position", L),
    ("has_timeindex", B),
    ("timeindex_bytes", L),
    ("timeindex_entries", L),
    ("timeindex_zero_tail_entries", L),
    ("timeindex_remainder", L),
    ("timeindex_monotonic", B),
    ("timeindex_first_violation", L),
    ("timeindex_first_timestamp", L),
    ("timeindex_last_timestamp", L),
    ("timeindex_last_offset", L),
    # deep mode
    ("batch_count", L),
    ("first_offset", L),
    ("last_offset", L),
    ("next_offset", L),
    ("valid_bytes", L),
    ("torn_tail", B),
    ("tail_error", S),
    ("crc_checked", L),
    ("crc_errors", L),
    ("first_crc_error_position", L),
    ("offset_errors", L),
    ("first_offset_error_position", L),
    ("index_not_batch_start", L),
    ("index_offset_before_batch", L),
    ("index_offset_after_batch", L),
    ("index_beyond_log", L),
    ("error", S),
)
PARTITION_SCHEMA = _schema(
    ("logdir", S),
    ("path", S),
    ("dir", S),
    ("topic", S),
    ("partition", INT),
    ("dir_state", S),
    ("topic_id", S),
    ("partition_metadata_present", B),
    ("partition_metadata_error", S),
    ("leader_epochs", T.ArrayType(T.ArrayType(L))),
    ("leader_epoch_error", S),
    ("latest_leader_epoch", L),
    ("segment_count", L),
    ("recovery_point", L),
    ("log_end_offset", L),
    ("error", S),
)
FILE_SCHEMA = _schema(
    ("logdir", S),
    ("path", S),
    ("file_type", S),
    ("partition_dir", S),
    ("topic", S),
    ("partition", INT),
    ("bytes", L),
    ("leftover", S),
    ("checkpoint", S),
    ("temporary", B),
    ("entries", T.ArrayType(T.ArrayType(S))),
    ("error", S),
)
LOGDIR_SCHEMA = _schema(
    ("logdir", S),
    ("path", S),
    ("exists", B),
    ("error", S),
    ("meta_error", S),
    ("clean_shutdown", B),
    ("lock_held_by_pid", L),
    ("kraft", B),
    ("meta", _schema(("version", INT), ("broker_id", INT), ("cluster_id", S))),
)
BROKER_FACTS_SCHEMA = _schema(("broker_id", INT), ("kafka_version", S), ("running", B), ("host", S))
BROKERS_SCHEMA = _schema(
    ("broker_id", INT), ("kafka_version", S), ("kafka_version_num", L), ("running", B), ("host", S), ("probed", B)
)
ZK_TOPIC_SCHEMA = _schema(
    ("topic", S),
    ("topic_id", S),
    ("partitions", T.MapType(S, T.ArrayType(INT))),
    ("replication_factor", INT),
    ("min_insync_replicas", INT),
    ("marked_for_deletion", B),
    ("error", S),
)
ZK_STATE_SCHEMA = _schema(
    ("topic", S), ("partition", INT), ("leader", INT), ("leader_epoch", L), ("isr", T.ArrayType(INT)), ("error", S)
)
ZK_BROKER_SCHEMA = _schema(("broker_id", INT), ("error", S))
ZK_CLUSTER_SCHEMA = _schema(("cluster_id", S), ("controller_id", INT))

FINDING_SCHEMA = _schema(
    ("rule", S),
    ("severity", S),
    ("broker_id", INT),
    ("log_dir", S),
    ("topic", S),
    ("partition", INT),
    ("segment", L),
    ("path", S),
    ("message", S),
    ("remediation", S),
    ("kafka_version", S),
)
FINDING_COLUMNS = FINDING_SCHEMA.fieldNames()
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
INDEX_FILE_BYTES = {"index": 10485760, "timeindex": 10485756}  # segment.index.bytes rounded per entry size


@dataclass
class Frames:
    """Staged facts, each row tagged with broker_id, kafka_version and kafka_version_num."""

    segments: DataFrame
    partitions: DataFrame
    files: DataFrame
    logdirs: DataFrame
    brokers: DataFrame  # broker facts: broker_id, kafka_version, kafka_version_num, running
    zk_topics: DataFrame | None = None
    zk_states: DataFrame | None = None
    zk_brokers: DataFrame | None = None
    zk_cluster: DataFrame | None = None
    # small facts read back to the driver once (a few rows per broker), used as literals by the rules
    fleet_version: str | None = None  # the newest Kafka version among the brokers (None: none known)
    fleet_version_num: int | None = None
    probed_brokers: tuple[int, ...] = ()  # brokers with probe output
    zk_registered: tuple[int, ...] = ()  # /brokers/ids in the ZooKeeper snapshot
    zk_cluster_id: str | None = None
    stopped_logdirs: tuple[str, ...] = ()  # "<broker_id>/<logdir>" without clean shutdown, no broker on it
    deep_logdirs: tuple[str, ...] = ()  # log dirs with deep-mode segment facts (batch offsets)

    @property
    def has_zk(self) -> bool:
        return self.zk_topics is not None

    def fleet_tagged(self, df: DataFrame) -> DataFrame:
        """Cluster-level findings (no single broker) take the newest broker's Kafka version."""
        return df.withColumn("kafka_version_num", F.lit(self.fleet_version_num).cast("long")).withColumn(
            "kafka_version", F.lit(self.fleet_version).cast("string")
        )


# ---- loading
def vnum(text: str) -> int:
    ver = KafkaVersion.parse(text)
    return ver.major * 1_000_000 + ver.minor * 1_000 + ver.patch


def _vnum_or_none(text: str | None) -> int | None:
    """As version_num, on the driver: None for a missing or unparsable version."""
    try:
        return vnum(text) if text else None
    except ValueError:
        return None


def _merged_schema(*schemas: T.StructType) -> T.StructType:
    """One schema holding every field of the given record schemas (a name has one type in all)."""
    fields: dict[str, T.StructField] = {"kind": T.StructField("kind", S, True)}
    for schema in schemas:
        for fld in schema.fields:
            known = fields.setdefault(fld.name, fld)
            assert known.dataType == fld.dataType, f"field {fld.name} has two types"
    return T.StructType(list(fields.values()))


PROBE_KINDS = {"segment": SEGMENT_SCHEMA, "partition": PARTITION_SCHEMA, "file": FILE_SCHEMA, "logdir": LOGDIR_SCHEMA}
# the kinds staged as Parquet beside the JSON Lines: the objects' names (fleet_doctor.staged_records, not imported
# here: it needs pyarrow) and, where its table stores a field in another type than the JSON parse gives, that type
STAGED_PARQUET = {"segment": "*.segments.parquet", "partition": "*.partitions.parquet", "file": "*.files.parquet"}
_STAGED_AS = {"file": {"entries": T.ArrayType(T.ArrayType(L))}}
ZK_KINDS = {
    "topic": ZK_TOPIC_SCHEMA,
    "partition_state": ZK_STATE_SCHEMA,
    "broker": ZK_BROKER_SCHEMA,
    "cluster": ZK_CLUSTER_SCHEMA,
}
UNLOADED_DIR_RE = r"-[0-9]+\.[0-9A-Za-z_-]+-(delete|stray)$"  # partition dir names Kafka never loads
ZK_RECORD_SCHEMA = _merged_schema(*ZK_KINDS.values())


def _of_kind(records: DataFrame, kind: str, schema: T.StructType, keep: tuple[str, ...] = ()) -> DataFrame:
    return records.where(F.col("kind") == kind).select(*keep, *schema.fieldNames())


def _logdir_key() -> Column:
    return F.concat_ws("/", F.col("broker_id").cast("string"), F.col("logdir"))


def _deep_facts(next_offset: Column, offset_errors: Column) -> Column:
    """The segment has deep-mode facts (batch offsets). A filter Parquet takes as it is: row groups of
    metadata-mode segments (both columns all null) are skipped on their statistics, never read."""
    return next_offset.isNotNull() | (offset_errors > 0)


def in_logdirs(keys: tuple[str, ...]) -> Column:
    """The row belongs to one of these log dirs (keys ``"<broker_id>/<logdir>"``, from the driver)."""
    return _logdir_key().isin(list(keys)) if keys else F.lit(False)


def _unloaded(col: Column) -> Column:
    # the cheap suffix test first: And stops there for nearly every row, the regex runs on the rest
    return (col.endswith("-delete") | col.endswith("-stray")) & col.rlike(UNLOADED_DIR_RE)


def read_staged(spark: SparkSession, probe_dir: str, kind: str) -> DataFrame:
    """The ``kind`` records staged as Parquet under ``probe_dir`` (any broker), with the columns of the kind's
    schema (null where the table has no such field) and ``broker_id``; empty when there are none."""
    schema = PROBE_KINDS[kind]
    stored = _STAGED_AS.get(kind, {})
    read = T.StructType([T.StructField(f.name, stored.get(f.name, f.dataType), True) for f in schema.fields])
    df = spark.read.schema(read).option("pathGlobFilter", STAGED_PARQUET[kind]).parquet(probe_dir)
    for name in stored:  # the type the JSON parse gives (for entries: numbers as their text)
        df = df.withColumn(name, F.col(name).cast(schema[name].dataType))
    return df.withColumn("broker_id", F.col("broker_id").cast("int"))


def _in_unloaded_dir(path: Column, partition_dir: Column) -> Column:
    """A segment or file record (its ``path``, and a file's ``partition_dir``) in a partition dir Kafka never loads
    again (ref §2.1): their files are reported by stray-dir only, not as segment or partition damage."""
    return _unloaded(path) | _unloaded(F.coalesce(partition_dir, F.lit("")))


def record_kind(value: Column) -> Column:
    """A probe line's ``kind``: read off the line's start where it comes first (the probe prints it first, in
    compact JSON), else found by a JSON path lookup."""
    head = F.regexp_extract(F.substring(value, 1, 40), r'^\{\s*"kind"\s*:\s*"([a-z_]+)"', 1)
    return F.coalesce(F.nullif(head, F.lit("")), F.get_json_object(value, "$.kind"))


def parse_probe_lines(raw: DataFrame) -> DataFrame:
    """Probe JSON Lines (``broker_id``, ``value``) -> ``broker_id``, ``kind`` and one struct per record kind
    (``<kind>_rec``), null but for the line's kind. Each line is parsed once, with its own kind's schema
    (narrower rows than one schema for every kind: ~30% less CPU here)."""
    kind = raw.select(
        F.col("broker_id").cast("int").alias("broker_id"), record_kind(F.col("value")).alias("kind"), "value"
    )
    return kind.select(
        "broker_id",
        "kind",
        *[F.when(F.col("kind") == k, F.from_json("value", sch)).alias(f"{k}_rec") for k, sch in PROBE_KINDS.items()],
    )


def load_frames(
    spark: SparkSession,
    probe_dir: str,
    brokers_path: str | None = None,
    zk_snapshot_path: str | None = None,
) -> Frames:
    """Read the staged inputs once each. Every probe line is parsed once (with its kind's schema) and
    the parsed facts are materialized with ``localCheckpoint``, each row holding only its kind's
    fields. Segment, partition and file records staged as Parquet are read from there (only the columns a
    plan uses), never parsed, and unioned with any JSON ones of their kind. The few facts the rules use
    as literals (brokers, log dirs whose lock is held, stopped log dirs, log dirs with deep-mode
    segment facts) come back to the driver in one small aggregation over both. Partition, file and
    log-dir facts are checkpointed again on their own: many rules read them, and the truncated lineage
    keeps those ~40 rule plans small (planning them dominates small audits). Segments, nearly all of
    the data, are read by a few plans only. No window or shuffle runs over all records: the two rules
    that order segments do it only in the log dirs where their facts exist (deep-mode output, a
    stopped broker)."""
    raw = spark.read.option("pathGlobFilter", "*.jsonl*").text(probe_dir)
    if "broker_id" not in raw.columns:
        raise ValueError(f"{probe_dir}: expected broker_id=<N>/ subdirectories holding probe JSON Lines")
    facts = {}
    if brokers_path:
        facts = {r.broker_id: r for r in spark.read.schema(BROKER_FACTS_SCHEMA).json(brokers_path).collect()}
    # parsed facts, each line once; filters only after the checkpoint: Spark pushes a filter below the
    # projection by inlining its columns, so each field a filter named would parse the line again
    checkpoint = parse_probe_lines(raw).localCheckpoint()
    path = F.coalesce(*[F.col(f"{k}_rec.path") for k in PROBE_KINDS if k != "partition"])
    unloaded = _in_unloaded_dir(path, F.col("file_rec.partition_dir"))
    # a line that did not parse at all has no log dir (every record of these kinds names its log dir)
    logdir = F.coalesce(*[F.col(f"{k}_rec.logdir") for k in PROBE_KINDS])
    parsed_ok = logdir.isNotNull()
    records = checkpoint.where(
        F.col("kind").isin(*PROBE_KINDS) & parsed_ok & ~((F.col("kind") != "partition") & unloaded)
    )
    # the records staged as Parquet (fleet_doctor.staged_records): read, never parsed; as for the JSON records,
    # a log dir named, and (but a partition record) not in a partition dir Kafka never loads
    unloaded_staged = {
        "segment": _in_unloaded_dir(F.col("path"), F.lit(None).cast(S)),
        "partition": F.lit(False),
        "file": _in_unloaded_dir(F.col("path"), F.col("partition_dir")),
    }
    columnar = {
        k: read_staged(spark, probe_dir, k).where(F.col("logdir").isNotNull() & ~unloaded_staged[k])
        for k in STAGED_PARQUET
    }
    # one pass over the checkpoint and the Parquet columns: per log dir, what the driver needs to know
    seg, ld = F.col("segment_rec"), F.col("logdir_rec")
    no_bool = F.lit(None).cast("boolean")
    per_logdir = (
        records.select(
            "broker_id",
            logdir.alias("logdir"),
            F.lit(True).alias("json"),
            ld.lock_held_by_pid.isNotNull().alias("locked"),
            (ld["exists"] & ~F.coalesce(ld.clean_shutdown, F.lit(False)) & ld.lock_held_by_pid.isNull()).alias(
                "unclean"
            ),
            _deep_facts(seg.next_offset, seg.offset_errors).alias("deep"),
        )
        .unionByName(
            columnar["segment"]
            .where(_deep_facts(F.col("next_offset"), F.col("offset_errors")))
            .select(
                "broker_id",
                "logdir",
                F.lit(False).alias("json"),
                no_bool.alias("locked"),
                no_bool.alias("unclean"),
                F.lit(True).alias("deep"),
            )
        )
        .groupBy("broker_id", "logdir")
        .agg(*[F.max(c).alias(c) for c in ("json", "locked", "unclean", "deep")])
        .collect()
    )
    # a broker's Parquet segments count only beside its JSON Lines, which staging commits last
    probed = {r.broker_id for r in per_logdir if r.json}
    broker_rows = [
        (
            bid,
            version,
            _vnum_or_none(version),
            bool(fact is not None and fact.running),
            fact.host if fact is not None else None,
            bid in probed,
        )
        for bid in sorted(b for b in probed | set(facts) if b is not None)
        for fact in [facts.get(bid)]
        for version in [fact.kafka_version if fact is not None else None]
    ]
    brokers = spark.createDataFrame(broker_rows, BROKERS_SCHEMA)
    versions = sorted((r[2], r[1]) for r in broker_rows if r[2] is not None)
    running = {r[0] for r in broker_rows if r[3]}

    def keys(pred: Callable) -> tuple[str, ...]:
        return tuple(sorted(f"{r.broker_id}/{r.logdir}" for r in per_logdir if r.broker_id is not None and pred(r)))

    def lookup(index: int, dtype: T.DataType) -> Column:
        pairs = [x for r in broker_rows for x in (F.lit(r[0]), F.lit(r[index]))]
        return (F.create_map(*pairs)[F.col("broker_id")] if pairs else F.lit(None)).cast(dtype)

    def tagged(df: DataFrame, *fields: str) -> DataFrame:
        return df.select(
            "broker_id",
            lookup(1, S).alias("kafka_version"),
            lookup(2, L).alias("kafka_version_num"),
            F.coalesce(lookup(3, B), F.lit(False)).alias("running"),
            *(fields or [c for c in df.columns if c != "broker_id"]),
        )

    probed_ids = sorted(b for b in probed if b is not None)

    def of_kind(kind: str) -> DataFrame:
        json_records = tagged(records.where(F.col("kind") == kind), f"{kind}_rec.*")
        if kind not in columnar:
            return json_records
        # a broker's Parquet records count only beside its JSON Lines, which staging commits last
        return json_records.unionByName(tagged(columnar[kind].where(F.col("broker_id").isin(probed_ids))))

    def materialized(df: DataFrame) -> DataFrame:
        # one partition per core: every rule plan over these facts runs a task per partition, and each task
        # deserializes its whole stage (the union of every rule), so a task per input file cost more than the rows
        return df.coalesce(spark.sparkContext.defaultParallelism).localCheckpoint()

    # a broker runs on this log dir: its facts say so, or a process holds the log dir's .lock
    locked = keys(lambda r: r.locked)
    frames = Frames(
        # live_active: the active segment of a running broker (its indexes are legitimately preallocated)
        segments=of_kind("segment").withColumn(
            "live_active", F.coalesce(F.col("active") & (F.col("running") | in_logdirs(locked)), F.lit(False))
        ),
        partitions=materialized(of_kind("partition")),
        files=materialized(of_kind("file")),
        logdirs=materialized(of_kind("logdir")),
        brokers=brokers,
        fleet_version=versions[-1][1] if versions else None,
        fleet_version_num=versions[-1][0] if versions else None,
        probed_brokers=tuple(probed_ids),
        stopped_logdirs=keys(lambda r: r.unclean and r.broker_id not in running),
        deep_logdirs=keys(lambda r: r.deep),
    )
    if zk_snapshot_path:
        # filtered after the checkpoint, as the probe records: one parse a line
        zk = spark.read.text(zk_snapshot_path).select(F.from_json("value", ZK_RECORD_SCHEMA).alias("r"))
        zk = zk.select("r.*").localCheckpoint().where(F.col("kind").isin(*ZK_KINDS))
        frames.zk_topics = _of_kind(zk, "topic", ZK_TOPIC_SCHEMA)
        frames.zk_states = _of_kind(zk, "partition_state", ZK_STATE_SCHEMA)
        frames.zk_brokers = _of_kind(zk, "broker", ZK_BROKER_SCHEMA)
        frames.zk_cluster = _of_kind(zk, "cluster", ZK_CLUSTER_SCHEMA)
        small = zk.where(F.col("kind").isin("broker", "cluster")).select("kind", "broker_id", "cluster_id", "error")
        small_rows = small.collect()
        frames.zk_registered = tuple(
            sorted(
                r.broker_id for r in small_rows if r.kind == "broker" and r.error is None and r.broker_id is not None
            )
        )
        frames.zk_cluster_id = next((r.cluster_id for r in small_rows if r.kind == "cluster" and r.cluster_id), None)
    return frames


# ---- finding construction
def severity(rule: Rule, version_num_col: Column) -> Column:
    """The rule's severity for each row's Kafka version (unknown version: the worst band)."""
    return _cached(("severity", rule.id, str(version_num_col)), lambda: _severity(rule, version_num_col))


def _severity(rule: Rule, version_num_col: Column) -> Column:
    worst = max(b.severity for b in rule.bands).value
    expr = None
    for band in sorted(rule.bands, key=lambda b: b.since, reverse=True):
        cond = version_num_col >= vnum(str(band.since))
        expr = F.when(cond, band.severity.value) if expr is None else expr.when(cond, band.severity.value)
    assert expr is not None
    return F.when(version_num_col.isNull(), worst).otherwise(expr.otherwise(rule.bands[0].severity.value))


def applies(rule: Rule, version_num_col: Column) -> Column:
    cond = version_num_col >= vnum(str(rule.applies_from))
    if rule.applies_until is not None:
        cond = cond & (version_num_col < vnum(str(rule.applies_until)))
    return version_num_col.isNull() | cond


def findings(
    df: DataFrame,
    rule_id: str,
    message: Column,
    *,
    path: Column,
    segment: Column | None = None,
    topic: Column | None = None,
    partition: Column | None = None,
    log_dir: Column | None = None,
    broker_id: Column | None = None,
) -> DataFrame:
    rule = get(rule_id)
    vcol = F.col("kafka_version_num") if "kafka_version_num" in df.columns else F.lit(None).cast("long")
    kver = F.col("kafka_version") if "kafka_version" in df.columns else F.lit(None).cast("string")
    return df.where(applies(rule, vcol)).select(
        F.lit(rule_id).alias("rule"),
        severity(rule, vcol).alias("severity"),
        (broker_id if broker_id is not None else F.col("broker_id")).cast("int").alias("broker_id"),
        (log_dir if log_dir is not None else F.col("logdir")).cast("string").alias("log_dir"),
        (topic if topic is not None else F.col("topic")).cast("string").alias("topic"),
        (partition if partition is not None else F.col("partition")).cast("int").alias("partition"),
        (segment if segment is not None else F.lit(None)).cast("long").alias("segment"),
        path.cast("string").alias("path"),
        message.cast("string").alias("message"),
        F.lit(rule.remediation.value).alias("remediation"),
        kver.cast("string").alias("kafka_version"),
    )


# Columns built from names and literals only are reusable across DataFrames; detect() builds some of
# them dozens of times, and each costs several JVM round trips. Cached per detect() run.
_COLUMN_CACHE: dict[tuple, Column] = {}


def _cached(key: tuple, build: Callable[[], Column]) -> Column:
    if key not in _COLUMN_CACHE:
        _COLUMN_CACHE[key] = build()
    return _COLUMN_CACHE[key]


def seg_file(ext: str) -> Column:
    """path/<base offset, 20 digits>.<ext> of a segment record."""
    return _cached(
        ("seg_file", ext),
        lambda: F.concat(
            F.col("path"), F.lit("/"), F.lpad(F.col("base_offset").cast("string"), 20, "0"), F.lit("." + ext)
        ),
    )


def _at_least(version: str) -> Column:
    return F.coalesce(F.col("kafka_version_num") >= vnum(version), F.lit(True))


# ---- segment and index rules
# Rules that read one fact frame without a join are Checks: detect() evaluates all the checks of a
# frame in one pass (one finding struct per check and row, the non-matching ones dropped), so a few
# dozen such rules cost one scan and one small plan instead of a union branch each.
@dataclass(frozen=True)
class Check:
    on: str  # the fact frame: "segments", "partitions", "files" or "logdirs"
    rule_id: str
    cond: Column
    message: Column
    path: Column
    segment: Column | None = None
    topic: Column | None = None
    partition: Column | None = None
    severity: Column | None = None  # overrides the rule's version band where it is not null


def _finding_struct(c: Check) -> Column:
    rule = get(c.rule_id)
    vcol = F.col("kafka_version_num")  # every fact frame carries its broker's version
    return F.when(
        applies(rule, vcol) & c.cond,
        F.struct(
            F.lit(rule.id).alias("rule"),
            (severity(rule, vcol) if c.severity is None else F.coalesce(c.severity, severity(rule, vcol))).alias(
                "severity"
            ),
            F.col("broker_id").cast("int").alias("broker_id"),
            F.col("logdir").cast("string").alias("log_dir"),
            (c.topic if c.topic is not None else F.col("topic")).cast("string").alias("topic"),
            (c.partition if c.partition is not None else F.col("partition")).cast("int").alias("partition"),
            (c.segment if c.segment is not None else F.lit(None)).cast("long").alias("segment"),
            c.path.cast("string").alias("path"),
            c.message.cast("string").alias("message"),
            F.lit(rule.remediation.value).alias("remediation"),
            F.col("kafka_version").cast("string").alias("kafka_version"),
        ),
    )


def run_checks(df: DataFrame, checks: list[Check]) -> DataFrame:
    # the rows that fire any check are found first by a plain (code-generated) filter; only those few
    # build the array of finding structs, whose null-filtering lambda Spark evaluates row by row
    hit = None
    for c in checks:
        cond = F.coalesce(applies(get(c.rule_id), F.col("kafka_version_num")) & c.cond, F.lit(False))
        hit = cond if hit is None else hit | cond
    found = F.filter(F.array(*[_finding_struct(c) for c in checks]), lambda x: x.isNotNull())
    return df.where(hit).select(F.explode(found).alias("f")).select("f.*")


def _seg(rule_id: str, cond: Column, message: Column, ext: str) -> Check:
    return Check("segments", rule_id, cond, message, path=seg_file(ext), segment=F.col("base_offset"))


def index_untrimmed(f: Frames) -> list[Check]:
    """A zero tail outside the active segment of a running broker (the active one is legitimately
    preallocated while the broker runs). On the active segment of a broker stopped without a clean marker
    recovery rebuilds the index at the next start in every version (ref §2.4: the active segment is always
    recovered), so there it costs restart time (warning) instead of failing or misleading Kafka."""
    rebuilt = _recovered_at_start(f)
    return [
        replace(
            _seg(
                "index-untrimmed",
                _stale_zero_tail(idx),
                F.format_string(
                    f"%s: {idx} holds %d real entries and a preallocated zero tail of %d entries (%d bytes): "
                    "not trimmed by a clean close%s",
                    seg_file(idx),
                    F.col(f"{idx}_entries"),
                    F.col(f"{idx}_zero_tail_entries"),
                    F.col(f"{idx}_bytes"),
                    F.when(rebuilt, F.lit("; the next start recovers this active segment and rebuilds it")).otherwise(
                        F.lit("")
                    ),
                ),
                idx,
            ),
            severity=F.when(rebuilt, F.lit("warning")),
        )
        for idx in ("index", "timeindex")
    ]


def _recovered_at_start(f: Frames) -> Column:
    """The active segment of a log dir whose broker is stopped and left no .kafka_cleanshutdown: recovered
    (indexes reset and rebuilt) at the next start."""
    return F.col("active") & in_logdirs(f.stopped_logdirs)


def _stale_zero_tail(idx: str) -> Column:
    """A zero tail Kafka will read as entries at the next start: any but the active segment's of a
    running broker (that one is trimmed by the clean close; ref §1.2)."""
    return (F.col(f"{idx}_zero_tail_entries") > 0) & ~F.col("live_active")


def index_last_offset(f: Frames) -> list[Check]:
    """Kafka's sanity check sees the whole file: with a zero tail its last entry is (base, 0)."""
    kafka_last = F.when(_stale_zero_tail("index"), F.col("base_offset")).otherwise(F.col("index_last_offset"))
    strict = ~_at_least("2.0.0")  # <= 1.1: last offset must be > base; 2.0+: must be >= base
    bad = F.when(strict, kafka_last <= F.col("base_offset")).otherwise(kafka_last < F.col("base_offset"))
    msg = F.format_string(
        "Corrupt index found, index file (%s) has non-zero size but the last offset is %d and the base offset is %d",
        seg_file("index"),
        kafka_last,
        F.col("base_offset"),
    )
    cond = (
        (F.col("index_bytes") >= 8)
        & kafka_last.isNotNull()
        & bad
        & ~(_stale_zero_tail("index") & _recovered_at_start(f))
    )
    return [_seg("index-last-offset", cond, msg, "index")]


def index_size(f: Frames) -> list[Check]:
    return [
        _seg(
            "index-size",
            F.col(f"{idx}_remainder") > 0,
            F.format_string(
                f"%s: {idx} file is corrupt, found %d bytes which is not a multiple of {esize}",
                seg_file(idx),
                F.col(f"{idx}_bytes"),
            ),
            idx,
        )
        for idx, esize in (("index", 8), ("timeindex", 12))
    ]


def index_not_monotonic(f: Frames) -> list[Check]:
    return [
        _seg(
            "index-not-monotonic",
            F.col(f"{idx}_monotonic") == F.lit(False),
            F.format_string(
                f"%s: {idx} entries go backwards at entry %d", seg_file(idx), F.col(f"{idx}_first_violation")
            ),
            idx,
        )
        for idx in ("index", "timeindex")
    ]


def index_beyond_log(f: Frames) -> list[Check]:
    meta = (F.col("index_entries") > 0) & F.col("has_log") & (F.col("index_last_position") >= F.col("log_bytes"))
    deep = F.coalesce(F.col("index_beyond_log"), F.lit(0)) > 0
    msg = F.format_string(
        "%s: index entries point at or past the end of the log (last entry position %d, log %d bytes, "
        "%d entries beyond the valid data)",
        seg_file("index"),
        F.col("index_last_position"),
        F.col("log_bytes"),
        F.coalesce(F.col("index_beyond_log"), F.lit(1)),
    )
    return [_seg("index-beyond-log", meta | deep, msg, "index")]


def timeindex_last_timestamp(f: Frames) -> list[Check]:
    kafka_last = F.when(_stale_zero_tail("timeindex"), F.lit(0)).otherwise(F.col("timeindex_last_timestamp"))
    first = F.col("timeindex_first_timestamp")
    msg = F.format_string(
        "Corrupt time index found, time index file (%s) has non-zero size but the last timestamp is %d which is "
        "less than the first timestamp %d",
        seg_file("timeindex"),
        kafka_last,
        first,
    )
    zero_tail_rebuilt = _stale_zero_tail("timeindex") & _recovered_at_start(f)  # index-untrimmed says it
    return [
        _seg(
            "timeindex-last-timestamp", first.isNotNull() & (kafka_last < first) & ~zero_tail_rebuilt, msg, "timeindex"
        )
    ]


def index_orphan(f: Frames) -> list[Check]:
    path = F.when(F.col("has_index"), seg_file("index")).otherwise(seg_file("timeindex"))
    return [
        Check(
            "segments",
            "index-orphan",
            ~F.col("has_log") & (F.col("has_index") | F.col("has_timeindex")),
            F.format_string("Found an orphaned index file %s, with no corresponding log file", path),
            path=path,
            segment=F.col("base_offset"),
        )
    ]


def index_missing(f: Frames) -> list[Check]:
    msg = F.format_string(
        "Could not find offset index file corresponding to log file %s (%d bytes): rebuilt at startup",
        seg_file("log"),
        F.col("log_bytes"),
    )
    return [_seg("index-missing", F.col("has_log") & ~F.col("has_index"), msg, "log")]


def segment_leftover(f: Frames) -> list[Check]:
    return [
        Check(
            "files",
            "segment-leftover",
            F.col("file_type") == "segment_leftover",
            F.format_string(
                "%s: leftover .%s file of an interrupted compaction, split or deletion", "path", "leftover"
            ),
            path=F.col("path"),
            segment=F.regexp_extract(F.col("path"), r"(\d{20})\.[a-z]+\.[a-z]+$", 1).cast("long"),
        )
    ]


def _with_next_base(segments: DataFrame) -> DataFrame:
    """Segments with the base offset of their partition's next segment (null for the last)."""
    order = Window.partitionBy("broker_id", "logdir", "path").orderBy("base_offset")
    return segments.withColumn("next_base", F.lead("base_offset").over(order))


def segment_overlap(f: Frames) -> DataFrame:
    # only deep-mode facts (batch offsets) can show either problem: the segments of other log dirs
    # are neither ordered nor read
    segs = _with_next_base(f.segments.where(in_logdirs(f.deep_logdirs)))
    overlap = (
        F.col("next_offset").isNotNull() & F.col("next_base").isNotNull() & (F.col("next_offset") > F.col("next_base"))
    )
    backwards = F.coalesce(F.col("offset_errors"), F.lit(0)) > 0
    msg = F.when(
        overlap,
        F.format_string(
            "%s: segment ends at offset %d, beyond the next segment's base offset %d",
            seg_file("log"),
            F.col("next_offset") - 1,
            F.col("next_base"),
        ),
    ).otherwise(
        F.format_string(
            "%s: %d batch(es) with offsets going backwards or below the base offset (first at byte %d)",
            seg_file("log"),
            F.col("offset_errors"),
            F.col("first_offset_error_position"),
        )
    )
    return findings(
        segs.where(overlap | backwards), "segment-overlap", msg, path=seg_file("log"), segment=F.col("base_offset")
    )


def log_torn_tail(f: Frames) -> list[Check]:
    msg = F.format_string(
        "%s: %d of %d bytes form valid batches; recovery will truncate the rest (%s)",
        seg_file("log"),
        F.col("valid_bytes"),
        F.col("log_bytes"),
        F.col("tail_error"),
    )
    return [_seg("log-torn-tail", F.col("torn_tail") == F.lit(True), msg, "log")]


def log_crc(f: Frames) -> list[Check]:
    msg = F.format_string(
        "%s: batch at byte %d fails its CRC (%s)",
        seg_file("log"),
        F.col("first_crc_error_position"),
        F.col("tail_error"),
    )
    return [_seg("log-crc", F.col("crc_errors") > 0, msg, "log")]


def index_entry_mismatch(f: Frames) -> list[Check]:
    # 2.0+ indexes (largest offset of an append, position of its first batch): offset past the
    # batch is benign there (kafka-reference §1.1, §2.6)
    after = F.when(_at_least("2.0.0"), F.lit(0)).otherwise(F.coalesce(F.col("index_offset_after_batch"), F.lit(0)))
    bad = (
        F.coalesce(F.col("index_not_batch_start"), F.lit(0))
        + F.coalesce(F.col("index_offset_before_batch"), F.lit(0))
        + after
    )
    msg = F.format_string(
        "%s: %d offset-index entries do not point at the start of a batch containing their offset",
        seg_file("index"),
        bad,
    )
    return [_seg("index-entry-mismatch", bad > 0, msg, "index")]


def file_unreadable(f: Frames) -> list[Check]:
    """Read errors the specific rules do not already cover."""
    covered = ["partition_metadata", "leader_epoch_checkpoint", "offset_checkpoint", "meta_properties"]
    err = F.col("error").isNotNull()
    return [
        Check("segments", "file-unreadable", err, F.col("error"), path=F.col("path"), segment=F.col("base_offset")),
        Check("files", "file-unreadable", err & ~F.col("file_type").isin(covered), F.col("error"), path=F.col("path")),
        Check("partitions", "file-unreadable", err, F.col("error"), path=F.col("path")),
        Check(
            "logdirs",
            "file-unreadable",
            err | F.col("meta_error").isNotNull(),
            F.coalesce("error", "meta_error"),
            path=F.col("path"),
            topic=F.lit(None),
            partition=F.lit(None),
        ),
    ]


# ---- partition directory metadata
# Kafka loads live partition dirs and -future ones (a replica being moved between log dirs); -delete
# and -stray dirs are never read again (ref §2.1)
def _loaded() -> Column:
    return F.col("dir_state").isin("live", "future")


def _loaded_partitions(f: Frames) -> DataFrame:
    return f.partitions.where(_loaded())


def _part(rule_id: str, cond: Column, message: Column, leaf: str) -> Check:
    return Check("partitions", rule_id, _loaded() & cond, message, path=F.concat(F.col("path"), F.lit("/" + leaf)))


def partition_metadata_malformed(f: Frames) -> list[Check]:
    err = F.col("partition_metadata_error")
    return [_part("partition-metadata-malformed", err.isNotNull(), err, "partition.metadata")]


def leader_epoch_malformed(f: Frames) -> list[Check]:
    err = F.col("leader_epoch_error")
    return [_part("leader-epoch-malformed", err.isNotNull(), err, "leader-epoch-checkpoint")]


def leader_epoch_not_monotonic(f: Frames) -> list[Check]:
    e = F.col("leader_epochs")
    decreasing = F.exists(
        F.sequence(F.lit(2), F.greatest(F.size(e), F.lit(2))),
        lambda i: (
            (F.size(e) >= i)
            & (
                (F.element_at(F.element_at(e, i), 1) < F.element_at(F.element_at(e, i - 1), 1))
                | (F.element_at(F.element_at(e, i), 2) < F.element_at(F.element_at(e, i - 1), 2))
            )
        ),
    )
    path = F.concat(F.col("path"), F.lit("/leader-epoch-checkpoint"))
    msg = F.format_string("%s: epochs or start offsets decrease: %s", path, F.to_json(e))
    return [_part("leader-epoch-not-monotonic", (F.size(e) > 1) & decreasing, msg, "leader-epoch-checkpoint")]


def leader_epoch_ahead(f: Frames) -> list[Check | DataFrame]:
    e = F.col("leader_epochs")
    path = F.concat(F.col("path"), F.lit("/leader-epoch-checkpoint"))
    beyond = F.exists(e, lambda x: F.element_at(x, 2) > F.col("log_end_offset"))
    local = _part(
        "leader-epoch-ahead",
        F.col("log_end_offset").isNotNull() & beyond,
        F.format_string(
            "%s: a leader epoch starts beyond the log end offset %d: %s", path, "log_end_offset", F.to_json(e)
        ),
        "leader-epoch-checkpoint",
    )
    if not f.has_zk:
        return [local]
    assert f.zk_states is not None
    zk = _live_partitions(f).join(
        f.zk_states.where(F.col("error").isNull()).select(
            "topic", "partition", F.col("leader_epoch").alias("zk_leader_epoch")
        ),
        ["topic", "partition"],
    )
    ahead = zk.where(F.col("latest_leader_epoch") > F.col("zk_leader_epoch"))
    zk_f = findings(
        ahead,
        "leader-epoch-ahead",
        F.format_string(
            "%s: latest leader epoch %d is above ZooKeeper's leader_epoch %d",
            path,
            "latest_leader_epoch",
            "zk_leader_epoch",
        ),
        path=path,
    )
    return [local, zk_f]


def stray_dir(f: Frames) -> list[Check]:
    msg = F.format_string("%s: lingering -%s partition directory", "path", "dir_state")
    return [Check("partitions", "stray-dir", F.col("dir_state") != "live", msg, path=F.col("path"))]


# ---- cross-source
def _live_partitions(f: Frames) -> DataFrame:
    return f.partitions.where(F.col("dir_state") == "live")


def topic_id_mismatch(f: Frames) -> DataFrame:
    assert f.zk_topics is not None
    zk = f.zk_topics.where(F.col("topic_id").isNotNull()).select("topic", F.col("topic_id").alias("zk_topic_id"))
    hit = (
        _live_partitions(f)
        .where(F.col("topic_id").isNotNull())
        .join(zk, "topic")
        .where(F.col("topic_id") != F.col("zk_topic_id"))
    )
    path = F.concat(F.col("path"), F.lit("/partition.metadata"))
    msg = F.format_string(
        "%s holds topic ID %s but ZooKeeper /brokers/topics/%s has %s: the replica leaves ISR on restart",
        path,
        "topic_id",
        "topic",
        "zk_topic_id",
    )
    return findings(hit, "topic-id-mismatch", msg, path=path)


def topic_id_split(f: Frames) -> DataFrame:
    ids = _live_partitions(f).where(F.col("topic_id").isNotNull())
    # replicas per ID; the ones outside the single most common ID are flagged (all of them on a tie:
    # without a majority there is no telling which side is right)
    per_id = (
        ids.groupBy("topic", "topic_id")
        .agg(F.count("*").alias("n"))
        .withColumn("top", F.max("n").over(Window.partitionBy("topic")))
    )
    per_topic = per_id.groupBy("topic").agg(
        F.count("*").alias("n_ids"),
        F.sum(F.when(F.col("n") == F.col("top"), 1).otherwise(0)).alias("n_top"),
        F.array_sort(F.collect_list("topic_id")).alias("all_ids"),
    )
    hit = (
        ids.join(per_id.select("topic", "topic_id", "n", "top"), ["topic", "topic_id"])
        .join(per_topic.where(F.col("n_ids") > 1), "topic")
        .where((F.col("n") < F.col("top")) | (F.col("n_top") > 1))
    )
    path = F.concat(F.col("path"), F.lit("/partition.metadata"))
    msg = F.format_string(
        "%s holds topic ID %s while other replicas of %s hold %s",
        path,
        F.col("topic_id"),
        F.col("topic"),
        F.array_join(F.col("all_ids"), ", "),
    )
    return findings(hit, "topic-id-split", msg, path=path)


def topic_id_missing_in_zk(f: Frames) -> DataFrame:
    assert f.zk_topics is not None
    # IBP >= 2.8 on the fleet: the newest audited broker (or unknown) decides
    replica_ids = (
        _live_partitions(f)
        .where(F.col("topic_id").isNotNull())
        .groupBy("topic")
        .agg(F.array_sort(F.collect_set("topic_id")).alias("replica_ids"))
    )
    hit = f.fleet_tagged(f.zk_topics.where(F.col("topic_id").isNull() & F.col("error").isNull())).join(
        replica_ids, "topic", "left"
    )
    msg = F.format_string(
        "/brokers/topics/%s has no topic_id: the next controller failover mints a new one (replicas hold %s)",
        F.col("topic"),
        F.coalesce(F.array_join("replica_ids", ", "), F.lit("no topic ID")),
    )
    return findings(
        hit,
        "topic-id-missing-in-zk",
        msg,
        path=F.concat(F.lit("zk:/brokers/topics/"), F.col("topic")),
        broker_id=F.lit(None),
        log_dir=F.lit(None),
        partition=F.lit(None),
    )


def _assignment(f: Frames) -> DataFrame:
    assert f.zk_topics is not None
    return f.zk_topics.select("topic", F.explode("partitions").alias("p", "replicas")).select(
        "topic", F.col("p").cast("int").alias("partition"), F.explode("replicas").alias("broker_id")
    )


def replica_not_assigned(f: Frames) -> DataFrame:
    assert f.zk_topics is not None
    assigned = _assignment(f)
    # a topic whose znode could not be read has no known assignment: no judgement on its replicas
    unreadable = f.zk_topics.where(F.col("partitions").isNull()).select("topic")
    known = f.zk_topics.where(F.col("partitions").isNotNull()).select("topic", F.lit(True).alias("known"))
    parts = _live_partitions(f).where(F.col("topic") != "__cluster_metadata").join(unreadable, "topic", "left_anti")
    hit = parts.join(assigned, ["topic", "partition", "broker_id"], "left_anti").join(known, "topic", "left")
    msg = F.when(
        F.col("known").isNull(),
        F.format_string("%s: topic %s is not in ZooKeeper", "path", "topic"),
    ).otherwise(
        F.format_string(
            "%s: the assignment does not place %s-%d on broker %d", "path", "topic", "partition", "broker_id"
        )
    )
    return findings(hit, "replica-not-assigned", msg, path=F.col("path"))


def replica_dir_missing(f: Frames) -> DataFrame:
    assert f.zk_topics is not None
    # only audited brokers; a topic being deleted loses its directories (renamed -delete) before its znode
    deleting = f.zk_topics.where(F.coalesce("marked_for_deletion", F.lit(False))).select("topic")
    expected = (
        _assignment(f).where(F.col("broker_id").isin(list(f.probed_brokers))).join(deleting, "topic", "left_anti")
    )
    present = _live_partitions(f).select("topic", "partition", "broker_id")
    hit = expected.join(present, ["topic", "partition", "broker_id"], "left_anti").join(
        f.brokers.select("broker_id", "kafka_version", "kafka_version_num"), "broker_id", "left"
    )
    msg = F.format_string(
        "assigned replica %s-%d has no partition directory on broker %d", "topic", "partition", "broker_id"
    )
    return findings(
        hit, "replica-dir-missing", msg, path=F.format_string("%s-%d", "topic", "partition"), log_dir=F.lit(None)
    )


def _zk_partition_rules(f: Frames) -> DataFrame:
    assert f.zk_topics is not None and f.zk_states is not None and f.zk_brokers is not None
    replicas = f.zk_topics.select("topic", F.explode("partitions").alias("p", "replicas")).select(
        "topic", F.col("p").cast("int").alias("partition"), "replicas"
    )
    st = f.fleet_tagged(f.zk_states.where(F.col("error").isNull()).join(replicas, ["topic", "partition"]))
    path = F.format_string("zk:/brokers/topics/%s/partitions/%d/state", "topic", "partition")
    urp = st.where(F.size("isr") < F.size("replicas"))
    urp_f = findings(
        urp,
        "under-replicated",
        F.format_string(
            "%s-%d: ISR %s is smaller than the replicas %s",
            "topic",
            "partition",
            F.to_json("isr"),
            F.to_json("replicas"),
        ),
        path=path,
        broker_id=F.lit(None),
        log_dir=F.lit(None),
    )
    # a snapshot taken while no broker was registered (a post-mortem of a stopped cluster) cannot tell
    # whether a leader is alive: only leader -1 counts as offline then
    unregistered = ~F.col("leader").isin(list(f.zk_registered)) if f.zk_registered else F.lit(False)
    off = st.where((F.col("leader") < 0) | unregistered)
    off_f = findings(
        off,
        "offline-partition",
        F.format_string("%s-%d has no live leader (leader %d)", "topic", "partition", "leader"),
        path=path,
        broker_id=F.lit(None),
        log_dir=F.lit(None),
    )
    return urp_f.unionByName(off_f)


def unsafe_replication(f: Frames) -> DataFrame:
    assert f.zk_topics is not None
    t = f.fleet_tagged(f.zk_topics.where(F.col("error").isNull() & F.col("replication_factor").isNotNull()))
    hit = t.where(
        (F.col("replication_factor") <= 1)
        | (F.col("min_insync_replicas").isNotNull() & (F.col("min_insync_replicas") >= F.col("replication_factor")))
    )
    msg = F.format_string(
        "topic %s: replication factor %d, min.insync.replicas %s: restarting any of its brokers makes partitions "
        "unavailable",
        "topic",
        "replication_factor",
        F.coalesce(F.col("min_insync_replicas").cast("string"), F.lit("default")),
    )
    return findings(
        hit,
        "unsafe-replication",
        msg,
        path=F.concat(F.lit("zk:/brokers/topics/"), F.col("topic")),
        broker_id=F.lit(None),
        log_dir=F.lit(None),
        partition=F.lit(None),
    )


# ---- log directory
def checkpoint_malformed(f: Frames) -> list[Check]:
    cond = (
        (F.col("file_type") == "offset_checkpoint")
        & ~F.coalesce("temporary", F.lit(False))
        & F.col("error").isNotNull()
    )
    return [
        Check(
            "files",
            "checkpoint-malformed",
            cond,
            F.col("error"),
            path=F.col("path"),
            topic=F.lit(None),
            partition=F.lit(None),
        )
    ]


def checkpoint_dangling(f: Frames) -> DataFrame:
    cps = f.files.where((F.col("file_type") == "offset_checkpoint") & ~F.coalesce("temporary", F.lit(False)))
    entries = cps.select(
        "broker_id",
        "logdir",
        "kafka_version",
        "kafka_version_num",
        F.col("path").alias("cp_path"),
        F.explode("entries").alias("e"),
    ).select(
        "broker_id",
        "logdir",
        "kafka_version",
        "kafka_version_num",
        "cp_path",
        F.element_at("e", 1).alias("topic"),
        F.element_at("e", 2).cast("int").alias("partition"),
        F.element_at("e", 3).alias("offset"),
    )
    dirs = _loaded_partitions(f).select("broker_id", "logdir", "topic", "partition")
    hit = entries.join(dirs, ["broker_id", "logdir", "topic", "partition"], "left_anti")
    msg = F.format_string(
        "%s lists %s-%d (offset %s) but the log dir has no such partition directory",
        "cp_path",
        "topic",
        "partition",
        "offset",
    )
    return findings(hit, "checkpoint-dangling", msg, path=F.col("cp_path"))


def unclean_shutdown(f: Frames) -> DataFrame:
    stopped = f.logdirs.where(
        F.col("exists")
        & ~F.coalesce("clean_shutdown", F.lit(False))
        & ~F.col("running")
        & F.col("lock_held_by_pid").isNull()
    )
    # work at the next start: segments from the one holding the recovery point onwards (only the
    # segments of stopped log dirs are ordered and joined with their partition's recovery point)
    recovery_points = f.partitions.groupBy("broker_id", "logdir", "path").agg(
        F.max("recovery_point").alias("partition_recovery_point")
    )
    segs = _with_next_base(f.segments.where(in_logdirs(f.stopped_logdirs))).join(
        recovery_points, ["broker_id", "logdir", "path"], "left"
    )
    above = (
        segs.where(
            F.col("next_base").isNull() | (F.col("next_base") > F.coalesce("partition_recovery_point", F.lit(0)))
        )
        .groupBy("broker_id", "logdir")
        .agg(
            F.count("*").alias("recover_segments"),
            F.sum(F.coalesce("log_bytes", F.lit(0))).alias("recover_bytes"),
        )
    )
    hit = stopped.join(above, ["broker_id", "logdir"], "left")
    msg = F.format_string(
        "%s has no .kafka_cleanshutdown: the next start recovers %d segment(s), %d bytes above the recovery points",
        "logdir",
        F.coalesce("recover_segments", F.lit(0)),
        F.coalesce("recover_bytes", F.lit(0)),
    )
    return findings(hit, "unclean-shutdown", msg, path=F.col("logdir"), topic=F.lit(None), partition=F.lit(None))


def meta_mismatch(f: Frames) -> DataFrame:
    ld = f.logdirs.where(F.col("meta").isNotNull())
    per_broker = ld.groupBy("broker_id").agg(
        F.count_distinct("meta.broker_id").alias("n_ids"),
        F.count_distinct("meta.cluster_id").alias("n_clusters"),
        F.array_sort(F.collect_set("meta.cluster_id")).alias("clusters"),
    )
    hit = ld.join(per_broker.where((F.col("n_ids") > 1) | (F.col("n_clusters") > 1)), "broker_id")
    msg = F.format_string(
        "%s/meta.properties (broker.id %d, cluster.id %s) disagrees with the broker's other log dirs (cluster ids %s)",
        "logdir",
        "meta.broker_id",
        "meta.cluster_id",
        F.array_join("clusters", ", "),
    )
    out = findings(
        hit,
        "meta-mismatch",
        msg,
        path=F.concat("logdir", F.lit("/meta.properties")),
        topic=F.lit(None),
        partition=F.lit(None),
    )
    if f.zk_cluster_id is None:
        return out
    foreign = ld.withColumn("zk_cluster_id", F.lit(f.zk_cluster_id)).where(
        F.col("meta.cluster_id").isNotNull() & (F.col("meta.cluster_id") != F.col("zk_cluster_id"))
    )
    msg2 = F.format_string(
        "%s/meta.properties has cluster.id %s but ZooKeeper /cluster/id is %s",
        "logdir",
        "meta.cluster_id",
        "zk_cluster_id",
    )
    return out.unionByName(
        findings(
            foreign,
            "meta-mismatch",
            msg2,
            path=F.concat("logdir", F.lit("/meta.properties")),
            topic=F.lit(None),
            partition=F.lit(None),
        )
    )


# ---- the registry of detectors: rule id -> function (several ids may share one function)
DETECTORS: dict[str, Callable[[Frames], DataFrame | list[Check] | list[Check | DataFrame]]] = {
    "index-untrimmed": index_untrimmed,
    "index-last-offset": index_last_offset,
    "index-size": index_size,
    "index-not-monotonic": index_not_monotonic,
    "index-beyond-log": index_beyond_log,
    "timeindex-last-timestamp": timeindex_last_timestamp,
    "index-orphan": index_orphan,
    "index-missing": index_missing,
    "segment-leftover": segment_leftover,
    "segment-overlap": segment_overlap,
    "log-torn-tail": log_torn_tail,
    "log-crc": log_crc,
    "index-entry-mismatch": index_entry_mismatch,
    "file-unreadable": file_unreadable,
    "partition-metadata-malformed": partition_metadata_malformed,
    "leader-epoch-malformed": leader_epoch_malformed,
    "leader-epoch-not-monotonic": leader_epoch_not_monotonic,
    "leader-epoch-ahead": leader_epoch_ahead,
    "stray-dir": stray_dir,
    "topic-id-mismatch": topic_id_mismatch,
    "topic-id-split": topic_id_split,
    "topic-id-missing-in-zk": topic_id_missing_in_zk,
    "replica-not-assigned": replica_not_assigned,
    "replica-dir-missing": replica_dir_missing,
    "under-replicated": _zk_partition_rules,  # also emits offline-partition
    "unsafe-replication": unsafe_replication,
    "checkpoint-malformed": checkpoint_malformed,
    "checkpoint-dangling": checkpoint_dangling,
    "unclean-shutdown": unclean_shutdown,
    "meta-mismatch": meta_mismatch,
}
EMITTED_BY = {"offline-partition": "under-replicated"}


def detect(f: Frames, partial_scope: bool = False) -> tuple[DataFrame, dict[str, str]]:
    """All findings, plus {rule id: reason} for rules that could not be evaluated. ``partial_scope``: the run
    staged only some of the fleet's brokers on purpose (the audit DAG's ``brokers`` param)."""
    _COLUMN_CACHE.clear()  # Columns belong to the active session
    skipped: dict[str, str] = {}
    parts: list[DataFrame] = []
    checks: dict[str, list[Check]] = {}
    for rule in RULES:
        if rule.id in EMITTED_BY:
            if EMITTED_BY[rule.id] in skipped:
                skipped[rule.id] = skipped[EMITTED_BY[rule.id]]
            continue
        if rule.needs is Needs.ZOOKEEPER and not f.has_zk and rule.id not in ("leader-epoch-ahead",):
            skipped[rule.id] = "no ZooKeeper snapshot given"
            continue
        # rules that compare brokers cannot judge from some of them (the odd replica may be out of scope, or a tie
        # blames the right one)
        if partial_scope and rule.needs is Needs.FLEET:
            skipped[rule.id] = "only some brokers audited in this run"
            continue
        out = DETECTORS[rule.id](f)
        for item in out if isinstance(out, list) else [out]:
            if isinstance(item, Check):
                checks.setdefault(item.on, []).append(item)
            else:
                parts.append(item)
    bases = {
        "segments": f.segments,
        "partitions": f.partitions,
        "files": f.files,
        "logdirs": f.logdirs,
    }
    fused = [run_checks(bases[on], cs) for on, cs in checks.items()]
    return union_all(fused + parts), skipped


def union_all(parts: list[DataFrame]) -> DataFrame:
    """Union of finding frames (all shaped by ``findings``, so by position), as a balanced tree:
    a chain of ~40 unions re-analyzes the growing plan at every step."""
    for p in parts:
        assert p.columns == FINDING_COLUMNS, p.columns
    while len(parts) > 1:
        parts = [parts[i].union(parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]
