"""Cross-source rules: replicas against the cluster's metadata (ZooKeeper's, or the image decoded from a KRaft
metadata log: the same records, ``Frames.metadata_source`` says which, and the messages name it) and against each
other (ref §4-§7)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from fleet_doctor.detect.findings import cluster_findings, detector, findings
from fleet_doctor.detect.frames import Frames, live_partitions
from fleet_doctor.rules import Severity


def _topic_path(f: Frames) -> Column:
    """Where the cluster keeps a topic: its znode, or (KRaft) its TopicRecord in the metadata log."""
    return F.concat(F.lit("kraft:/topics/" if f.kraft else "zk:/brokers/topics/"), F.col("topic"))


def _partition_path(f: Frames) -> Column:
    if f.kraft:
        return F.format_string("kraft:/topics/%s/partitions/%d", "topic", "partition")
    return F.format_string("zk:/brokers/topics/%s/partitions/%d/state", "topic", "partition")


@detector("topic-id-mismatch")
def topic_id_mismatch(f: Frames) -> DataFrame:
    assert f.cluster_topics is not None
    zk = f.cluster_topics.where(F.col("topic_id").isNotNull()).select("topic", F.col("topic_id").alias("zk_topic_id"))
    hit = (
        live_partitions(f)
        .where(F.col("topic_id").isNotNull())
        .join(zk, "topic")
        .where(F.col("topic_id") != F.col("zk_topic_id"))
    )
    path = F.concat(F.col("path"), F.lit("/partition.metadata"))
    if f.kraft:
        msg = F.format_string(
            "%s holds topic ID %s but %s has TopicRecord %s with ID %s: at the next start the broker treats the "
            "replica as stray (stray-replica)",
            path,
            "topic_id",
            F.lit(f.metadata_log()),
            "topic",
            "zk_topic_id",
        )
    else:
        msg = F.format_string(
            "%s holds topic ID %s but ZooKeeper /brokers/topics/%s has %s: the replica leaves ISR on restart",
            path,
            "topic_id",
            "topic",
            "zk_topic_id",
        )
    return findings(hit, "topic-id-mismatch", msg, path=path)


# how much of a split the message names: partition ranges per broker, brokers per ID, IDs per topic
SPLIT_RANGES, SPLIT_BROKERS, SPLIT_IDS = 4, 6, 4


def _more(n: Column, what: str, sep: str = ",") -> Column:
    """``<sep> and N more <what>s`` when ``n`` > 0, else nothing."""
    more = F.format_string(f"{sep} and %d more {what}%s", n, F.when(n == 1, "").otherwise("s"))
    return F.when(n > 0, more).otherwise("")


def _plural(n: Column, word: str) -> Column:
    return F.format_string(f"%d {word}%s", n, F.when(n == 1, "").otherwise("s"))


@detector("topic-id-split")
def topic_id_split(f: Frames) -> DataFrame:
    """One finding per topic whose replicas hold more than one topic ID, naming each ID and the replicas holding it.
    With a topic ID in the cluster's metadata the replicas that differ from it are topic-id-mismatch findings (the
    critical ones, one per replica) and the split is info; without one no side can be called right and the split
    is the critical finding (the registry's band)."""
    reps = (
        live_partitions(f)
        .where(F.col("topic_id").isNotNull())
        .select("topic", "topic_id", "broker_id", "partition")
        .distinct()
    )
    split = reps.join(
        reps.groupBy("topic").agg(F.countDistinct("topic_id").alias("n_ids")).where(F.col("n_ids") > 1), "topic"
    )
    # runs of consecutive partitions per (topic, ID, broker): partition - row number is constant along a run
    in_order = Window.partitionBy("topic", "topic_id", "broker_id").orderBy("partition")
    run = F.col("partition") - F.row_number().over(in_order)
    runs = (
        split.withColumn("run", run)
        .groupBy("topic", "topic_id", "broker_id", "run")
        .agg(F.min("partition").alias("lo"), F.max("partition").alias("hi"))
        .withColumn("n", F.col("hi") - F.col("lo") + 1)
        .withColumn(
            "text",
            F.when(F.col("n") == 1, F.col("lo").cast("string")).otherwise(F.format_string("%d-%d", "lo", "hi")),
        )
    )
    shown_runs = F.slice(F.array_sort(F.collect_list(F.struct("lo", "n", "text"))), 1, SPLIT_RANGES)
    per_broker = (
        runs.groupBy("topic", "topic_id", "broker_id")
        .agg(F.sum("n").alias("n"), shown_runs.alias("runs"))
        .withColumn("shown", F.aggregate("runs", F.lit(0).cast("long"), lambda acc, r: acc + r["n"]))
        .withColumn(
            "text",
            F.concat(
                F.format_string("broker %d partition%s ", "broker_id", F.when(F.col("n") == 1, "").otherwise("s")),
                F.array_join(F.transform("runs", lambda r: r["text"]), ","),
                _more(F.col("n") - F.col("shown"), "partition", sep=""),
            ),
        )
    )
    if f.cluster_topics is not None:
        zk = f.cluster_topics.select("topic", F.col("topic_id").alias("zk_topic_id"), F.lit(True).alias("in_zk"))
    else:
        zk = per_broker.select("topic").distinct().select("topic", F.lit(None).cast("string").alias("zk_topic_id"))
        zk = zk.withColumn("in_zk", F.lit(None).cast("boolean"))
    owner = "the metadata log's" if f.kraft else "ZooKeeper's"
    per_id = (
        per_broker.groupBy("topic", "topic_id")
        .agg(
            F.sum("n").alias("n"),
            F.count("*").alias("n_brokers"),
            F.slice(F.array_sort(F.collect_list(F.struct("broker_id", "text"))), 1, SPLIT_BROKERS).alias("bs"),
        )
        .join(zk, "topic", "left")
        .withColumn("is_zk", F.coalesce(F.col("topic_id") == F.col("zk_topic_id"), F.lit(False)))
        .withColumn(
            "text",
            F.concat(
                F.format_string(
                    "%s (%s%s) on ",
                    "topic_id",
                    _plural(F.col("n"), "replica"),
                    F.when(F.col("is_zk"), F.lit(f", {owner}")).otherwise(""),
                ),
                F.array_join(F.transform("bs", lambda b: b["text"]), ", "),
                _more(F.col("n_brokers") - F.size("bs"), "broker"),
            ),
        )
    )
    # ZooKeeper's ID first, then the ID most replicas hold, then by ID: a stable order
    order = F.struct((~F.col("is_zk")).alias("other"), (-F.col("n")).alias("fewer"), F.col("topic_id"))
    per_topic = per_id.groupBy("topic", "zk_topic_id", "in_zk").agg(
        F.count("*").alias("n_ids"),
        F.sum("n").alias("n"),
        F.array_sort(F.collect_list(F.struct(order.alias("o"), "n", "text"))).alias("ids"),
    )
    shown = F.slice("ids", 1, SPLIT_IDS)
    hidden = F.col("n_ids") - F.size(shown)
    hidden_replicas = F.col("n") - F.aggregate(shown, F.lit(0).cast("long"), lambda acc, i: acc + i["n"])
    if f.kraft:
        log = f.metadata_log()[0].upper() + f.metadata_log()[1:]  # it starts a sentence
        has = F.format_string(f"{log} has TopicRecord %s with ID %s", "topic", "zk_topic_id")
        absent = F.format_string(f"{log} has no topic %s", "topic")
        no_id = F.format_string(f"{log} has TopicRecord %s without an ID", "topic")
    else:
        has = F.format_string("ZooKeeper /brokers/topics/%s has %s", "topic", "zk_topic_id")
        absent = F.format_string("ZooKeeper has no topic %s", "topic")
        no_id = F.format_string("ZooKeeper /brokers/topics/%s has no topic ID", "topic")
    if f.cluster_topics is None:
        absent = F.lit("No metadata log was read" if f.kraft else "No ZooKeeper snapshot was given")
    verdict = F.when(
        F.col("zk_topic_id").isNotNull(),
        F.concat(has, F.lit(": the replicas holding another ID are its topic-id-mismatch findings")),
    ).otherwise(
        F.concat(
            F.when(F.col("in_zk").isNull(), absent).otherwise(no_id),
            F.lit(": no side can be called right, which ID to keep is a decision for a human"),
        )
    )
    msg = F.concat(
        F.format_string("topic %s: its replicas hold %d topic IDs: ", "topic", "n_ids"),
        F.array_join(F.transform(shown, lambda i: i["text"]), "; "),
        F.when(hidden > 0, F.format_string("; and %d more IDs on %d replicas", hidden, hidden_replicas)).otherwise(""),
        F.lit(". "),
        verdict,
    )
    sev = F.when(F.col("zk_topic_id").isNotNull(), F.lit(Severity.INFO.value))
    return cluster_findings(f.fleet_tagged(per_topic), "topic-id-split", msg, path=_topic_path(f), severity=sev)


@detector("topic-id-missing-in-zk")
def topic_id_missing_in_zk(f: Frames) -> DataFrame:
    assert f.cluster_topics is not None
    # IBP >= 2.8 on the fleet: the newest audited broker (or unknown) decides
    replica_ids = (
        live_partitions(f)
        .where(F.col("topic_id").isNotNull())
        .groupBy("topic")
        .agg(F.array_sort(F.collect_set("topic_id")).alias("replica_ids"))
    )
    hit = f.fleet_tagged(f.cluster_topics.where(F.col("topic_id").isNull() & F.col("error").isNull())).join(
        replica_ids, "topic", "left"
    )
    msg = F.format_string(
        "/brokers/topics/%s has no topic_id: the next controller failover mints a new one (replicas hold %s)",
        F.col("topic"),
        F.coalesce(F.array_join("replica_ids", ", "), F.lit("no topic ID")),
    )
    return cluster_findings(hit, "topic-id-missing-in-zk", msg, path=_topic_path(f))


def _assignment(f: Frames) -> DataFrame:
    assert f.cluster_topics is not None
    return f.cluster_topics.select("topic", F.explode("partitions").alias("p", "replicas")).select(
        "topic", F.col("p").cast("int").alias("partition"), F.explode("replicas").alias("broker_id")
    )


@detector("replica-not-assigned")
def replica_not_assigned(f: Frames) -> DataFrame:
    assert f.cluster_topics is not None
    assigned = _assignment(f)
    # a topic whose znode could not be read has no known assignment: no judgement on its replicas
    unreadable = f.cluster_topics.where(F.col("partitions").isNull()).select("topic")
    known = f.cluster_topics.where(F.col("partitions").isNotNull()).select("topic", F.lit(True).alias("known"))
    parts = live_partitions(f).where(F.col("topic") != "__cluster_metadata").join(unreadable, "topic", "left_anti")
    hit = parts.join(assigned, ["topic", "partition", "broker_id"], "left_anti").join(known, "topic", "left")
    msg = F.when(
        F.col("known").isNull(),
        F.format_string(
            "%s: topic %s is not in %s", "path", "topic", F.lit(f.metadata_log() if f.kraft else "ZooKeeper")
        ),
    ).otherwise(
        F.format_string(
            "%s: the assignment does not place %s-%d on broker %d", "path", "topic", "partition", "broker_id"
        )
    )
    return findings(hit, "replica-not-assigned", msg, path=F.col("path"))


@detector("replica-dir-missing")
def replica_dir_missing(f: Frames) -> DataFrame:
    assert f.cluster_topics is not None
    # only audited brokers; a topic being deleted loses its directories (renamed -delete) before its znode
    deleting = f.cluster_topics.where(F.coalesce("marked_for_deletion", F.lit(False))).select("topic")
    expected = (
        _assignment(f).where(F.col("broker_id").isin(list(f.probed_brokers))).join(deleting, "topic", "left_anti")
    )
    present = live_partitions(f).select("topic", "partition", "broker_id")
    hit = expected.join(present, ["topic", "partition", "broker_id"], "left_anti").join(
        f.brokers.select("broker_id", "kafka_version", "kafka_version_num"), "broker_id", "left"
    )
    msg = F.format_string(
        "assigned replica %s-%d has no partition directory on broker %d", "topic", "partition", "broker_id"
    )
    return findings(
        hit, "replica-dir-missing", msg, path=F.format_string("%s-%d", "topic", "partition"), log_dir=F.lit(None)
    )


@detector("under-replicated", "offline-partition")
def _zk_partition_rules(f: Frames) -> DataFrame:
    assert f.cluster_topics is not None and f.cluster_states is not None and f.cluster_brokers is not None
    replicas = f.cluster_topics.select("topic", F.explode("partitions").alias("p", "replicas")).select(
        "topic", F.col("p").cast("int").alias("partition"), "replicas"
    )
    st = f.fleet_tagged(f.cluster_states.where(F.col("error").isNull()).join(replicas, ["topic", "partition"]))
    path = _partition_path(f)
    urp = st.where(F.size("isr") < F.size("replicas"))
    urp_f = cluster_findings(
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
        per_partition=True,
    )
    # a snapshot taken while no broker was registered (a post-mortem of a stopped cluster) cannot tell
    # whether a leader is alive: only leader -1 counts as offline then
    unregistered = ~F.col("leader").isin(list(f.registered_brokers)) if f.registered_brokers else F.lit(False)
    off = st.where((F.col("leader") < 0) | unregistered)
    off_f = cluster_findings(
        off,
        "offline-partition",
        F.format_string("%s-%d has no live leader (leader %d)", "topic", "partition", "leader"),
        path=path,
        per_partition=True,
    )
    return urp_f.unionByName(off_f)


@detector("unsafe-replication")
def unsafe_replication(f: Frames) -> DataFrame:
    assert f.cluster_topics is not None
    t = f.fleet_tagged(f.cluster_topics.where(F.col("error").isNull() & F.col("replication_factor").isNotNull()))
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
    return cluster_findings(hit, "unsafe-replication", msg, path=_topic_path(f))


@detector("meta-mismatch")
def meta_mismatch(f: Frames) -> DataFrame:
    ld = f.logdirs.where(F.col("meta").isNotNull())
    # distinct counts as set sizes: two distinct aggregates would expand every row and aggregate twice
    per_broker = ld.groupBy("broker_id").agg(
        F.size(F.collect_set("meta.broker_id")).alias("n_ids"),
        F.size(F.collect_set("meta.cluster_id")).alias("n_clusters"),
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
    out = _meta_findings(hit, msg)
    if f.facts_cluster_id is None:
        return out
    foreign = ld.withColumn("facts_cluster_id", F.lit(f.facts_cluster_id)).where(
        F.col("meta.cluster_id").isNotNull() & (F.col("meta.cluster_id") != F.col("facts_cluster_id"))
    )
    msg2 = F.format_string(
        "%s/meta.properties has cluster.id %s but %s is %s",
        "logdir",
        "meta.cluster_id",
        F.lit(f"the cluster id of {f.metadata_log()}" if f.kraft else "ZooKeeper /cluster/id"),
        "facts_cluster_id",
    )
    return out.unionByName(_meta_findings(foreign, msg2))


def _meta_findings(df: DataFrame, message: Column) -> DataFrame:
    path = F.concat("logdir", F.lit("/meta.properties"))
    return findings(df, "meta-mismatch", message, path=path, topic=F.lit(None), partition=F.lit(None))
