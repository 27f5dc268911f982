"""Rules on log directories: the offset checkpoints and the clean-shutdown marker (ref §2.2, §2.3)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from fleet_doctor.detect.findings import Check, detector, findings
from fleet_doctor.detect.frames import Frames, in_logdirs, loaded_partitions
from fleet_doctor.detect.segments import with_next_base


@detector("checkpoint-malformed")
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


@detector("checkpoint-dangling")
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
    dirs = loaded_partitions(f).select("broker_id", "logdir", "topic", "partition")
    hit = entries.join(dirs, ["broker_id", "logdir", "topic", "partition"], "left_anti")
    msg = F.format_string(
        "%s lists %s-%d (offset %s) but the log dir has no such partition directory",
        "cp_path",
        "topic",
        "partition",
        "offset",
    )
    return findings(hit, "checkpoint-dangling", msg, path=F.col("cp_path"))


@detector("unclean-shutdown")
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
    segs = with_next_base(f.segments.where(in_logdirs(f.stopped_logdirs))).join(
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
