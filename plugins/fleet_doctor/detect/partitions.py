"""Rules on partition directories: ``partition.metadata``, ``leader-epoch-checkpoint`` and the directory's state
(ref §2.1, §4)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from fleet_doctor.detect.findings import Check, detector, findings
from fleet_doctor.detect.frames import Frames, live_partitions, loaded


def _part(rule_id: str, cond: Column, message: Column, leaf: str) -> Check:
    return Check("partitions", rule_id, loaded() & cond, message, path=F.concat(F.col("path"), F.lit("/" + leaf)))


@detector("partition-metadata-malformed")
def partition_metadata_malformed(f: Frames) -> list[Check]:
    err = F.col("partition_metadata_error")
    return [_part("partition-metadata-malformed", err.isNotNull(), err, "partition.metadata")]


@detector("leader-epoch-malformed")
def leader_epoch_malformed(f: Frames) -> list[Check]:
    err = F.col("leader_epoch_error")
    return [_part("leader-epoch-malformed", err.isNotNull(), err, "leader-epoch-checkpoint")]


@detector("leader-epoch-not-monotonic")
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


@detector("leader-epoch-ahead")
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
    if not f.has_cluster_facts:
        return [local]
    assert f.cluster_states is not None
    zk = live_partitions(f).join(
        f.cluster_states.where(F.col("error").isNull()).select(
            "topic", "partition", F.col("leader_epoch").alias("zk_leader_epoch")
        ),
        ["topic", "partition"],
    )
    ahead = zk.where(F.col("latest_leader_epoch") > F.col("zk_leader_epoch"))
    zk_f = findings(
        ahead,
        "leader-epoch-ahead",
        F.format_string(
            "%s: latest leader epoch %d is above "
            + ("%d, the leader epoch in " + f.metadata_log() if f.kraft else "ZooKeeper's leader_epoch %d"),
            path,
            "latest_leader_epoch",
            "zk_leader_epoch",
        ),
        path=path,
    )
    return [local, zk_f]


@detector("stray-dir")
def stray_dir(f: Frames) -> list[Check]:
    msg = F.format_string("%s: lingering -%s partition directory", "path", "dir_state")
    # what a -stray dir is (KRaft 3.7+, ref §2.1 item 6): said where one is, whatever the cluster's mode
    msg = F.when(
        F.col("dir_state") == "stray",
        F.concat(
            msg,
            F.lit(
                ": KRaft (3.7+) found this replica stray at a start (no topic ID, an ID the metadata image does not "
                "know, or an assignment without this broker) and renamed it instead of deleting it; Kafka never "
                "reads or deletes it again"
            ),
        ),
    ).otherwise(msg)
    return [Check("partitions", "stray-dir", F.col("dir_state") != "live", msg, path=F.col("path"))]
