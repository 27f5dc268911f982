"""KRaft rules: replicas against the metadata image (``stray-replica``), and each controller's own metadata log and
quorum-state (the controllers input: ``metadata-log-torn``, ``metadata-snapshot-gap``, ``quorum-state-divergent``,
``metadata-record-unknown``). kraft-ref §n is ../shared/docs/kraft-reference.md. ``detect()`` runs them only on a
KRaft cluster (``Frames.kraft``); the controllers' facts are a few rows, so every plan here is small.

A controller's finding carries its node id as ``broker_id`` (combined mode: the broker; a controller-only node: its
``node.id``), the log dir holding ``__cluster_metadata-0`` as ``log_dir``, topic ``__cluster_metadata``, partition 0.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from fleet_doctor.detect.findings import detector, findings
from fleet_doctor.detect.frames import CONTROLLER_KEY, METADATA_TOPIC, Frames, live_partitions
from fleet_doctor.rules import KafkaVersion

TORN, CRC = "torn-tail", "crc"
UNKNOWN = ("unknown-record", "unsupported-version", "undecodable", "inconsistent", "unreadable")
# stray logs renamed -stray instead of deleted (3.7.0); a log without a topic ID stray, not a failed start (3.7.1)
RENAMES_STRAY = KafkaVersion.parse("3.7.0").number
NO_TOPIC_ID_IS_STRAY = KafkaVersion.parse("3.7.1").number


# ---- stray replicas (kraft-ref §7, ref §2.1 item 6)
@detector("stray-replica")
def stray_replica(f: Frames) -> DataFrame:
    """LogManager.isStrayKraftReplica on every live partition dir: no topic ID, a topic ID the image does not know,
    or the image's partition (by topic ID, never by name: names are reused) without this broker."""
    assert f.cluster_topics is not None
    image = f.cluster_topics.where(F.col("topic_id").isNotNull() & F.col("error").isNull())
    ids = image.select("topic_id", F.lit(True).alias("id_known"))
    by_name = image.select("topic", F.col("topic_id").alias("name_topic_id"))
    image_parts = image.where(F.col("partitions").isNotNull()).select(
        "topic_id", F.explode("partitions").alias("p", "image_replicas")
    )
    image_parts = image_parts.select("topic_id", F.col("p").cast("int").alias("partition"), "image_replicas")
    # a malformed partition.metadata is partition-metadata-malformed's (the log dir goes offline first)
    parts = live_partitions(f).where((F.col("topic") != METADATA_TOPIC) & F.col("partition_metadata_error").isNull())
    rows = (
        parts.join(ids, "topic_id", "left")
        .join(image_parts, ["topic_id", "partition"], "left")
        .join(by_name, "topic", "left")
    )
    no_id = F.col("topic_id").isNull()
    unknown_id = F.col("topic_id").isNotNull() & F.col("id_known").isNull()
    no_partition = F.col("id_known") & F.col("image_replicas").isNull()
    excluded = F.col("image_replicas").isNotNull() & ~F.array_contains("image_replicas", F.col("broker_id"))
    hit = rows.where(no_id | unknown_id | no_partition | excluded)
    source = f.metadata_log()
    why = (
        F.when(no_id, F.format_string("%s has no topic ID (no partition.metadata)", "path"))
        .when(
            unknown_id,
            F.format_string(
                "%s/partition.metadata holds topic ID %s, which %s does not know (%s)",
                "path",
                "topic_id",
                F.lit(source),
                F.when(F.col("name_topic_id").isNull(), F.format_string("it has no topic %s", "topic")).otherwise(
                    F.format_string("its TopicRecord %s has ID %s", "topic", "name_topic_id")
                ),
            ),
        )
        .when(
            no_partition,
            F.format_string(
                "%s: topic %s (%s) has no partition %d in %s", "path", "topic", "topic_id", "partition", F.lit(source)
            ),
        )
        .otherwise(
            F.format_string(
                "%s: %s places %s-%d on brokers %s, not on broker %d",
                "path",
                F.lit(source),
                "topic",
                "partition",
                F.to_json("image_replicas"),
                "broker_id",
            )
        )
    )
    version = F.col("kafka_version_num")
    renamed = "Kafka renames it <topic>-<p>.<uuid>-stray at the next start and keeps it"
    fate = (
        F.when(
            no_id,
            F.when(version.isNull(), "before Kafka 3.7.1 the broker's start fails, from 3.7.1 it is renamed -stray")
            .when(version >= NO_TOPIC_ID_IS_STRAY, renamed)
            .otherwise("the broker's start fails (a log without a topic ID is not allowed in KRaft mode before 3.7.1)"),
        )
        .when(version.isNull(), "Kafka 3.0-3.6 deletes it at the next start, 3.7+ renames it -stray")
        .when(version >= RENAMES_STRAY, renamed)
        .otherwise("Kafka deletes it at the next start")
    )
    msg = F.format_string("%s: the replica is stray: %s", why, fate)
    # a log without a topic ID fails the start before 3.7.1 (findStrayPartitions throws), on 3.7.0 too
    fails = F.when(no_id & F.coalesce(version < NO_TOPIC_ID_IS_STRAY, F.lit(True)), F.lit("critical"))
    return findings(hit, "stray-replica", msg, path=F.col("path"), severity=fails)


# ---- the controllers' own metadata logs and quorum-state
def _controllers(f: Frames, kind: str) -> DataFrame:
    """The controllers' ``kind`` records, each with its node's Kafka version, ``c_logdir`` and ``metadata_dir``
    (frames.load_controllers)."""
    assert f.controllers is not None
    return f.controllers.where(F.col("kind") == kind)


def _controller_findings(df: DataFrame, rule_id: str, message: Column, path: Column, severity: Column | None = None):
    return findings(
        df,
        rule_id,
        message,
        path=path,
        broker_id=F.col("node_id"),
        log_dir=F.col("c_logdir"),
        topic=F.lit(METADATA_TOPIC),
        partition=F.lit(0),
        severity=severity,
    )


def _problems(f: Frames, kinds: tuple[str, ...]) -> DataFrame:
    """The controllers' problems of ``kinds``, one row per node, file and kind: the first (by offset) with its
    message, and how many there are (frames.load_controllers groups them)."""
    assert f.controller_problems is not None
    return f.controller_problems.where(F.col("problem").isin(*kinds))


def _more(n: Column, what: str) -> Column:
    return F.when(n > 1, F.format_string(f" (%d {what} in this file)", n)).otherwise(F.lit(""))


@detector("metadata-log-torn")
def metadata_log_torn(f: Frames) -> DataFrame:
    """The decoder's torn-tail and crc problems (they name the file and offset); a header that reports a torn tail
    or CRC failures without such a problem record still counts (its own fields name them)."""
    found = _problems(f, (TORN, CRC))
    from_problems = found.select(
        *CONTROLLER_KEY,
        F.coalesce("file", "metadata_dir").alias("where"),
        "problem",
        F.concat(F.coalesce(F.col("first.message"), F.lit("")), _more(F.col("n"), "such batches")).alias("what"),
    )
    h = _controllers(f, "cluster_metadata")
    torn = h.where(F.coalesce("log_torn_tail", F.lit(False))).select(
        *CONTROLLER_KEY,
        F.col("metadata_dir").alias("where"),
        F.lit(TORN).alias("problem"),
        F.format_string(
            "%s: the log's tail after offset %s is torn: %s",
            "metadata_dir",
            F.coalesce(F.col("log_end_offset").cast("string"), F.lit("?")),
            F.coalesce("log_tail_error", F.lit("not a whole batch")),
        ).alias("what"),
    )
    crc = h.where(F.coalesce("log_crc_errors", F.lit(0)) > 0).select(
        *CONTROLLER_KEY,
        F.col("metadata_dir").alias("where"),
        F.lit(CRC).alias("problem"),
        F.format_string(
            "%s: %d batch(es) fail their CRC-32C, the first at offset %s",
            "metadata_dir",
            "log_crc_errors",
            F.coalesce(F.col("log_first_crc_error_offset").cast("string"), F.lit("?")),
        ).alias("what"),
    )
    told = from_problems.select("node_id", "c_logdir", "problem")  # a left anti join: duplicates change nothing
    from_headers = torn.unionByName(crc).join(told, ["node_id", "c_logdir", "problem"], "left_anti")
    rows = from_problems.unionByName(from_headers)
    consequence = (
        F.when(
            F.col("where").endswith(".checkpoint"),  # a snapshot: never truncated, it cannot be loaded at all
            F.lit("Kafka loads only the newest snapshot and fails on a corrupt one: this node cannot start with it"),
        ).when(
            F.col("problem") == CRC,
            F.lit("recovery truncates the metadata log there: every later record is lost on this node"),
        )
    ).otherwise(F.lit("recovery truncates it at the last valid batch; the node fetches the rest from the leader"))
    msg = F.format_string("controller %d: %s: %s", "node_id", "what", consequence)
    severity = F.when(F.col("problem") == CRC, F.lit("critical"))
    return _controller_findings(rows, "metadata-log-torn", msg, F.col("where"), severity)


@detector("metadata-snapshot-gap")
def metadata_snapshot_gap(f: Frames) -> DataFrame:
    h = _controllers(f, "cluster_metadata").where(F.coalesce("snapshot_gap", F.lit(False)))
    start = F.coalesce(F.col("log_start_offset").cast("string"), F.lit("?"))
    covered = F.when(
        F.col("snapshot").isNull(),
        F.format_string("there is no snapshot, so records 0..%d are on neither", F.col("log_start_offset") - 1),
    ).otherwise(
        F.format_string(
            "the newest snapshot %s ends at offset %s: the records in between are on neither",
            "snapshot",
            F.coalesce(F.col("snapshot_end_offset").cast("string"), F.lit("?")),
        )
    )
    msg = F.format_string(
        "controller %d: %s: the log starts at offset %s but %s", "node_id", "metadata_dir", start, covered
    )
    return _controller_findings(h, "metadata-snapshot-gap", msg, F.col("metadata_dir"))


@detector("metadata-record-unknown")
def metadata_record_unknown(f: Frames) -> DataFrame:
    # records a node could not apply after a snapshot gap (a partition change of a topic whose TopicRecord is in the
    # gap) are the gap's consequence: metadata-snapshot-gap says it once
    gapped = (
        _controllers(f, "cluster_metadata")
        .where(F.coalesce("snapshot_gap", F.lit(False)))
        .select("node_id", "c_logdir", F.lit("inconsistent").alias("problem"))
    )
    found = _problems(f, UNKNOWN).join(gapped, ["node_id", "c_logdir", "problem"], "left_anti")
    msg = F.format_string(
        "controller %d: %s%s: the record was skipped, the audit's cluster facts may miss what it changes",
        "node_id",
        F.coalesce(F.col("first.message"), F.format_string("%s at offset %s", "file", "first.offset")),
        _more(F.col("n"), "such records"),
    )
    out = _controller_findings(found, "metadata-record-unknown", msg, F.coalesce("file", "metadata_dir"))
    # a header's error without any problem record of its node: the decoder could not read the dir at all
    told = _controllers(f, "metadata_problem").select("node_id", "c_logdir")
    failed = (
        _controllers(f, "cluster_metadata")
        .where(F.col("error").isNotNull())
        .join(told, ["node_id", "c_logdir"], "left_anti")
    )
    msg2 = F.format_string("controller %d: %s could not be decoded: %s", "node_id", "metadata_dir", "error")
    return out.unionByName(_controller_findings(failed, "metadata-record-unknown", msg2, F.col("metadata_dir")))


@detector("quorum-state-divergent")
def quorum_state_divergent(f: Frames) -> DataFrame:
    """Each node's quorum-state is its own view (kraft-ref §6), compared within one cluster id: two leaders for one
    epoch (critical); a log holding batches of an epoch above its own quorum-state's (warning: the file was rolled
    back); a node behind the highest epoch whose log holds no batch of it (info: a missed election or lag).

    A node's log epoch is the newest of its log's batch epochs (``log_max_epoch``) and its newest snapshot's epoch,
    both from the decoder's own header of that node: read in the same pass as its quorum-state (the probe's
    leader-epoch-checkpoint is read at another moment, so a live node may have moved on in between).

    The highest epoch a node is "behind" counts only quorum-states naming a leader: a voter cut off from the quorum
    without pre-vote (Kafka < 4.0) keeps raising its epoch as a candidate with leaderId -1. Such a node, at an epoch
    above every node's log with no leader, is its own finding (warning: stuck in elections), not the others'."""
    h = _controllers(f, "cluster_metadata").where(F.col("quorum_leader_epoch").isNotNull())
    qs_path = F.concat(F.col("metadata_dir"), F.lit("/quorum-state"))
    has_leader = F.col("quorum_leader_id") >= 0
    view = F.format_string("controller %d: leader %d", "node_id", "quorum_leader_id")
    # the comparisons between nodes as windows over one cluster id (and one epoch): two sorts of a few rows instead
    # of a grouping and a join for each
    cluster, epoch = Window.partitionBy("cluster"), Window.partitionBy("cluster", "quorum_leader_epoch")
    q = h.select(
        "*",
        F.coalesce("cluster_id", F.lit("")).alias("cluster"),
        F.greatest(F.col("log_max_epoch").cast("long"), F.col("snapshot_epoch").cast("long")).alias("log_epoch"),
    )
    q = q.select(
        "*",
        F.size(F.collect_set(F.when(has_leader, F.col("quorum_leader_id"))).over(epoch)).alias("n_leaders"),
        F.array_join(F.sort_array(F.collect_list(F.when(has_leader, view)).over(epoch)), ", ").alias("views"),
        F.max("log_epoch").over(cluster).alias("logs_epoch"),
        F.max(F.when(has_leader, F.col("quorum_leader_epoch"))).over(cluster).alias("top_epoch"),
    )
    at_top = has_leader & (F.col("quorum_leader_epoch") == F.col("top_epoch"))
    q = q.select(
        "*",
        F.array_join(
            F.sort_array(F.collect_set(F.when(at_top, F.col("node_id").cast("string"))).over(cluster)), ", "
        ).alias("top_nodes"),
        F.array_join(
            F.sort_array(F.collect_set(F.when(at_top, F.col("quorum_leader_id").cast("string"))).over(cluster)), ", "
        ).alias("top_leaders"),
    )

    # two leaders for one epoch
    split = q.where(has_leader & (F.col("n_leaders") > 1))
    split_f = _controller_findings(
        split,
        "quorum-state-divergent",
        F.format_string(
            "controller %d: %s names leader %d for epoch %d, but the nodes disagree (%s): two leaders for one epoch",
            "node_id",
            qs_path,
            "quorum_leader_id",
            "quorum_leader_epoch",
            "views",
        ),
        qs_path,
        F.lit("critical"),
    )

    # a log ahead of its own quorum-state
    ahead = q.where(F.col("log_epoch") > F.col("quorum_leader_epoch"))
    ahead_f = _controller_findings(
        ahead,
        "quorum-state-divergent",
        F.format_string(
            "controller %d: its metadata log holds batches of epoch %d but %s is at epoch %d (leader %d): the file "
            "was rolled back or copied from another node",
            "node_id",
            "log_epoch",
            qs_path,
            "quorum_leader_epoch",
            "quorum_leader_id",
        ),
        qs_path,
        F.lit("warning"),
    )

    # a candidate looping in elections: no leader, at an epoch above every node's log
    looping = q.where(~has_leader & (F.col("quorum_leader_epoch") > F.coalesce(F.col("logs_epoch"), F.lit(-1))))
    looping_f = _controller_findings(
        looping,
        "quorum-state-divergent",
        F.format_string(
            "controller %d: %s is at epoch %d with no leader, above every node's metadata log (newest epoch %s): "
            "the node is stuck in elections (a candidate cut off from the quorum raises its epoch at each attempt)",
            "node_id",
            qs_path,
            "quorum_leader_epoch",
            F.coalesce(F.col("logs_epoch").cast("string"), F.lit("unknown")),
        ),
        qs_path,
        F.lit("warning"),
    )

    # behind the highest epoch that names a leader, with no batch of it
    behind = q.where(
        (F.col("quorum_leader_epoch") < F.col("top_epoch"))
        & (F.coalesce("log_epoch", F.lit(-1)) < F.col("top_epoch"))
        # a log ahead of its own quorum-state is the warning above, not lag
        & (F.coalesce("log_epoch", F.lit(-1)) <= F.col("quorum_leader_epoch"))
    )
    behind_f = _controller_findings(
        behind,
        "quorum-state-divergent",
        F.format_string(
            "controller %d: %s is at epoch %d (leader %d) while controller(s) %s are at epoch %d (leader %s); its "
            "log holds no batch of epoch %d (its newest: %s): it missed that election or has not replicated it yet",
            "node_id",
            qs_path,
            "quorum_leader_epoch",
            "quorum_leader_id",
            "top_nodes",
            "top_epoch",
            F.when(F.col("top_leaders") == "", F.lit("none")).otherwise(F.col("top_leaders")),
            "top_epoch",
            F.coalesce(F.col("log_epoch").cast("string"), F.lit("unknown")),
        ),
        qs_path,
        F.lit("info"),
    )
    return split_f.unionByName(ahead_f).unionByName(behind_f).unionByName(looping_f)
