"""Detection's input: the staged facts of an audit run, loaded once each into ``Frames``.

- probe output: ``<probe_dir>/broker_id=<N>/*.jsonl[.gz]`` (docs/probe-schema.md), with the segment, partition and
  file records as ``*.{segments,partitions,files}.parquet`` beside them (fleet_doctor.staging);
- broker facts: JSON Lines ``{"broker_id": N, "kafka_version": "3.6.0", "running": false}``;
- cluster facts (optional): a ZooKeeper snapshot's JSON Lines (docs/zk-snapshot-schema.md), or the same records
  decoded from a KRaft cluster's metadata log (docs/cluster-metadata-schema.md: its first record is
  ``cluster_metadata``, its brokers carry ``fenced``);
- controllers (optional, KRaft): JSON Lines of each controller's ``cluster_metadata`` record, each followed by its
  ``metadata_problem`` records (as ``fleet-doctor cluster-metadata`` prints them).

What detection reads of each probe record kind is ``fleet_doctor.records``' definition (``spark_schema``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from pyspark import inheritable_thread_target
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from fleet_doctor import records
from fleet_doctor.rules import KafkaVersion
from fleet_doctor.staging import STAGED_KINDS

LONG, INT, STRING, BOOL = T.LongType(), T.IntegerType(), T.StringType(), T.BooleanType()


def _schema(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(n, t, True) for n, t in fields])


# what detection reads of the probe's records (JSON's view), and of the tables they are staged as
PROBE_KINDS = {kind: records.spark_schema(kind) for kind in ("segment", "partition", "file", "logdir")}
STAGED_PARQUET = {k.kind: f"*{k.suffix}" for k in STAGED_KINDS}
BROKER_FACTS_SCHEMA = _schema(("broker_id", INT), ("kafka_version", STRING), ("running", BOOL), ("host", STRING))
BROKERS_SCHEMA = _schema(
    ("broker_id", INT),
    ("kafka_version", STRING),
    ("kafka_version_num", LONG),
    ("running", BOOL),
    ("host", STRING),
    ("probed", BOOL),
)
ZK_TOPIC_SCHEMA = _schema(
    ("topic", STRING),
    ("topic_id", STRING),
    ("partitions", T.MapType(STRING, T.ArrayType(INT))),
    ("replication_factor", INT),
    ("min_insync_replicas", INT),
    ("marked_for_deletion", BOOL),
    ("error", STRING),
)
ZK_STATE_SCHEMA = _schema(
    ("topic", STRING),
    ("partition", INT),
    ("leader", INT),
    ("leader_epoch", LONG),
    ("isr", T.ArrayType(INT)),
    ("error", STRING),
)
# fenced, in_controlled_shutdown: KRaft only
ZK_BROKER_SCHEMA = _schema(("broker_id", INT), ("error", STRING), ("fenced", BOOL), ("in_controlled_shutdown", BOOL))
ZK_CLUSTER_SCHEMA = _schema(("cluster_id", STRING), ("controller_id", INT))
# the first record of cluster facts decoded from a KRaft metadata log: the node and the snapshot they came from
KRAFT_HEADER_SCHEMA = _schema(("node_id", INT), ("dir", STRING), ("snapshot", STRING), ("log_end_offset", LONG))
# a controller's own metadata log and quorum-state (the controllers input): its header and its problems
CONTROLLER_SCHEMA = _schema(
    ("kind", STRING),
    ("node_id", INT),
    ("controller_id", INT),  # the audit's: the inventory's controller the records were read on
    ("dir", STRING),
    ("cluster_id", STRING),
    ("snapshot", STRING),
    ("snapshot_end_offset", LONG),
    ("snapshot_epoch", INT),
    ("log_start_offset", LONG),
    ("log_end_offset", LONG),
    ("quorum_leader_id", INT),
    ("quorum_leader_epoch", INT),
    ("quorum_voted_id", INT),
    ("last_leader_change_epoch", INT),
    ("log_max_epoch", INT),
    ("log_torn_tail", BOOL),
    ("log_tail_error", STRING),
    ("log_crc_errors", LONG),
    ("log_first_crc_error_offset", LONG),
    ("snapshot_gap", BOOL),
    ("error", STRING),
    ("file", STRING),
    ("offset", LONG),
    ("position", LONG),
    ("problem", STRING),
    ("message", STRING),
)


@dataclass
class Frames:
    """Staged facts, each row tagged with broker_id, kafka_version and kafka_version_num."""

    segments: DataFrame
    partitions: DataFrame
    files: DataFrame
    logdirs: DataFrame
    brokers: DataFrame  # broker facts: broker_id, kafka_version, kafka_version_num, running
    cluster_topics: DataFrame | None = None
    cluster_states: DataFrame | None = None
    cluster_brokers: DataFrame | None = None
    cluster_rows: DataFrame | None = None
    # small facts read back to the driver once (a few rows per broker), used as literals by the rules
    fleet_version: str | None = None  # the newest Kafka version among the brokers (None: none known)
    fleet_version_num: int | None = None
    probed_brokers: tuple[int, ...] = ()  # brokers with probe output
    registered_brokers: tuple[int, ...] = ()  # /brokers/ids in the ZooKeeper snapshot; KRaft: registered, not fenced
    facts_cluster_id: str | None = None
    # where the cluster facts come from: "zookeeper" or "kraft" (None: no cluster facts given)
    metadata_source: str | None = None
    metadata_node: int | None = None  # KRaft: the node whose metadata log the facts were decoded from
    metadata_snapshot: str | None = None  # KRaft: the snapshot file the facts start from
    fenced_brokers: tuple[int, ...] = ()  # KRaft: registered but fenced (ZooKeeper: none)
    shutdown_brokers: tuple[int, ...] = ()  # KRaft: fenced after a controlled shutdown (in_controlled_shutdown)
    # the cluster's metadata mode ("zookeeper" | "kraft"; None: not known), resolved once when the frames load: as the
    # run declares it (the inventory's, or what a scan was given), else what the staged facts are. A KRaft run whose
    # controllers could not be read still knows it is one
    metadata_mode: str | None = None
    # something of the cluster was seen alive: a process holds a probed log dir's lock, or the controllers' metadata
    # was read by the audit from the running deployment (records with the audit's controller_id)
    live_source: bool = False
    # "<node_id>/<logdir>" of each node whose __cluster_metadata-0 the controllers input decoded (metadata-log-torn
    # covers its torn tail and CRC failures)
    metadata_logdirs: tuple[str, ...] = ()
    running_brokers: tuple[int, ...] = ()  # brokers whose facts say they run
    # KRaft: each controller's metadata log header and its problems (the controllers input; None: not given)
    controllers: DataFrame | None = None
    # KRaft: the controllers' metadata_problem records grouped per node, log dir, file and problem: the first by
    # offset (``first``: o, offset, message) and how many (``n``)
    controller_problems: DataFrame | None = None
    stopped_logdirs: tuple[str, ...] = ()  # "<broker_id>/<logdir>" without clean shutdown, no broker on it
    deep_logdirs: tuple[str, ...] = ()  # log dirs with deep-mode segment facts (batch offsets)

    @property
    def has_cluster_facts(self) -> bool:
        """Cluster facts were given (a ZooKeeper snapshot, or the image decoded from a KRaft metadata log)."""
        return self.cluster_topics is not None

    @property
    def stopped_kraft_cluster(self) -> bool:
        """The KRaft facts are those of a deliberately stopped cluster (a clean shutdown leaves every partition
        leaderless, its ISR the last replica to stop), so partition liveness cannot be judged from them: every
        registered broker is fenced, and either every one of them after a controlled shutdown
        (``in_controlled_shutdown``, recorded from Kafka 3.3), or nothing of the cluster runs at all (no broker
        facts say running, no log dir lock is held, the metadata was not read from a live controller: a scan of
        copied dirs). Brokers fenced because they crashed, or while they catch up, under live controllers are not a
        stopped cluster: their partitions are offline."""
        if self.metadata_source != "kraft" or not self.fenced_brokers or self.registered_brokers:
            return False
        if set(self.shutdown_brokers) >= set(self.fenced_brokers):
            return True
        return not self.running_brokers and not self.live_source

    @property
    def kraft(self) -> bool:
        """The cluster is a KRaft one (``metadata_mode``)."""
        return self.metadata_mode == "kraft"

    def metadata_log(self) -> str:
        """How messages name the KRaft cluster facts: "the metadata log" (of controller N, when known)."""
        return "the metadata log" + (f" of controller {self.metadata_node}" if self.metadata_node is not None else "")

    def fleet_tagged(self, df: DataFrame) -> DataFrame:
        """Cluster-level findings (no single broker) take the newest broker's Kafka version."""
        return df.withColumn("kafka_version_num", F.lit(self.fleet_version_num).cast("long")).withColumn(
            "kafka_version", F.lit(self.fleet_version).cast("string")
        )


# ---- loading
def _vnum_or_none(text: str | None) -> int | None:
    """As version_num, on the driver: None for a missing or unparsable version."""
    try:
        return KafkaVersion.parse(text).number if text else None
    except ValueError:
        return None


def _merged_schema(*schemas: T.StructType) -> T.StructType:
    """One schema holding every field of the given record schemas (a name has one type in all)."""
    fields: dict[str, T.StructField] = {"kind": T.StructField("kind", STRING, True)}
    for schema in schemas:
        for fld in schema.fields:
            known = fields.setdefault(fld.name, fld)
            assert known.dataType == fld.dataType, f"field {fld.name} has two types"
    return T.StructType(list(fields.values()))


LOAD_THREADS = 4  # the cluster facts, and the partition, file and log-dir facts checkpointed side by side
METADATA_TOPIC = "__cluster_metadata"  # KRaft's metadata log
METADATA_DIR = METADATA_TOPIC + "-0"
ZK_KINDS = {
    "topic": ZK_TOPIC_SCHEMA,
    "partition_state": ZK_STATE_SCHEMA,
    "broker": ZK_BROKER_SCHEMA,
    "cluster": ZK_CLUSTER_SCHEMA,
    "cluster_metadata": KRAFT_HEADER_SCHEMA,
}
UNLOADED_DIR_RE = r"-[0-9]+\.[0-9A-Za-z_-]+-(delete|stray)\z"  # partition dir names Kafka never loads
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
    stored = records.spark_schema(kind, staged=True)
    read = T.StructType([stored[f.name] if f.name in stored.fieldNames() else f for f in schema.fields])
    df = spark.read.schema(read).option("pathGlobFilter", STAGED_PARQUET[kind]).parquet(probe_dir)
    for fld in read.fields:  # the type the JSON parse gives (for a file's entries: numbers as their text)
        if fld.dataType != schema[fld.name].dataType:
            df = df.withColumn(fld.name, F.col(fld.name).cast(schema[fld.name].dataType))
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
    cluster_metadata_path: str | None = None,
    controllers_path: str | None = None,
    metadata_mode: str | None = None,
) -> Frames:
    """Read the staged inputs once each: the JSON records parsed once (each with its kind's schema) and
    checkpointed, the Parquet records read (never parsed) and unioned with the JSON ones of their kind. The few
    facts the rules use as literals (brokers, log dirs whose lock is held, stopped log dirs, log dirs with
    deep-mode facts) come back to the driver in one small aggregation. Partition, file and log-dir facts are
    checkpointed on their own: many rule plans read them. Why each of these choices: bench/README.md, detection
    benchmark."""
    in_thread = inheritable_thread_target(spark)  # the job group and properties of this thread
    with ThreadPoolExecutor(LOAD_THREADS) as pool:
        # the cluster facts load beside the probe records (Spark runs the jobs of both threads side by side)
        cluster_facts = (
            pool.submit(in_thread(_cluster_facts), spark, cluster_metadata_path) if cluster_metadata_path else None
        )
        return _load(spark, pool, in_thread, probe_dir, brokers_path, cluster_facts, controllers_path, metadata_mode)


def _cluster_facts(spark: SparkSession, path: str) -> tuple[DataFrame, list[Row]]:
    """The cluster facts' records, parsed once and checkpointed (filtered after the checkpoint, as the probe
    records: one parse a line), and the few the driver reads (brokers, cluster, a KRaft header)."""
    zk = spark.read.text(path).select(F.from_json("value", ZK_RECORD_SCHEMA).alias("r"))
    zk = zk.select("r.*").localCheckpoint().where(F.col("kind").isin(*ZK_KINDS))
    small = zk.where(F.col("kind").isin("broker", "cluster", "cluster_metadata")).select(
        "kind", "broker_id", "cluster_id", "error", "fenced", "in_controlled_shutdown", "node_id", "snapshot"
    )
    return zk, small.collect()


def _load(
    spark: SparkSession,
    pool: ThreadPoolExecutor,
    in_thread: Callable[[Callable], Callable],
    probe_dir: str,
    brokers_path: str | None,
    cluster_facts: Future | None,
    controllers_path: str | None,
    metadata_mode: str | None,
) -> Frames:
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
    # the records staged as Parquet (fleet_doctor.staging): read, never parsed; as for the JSON records,
    # a log dir named, and (but a partition record) not in a partition dir Kafka never loads
    unloaded_staged = {
        "segment": _in_unloaded_dir(F.col("path"), F.lit(None).cast(STRING)),
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

    # built from names and literals only: one set of columns for every fact frame (each costs JVM round trips)
    broker_tags = (
        lookup(1, STRING).alias("kafka_version"),
        lookup(2, LONG).alias("kafka_version_num"),
        F.coalesce(lookup(3, BOOL), F.lit(False)).alias("running"),
    )

    def tagged(df: DataFrame, *fields: str) -> DataFrame:
        return df.select("broker_id", *broker_tags, *(fields or [c for c in df.columns if c != "broker_id"]))

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
    kinds = ("partition", "file", "logdir")
    partitions, files, logdirs = pool.map(in_thread(lambda kind: materialized(of_kind(kind))), kinds)
    frames = Frames(
        # live_active: the active segment of a running broker (its indexes are legitimately preallocated)
        segments=of_kind("segment").withColumn(
            "live_active", F.coalesce(F.col("active") & (F.col("running") | in_logdirs(locked)), F.lit(False))
        ),
        partitions=partitions,
        files=files,
        logdirs=logdirs,
        brokers=brokers,
        fleet_version=versions[-1][1] if versions else None,
        fleet_version_num=versions[-1][0] if versions else None,
        probed_brokers=tuple(probed_ids),
        running_brokers=tuple(sorted(b for b in running if b is not None)),
        stopped_logdirs=keys(lambda r: r.unclean and r.broker_id not in running),
        deep_logdirs=keys(lambda r: r.deep),
        metadata_mode=metadata_mode,
        live_source=bool(locked),
    )
    if cluster_facts is not None:
        zk, small_rows = cluster_facts.result()
        frames.cluster_topics = _of_kind(zk, "topic", ZK_TOPIC_SCHEMA)
        frames.cluster_states = _of_kind(zk, "partition_state", ZK_STATE_SCHEMA)
        frames.cluster_brokers = _of_kind(zk, "broker", ZK_BROKER_SCHEMA)
        frames.cluster_rows = _of_kind(zk, "cluster", ZK_CLUSTER_SCHEMA)
        # a KRaft broker that is registered but fenced is not alive (ZooKeeper's records have no fenced: null)
        frames.registered_brokers = tuple(
            sorted(
                r.broker_id
                for r in small_rows
                if r.kind == "broker" and r.error is None and r.broker_id is not None and not r.fenced
            )
        )
        frames.fenced_brokers = tuple(
            sorted(r.broker_id for r in small_rows if r.kind == "broker" and r.error is None and r.fenced)
        )
        frames.shutdown_brokers = tuple(
            sorted(
                r.broker_id
                for r in small_rows
                if r.kind == "broker" and r.error is None and r.fenced and r.in_controlled_shutdown
            )
        )
        frames.facts_cluster_id = next((r.cluster_id for r in small_rows if r.kind == "cluster" and r.cluster_id), None)
        header = next((r for r in small_rows if r.kind == "cluster_metadata"), None)
        frames.metadata_source = "zookeeper" if header is None else "kraft"
        if header is not None:
            frames.metadata_node, frames.metadata_snapshot = header.node_id, header.snapshot
    if controllers_path:
        node_versions = {r[0]: (r[1], r[2]) for r in broker_rows}
        frames.controllers, frames.controller_problems, heads = load_controllers(
            spark, controllers_path, node_versions, (frames.fleet_version, frames.fleet_version_num)
        )
        frames.live_source = frames.live_source or any(h["controller_id"] is not None for h in heads)
        frames.metadata_logdirs = tuple(
            sorted(
                f"{h['node_id']}/{metadata_logdir(h['dir'])}"
                for h in heads
                if h["error"] is None and h["node_id"] is not None and h["dir"]
            )
        )
    if frames.metadata_mode is None:  # not declared: what the staged facts are (a metadata log's, controllers')
        kraft_facts = frames.metadata_source == "kraft" or controllers_path is not None
        frames.metadata_mode = "kraft" if kraft_facts else frames.metadata_source
    return frames


def metadata_logdir(path: str) -> str:
    """The log dir holding ``__cluster_metadata-0``, from the dir the decoder read (either of the two)."""
    bare = path.rstrip("/")
    return bare[: -len("/" + METADATA_DIR)] if bare.endswith("/" + METADATA_DIR) else bare


# what the controller rules read of each controller record beyond CONTROLLER_SCHEMA: its node's Kafka version, the
# log dir holding its __cluster_metadata-0 and that dir
CONTROLLER_FRAME_SCHEMA = T.StructType(
    [
        *CONTROLLER_SCHEMA.fields,
        *_schema(
            ("kafka_version", STRING), ("kafka_version_num", LONG), ("c_logdir", STRING), ("metadata_dir", STRING)
        ).fields,
    ]
)


# what a controller's finding is keyed by (detect/kraft.py), and a problem of its
CONTROLLER_KEY = ("node_id", "c_logdir", "metadata_dir", "kafka_version", "kafka_version_num")
PROBLEM_KEY = (*CONTROLLER_KEY, "file", "problem")
CONTROLLER_PROBLEMS_SCHEMA = T.StructType(
    [
        *(CONTROLLER_FRAME_SCHEMA[k] for k in PROBLEM_KEY),
        T.StructField("first", _schema(("o", LONG), ("offset", LONG), ("message", STRING)), True),
        T.StructField("n", LONG, True),
    ]
)


def load_controllers(
    spark: SparkSession,
    path: str,
    node_versions: dict[int, tuple[str | None, int | None]],
    fleet_version: tuple[str | None, int | None],
) -> tuple[DataFrame, DataFrame, list[dict]]:
    """The controllers input (a few rows per controller), read to the driver once: a header's node is its
    meta.properties ``node_id``, else the ``controller_id`` the audit read it as; each ``metadata_problem`` takes the
    node and ``dir`` of the ``cluster_metadata`` record before it (the decoder prints a node's problems after its
    header) unless it names its own. Each record takes its node's Kafka version (``node_versions``, from the broker
    facts; else the fleet's), ``c_logdir`` and ``metadata_dir``. Returns a small DataFrame of them for the rules, the
    problems grouped (``Frames.controller_problems``) and the headers (``cluster_metadata`` records) as dicts."""
    rows = (
        spark.read.text(path)
        .select(F.from_json("value", CONTROLLER_SCHEMA).alias("r"))
        .where(F.col("r.kind").isin("cluster_metadata", "metadata_problem"))
        .select("r.*")
        .collect()
    )
    out, heads, node, where = [], [], None, None
    for r in rows:
        d = r.asDict()
        if d["kind"] == "cluster_metadata":
            d["node_id"] = d["controller_id"] if d["node_id"] is None else d["node_id"]
            node, where = d["node_id"], d["dir"]
            heads.append(d)
        else:
            d["node_id"] = node if d["node_id"] is None else d["node_id"]
            d["dir"] = where if d["dir"] is None else d["dir"]
        version, version_num = node_versions.get(d["node_id"], (None, None))
        d["kafka_version"] = fleet_version[0] if version is None else version
        d["kafka_version_num"] = fleet_version[1] if version_num is None else version_num
        d["c_logdir"] = None if d["dir"] is None else metadata_logdir(d["dir"])
        d["metadata_dir"] = None if d["dir"] is None else f"{d['c_logdir']}/{METADATA_DIR}"
        out.append(tuple(d[n] for n in CONTROLLER_FRAME_SCHEMA.fieldNames()))
    # the problems grouped here, on the driver (a few rows): a grouping in the plan is a shuffle stage of its own
    grouped: dict[tuple, list[dict]] = {}
    for d in (dict(zip(CONTROLLER_FRAME_SCHEMA.fieldNames(), row, strict=True)) for row in out):
        if d["kind"] == "metadata_problem":
            grouped.setdefault(tuple(d[k] for k in PROBLEM_KEY), []).append(d)

    def by_offset(d: dict) -> tuple:  # Spark's order of the struct (o, offset, message): nulls first
        o = -1 if d["offset"] is None else d["offset"]
        return (o, d["offset"] is not None, d["offset"] or 0, d["message"] is not None, d["message"] or "")

    problems = []
    for key, ds in grouped.items():
        first = min(ds, key=by_offset)
        o = -1 if first["offset"] is None else first["offset"]
        problems.append((*key, (o, first["offset"], first["message"]), len(ds)))
    return (
        spark.createDataFrame(out, CONTROLLER_FRAME_SCHEMA),
        spark.createDataFrame(problems, CONTROLLER_PROBLEMS_SCHEMA),
        heads,
    )


# ---- the partition dirs rules look at
def loaded() -> Column:
    """A partition dir Kafka loads: live ones and -future ones (a replica being moved between log dirs); -delete and
    -stray dirs are never read again (ref §2.1)."""
    return F.col("dir_state").isin("live", "future")


def loaded_partitions(f: Frames) -> DataFrame:
    return f.partitions.where(loaded())


def live_partitions(f: Frames) -> DataFrame:
    return f.partitions.where(F.col("dir_state") == "live")
