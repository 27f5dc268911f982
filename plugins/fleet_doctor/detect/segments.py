"""Rules on segment and index files: the facts of one partition dir's segments (records kind ``segment``) and the
leftover files beside them (ref §1, §2)."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from fleet_doctor.detect.findings import Check, at_least, cached, detector, findings
from fleet_doctor.detect.frames import METADATA_TOPIC, Frames, in_logdirs


def seg_file(ext: str) -> Column:
    """path/<base offset, 20 digits>.<ext> of a segment record."""
    return cached(
        ("seg_file", ext),
        lambda: F.concat(
            F.col("path"), F.lit("/"), F.lpad(F.col("base_offset").cast("string"), 20, "0"), F.lit("." + ext)
        ),
    )


def _seg(rule_id: str, cond: Column, message: Column, ext: str) -> Check:
    return Check("segments", rule_id, cond, message, path=seg_file(ext), segment=F.col("base_offset"))


@detector("index-untrimmed")
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


@detector("index-last-offset")
def index_last_offset(f: Frames) -> list[Check]:
    """Kafka's sanity check sees the whole file: with a zero tail its last entry is (base, 0)."""
    kafka_last = F.when(_stale_zero_tail("index"), F.col("base_offset")).otherwise(F.col("index_last_offset"))
    strict = ~at_least("2.0.0")  # <= 1.1: last offset must be > base; 2.0+: must be >= base
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


@detector("index-size")
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


@detector("index-not-monotonic")
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


@detector("index-beyond-log")
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


@detector("timeindex-last-timestamp")
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


@detector("index-orphan")
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


@detector("index-missing")
def index_missing(f: Frames) -> list[Check]:
    msg = F.format_string(
        "Could not find offset index file corresponding to log file %s (%d bytes): rebuilt at startup",
        seg_file("log"),
        F.col("log_bytes"),
    )
    return [_seg("index-missing", F.col("has_log") & ~F.col("has_index"), msg, "log")]


@detector("segment-leftover")
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
            segment=F.regexp_extract(F.col("path"), r"(\d{20})\.[a-z]+\.[a-z]+\z", 1).cast("long"),
        )
    ]


def with_next_base(segments: DataFrame) -> DataFrame:
    """Segments with the base offset of their partition's next segment (null for the last)."""
    order = Window.partitionBy("broker_id", "logdir", "path").orderBy("base_offset")
    return segments.withColumn("next_base", F.lead("base_offset").over(order))


@detector("segment-overlap")
def segment_overlap(f: Frames) -> DataFrame:
    # only deep-mode facts (batch offsets) can show either problem: the segments of other log dirs
    # are neither ordered nor read
    segs = with_next_base(f.segments.where(in_logdirs(f.deep_logdirs)))
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


def _log_check(rule_id: str, cond: Column, template: str, *fields: str) -> Check:
    """A check on a segment's .log (deep mode facts); the message names the file, then ``fields`` in ``template``."""
    return _seg(rule_id, cond, F.format_string(f"%s: {template}", seg_file("log"), *map(F.col, fields)), "log")


def _not_decoded_metadata_log(f: Frames) -> Column:
    """Not a segment of a KRaft node's ``__cluster_metadata-0`` that the controllers input decoded: a torn tail or a
    CRC failure there is metadata-log-torn's (one finding, with what it means for the metadata)."""
    if not f.metadata_logdirs:
        return F.lit(True)
    return ~((F.col("topic") == METADATA_TOPIC) & (F.col("partition") == 0) & in_logdirs(f.metadata_logdirs))


@detector("log-torn-tail")
def log_torn_tail(f: Frames) -> list[Check]:
    template = "%d of %d bytes form valid batches; recovery will truncate the rest (%s)"
    torn = (F.col("torn_tail") == F.lit(True)) & _not_decoded_metadata_log(f)
    return [_log_check("log-torn-tail", torn, template, "valid_bytes", "log_bytes", "tail_error")]


@detector("log-crc")
def log_crc(f: Frames) -> list[Check]:
    template = "batch at byte %d fails its CRC (%s)"
    bad = (F.col("crc_errors") > 0) & _not_decoded_metadata_log(f)
    return [_log_check("log-crc", bad, template, "first_crc_error_position", "tail_error")]


@detector("index-entry-mismatch")
def index_entry_mismatch(f: Frames) -> list[Check]:
    # 2.0+ indexes (largest offset of an append, position of its first batch): offset past the
    # batch is benign there (kafka-reference §1.1, §2.6)
    after = F.when(at_least("2.0.0"), F.lit(0)).otherwise(F.coalesce(F.col("index_offset_after_batch"), F.lit(0)))
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


@detector("file-unreadable")
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
